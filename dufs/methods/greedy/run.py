"""A greedy selection's run on the driver: the selected set's k x k system, a step's two n-vectors and its pass,
the global choice, checkpoints, and the rebuild after lost workers."""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.sparse as sp

from dufs._logging import get_logger
from dufs.engine import (
    AnchorGraph,
    Kept,
    Matrix,
    PerBlock,
    Pieced,
    as_future,
    current_client,
    flush,
    kept_call,
    kept_vectors,
    last_timeline,
    mark_spread,
    piece_workers,
    shipped,
)
from dufs.errors import ParameterError
from dufs.kernels.blockops import col_sums
from dufs.kernels.greedy import JCFS
from dufs.methods.greedy import partition
from dufs.methods.greedy.partition import (
    _in_partition,
    _init,
    _load_blocks,
    _partitions,
    _propose,
    _step,
    _step_dtype,
)
from dufs.methods.greedy.pieces import PieceSides
from dufs.methods.greedy.side import Side, make_side, side_call
from dufs.methods.solver import atomic_write, recoverable, release
from dufs.scheduling import one_blas_thread

log = get_logger(__name__)


@dataclass
class GreedyResult:
    """The selected ``indices`` (in the order chosen), the chosen features' ``criterion`` and the ``objective``
    after each step (see the module docstring), and ``diagnostics``."""

    indices: np.ndarray
    criterion: np.ndarray
    objective: np.ndarray
    diagnostics: dict = field(default_factory=dict)


class GreedyRun:
    """One greedy selection of ``k`` features on M: the block state on the workers, the selected set and its
    vectors over the samples here (a :class:`~dufs.methods.greedy.side.Side`), or, where the workers are on several
    machines (``dufs.engine.kept-vectors``), kept on one worker: the driver then handles the chosen feature's
    column and a few numbers a step, and the step's vectors go to the blocks from there."""

    def __init__(self, M: Matrix, k: int, mode: int, lam1: float, lam2: float, L: Any, W: Any, Y: Any,
                 checkpoint: str | None, checkpoint_every: int, problem: dict):
        self.M, self.k, self.mode, self.lam1, self.lam2, self.L, self.W, self.Y = M, k, mode, lam1, lam2, L, W, Y
        n = M.shape[0]
        mu, inv = M.transform
        self.coef = np.ones(M.shape[1]) if inv is None else np.asarray(inv, dtype=np.float64)
        self.shift = np.zeros(M.shape[1]) if mu is None else np.asarray(mu, dtype=np.float64)
        self.raw = mu is None and inv is None  # every block's columns as stored: a step's kernel reads no V sums
        self.n = n
        self.dir = checkpoint
        self.every = checkpoint_every
        self.problem = problem
        self.ids: list[int] = []
        self.criterion: list[float] = []
        self.objective: list[float] = []
        self.Ysum = None if Y is None else col_sums(Y)
        self.state: Any = None
        self.client = current_client()
        self.kept = kept_vectors(self.client)
        self.recoveries = 0
        self.side: Any = self._first_side()  # a Side, its Kept handle on a worker, or its pieces
        # where the work over the samples runs (the diagnostics' "samples_side")
        self.side_layout = (f"{len(self.side)} pieces" if isinstance(self.side, PieceSides) else
                            "one worker" if isinstance(self.side, Kept) else "driver")
        self.parts: list[list[int]] | None = None  # the partitions of the block state (None: one task a block)
        self.replayed = 0
        self.resumed = 0

    # ---------------------------------------------------------------- the side over the samples
    def _side_args(self) -> tuple:
        """:class:`Side`'s arguments: (n, mode, lambda1, lambda2, L, W, Y, dtype, wd, li)."""
        W, lam1, mode = self.W, self.lam1, self.mode
        anchor = isinstance(W, AnchorGraph) and lam1 and mode != JCFS
        wd = 1.0 + lam1 * np.asarray(W.degrees, dtype=np.float64) if anchor else None
        li = np.asarray(W.lam_inv, dtype=np.float64) if anchor else None
        dtype = np.float32 if np.dtype(self.M.dtype) == np.float32 else np.float64
        return (self.n, mode, lam1, self.lam2, self.L if lam1 and not anchor else None, W if anchor else None,
                self.Y, dtype, wd, li)

    def _first_side(self) -> Any:
        """:meth:`_new_side`, made again where a worker it was made on was lost meanwhile (as a step's loss is)."""
        while True:
            try:
                return self._new_side()
            except Exception as exc:
                if not recoverable(exc, self.recoveries):
                    raise
                self.recoveries += 1
                log.warning("the selected set's side was lost as it was made (%s); making it again", exc)

    def _new_side(self) -> Any:
        """An empty :class:`Side` here, or made and kept on a worker (:attr:`kept`): the anchor graph's Zh whole
        where it was assembled (:meth:`AnchorGraph.zh_shared`, a future), the other arrays sent once; or, on workers
        of several machines with B local to the rows, in a piece of the rows a machine (:class:`PieceSides`)."""
        n, mode, lam1, lam2, L, W, Y, dtype, wd, li = self._side_args()
        if not self.kept:
            return Side(n, mode, lam1, lam2, L, W, Y, dtype, wd, li)
        c = self.client
        workers = piece_workers(c, n) if L is None else []
        if len(workers) > 1:
            return PieceSides(workers, n, mode, lam1, lam2, W, Y, dtype, wd, li)
        big = [None if a is None else c.scatter(a, hash=False) for a in (Y, wd)]
        zh = None if W is None else W.zh_shared()
        if zh is not None and not hasattr(zh, "key"):  # Zh here (gathered for the driver's products): sent once
            zh = c.scatter(zh, hash=False)
        return kept_call(c, make_side, n, mode, lam1, lam2, L, zh, None if W is None else W.anchors,
                         None if W is None else W.lam, big[0], dtype, big[1], li, keep=1)[1][0]

    # ---------------------------------------------------------------- block state
    def _graph_args(self) -> tuple:
        W, d, lam_inv = None, None, None
        if self.lam1 and self.W is not None:
            if isinstance(self.W, AnchorGraph):
                # Zh whole for the blocks (x^T W x needs every row of a column), assembled on a worker when the
                # graph is in row pieces: the driver never holds it
                W, d, lam_inv = self.W.zh_shared(), self.W.degrees, self.W.lam_inv
            else:
                W = sp.csr_array(self.W)
                d = np.asarray(W.sum(axis=1), dtype=np.float64).ravel()
        return W, d, lam_inv

    def _map(self, fn: Any, *args: Any, per_block: tuple = (), state: Any) -> tuple[list, Any]:
        """``M.map_blocks(fn, *args, state=state)``, by partition when :attr:`parts` is set (the arguments at the
        positions ``per_block`` are PerBlock); the proposals come back one per block, in block order."""
        # with the side kept on a worker no proposal carries its column: the winner's goes from its block's worker
        # to the side's (:meth:`choose`), not through the driver
        kw = {"attach": 0} if self.remote and fn in (_step, _init, _propose) else {}
        if self.parts is None:
            return self.M.map_blocks(fn, *args, state=state, **kw)
        attach = 0 if kw else max(partition.ATTACH, partition.ATTACH_STEP // len(self.parts))
        props, new = self.M.map_blocks(_in_partition, fn, per_block, attach, *args, state=state,
                                       partitions=self.parts, **kw)
        by_block: list = [None] * self.M.n_blocks
        for part, got in zip(self.parts, props, strict=True):
            for i, p in zip(part, got, strict=True):
                by_block[i] = p
        return by_block, new

    def _fresh(self) -> list:
        """An empty state, one item per block or partition (the partitions cut again: after a lost worker the
        blocks may live elsewhere)."""
        self.parts = _partitions(self.M)
        return [None] * (self.M.n_blocks if self.parts is None else len(self.parts))

    def init_state(self, selected: list[int]) -> list:
        W, d, lam_inv = self._graph_args()
        Y = self.Y
        Ysum = self.Ysum
        with shipped(W) as Wa, shipped(Y) as Ya:
            props, self.state = self._map(_init, self.n, PerBlock(self.coef), PerBlock(self.shift), self.lam2,
                                          self.lam1, Wa, d, lam_inv, Ya, Ysum, self.mode, list(selected),
                                          per_block=(1, 2), state=self._fresh())
        return props

    def load_state(self, step: int) -> None:
        _, self.state = self._map(_load_blocks, self.dir, step, PerBlock(self.coef), PerBlock(self.shift),
                                  per_block=(2, 3), state=self._fresh())

    def pass_(self, p: int, V: Any, s_p: float, c2: float, save: bool, vsum: np.ndarray | None = None) -> list:
        from distributed import Future

        if isinstance(V, Kept):  # on its worker: a future of it there, sent on to the machines of the blocks
            V = mark_spread(as_future(self.client, V))
        elif isinstance(V, Future):  # joined from the pieces on a worker: sent on from there
            V = mark_spread(V)
        elif not isinstance(V, Pieced):  # (in pieces of rows, each machine gets the rows its blocks touch)
            V = np.ascontiguousarray(V, dtype=_step_dtype(self.mode, V.shape))  # the column sums from these values
            vsum = col_sums(V)
        vsum = np.zeros(vsum.shape[0]) if self.raw else vsum  # read only by blocks with a transform
        with contextlib.nullcontext(V) if isinstance(V, Pieced) else shipped(V, broadcast=True, shared=True) as Va:
            props, new = self._map(_step, p, Va, vsum, s_p, c2, self.mode, self.dir if save else None,
                                   state=self.state)
        release(self.state)
        self.state = new
        return props

    # ---------------------------------------------------------------- the driver's part of a step
    def choose(self, props: list) -> tuple[int, tuple]:
        got = [p for p in props if p[0] >= 0 and np.isfinite(p[1])]
        if not got:
            raise ParameterError(f"only {len(self.ids)} features are linearly independent under this criterion; "
                                 f"ask for at most {len(self.ids)}")
        p = min(got, key=lambda q: (-q[1], q[0]))  # the best score, then the lower index
        if p[2] is not None:
            return p[0], p[2]
        if self.remote:  # made on its block's worker: the side's calls fetch it from there
            return p[0], self.M.column_future(p[0])
        X = self.M.columns([p[0]])
        return p[0], (X.indices, X.data)

    @property
    def remote(self) -> bool:
        """Whether the side is kept on the workers (on one, or in pieces)."""
        return isinstance(self.side, Kept | PieceSides)

    def take(self, p: int, col: tuple) -> tuple:
        """Add p to S: record its criterion and the objective; return (V, s_p, c2, V's column sums or None) for the
        update pass (V has one column for LapDOFS, two otherwise; a :class:`~dufs.engine.kept.Kept` vector where the
        side is kept on a worker, or a future of it joined from the pieces, with its column sums)."""
        coef, shift = float(self.coef[p]), float(self.shift[p])
        if isinstance(self.side, PieceSides):
            V, s_p, c2, crit, obj, vsum = self.side.take(int(p), col, coef, shift)
        elif isinstance(self.side, Kept):
            (s_p, c2, crit, obj, vsum), (V,) = kept_call(self.client, side_call, self.side, "take", int(p), col, coef,
                                                         shift, keep=1)
        else:
            V, s_p, c2 = self.side.take(int(p), col, coef, shift)
            crit, obj, vsum = self.side.criterion[-1], self.side.objective[-1], None
        self.ids.append(int(p))
        self.criterion.append(float(crit))
        self.objective.append(float(obj))
        return V, s_p, c2, vsum

    def vectors_at(self, t: int) -> tuple:
        """(V, s_p, c2, V's column sums or None) of step t, recomputed from the selection (for a replay after a
        restart or a lost worker)."""
        if isinstance(self.side, PieceSides):
            return self.side.vectors_at(int(t))
        if isinstance(self.side, Kept):
            (s_p, c2, _, _, vsum), (V,) = kept_call(self.client, side_call, self.side, "vectors_at", int(t), keep=1)
            return V, s_p, c2, vsum
        return (*self.side.vectors_at(t), None)

    def renew_side(self) -> None:
        """The side made again from the selection (its worker lost): the columns read again in one pass."""
        ids = list(self.ids)
        self.side = self._new_side()
        self.ids, self.criterion, self.objective = [], [], []
        if ids:
            cols = self.M.columns(ids)
            for i, p in enumerate(ids):
                a, b = cols.indptr[i], cols.indptr[i + 1]
                self.take(p, (cols.indices[a:b].copy(), cols.data[a:b].copy()))

    # ---------------------------------------------------------------- checkpoints
    def save_driver(self, step_of_blocks: int) -> None:
        if self.dir is None:
            return
        os.makedirs(self.dir, exist_ok=True)
        path = os.path.join(self.dir, "selection.json")
        meta = {"format": 1, "problem": self.problem, "indices": self.ids, "criterion": self.criterion,
                "objective": self.objective}
        atomic_write(path, lambda f: f.write(json.dumps(meta).encode()))

    def load_driver(self) -> list[int] | None:
        path = os.path.join(self.dir, "selection.json")
        if not os.path.exists(path):
            return None
        try:
            with open(path) as f:
                meta = json.load(f)
        except (OSError, ValueError) as e:
            raise ParameterError(f"the greedy checkpoint {path} is unreadable ({e}); delete it or run with "
                                 f"resume=False") from None
        if meta.get("problem") != self.problem:
            raise ParameterError(f"the greedy checkpoint {path} belongs to another problem; delete it, give "
                                 f"another checkpoint directory, or run with resume=False")
        return [int(i) for i in meta["indices"]]

    def block_step_on_disk(self, upto: int) -> int | None:
        """The newest step <= ``upto`` that every block has on disk (None: none)."""
        if self.dir is None or not os.path.isdir(self.dir):
            return None
        have: dict[int, set] = {}
        for name in os.listdir(self.dir):
            if name.startswith("block-") and name.endswith(".npz"):
                with contextlib.suppress(ValueError):
                    _, start, step = name[:-4].split("-")
                    have.setdefault(int(step), set()).add(int(start))
        starts = {b.start for b in self.M.blocks}
        ok = [s for s, got in have.items() if s <= upto and starts <= got]
        return max(ok) if ok else None

    # ---------------------------------------------------------------- rebuild
    def rebuild(self, done: int) -> list:
        """Block state after ``done`` update passes: from the newest complete block files, else from the start,
        then the missing passes replayed. Returns the proposals after the last one."""
        t0 = self.block_step_on_disk(done)
        if t0 is not None:
            self.load_state(t0)
            props = None
        else:
            props = self.init_state([])
            t0 = 0
        for t in range(t0, done):
            V, s_p, c2, vsum = self.vectors_at(t)
            props = self.pass_(self.ids[t], V, s_p, c2, save=self.save_at(t + 1), vsum=vsum)
            self.replayed += 1
        if props is None:  # loaded exactly at `done`: ask for the proposals without changing anything
            props, _ = self._map(_propose, self.mode, state=self.state)
        return props

    def save_at(self, step: int) -> bool:
        return self.dir is not None and step % self.every == 0


def _rebuild_after(run: GreedyRun, exc: BaseException, done: int, verbose_name: str) -> list:
    """The block state rebuilt after ``done`` passes, when ``exc`` is the loss of a worker; the rebuild may itself
    meet the same loss (its first pass can start before the scheduler has removed the dead worker), so it is
    tried again, all tries counted against :data:`MAX_RECOVERIES`. Anything else is raised."""
    while True:
        if not recoverable(exc, run.recoveries):
            raise exc
        run.recoveries += 1
        log.warning("%s: the block state was lost (%s); rebuilding it", verbose_name, type(exc).__name__)
        try:
            if run.remote:  # its worker may be the one lost: the side too, from the selection
                run.renew_side()
            return run.rebuild(done)
        except Exception as e:
            exc = e


def _take(run: GreedyRun, p: int, col: Any, verbose_name: str) -> tuple:
    """``run.take(p, col)``; where the side is kept on the workers and one that keeps it (or a piece) was lost, the
    side made again from the selection and the step taken again."""
    while True:
        try:
            return run.take(p, col)
        except Exception as exc:
            if not (run.remote and recoverable(exc, run.recoveries)):
                raise
            run.recoveries += 1
            log.warning("%s: the selected set kept on the workers was lost (%s); making it again", verbose_name,
                        type(exc).__name__)
            run.renew_side()
            col = run.M.column_future(p)  # its block's worker may be the one lost


def _calls_seconds(before: list) -> float | None:
    """The longest of the workers' call times (on their clocks) in the direct pass that just ran, or None when it
    ran as tasks: :func:`~dufs.engine.direct.last_timeline` then still holds ``before``, an older pass's."""
    tl = last_timeline()
    if not tl or tl == before:
        return None
    return max(t1 - t0 for _, t0, t1 in tl)


def run_greedy(run: GreedyRun, resume: bool, verbose_name: str) -> GreedyResult:
    """The greedy selection's steps (the driver in :func:`~dufs.scheduling.one_blas_thread` meanwhile)."""
    with one_blas_thread():
        return _run_greedy(run, resume, verbose_name)


def _run_greedy(run: GreedyRun, resume: bool, verbose_name: str) -> GreedyResult:
    t0 = time.perf_counter()
    M, k = run.M, run.k
    done = 0  # update passes applied to the block state
    props = None
    pending: Any = None  # (V, s_p, c2, vsum) of the last choice, whose update pass has not run yet
    if resume:
        ids = run.load_driver()
        if ids:
            # rebuild the driver's selected columns and H from the recorded sequence (columns re-read in one pass)
            cols = M.columns(ids)
            for i, p in enumerate(ids):
                a, b = cols.indptr[i], cols.indptr[i + 1]
                pending = run.take(p, (cols.indices[a:b].copy(), cols.data[a:b].copy()))
            done = len(ids) - 1
            run.resumed = len(ids)
            props = run.rebuild(done)
            log.info("%s: resumed after %d selected features", verbose_name, len(ids))
    if props is None:
        props = run.init_state([])
    times: list[float] = []  # per step: the update pass of the previous choice, then this choice
    driver: list[float] = []  # of which the driver's part (V for the next pass, the criterion, H)
    passes: list[float] = []  # ... and the update pass (0 for the first step's start)
    calls: list[float | None] = []  # of which the slowest worker's calls, where the pass ran as direct calls
    while len(run.ids) < k:
        ts = time.perf_counter()
        tp, tc = 0.0, None
        if len(run.ids) > done:  # the previous choice still has its update pass to run
            t = len(run.ids) - 1
            try:
                V, s_p, c2, vsum = pending
                before = last_timeline()
                props = run.pass_(run.ids[t], V, s_p, c2, save=run.save_at(t + 1), vsum=vsum)
                tp, tc = time.perf_counter() - ts, _calls_seconds(before)
            except Exception as e:
                props = _rebuild_after(run, e, t, verbose_name)
                if run.remote:  # the pending vectors were the lost side's: made again
                    pending = run.vectors_at(t)
                continue
            done = t + 1
        p, col = run.choose(props)
        td = time.perf_counter()
        pending = _take(run, p, col, verbose_name)
        driver.append(time.perf_counter() - td)
        passes.append(tp)
        calls.append(tc)
        run.save_driver(done)
        times.append(time.perf_counter() - ts)
        log.debug("%s step %d: feature %d, criterion %.6g, objective %.6g", verbose_name, len(run.ids) - 1, p,
                  run.criterion[-1], run.objective[-1])
    release(run.state)
    if run.remote:
        run.side = None
        flush(run.client)
    return GreedyResult(indices=np.asarray(run.ids, dtype=np.int64), criterion=np.asarray(run.criterion),
                        objective=np.asarray(run.objective),
                        diagnostics={"steps": k, "step_seconds": times, "driver_seconds": driver,
                                     "pass_seconds": passes, "pass_call_seconds": calls,
                                     "select_time": time.perf_counter() - t0,
                                     "recoveries": run.recoveries, "passes_replayed": run.replayed,
                                     "resumed_steps": run.resumed, "samples_side": run.side_layout,
                                     "checkpoint": run.dir})


def check_k(M: Matrix, n_features: Any) -> int:
    d = M.shape[1]
    if not isinstance(n_features, int | np.integer) or not 1 <= n_features <= d:
        raise ParameterError(f"The 'n_features' parameter must be an int in [1, {d}]; got {n_features!r}.")
    return int(n_features)
