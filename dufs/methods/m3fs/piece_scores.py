"""The two-cluster v-step's scores in row pieces, one a machine (docs/scaling.md, "M3FS's scores in pieces of
rows"), where :mod:`dufs.methods.m3fs.kept_scores` keeps them on one worker.

Kept on one worker, a FISTA iteration's work over the samples (the momentum point's scores and L F, the best bias's
Newton steps, the majoriser's value and its gradient R, the backtracking) is O(n) on one process whatever the number
of machines: the term M3FS's scaling misses on. Here each machine's first worker keeps the scores of its rows
[a_j, b_j) (x's and x_prev's, with L F; the labels, L 1 and, on an anchor graph, its rows of Zh), and each call of
the v-step runs on every piece at once, one task a piece: the same functions as on one worker, their sums over the
samples (1^T L F and 1^T L 1, the hinge's slope in the bias at each Newton step, the majoriser's value, 1^T R, and
an anchor Laplacian's Zh^T D^-1/2 x) all-reduced among the pieces (:func:`~dufs.engine.allreduce_sum`, worker to
worker), so that every piece takes the same decisions from the same bits. R stays in its pieces: the pass brings
each machine the rows its blocks touch (as the greedy selectors' V), and each piece reads its rows of the pass's
sum from the worker that holds it. The sums are made by pieces, so the v-step is the one worker's up to the order
of additions. Only where the Laplacian is local to the rows given those sums: an anchor graph's, or none (a kNN
graph's mixes the rows: its scores stay on one worker)."""

from __future__ import annotations

import uuid
from typing import Any

import numpy as np
import scipy.sparse as sp

from dufs.engine import (
    AllSum,
    AnchorGraph,
    HeldPieces,
    Pieced,
    abort_exchange,
    current_client,
    distinct_workers,
    ensure_plugin,
    fetch_kept,
    kept_call,
    kept_calls,
    piece_bounds,
    piece_workers,
)
from dufs.errors import ParameterError
from dufs.methods.m3fs.kept_scores import Decisions, KeptScores, _final, _momentum, _Samples, _trial
from dufs.methods.m3fs.resident import StepSum

__all__ = ["PieceScores", "kept_side"]


def kept_side(prob: Any, F: np.ndarray, LF: np.ndarray | None, graph: Any, homes: list | None = None) -> Any:
    """Where a v-step's scores are kept on workers of several machines: in a piece of rows a machine
    (:class:`PieceScores`) where the Laplacian allows it (``dufs.engine.side-pieces``), else on one worker
    (:class:`~dufs.methods.m3fs.kept_scores.KeptScores`). ``homes``: the workers of the pass's partitions, whose
    machines' order is the order in which a reduce-scatter over them leaves the pieces of its sum (the pieces of
    the scores are made in that order, so that each reads its own in place)."""
    local = prob.lambda_ == 0.0 or isinstance(graph, AnchorGraph)
    workers = piece_workers(current_client(), prob.n) if local else []
    if len(workers) > 1:
        return PieceScores(prob, F, LF, graph, _in_order(workers, homes))
    return KeptScores(prob, F, LF, graph)


def _in_order(workers: list[str], homes: list | None) -> list[str]:
    """``workers`` (one a machine) with the machines in the order of their first worker among ``homes``, those
    without one after them."""
    from distributed.comm import get_address_host

    if not homes or None in homes:
        return workers
    first: dict[str, int] = {}
    for i, h in enumerate(homes):
        first.setdefault(get_address_host(h), i)
    return sorted(workers, key=lambda w: first.get(get_address_host(w), len(homes)))


class PieceScores(Decisions):
    """:class:`~dufs.methods.m3fs.kept_scores.KeptScores` 's calls, the scores in a piece of rows on each of
    ``workers`` (the module docstring)."""

    def __init__(self, prob: Any, F: np.ndarray, LF: np.ndarray | None, graph: Any, workers: list[str]):
        c = self.client = current_client()
        ensure_plugin(c)
        n = prob.n
        self.bounds = piece_bounds(n, len(workers))
        zh = graph.zh_shared() if prob.lambda_ != 0.0 else None
        lam = None if zh is None else np.asarray(graph.lam, dtype=np.float64)
        if zh is not None and not hasattr(zh, "key"):  # Zh here: each piece's rows sent to its worker
            zh = sp.csr_array(zh)
        calls = []
        for j, w in enumerate(workers):
            a, b = self.bounds[j], self.bounds[j + 1]
            vecs = [None if v is None else _scatter(c, np.ascontiguousarray(v[a:b]), w)
                    for v in (F, LF, prob.yy, prob.L1v)]
            zh_j = None
            if zh is not None and hasattr(zh, "key"):  # assembled on a worker: its rows cut there
                held = list(c.who_has([zh]).get(zh.key, ()))
                at = {"workers": held, "allow_other_workers": True} if held else {}
                zh_j = c.submit(_rows, zh, a, b, pure=False, **at)
            elif zh is not None:
                zh_j = _scatter(c, zh[a:b], w)
            calls.append((*vecs, zh_j, lam, _Samples.consts(prob), n, (a, b)))
        self.pieces = [h[0] for _, h in kept_calls(c, _make, calls, keep=1, where=list(workers))]
        self.peers = distinct_workers(self.pieces)
        self.R: list | None = None
        self.decision: str | None = None
        self.in_pieces = True  # the pass's sum wanted in pieces of rows (ResidentU.step_held)

    def _call(self, what: str, *args: Any, keep: int = 0, each: list | None = None) -> list:
        """``what`` on every piece at once, one task each, their sums all-reduced under one fresh token (given up on
        the others where one fails, so that none waits); ``each``: a first argument of each piece's own."""
        token = uuid.uuid4().hex
        calls = [(p, what, token, j, self.peers, *([] if each is None else [each[j]]), *args)
                 for j, p in enumerate(self.pieces)]
        try:
            return kept_calls(self.client, _run, calls, keep=keep)
        except BaseException:
            abort_exchange(self.client, token, self.peers)
            raise

    def momentum(self, beta: float, yb: float, aY: float) -> tuple[float, float, float]:
        """As :meth:`KeptScores.momentum`: R kept in its pieces for the pass."""
        got = self._call("momentum", self.decision, beta, yb, aY, keep=1)
        self.decision = None
        self.R = [kept[0] for _, kept in got]
        return got[0][0]

    def gradient(self) -> Any:
        """R in its pieces (a :class:`~dufs.engine.Pieced`): the pass brings each machine the rows its blocks
        touch (on one machine R is joined on the first piece's worker)."""
        R, self.R = self.R, None
        return Pieced(R, self.bounds, _join, self.peers[0])

    def trial(self, both: Any, centred: bool, step: float, Lip: float) -> tuple[tuple, float, float]:
        """As :meth:`KeptScores.trial`: each piece reading its rows of the pass's sum where a reduce-scatter left
        them on its own worker (a :class:`~dufs.engine.HeldPieces` in the pieces' order), else from the sum kept
        where it was made."""
        from distributed import Future

        c = self.client
        if isinstance(both, HeldPieces):
            if both.receivers == self.peers and both.in_pieces(8 * self.bounds[-1]):
                got = self._call("trial", centred, step, Lip, each=list(both.futures))
                Fn, nb, dd, aN, Lip, tried = got[0][0]
                return (Fn, None, nb, None, None, dd, aN), Lip, tried
            both = both.whole(c)
        if not isinstance(both, Future):  # made here after all (a pass run inline)
            both = c.scatter(both, hash=False, workers=[self.peers[0]])
        _, (held,) = kept_call(c, _hold, both, keep=1)
        got = self._call("trial", centred, step, Lip, each=[(held.address, held.token)] * len(self.pieces))
        Fn, nb, dd, aN, Lip, tried = got[0][0]
        return (Fn, None, nb, None, None, dd, aN), Lip, tried

    def final(self) -> tuple[np.ndarray, np.ndarray | None]:
        """x's scores F and L F (None without a manifold term), joined here from the pieces."""
        got = self._call("final", self.decision)
        self.decision = None
        F = np.concatenate([small[0] for small, _ in got], axis=0)
        LF = None if got[0][0][1] is None else np.concatenate([small[1] for small, _ in got], axis=0)
        return F, LF


def _scatter(client: Any, x: Any, worker: str) -> Any:
    try:
        return client.scatter(x, hash=False, workers=[worker])
    except KeyError:  # that worker left since it was named: anywhere (its piece's call fetches it)
        return client.scatter(x, hash=False)


# ---------------------------------------------------------------------------------------------------- on a worker
class _PieceLaplacian:
    """The normalised anchor Laplacian I - D^-1/2 Zh Lambda^-1 Zh^T D^-1/2 on a piece's rows of Zh: its degrees
    Zh (Lambda^-1 lam) are its own rows' (lam = Zh^T 1 over every sample), and Zh^T D^-1/2 x, a sum over the
    samples, is all-reduced by the call's :attr:`prob`'s ``allsum``."""

    def __init__(self, zh: Any, lam: np.ndarray):
        self.zh = sp.csr_array(zh, dtype=np.float64)
        self.li = np.zeros_like(lam)
        self.li[lam > 0] = 1.0 / lam[lam > 0]
        deg = np.asarray(self.zh @ (self.li * lam), dtype=np.float64)
        self.s = np.zeros_like(deg)
        self.s[deg > 0] = 1.0 / np.sqrt(deg[deg > 0])
        self.prob: Any = None

    def __matmul__(self, V: Any) -> np.ndarray:
        V = np.asarray(V, dtype=np.float64)
        V2 = V.reshape(self.zh.shape[0], -1)
        t = np.asarray(self.zh.T @ (self.s[:, None] * V2))
        if self.prob is not None and self.prob.allsum is not None:
            t = self.prob.allsum(t)
        out = V2 - self.s[:, None] * np.asarray(self.zh @ (self.li[:, None] * t))
        return out.reshape(V.shape)


def _make(F, LF, yy, L1v, zh, lam, consts, n, rows):
    L = None if zh is None else _PieceLaplacian(zh, lam)
    s = _Samples(F, LF, yy, L1v, L, consts, n=n)
    if L is not None:
        L.prob = s.prob
    s.rows = rows
    return None, [s]


def _rows(zh: Any, a: int, b: int) -> Any:
    return zh[a:b]


def _join(*parts: np.ndarray) -> np.ndarray:
    return np.concatenate(parts, axis=0)


def _hold(both: Any) -> tuple:
    return None, [np.asarray(both.buf if isinstance(both, StepSum) else both)]


def _trial_piece(s: _Samples, held: Any, centred: bool, step: float, Lip: float) -> tuple:
    """:func:`~dufs.methods.m3fs.kept_scores._trial` on this piece's rows of the pass's sum (the 9 dots, then the
    scores): its piece of a reduce-scatter's sum made here (a :class:`StepSum`), or kept under ``held`` (its
    worker, its token)."""
    if isinstance(held, StepSum):
        return _trial(s, held.buf, centred, step, Lip)
    a, b = s.rows
    address, token = held
    dots, Fu = fetch_kept([(address, token, 0, 9), (address, token, 9 + a, 9 + b)])
    return _trial(s, np.concatenate([dots, Fu]), centred, step, Lip)


_CALLS = {"momentum": _momentum, "trial": _trial_piece, "final": _final}


def _run(s: _Samples, what: str, token: str, rank: int, peers: list[str], *args: Any) -> tuple:
    """On the worker that keeps piece ``rank``'s scores ``s``: the call ``what``, its sums over the samples
    all-reduced with the other pieces' under ``token``."""
    fn = _CALLS.get(what)
    if fn is None:
        raise ParameterError(f"m3fs piece scores: unknown call {what!r}")
    s.prob.allsum = AllSum(token, rank, peers)
    try:
        return fn(s, *args)
    finally:
        s.prob.allsum = None
