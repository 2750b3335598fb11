"""The recovery bench's generators against facts of their design, and a tiny ``dufs bench recovery`` run whose
variance row is checked against NumPy (no timing assertions)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from dufs.cli import app
from dufs.data.synthetic import make_signature_counts, make_topic_documents

GENERATORS = [make_signature_counts, make_topic_documents]


def _occurrence(X, labels, planted):
    """Per cluster: the fraction of its own rows holding each of its planted features, and of the other rows."""
    B = (X.toarray() > 0)
    own = np.array([B[labels == c][:, planted[c]].mean() for c in range(planted.shape[0])])
    other = np.array([B[labels != c][:, planted[c]].mean() for c in range(planted.shape[0])])
    return own, other


@pytest.mark.parametrize("gen", GENERATORS)
def test_shapes_sizes_and_planted_features(gen):
    n, d, c = 3000, 4000, 4
    X, labels, planted = gen(n, d, c, seed=3)
    assert X.shape == (n, d) and labels.shape == (n,) and planted.shape == (c, 20)
    assert X.format == "csr" and np.all(X.data > 0) and np.all(X.data == np.round(X.data))  # counts
    assert np.unique(planted).size == planted.size and planted.min() >= 0 and planted.max() < d
    sizes = np.bincount(labels, minlength=c)
    assert sizes.sum() == n and np.all(sizes > 0)
    assert np.unique(sizes).size == c and 3 < sizes.max() / sizes.min() < 7  # unequal: 5x by default
    assert not np.all(labels[:-1] <= labels[1:])  # rows shuffled
    own, other = _occurrence(X, labels, planted)
    assert np.all(own > 5 * other), (own, other)
    # the background is Zipf: its most frequent word is in far more rows than a typical word that occurs at all
    df = np.bincount(X.indices, minlength=d).astype(float)
    df[planted.ravel()] = 0
    assert df.max() > 20 * np.median(df[df > 0])


def test_signature_rates_are_as_described():
    X, labels, planted = make_signature_counts(6000, 3000, 3, signature_rate=0.3, leak=0.1, seed=1)
    own, other = _occurrence(X, labels, planted)
    # 0.3 of the own rows and 0.03 of the others', plus the same background rate in both (binomial: within about
    # 4 standard errors)
    assert np.all(np.abs(own - other - 0.27) < 0.025), (own, other)
    assert np.all(other > 0.03 - 0.006), other


def test_topic_documents_vary_in_length():
    X, labels, topics = make_topic_documents(4000, 3000, 3, mean_length=80.0, length_sigma=0.8, seed=2)
    tokens = np.asarray(X.sum(axis=1)).ravel()
    assert abs(tokens.mean() / 80.0 - 1) < 0.1
    assert tokens.std() / tokens.mean() > 0.6  # log-normal lengths: sd/mean = sqrt(exp(0.64) - 1) ~ 0.95
    # about topic_share (0.15) of the tokens are topic words
    assert abs(X[:, topics.ravel()].sum() / tokens.sum() - 0.15) < 0.02


@pytest.mark.parametrize("gen", GENERATORS)
def test_seed_reproducibility(gen):
    a = gen(500, 2000, 3, seed=7)
    b = gen(500, 2000, 3, seed=7)
    c = gen(500, 2000, 3, seed=8)
    for u, v in zip(a, b, strict=True):
        u, v = (u.toarray(), v.toarray()) if hasattr(u, "toarray") else (u, v)
        np.testing.assert_array_equal(u, v)
    assert (a[0] != c[0]).nnz > 0 and not np.array_equal(a[2], c[2])


def test_bench_recovery_cli_variance_matches_numpy(tmp_path):
    n, d, c = 300, 1500, 3
    out = tmp_path / "res.json"
    args = ["bench", "recovery", "--rows", str(n), "--features", str(d), "--clusters", str(c), "--kinds",
            "signature", "--methods", "variance,laplacian", "--seeds", "1", "--dir", str(tmp_path), "--out", str(out)]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "| kind | method | found | clusters |" in res.output
    assert "| signature | variance |" in res.output and "| signature | laplacian |" in res.output

    # independently: population variance of the raw counts, the top k = 3 x 20 planted features
    X, labels, planted = make_signature_counts(n, d, c, seed=1)
    D = X.toarray()
    var = (D ** 2).mean(axis=0) - D.mean(axis=0) ** 2
    k = planted.size
    order = np.sort(var)[::-1]
    assert order[k - 1] > order[k] * (1 + 1e-6)  # no tie at the cut: the top k is one set
    top = np.argsort(-var)[:k]
    found = int(np.isin(planted.ravel(), top).sum())
    represented = int(sum(np.isin(row, top).any() for row in planted))
    rows = {r["method"]: r for r in json.loads(out.read_text())["results"]}
    assert rows["variance"]["found"] == found and rows["variance"]["represented"] == represented
    assert f"| signature | variance | {found} of {k} | {represented} of {c} |" in res.output
    assert rows["laplacian"]["k"] == k and "found" in rows["laplacian"]

    bad = CliRunner().invoke(app, ["bench", "recovery", "--kinds", "nope"])
    assert bad.exit_code == 2 and "unknown data kind" in bad.output
