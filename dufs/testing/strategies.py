"""Hypothesis strategies for dufs: sparse matrices with their edge cases, and store blockings.

>>> from hypothesis import given
>>> from dufs.testing.strategies import blockings, sparse_matrices
>>> @given(X=sparse_matrices(max_rows=20, max_cols=20), b=blockings(max_blocks=4))
... def test_something(X, b):
...     with b.config():
...         ...

The matrices are SciPy ``csr_array`` s. Their sparsity pattern comes from a drawn seed (patterns
of up to a few thousand cells drawn cell by cell would make examples slow); their shape, density,
edge case and values are drawn by Hypothesis and shrink. Values are finite and at most
:data:`dufs.data.layout.MAX_ABS` in magnitude (what dufs accepts); with
``canonical=False`` a matrix may also carry explicit zeros, duplicate entries and unsorted indices
(what a store's writer must canonicalise away).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from dufs.data.layout import MAX_ABS

__all__ = ["EDGE_CASES", "Blocking", "blockings", "densities", "sparse_matrices", "value_dtypes"]

#: the shapes of sparsity :func:`sparse_matrices` draws from
EDGE_CASES = ("general", "empty_rows", "empty_cols", "single_row", "single_col", "zero_nnz", "full")

value_dtypes = st.sampled_from([np.dtype(np.float64), np.dtype(np.float32)])


def densities() -> st.SearchStrategy[float]:
    """Densities with the interesting ends pinned: nothing, very sparse, half, everything."""
    return st.one_of(st.sampled_from([0.0, 0.01, 0.1, 0.5, 1.0]), st.floats(0.0, 1.0))


def _values(dtype: np.dtype, n: int) -> st.SearchStrategy[np.ndarray]:
    width = 32 if dtype == np.float32 else 64
    # any value dufs accepts: float32's range lies within MAX_ABS
    big = MAX_ABS if width == 64 else None
    finite = st.floats(min_value=None if big is None else -big, max_value=big, allow_nan=False, allow_infinity=False,
                       width=width, allow_subnormal=True)
    # mostly small integers (word counts, labels-like data), sometimes any finite float of the dtype
    elements = st.one_of(st.integers(-3, 9).map(float), finite)
    return hnp.arrays(dtype, n, elements=elements)


@st.composite
def sparse_matrices(
    draw: st.DrawFn,
    *,
    min_rows: int = 1,
    max_rows: int = 30,
    min_cols: int = 1,
    max_cols: int = 30,
    dtype: Any = None,
    density: float | None = None,
    edge_case: str | None = None,
    canonical: bool = True,
) -> sp.csr_array:
    """A SciPy ``csr_array`` of finite values, covering the edge cases of :data:`EDGE_CASES`.

    Parameters
    ----------
    min_rows, max_rows, min_cols, max_cols : int
        Shape bounds (a single-row / single-column edge case still needs ``min_* <= 1``).
    dtype : dtype, optional
        float64 or float32; drawn from both when not given.
    density : float, optional
        Fraction of stored cells; drawn (:func:`densities`) when not given.
    edge_case : str, optional
        One of :data:`EDGE_CASES`; drawn when not given.
    canonical : bool
        If False, the matrix may carry explicit zeros, duplicates and unsorted indices (the same
        values as its canonical form after ``sum_duplicates``).
    """
    dt = np.dtype(dtype) if dtype is not None else draw(value_dtypes)
    case = edge_case if edge_case is not None else draw(st.sampled_from(EDGE_CASES))
    if case not in EDGE_CASES:
        raise ValueError(f"edge_case must be one of {EDGE_CASES}; got {case!r}")
    n = 1 if case == "single_row" and min_rows <= 1 else draw(st.integers(min_rows, max(min_rows, max_rows)))
    d = 1 if case == "single_col" and min_cols <= 1 else draw(st.integers(min_cols, max(min_cols, max_cols)))
    dens = {"zero_nnz": 0.0, "full": 1.0}.get(case, density if density is not None else draw(densities()))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    mask = rng.random((n, d)) < dens
    if case == "empty_rows" and n:
        mask[rng.random(n) < 0.5] = False
        mask[rng.integers(n)] = False  # at least one
    if case == "empty_cols" and d:
        mask[:, rng.random(d) < 0.5] = False
        mask[:, rng.integers(d)] = False
    rows, cols = np.nonzero(mask)
    vals = draw(_values(dt, rows.shape[0]))
    keep = vals != 0
    rows, cols, vals = rows[keep], cols[keep], vals[keep]
    if canonical or not draw(st.booleans()):
        X = sp.csr_array((vals, (rows, cols)), shape=(n, d), dtype=dt)
        X.sum_duplicates()
        X.sort_indices()
        return X
    # non-canonical: split some entries into duplicates, add explicit zeros, shuffle within rows
    k = rows.shape[0]
    split = rng.random(k) < 0.3
    half = (vals[split] / 2).astype(dt)
    rows = np.concatenate([rows, rows[split]])
    cols = np.concatenate([cols, cols[split]])
    first = vals.copy()
    first[split] = half
    vals = np.concatenate([first, (vals[split] - half).astype(dt)]).astype(dt)
    nz = int(rng.integers(0, 4)) if n and d else 0
    rows = np.concatenate([rows, rng.integers(0, max(n, 1), nz)])
    cols = np.concatenate([cols, rng.integers(0, max(d, 1), nz)])
    vals = np.concatenate([vals, np.zeros(nz, dt)])
    order = np.lexsort((rng.random(rows.shape[0]), rows))  # rows ascending, columns shuffled
    rows, cols, vals = rows[order], cols[order], vals[order]
    indptr = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=n))]).astype(np.int64)
    return sp.csr_array((vals, cols.astype(np.int32), indptr), shape=(n, d))


@dataclass(frozen=True)
class Blocking:
    """Store block sizes: the ``dufs.store.*`` settings and ``write_store``'s ``feature_block``."""

    row_block: int
    granule: int
    block_nnz: int
    chunk_elements: int
    feature_block: int | None = None

    def settings(self) -> dict[str, int]:
        return {
            "dufs.store.row-block": self.row_block,
            "dufs.store.feature-granule": self.granule,
            "dufs.store.feature-block-nnz": self.block_nnz,
            "dufs.store.chunk-elements": self.chunk_elements,
        }

    @contextlib.contextmanager
    def config(self) -> Iterator[Blocking]:
        """Use as ``with b.config(): write_store(X, path, feature_block=b.feature_block)``."""
        import dask

        with dask.config.set(self.settings()):
            yield self

    def with_feature_block(self, feature_block: int | None) -> Blocking:
        return Blocking(self.row_block, self.granule, self.block_nnz, self.chunk_elements, feature_block)


@st.composite
def blockings(
    draw: st.DrawFn,
    *,
    n_rows: int | None = None,
    n_cols: int | None = None,
    nnz: int | None = None,
    max_blocks: int = 4,
    max_chunks: int = 8,
    feature_block: bool | None = None,
) -> Blocking:
    """Block sizes giving at most ``max_blocks`` blocks each way, ``max_chunks`` chunks per array.

    Pass the matrix's ``n_rows``, ``n_cols`` and ``nnz`` to get blockings that cut it (several
    blocks, blocks that split granules, chunks smaller than blocks) while keeping the counts bounded
    (per-block overhead is real). ``feature_block``: True for a fixed number of features per block,
    False for the nnz-balanced default, None to draw either.
    """
    big = 64
    n = big if n_rows is None else max(1, n_rows)
    d = big if n_cols is None else max(1, n_cols)
    m = big * big if nnz is None else max(1, nnz)
    row_block = draw(st.integers(max(1, math.ceil(n / max_blocks)), max(1, n + 1)))
    granule = draw(st.integers(max(1, math.ceil(d / max_blocks)), max(1, d + 1)))
    block_nnz = draw(st.integers(1, m + 1))
    chunk_elements = draw(st.integers(max(1, math.ceil(max(n + 1, d + 1, m) / max_chunks)), m + n + d + 2))
    fixed = draw(st.booleans()) if feature_block is None else feature_block
    fb = draw(st.integers(granule, max(granule, d + 1))) if fixed else None
    return Blocking(row_block, granule, block_nnz, chunk_elements, fb)
