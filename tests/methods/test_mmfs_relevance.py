"""MMFS's multi-class relevance (the correlation ratio) against dense NumPy, and its invariance to the class ids."""

from __future__ import annotations

import dask
import numpy as np
import pytest
import scipy.sparse as sp

import dufs
from dufs.engine import Matrix
from dufs.errors import ParameterError
from dufs.methods.mmfs import class_relevance, encode_labels, geometry, mmfs, relevance
from dufs.testing.references import label_relevance, mmfs_features


@pytest.fixture(autouse=True)
def _sync():
    with dask.config.set(scheduler="sync"):
        yield


def _data(seed: int, n: int = 90, d: int = 23, k: int = 4, sparse: bool = False):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, k, n)
    X = rng.normal(size=(n, d)) + 3.0  # not centred: the shift must drop out
    X[:, :5] += 0.8 * y[:, None] * rng.normal(size=5)  # class-dependent means
    if sparse:
        X[rng.random((n, d)) < 0.6] = 0.0
        X[:, 9] = 0.0  # an empty column
    X[:, 7] = 2.5  # a constant column
    return (sp.csr_array(X) if sparse else X), y


def _dense_ratio(X: np.ndarray, y: np.ndarray, mode) -> np.ndarray:
    """coef_i sqrt(B_i) from the dense columns: sqrt(B / T) (eta) under "zscore" and "scale", sqrt(B) for None."""
    X = np.asarray(X, dtype=np.float64)
    mu = X.mean(0)
    B = sum((y == c).sum() * (X[y == c].mean(0) - mu) ** 2 for c in np.unique(y))
    T = ((X - mu) ** 2).sum(0)
    if mode is None:
        out = np.sqrt(B)
    else:
        with np.errstate(invalid="ignore", divide="ignore"):
            out = np.where(T > 0, np.sqrt(B / T), 0.0)
    out[np.ptp(X, axis=0) == 0] = 0.0
    return out


def _dense_ovr(X: np.ndarray, y: np.ndarray, mode) -> np.ndarray:
    """|f_i^T e~_c| over the classes c, from the explicit MMFS columns F (references.mmfs_features)."""
    F = mmfs_features(np.asarray(X, dtype=np.float64), mode)
    return np.stack([label_relevance(F, (y == c).astype(np.float64)) for c in np.unique(y)])


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("mode", ["zscore", "scale", None])
@pytest.mark.parametrize("width", [None, 5])
def test_correlation_ratio_equals_dense_numpy(sparse, mode, width):
    X, y = _data(1, sparse=sparse)
    M = Matrix(X, standardize=mode, block_width=width)
    r = relevance(M, y, geometry(M), "correlation")
    D = X.toarray() if sparse else X
    np.testing.assert_allclose(r, _dense_ratio(D, y, mode), rtol=1e-10, atol=1e-12)
    assert r[7] == 0.0
    if mode is not None:  # eta is in [0, 1]
        assert r.max() <= 1.0 + 1e-12


@pytest.mark.parametrize("mode", ["zscore", "scale", None])
@pytest.mark.parametrize("rule", ["ovr-max", "ovr-mean"])
def test_one_vs_rest_equals_dense_numpy(mode, rule):
    X, y = _data(2, sparse=True)
    M = Matrix(X, standardize=mode, block_width=6)
    classes, codes = encode_labels(y)
    r = class_relevance(M, codes, classes.shape[0], geometry(M), rule)
    per = _dense_ovr(X.toarray(), y, mode)
    per[:, np.ptp(X.toarray(), axis=0) == 0] = 0.0
    np.testing.assert_allclose(r, per.max(0) if rule == "ovr-max" else per.mean(0), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("mode", ["zscore", "scale", None])
def test_two_classes_ratio_equals_binary_correlation(sparse, mode):
    """For two classes the correlation ratio is |Pearson correlation| with the 0/1 labels (the binary rule)."""
    X, y = _data(3, k=2, sparse=sparse)
    M = Matrix(X, standardize=mode, block_width=4)
    geo = geometry(M)
    binary = relevance(M, y, geo, "correlation")  # the binary path: the labels as numbers
    ratio = class_relevance(M, encode_labels(y)[1], 2, geo, "ratio")
    np.testing.assert_allclose(ratio, binary, rtol=1e-12, atol=1e-14)
    F = mmfs_features(X.toarray() if sparse else X, mode)
    np.testing.assert_allclose(binary, label_relevance(F, y), rtol=1e-10, atol=1e-13)
    if mode == "zscore":
        D = X.toarray() if sparse else X
        ok = np.ptp(D, axis=0) > 0
        corr = np.array([abs(np.corrcoef(D[:, j], y)[0, 1]) for j in np.flatnonzero(ok)])
        np.testing.assert_allclose(ratio[ok], corr, rtol=1e-10)


def test_binary_relevance_is_unchanged_by_the_label_values():
    """Binary numeric labels go through the old path as they are: {-1, 1}, {0, 1} and {3, 7} give one r."""
    X, y = _data(4, k=2)
    M = Matrix(X, standardize="zscore")
    geo = geometry(M)
    ref = relevance(M, y.astype(np.float64), geo)
    for lab in (np.where(y == 1, 1.0, -1.0), np.where(y == 1, 7, 3), y.astype(bool), np.where(y == 1, "b", "a")):
        np.testing.assert_allclose(relevance(M, lab, geo), ref, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("rule", ["ratio", "ovr-max", "ovr-mean"])
def test_renumbering_the_classes_gives_identical_relevance(rule):
    X, y = _data(5, k=6, sparse=True)
    M = Matrix(X, standardize="zscore", block_width=7)
    geo = geometry(M)
    perm = np.array([4, 0, 5, 2, 1, 3])
    got = [class_relevance(M, encode_labels(lab)[1], 6, geo, rule) for lab in (y, perm[y], 10 * perm[y] - 3)]
    for r in got[1:]:
        np.testing.assert_array_equal(r, got[0])
    if rule == "ratio":
        names = np.array(list("uvwxyz"))[perm][y]  # string labels: encoded as classes
        np.testing.assert_array_equal(relevance(M, names, geo), got[0])
        np.testing.assert_array_equal(relevance(M, perm[y].astype(np.float64), geo), got[0])


def _iris_with_noise():
    from sklearn.datasets import load_iris

    X, y = load_iris(return_X_y=True)
    rng = np.random.default_rng(0)
    return np.hstack([X, rng.normal(size=(X.shape[0], 10))]), y


def test_fit_selection_does_not_depend_on_the_class_ids():
    X, y = _iris_with_noise()
    sels = []
    for perm in ([0, 1, 2], [2, 0, 1], [1, 2, 0]):
        lab = np.asarray(perm)[y]
        sel = dufs.fit(X, lab, method="mmfs", n_features=3, client=False)
        sels.append((sel.indices.tolist(), np.asarray(sel.scores).tolist()))
    assert sels[1] == sels[0] and sels[2] == sels[0]
    assert set(sels[0][0]) <= {0, 1, 2, 3}  # the iris measurements, not the noise
    # with the labels as numbers the old rule depended on the numbering: its relevance changes with it
    M = Matrix(X, standardize="zscore")
    geo = geometry(M)
    old = [np.abs(geo["coef"] * M.with_standardize(None).rmatvec(
        (lab - lab.mean()) / np.linalg.norm(lab - lab.mean()))) for lab in (y * 1.0, np.asarray([2.0, 0, 1])[y])]
    assert not np.allclose(old[0], old[1])


def test_mmfs_multiclass_uses_the_correlation_ratio():
    X, y = _iris_with_noise()
    M = Matrix(X, standardize="zscore")
    res = mmfs(M, y, n_features=3, theta=0.5, checkpoint=None)
    np.testing.assert_allclose(res.r, _dense_ratio(X, y, "zscore"), rtol=1e-10)
    np.testing.assert_allclose(res.rho, res.r)  # theta = 0.5: rho = r


def test_constant_labels_raise():
    X, _ = _data(6)
    M = Matrix(X, standardize="zscore")
    with pytest.raises(ParameterError, match="constant"):
        relevance(M, np.ones(X.shape[0]), geometry(M))
    with pytest.raises(ParameterError, match="rule"):
        class_relevance(M, np.arange(X.shape[0]) % 3, 3, geometry(M), "nope")
