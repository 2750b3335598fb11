"""Columns of the feature-blocked matrix (part of :class:`~dufs.engine.matrix.Matrix`): raw columns gathered from
the blocks that hold them, one made where its block lives, transformed dense columns and kernel columns over the
features."""

from __future__ import annotations

from typing import Any

import numpy as np

from dufs.engine.blocks import block_column, block_columns
from dufs.engine.dispatch import current_client, delayed
from dufs.engine.executor import inline_when_small
from dufs.engine.inputs import as_ids
from dufs.errors import ParameterError

__all__ = ["ColumnAccess"]


class ColumnAccess:
    """:class:`~dufs.engine.matrix.Matrix`'s column methods (a mixin: its shape, blocks, transform, executor and
    products are the matrix's)."""

    @inline_when_small
    def columns(self, ids: Any) -> Any:
        """Columns ``ids`` of X (untransformed) as a SciPy ``csc_array`` (n_samples x len(ids)), in the order given.

        One pass over the blocks that hold them. The transformed column j is ``(X[:, j] - center[j]) / scale[j]``;
        :meth:`dense_columns` gives it.
        """
        from dufs.engine.blocks import assemble_columns

        ids = as_ids(ids, self.shape[1])
        bounds = self.bounds
        owner = np.searchsorted(bounds, ids, side="right") - 1
        f = delayed(block_columns)
        want = sorted(set(owner.tolist()))
        locs = {i: np.unique(ids[owner == i] - bounds[i]) for i in want}
        got = self.executor.run([f(self.executor.src[i], locs[i]) for i in want], "columns")
        dtype = self.dtype if np.dtype(self.dtype).kind == "f" else np.float64
        return assemble_columns(self.shape[0], ids, owner, bounds, locs, dict(zip(want, got, strict=True)), dtype)

    def column_future(self, j: Any) -> Any:
        """Column ``j`` of X (untransformed) as (rows, values), made where its block lives: under a distributed
        client with persisted blocks a ``distributed.Future`` on the block's worker (for work on another worker,
        which fetches it from there rather than through this process), else the value (one pass)."""
        (j,) = as_ids([j], self.shape[1])
        client = current_client()
        if client is None or self.residency.get("mode") != "persisted":
            X = self.columns([j])
            return X.indices, X.data
        i = int(np.searchsorted(self.bounds, j, side="right")) - 1
        return client.submit(block_column, self.executor.src[i], int(j - self.bounds[i]), pure=False)

    def dense_columns(self, ids: Any) -> np.ndarray:
        """Columns ``ids`` of Z (transformed) as a dense float64 (n_samples x len(ids)) array."""
        ids = as_ids(ids, self.shape[1])
        C = self.columns(ids).toarray().astype(np.float64)
        mu, inv = self.transform
        if mu is not None:
            C -= mu[ids][None, :]
        if inv is not None:
            C *= inv[ids][None, :]
        return C

    def similarity_column(self, i: Any, kind: str = "linear", *, gamma: float | None = None) -> np.ndarray:
        """k(z_i, z_j) for every feature j: ``kind`` is ``"linear"`` (z_i^T z_j), ``"poly2"`` (the degree-2
        homogeneous polynomial (z_i^T z_j)^2; the squared correlation times n^2 under ``"zscore"``) or ``"rbf"``
        (exp(-gamma ||z_i - z_j||^2), ``gamma`` default 1 / n_samples).

        ``i`` an int gives a (n_features,) vector; a sequence gives (n_features, len(i)). Two passes (one to gather
        the columns, one product), plus the statistics pass when not yet cached.
        """
        if kind not in ("linear", "poly2", "rbf"):
            raise ParameterError(f"The 'kind' parameter of similarity_column must be 'linear', 'poly2' or 'rbf'; "
                                 f"got {kind!r}.")
        n, d = self.shape
        one = np.ndim(i) == 0
        ids = as_ids(np.atleast_1d(i), d)
        if gamma is None:
            gamma = 1.0 / max(n, 1)
        elif not (isinstance(gamma, int | float | np.floating) and gamma > 0):
            raise ParameterError(f"The 'gamma' parameter of similarity_column must be a float > 0; got {gamma!r}.")
        G = self.rmatvec(self.dense_columns(ids))
        if kind == "poly2":
            G = G * G
        elif kind == "rbf":
            sq = self.column_sq_norms()
            D2 = np.maximum(sq[:, None] + sq[ids][None, :] - 2.0 * G, 0.0)
            D2[ids, np.arange(ids.shape[0])] = 0.0
            G = np.exp(-float(gamma) * D2)
        return G[:, 0] if one else G
