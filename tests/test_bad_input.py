"""NaN and infinity are refused in every input kind, by dufs.fit, every estimator and dufs.engine.as_matrix, with one
line naming the first offending (row, feature); non-finite, missing or mixed labels are refused naming the row."""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest
import scipy.sparse as sp
import sparse

import dufs
from dufs.engine import as_matrix
from dufs.errors import DufsError, ParameterError
from dufs.estimators import (
    JCFS,
    M3FS,
    MMFS,
    UFCM,
    CorrelationSelector,
    FisherScore,
    LapAOFS,
    LapDOFS,
    LaplacianScore,
    VarianceSelector,
)

ESTIMATORS = [VarianceSelector, CorrelationSelector, FisherScore, LaplacianScore, MMFS, LapAOFS, LapDOFS, JCFS, UFCM,
              M3FS]


def _data(bad=((5, 3, np.nan),)):
    """60 x 8 with labels X[:, 3] > 0 (so dropping feature 3 matters) and the given non-finite entries."""
    rng = np.random.default_rng(0)
    X = rng.standard_normal((60, 8))
    X[rng.random((60, 8)) < 0.3] = 0.0
    y = (X[:, 3] > 0).astype(float)
    for r, c, v in bad:
        X[r, c] = v
    return X, y


def _first(X):
    """The first non-finite entry in row-major order (the dense reference)."""
    r, c = np.argwhere(~np.isfinite(X))[0]
    return int(r), int(c), float(X[r, c])


def _in_memory(X):
    return {"numpy": X, "numpy-f32": X.astype(np.float32), "csr": sp.csr_array(X), "csc-matrix": sp.csc_matrix(X),
            "coo": sp.coo_array(X), "pydata-coo": sparse.COO.from_numpy(X), "pydata-gcxs": sparse.GCXS.from_numpy(X)}


def _message(r, c, v):
    return (rf"^X has a non-finite value \({v}\) at row {r}, feature {c}( \(\d+ in all\))?; dufs does not impute "
            rf"NaN or inf: remove or fill it$")


@pytest.mark.parametrize("bad", [((5, 3, np.nan),), ((41, 6, np.inf), (5, 7, -np.inf), (5, 3, np.nan)),
                                 ((59, 0, -np.inf),)], ids=["nan", "three", "-inf"])
def test_every_in_memory_kind_names_the_first_offending_entry(bad):
    X, y = _data(bad)
    r, c, v = _first(X)
    for kind, Xi in _in_memory(X).items():
        for method in ("correlation", "fisher", "mmfs", "variance", "qpfs", "laplacian"):
            yy = y if dufs.api.METHODS[method].supervised else None
            with pytest.raises(ParameterError, match=_message(r, c, v)) as info:
                dufs.fit(Xi, yy, method=method, n_features=2)
            assert "\n" not in str(info.value), (kind, method)
        with pytest.raises(ParameterError, match=_message(r, c, v)):
            as_matrix(Xi, y=y)
    assert "(3 in all)" in str(info.value) if len(bad) == 3 else "in all" not in str(info.value)


def test_every_estimator_refuses_non_finite_values_in_one_line():
    """Not scikit-learn's multi-line message: dufs's, naming the entry (and a ParameterError, a ValueError)."""
    X, y = _data(((7, 2, np.inf),))
    for cls in ESTIMATORS:
        for Xi in (X, sp.csr_array(X)):
            with pytest.raises(ParameterError, match=_message(7, 2, "inf")) as info:
                cls(n_features=2).fit(Xi, y)
            assert "\n" not in str(info.value)


@pytest.mark.parametrize("chunks", [sparse.COO, np.asarray], ids=["sparse-chunks", "dense-chunks"])
def test_dask_arrays_are_checked_block_by_block(chunks):
    """A Dask array is checked as each column slab becomes a feature block: the message names the first offending
    entry of the block it is found in, and the block."""
    X, y = _data(((5, 3, np.nan), (50, 7, np.inf)))
    src = sparse.COO.from_numpy(X) if chunks is sparse.COO else X
    Xd = da.from_array(src, chunks=(25, 3), asarray=chunks is np.asarray)
    msg = (r"^X has a non-finite value \((nan\) at row 5, feature 3 \(in features 3-5|inf\) at row 50, feature 7 "
           r"\(in features 6-7) of the Dask array\); dufs does not impute")
    for method in ("fisher", "mmfs", "variance"):
        with pytest.raises(ParameterError, match=msg):
            dufs.fit(Xd, y if method != "variance" else None, method=method, n_features=2, client=False)
    with pytest.raises(ParameterError, match=msg):
        as_matrix(Xd).column_stats()
    # a slab with nothing wrong is read as it is: the first 3 features give the dense statistics
    st = as_matrix(Xd[:, :3]).column_stats()
    np.testing.assert_allclose(st.var(), X[:, :3].var(axis=0), rtol=1e-12)


def test_a_dask_array_on_a_cluster_fails_on_the_worker_with_the_same_message(cluster_client):
    X, y = _data(((33, 4, -np.inf),))
    Xd = da.from_array(sparse.COO.from_numpy(X), chunks=(20, 4), asarray=False)
    with pytest.raises(ParameterError, match=r"^X has a non-finite value \(-inf\) at row 33, feature 4 \(in "
                                             r"features 4-7 of the Dask array\)"):
        dufs.fit(Xd, y, method="fisher", n_features=2, client=cluster_client)


def test_values_whose_squares_overflow_are_refused_in_one_line():
    """A finite value beyond 1e150 (its square overflows float64, and with it the feature's variance, the scores and
    every distance: M3FS's kNN graph failed in SciPy, LapAOFS on a negative index, UFCM in k-means) is named like a
    non-finite one, for every method, and in a Dask array's block; up to 1e150 the data are used as they are."""
    X, y = _data(())
    X[44, 6], X[12, 2] = 1e200, -5e150
    msg = (r"^X has a value too large to compute with \(-5e\+150\) at row 12, feature 2 \(2 in all\); beyond "
           r"1e\+150 in magnitude its square, and the feature's variance and every distance it enters, overflow "
           r"float64: scale the feature or the data down \(divide by a constant\)$")
    for method in dufs.api.METHODS:
        yy = y if dufs.api.METHODS[method].supervised else None
        for Xi in (X, sp.csc_array(X)):
            with pytest.raises(ParameterError, match=msg):
                dufs.fit(Xi, yy, method=method, n_features=2)
    with pytest.raises(ParameterError, match=r"\((-5e\+150\) at row 12, feature 2 \(in features 0-3|1e\+200\) at "
                                             r"row 44, feature 6 \(in features 4-7) of the Dask array\)"):
        as_matrix(da.from_array(X, chunks=(30, 4))).column_stats()
    X[44, 6], X[12, 2] = 1e150, -1e150
    st = as_matrix(X).column_stats()
    assert st.max[6] == 1e150 and st.min[2] == -1e150


@pytest.mark.parametrize(("labels", "msg"), [
    ("nan", r"^y has a non-finite value \(nan\) at row 17; dufs does not impute NaN or inf: remove that sample"),
    ("infs", r"^y has a non-finite value \(inf\) at row 3 \(2 in all\);"),
    ("none", r"^y has a missing label \(None\) at row 4; dufs does not impute"),
    ("mixed", r"^y mixes label types: row 1 has 1 \(int\) where row 0 has 'a' \(str\); give every sample a label"),
    ("shape", r"^y must hold one label per row of X \(60 rows\); got shape \(59,\)"),
])
def test_bad_labels_name_the_row(labels, msg):
    X, y = _data(())
    if labels == "nan":
        y[17] = np.nan
    elif labels == "infs":
        y[[3, 9]] = np.inf
    elif labels == "none":
        y = np.where(y > 0, "a", "b").astype(object)
        y[4] = None
    elif labels == "mixed":
        y = np.array(["a", 1] * 30, dtype=object)
    else:
        y = y[:59]
    for method in ("correlation", "fisher", "mmfs", "qpfs"):
        with pytest.raises(ParameterError, match=msg):
            dufs.fit(X, y, method=method, n_features=2)
    with pytest.raises(ParameterError, match=msg):
        as_matrix(X, y=y)
    if labels != "shape":  # scikit-learn's own length check comes first in the estimators
        for cls in (CorrelationSelector, FisherScore, MMFS):
            with pytest.raises(ParameterError, match=msg):
                cls(n_features=2).fit(X, y)


def test_unsupervised_methods_ignore_labels():
    """y given to an unsupervised method is not read, so bad labels there are no error."""
    X, y = _data(())
    y[0] = np.nan
    want = dufs.fit(X, method="variance", n_features=3).indices
    assert dufs.fit(X, y, method="variance", n_features=3).indices.tolist() == want.tolist()


def test_estimator_input_errors_are_dufs_errors():
    X, y = _data(())
    with pytest.raises(DufsError, match=r"^FisherScore requires y to be passed, but the target y is None"):
        FisherScore(n_features=2).fit(X)
    with pytest.raises(DufsError, match=r"^Found input variables with inconsistent numbers of samples: \[60, 59\]"):
        MMFS(n_features=2).fit(X, y[:59])
    with pytest.raises(DufsError, match=r"^Found array with 0 sample\(s\)"):
        CorrelationSelector(n_features=2).fit(X[:0], y[:0])
