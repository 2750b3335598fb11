"""MMFS's vectors over the samples kept on the worker that sums a round (:mod:`dufs.engine.kept`; workers on several
machines): the round's result left there (:class:`_KeptRound`) and the work the driver did on it, run there."""

from __future__ import annotations

from typing import Any

import numpy as np

from dufs.engine import Kept, kept_call
from dufs.kernels.dcd import apply_step, step_dots
from dufs.methods.mmfs.gram import _epochs_over
from dufs.methods.mmfs.records import PartitionResult, RoundTotals

_NO_ROWS = np.zeros(0)


class _KeptRound:
    """A round's summed result left on its worker (``map_blocks(hold=True)``): its change of ws and its working
    sets kept there (``dws``, and ``cols``, a :class:`~dufs.engine.kept.Kept` item where there are any, else an
    empty list) and what the driver needs brought back: the totals (``tail``) and the line search's products
    (``dots``: dw^T dw, p^T p, dw^T p with the momentum direction ``pw``), in one task."""

    __slots__ = ("cols", "dots", "dws", "tail")

    def __init__(self, client: Any, res: Any, pw: Kept | None):
        from distributed import Future

        if not isinstance(res, Future):  # made here after all (a pass run inline or by direct calls)
            res = client.scatter(res, hash=False)
        (self.tail, has_cols, self.dots), (self.dws, cols) = kept_call(client, _after_round, res, pw, keep=2)
        self.cols = cols if has_cols else []


# ---------------------------------------------------------------------------------------------------- on a worker
def _after_round(res: PartitionResult, pw: np.ndarray | None) -> tuple:
    """The round's change of ws and its working sets (kept), and (its totals, whether it has working sets, the
    line-search products)."""
    dws = res.dense()
    dots = step_dots(dws, res.tail.dt, _NO_ROWS if pw is None else pw)
    return (res.tail, bool(res.cols), tuple(map(float, dots))), [dws, res.cols]


def _epochs_kept(cols: list, dws: np.ndarray, ws: np.ndarray | None, pw: np.ndarray | None, tl: RoundTotals,
                 wt: np.ndarray, b: float, m: int, C: float, gamma: float, serial: bool, cocoa: bool, sigma: float,
                 seed: int, nnz: int) -> tuple:
    """:func:`_epochs_over` on the worker that keeps the round's working sets and dws (``ws`` None: zero), dws
    changed in place; (the totals, the moves, the line search's products) back."""
    ws = np.zeros(int(m)) if ws is None else ws
    tl, moved = _epochs_over(tl, cols, ws, wt, b, m, C, gamma, serial, cocoa, sigma, seed, nnz, None, None, dws)
    dots = step_dots(dws, tl.dt, _NO_ROWS if pw is None else pw)
    return (tl, moved, tuple(map(float, dots))), []


def _after_step(dws: np.ndarray, dt: float, s: float, t: float, pw: np.ndarray | None, ws: np.ndarray | None
                ) -> tuple:
    """The step applied on the worker that keeps the vectors: the new momentum direction and ws (kept; ``ws``
    None is zero), (1^T ws, ws^T ws) back (:func:`~dufs.kernels.dcd.apply_step`)."""
    m = dws.shape[0]
    p = pw.copy() if pw is not None and t != 0.0 else np.empty(m)  # apply_step writes p: not a kept vector
    out = np.empty(m)
    total, norm2 = apply_step(dws, dt, s, t, p, np.zeros(m) if ws is None else ws, out)
    return (float(total), float(norm2)), [p, out]


def _norm2(ws: np.ndarray) -> tuple:
    return float(ws @ ws), []


def _keep(v: np.ndarray) -> tuple:
    return None, [v]
