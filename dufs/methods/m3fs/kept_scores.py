"""The two-cluster v-step's vectors over the samples kept on one worker (:mod:`dufs.engine.kept`; workers on several
machines), beside the workers' u (:mod:`dufs.methods.m3fs.resident`).

A FISTA iteration's work over the samples (the momentum point's scores and L F, the best bias, the majoriser's value
and its gradient R, the backtracking's trial points) ran on the driver: R went out to the machines of the blocks
and the partitions' summed scores came back, 16 n bytes through the driver's link and O(n) of its CPU and memory
an iteration, whatever the number of machines. Here the scores and their L F (x's, x_prev's, the momentum point's,
the trial's) stay in one worker's memory: R is kept there and sent on to the pass, the pass's sum is left on the
worker that made it and read there, and the driver gets the scalars FISTA decides on (the values, the bias, the
step's dots, the Lipschitz estimate). The same functions make the same numbers in the same order
(:func:`~dufs.methods.m3fs.fista.momentum_scores`, :func:`~dufs.methods.m3fs.fista.backtrack_scores`), so the
v-step is the driver's bit for bit. A v-step ships its start's scores there once and fetches the final scores
once (the alternation's labels and objective need them)."""

from __future__ import annotations

from typing import Any

import numpy as np

from dufs.engine import as_future, current_client, kept_call
from dufs.methods.m3fs.fista import backtrack_scores, momentum_scores
from dufs.methods.m3fs.resident import retrial_point, step_result

__all__ = ["KeptScores"]


class Decisions:
    """What FISTA made of the last trial point (:meth:`accept` / :meth:`restart`), applied with the next call."""

    decision: str | None = None

    def accept(self) -> None:
        self.decision = "accept"

    def restart(self) -> None:
        self.decision = "restart"


class KeptScores(Decisions):
    """The scores of a v-step's iterates kept on one worker (see the module docstring): :meth:`momentum` makes the
    momentum point there and keeps its gradient R for the pass (:meth:`gradient`), :meth:`trial` backtracks there
    from the pass's held sum, :meth:`accept` / :meth:`restart` say what FISTA made of the trial (applied with the
    next call), :meth:`final` brings x's scores and L F back."""

    def __init__(self, prob: Any, F: np.ndarray, LF: np.ndarray | None, graph: Any):
        self.client = c = current_client()
        futs = c.scatter([F, LF, prob.yy, prob.L1v], hash=False, workers=[_home(c)])
        kind, zh, rest = _graph_spec(c, graph, prob.L)
        _, (self.h,) = kept_call(c, _make, *futs, kind, zh, rest, _Samples.consts(prob), keep=1)
        del futs, zh
        self.R: Any = None
        self.decision: str | None = None

    def momentum(self, beta: float, yb: float, aY: float) -> tuple[float, float, float]:
        """The momentum point from x's and x_prev's scores (the last decision applied first): (its best bias, the
        majoriser's value there without 1/2 ||y||^2, 1^T R); R kept for the pass."""
        (yb, Fy, gb), (self.R,) = kept_call(self.client, _momentum, self.h, self.decision, beta, yb, aY, keep=1)
        self.decision = None
        return yb, Fy, gb

    def gradient(self) -> Any:
        """A future of the kept R, for the pass (let go here: the pass holds it)."""
        R, self.R = self.R, None
        return as_future(self.client, R)

    def trial(self, both: Any, centred: bool, step: float, Lip: float) -> tuple[tuple, float]:
        """The backtracking from the pass's sum ``both`` (the 9 dots, then the scores: a future, or the array)
        where the scores are: (the trial accepted, without its vectors over the samples, the Lipschitz estimate,
        the step of the trial point)."""
        from distributed import Future

        if not isinstance(both, Future):  # made here after all (a pass run inline)
            both = self.client.scatter(both, hash=False)
        (Fn, nb, dd, aN, Lip, tried), _ = kept_call(self.client, _trial, self.h, both, centred, step, Lip)
        return (Fn, None, nb, None, None, dd, aN), Lip, tried

    def final(self) -> tuple[np.ndarray, np.ndarray | None]:
        """x's scores F and L F (None without a manifold term), the last decision applied."""
        (F, LF), _ = kept_call(self.client, _final, self.h, self.decision)
        self.decision = None
        return F, LF


def _graph_spec(client: Any, graph: Any, L: Any) -> tuple:
    """How the worker makes the graph's normalised Laplacian (:func:`_laplacian`): ("anchor", Zh whole where it
    was assembled or sent once, (anchors, Lambda)), ("knn", None, W) or ("given", None, L)."""
    from dufs.engine import AnchorGraph

    if isinstance(graph, AnchorGraph):
        zh = graph.zh_shared()
        if not hasattr(zh, "key"):  # Zh here (gathered for the driver's products): sent once
            zh = client.scatter(zh, hash=False)
        return "anchor", zh, (graph.anchors, graph.lam)
    if graph is not None:
        return "knn", None, graph
    return "given", None, L


def _laplacian(kind: str, zh: Any, rest: Any) -> Any:
    """On the worker: the normalised Laplacian that :func:`_graph_spec` describes, made as the driver makes its
    own (:func:`dufs.engine.laplacian_operator`)."""
    from dufs.engine import AnchorGraph, laplacian_operator

    if kind == "anchor":
        return laplacian_operator(AnchorGraph(zh, rest[0], None, rest[1]), normed=True)
    if kind == "knn":
        return laplacian_operator(rest, normed=True)
    return rest


def _home(client: Any) -> str:
    """The worker that keeps the scores: the last of the workers by address (the blocks' first partitions go to
    the first), so that a solve's placement does not depend on the order the scheduler lists them in."""
    return sorted(client.nthreads())[-1]


# ---------------------------------------------------------------------------------------------------- on a worker
class _Samples:
    """What a v-step keeps over the samples on the worker: the sample side of its problem
    (:class:`~dufs.methods.m3fs.vstep._VProblem` without the data and the vectors over the features), x's and
    x_prev's scores and L F, the momentum point's and the trial's."""

    def __init__(self, F, LF, yy, L1v, L, consts, n=None):
        from dufs.methods.m3fs.vstep import _VProblem

        self.prob = _VProblem.samples(yy, L1v, L, n=n, **consts)
        self.xF = self.xpF = F
        self.xLF = self.xpLF = LF
        self.y = self.new = None
        self.tr = _Trials()

    @staticmethod
    def consts(prob: Any) -> dict:
        return {"c": prob.c, "lambda_": prob.lambda_, "smoothing": prob.smoothing, "l": prob.bal.l}

    def decide(self, decision: str | None) -> None:
        """FISTA's decision on the last trial point, as :meth:`~dufs.methods.m3fs.fista._State.advance` makes it."""
        if decision == "restart":  # x is the best point
            self.xpF, self.xpLF = self.xF, self.xLF
        elif decision == "accept":
            nF, nLF = self.new
            self.xpF, self.xF = self.xF, nF
            if self.xLF is not None:
                self.xpLF, self.xLF = self.xLF, nLF
        self.new = None


def _make(F, LF, yy, L1v, kind, zh, rest, consts):
    return None, [_Samples(F, LF, yy, L1v, _laplacian(kind, zh, rest), consts)]


def _momentum(s: _Samples, decision, beta, yb, aY):
    s.decide(decision)
    yb, yF, LF, Fy, R = momentum_scores(s.prob, s.xF, s.xpF, s.xLF, s.xpLF, beta, yb, None, aY, 0.0)
    s.y = (yb, yF, LF, Fy)
    gb = float(R.sum())
    if s.prob.allsum is not None:  # a piece of the rows (dufs.methods.m3fs.piece_scores): over every sample
        gb = float(s.prob.allsum(np.array([gb]))[0])
    return (yb, Fy, gb), [R[:, 0]]


class _Trials:
    """The retrials' state on the worker, as :class:`~dufs.methods.m3fs.resident.ResidentU` keeps it on the
    driver: the last sweep's dots and the step of the last trial point."""

    def __init__(self):
        self.base: dict = {}
        self.tried = 0.0

    def retrial(self, step, Fu, yFu):
        Fu, dots = retrial_point(self.base, self.tried, step, Fu, yFu)
        self.tried = float(step)
        return Fu, dots


def _trial(s: _Samples, both, centred, step, Lip):
    yb, yF, LF, Fy = s.y
    Fu, s.tr.base, dots = step_result(both[:9], np.array(both[9:]), centred, step)
    s.tr.tried = float(step)
    Fy += 0.5 * dots["uuY"]
    trial, Lip = backtrack_scores(s.prob, Lip, s.tr, Fu, dots, yb, yF, LF, Fy)
    Fn, _, nb, nF, nLF, dd, aN = trial
    s.new, s.y = (nF, nLF), None
    return (Fn, nb, dd, aN, Lip, s.tr.tried), []


def _final(s: _Samples, decision):
    s.decide(decision)
    return (s.xF, s.xLF), []
