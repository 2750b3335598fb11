"""The two-cluster v-step's feature-side vectors kept on the workers, beside the blocks (:func:`resident_partitions`).

A FISTA iteration of the v-step (:func:`dufs.methods.m3fs_scalable.v_step`) makes two products with the data: the
gradient g = Z^T R of the loss in the scores, and the scores Z s n of the trial point n = y - g / L (s = sigma^1/2, y
the momentum point). Between them everything over the features is elementwise (the momentum, the gradient in u, the
trial step) or a dot product. On the driver, each product ships a vector over the features one way (Z^T R back, s n out:
8 MB each at 1M features, 240 MB at kddb's 30M) and the driver sweeps five of them an iteration. Here each partition's
worker keeps its features' part of x, x_prev, y, g and n, and one call a FISTA iteration makes both products in one
sweep of its blocks' nonzeros (:func:`~dufs.kernels.vstep.fista_sweep`) and sends back only the partial scores (one
vector over the samples) and nine partial dot products. The driver keeps what lives over the samples, as before, and
a^T x, a^T x_prev, from which the momentum point's a^T y (the class balance's bound on the bias, needed before the call)
is their linear combination; ||y||^2 comes back with the call. A backtracking trial with a longer L (a shorter step t)
makes no call: the trial point y - t g's scores are affine in t (from the last trial's and the momentum point's) and its
dots quadratic (from a^T y, y^T y, a^T g, y^T g and g^T g), and the workers make it again from y and g when told it
was taken.

Each worker function returns a new state that shares the arrays it keeps, and writes into those of the state it was
given that the new one lets go (a fresh array's pages fault in again every call): a state is used once, as the driver
keeps only the last (a lost one is not rebuilt: the v-step runs again with its vectors on the driver)."""

from __future__ import annotations

import contextlib

import numpy as np

from dufs.engine import Matrix
from dufs.engine.dispatch import current_client, shipped, tree_sum_values
from dufs.engine.shm import local_array
from dufs.kernels.vstep import fista_sweep

__all__ = ["ResidentU", "resident_partitions"]

_NONE = np.zeros(0)


def resident_partitions(M: Matrix) -> list[list[int]] | None:
    """The feature blocks in one partition a worker thread (each on the worker that holds its blocks) when ``M``'s
    blocks are persisted on a distributed cluster; None otherwise (the v-step keeps its vectors on the driver)."""
    client = current_client()
    if client is None or M.residency.get("mode") != "persisted" or M.n_blocks < 1:
        return None
    try:
        threads = sum(client.nthreads().values())
    except Exception:  # a client that cannot say: the driver's way
        return None
    return M.partition(max(1, min(threads, M.n_blocks)))


# ---------------------------------------------------------------------------------------------------- on the workers
def _init(blks, st, U0, si, cm, a):
    """The state of a partition's blocks from the vectors over all the features (shared, or None): each block's
    part copied out (x's memory is reused once x is let go)."""

    def parts(v):
        if v is None:
            return None
        v = local_array(v)
        return [np.array(v[b.start:b.stop], dtype=np.float64) for b in blks]

    x = parts(U0)
    return {"si": parts(si), "cm": parts(cm), "a": parts(a) or [_NONE] * len(blks), "x": x, "xp": x, "y": None,
            "g": None, "u": None}, None


def _decided(st, decision):
    """(x, x_prev) after the driver's decision on the last trial point: None (none yet), ("accept", step) or
    ("restart", None). A trial point taken at another step than its sweep's (the driver's backtracking, which needs
    no sweep: :meth:`ResidentU.retrial`) is made again from y and g first, as the sweep makes it."""
    if decision is None:
        return st["x"], st["xp"]
    kind, step = decision
    if kind == "restart":
        return st["x"], st["x"]
    if step is not None:
        for u, y, g in zip(st["u"], st["y"], st["g"], strict=True):
            np.multiply(g, -step, out=u)
            u += y
    return st["u"], st["x"]


def _free(st, x, xp, i):
    """An array of block ``i`` that the state ``st`` held and (x, xp) no longer do (its memory reused: a fresh array's
    pages fault in again each call, about 10 ms a call of 1M features here), or None."""
    for c in (None if st["u"] is None else st["u"][i], st["xp"][i], st["x"][i]):
        if c is not None and c is not x[i] and c is not xp[i]:
            return c
    return None


def _step(blks, st, R, beta, ga, rsum, step, decision):
    """The decision on the last trial applied, then for each block in one sweep of its nonzeros
    (:func:`~dufs.kernels.vstep.fista_sweep`): the momentum point y = x + beta (x - x_prev), the gradient
    g = si X^T R - rsum cm + y - ga a, the trial point and its partial scores. The state given is used up (its
    arrays that the new one no longer holds are written)."""
    R = local_array(R)
    n = R.shape[0]
    x, xp = _decided(st, decision)
    out = np.zeros(n)
    dots = np.zeros(9)
    ys, gs, us = [], [], []
    for i, b in enumerate(blks):
        w = b.indptr.shape[0] - 1
        u = _free(st, x, xp, i)
        y = st["y"][i] if st["y"] is not None else np.empty(w)
        g = st["g"][i] if st["g"] is not None else np.empty(w)
        u = u if u is not None else np.empty(w)
        dots += fista_sweep(b.indptr, b.indices, b.data, R, x[i], xp[i], beta, st["si"][i], st["a"][i], ga,
                            _NONE if st["cm"] is None else st["cm"][i], rsum, step, y, g, u, out)
        ys.append(y)
        gs.append(g)
        us.append(u)
    return {**st, "x": x, "xp": xp, "y": ys, "g": gs, "u": us}, (dots, out[:, None])


def _final(blks, st, decision):
    x, xp = _decided(st, decision)
    return {**st, "x": x, "xp": xp}, x


# ---------------------------------------------------------------------------------------------------- the driver
class ResidentU:
    """The v-step's u over the features on the workers: ``step`` returns (Z S^1/2 n, the dots {"aY", "uuY", "aN",
    "uuN", "dd", "gd"}) for the trial point n = y - step g (Z with its transform), and ``retrial`` the same for
    another step with no call (the trial point's scores and dots are affine in the step); ``accept`` or ``restart``
    tell the workers what became of the last trial point (sent with the next call); ``result`` brings u = x
    back."""

    def __init__(self, M: Matrix, U0: np.ndarray, s_half: np.ndarray, a: np.ndarray | None,
                 parts: list[list[int]]):
        mu, inv = M.transform
        si = s_half if inv is None else s_half * inv
        self.M, self.parts, self.n = M, parts, M.shape[0]
        self.centred = mu is not None
        self.decision: tuple[str, float | None] | None = None
        self.swept = self.tried = 0.0  # the step of the last sweep's trial point, and of the last trial point
        self.base: dict[str, float] = {}  # the last sweep's a^T y, y^T y, a^T g, y^T g and g^T g
        vecs = [np.ascontiguousarray(U0, dtype=np.float64), si, None if mu is None else si * mu,
                None if a is None or not a.size else a]
        with contextlib.ExitStack() as stack:  # through /dev/shm where the workers are on this machine
            refs = [stack.enter_context(shipped(v, broadcast=True, shared=True)) for v in vecs]
            _, self.state = M.map_blocks(_init, *refs, state=[None] * len(parts), partitions=parts)
        M.count_passes(-1)  # it sweeps no nonzeros

    def step(self, R: np.ndarray, beta: float, gb: float, step: float) -> tuple[np.ndarray, dict]:
        R2 = np.ascontiguousarray(R, dtype=np.float64).reshape(self.n)
        with shipped(R2, broadcast=True, shared=True) as Ra:
            got, self.state = self.M.map_blocks(_step, Ra, float(beta), gb / self.n, gb, float(step), self.decision,
                                                state=self.state, partitions=self.parts)
        self.decision = None
        dots = np.sum([g[0] for g in got], axis=0)
        Fu = tree_sum_values([g[1] for g in got])[:, 0]
        if self.centred:  # Z n = X diag(inv) S^1/2 n - 1 (mu inv S^1/2)^T n
            Fu -= dots[6]
        self.swept = self.tried = float(step)
        aY, uuY, _, _, dd, _, _, ag, yg = map(float, dots)
        self.base = {"aY": aY, "uuY": uuY, "ag": ag, "yg": yg, "gg": dd / (step * step) if step else 0.0}
        return Fu, dict(zip(("aY", "uuY", "aN", "uuN", "dd", "gd"), map(float, dots[:6]), strict=True))

    def retrial(self, step: float, Fu: np.ndarray, yFu: np.ndarray) -> tuple[np.ndarray, dict]:
        """The trial point y - ``step`` g's scores and dots from the last trial point's scores ``Fu`` and the
        momentum point's ``yFu`` (both without the bias): no call, no sweep, as n = y - t g makes Z S^1/2 n and
        its dots affine (or quadratic) in t. Backtracking took a second sweep of the data a time; the workers make
        the trial point taken again with the next call (:func:`_decided`). ``Fu`` is written."""
        r = float(step) / self.tried
        Fu -= yFu  # -t_last Z S^1/2 g
        Fu *= r
        Fu += yFu
        self.tried = t = float(step)
        b = self.base
        gg = b["gg"]
        return Fu, {"aY": b["aY"], "uuY": b["uuY"], "aN": b["aY"] - t * b["ag"],
                    "uuN": b["uuY"] - 2.0 * t * b["yg"] + t * t * gg, "dd": t * t * gg, "gd": -t * gg}

    def accept(self) -> None:
        self.decision = ("accept", None if self.tried == self.swept else self.tried)

    def restart(self) -> None:
        self.decision = ("restart", None)

    def result(self) -> np.ndarray:
        got, self.state = self.M.map_blocks(_final, self.decision, state=self.state, partitions=self.parts)
        self.M.count_passes(-1)  # it sweeps no nonzeros
        self.decision = None
        out = np.empty(self.M.shape[1])
        bounds = self.M.bounds
        for part, xs in zip(self.parts, got, strict=True):
            for i, x in zip(part, xs, strict=True):
                out[bounds[i]:bounds[i + 1]] = x
        return out

    def release(self) -> None:
        self.state.release()
