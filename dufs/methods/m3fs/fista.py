"""M3FS's v-step, the algorithm (:func:`dufs.methods.m3fs.vstep.v_step`): accelerated projected gradient (FISTA)
in u = S^-1/2 v with backtracking and function-value restart, on the problem of
:class:`~dufs.methods.m3fs.vstep._VProblem`, and where its products with the data are made: here (two products
an iteration) or, two clusters, by the workers that keep u beside their blocks (one call an iteration:
:class:`~dufs.methods.m3fs.resident.ResidentU`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from dufs.kernels.vstep import axpy, fista_extrapolate, fista_gradient, fista_momentum, fista_trial

if TYPE_CHECKING:
    from dufs.methods.m3fs.vstep import _VProblem

# the v-step stops once _STALL iterations in a row have not lowered its best value by _STALL_REL of it: a warm start
# already at the optimum (a label-polishing trial, a last iteration whose labels did not change) has a first
# gradient-mapping norm so small that ``tol`` times it is below what floating point resolves, and ran all its
# ``max_iter`` iterations (500 of them, 1,072 passes, in each such v-step on 3000 samples)
_STALL, _STALL_REL = 10, 1e-13
_NONE = np.zeros(0)  # an empty array: "none" to the kernels (no balance vector)
_LIP_MAX = 1e150  # a backtracking Lipschitz estimate past this: no step of FISTA's can lower the value

# a trial point: (its value, u (None on the workers), b, F, L F (None without), ||n - y||^2, a^T u on the workers)
_Trial = tuple[float, Any, float, np.ndarray, Any, float, Any]


class _State:
    """FISTA's iterates: x (always the best point) and x_prev with their biases and scores (and, two clusters with a
    manifold term, L F at both, so that L F at the momentum point is extrapolated too: L is linear), the momentum's
    t, the Lipschitz estimate, the first gradient-mapping norm and the best point (value, u, b, F). With u on the
    workers (``rd``) the driver keeps a^T x and a^T x_prev (``ax``, ``axp``) instead of x and x_prev; with the
    scores kept on a worker too (``side``: :class:`~dufs.methods.m3fs.kept_scores.KeptScores`), no vector at all
    (the scores are None here)."""

    def __init__(self, U: np.ndarray | None, b: float, F: np.ndarray, LF: np.ndarray | None, value: float,
                 lipschitz: float, rd: Any, aU0: float | None, binary: bool, side: Any = None):
        self.side = side
        if side is not None:
            F = LF = None
        self.x, self.xb, self.xF = U, b, F
        self.xp, self.xpb, self.xpF = U, b, F
        self.best = (value, U, b, F)
        self.rd, self.ax, self.axp = rd, aU0, aU0
        if rd is not None:
            self.x = self.xp = None
        self.xLF = self.xpLF = LF if binary else None
        self.t, self.Lip, self.g0, self.stalled = 1.0, float(lipschitz), None, 0

    def momentum(self) -> float:
        """Beck and Teboulle's momentum beta of this iteration (t advanced)."""
        t_next = 0.5 * (1.0 + np.sqrt(1.0 + 4.0 * self.t * self.t))
        beta = (self.t - 1.0) / t_next
        self.t = t_next
        return beta

    def advance(self, trial: _Trial, binary: bool) -> None:
        """The trial point becomes x, or (its value above the best) the momentum restarts from the best point."""
        Fn, nU, nb, nF, nLF, _, aN = trial
        best = self.best
        self.stalled = self.stalled + 1 if Fn >= best[0] - _STALL_REL * max(1.0, abs(best[0])) else 0
        if Fn > best[0]:  # restart the momentum from the best point
            self.t = 1.0
            self.xp, self.xpb, self.xpF = best[1], best[2], best[3]
            self.x, self.xb, self.xF = best[1], best[2], best[3]
            self.xpLF = self.xLF
            if self.rd is not None:
                self.rd.restart()
                self.axp = self.ax
            if self.side is not None:
                self.side.restart()
        else:
            self.xp, self.xpb, self.xpF = self.x, self.xb, self.xF
            self.x, self.xb, self.xF = nU, nb, nF
            self.best = (Fn, nU, nb, nF)
            if binary and self.xLF is not None:
                self.xpLF, self.xLF = self.xLF, nLF
            if self.rd is not None:
                self.rd.accept()
                self.axp, self.ax = self.ax, aN
            if self.side is not None:
                self.side.accept()


def fista(prob: _VProblem, st: _State, *, tol: float, max_iter: int, value_rtol: float, max_passes: int | None,
          passes0: int, stop: Callable[[], bool] | None = None) -> int:
    """FISTA from ``st`` until the gradient mapping's norm G is at most ``tol`` times its first value, or G^2 / 2
    (a bound on how far the value is above the optimum: the problem is 1-strongly convex in u) is at most
    ``value_rtol`` times the value, or the step changes nothing, or :data:`_STALL` steps in a row have not lowered
    the best value, after ``max_iter`` iterations at most, once the data's passes since ``passes0`` reach
    ``max_passes`` or once ``stop()`` (the caller's budget, asked after each iteration) says so; returns the
    iterations made (the best point is ``st.best``)."""
    it = 0
    for it in range(1, int(max_iter) + 1):  # noqa: B007 (the count is returned)
        trial = _iteration(prob, st)
        gm = st.Lip * np.sqrt(trial[5])
        st.g0 = gm if st.g0 is None else st.g0
        st.advance(trial, prob.binary)
        del trial
        if gm <= tol * max(st.g0, 1e-300) or gm == 0.0 or st.stalled >= _STALL or \
                0.5 * gm * gm <= value_rtol * abs(st.best[0]):
            break
        if max_passes is not None and prob.M.passes - passes0 >= max_passes:
            break
        if stop is not None and stop():
            break
    return it


def _iteration(prob: _VProblem, st: _State) -> _Trial:
    """One iteration up to its accepted trial point: the momentum point y, the gradient there and the backtracking
    on n = y - g / Lip (the Lipschitz estimate first lowered by 10%)."""
    beta = st.momentum()
    if st.side is not None:
        return _iteration_kept(st, beta)
    # at kddb size a d-vector is 240 MB and an n-vector 154 MB: the updates below work in place so that the
    # loop holds x, xp, y, the gradient, the trial point and its step (and their scores), not their temporaries
    yb = st.xb + beta * (st.xb - st.xpb)
    LF = None
    if prob.binary:
        yU, yb, yF, LF, Fy, R = _momentum_two(prob, st, beta, yb)
    else:
        yF = st.xF - st.xpF
        yF *= beta
        yF += st.xF
        yU = st.x - st.xp
        yU *= beta
        yU += st.x
        Fy, R = prob.value(yU, yb, yF, LF)
    gb = float(R.sum()) if prob.binary else 0.0  # dJ/db
    st.Lip *= 0.9
    if st.rd is not None:  # the gradient, the trial point and its scores: one call, one sweep of the data
        Fu, dots = st.rd.step(R, beta, gb, 1.0 / st.Lip)
        del R
        Fy += 0.5 * dots["uuY"]
        return _backtrack_resident(prob, st, Fu, dots, yb, yF, LF, Fy)
    gU = prob.M.rmatvec(R).reshape(prob.d, prob.p)
    del R
    if prob.binary:
        # phi's gradient (Danskin's theorem in beta = n b + a^T u, whose interval [-l, l] does not move
        # with u): J's in u less dJ/db a / n, nonzero when the best bias sits on the balance bound
        fista_gradient(gU[:, 0], prob.s_half, yU[:, 0], prob.a_vec, gb / prob.n)
    else:
        gU *= prob.s_half[:, None]
        gU += yU
    return _backtrack_here(prob, st, gU, yU, yb, Fy)


def _iteration_kept(st: _State, beta: float) -> _Trial:
    """:func:`_iteration` with the scores kept on a worker (``st.side``) and u on the workers: the momentum point
    and its gradient made there, the pass given the gradient there and its sum left where it is made, the
    backtracking run there; the same numbers in the same order as the driver's."""
    yb = st.xb + beta * (st.xb - st.xpb)
    yb, Fy, gb = st.side.momentum(beta, yb, (1.0 + beta) * st.ax - beta * st.axp)
    st.Lip *= 0.9
    rd = st.rd
    both = rd.step_held(st.side.gradient(), beta, gb, 1.0 / st.Lip, pieces=getattr(st.side, "in_pieces", False))
    trial, st.Lip, rd.tried = st.side.trial(both, rd.centred, 1.0 / st.Lip, st.Lip)
    return trial


def _momentum_two(prob: _VProblem, st: _State, beta: float, yb: float) -> tuple:
    """Two clusters: the momentum point by fused sweeps (:mod:`dufs.kernels.vstep`), its scores and L F
    extrapolated from x's and x_prev's, and the best bias there; (yU, yb, yF, L yF, value, gradient in F), yU None
    with u on the workers."""
    if st.rd is None:
        yU = np.empty((prob.d, 1))
        aY, uuY = fista_momentum(st.x[:, 0], st.xp[:, 0], beta, prob.a_vec, yU[:, 0])
    else:  # y on the workers: a^T y from a^T x and a^T x_prev, ||y||^2 comes back with the step
        yU, aY, uuY = None, (1.0 + beta) * st.ax - beta * st.axp, 0.0
    return (yU, *momentum_scores(prob, st.xF, st.xpF, st.xLF, st.xpLF, beta, yb, yU, aY, uuY))


def momentum_scores(prob: _VProblem, xF: np.ndarray, xpF: np.ndarray, xLF: np.ndarray | None,
                    xpLF: np.ndarray | None, beta: float, yb: float, yU: np.ndarray | None, aY: float,
                    uuY: float) -> tuple:
    """The momentum point's scores and L F extrapolated from x's and x_prev's, its best bias and the majoriser's
    value there: (yb, yF, L yF, value, gradient in F). The work over the samples alone (u's part given: ``yU``,
    a^T y, ||y||^2), so that a worker that keeps the scores makes it too (:mod:`dufs.methods.m3fs.kept`)."""
    yF = np.empty((xF.shape[0], 1))
    yFu = yF[:, 0]
    fista_extrapolate(xF[:, 0], xpF[:, 0], beta, yb, _NONE, yFu)  # its scores less the extrapolated bias
    LFu = None
    if xLF is not None:  # L yFu = L xF + beta (L xF - L xpF) - yb L 1
        LFu = np.empty(xF.shape[0])
        fista_extrapolate(xLF[:, 0], xpLF[:, 0], beta, yb, prob.L1v, LFu)
    yb, yF, LF = prob.settle(yU, yFu, yb, aY, LFu)
    Fy, R = prob.value(yU, yb, yF, LF, uuY)
    return yb, yF, LF, Fy, R


def _backtrack_here(prob: _VProblem, st: _State, gU: np.ndarray, yU: np.ndarray, yb: float, Fy: float) -> _Trial:
    """The backtracking with u here: trial points y - g / Lip, Lip doubled until the quadratic model at y bounds
    the value (two clusters: the bias eliminated at each; M: projected on the balance)."""
    while True:
        if prob.binary:
            nU, sv = np.empty((prob.d, 1)), np.empty(prob.d)
            aN, uuN, dd, gd = fista_trial(gU[:, 0], yU[:, 0], prob.s_half, prob.a_vec, 1.0 / st.Lip, nU[:, 0], sv)
            nb, nF, nLF = prob.settle(nU, prob.M.matvec(sv), yb, aN)
            del sv
            Fn = prob.value(nU, nb, nF, nLF, uuN, grad=False)[0]
        else:
            nU = gU * (-1.0 / st.Lip)
            nU += yU
            nU, nb = prob.bal.project(nU, 0.0)
            nF, nLF = prob.scores(nU, nb), None
            Fn = prob.value(nU, nb, nF)[0]
            dU = nU - yU
            dd = float(np.vdot(dU, dU))
            gd = float(np.vdot(gU, dU))
            del dU
        quad = gd + 0.5 * st.Lip * dd
        if Fn <= Fy + quad + 1e-12 * max(1.0, abs(Fy)):
            return Fn, nU, nb, nF, nLF, dd, None
        del nU, nF, nLF
        st.Lip = _longer(st.Lip, Fn, Fy)


def _backtrack_resident(prob: _VProblem, st: _State, Fu: np.ndarray, dots: dict, yb: float, yF: np.ndarray,
                        LF: np.ndarray | None, Fy: float) -> _Trial:
    """The backtracking with u on the workers, from the step's scores ``Fu`` and ``dots`` (:func:`backtrack_scores`
    with the workers' :class:`~dufs.methods.m3fs.resident.ResidentU`)."""
    trial, st.Lip = backtrack_scores(prob, st.Lip, st.rd, Fu, dots, yb, yF, LF, Fy)
    return trial


def backtrack_scores(prob: _VProblem, Lip: float, rd: Any, Fu: np.ndarray, dots: dict, yb: float, yF: np.ndarray,
                     LF: np.ndarray | None, Fy: float) -> tuple[_Trial, float]:
    """The backtracking with u on the workers, from the step's scores ``Fu`` and ``dots``: a retrial's scores, its
    dots and its L Fu are affine in the step (``rd.retrial``: :meth:`ResidentU.retrial`), so no retrial calls the
    workers or makes a product with L. Returns (the trial accepted, the Lipschitz estimate)."""
    LFt = LyFu = None  # a retrial's L Fu, and the momentum point's L (yF - yb)
    while True:
        nb, nF, nLF = prob.settle(None, Fu, yb, dots["aN"], LFt)
        Fn = prob.value(None, nb, nF, nLF, dots["uuN"], grad=False)[0]
        dd, gd = dots["dd"], dots["gd"]
        if Fn <= Fy + gd + 0.5 * Lip * dd + 1e-12 * max(1.0, abs(Fy)):
            return (Fn, None, nb, nF, nLF, dd, dots["aN"]), Lip
        Lip = _longer(Lip, Fn, Fy)
        Fu = nF[:, 0]
        Fu -= nb  # the trial's scores without the bias again
        if nLF is not None:  # L Fu is affine in the step as Fu is (ResidentU.retrial): no product
            if LyFu is None:
                LyFu = np.array(LF[:, 0])
                axpy(-yb, prob.L1v, LyFu)
            LFt = nLF[:, 0]
            axpy(-nb, prob.L1v, LFt)
            LFt -= LyFu
            LFt *= (1.0 / Lip) / rd.tried
            LFt += LyFu
        Fu, dots = rd.retrial(1.0 / Lip, Fu, yF[:, 0] - yb)
        del nF, nLF


def _longer(Lip: float, Fn: float, Fy: float) -> float:
    """The backtracking's next Lipschitz estimate, twice ``Lip``; a FloatingPointError where no step can pass the
    test: the trial value ``Fn`` or the momentum point's ``Fy`` is NaN, or the estimate is past :data:`_LIP_MAX`
    (the step is then too small to move anything), where doubling it went on for ever."""
    if np.isnan(Fn) or np.isnan(Fy) or not Lip <= _LIP_MAX:
        raise FloatingPointError(f"m3fs v-step: backtracking found no step that lowers the objective (trial value "
                                 f"{Fn!r}, value at the momentum point {Fy!r}, Lipschitz estimate {Lip:.3g}): the "
                                 f"scores overflow or hold NaN; scale the data (standardize='scale') or check it "
                                 f"for NaN and very large values")
    return 2.0 * Lip
