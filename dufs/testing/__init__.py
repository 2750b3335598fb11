"""Test helpers shipped with dufs, for its tests and code built on it (like ``zarr.testing``).

- :mod:`dufs.testing.strategies`: Hypothesis strategies for sparse matrices and store blockings
  (needs ``hypothesis``, a test dependency; this module itself does not import it).
- :func:`canonical`: the canonical SciPy form of any 2-D input, what a store gives back.
- :func:`assert_store_matches`: a store holds exactly a given matrix (both orientations, labels,
  per-feature nnz).
- :func:`lazy_sparse_dask`: a Dask array of ``sparse.COO`` chunks made by whichever process computes
  them, so a test can prove that a writer never materialises its input on the driver.
- :func:`patience`: how long a test waits for a subprocess or a cluster before it calls it hung.

>>> import scipy.sparse as sp
>>> canonical(sp.coo_array(([1.0, 2.0, 0.0], ([0, 0, 1], [1, 1, 0])), shape=(2, 2))).toarray()
array([[0., 3.],
       [0., 0.]])
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import scipy.sparse as sp

__all__ = ["DriverComputeError", "assert_store_matches", "canonical", "lazy_sparse_dask", "patience"]


def patience(seconds: float) -> float:
    """A test's wait limit for something that normally takes well under ``seconds`` on an idle machine (a
    subprocess reaching a state, workers joining), times ``DUFS_TEST_PATIENCE`` (default 5).

    These limits only tell a hang from slowness: on a loaded or oversubscribed machine, where starting Python with
    dask, scikit-learn and numba can take most of a minute, the unscaled figures failed tests that were merely
    slow. A hung test still fails, later."""
    return float(seconds) * float(os.environ.get("DUFS_TEST_PATIENCE", "5"))


def canonical(X: Any, fmt: str = "csr") -> Any:
    """``X`` as a SciPy ``csr_array`` (or ``csc_array``) in canonical form.

    Sorted indices, duplicates summed, no explicit zeros.

    Accepts NumPy arrays, SciPy sparse matrices and arrays, pydata ``sparse`` arrays and Dask arrays
    (computed with the synchronous scheduler).
    """
    if type(X).__module__.startswith("dask"):
        X = X.compute(scheduler="sync")
    if type(X).__module__.startswith("sparse"):
        X = X.to_scipy_sparse()
    cls = sp.csr_array if fmt == "csr" else sp.csc_array
    M = cls(X) if sp.issparse(X) else cls(np.atleast_2d(np.asarray(X)))
    M = M.copy()
    M.sum_duplicates()
    M.eliminate_zeros()
    M.sort_indices()
    return M


def _assert_same_buffers(got: Any, want: Any, what: str) -> None:
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    np.testing.assert_array_equal(
        np.asarray(got.indptr, np.int64),
        np.asarray(want.indptr, np.int64),
        err_msg=f"{what}: indptr",
    )
    np.testing.assert_array_equal(
        np.asarray(got.indices, np.int64),
        np.asarray(want.indices, np.int64),
        err_msg=f"{what}: indices",
    )
    assert got.data.dtype == want.data.dtype, f"{what}: dtype {got.data.dtype} != {want.data.dtype}"
    np.testing.assert_array_equal(got.data, want.data, err_msg=f"{what}: data", strict=True)


def assert_store_matches(
    store: Any, X: Any, y: Any = None, *, value_dtype: Any = None, check_blocks: bool = True
) -> None:
    """Assert that ``store`` holds exactly ``X`` (canonicalised, cast to ``value_dtype``) and ``y``.

    Checks shape, nnz and dtype; both orientations buffer for buffer (indptr, indices, data); every
    block against the store's bounds and per-block nnz (``check_blocks``); labels; ``feature_nnz``
    against the column counts.
    """
    want_csr = canonical(X, "csr")
    dt = np.dtype(value_dtype) if value_dtype is not None else want_csr.dtype
    want_csr = want_csr.astype(dt)
    want = {"csr": want_csr, "csc": canonical(want_csr, "csc")}
    assert tuple(store.shape) == want_csr.shape, f"shape {store.shape} != {want_csr.shape}"
    assert store.nnz == want_csr.nnz, f"nnz {store.nnz} != {want_csr.nnz}"
    assert store.dtype == dt, f"dtype {store.dtype} != {dt}"
    for o in ("csr", "csc"):
        got = store.to_scipy(o)
        assert got.format == o, f"to_scipy({o!r}) gave format {got.format}"
        _assert_same_buffers(got, want[o], f"to_scipy({o!r})")
        if not check_blocks:
            continue
        b = store.bounds(o)
        extent = want_csr.shape[0] if o == "csr" else want_csr.shape[1]
        assert b[0] == 0 and b[-1] == extent and np.all(np.diff(b) >= 0), f"{o} bounds {b}"
        assert len(store.block_nnz(o)) == len(b) - 1
        for i in range(len(b) - 1):
            blk = store.block(i, o)
            assert (blk.start, blk.stop) == (b[i], b[i + 1])
            assert blk.indptr.dtype == np.int64 and blk.indices.dtype == np.int32 and blk.data.dtype == dt
            assert blk.nnz == store.block_nnz(o)[i]
            part = want[o][b[i] : b[i + 1]] if o == "csr" else want[o][:, b[i] : b[i + 1]]
            _assert_same_buffers(blk.to_scipy(), canonical(part, o), f"{o} block {i}")
    np.testing.assert_array_equal(store.feature_nnz, np.diff(want["csc"].indptr), err_msg="feature_nnz")
    assert store.feature_nnz.dtype == np.int64
    if y is None:
        assert store.y is None and not store.has_labels
    else:
        assert store.has_labels
        np.testing.assert_array_equal(store.y, np.asarray(y, dtype=np.float64), strict=True)


class DriverComputeError(RuntimeError):
    """A chunk of :func:`lazy_sparse_dask` was computed on the process it was forbidden on."""


def _random_coo_chunk(seed: int, shape: tuple[int, int], density: float, dtype: str, forbid_pid: int | None) -> Any:
    import sparse

    if forbid_pid is not None and os.getpid() == forbid_pid:
        raise DriverComputeError(f"a chunk was computed in process {forbid_pid}, which must not materialise data")
    rng = np.random.default_rng(seed)
    M = sp.random_array(shape, density=density, format="coo", dtype=dtype, rng=rng)
    return sparse.COO.from_scipy_sparse(M)


def lazy_sparse_dask(
    shape: tuple[int, int],
    chunks: tuple[int, int],
    *,
    density: float = 0.1,
    dtype: Any = np.float64,
    seed: int = 0,
    forbid_pid: int | None = None,
) -> Any:
    """A Dask array of random ``sparse.COO`` chunks, each made only when (and where) it is computed.

    ``forbid_pid``: computing a chunk in this process raises :class:`DriverComputeError` (pass the
    driver's pid to prove a writer builds its input on the workers only). The chunks depend only on
    ``seed`` and their
    position, so :func:`canonical` of the array (computed elsewhere) is the reference.
    """
    import dask.array as da
    import sparse

    n, d = shape
    rchunks = da.core.normalize_chunks(chunks, shape)
    name = "dufs-testing-lazy-sparse-" + da.core.tokenize(shape, chunks, density, np.dtype(dtype).str, seed, forbid_pid)
    dsk = {}
    for i, rows in enumerate(rchunks[0]):
        for j, cols in enumerate(rchunks[1]):
            dsk[(name, i, j)] = (
                _random_coo_chunk,
                seed * 1_000_003 + i * 1009 + j,
                (rows, cols),
                density,
                np.dtype(dtype).str,
                forbid_pid,
            )
    meta = sparse.COO.from_numpy(np.zeros((0, 0), dtype=dtype))
    return da.Array(dsk, name, rchunks, meta=meta)
