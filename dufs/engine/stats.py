"""Per-feature column statistics: :class:`ColumnStats`, a mergeable record filled in one pass over the blocks."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import NamedTuple

import numpy as np

from dufs.engine.blocks import resolve
from dufs.errors import ParameterError
from dufs.kernels.blockops import csc_class_stats, csc_column_stats

__all__ = ["ColumnStats", "Transform", "block_stats", "transform_of"]


@dataclass
class ColumnStats:
    """Per-feature statistics over ``n_rows`` samples (implicit zeros included), all float64 but ``nnz``.

    ``m2`` is the centred sum of squares (exact zero for a constant column); it is what :meth:`var` uses, the
    raw ``sumsq`` being kept for callers that want it. The per-class fields are set when labels were given:
    ``classes`` (sorted label values), ``class_count`` (n_classes), ``class_sum`` and ``class_sumsq``
    (n_classes x n_features).

    :meth:`merge` combines the statistics of the same features over two disjoint sets of rows (Chan et al.'s
    update for ``m2``); :meth:`concat` joins statistics of consecutive feature blocks over the same rows.
    """

    n_rows: int
    sum: np.ndarray
    sumsq: np.ndarray
    nnz: np.ndarray
    min: np.ndarray
    max: np.ndarray
    m2: np.ndarray | None = None
    classes: np.ndarray | None = None
    class_count: np.ndarray | None = None
    class_sum: np.ndarray | None = None
    class_sumsq: np.ndarray | None = None

    @property
    def n_features(self) -> int:
        return int(self.sum.shape[0])

    @property
    def has_classes(self) -> bool:
        return self.classes is not None

    def mean(self) -> np.ndarray:
        """Per-feature mean (NaN when there are no rows)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return self.sum / self.n_rows if self.n_rows else np.full(self.n_features, np.nan)

    def var(self) -> np.ndarray:
        """Per-feature population variance (ddof 0); exactly 0 for a constant feature, NaN when there are no rows."""
        if not self.n_rows:
            return np.full(self.n_features, np.nan)
        if self.m2 is not None:
            v = self.m2 / self.n_rows
        else:
            mu = self.mean()
            v = self.sumsq / self.n_rows - mu * mu
        v = np.maximum(v, 0.0)
        v[self.min == self.max] = 0.0
        return v

    def std(self) -> np.ndarray:
        """Per-feature population standard deviation."""
        return np.sqrt(self.var())

    def class_mean(self) -> np.ndarray:
        """Per-class, per-feature means (n_classes x n_features)."""
        if self.class_sum is None or self.class_count is None:
            raise ParameterError("these column statistics carry no per-class sums: pass y to column_stats")
        with np.errstate(invalid="ignore", divide="ignore"):
            return self.class_sum / self.class_count[:, None]

    # ------------------------------------------------------------------ combining
    def merge(self, other: ColumnStats) -> ColumnStats:
        """Statistics of the same features over the rows of ``self`` and ``other`` together (disjoint rows)."""
        if other.n_features != self.n_features:
            raise ParameterError(f"cannot merge column statistics of {self.n_features} and {other.n_features} "
                                 f"features")
        na, nb = self.n_rows, other.n_rows
        n = na + nb
        if na == 0:
            return replace(other)
        if nb == 0:
            return replace(self)
        m2 = None
        if self.m2 is not None and other.m2 is not None:
            delta = other.sum / nb - self.sum / na
            m2 = self.m2 + other.m2 + delta * delta * (na * nb / n)
        out = ColumnStats(n, self.sum + other.sum, self.sumsq + other.sumsq, self.nnz + other.nnz,
                          np.minimum(self.min, other.min), np.maximum(self.max, other.max), m2)
        if self.has_classes and other.has_classes:
            classes = np.union1d(self.classes, other.classes)
            k, d = classes.shape[0], self.n_features
            cnt = np.zeros(k, dtype=np.int64)
            s = np.zeros((k, d))
            ss = np.zeros((k, d))
            for part in (self, other):
                pos = np.searchsorted(classes, part.classes)
                cnt[pos] += part.class_count
                s[pos] += part.class_sum
                ss[pos] += part.class_sumsq
            out.classes, out.class_count, out.class_sum, out.class_sumsq = classes, cnt, s, ss
        return out

    @classmethod
    def concat(cls, parts: list[ColumnStats]) -> ColumnStats:
        """Statistics of consecutive feature blocks (same rows, same classes) joined along features."""
        if not parts:
            raise ParameterError("ColumnStats.concat needs at least one part")
        n = parts[0].n_rows
        if any(p.n_rows != n for p in parts):
            raise ParameterError("ColumnStats.concat: the parts cover different numbers of rows")

        def cat(name: str, axis: int = 0) -> np.ndarray | None:
            vals = [getattr(p, name) for p in parts]
            return None if any(v is None for v in vals) else np.concatenate(vals, axis=axis)

        out = cls(n, cat("sum"), cat("sumsq"), cat("nnz"), cat("min"), cat("max"), cat("m2"))
        out.classes, out.class_count = parts[0].classes, parts[0].class_count
        out.class_sum, out.class_sumsq = cat("class_sum", 1), cat("class_sumsq", 1)
        return out


def block_stats(src, n_rows, codes, n_classes):
    b = resolve(src)
    indptr, indices, data = b.indptr, b.indices, b.data
    s, ss, m2, nnz, mn, mx = csc_column_stats(indptr, indices, data, n_rows)
    out = ColumnStats(n_rows, s, ss, nnz, mn, mx, m2)
    if codes is not None:
        out.class_sum, out.class_sumsq = csc_class_stats(indptr, indices, data, codes, n_classes)
    return out


class Transform(NamedTuple):
    """The implicit standardisation of a matrix: Z = (X - 1 centre^T) diag(inv_scale), per feature; ``centre``
    None means no centring, ``inv_scale`` None no scaling."""

    centre: np.ndarray | None
    inv_scale: np.ndarray | None


def transform_of(stats: ColumnStats, standardize: str | None) -> Transform:
    """The standardisation ``standardize`` of columns with these statistics (of a whole matrix or of one block:
    every number is per feature)."""
    if standardize is None:
        return Transform(None, None)
    sd = stats.std()
    sd = np.where((sd > 0) & np.isfinite(sd), sd, 1.0)
    inv = 1.0 / sd
    if standardize == "scale":
        return Transform(None, inv)
    return Transform(np.nan_to_num(stats.mean(), nan=0.0), inv)
