"""The distributed solver of MMFS's dual (docs/methods.md, "MMFS"): rounds of block dual coordinate descent over
the Matrix's feature partitions, each where its blocks live (``Matrix.map_blocks`` with per-partition state), an
exact search on the plane of the summed step and the last step's change, the duality gap as the certificate,
CoCoA+ as the fallback, and the resilience of :mod:`dufs.methods.solver` (rebuilding lost state from alpha, atomic
checkpoints)."""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from dufs._logging import get_logger
from dufs.engine import (
    Kept,
    Matrix,
    PerBlock,
    as_future,
    buffer,
    fetch,
    flush,
    in_shared_memory,
    kept_call,
    kept_vectors,
    mark_spread,
    shipped,
)
from dufs.errors import ParameterError
from dufs.kernels.dcd import (
    apply_step,
    step_dots,
)
from dufs.methods.mmfs.gram import _ColumnCache, _epochs_over, _GramCache
from dufs.methods.mmfs.kept_round import _after_step, _epochs_kept, _keep, _KeptRound, _norm2
from dufs.methods.mmfs.partition import _init, _init_from_spec, _margin_summary, _round, _take_alpha
from dufs.methods.mmfs.plane import _plane_step
from dufs.methods.mmfs.records import PartitionResult, RoundTotals
from dufs.methods.solver import recoverable, release
from dufs.scheduling import current_client, driver_threads, in_threads

log = get_logger(__name__)


# working sets of at most this many nonzeros in all (a round's partitions) go to the driver for one serial DCD
# epoch over their union, the bias moving, instead of an epoch per partition with the bias held (128 MB of float32
# columns at most, kept between rounds by the driver's column cache of the same size): against 4M, fewer rounds in
# less time (docs/measurements.md, "MMFS's solver"). A kddb-size working set (200 heavy features, 96M nonzeros)
# stays on its partitions either way
_SERIAL_NNZ = 16_000_000


# a cold start's first round (alpha = 0, w = 0, b = 0: every feature's gradient is -rho) works on the _SCREEN features
# of the largest margins (split over the partitions), not on every feature, as working-set solvers start (skglm: 10
# features, by their violation); the rounds after take every violator of the exact gradient. The screened round
# takes a fraction of an epoch over every feature, and the solve fewer rounds (docs/measurements.md, "MMFS's solver")
_SCREEN = 10


def _init_blocks(M: Matrix, partitions: list, geo: dict | None, rho: Any, alpha0: np.ndarray | None,
                 seed: int) -> Any:
    """The partitions' states: from the driver's arrays (``geo``, ``rho``), or, when ``rho`` is a
    :class:`~dufs.methods.mmfs.MarginSpec`, computed by each block where it lives."""
    if geo is None:
        return _init_on_blocks(M, partitions, rho, alpha0, seed)[0]
    a0 = None if alpha0 is None else PerBlock(alpha0)
    _, state = M.map_blocks(_init, PerBlock(geo["coef"]), PerBlock(geo["shift"]), PerBlock(geo["colsum"]),
                            PerBlock(geo["qii"]), PerBlock(rho), a0, _seeds(M, seed), state=[None] * len(partitions),
                            partitions=partitions)
    return state


def _seeds(M: Matrix, seed: int) -> PerBlock:
    return PerBlock([seed * 1000003 + i for i in range(M.n_blocks)])


def _init_on_blocks(M: Matrix, partitions: list, spec: Any, alpha0: np.ndarray | None, seed: int
                    ) -> tuple[Any, np.ndarray]:
    """The partitions' states with each block's geometry and margins computed where it lives (``spec``: a
    :class:`~dufs.methods.mmfs.MarginSpec`), and the margins' [sum, norm, largest] from the same pass."""
    r_given = None if spec.r is None else PerBlock(spec.r)
    a0 = None if alpha0 is None else PerBlock(alpha0)
    with spec_shared(spec) as sp:
        parts, state = M.map_blocks(_init_from_spec, sp, r_given, a0, _seeds(M, seed), state=[None] * len(partitions),
                                    partitions=partitions)
    return state, _summary(parts)


@contextlib.contextmanager
def spec_shared(spec: Any) -> Any:
    """``spec`` (a :class:`~dufs.methods.mmfs.MarginSpec`) with its n-vectors (the scaled labels, the class codes)
    in /dev/shm for the ``with`` block where the workers share this machine's (:func:`dufs.engine.in_shared_memory`),
    else as it is (scattered once by the pass)."""
    from dataclasses import replace

    with contextlib.ExitStack() as stack:
        refs = {k: stack.enter_context(in_shared_memory(a)) for k in ("yn", "codes")
                if isinstance(a := getattr(spec, k), np.ndarray)}
        shared = {k: r for k, r in refs.items() if r is not getattr(spec, k)}
        yield replace(spec, **shared) if shared else spec


def init_state(M: Matrix, partitions: list, spec: Any, seed: int) -> tuple[Any, np.ndarray]:
    """The partitions' states at alpha = 0, each block computing its geometry and margins where it lives (a
    :class:`~dufs.methods.mmfs.MarginSpec`), and the margins' [sum, norm, largest] from the same pass (what
    :func:`margin_summary` gives, without a pass of its own)."""
    return _init_on_blocks(M, partitions, spec, None, seed)


def _summary(parts: list) -> np.ndarray:
    """[sum, norm, largest] of the margins from the blocks' or partitions' (sum, sum of squares, largest)."""
    s = np.array([0.0, 0.0, 0.0])
    for p in parts:
        s[:2] += p[:2]
        s[2] = max(s[2], p[2])
    return np.array([s[0], np.sqrt(s[1]), s[2]])


def margin_summary(M: Matrix, spec: Any) -> np.ndarray:
    """[sum, norm, largest] of the margins a :class:`~dufs.methods.mmfs.MarginSpec` gives, by one pass (each
    block computes its own and returns three numbers)."""
    with spec_shared(spec) as sp:
        return _summary(M.map_blocks(_margin_summary, sp, None if spec.r is None else PerBlock(spec.r)))


def _gather_alpha(M: Matrix, partitions: list, state: Any, with_g: bool = True, top: int = 0
                  ) -> tuple[np.ndarray, Any, Any, dict]:
    """(alpha, g) of every feature on the driver (g None unless ``with_g``), the state to go on with, and a dict:
    ``support``, alpha's nonzeros (indices, values), and with ``top`` > 0 the ``top`` best features (``top``:
    :func:`_merge_tops`, from the same pass)."""
    parts, new = M.map_blocks(_take_alpha, with_g, int(top), state=state, partitions=partitions)
    release(state)
    d = M.shape[1]
    alpha = np.zeros(d)
    g = np.zeros(d) if with_g else None
    index, value = [np.zeros(0, np.int64)], [np.zeros(0)]
    for part, _ in parts:
        for start, nz, a, gg in part:
            alpha[start + nz] = a
            index.append(start + nz)
            value.append(a)
            if with_g:
                g[start:start + gg.shape[0]] = gg
    info = {"support": (np.concatenate(index), np.concatenate(value)),
            "top": _merge_tops([t for _, t in parts], top) if top else None}
    return alpha, g, new, info


def primal(M: Matrix, alpha: np.ndarray, gamma: float) -> tuple[np.ndarray, np.ndarray, float]:
    """(ws, wt, b) from alpha in one pass: w = F alpha (Z alpha / sqrt(m) under a standardization, X alpha raw)."""
    m = M.shape[0]
    ws = np.asarray(M.matvec(alpha), dtype=np.float64)
    if M.standardize is not None:
        ws = ws / np.sqrt(m)
    return ws, np.array([0.0, float(ws.sum())]), float(gamma * alpha.sum())


_NO_ROWS = np.zeros(0)
_THREADED_ROWS = 1 << 18  # the driver's sweeps over at least this many samples run on its threads


def _range_sums(fn: Any, m: int) -> tuple:
    """``fn(r0, r1)``'s tuple of sums over the sample ranges [r0, r1) on the driver's threads (the workers wait
    meanwhile; from _THREADED_ROWS samples), the ranges' sums added in range order."""
    parts: dict = {}
    in_threads(lambda r0, r1: parts.__setitem__(r0, fn(r0, r1)), m, driver_threads() if m >= _THREADED_ROWS else 1)
    return tuple(sum(v) for v in zip(*(parts[k] for k in sorted(parts)), strict=True))


def _step_dots(dws: np.ndarray, dt: float, pw: np.ndarray | None) -> tuple[float, float, float]:
    """:func:`~dufs.kernels.dcd.step_dots` by :func:`_range_sums`."""
    return _range_sums(lambda r0, r1: step_dots(dws[r0:r1], dt, _NO_ROWS if pw is None else pw[r0:r1]),
                       dws.shape[0])


def _apply_step(dws: np.ndarray, dt: float, s: float, t: float, pw: np.ndarray, ws: np.ndarray,
                out: np.ndarray) -> tuple[float, float]:
    """:func:`~dufs.kernels.dcd.apply_step` by :func:`_range_sums`."""
    return _range_sums(lambda r0, r1: apply_step(dws[r0:r1], dt, s, t, pw[r0:r1], ws[r0:r1], out[r0:r1]),
                       ws.shape[0])


def solve(M: Matrix, rho: Any, geo: dict | None = None, *, C: float, gamma: float, tol: float, max_epochs: int,
          random_state: int = 0, partitions: list | None = None, state: Any = None, w: tuple | None = None,
          trace: list | None = None, alpha0: np.ndarray | None = None, checkpoint: Any = None,
          checkpoint_every: int = 5, checkpoint_meta: dict | None = None, recovery: dict | None = None,
          rule: str = "auto", gather_g: bool = True, cold: bool = False, top: int = 0,
          ws_kept: bool = False) -> dict:
    """Rounds of block DCD + line search until gap / |D| <= tol or ``max_epochs`` rounds. Returns a dict with the
    final ``state`` (per partition), ``ws``, ``wt``, ``b``, ``gap``, ``objective``, ``rounds``, ``converged``, and
    ``alpha`` and ``g`` gathered to the driver (``g`` unless ``gather_g`` is False), and ``top``: with ``top`` > 0,
    the ``top`` best features (:func:`_merge_tops`, from the same pass as alpha).

    The problem is ``rho`` and ``geo`` (the margins and :func:`~dufs.methods.mmfs.geometry`, on the driver), or
    ``rho`` a :class:`~dufs.methods.mmfs.MarginSpec` and ``geo`` None: every block then computes its own where it
    lives (and again after lost workers), and nothing over the features but alpha reaches the driver.

    ``partitions``: lists of block indices ( default: one partition of every block). With one
    partition a round is one serial DCD epoch, the bias moving. With K > 1 each partition runs its epoch with the
    bias held; a round after one whose duality gap did not decrease solves CoCoA+'s safe local subproblems
    (sigma' = K, the bias moving locally) instead (``trace[i]["rule"]``), then the held-bias rule resumes;
    ``rule="cocoa+"`` uses CoCoA+ every round.

    ``alpha0`` is alpha on the driver: the start when ``state`` is None, else what ``state`` holds; ``cold``: the
    ``state`` given was made at alpha = 0 (:func:`init_state`), so the solve starts cold, as from no state. Every
    ``checkpoint_every`` rounds (under a distributed client or with a ``checkpoint``) alpha is gathered to the
    driver with the (w, b) it belongs to, and written to ``checkpoint`` (a :class:`_Checkpoint`) with
    ``checkpoint_meta``; when a round fails because workers (and the block state on them) were lost, the state is
    rebuilt from that copy and the rounds go on from there. ``recovery`` (a dict) counts ``recoveries`` and the
    ``rounds_replayed``.

    Where ``dufs.engine.kept-vectors`` says so (workers on several machines), ws, its change and the momentum
    direction stay on the worker that sums the partitions' round (:mod:`dufs.engine.kept`) and the driver handles
    a few numbers a round; ``ws_kept``: the ``ws`` returned may then be such a :class:`~dufs.engine.kept.Kept`
    vector (for the next solve's ``w``), else it is brought here.
    """
    run = _Solve(M, rho, geo, C=C, gamma=gamma, tol=tol, max_epochs=max_epochs, random_state=random_state,
                 partitions=partitions, trace=trace, checkpoint=checkpoint, checkpoint_every=checkpoint_every,
                 checkpoint_meta=checkpoint_meta, recovery=recovery, rule=rule, gather_g=gather_g, top=top)
    run.start(w, state, alpha0, cold)
    out = run.rounds()
    if not ws_kept and isinstance(out["ws"], Kept):
        out["ws"] = fetch(run.client, out["ws"])
        flush(run.client)
    return out


class _Snapshot(NamedTuple):
    """The last copy of alpha on the driver with the (w, b) it belongs to, the rounds and the trace entries before
    it: what a checkpoint holds and where the rounds go on from after lost workers."""

    alpha: np.ndarray | None
    ws: np.ndarray
    wt: np.ndarray
    b: float
    rounds: int
    entries: int


@dataclass
class _Outcome:
    """A round as the driver's steps after it see it: the partitions' summed result, the totals (with the
    driver's epochs), the rule that ran, the relative gap at the round's start and whether it ends the solve, the
    change of ws (None when it does), the seconds waiting for the partitions, and whether alpha was gathered."""

    res: PartitionResult
    tl: RoundTotals
    mode: str
    rel: float
    done: bool
    dws: np.ndarray | None
    t_map: float
    fresh: bool


class _Solve:
    """One :func:`solve`'s state between its rounds: the problem and the parameters (fixed), the driver's (ws, wt,
    b), the partitions' block state, the last :class:`_Snapshot`, the step and the momentum, the rule of the next
    round, and the numbers :func:`solve` returns. :meth:`start`, then :meth:`rounds`: each round on the partitions
    (:meth:`round`: :meth:`map_round`, :meth:`driver_epochs`, :meth:`gather`), its trace entry (:meth:`record`),
    the checkpoint (:meth:`save`), the next rule and the line search (:meth:`next_rule`, :meth:`line_step`), or,
    when the round failed as lost workers make it fail, :meth:`recover`."""

    def __init__(self, M: Matrix, rho: Any, geo: dict | None, *, C: float, gamma: float, tol: float,
                 max_epochs: int, random_state: int, partitions: list | None, trace: list | None, checkpoint: Any,
                 checkpoint_every: int, checkpoint_meta: dict | None, recovery: dict | None, rule: str,
                 gather_g: bool, top: int):
        self.M, self.rho, self.geo = M, rho, geo
        self.C, self.gamma, self.tol, self.max_epochs = C, gamma, tol, max_epochs
        self.m = M.shape[0]
        self.partitions = [list(range(M.n_blocks))] if partitions is None else partitions
        self.recovery = {} if recovery is None else recovery
        self.recovery.setdefault("recoveries", 0)
        self.recovery.setdefault("rounds_replayed", 0)
        self.trace = [] if trace is None else trace
        self.every = max(1, int(checkpoint_every))
        self.checkpoint, self.checkpoint_meta = checkpoint, checkpoint_meta
        self.client = current_client()
        self.snap_on = checkpoint is not None or self.client is not None
        self.seen = self.recovery.setdefault("_workers", set())
        self.rule, self.gather_g, self.top = rule, gather_g, top
        self.seed = int(random_state)
        K = self.K = len(self.partitions)
        # the vectors over the samples kept on a worker (dufs.engine.kept) where the workers are on several
        # machines: the "driver's" epochs then run there too, where the working sets arrive with the round's sum,
        # without the caches below (a partition sends its whole working set each round)
        self.kept = kept_vectors(self.client)
        self.budget = _SERIAL_NNZ // K if K > 1 and rule == "auto" else 0
        keep = self.budget and not self.kept
        self.cache = _ColumnCache(_SERIAL_NNZ) if keep else None  # working-set columns kept between rounds
        self.held = _GramCache() if keep else None  # and the Gram matrix of the last one solved through it
        self.partition_of = [0] * M.n_blocks  # each block's partition
        for q, part_blocks in enumerate(self.partitions):
            for i in part_blocks:
                self.partition_of[i] = q
        self.bounds = M.bounds

    def watch(self) -> None:
        """Count the workers that left the cluster during the solve (dask may recompute their work itself)."""
        if self.client is not None:
            with contextlib.suppress(Exception):
                now = set(self.client.scheduler_info(n_workers=-1).get("workers", {}))
                self.recovery["workers_lost"] = len(self.seen - now)
                self.seen.update(now)

    def start(self, w: tuple | None, state: Any, alpha0: np.ndarray | None, cold: bool) -> None:
        """The start: (w, b), the block state, the first snapshot, no step yet, and the first round's rule."""
        self.watch()
        # alpha = 0, b = 0 (``cold``: the state given was made at alpha = 0, by :func:`init_state`)
        cold = cold or (w is None and alpha0 is None and state is None)
        self.at_zero = w is None  # w = 0, b = 0: the first round's start need not read the data (dcd_start)
        if w is None:
            self.ws, self.wt, self.b = np.zeros(self.m), np.zeros(2), 0.0
        else:
            self.ws, self.wt, self.b = w
        M, d = self.M, self.M.shape[1]
        if state is None:
            state = _init_blocks(M, self.partitions, self.geo, self.rho, alpha0, self.seed)
            if alpha0 is None and self.snap_on:
                alpha0 = np.zeros(d)
        elif alpha0 is None and self.snap_on:
            alpha0, _, state = (np.zeros(d), None, state) if cold else _gather_alpha(M, self.partitions, state)[:3]
        self.state = state
        self.snap = _Snapshot(alpha0, self.ws, self.wt, self.b, 0, len(self.trace))
        self.step = np.zeros(2)  # (s, t): along the last round's direction, and along the change before it (below)
        self.pw, self.ps = None, 0.0  # the change of w (and of sum alpha) the last step made: the momentum direction
        self.dal = None  # the blocks' directions when the driver ran their epochs (else each block keeps its own)
        if self.rule not in ("auto", "cocoa+"):
            raise ParameterError(f"The 'rule' parameter of solve must be 'auto' or 'cocoa+'; got {self.rule!r}.")
        # whether this round solves CoCoA+'s local subproblems (the previous round did not decrease the gap). From a
        # cold start (alpha = 0, b = 0) the first round does too where the partitions run its epochs (its working
        # sets, the features of the largest margins, too large for the driver): held at 0, far from its optimum, the
        # bias made every partition's epoch over all the features take up about half of them, for rounds before the
        # gap came down, where the bias moving locally took up a few dozen (docs/measurements.md, "MMFS's solver")
        self.cocoa = self.K > 1 and (self.rule == "cocoa+" or cold)
        self.prev_gap = np.inf
        self.converged = False
        self.gap = self.obj = np.inf
        self.r = 0
        self.alpha = self.g = None
        self.gathered: dict = {}  # the last gather's support and ranking head (_gather_alpha)
        self.wnorm2 = None  # ||ws||^2 when known (apply_step)

    @property
    def sigma(self) -> float:
        """CoCoA+'s sigma' this round (K), 1 under the held-bias rule."""
        return float(self.K) if self.cocoa else 1.0

    def rounds(self) -> dict:
        """The rounds until the gap is within tol or after ``max_epochs``; :func:`solve`'s dict."""
        while True:
            last = self.r >= self.max_epochs
            t_round = time.perf_counter()
            reused0 = 0 if self.cache is None else self.cache.reused
            try:
                out = self.round(last)
            except Exception as e:
                if not self.snap_on or self.snap.alpha is None or not recoverable(e, self.recovery["recoveries"]):
                    raise
                self.recover(e)
                continue
            self.record(out, t_round, reused0)
            if self.checkpoint is not None and out.fresh:
                self.save(out.done)
            if out.done:
                self.converged = True
                break
            if last:
                break
            self.alpha = self.g = None
            self.next_rule()
            try:  # with the vectors kept on a worker (dufs.engine.kept), a step that worker's loss stops
                self.line_step(out)
            except Exception as e:
                if not self.snap_on or self.snap.alpha is None or not recoverable(e, self.recovery["recoveries"]):
                    raise
                self.recover(e)
                continue
            del out  # the round's summed result: its vectors free (pooled) before the next round's
        return {"state": self.state, "ws": self.ws, "wt": self.wt, "b": self.b, "gap": self.gap,
                "objective": self.obj, "converged": self.converged, "trace": self.trace, "alpha": self.alpha,
                "g": self.g, "top": self.gathered.get("top"),
                "support": int(self.gathered["support"][0].shape[0]) if self.gathered
                else int(np.count_nonzero(self.alpha))}

    def round(self, last: bool) -> _Outcome:
        """One round: the partitions' (:meth:`map_round`), the gap at its start, the driver's epochs over the
        working sets the partitions sent, and alpha gathered when the round ends the solve or a snapshot is due."""
        if self.state is None:
            self.state = _init_blocks(self.M, self.partitions, self.geo, self.rho, self.snap.alpha,
                                      self.seed + 7919 * self.recovery["recoveries"])
        res, t_map = self.map_round(last)
        tl = res.tail
        self.dal = None
        mode = "serial" if self.K == 1 else "cocoa+" if self.cocoa else "held-bias"
        # the gap at this round's start (the driver's epochs below add no gap terms)
        self.gap, ra = tl.gap, tl.rho_alpha
        if self.wnorm2 is None:  # ws is w itself: the driver folds the constant part in every round
            self.wnorm2 = kept_call(self.client, _norm2, self.ws)[0] if isinstance(self.ws, Kept) else \
                float(self.ws @ self.ws)
        self.obj = 0.5 * self.wnorm2 + self.b * self.b / (2.0 * self.gamma) - ra
        rel = self.gap / max(abs(self.obj), 1e-300)
        done = rel <= self.tol or self.gap <= 0.0 or tl.at_tol > 0.0
        # the change of ws the partitions made (not read after a round that ends the solve)
        dws = None if done else res.dws if self.kept else res.dense_into(buffer(self.m))
        # a round that ends the solve runs no driver epoch: its step would never be applied
        # (docs/measurements.md, "MMFS's solver")
        serial = tl.epochs_run == 0
        if res.cols:
            mode = "serial working set" if serial else mode
        if res.cols and not done:
            tl = self.driver_epochs(res.cols, tl, serial, dws)
        self.r += 1
        fresh = done or last or (self.snap_on and self.r % self.every == 0)
        if fresh:  # alpha now is the one the round's gap was computed at: it belongs to (ws, wt, b)
            self.gather(done or last)
        return _Outcome(res, tl, mode, rel, done, dws, t_map, fresh)

    def map_round(self, last: bool) -> tuple[PartitionResult, float]:
        """The partitions' part of the round (:func:`~dufs.methods.mmfs.partition._round`, their results summed)
        and the seconds the driver waited for it; the block state moves on to the new one.

        Under a cluster w travels beside the graph, not inside it: the scheduler keeps the task specs of the whole
        chain of block states, and an embedded w would stay there once per round (m floats each); a lost chain is
        rebuilt from the driver's last copy of alpha instead (:meth:`recover`). It goes to every worker at once when
        more than one partition reads it (scattered to one worker, the others' tasks fetched it from there: a
        second transfer), or, on this machine's workers, as one shared copy (dufs.engine.shm)."""
        t_map = time.perf_counter()
        K, first = self.K, self.at_zero and self.r == 0
        # kept on a worker: a future of it there, sent on to the machines of the partitions by the pass
        ws = mark_spread(as_future(self.client, self.ws)) if isinstance(self.ws, Kept) else self.ws
        with shipped(ws, broadcast=K > 1, shared=True) as w_arg:
            res, new_state = self.M.map_blocks(
                _round, w_arg, self.wt, self.b, self.step, float(self.m), self.C, self.gamma, K == 1 or self.cocoa,
                not last, self.sigma, None if self.dal is None else PerBlock(self.dal), self.budget,
                PerBlock(self.partition_of), None if self.cache is None else PerBlock(self.cache.known(self.bounds)),
                first, -(-_SCREEN // K) if first else 0, float(self.tol) if K == 1 else None,
                state=self.state, reduce="sum", partitions=self.partitions, hold=self.kept)
        del ws
        release(self.state)
        self.state = new_state
        if self.kept:  # the sum stays where it was made: its change of ws kept there, the line search's dots back
            res = _KeptRound(self.client, res, self.pw)
            self.dots = res.dots
        return res, time.perf_counter() - t_map

    def driver_epochs(self, cols: list, tl: RoundTotals, serial: bool, dws: np.ndarray) -> RoundTotals:
        """The driver's epochs over the working sets the partitions sent (``cols``), their directions to
        ``self.dal``; returns ``tl`` with their totals added. With no partition running its own epoch
        (``serial``), one serial epoch over all of them, the bias moving (exact DCD on the working set); otherwise
        an epoch per partition, as the partition would have run it."""
        args = (self.wt, self.b, self.m, self.C, self.gamma, serial, self.cocoa, self.sigma,
                self.seed * 1000003 + 7 * self.r, self.M.nnz)
        if self.kept:  # where the working sets and dws are: the totals, the moves and the new dots back
            (tl, moved, dots), _ = kept_call(self.client, _epochs_kept, cols, dws, self._ws_arg(), self.pw, tl,
                                             *args)
            self.dots = dots
        else:
            tl, moved = _epochs_over(tl, cols, self.ws, *args, self.held, self.cache, dws)
        dal = [None] * self.M.n_blocks
        for start, ix, d in moved:
            dal[int(np.searchsorted(self.bounds, start, side="right")) - 1] = (ix, d)
        self.dal = dal if any(v is not None for v in dal) else None  # None: the block keeps its own
        return tl

    def _ws_arg(self) -> Kept | None:
        """ws for a call on the worker that keeps the vectors: its :class:`~dufs.engine.kept.Kept` vector, None
        for zero, or (a start or a w made again here from alpha) kept there now."""
        if isinstance(self.ws, Kept):
            return self.ws
        if not np.any(self.ws):
            return None
        self.ws = kept_call(self.client, _keep, self.client.scatter(self.ws, hash=False), keep=1)[1][0]
        return self.ws

    def gather(self, final: bool) -> None:
        """alpha (and on the ``final`` round g and the ranking's head) to the driver, as the new snapshot."""
        self.alpha, self.g, self.state, self.gathered = _gather_alpha(
            self.M, self.partitions, self.state, with_g=self.gather_g and final, top=self.top if final else 0)
        self.snap = _Snapshot(self.alpha, self.ws, self.wt, self.b, self.r - 1, len(self.trace))
        self.watch()

    def recover(self, e: Exception) -> None:
        """After a round that failed because workers (and the block state on them) were lost: back to the last
        snapshot, the block state to be rebuilt from its alpha by the next round."""
        rec = self.recovery
        rec["recoveries"] += 1
        rec["rounds_replayed"] += self.r - self.snap.rounds
        rec.setdefault("errors", []).append(f"{type(e).__name__}: {str(e)[:200]}")
        log.warning("MMFS: the block state was lost (%s: %s); rebuilding it from alpha at round %d",
                    type(e).__name__, str(e)[:200], self.snap.entries)
        with contextlib.suppress(Exception):
            release(self.state)
        self.state = None
        _, self.ws, self.wt, self.b, self.r, n = self.snap
        if isinstance(self.ws, Kept):  # its worker may be the one lost: w made again from alpha (one pass)
            self.ws, self.wt, _ = primal(self.M, self.snap.alpha, self.gamma)
        del self.trace[n:]
        self.step, self.pw, self.ps = np.zeros(2), None, 0.0
        self.wnorm2 = None
        self.dal = None
        self.cocoa = self.rule == "cocoa+" and self.K > 1
        self.prev_gap = np.inf

    def record(self, out: _Outcome, t_round: float, reused0: int) -> None:
        """The round's trace entry and log line."""
        tl, gap, obj = out.tl, self.gap, self.obj
        self.trace.append({"round": len(self.trace), "objective": obj, "duality_gap": gap, "relative_gap": out.rel,
                           "updates": int(tl.updates), "active": int(tl.visited), "gamma": self.gamma,
                           "rule": out.mode,
                           # the working sets' nonzeros the driver had from earlier rounds (not sent again)
                           "reused_nnz": 0 if self.cache is None else self.cache.reused - reused0,
                           # seconds: the round on the driver (its checkpoint included), waiting for the partitions'
                           # tasks, and summed over those: starting (step, gradient, gap terms), the DCD epochs, the
                           # task
                           "wall_s": time.perf_counter() - t_round, "map_s": out.t_map, "start_s": tl.start_s,
                           "epoch_s": tl.epoch_s, "task_s": tl.task_s})
        log.debug("round %d: D = %.10g, gap = %.3g (relative %.3g), %d updates, %d active", len(self.trace) - 1,
                  obj, gap, out.rel, int(tl.updates), int(tl.visited))

    def save(self, done: bool) -> None:
        """The last snapshot's alpha to the checkpoint, with the trace before it."""
        snap = self.snap
        meta = {"round": snap.entries, "gamma": self.gamma, "trace": self.trace[:snap.entries],
                "converged": bool(done), **(self.checkpoint_meta or {})}
        self.checkpoint.save(snap.alpha, meta, self.gathered["support"])

    def next_rule(self) -> None:
        """The fallback: after a round whose gap did not decrease, one round of CoCoA+ (provably safe; Ma et al.):
        fewer rounds to the gap than with the fallback only after a round whose line search found no descent (the
        gap zig-zags under the held-bias rule; docs/measurements.md, "MMFS's solver")."""
        self.cocoa = self.K > 1 and (self.rule == "cocoa+" or not self.cocoa and self.gap >= self.prev_gap)
        self.prev_gap = self.gap

    def line_step(self, out: _Outcome) -> None:
        """The step (s, t) by an exact line search, applied to (ws, wt, b) and the momentum direction.

        Along the summed direction d: the dual is quadratic along it, with slope d^T grad D = sum_j d_j (g_j -
        rho_j) (summed by the blocks from the exact gradient) and curvature ||dw||^2 + gamma ds^2 (dw = dws + dt 1
        summed element by element, not expanded: no cancellation between its two parts). The sums over the
        samples by step_dots and apply_step, one sweep each, into pooled vectors (dufs.engine.buffers): a fresh
        n_samples vector's pages cost more than the arithmetic (docs/measurements.md, "MMFS's solver")."""
        tl, gamma, m = out.tl, self.gamma, self.m
        dt, ds, slope = tl.dt, tl.ds, tl.slope
        dd, pp, dp = self.dots if self.kept else _step_dots(out.dws, dt, self.pw)
        den = dd + gamma * ds * ds
        st_ = float(np.clip(-slope / den, 0.0, 1.0)) if den > 0 and slope < 0 else 0.0
        tt = 0.0
        if self.pw is not None and tl.thi > tl.tlo and not out.res.cols:
            # and along the last step's change p as well: the dual is quadratic on span{d, p}, minimised over
            # s in [0, 1] and the t that keeps alpha in the box. The bias couples every coordinate (gamma 1 1^T,
            # an eigenvalue of gamma times the free coordinates): one direction a round zig-zags across it
            ps = self.ps
            st_, tt = _plane_step(slope, tl.pslope, den, pp + gamma * ps * ps, dp + gamma * ds * ps, tl.tlo,
                                  tl.thi, st_)
        self.step = np.array([st_, tt])
        self.trace[-1]["step"], self.trace[-1]["momentum"] = st_, tt
        self.ps = st_ * ds + tt * self.ps if tt != 0.0 else st_ * ds
        if self.kept and (st_ != 0.0 or tt != 0.0):  # on the worker that keeps dws: the new p and ws kept there
            (total, self.wnorm2), (self.pw, self.ws) = kept_call(self.client, _after_step, out.dws, dt, st_, tt,
                                                                 self.pw, self._ws_arg(), keep=2)
            self.wt = np.array([0.0, total])
        elif st_ != 0.0 or tt != 0.0:
            self.pw = buffer(m) if self.pw is None else self.pw
            new_ws = buffer(m)  # not the one a snapshot holds: a pooled vector is handed out only once unused
            total, self.wnorm2 = _apply_step(out.dws, dt, st_, tt, self.pw, self.ws, new_ws)
            self.ws = new_ws
            self.wt = np.array([0.0, total])
        else:
            self.pw = None
        self.b = self.b + gamma * self.ps


def _merge_tops(parts: list, k: int) -> np.ndarray:
    """The ``k`` best features by :meth:`~dufs.methods.mmfs.MMFSResult.ranking`'s rule (the support by alpha, then
    the dual gradient g - rho, ties to the lower index) from the partitions' proposals (:func:`_top_of_state`)."""
    ids = np.concatenate([p[0] for p in parts]) if parts else np.zeros(0, np.int64)
    grp = np.concatenate([p[1] for p in parts]) if parts else np.zeros(0)
    key = np.concatenate([p[2] for p in parts]) if parts else np.zeros(0)
    order = np.lexsort((ids, key, grp))[:k]
    return ids[order]
