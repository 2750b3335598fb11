"""Writing a store from in-memory or Dask input: NumPy, SciPy sparse, pydata ``sparse``, Dask arrays.

Dask input is written out of core: each row slab is computed on a worker and written there, so the whole matrix
is never materialised anywhere.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
from typing import Any

import numpy as np
import scipy.sparse as sp

from dufs import config
from dufs.data.builder import StoreBuilder
from dufs.data.layout import MAX_ABS, TOO_LARGE
from dufs.data.store import SparseStore
from dufs.errors import ParameterError
from dufs.scheduling import current_client


def _csr_buffers(block: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Canonical CSR buffers (sorted indices, duplicates summed, explicit zeros dropped) of a 2-D block."""
    block = _widen(block)
    if isinstance(block, np.ndarray) or np.isscalar(block):
        m = sp.csr_array(np.atleast_2d(np.asarray(block)))
    elif sp.issparse(block):
        m = sp.csr_array(block)
    elif type(block).__module__.startswith("sparse"):
        m = sp.csr_array(block.to_scipy_sparse())
    else:
        m = sp.csr_array(np.asarray(block))
    m.sum_duplicates()
    m.eliminate_zeros()
    m.sort_indices()
    return m.indptr.astype(np.int64), m.indices, m.data


def _widen(x: Any) -> Any:
    """float16 input as float32 (exactly): SciPy sparse has no float16."""
    return x.astype(np.float32) if getattr(x, "dtype", None) == np.float16 else x


def _check_finite(data: np.ndarray, what: str) -> None:
    if data.size and not np.isfinite(data).all():
        raise ParameterError(f"{what} contains NaN or infinite values; dufs stores finite numbers only")


def _check_finite_rows(indptr: np.ndarray, indices: np.ndarray, data: np.ndarray, row0: int,
                       scope: str = "in this block of rows") -> None:
    """The first non-finite value of CSR rows ``row0, row0 + 1, ...``, or of float64 values beyond
    :data:`~dufs.data.layout.MAX_ABS`, named by its row and feature (float32 holds none that large). One sweep when
    every value is in range: a float64 sum of squares at most MAX_ABS^2 has no NaN, inf or larger value among its
    terms."""
    if not data.size:
        return
    with np.errstate(all="ignore"):
        if data.dtype == np.float64 and float(np.dot(data, data)) <= MAX_ABS * MAX_ABS:  # False for NaN
            return
    if not np.isfinite(data).all():
        bad = np.flatnonzero(~np.isfinite(data))
        what, fix = "a non-finite value", "dufs stores finite numbers only: remove or fill it"
    elif data.dtype == np.float64:
        bad = np.flatnonzero(np.abs(data) > MAX_ABS)
        what, fix = "a value too large to compute with", TOO_LARGE
    else:
        return
    if not bad.size:  # large values, none beyond the bound
        return
    first = int(bad[0])  # CSR order is (row, feature) order
    row = row0 + int(np.searchsorted(indptr, first, side="right")) - 1
    more = f" ({bad.size} {scope})" if bad.size > 1 else ""
    raise ParameterError(f"X has {what} ({float(data[first])}) at row {row}, feature {int(indices[first])}{more}; "
                         f"{fix}")


def _write_slab(builder: StoreBuilder, i: int, slab: Any, y: Any, row0: int = 0) -> int:
    indptr, indices, data = _csr_buffers(slab)
    _check_finite_rows(indptr, indices, data, row0)
    with np.errstate(over="ignore"):
        cast = data.astype(builder.value_dtype, copy=False)
    if not np.isfinite(cast).all():
        raise ParameterError(f"row block {i} has values beyond the range of {builder.value_dtype}; "
                             f"pass value_dtype=np.float64")
    if y is not None:
        y = np.asarray(y, dtype=np.float64).ravel()
        _check_finite(y, f"labels of row block {i}")
    builder.write_row_block(i, indptr, indices, data, y)
    return int(indptr[-1])


def _compute_to_the_end(tasks: list, *, local: bool = False) -> tuple:
    """``dask.compute(*tasks)`` that, when a task fails, lets the running ones finish before raising.

    ``write_store`` removes the partial store after a failure: a block still being written then would recreate
    it, and the removal itself would fail on the directory being written into. ``local``: on local threads even
    when a distributed client is active (for in-memory input).
    """
    import dask

    scheduler = dask.config.get("scheduler", None)
    client = None if local else current_client()
    if client is not None:
        from distributed import wait

        futures = client.compute(tasks)
        try:
            wait(futures)  # every task finished or failed
            return tuple(client.gather(futures))
        finally:  # released now: a failure's traceback would keep them (and their results on the workers) alive
            for f in futures:
                f.release()
    if scheduler is not None and not local:
        return dask.compute(*tasks)
    pool = cf.ThreadPoolExecutor(os.cpu_count() or 1)
    try:
        return dask.compute(*tasks, scheduler="threads", pool=pool)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)  # running tasks end before the caller cleans up


def write_store(X: Any, path: str | os.PathLike, y: Any = None, *, feature_ids: Any = None,
                row_block: int | None = None, feature_block: int | None = None, value_dtype: Any = None,
                overwrite: bool = False, provenance: dict | None = None,
                ground_truth: dict | None = None) -> SparseStore:
    """Write ``X`` (n_samples x n_features) and optional labels ``y`` to a dufs store at ``path``.

    Parameters
    ----------
    X : numpy.ndarray, scipy.sparse matrix/array, sparse.COO/GCXS or dask.array.Array
        Dask arrays may have dense or sparse chunks; they are written slab by slab on the workers.
    path : str or path-like
        Local directory or fsspec URL (``memory://...``).
    y : array-like, optional
        Labels, one per row.
    row_block : int, optional
        Rows per CSR block (default ``dufs.store.row-block``).
    feature_block : int, optional
        Features per CSC block; by default blocks are balanced by nonzeros (``dufs.store.feature-block-nnz``).
    overwrite : bool
        Replace a dufs store at ``path`` (the old one stays readable as it was until the new one is complete).
        Anything else there (a file, a directory of other files) is refused with a ``StoreError`` before any work.

    Returns
    -------
    SparseStore
    """
    row_block, n_rows, n_features = _check_write_args(X, y, row_block)
    b = StoreBuilder(path, value_dtype=value_dtype or _default_dtype(X), overwrite=overwrite,
                     options={"writer": "write_store", "row_block": row_block})
    b.begin()
    try:
        if _is_dask(X):
            _write_dask(b, X, y, row_block)
        else:
            _write_in_memory(b, X, y, row_block, n_rows)
        if n_rows == 0:
            b.write_row_block(0, np.zeros(1, np.int64), np.empty(0, np.int32), np.empty(0),
                              None if y is None else np.empty(0))
        return b.finalize(n_features=n_features, feature_ids=feature_ids, feature_block=feature_block,
                          provenance={"source": "write_store", "input_type": type(X).__name__,
                                      **(provenance or {})},
                          ground_truth=ground_truth)
    except BaseException:
        b.abort(remove=True)
        raise


def _check_write_args(X: Any, y: Any, row_block: int | None) -> tuple[int, int, int]:
    """write_store's arguments checked, before anything is written: the rows per block, and X's shape."""
    row_block = int(config.get("store.row-block") if row_block is None else row_block)  # 0 is an error
    if row_block < 1:
        raise ParameterError(f"The 'row_block' parameter of write_store must be an int >= 1; got {row_block}.")
    if getattr(X, "ndim", 2) != 2:
        raise ParameterError(f"The 'X' parameter of write_store must be 2-D; got {getattr(X, 'ndim', '?')}-D.")
    n_rows, n_features = (int(s) for s in X.shape)
    if y is not None and len(y) != n_rows:
        raise ParameterError(f"X has {n_rows} rows but y has {len(y)} labels")
    if y is not None and not _is_dask(y):
        if np.asarray(y).dtype.kind not in "biuf":
            raise ParameterError(f"y holds labels of dtype {np.asarray(y).dtype}; a store keeps numeric labels: "
                                 f"encode the classes first (classes, y = np.unique(y, return_inverse=True))")
        _check_finite(np.asarray(y, dtype=np.float64), "y")
    return row_block, n_rows, n_features


def _write_dask(b: StoreBuilder, X: Any, y: Any, row_block: int) -> None:
    """Write a Dask array's row blocks: each slab computed and written by a task, on the workers."""
    import dask
    import dask.array as da

    Xr = X.rechunk({0: row_block, 1: -1})
    parts = Xr.to_delayed().ravel()
    if y is not None:
        yd = y if _is_dask(y) else da.from_array(np.asarray(y), chunks=row_block)
        ys = yd.rechunk(Xr.chunks[0]).to_delayed().ravel()
    else:
        ys = [None] * len(parts)
    row0 = np.concatenate([[0], np.cumsum(Xr.chunks[0])[:-1]]).astype(int)
    tasks = [dask.delayed(_write_slab)(b, i, part, yy, int(row0[i]))
             for i, (part, yy) in enumerate(zip(parts, ys, strict=True))]
    _compute_to_the_end(tasks)


def _write_in_memory(b: StoreBuilder, X: Any, y: Any, row_block: int, n_rows: int) -> None:
    """Write in-memory input's row blocks on local threads, its first non-finite value refused before any write."""
    import dask

    M = X
    if type(X).__module__.startswith("sparse"):
        M = _widen(X).to_scipy_sparse()
    if sp.issparse(M):
        M = sp.csr_array(M)  # shares the caller's buffers when X is a CSR array already
        if not M.has_sorted_indices:
            M = M.copy()  # sorted here, not in the caller's array
            M.sort_indices()
        _check_finite_rows(M.indptr, M.indices, M.data, 0, "in all")  # the first of all, before any write
    elif isinstance(M, np.ndarray) and M.size and not np.isfinite(M).all():
        r, c = np.argwhere(~np.isfinite(M))[0]
        n_bad = int((~np.isfinite(M)).sum())
        raise ParameterError(f"X has a non-finite value ({float(M[r, c])}) at row {int(r)}, feature {int(c)}"
                             + (f" ({n_bad} in all)" if n_bad > 1 else "")
                             + "; dufs stores finite numbers only: remove or fill it")
    ya = None if y is None else np.asarray(y)
    tasks = [dask.delayed(_write_slab)(b, i, M[a:a + row_block], None if ya is None else ya[a:a + row_block], a)
             for i, a in enumerate(range(0, n_rows, row_block))]
    _compute_to_the_end(tasks, local=True)


def _is_dask(x: Any) -> bool:
    return type(x).__module__.startswith("dask")


def _default_dtype(X: Any) -> Any:
    dt = np.dtype(getattr(X, "dtype", np.float64))
    if dt.kind == "f":
        return dt if dt.itemsize >= 4 else np.float32
    return None


def _write_synthetic_block(builder: StoreBuilder, spec: Any, i: int, start: int, stop: int) -> int:
    from dufs.data.synthetic import generate_rows

    indptr, indices, data, y = generate_rows(spec, start, stop)
    builder.write_row_block(i, indptr, indices, data, y)
    return int(indptr[-1])


def make_synthetic(path: str | os.PathLike, spec: Any, *, row_block: int | None = None,
                   feature_block: int | None = None, overwrite: bool = False, resume: bool = False,
                   client: Any = None, progress: Any = None) -> SparseStore:
    """Write a synthetic kddb-like store block by block, straight into the store (no text detour).

    Row blocks are generated and written as tasks on the cluster (the active client, else local threads); the
    data depend only on ``spec`` (its seed), never on the blocking or the number of workers. The informative
    features and weights go into the store's attributes as ground truth. ``overwrite`` replaces only a dufs store
    (see :func:`write_store`).
    """
    from dufs.data._exec import Executor

    row_block = int(config.get("store.row-block") if row_block is None else row_block)  # 0 is an error
    if row_block < 1:
        raise ParameterError(f"The 'row_block' parameter of make_synthetic must be an int >= 1; got {row_block}.")
    gt = spec.ground_truth()
    b = StoreBuilder(path, value_dtype=np.float32, overwrite=overwrite, resume=resume,
                     options={"writer": "make_synthetic", "spec": gt, "n_rows": spec.n_rows,
                              "n_features": spec.n_features, "nnz_per_row": spec.nnz_per_row,
                              "row_block": row_block})
    done = b.begin()
    ex = Executor(client)
    try:
        starts = list(range(0, spec.n_rows, row_block)) or [0]
        todo = [(i, a) for i, a in enumerate(starts) if i not in done]
        futs = [ex.submit(_write_synthetic_block, b, spec, i, a, min(a + row_block, spec.n_rows))
                for i, a in todo]
        for f in ex.as_completed(futs):
            nnz = f.result()
            if progress:
                progress({"stage": "generate", "blocks": 1, "nnz": nnz, "total_blocks": len(todo)})
        return b.finalize(n_features=spec.n_features, feature_block=feature_block, executor=ex,
                          provenance={"source": "make_synthetic", "generator": gt.get("generator")},
                          ground_truth=gt,
                          progress=(lambda stage, k, n: progress({"stage": stage, "done": k, "total": n}))
                          if progress else None)
    except BaseException:
        b.abort(remove=False)
        raise
    finally:
        ex.close()
