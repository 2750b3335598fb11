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
from dufs.engine import AnchorGraph, Matrix, PerBlock, last_timeline, shipped
from dufs.errors import ParameterError
from dufs.kernels.blockops import col_sums
from dufs.kernels.greedy import (
    A_OPTIMAL,
    JCFS,
    anchor_b,
    anchor_step_bits,
    anchor_zt_column,
    sparse_z,
)
from dufs.methods.greedy import partition
from dufs.methods.greedy.columns import SelectedColumns, _in_threads, _row_shares
from dufs.methods.greedy.partition import _in_partition, _init, _load_blocks, _partitions, _propose, _step, _step_dtype
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


def _ztY(Y: np.ndarray, col: tuple[np.ndarray, np.ndarray], coef: float, shift: float, Ysum: np.ndarray
         ) -> np.ndarray:
    """z^T Y for z = coef (x - shift), x the sparse column ``col``: only x's rows of Y are read (in slices)."""
    rows, vals = col
    out = np.zeros(Y.shape[1])
    for a in range(0, rows.shape[0], 1 << 20):
        out += np.asarray(vals[a:a + (1 << 20)], dtype=np.float64) @ np.asarray(Y[rows[a:a + (1 << 20)]],
                                                                                dtype=np.float64)
    return coef * (out - shift * Ysum)


def _dense_z(n: int, col: tuple[np.ndarray, np.ndarray], coef: float, shift: float) -> np.ndarray:
    z = np.zeros(n)
    z[col[0]] = col[1]
    if shift:
        z -= shift
    if coef != 1.0:
        z *= coef
    return z


class GreedyRun:
    """One greedy selection of ``k`` features on M: the block state on the workers, the selected set here."""

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
        self.sel = SelectedColumns(n, lam2, np.float32 if np.dtype(M.dtype) == np.float32 else np.float64)
        self.criterion: list[float] = []
        self.objective: list[float] = []
        self.trace_obj = 0.0  # Tr(H^-1) (A) or log det H (D)
        self.RS = np.zeros((0, 0 if Y is None else Y.shape[1]))  # Z_S^T Y (JCFS)
        # LapAOFS/LapDOFS on an anchor graph: A_S = Zh^T Z_S (k x n_anchors), 1 + lambda1 d and Lambda^-1
        # (:meth:`_take_anchor`)
        self.AS: np.ndarray | None = None
        if isinstance(W, AnchorGraph) and lam1 and mode != JCFS:
            self.AS = np.zeros((0, W.n_anchors))
            self.wd = 1.0 + lam1 * np.asarray(W.degrees, dtype=np.float64)
            self.li = np.asarray(W.lam_inv, dtype=np.float64)
        # Y is float64, or float32 at kddb size (n x c, see jcfs._anchor_embedding): its sums are taken once, in
        # float64, and products with it never make a float64 copy of it
        self.Ysum = None if Y is None else col_sums(Y)
        self.Ysq = 0.0 if Y is None else float(sum(np.dot(Y[:, j], Y[:, j].astype(np.float64))
                                                   for j in range(Y.shape[1])))
        self.state: Any = None
        self._ybuf: np.ndarray | None = None  # :meth:`_scratch`
        # n-vectors kept between steps, zero but at the rows they hold now (:func:`sparse_z`, :meth:`_at_rows`)
        self._bufs: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self.parts: list[list[int]] | None = None  # the partitions of the block state (None: one task a block)
        self.recoveries = 0
        self.replayed = 0
        self.resumed = 0

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
        if self.parts is None:
            return self.M.map_blocks(fn, *args, state=state)
        attach = max(partition.ATTACH, partition.ATTACH_STEP // len(self.parts))
        props, new = self.M.map_blocks(_in_partition, fn, per_block, attach, *args, state=state,
                                       partitions=self.parts)
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

    def pass_(self, p: int, V: np.ndarray, s_p: float, c2: float, save: bool) -> list:
        V = np.ascontiguousarray(V, dtype=_step_dtype(self.mode, V.shape))  # the column sums below from these values
        vsum = np.zeros(V.shape[1]) if self.raw else col_sums(V)  # read only by blocks with a transform
        with shipped(V, broadcast=True, shared=True) as Va:  # every block's worker reads it
            props, new = self._map(_step, p, Va, vsum, s_p, c2, self.mode, self.dir if save else None,
                                   state=self.state)
        release(self.state)
        self.state = new
        return props

    # ---------------------------------------------------------------- the driver's part of a step
    def B(self, v: np.ndarray) -> np.ndarray:
        if not self.lam1:
            return v
        return v + self.lam1 * np.asarray(self.L @ v)

    def choose(self, props: list) -> tuple[int, tuple]:
        got = [p for p in props if p[0] >= 0 and np.isfinite(p[1])]
        if not got:
            raise ParameterError(f"only {self.sel.k} features are linearly independent under this criterion; "
                                 f"ask for at most {self.sel.k}")
        p = min(got, key=lambda q: (-q[1], q[0]))  # the best score, then the lower index
        if p[2] is not None:
            return p[0], p[2]
        X = self.M.columns([p[0]])
        return p[0], (X.indices, X.data)

    def take(self, p: int, col: tuple) -> tuple[np.ndarray, float, float]:
        """Add p to S: record its criterion and the objective; return (V, s_p, c2) for the update pass (V has one
        column for LapDOFS, two otherwise)."""
        if self.AS is not None:
            return self._take_anchor(p, col)
        S, n = self.sel, self.n
        z = _dense_z(n, col, self.coef[p], self.shift[p])
        Bz = self.B(z)
        u = S.tapply(Bz)
        gpp = float(z @ Bz) + self.lam2
        c = S.solve(u)
        s_p = gpp - float(u @ c)
        if self.mode == JCFS:
            Rp = _ztY(self.Y, col, self.coef[p], self.shift[p], self.Ysum)
            Ep = Rp - c @ self.RS
            e2 = float(Ep @ Ep)
            self.criterion.append(e2 / (self.lam2 * s_p))
            # for the next pass: r = z_p - Z_S c, q = Y E_p - Z_S H^-1 R_S E_p (one product with Z_S for both)
            P = S.apply(np.column_stack([c, S.solve(self.RS @ Ep)]))
            YE = self.Y @ Ep.astype(self.Y.dtype)
            V = np.column_stack([z - P[:, 0], YE - P[:, 1]])
            S.add(p, col, self.coef[p], self.shift[p], u, gpp)
            self.RS = np.vstack([self.RS, Rp[None, :]])
            G = S.solve(self.RS)
            self.objective.append(float(self.Ysq - np.sum(self.RS * G)) / self.lam2)
            return V, s_p, e2
        if self.mode == A_OPTIMAL:
            # V = [B r, B Z_S d] with r = z_p - Z_S c, d = H^-1 c: B r = B z_p - B Z_S c (one B product, 2 columns)
            BP = self.B(S.apply(np.column_stack([c, S.solve(c)])))
            V = np.column_stack([Bz - BP[:, 0], BP[:, 1]])
        else:
            V = (Bz - self.B(S.apply(c)))[:, None]  # LapDOFS updates s only: one column
        return self._record(p, col, u, gpp, c, s_p, V)

    def _record(self, p: int, col: tuple, u: np.ndarray, gpp: float, c: np.ndarray, s_p: float, V: np.ndarray
                ) -> tuple[np.ndarray, float, float]:
        """LapAOFS's or LapDOFS's criterion and objective for the chosen p; p added to S."""
        v_p = float(c @ c)
        if self.mode == A_OPTIMAL:
            self.criterion.append(1.0 - self.lam2 * (1.0 + v_p) / s_p)
            self.trace_obj += (1.0 + v_p) / s_p
        else:
            self.criterion.append(s_p / self.lam2 - 1.0)
            self.trace_obj += float(np.log(s_p))
        self.objective.append(self.trace_obj)
        self.sel.add(p, col, self.coef[p], self.shift[p], u, gpp)
        return V, s_p, v_p + 1.0

    def _take_anchor(self, p: int, col: tuple) -> tuple[np.ndarray, float, float]:
        """:meth:`take` for LapAOFS and LapDOFS on an anchor graph W = Zh Lambda^-1 Zh^T, with A_S = Zh^T Z_S
        (k x n_anchors, one row added a step) kept here: B y = (1 + lambda1 d) y - lambda1 Zh Lambda^-1 Zh^T y, and
        every y a step applies B to (z_p, Z_S c, Z_S d) has Zh^T y = a_p, A_S c or A_S d with a_p = Zh^T z_p. So
        a step makes one product Zh^T z_p and one Zh P (P: n_anchors x 1 or 2), where B z_p, then B of the other
        columns, made two of each. Where z_p = coef x_p is sparse (no shift) the products with it read its rows
        only, and z_p is an n-vector kept between steps, zero but at its rows (:func:`sparse_z`)."""
        S, n, W, lam1, li = self.sel, self.n, self.W, self.lam1, self.li
        Zh = W.Zh if W.products_here else None  # Zh on the driver: its products here, row by row
        if not self.shift[p]:
            rows = np.asarray(col[0])
            z, last = self._bufs.get("z", (None, rows[:0]))
            if z is None:
                z = np.zeros(n)
            wzr = np.empty(rows.shape[0])  # B's diagonal part of z_p, at its rows
            zbz = sparse_z(rows, np.asarray(col[1]), float(self.coef[p]), self.wd, last, z, wzr)
            self._bufs["z"] = (z, rows)
            wz = self._at_rows("wz", rows, wzr) if S.slots < S.k else None  # for the columns outside the mask
            zbs = S.tapply_rows(rows, wzr, wz)
        else:
            z = _dense_z(n, col, self.coef[p], self.shift[p])
            wz = self.wd * z
            zbz = float(z @ wz)
            zbs = S.tapply(wz)
        if Zh is not None and not self.shift[p]:  # Zh^T z from x's rows of Zh alone, a share of them a thread
            rows, vals = np.asarray(col[0]), np.asarray(col[1])
            cut = _row_shares(rows.shape[0])
            A = np.empty((len(cut) - 1, W.n_anchors))
            _in_threads(lambda a, b: [anchor_zt_column(Zh.indptr, Zh.indices, Zh.data, rows[cut[i]:cut[i + 1]],
                                                       vals[cut[i]:cut[i + 1]], float(self.coef[p]), A[i])
                                      for i in range(a, b)], len(cut) - 1)
            a_p = A.sum(axis=0)
        else:
            a_p = np.asarray(W.zt(z), dtype=np.float64).ravel()
        lia = li * a_p
        u = zbs - lam1 * (self.AS @ lia)  # Z_S^T B z_p
        gpp = zbz - lam1 * float(a_p @ lia) + self.lam2
        c = S.solve(u)
        s_p = gpp - float(u @ c)
        if self.mode == A_OPTIMAL:
            d = S.solve(c)
            C = np.column_stack([c, d])  # the vectors [Z_S c, Z_S d]
            Q = np.column_stack([a_p - self.AS.T @ c, self.AS.T @ d])  # Zh^T [r, Z_S d], r = z_p - Z_S c
        else:
            C = c[:, None]
            Q = (a_p - self.AS.T @ c)[:, None]
        # B y = (1 + lambda1 d) y - lambda1 W y in the dtype the step ships it in, with W y = Zh Lambda^-1 Zh^T y:
        # Zh here, row by row in the same sweep as Z_S C's rows; in pieces, W y from the workers first (in that
        # dtype too)
        dt = _step_dtype(self.mode, (n, C.shape[1]))
        P = np.ascontiguousarray(li[:, None] * Q)
        V = np.empty((n, C.shape[1]), dtype=dt)
        wd = self.wd
        if Zh is not None:
            Y, T, offset = S.apply_parts(C, out=self._scratch(C.shape[1]))
            w8 = S.mask_bytes()
            _in_threads(lambda a, b: anchor_step_bits(Zh.indptr, Zh.indices, Zh.data, P, z, Y, w8, T, offset, wd,
                                                      lam1, V, a, b), n)
        else:
            Y = S.apply(C, out=self._scratch(C.shape[1]))
            WY = W.zp(P, dtype=dt)
            _in_threads(lambda a, b: anchor_b(z, Y, wd, WY, lam1, V, a, b), n)
        self.AS = np.vstack([self.AS, a_p[None, :]])
        return self._record(p, col, u, gpp, c, s_p, V)

    def _at_rows(self, name: str, rows: np.ndarray, values: np.ndarray) -> np.ndarray:
        """An n-vector kept between steps (a fresh one's pages fault in again every step), zero but at ``rows``,
        where it holds ``values``: the last call's rows are zeroed first."""
        buf, last = self._bufs.get(name, (None, None))
        if buf is None:
            buf = np.zeros(self.n)
        else:
            buf[last] = 0.0
        buf[rows] = values
        self._bufs[name] = (buf, rows)
        return buf

    def _scratch(self, p: int) -> np.ndarray:
        """An n x p float64 array kept between steps (a fresh one's pages fault in again every step)."""
        if self._ybuf is None or self._ybuf.shape[1] != p:
            self._ybuf = np.empty((self.n, p))
        return self._ybuf

    def vectors_at(self, t: int) -> tuple[np.ndarray, float, float]:
        """(V, s_p, c2) of step t, recomputed from the selection (for a replay after a restart or a lost worker)."""
        full = self.sel
        saved = (self.sel, self.criterion, self.objective, self.trace_obj, self.RS, self.AS)
        self.sel, self.criterion, self.objective, self.RS = full.head(t), [], [], self.RS[:t]
        self.AS = None if self.AS is None else self.AS[:t]
        try:
            out = self.take(full.ids[t], full.col(t))
        finally:
            self.sel, self.criterion, self.objective, self.trace_obj, self.RS, self.AS = saved
        return out

    # ---------------------------------------------------------------- checkpoints
    def save_driver(self, step_of_blocks: int) -> None:
        if self.dir is None:
            return
        os.makedirs(self.dir, exist_ok=True)
        path = os.path.join(self.dir, "selection.json")
        meta = {"format": 1, "problem": self.problem, "indices": self.sel.ids, "criterion": self.criterion,
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
            V, s_p, c2 = self.vectors_at(t)
            props = self.pass_(self.sel.ids[t], V, s_p, c2, save=self.save_at(t + 1))
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
            return run.rebuild(done)
        except Exception as e:
            exc = e


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
    pending: Any = None  # (V, s_p, c2) of the last choice, whose update pass has not run yet
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
    while run.sel.k < k:
        ts = time.perf_counter()
        tp, tc = 0.0, None
        if run.sel.k > done:  # the previous choice still has its update pass to run
            t = run.sel.k - 1
            try:
                V, s_p, c2 = pending
                before = last_timeline()
                props = run.pass_(run.sel.ids[t], V, s_p, c2, save=run.save_at(t + 1))
                tp, tc = time.perf_counter() - ts, _calls_seconds(before)
            except Exception as e:
                props = _rebuild_after(run, e, t, verbose_name)
                continue
            done = t + 1
        p, col = run.choose(props)
        td = time.perf_counter()
        pending = run.take(p, col)
        driver.append(time.perf_counter() - td)
        passes.append(tp)
        calls.append(tc)
        run.save_driver(done)
        times.append(time.perf_counter() - ts)
        log.debug("%s step %d: feature %d, criterion %.6g, objective %.6g", verbose_name, run.sel.k - 1, p,
                  run.criterion[-1], run.objective[-1])
    release(run.state)
    return GreedyResult(indices=np.asarray(run.sel.ids, dtype=np.int64), criterion=np.asarray(run.criterion),
                        objective=np.asarray(run.objective),
                        diagnostics={"steps": k, "step_seconds": times, "driver_seconds": driver,
                                     "pass_seconds": passes, "pass_call_seconds": calls,
                                     "select_time": time.perf_counter() - t0,
                                     "recoveries": run.recoveries, "passes_replayed": run.replayed,
                                     "resumed_steps": run.resumed,
                                     "checkpoint": run.dir})


def check_k(M: Matrix, n_features: Any) -> int:
    d = M.shape[1]
    if not isinstance(n_features, int | np.integer) or not 1 <= n_features <= d:
        raise ParameterError(f"The 'n_features' parameter must be an int in [1, {d}]; got {n_features!r}.")
    return int(n_features)
