"""What the engine takes in: the blocks of each input kind (NumPy, SciPy and pydata sparse, Dask arrays, stores),
the checks every input passes (finite values, labels), and the identity of an input (shape, nonzeros, a content
fingerprint) that a :class:`~dufs.selection.Selection` records."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from dufs import config
from dufs.data.layout import MAX_ABS, TOO_LARGE
from dufs.engine.blocks import BlockInfo, FeatureBlock, StoreBlock
from dufs.errors import ParameterError

__all__ = ["Source", "as_2d", "as_ids", "block_slab", "blocks_from_array", "blocks_from_dask", "blocks_from_store",
           "check_finite", "check_label_codes", "check_labels", "check_product_dtype", "check_standardize",
           "dask_identity", "est_bytes", "input_identity", "is_dask_array", "memory_identity", "source_of",
           "store_identity"]


_NO_IMPUTE = "dufs does not impute NaN or inf: remove or fill it"


def check_finite(data: np.ndarray, indices: np.ndarray, indptr: np.ndarray, *, col0: int = 0, where: str = "",
                 name: str = "X") -> None:
    """Raise a :class:`ParameterError` naming the first (row, feature) of a non-finite value in the CSC buffers
    ``data, indices, indptr`` (features ``col0``, ``col0 + 1``, ...; ``indices`` are row numbers), or of a value
    larger in magnitude than :data:`MAX_ABS` (finite, but its square and every sum of squares or distance it enters
    overflow: the statistics, kernels and graphs of every method would hold inf and NaN).

    One cheap pass over ``data`` when every value is in range: a sum of squares at most MAX_ABS^2 has no NaN, no
    infinite and no larger value among its terms; a larger one falls back to the exact element-wise tests (float32 data
    hold no value beyond :data:`MAX_ABS`: their plain sum, finite exactly when every value is, barring an overflow, is
    the test)."""
    if data.size == 0:
        return
    with np.errstate(all="ignore"):
        if data.dtype == np.float64:
            total = float(np.dot(data, data))
            if total <= MAX_ABS * MAX_ABS:  # False for NaN
                return
        elif np.isfinite(np.add.reduce(data, dtype=np.float64)):
            return
    bad = np.flatnonzero(~np.isfinite(data))
    what = "a non-finite value"
    fix = _NO_IMPUTE
    if bad.size == 0:  # every value is finite: any beyond the range squares and distances can hold?
        bad = np.flatnonzero(np.abs(data) > MAX_ABS)
        if bad.size == 0:  # large values, none beyond it
            return
        what = "a value too large to compute with"
        fix = TOO_LARGE
    rows = np.asarray(indices)[bad].astype(np.int64)
    cols = np.searchsorted(np.asarray(indptr), bad, side="right") - 1 + int(col0)
    i = int(np.lexsort((cols, rows))[0])
    if where:  # a block of a larger input: the first in that block (blocks are checked as they are loaded)
        note = f" (the first of {bad.size} in {where})" if bad.size > 1 else f" (in {where})"
    else:
        note = f" ({bad.size} in all)" if bad.size > 1 else ""
    raise ParameterError(f"{name} has {what} ({float(data[bad[i]])}) at row {int(rows[i])}, feature "
                         f"{int(cols[i])}{note}; {fix}")


def check_labels(y: Any, n_rows: int) -> tuple[np.ndarray, np.ndarray | None]:
    """Labels ``y`` (one per row) as float64 values, and their classes when they are not numbers.

    Numbers and booleans are kept as values (float64) and must be finite: the first NaN or infinity is an error
    naming its row. Other labels (strings, or any hashable values of one type) are classes: each becomes the index
    of its class among the sorted distinct labels (0., 1., ...), and those labels are returned as ``classes``
    (None for numbers). A column vector is taken as a vector."""
    a = np.asarray(y)
    if a.ndim == 2 and 1 in a.shape:
        a = a.ravel()
    if a.ndim != 1 or a.shape[0] != n_rows:
        raise ParameterError(f"y must hold one label per row of X ({n_rows} rows); got shape {np.shape(y)}")
    if a.dtype.kind == "O":
        try:
            if any(isinstance(v, str | bytes) for v in a):
                raise TypeError("strings")  # classes, even when they read as numbers
            a = a.astype(np.float64)
        except (TypeError, ValueError):
            missing = next((i for i, v in enumerate(a) if v is None or isinstance(v, float) and v != v), None)
            if missing is not None:
                raise ParameterError(f"y has a missing label ({a[missing]!r}) at row {missing}; dufs does not "
                                     f"impute: remove that sample or give it a label") from None
            kinds = [str if isinstance(v, str) else type(v) for v in a]
            odd = next((i for i, k in enumerate(kinds) if k is not kinds[0]), None)
            if odd is not None:
                raise ParameterError(f"y mixes label types: row {odd} has {a[odd]!r} ({kinds[odd].__name__}) where "
                                     f"row 0 has {a[0]!r} ({kinds[0].__name__}); give every sample a label of one "
                                     f"type") from None
    if a.dtype.kind == "c":
        raise ParameterError(f"y must hold real numbers or class labels; got complex values ({a.dtype})")
    if a.dtype.kind in "biuf":
        v = a.astype(np.float64)
        with np.errstate(all="ignore"):
            ok = np.isfinite(np.add.reduce(v)) if v.size else True
        if not ok:
            bad = np.flatnonzero(~np.isfinite(v))
            if bad.size:
                more = f" ({bad.size} in all)" if bad.size > 1 else ""
                raise ParameterError(f"y has a non-finite value ({v[bad[0]]}) at row {int(bad[0])}{more}; dufs does "
                                     f"not impute NaN or inf: remove that sample or give it a label")
        return v, None
    try:
        classes, codes = np.unique(a, return_inverse=True)
    except TypeError as exc:
        raise ParameterError(f"y holds labels that cannot be ordered ({exc}); give class labels as numbers or "
                             f"strings") from None
    return codes.reshape(-1).astype(np.float64), classes


def _sha(*parts: Any) -> str:
    """A short SHA-256 hex digest of arrays (their bytes) and plain values (their repr), in order."""
    import hashlib

    h = hashlib.sha256()
    for p in parts:
        if isinstance(p, np.ndarray):
            h.update(np.ascontiguousarray(p).data)
        else:
            h.update(repr(p).encode())
        h.update(b"|")
    return h.hexdigest()[:32]


def _fingerprint_csc(A: Any) -> str:
    """The content fingerprint of an in-memory matrix in its canonical CSC form (:func:`_canonical_csc`): SHA-256
    of its shape, value dtype, indptr, row indices and values, so NumPy, SciPy (any format) and pydata inputs of the
    same matrix and dtype agree."""
    idx = A.indices.astype(np.int32 if A.shape[0] < 2**31 else np.int64, copy=False)
    return "sha256-csc:" + _sha(tuple(int(s) for s in A.shape), str(A.dtype), A.indptr.astype(np.int64, copy=False),
                                idx, A.data)


def _feature_ids_digest(ids: np.ndarray) -> str:
    ids = np.asarray(ids)
    if ids.dtype.kind in "iu":
        return _sha("int", ids.astype(np.int64))
    return _sha("str", "\x00".join(str(v) for v in ids.tolist()))


def store_identity(store: Any, feature_ids: np.ndarray | None = None) -> dict:
    keyed = store.meta.fingerprint_fields()
    out = {"kind": "store", "path": store.path, "shape": [int(s) for s in store.shape], "nnz": int(store.nnz),
           "dtype": str(store.dtype), "created": store.meta.created,
           "fingerprint": "store-meta:" + _sha(sorted(keyed.items())),
           "fingerprint_of": "the store's metadata: shape, nnz, dtype, block bounds and nonzeros per block, and the "
                             "crc32c of every feature block and of the labels (stores written since they are "
                             "recorded); the data are not read"}
    if feature_ids is not None:
        out["feature_ids"] = _feature_ids_digest(feature_ids)
    return out


def dask_identity(X: Any) -> dict:
    return {"kind": "dask", "type": type(X).__name__, "shape": [int(s) for s in X.shape], "nnz": None,
            "dtype": str(X.dtype), "chunks": [[int(c) for c in cs] for cs in X.chunks], "fingerprint": None,
            "fingerprint_of": "nothing: a Dask array is identified by its shape and chunks only (fingerprinting its "
                              "content would compute it)"}


def memory_identity(kind: str, shape: tuple[int, int], nnz: int, dtype: Any, fingerprint: str) -> dict:
    return {"kind": "memory", "type": kind, "shape": [int(s) for s in shape], "nnz": int(nnz), "dtype": str(dtype),
            "fingerprint": fingerprint,
            "fingerprint_of": "SHA-256 of the matrix in canonical CSC form (shape, dtype, indptr, indices, values)"}


def input_identity(X: Any, *, feature_ids: bool = True) -> dict:
    """What identifies an input, cheaply, without building a :class:`Matrix`: ``kind`` ("store", "memory" or
    "dask"), ``shape``, ``nnz`` (None for a Dask array), ``dtype``, ``fingerprint`` (None for a Dask array) and
    what it was taken of (``fingerprint_of``), plus ``path`` (and ``created``) for a store, ``chunks`` for a Dask
    array and ``feature_ids`` (a digest) for a store that has them (read when ``feature_ids``).

    - a store (a :class:`~dufs.data.SparseStore`, a path or a URL): from its metadata only (shape, nnz, dtype, block
      bounds and nonzeros per block); the data are not read;
    - in-memory input (NumPy, SciPy sparse, pydata sparse): SHA-256 of its canonical CSC form, one pass over it;
    - a Dask array: shape and chunks only (no content fingerprint, nothing is computed).

    (A :class:`Matrix` keeps the identity of what it was built from in ``Matrix.identity``.)
    """
    if isinstance(X, str | os.PathLike):
        from dufs.data import open_store

        X = open_store(X)
    from dufs.data import SparseStore

    if isinstance(X, SparseStore):
        return store_identity(X, X.feature_ids if feature_ids else None)
    if is_dask_array(X):
        if X.ndim != 2:
            raise ParameterError(f"The 'X' parameter must be 2-D; got a {X.ndim}-D Dask array.")
        return dask_identity(X)
    kind = type(X).__name__
    if type(X).__module__.startswith("sparse"):
        X = X.to_scipy_sparse()
    A = _canonical_csc(_as_csc(X))
    return memory_identity(kind, A.shape, A.nnz, A.dtype, _fingerprint_csc(A))


def block_slab(start, stop, n_rows, chunks):
    """A feature block from the row chunks of one column slab of a Dask array (dense or sparse chunks)."""
    import scipy.sparse as sp

    parts = []
    for c in chunks:
        if hasattr(c, "to_scipy_sparse"):
            c = c.to_scipy_sparse()
        parts.append(sp.csc_array(c) if sp.issparse(c) else sp.csc_array(np.asarray(c)))
    A = sp.csc_array(sp.vstack(parts, format="csc")) if len(parts) > 1 else parts[0]
    if A.shape != (n_rows, stop - start):
        raise ParameterError(f"a column slab of the Dask array has shape {A.shape}, expected {(n_rows, stop - start)}")
    if A.dtype.kind != "f":
        A = A.astype(np.float64)
    A.sum_duplicates()
    A.eliminate_zeros()
    A.sort_indices()
    check_finite(A.data, A.indices, A.indptr, col0=start, where=f"features {start}-{stop - 1} of the Dask array")
    return FeatureBlock(start, stop, A.indptr.astype(np.int64), A.indices.astype(np.int32), A.data)


def est_bytes(blocks: list, dtype: Any) -> int:
    item = np.dtype(dtype).itemsize + 4
    return int(sum(b.nnz * item + 8 * (b.width + 1) for b in blocks))


def is_dask_array(X: Any) -> bool:
    return type(X).__module__.startswith("dask.array") or type(X).__name__ == "Array" and hasattr(X, "dask")


def blocks_from_store(store: Any) -> list[StoreBlock]:
    bounds, nnz = store.bounds("csc"), store.block_nnz("csc")
    created = store.meta.created
    return [StoreBlock(int(bounds[i]), int(bounds[i + 1]), int(nnz[i]), store.path, i, created)
            for i in range(store.n_blocks("csc"))]


def blocks_from_dask(X: Any, block_width: int | None) -> tuple[list, list, tuple[int, int], np.dtype]:
    import dask

    if X.ndim != 2:
        raise ParameterError(f"The 'X' parameter must be 2-D; got a {X.ndim}-D Dask array.")
    if any(math.isnan(c) for cs in X.chunks for c in cs):
        raise ParameterError("The Dask array has unknown chunk sizes: call X.compute_chunk_sizes() first.")
    if block_width is not None:
        if not isinstance(block_width, int | np.integer) or block_width < 1:
            raise ParameterError(f"The 'block_width' parameter must be an int >= 1; got {block_width!r}.")
        X = X.rechunk({1: int(block_width)})
    n, d = (int(s) for s in X.shape)
    D = X.to_delayed()
    cb = np.concatenate([[0], np.cumsum(X.chunks[1])]).astype(np.int64)
    f = dask.delayed(block_slab, pure=True)
    src = [f(int(cb[j]), int(cb[j + 1]), n, [D[i, j] for i in range(D.shape[0])]) for j in range(D.shape[1])]
    dtype = X.dtype if np.dtype(X.dtype).kind == "f" else np.dtype(np.float64)
    infos = [BlockInfo(int(cb[j]), int(cb[j + 1])) for j in range(D.shape[1])]
    return src, infos, (n, d), dtype


def _as_csc(X: Any) -> Any:
    """An in-memory matrix (NumPy, SciPy sparse; pydata sparse converted before) as a SciPy ``csc_array`` copy."""
    import scipy.sparse as sp

    if sp.issparse(X):
        return sp.csc_array(X, copy=True)
    if isinstance(X, np.ndarray):
        if X.ndim != 2:
            raise ParameterError(f"The 'X' parameter must be 2-D; got {X.ndim}-D.")
        if X.dtype == np.float16:
            X = X.astype(np.float32)  # exactly; SciPy sparse has no float16
        elif X.dtype.kind not in "biuf":
            try:
                X = X.astype(np.float64)
            except (TypeError, ValueError):
                raise ParameterError(f"X must hold numbers; got a NumPy array of dtype {X.dtype} that does not "
                                     f"convert to float: convert it, or encode its categories first") from None
        return sp.csc_array(X)
    raise ParameterError(f"The 'X' parameter must be a SparseStore, a store path, a SciPy or pydata sparse "
                         f"matrix, a Dask array or a NumPy array; got {type(X).__name__}.")


def _canonical_csc(A: Any) -> Any:
    """``A`` (a SciPy ``csc_array``) with float values, no duplicates or explicit zeros, sorted indices: the form
    the blocks are cut from and the fingerprint is taken of (in place)."""
    if A.dtype.kind != "f":
        A = A.astype(np.float64)
    A.sum_duplicates()
    A.eliminate_zeros()
    A.sort_indices()
    return A


def blocks_from_array(X: Any, block_width: int | None) -> tuple[list[FeatureBlock], tuple[int, int], np.dtype,
                                                                  str]:
    A = _canonical_csc(_as_csc(X))
    check_finite(A.data, A.indices, A.indptr)
    fingerprint = _fingerprint_csc(A)
    n, d = (int(s) for s in A.shape)
    if block_width is None:
        target = max(1, int(config.get("store.feature-block-nnz")))
        nb = max(1, math.ceil(A.nnz / target))
        block_width = max(1, math.ceil(d / nb))
    if not isinstance(block_width, int | np.integer) or block_width < 1:
        raise ParameterError(f"The 'block_width' parameter must be an int >= 1; got {block_width!r}.")
    block_width = int(block_width)
    indptr = A.indptr.astype(np.int64)
    blocks = []
    for a in range(0, d, block_width):
        b = min(d, a + block_width)
        lo, hi = indptr[a], indptr[b]
        blocks.append(FeatureBlock(a, b, indptr[a:b + 1] - lo, A.indices[lo:hi].astype(np.int32),
                                   A.data[lo:hi].copy()))
    return blocks, (n, d), A.dtype, fingerprint


_STANDARDIZE_VALUES = ("zscore", "scale", None, "auto")


def check_standardize(standardize: Any) -> None:
    if standardize not in _STANDARDIZE_VALUES:
        raise ParameterError(f"The 'standardize' parameter must be one of 'zscore', 'scale', None or 'auto'; got "
                             f"{standardize!r}.")


def as_ids(ids: Any, d: int) -> np.ndarray:
    a = np.asarray(ids)
    if a.ndim != 1 or (a.size and a.dtype.kind not in "iu"):
        raise ParameterError(f"feature ids must be a 1-D sequence of ints; got {ids!r}")
    a = a.astype(np.int64)
    bad = (a < 0) | (a >= d)
    if bad.any():
        raise ParameterError(f"feature id {int(a[bad][0])} is out of range for {d} features")
    return a


def check_product_dtype(dtype: Any, name: str) -> None:
    """A product's ``dtype``: float32 or float64."""
    if np.dtype(dtype) not in (np.float32, np.float64):
        raise ParameterError(f"The 'dtype' parameter of {name} must be float32 or float64; got {dtype!r}.")


def check_label_codes(labels: Any, n_labels: Any, n: int) -> tuple[np.ndarray, np.ndarray | None]:
    """``labels`` (integers in [0, n_labels), one a sample) checked for ``Matrix.label_rmatvec``, and each label's
    count (None for no samples)."""
    if isinstance(n_labels, bool) or not isinstance(n_labels, int | np.integer) or n_labels < 1:
        raise ParameterError(f"The 'n_labels' parameter of label_rmatvec must be an int >= 1; got {n_labels!r}.")
    c = int(n_labels)
    lab = np.asarray(labels)
    if lab.shape != (n,) or (lab.size and lab.dtype.kind not in "iu"):
        raise ParameterError(f"The 'labels' parameter of label_rmatvec must be integers of shape (n_samples,) "
                             f"= ({n},); got {lab.dtype} of shape {lab.shape}.")
    counts = np.bincount(lab, minlength=c) if lab.size and lab.min() >= 0 else None
    if lab.size and (counts is None or counts.shape[0] > c):
        raise ParameterError(f"The 'labels' parameter of label_rmatvec must lie in [0, n_labels) = [0, {c}); "
                             f"got values in [{lab.min()}, {lab.max()}].")
    return lab, counts


def as_2d(V: Any, n: int, name: str, what: str, keep_float32: bool = False) -> tuple[np.ndarray, bool]:
    V = np.asarray(V)
    V = V.astype(np.float32 if keep_float32 and V.dtype == np.float32 else np.float64, copy=False)
    if V.ndim not in (1, 2) or V.shape[0] != n:
        raise ParameterError(f"The '{name}' parameter must have shape ({what},) or ({what}, p) with {what}={n}; "
                             f"got {V.shape}.")
    one = V.ndim == 1
    return np.ascontiguousarray(V[:, None] if one else V), one


@dataclass(frozen=True)
class Source:
    """What a matrix is built over (:func:`source_of`): the blocks' sources and their
    :class:`~dufs.engine.blocks.BlockInfo`, the shape and dtype, the labels the input carries, where the blocks
    live (``residency``), the input's identity, and a store's path and feature ids."""

    src: list
    blocks: list
    shape: tuple[int, int]
    dtype: Any
    labels: Any
    residency: dict
    identity: dict
    store_path: str | None = None
    feature_ids: np.ndarray | None = None


def source_of(X: Any, block_width: int | None, y: Any) -> Source:
    """The :class:`Source` of a store (a :class:`~dufs.data.SparseStore` or its path), a Dask array or an in-memory
    matrix (NumPy, SciPy or pydata sparse); ``y`` given overrides a store's labels."""
    if isinstance(X, str | os.PathLike):
        from dufs.data import open_store

        X = open_store(X)
    from dufs.data import SparseStore

    if isinstance(X, SparseStore):
        src = blocks_from_store(X)
        return Source(src, [BlockInfo(b.start, b.stop, b.nnz) for b in src], X.shape, X.dtype,
                      X.y if y is None else y,
                      {"mode": "store", "bytes": est_bytes(src, X.dtype),
                       "reason": "not persisted: blocks are read on the workers, cached per process"},
                      store_identity(X, X.feature_ids), X.path, X.feature_ids)
    if is_dask_array(X):
        src, infos, shape, dtype = blocks_from_dask(X, block_width)
        return Source(src, infos, shape, dtype, y,
                      {"mode": "source", "bytes": None,
                       "reason": "not persisted: blocks are recomputed from the Dask graph each pass"},
                      dask_identity(X))
    kind = type(X).__name__
    if type(X).__module__.startswith("sparse"):
        X = X.to_scipy_sparse()
    src, shape, dtype, fingerprint = blocks_from_array(X, block_width)
    return Source(src, [BlockInfo(b.start, b.stop, b.nnz) for b in src], shape, dtype, y,
                  {"mode": "driver", "bytes": sum(b.nbytes for b in src), "reason": "in memory in this process"},
                  memory_identity(kind, shape, sum(b.nnz for b in src), dtype, fingerprint))
