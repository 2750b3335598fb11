"""A greedy selection's work over the samples in row pieces, one a machine (docs/scaling.md, "First of them: a
greedy step in pieces of rows").

Kept on one worker (:func:`~dufs.methods.greedy.side.make_side`), a step's work over the samples is O(n) on one
process whatever the number of machines: the term every greedy selector's weak scaling misses on. Here each
machine's worker keeps a :class:`~dufs.methods.greedy.side.Side` over its rows [a_j, b_j) (its pieces of the
selected columns, of the anchor graph's Zh or of JCFS's Y), and a step is one task a machine, side by side:
:meth:`Side.partials` (the step's sums over the piece's samples, a few hundred numbers), their all-reduce among
the pieces' workers (:func:`~dufs.engine.exchange.allreduce_sum`: worker to worker, in a fixed tree), then
:meth:`Side.finish` from the sums over every sample, which makes the same H, criterion and objective on every
piece and V's rows of the piece. V stays in its pieces: the pass brings each machine the rows its blocks touch
from each piece (:class:`~dufs.engine.Pieced`; on one machine it is joined there by one task). The sums are
made by pieces, so the selections are the one side's up to the order of additions. Only where B is local to the
rows: an anchor graph's (whose Zh^T z is one of the sums) or no graph term; a kNN graph's Laplacian mixes the
rows."""

from __future__ import annotations

import uuid
from typing import Any

import numpy as np

from dufs.engine import (
    Kept,
    Pieced,
    abort_exchange,
    allreduce_sum,
    current_client,
    distinct_workers,
    ensure_plugin,
    kept_calls,
    piece_bounds,
    tree_sum_values,
)
from dufs.errors import ParameterError
from dufs.methods.greedy.side import make_side, step_vectors

__all__ = ["PieceSides"]


class PieceSides:
    """The sides of a greedy selection, one a worker of ``workers`` (one a machine), each over its rows (the module
    docstring); :meth:`take` and :meth:`vectors_at` as :class:`~dufs.methods.greedy.side.Side` 's, V kept in its
    pieces (a :class:`~dufs.engine.Pieced`) with its column sums."""

    def __init__(self, workers: list[str], n: int, mode: int, lam1: float, lam2: float, W: Any, Y: Any, dtype: Any,
                 wd: np.ndarray | None, li: np.ndarray | None):
        c = self.client = current_client()
        self.workers = list(workers)
        self.bounds = piece_bounds(n, len(workers))
        self.mode = mode
        zh = None if W is None else W.zh_shared()
        ysq = None if Y is None else float(sum(np.dot(Y[:, j], Y[:, j].astype(np.float64))
                                               for j in range(Y.shape[1])))
        calls = []
        for j, w in enumerate(self.workers):
            a, b = self.bounds[j], self.bounds[j + 1]
            zh_j = None
            if zh is not None:
                if hasattr(zh, "key"):  # assembled on a worker: its rows cut there, the piece fetched from it
                    held = list(c.who_has([zh]).get(zh.key, ()))
                    at = {"workers": held, "allow_other_workers": True} if held else {}
                    zh_j = c.submit(_rows, zh, a, b, pure=False, **at)
                else:
                    zh_j = _scatter(c, zh[a:b], w)
            big = [None if v is None else _scatter(c, np.ascontiguousarray(v[a:b]), w) for v in (Y, wd)]
            calls.append((b - a, mode, lam1, lam2, None, zh_j, None if W is None else W.anchors,
                          None if W is None else W.lam, big[0], dtype, big[1], li, ysq))
        self.sides: list[Kept] = [h[0] for _, h in kept_calls(c, make_side, calls, keep=1, where=self.workers)]
        self.peers = distinct_workers(self.sides)  # its steps' all-reduces wait rank on rank

    def __len__(self) -> int:
        return len(self.sides)

    def take(self, p: int, col: Any, coef: float, shift: float) -> tuple:
        """A step (:meth:`Side.take` in pieces): (V, s_p, c2, criterion, objective, V's column sums)."""
        return self._step("step", int(p), col, coef, shift)

    def vectors_at(self, t: int) -> tuple:
        """A replay's step t (:meth:`Side.vectors_at` in pieces): (V, s_p, c2, V's column sums)."""
        V, s_p, c2, _, _, vsum = self._step("replay_step", int(t))
        return V, s_p, c2, vsum

    def _step(self, what: str, *args: Any) -> tuple:
        """One task a piece, side by side: its sums, their all-reduce among the pieces' workers, the second phase
        (the module docstring); V left in its pieces."""
        c = self.client
        ensure_plugin(c)
        token = uuid.uuid4().hex
        peers = self.peers
        try:
            got = kept_calls(c, piece_call, [(s, what, self.bounds[j], self.bounds[-1], token, j, peers, *args)
                                             for j, s in enumerate(self.sides)], keep=1)
        except BaseException:  # the other pieces stop waiting for the one that failed
            abort_exchange(c, token, peers)
            raise
        s_p, c2, crit, obj, _ = got[0][0]
        vsum = tree_sum_values([small[4] for small, _ in got])
        V = Pieced([kept[0] for _, kept in got], self.bounds, _join, self.workers[0])
        return V, s_p, c2, crit, obj, vsum


def _scatter(client: Any, x: Any, worker: str) -> Any:
    try:
        return client.scatter(x, hash=False, workers=[worker])
    except KeyError:  # that worker left since it was named: anywhere (its piece's calls fetch it)
        return client.scatter(x, hash=False)


# ---------------------------------------------------------------------------------------------------- on a worker
def _rows(zh: Any, a: int, b: int) -> Any:
    return zh[a:b]


def _join(*parts: np.ndarray) -> np.ndarray:
    return np.concatenate(parts, axis=0)


def _column_rows(col: tuple, a: int, b: int) -> tuple[np.ndarray, np.ndarray]:
    """The nonzeros of column ``col`` (rows, values) in rows [a, b), numbered from a."""
    rows, vals = np.asarray(col[0]), np.asarray(col[1])
    keep = (rows >= a) & (rows < b)
    return (rows[keep] - a).astype(rows.dtype, copy=False), vals[keep]


def piece_call(side: Any, what: str, a: int, rows: int, token: str, rank: int, peers: list[str], *args: Any
               ) -> tuple:
    """On the worker that keeps a piece's ``side`` (rows from ``a`` of ``rows``), the task of piece ``rank`` among
    ``peers`` (their workers): the first phase of a step (``step``: p, its column, coef, shift) or of a replay
    (``replay_step``: t), its sums all-reduced with the other pieces' (exchange ``token``), then the second phase
    from the sums over every sample; V's piece kept, (s_p, c2, the criterion, the objective, V's piece's column
    sums) back (the criterion and objective None in a replay)."""
    if what == "step":
        p, col, coef, shift = args
        part = side.partials(p, _column_rows(col, a, a + side.n), coef, shift)
    elif what == "replay_step":
        part = side.replay_partials(*args)
    else:
        raise ParameterError(f"piece_call: unknown call {what!r}")
    sums = allreduce_sum(part, token, rank, peers)
    if what == "step":
        V, s_p, c2 = side.finish(sums)
        crit, obj = side.criterion[-1], side.objective[-1]
    else:
        (V, s_p, c2), crit, obj = side.replay_finish(sums), None, None
    # V's dtype as the whole vector's would be (V's rows from every piece): the same on any number of machines
    return step_vectors(V, (s_p, c2, crit, obj), mode=side.mode, rows=rows)
