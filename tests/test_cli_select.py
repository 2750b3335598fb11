"""`dufs select` and `dufs evaluate` on a store: the JSON selection, the table and the figure."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from typer.testing import CliRunner

import dufs
from dufs.cli import app
from dufs.data.datasets import load


def test_select_then_evaluate(tmp_path):
    X, y = load("relathe")
    X = sp.csr_array(X)
    idx = np.arange(X.shape[0])
    train, test = idx % 4 != 0, idx % 4 == 0
    dufs.write_store(X[train], tmp_path / "train.zarr", y[train])
    dufs.write_store(X[test], tmp_path / "test.zarr", y[test])
    out = tmp_path / "sel.json"
    r = CliRunner().invoke(app, ["select", str(tmp_path / "train.zarr"), "--method", "fisher", "-k", "50",
                                 "-o", str(out), "--workers", "0"])
    assert r.exit_code == 0, r.output
    sel = dufs.Selection.from_json(out)
    ref = dufs.fit(X[train], y[train], method="fisher", n_features=50)
    assert sel.indices.tolist() == ref.indices.tolist()
    fig = tmp_path / "acc.png"
    r = CliRunner().invoke(app, ["evaluate", str(tmp_path / "train.zarr"), str(out), "--test",
                                 str(tmp_path / "test.zarr"), "--ks", "5,50", "--figure", str(fig)])
    assert r.exit_code == 0, r.output
    assert fig.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the printed accuracy at K=50 is LinearSVC(C=1) on those columns, computed independently
    from sklearn.svm import LinearSVC

    cols = ref.indices
    acc = LinearSVC(C=1.0).fit(X[train][:, cols], y[train]).score(X[test][:, cols], y[test])
    assert f"{acc:.4f}" in r.output
    # the JSON is small; every score is in the sidecar beside it; dufs info reads both
    side = tmp_path / "sel.scores.npy"
    assert out.stat().st_size < 20_000 and np.load(side).shape == (X.shape[1],)
    np.testing.assert_array_equal(np.load(side), ref.scores)
    r = CliRunner().invoke(app, ["info", str(out)])
    assert r.exit_code == 0, r.output
    assert "fisher: 50 of" in r.output and str(ref.indices[0]) in r.output and "MISSING" not in r.output
    # without the sidecar: dufs info says so, and evaluate still works from the indices
    side.unlink()
    r = CliRunner().invoke(app, ["info", str(out)])
    assert r.exit_code == 0 and "MISSING" in r.output, r.output
    r = CliRunner().invoke(app, ["evaluate", str(tmp_path / "train.zarr"), str(out), "--test",
                                 str(tmp_path / "test.zarr"), "--ks", "50", "--figure", str(fig)])
    assert r.exit_code == 0, r.output
    assert f"{acc:.4f}" in r.output


def test_select_on_bad_method_exits_2(tmp_path):
    dufs.write_store(sp.random_array((20, 10), density=0.3, rng=0), tmp_path / "s.zarr", np.arange(20) % 2)
    r = CliRunner().invoke(app, ["select", str(tmp_path / "s.zarr"), "--method", "nope", "-k", "3",
                                 "--workers", "0"])
    assert r.exit_code == 2 and "'method' parameter of fit" in r.output


def test_select_says_a_degenerate_result_as_a_warning_line(tmp_path):
    """UFCM on PCMAC's raw term counts (``-p values=raw``) singles out 2 documents as a cluster: `dufs select` says
    so on a line of its own, naming the fix, and still writes the selection; with its default (the counts' presence,
    ``values="auto"``) it says nothing."""
    X, y = load("pcmac")
    dufs.write_store(sp.csr_array(X), tmp_path / "s.zarr", y)
    args = ["--method", "ufcm", "-k", "10", "--workers", "0"]
    r = CliRunner().invoke(app, ["select", str(tmp_path / "s.zarr"), *args, "-p", "values=raw", "-o",
                                 str(tmp_path / "sel.json")], env={"COLUMNS": "400"})
    assert r.exit_code == 0, r.output
    line = next(x for x in r.output.splitlines() if x.startswith("warning: ufcm: almost every sample"))
    assert "values='auto'" in line and "DufsWarning" not in r.output
    assert dufs.Selection.from_json(tmp_path / "sel.json").n_selected == 10
    r = CliRunner().invoke(app, ["select", str(tmp_path / "s.zarr"), *args], env={"COLUMNS": "400"})
    assert r.exit_code == 0 and "warning" not in r.output, r.output


def test_select_param_none_or_null_in_any_case_is_none(tmp_path):
    """``-p t=None`` (none, null, NULL) is None, as in ``fit(t=None)``, not the string "None" that the parameter
    check refuses; a JSON-quoted "None" stays a string."""
    from dufs.cli.selecting import _parse_params

    X = sp.random_array((30, 10), density=0.3, rng=0, format="csr")
    dufs.write_store(X, tmp_path / "s.zarr")
    ref = dufs.fit(dufs.open(tmp_path / "s.zarr"), method="laplacian", n_features=4, n_neighbors=3,
                   weights="heat", t=None, client=False)
    for word in ("None", "none", "null", "NULL"):
        out = tmp_path / f"sel-{word}.json"
        r = CliRunner().invoke(app, ["select", str(tmp_path / "s.zarr"), "-m", "laplacian", "-k", "4", "-p",
                                     "n_neighbors=3", "-p", "weights=heat", "-p", f"t={word}", "-o", str(out),
                                     "--workers", "0"])
        assert r.exit_code == 0, r.output
        assert dufs.Selection.from_json(out).indices.tolist() == ref.indices.tolist()
    assert _parse_params(["a=None", 'b="None"', "c=nonesuch", "d=1.5"]) == {"a": None, "b": "None",
                                                                           "c": "nonesuch", "d": 1.5}
    r = CliRunner().invoke(app, ["select", "--help"])
    assert "parsed as JSON" in " ".join(r.output.replace("│", " ").split())
