"""The two-cluster v-step's feature-side vectors kept on the workers, beside the blocks (:func:`resident_partitions`).

A FISTA iteration of the v-step (:func:`dufs.methods.m3fs.vstep.v_step`) makes two products with the data: the
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
from typing import Any

import numpy as np

from dufs.engine import (
    Matrix,
    PerBlock,
    Pieced,
    buffer,
    current_client,
    mark_spread,
    receiving,
    shipped,
    thread_runs,
    tree_sum_into,
    tree_sum_values,
)
from dufs.kernels.vstep import fista_sweep, scaled_start
from dufs.scheduling import each_in_threads, task_threads

__all__ = ["ResidentU", "StepSum", "resident_partitions"]

_NONE = np.zeros(0)


def resident_partitions(M: Matrix) -> list[list[int]] | None:
    """The feature blocks in one partition a worker process (each on the worker that holds its blocks; a worker of
    several threads sweeps its partition's blocks in a run a thread, :func:`_step`) when ``M``'s blocks are
    persisted on a distributed cluster; None otherwise (the v-step keeps its vectors on the driver). A partition a
    thread cost the scheduler its transitions per thread: at 16 threads a machine, 16 times those of a worker of
    16 threads (docs/scaling.md)."""
    client = current_client()
    if client is None or M.residency.get("mode") != "persisted" or M.n_blocks < 1:
        return None
    try:
        workers = len(client.nthreads())
    except Exception:  # a client that cannot say: the driver's way
        return None
    return M.partition(max(1, min(workers, M.n_blocks)))


# ---------------------------------------------------------------------------------------------------- on the workers
def _init(blks, st, U0, s, inv, mu, colsum):
    """The state of a partition's blocks from the vectors over all the features (shared, or None): u's start U0,
    s = sigma^1/2 and the constants it is weighed with (the transform's ``inv`` and ``mu``, the column sums), each
    block's part copied out; si = s inv, cm = si mu and a = s colsum made here, as the driver makes them (x's memory
    is reused once x is let go). The state's arrays are pooled (:func:`~dufs.engine.buffers.buffer`): a worker's
    fresh arrays fault their pages in (docs/measurements.md, "M3FS's v-step"), and a solve's state goes back to the
    pool when it is dropped, for the next solve's."""

    def parts(v):
        if v is None:
            return None
        out = []
        for b in blks:
            p = buffer(b.stop - b.start)
            np.copyto(p, v[b.start:b.stop])
            out.append(p)
        return out

    # u's start: all zeros (a first v-step's) is not shipped
    x = parts(U0) if U0 is not None else [buffer(b.stop - b.start, zero=True) for b in blks]
    st = {"s": parts(s), "inv": parts(inv), "mu": parts(mu), "colsum": parts(colsum), "si": None, "cm": None,
          "a": None, "x": x, "xp": x, "y": None, "g": None, "u": None}
    _weigh(st)
    return st, None


def _weigh(st):
    """si = s inv, cm = si mu and a = s colsum of each block from the state's s and constants, into the arrays the
    state has where it has them (si is s itself where there is no transform)."""
    k = len(st["s"])

    def prod(old, i, u, v):
        out = buffer(u.shape[0]) if old is None or old[i] is _NONE else old[i]
        np.multiply(u, v, out=out)
        return out

    si = list(st["s"]) if st["inv"] is None else [prod(st["si"], i, st["s"][i], st["inv"][i]) for i in range(k)]
    cm = None if st["mu"] is None else [prod(st["cm"], i, si[i], st["mu"][i]) for i in range(k)]
    a = [_NONE] * k if st["colsum"] is None else [prod(st["a"], i, st["s"][i], st["colsum"][i]) for i in range(k)]
    st.update(si=si, cm=cm, a=a)


def _renew(blks, st, s, decision):
    """The next v-step's start on the state the last one left: x its final point (``decision`` applied), u's start
    (s_old x) / s (0 where s is not positive: the driver's scaled_start of V0 = s_old x, the V the last v-step
    returned) and si, cm, a for the new s; only s shipped, the state's arrays reused."""
    x, _ = _decided(st, decision)
    for i, b in enumerate(blks):
        sb = s[b.start:b.stop]
        xi = x[i]
        xi *= st["s"][i]
        scaled_start(xi[:, None], sb, xi[:, None])
        st["s"][i][:] = sb
    st = {**st, "x": x, "xp": x}
    _weigh(st)
    return st, None


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
    pages fault in again each call; docs/measurements.md, "M3FS's v-step"), or None."""
    for c in (None if st["u"] is None else st["u"][i], st["xp"][i], st["x"][i]):
        if c is not None and c is not x[i] and c is not xp[i]:
            return c
    return None


class StepSum:
    """A partition's result of :func:`_step` (the 9 dots, then the scores) as a sum over the machines may leave it
    in pieces of its rows (``Matrix.map_blocks(hold="pieces")``): each piece carries the dots (summed over the
    machines on every receiver) and its rows of the scores; the pieces' sums are the sum's."""

    def __init__(self, buf: np.ndarray):
        self.buf = buf

    def __add__(self, other: StepSum) -> StepSum:
        return StepSum(self.buf + other.buf)

    @property
    def dufs_rows(self) -> int:
        return self.buf.shape[0] - 9

    def dufs_pieces(self, bounds: list[int]) -> list[StepSum]:
        return [StepSum(np.concatenate([self.buf[:9], self.buf[9 + a:9 + c]]))
                for a, c in zip(bounds[:-1], bounds[1:], strict=True)]

    @classmethod
    def dufs_join(cls, pieces: list[StepSum]) -> StepSum:
        return cls(np.concatenate([pieces[0].buf[:9], *(p.buf[9:] for p in pieces)]))

    def dufs_take(self, idx: np.ndarray) -> StepSum:
        """The dots and the scores at rows ``idx`` only (sent so where the others are zero)."""
        return StepSum(np.concatenate([self.buf[:9], self.buf[9:][idx]]))

    def dufs_expand(self, idx: np.ndarray, rows: int) -> StepSum:
        """:meth:`dufs_take` 's piece back to ``rows`` rows, zero off ``idx``."""
        buf = np.zeros(9 + rows)
        buf[:9] = self.buf[:9]
        buf[9:][idx] = self.buf[9:]
        return StepSum(buf)


def _step(blks, st, R, beta, ga, rsum, step, decision, into=None, row=None, renew=None, pieces=False):
    """The decision on the last trial applied (with ``renew``, the new v-step's start made first by :func:`_renew`
    from the last v-step's final decision, s = ``renew``), then for each block in one sweep of its nonzeros
    (:func:`~dufs.kernels.vstep.fista_sweep`): the momentum point y = x + beta (x - x_prev), the gradient
    g = si X^T R - rsum cm + y - ga a, the trial point and its partial scores, written into row ``row[0]`` of the
    driver's results file ``into`` (:func:`dufs.engine.receiving`) where it gives one (the result: the 9 dots),
    else the result (the dots, then the scores), summed over the partitions by the workers. On a worker of several
    threads the blocks are cut into a run a thread (balanced by nonzeros), swept side by side, each into its own
    sum, and the runs' sums added by the fixed tree. The state given is used up (its arrays that the new one no
    longer holds are written)."""
    if renew is not None:
        st, _ = _renew(blks, st, renew, decision)
        decision = None
    n = R.shape[0]
    x, xp = _decided(st, decision)
    members = thread_runs(blks, task_threads())
    made: list = [None] * len(blks)

    def sweep(j, dots, out):  # a group's blocks in turn, into its own sum
        for i in members[j]:
            b = blks[i]
            w = b.indptr.shape[0] - 1
            u = _free(st, x, xp, i)
            y = st["y"][i] if st["y"] is not None else buffer(w)
            g = st["g"][i] if st["g"] is not None else buffer(w)
            u = u if u is not None else buffer(w)
            dots += fista_sweep(b.indptr, b.indices, b.data, R, x[i], xp[i], beta, st["si"][i], st["a"][i], ga,
                                _NONE if st["cm"] is None else st["cm"][i], rsum, step, y, g, u, out)
            made[i] = (y, g, u)

    # the dots and the scores in one array, summed with the other partitions' on the workers (pooled: a fresh
    # vector's pages fault in each time)
    if len(members) == 1:
        if into is not None:  # the driver's file: nothing to send back but the dots
            out = into[row[0]]
            out.fill(0.0)
            both = np.zeros(9)
            sweep(0, both, out)
        else:
            both = buffer(9 + n, zero=True)
            sweep(0, both[:9], both[9:])
    else:
        sums = [buffer(9 + n, zero=True) for _ in members]
        each_in_threads(lambda j: sweep(j, sums[j][:9], sums[j][9:]), len(members), task_threads())
        both = buffer(9 + n)
        tree_sum_into(sums, both)
        if into is not None:
            into[row[0]][:] = both[9:]
            both = both[:9].copy()
    ys, gs, us = (list(v) for v in zip(*made, strict=True))
    if pieces and into is None:  # (a copy: the pooled buffer is this worker's next call's)
        both = StepSum(np.array(both))
    return {**st, "x": x, "xp": xp, "y": ys, "g": gs, "u": us}, both


def _final(blks, st, decision, into=None, starts=None, renew=None):
    """The final point x, and v = s x: each block's written into the driver's results file ``into`` at ``starts``
    where it gives one (nothing sent back), else sent back (``renew``: a new start made first, as in :func:`_step`)."""
    if renew is not None:
        st, _ = _renew(blks, st, renew, decision)
        decision = None
    x, xp = _decided(st, decision)
    if into is None:
        return {**st, "x": x, "xp": xp}, [xi * si for xi, si in zip(x, st["s"], strict=True)]
    for xi, si, a in zip(x, st["s"], starts, strict=True):
        np.multiply(xi, si, out=into[a:a + xi.shape[0]])
    return {**st, "x": x, "xp": xp}, None


def step_result(dots: np.ndarray, Fu: np.ndarray, centred: bool, step: float) -> tuple[np.ndarray, dict, dict]:
    """A step's scores (their centring applied, in place), the dots a retrial needs and the trial point's dots,
    from the partitions' summed 9 dots and scores: (Fu, the retrial's base, {"aY", "uuY", "aN", "uuN", "dd",
    "gd"})."""
    if centred:  # Z n = X diag(inv) S^1/2 n - 1 (mu inv S^1/2)^T n
        Fu -= dots[6]
    aY, uuY, _, _, dd, _, _, ag, yg = map(float, dots)
    base = {"aY": aY, "uuY": uuY, "ag": ag, "yg": yg, "gg": dd / (step * step) if step else 0.0}
    return Fu, base, dict(zip(("aY", "uuY", "aN", "uuN", "dd", "gd"), map(float, dots[:6]), strict=True))


def retrial_point(base: dict, tried: float, step: float, Fu: np.ndarray, yFu: np.ndarray) -> tuple[np.ndarray, dict]:
    """The trial point y - ``step`` g's scores and dots from the last trial point's scores ``Fu`` (at step
    ``tried``) and the momentum point's ``yFu`` (both without the bias), as n = y - t g makes Z S^1/2 n and its
    dots affine (or quadratic) in t, from the last sweep's ``base`` dots (:func:`step_result`). ``Fu`` is
    written."""
    r = float(step) / tried
    Fu -= yFu  # -t_last Z S^1/2 g
    Fu *= r
    Fu += yFu
    t = float(step)
    gg = base["gg"]
    return Fu, {"aY": base["aY"], "uuY": base["uuY"], "aN": base["aY"] - t * base["ag"],
                "uuN": base["uuY"] - 2.0 * t * base["yg"] + t * t * gg, "dd": t * t * gg, "gd": -t * gg}


# ---------------------------------------------------------------------------------------------------- the driver
class ResidentU:
    """The v-step's u over the features on the workers: ``step`` returns (Z S^1/2 n, the dots {"aY", "uuY", "aN",
    "uuN", "dd", "gd"}) for the trial point n = y - step g (Z with its transform), and ``retrial`` the same for
    another step with no call (the trial point's scores and dots are affine in the step); ``accept`` or ``restart``
    tell the workers what became of the last trial point (sent with the next call); ``result`` brings u = x
    back."""

    def __init__(self, M: Matrix, U0: np.ndarray, s_half: np.ndarray, colsum: np.ndarray | None,
                 parts: list[list[int]]):
        mu, inv = M.transform
        self.M, self.parts, self.n = M, parts, M.shape[0]
        # each block's partition: the row of the step's results file its partition writes
        self._rows = [0] * M.n_blocks
        for r, part in enumerate(parts):
            for i in part:
                self._rows[i] = r
        self.centred = mu is not None
        self.colsum = colsum
        self.V: np.ndarray | None = None  # the V its v-step returned, when kept for the next (:meth:`fits`)
        self.decision: tuple[str, float | None] | None = None
        self.pending: np.ndarray | None = None  # the s_half of a start made with the next call (renew)
        self.swept = self.tried = 0.0  # the step of the last sweep's trial point, and of the last trial point
        self.base: dict[str, float] = {}  # the last sweep's a^T y, y^T y, a^T g, y^T g and g^T g
        # u's start, s = sigma^1/2 and its weights (a = S^1/2 colsum is the balance's vector; none where colsum is)
        U0 = np.ascontiguousarray(U0, dtype=np.float64)
        vecs = [U0 if np.any(U0) else None, s_half, inv, mu, None if colsum is None or not np.size(colsum) else colsum]
        with contextlib.ExitStack() as stack:  # through /dev/shm where the workers are on this machine
            refs = [stack.enter_context(shipped(v, broadcast=True, shared=True)) for v in vecs]
            _, self.state = M.map_blocks(_init, *refs, state=[None] * len(parts), partitions=self.parts)
        M.count_passes(-1)  # it sweeps no nonzeros

    def fits(self, M: Matrix, parts: list[list[int]], V0: Any, colsum: np.ndarray | None) -> bool:
        """Whether a v-step on ``M`` by ``parts`` from ``V0`` can start from this state (:meth:`renew`): ``V0`` is
        the V this one's v-step returned (its u is on the workers) and the rest is the same."""
        return self.V is not None and V0 is self.V and M is self.M and parts == self.parts and colsum is self.colsum

    def renew(self, s_half: np.ndarray) -> None:
        """The next v-step's start from this state: u0 = V0 / s_half made on the workers from their u (V0 = s_old
        u), and the weights for the new s_half; s_half alone shipped (the start made afresh shipped four vectors
        over the features and copied them into new arrays), with the next call (:meth:`step` or :meth:`result`): a
        call of its own costs the time to reach the workers and back (docs/measurements.md, "M3FS's v-step")."""
        self.pending = np.ascontiguousarray(s_half, dtype=np.float64)
        self.V = None

    def _renewing(self, stack: contextlib.ExitStack) -> dict:
        """The keywords of the next call: the pending start's s_half, shipped for the length of ``stack`` (the call's
        ``decision``, the last v-step's final one, is applied to the start first)."""
        if self.pending is None:
            return {}
        ref = stack.enter_context(shipped(self.pending, broadcast=True, shared=True))
        self.pending = None
        return {"renew": ref}

    def step(self, R: np.ndarray, beta: float, gb: float, step: float) -> tuple[np.ndarray, dict]:
        R2 = np.ascontiguousarray(R, dtype=np.float64).reshape(self.n)
        k = len(self.parts)
        with contextlib.ExitStack() as stack:
            Ra = stack.enter_context(shipped(R2, broadcast=True, shared=True))
            # the partitions' scores written into one file here where the workers share this machine
            into = receiving(stack, (k, self.n), np.float64)
            extra = {} if into is None else {"into": into.target, "row": PerBlock(self._rows)}
            got, self.state = self.M.map_blocks(_step, Ra, float(beta), gb / self.n, gb, float(step), self.decision,
                                                state=self.state, partitions=self.parts, reduce="sum", **extra,
                                                **self._renewing(stack))
            # the partitions' scores summed by the same fixed tree either way (the same numbers): by the workers,
            # or here from the file into an array of the driver's own (the file goes back to the pool)
            if into is None:
                dots, Fu = got[:9], np.array(got[9:])
            else:
                rows = list(into.array)
                dots, Fu = got, rows[0].copy() if k == 1 else tree_sum_values(rows)
        self.decision = None
        self.swept = self.tried = float(step)
        Fu, self.base, out = step_result(dots, Fu, self.centred, step)
        return Fu, out

    def retrial(self, step: float, Fu: np.ndarray, yFu: np.ndarray) -> tuple[np.ndarray, dict]:
        """The trial point y - ``step`` g's scores and dots from the last trial point's scores ``Fu`` and the
        momentum point's ``yFu`` (both without the bias): no call, no sweep (:func:`retrial_point`). Backtracking
        took a second sweep of the data a time; the workers make the trial point taken again with the next call
        (:func:`_decided`). ``Fu`` is written."""
        Fu, dots = retrial_point(self.base, self.tried, step, Fu, yFu)
        self.tried = float(step)
        return Fu, dots

    def step_held(self, R: Any, beta: float, gb: float, step: float, pieces: bool = False) -> Any:
        """:meth:`step` with the gradient ``R`` a future (kept on a worker: :mod:`dufs.methods.m3fs.kept_scores`)
        and the partitions' sum of (the 9 dots, the scores) left where it is made: its future (or, a pass run
        inline, the array), which :func:`step_result` reads where the scores are kept. ``pieces``: the sum as
        :class:`StepSum`, left in pieces of its rows where the machines' partials are added by a reduce-scatter
        (a :class:`~dufs.engine.HeldPieces`), for scores kept in pieces of rows
        (:mod:`dufs.methods.m3fs.piece_scores`)."""
        with contextlib.ExitStack() as stack:
            R = R if isinstance(R, Pieced) else mark_spread(R)  # (in pieces: the rows each machine touches)
            got, self.state = self.M.map_blocks(_step, R, float(beta), gb / self.n, gb, float(step),
                                                self.decision, state=self.state, partitions=self.parts,
                                                reduce="sum", hold="pieces" if pieces else True, pieces=pieces,
                                                rows_touched=True, **self._renewing(stack))
        self.decision = None
        self.swept = self.tried = float(step)
        return got

    def accept(self) -> None:
        self.decision = ("accept", None if self.tried == self.swept else self.tried)

    def restart(self) -> None:
        self.decision = ("restart", None)

    def result(self) -> np.ndarray:
        """v = S^1/2 u at the final point (the workers keep u for :meth:`renew`)."""
        d = self.M.shape[1]
        bounds = self.M.bounds
        with contextlib.ExitStack() as stack:
            into = receiving(stack, (d,), np.float64)
            extra = {} if into is None else {"into": into.target, "starts": PerBlock([int(a) for a in bounds[:-1]])}
            got, self.state = self.M.map_blocks(_final, self.decision, state=self.state, partitions=self.parts,
                                                **extra, **self._renewing(stack))
            self.M.count_passes(-1)  # it sweeps no nonzeros
            self.decision = None
            if into is not None:
                return into.result()
        out = np.empty(d)
        for part, vs in zip(self.parts, got, strict=True):
            for i, v in zip(part, vs, strict=True):
                out[bounds[i]:bounds[i + 1]] = v
        return out

    def homes(self) -> list:
        """The workers of the partitions' state (None where not kept on a worker)."""
        return [getattr(it, "address", None) for it in getattr(self.state, "items", [])]

    def release(self) -> None:
        self.state.release()
