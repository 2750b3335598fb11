"""What a round of MMFS's solver reports: a partition's result and the round's totals."""

from __future__ import annotations

from dataclasses import astuple, dataclass

import numpy as np

_NO_STEP = (np.zeros(0, dtype=np.int64), np.zeros(0))


@dataclass
class RoundTotals:
    """The numbers a round's partitions send besides the change of w, summed over them by ``+`` (in the fixed
    order of the tree reduce): the change of the two scalars of w (``dt``: of the constant part, ``dS``: of its
    sum) and of sum(alpha) (``ds``) that the alphas' change makes, the slope dalpha^T (g - rho) along it, the gap
    terms at the round's start (``gap``, ``sum_alpha``, ``rho_alpha`` = rho^T alpha), the coordinate updates and
    the coordinates visited, the partitions, and seconds spent starting (step, gradient, gap terms), in DCD epochs
    and in the whole task, and the partitions that ran their own epoch."""

    dt: float = 0.0
    dS: float = 0.0
    ds: float = 0.0
    slope: float = 0.0
    gap: float = 0.0
    sum_alpha: float = 0.0
    rho_alpha: float = 0.0
    updates: float = 0.0
    visited: float = 0.0
    partitions: float = 0.0
    start_s: float = 0.0
    epoch_s: float = 0.0
    task_s: float = 0.0
    epochs_run: float = 0.0
    pslope: float = 0.0  # the slope p^T (g - rho) along the momentum direction p
    tlo: float = -np.inf  # the range of the momentum step t that keeps alpha in the box (max / min over partitions)
    thi: float = np.inf
    at_tol: float = 0.0  # the one partition found the gap within tol at the round's start and ran no epoch

    def __add__(self, other: RoundTotals) -> RoundTotals:
        out = RoundTotals(*(a + b for a, b in zip(astuple(self), astuple(other), strict=True)))
        out.tlo, out.thi = max(self.tlo, other.tlo), min(self.thi, other.thi)
        return out


class PartitionResult:
    """A partition's result of a round, summed over the partitions by ``+`` (the reduce): the change of ws (sparse
    (rows, values) while few rows change, else dense) and the scalars ``tail``."""

    __slots__ = ("m", "rows", "vals", "tail", "cols")

    def __init__(self, m: int, rows: np.ndarray | None, vals: np.ndarray, tail: np.ndarray,
                 cols: list | None = None):
        self.m, self.rows, self.vals, self.tail = m, rows, vals, tail
        self.cols = [] if cols is None else cols  # working sets (:func:`_payload`) for the driver's epochs

    def dense(self) -> np.ndarray:
        return self.vals if self.rows is None else self.dense_into(np.empty(self.m))

    def dense_into(self, out: np.ndarray) -> np.ndarray:
        """:meth:`dense` written into ``out`` (float64, ``m``)."""
        if self.rows is None:
            np.copyto(out, self.vals)
        else:
            out.fill(0.0)
            np.add.at(out, self.rows, self.vals)
        return out

    def __add__(self, other: PartitionResult) -> PartitionResult:
        tail = self.tail + other.tail
        cols = self.cols + other.cols
        if self.rows is not None and other.rows is not None and self.rows.size + other.rows.size < self.m // 4:
            return PartitionResult(self.m, np.concatenate([self.rows, other.rows]),
                                   np.concatenate([self.vals, other.vals]), tail, cols)
        return PartitionResult(self.m, None, self.dense() + other.dense(), tail, cols)

    # cut in pieces of rows for a sum over machines (dufs.engine.exchange): the tail and the working sets go with
    # the first piece, the others carry zeros (RoundTotals' defaults add nothing), so the pieces' sums are the sum's
    @property
    def dufs_rows(self) -> int:
        return self.m

    def dufs_pieces(self, bounds: list[int]) -> list[PartitionResult]:
        out = []
        for j, (a, c) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
            tail, cols = (self.tail, self.cols) if j == 0 else (type(self.tail)(), [])
            if self.rows is None:
                out.append(PartitionResult(c - a, None, np.ascontiguousarray(self.vals[a:c]), tail, cols))
            else:
                keep = (self.rows >= a) & (self.rows < c)
                out.append(PartitionResult(c - a, self.rows[keep] - a, self.vals[keep], tail, cols))
        return out

    @classmethod
    def dufs_join(cls, pieces: list[PartitionResult]) -> PartitionResult:
        m = sum(p.m for p in pieces)
        first = pieces[0]
        if all(p.rows is not None for p in pieces):
            starts = np.cumsum([0] + [p.m for p in pieces[:-1]])
            return cls(m, np.concatenate([p.rows + s for p, s in zip(pieces, starts, strict=True)]),
                       np.concatenate([p.vals for p in pieces]), first.tail, first.cols)
        return cls(m, None, np.concatenate([p.dense() for p in pieces]), first.tail, first.cols)

    @classmethod
    def of(cls, dws: np.ndarray, tail: np.ndarray, cols: list | None = None) -> PartitionResult:
        if np.count_nonzero(dws) < dws.shape[0] // 4:  # counted first: the rows of a dense change are 8 bytes each
            rows = np.flatnonzero(dws)
            return cls(dws.shape[0], rows, dws[rows], tail, cols)
        return cls(dws.shape[0], None, dws, tail, cols)
