"""``n_clusters="auto"`` (the default of JCFS, M3FS and UFCM): the eigengap of the normalised Laplacian of the rows'
kNN graph, on a row sample above 5,000 rows, recovers the planted cluster count of clustered sparse data it was not
tuned on, and a fit with it is the fit with the count it chose."""

from __future__ import annotations

import dask
import numpy as np
import pytest
import scipy.sparse as sp

import dufs
from dufs.data.synthetic import SyntheticSpec, generate_rows, make_signature_counts, make_topic_documents
from dufs.engine import Matrix
from dufs.methods.graph import estimate_clusters


def _planted(n, d, c, seed):
    ip, ix, da, y = generate_rows(SyntheticSpec(n_rows=n, n_features=d, n_clusters=c, seed=seed), 0, n)
    return sp.csr_array((da, ix, ip), shape=(n, d))


@pytest.mark.parametrize("c", [2, 5, 12])
def test_the_estimate_is_the_planted_count(c):
    """Exact up to 5 clusters, within one above (issue 58's criterion: 2,500 topic documents of 12 topics, the
    smallest of 82 documents, read as presence give 13)."""
    X, labels, _ = make_topic_documents(2500, 6000, c, seed=11)
    assert np.unique(labels).size == c
    got, info = estimate_clusters(Matrix(X, standardize="zscore"))  # sparse: the unit presence rows' graph
    assert abs(got - c) <= (0 if c <= 5 else 1), info["eigenvalues"][: c + 2]
    assert info["metric"] == "cosine" and info["values"] == "presence" and info["samples"] == 2500
    assert estimate_clusters(Matrix(_planted(2500, 6000, c, seed=12)))[0] == c


@pytest.mark.parametrize("c", [2, 5])
def test_signature_counts_give_their_count_read_as_presence(c):
    """Heavy-tailed counts whose clusters show in which features a row has, not in their values: the raw values'
    graph missed the count (docs/methods.md, "The graph's values"), the presence graph finds it (at 5,000 x 20,000
    for 12 and 20 clusters too; at this size 12 clusters, the smallest of 98 rows, gave 10)."""
    X, labels, _ = make_signature_counts(3000, 8000, c, seed=5)
    got, info = estimate_clusters(Matrix(X))
    assert abs(got - c) <= (0 if c <= 5 else 1), info["eigenvalues"][: c + 2]
    with dask.config.set({"dufs.graph.values": "raw"}):
        assert estimate_clusters(Matrix(X))[0] != c


def test_above_the_sample_the_rows_are_sampled_and_the_count_holds():
    from dufs.methods import graph

    X = _planted(3000, 5000, 5, seed=13)
    got, info = graph.estimate_clusters(Matrix(X), sample=1500)
    assert got == 5 and 1300 < info["samples"] < 1700


def test_fit_with_auto_is_the_fit_with_the_estimate_and_records_it():
    X, _, planted = make_topic_documents(1500, 4000, 4, seed=14)
    got = dufs.fit(X, method="ufcm", n_features=40)
    assert got.diagnostics["n_clusters"] == 4 and got.diagnostics["n_clusters_estimate"]["method"] == "eigengap"
    ref = dufs.fit(X, method="ufcm", n_features=40, n_clusters=4)
    np.testing.assert_array_equal(got.indices, ref.indices)
    assert "n_clusters_estimate" not in ref.diagnostics and ref.diagnostics["n_clusters"] == 4


def test_too_few_rows_take_two():
    assert estimate_clusters(Matrix(sp.random_array((3, 8), density=0.6, rng=0, format="csr")))[0] == 2
