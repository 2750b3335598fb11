"""Greedy sequential selectors in feature space: LapAOFS, LapDOFS (paper 004) and JCFS's greedy Fisher step
(paper 001), in the feature-space forms of docs/methods.md ("LapAOFS and LapDOFS", "JCFS").

With Z the implicitly transformed data (n_samples x n_features, never formed), B = I + lambda1 L (LapAOFS and
LapDOFS; B = I and lambda2 = gamma for JCFS) and G = Z^T B Z + lambda2 I (never formed), the selected set S has the
k x k matrix H = G_SS. Every candidate g keeps O(1) numbers where its block lives: its Schur complement
s_g = G_gg - G_gS H^-1 G_Sg and one more (LapAOFS: v_g = ||H^-1 G_Sg||^2; JCFS: ||E_g||^2 with
E = Z^T Y - G_.S H^-1 Z_S^T Y). The choices:

- LapAOFS (A-optimal, eq. (20)): argmin (1 + v_g) / s_g, the increase of Tr(H^-1);
- LapDOFS (D-optimal, eq. (29)): argmax s_g, det H grows by the factor s_g;
- JCFS (eq. (14)): argmax ||E_g||^2 / s_g.

A step is one pass: the driver, holding only the selected columns and H, builds two n-vectors V = [B r, B Z_S d]
(JCFS: [r, q]) for the feature p just chosen; every block computes Z_b^T V, updates its candidates' numbers
(:func:`dufs.kernels.greedy.greedy_update`) and proposes its best; the driver takes the global best (ties: the
lower feature index). Recorded per step, in the papers' own terms: the chosen feature's criterion (eq. (20),
(29) or (14) evaluated at it) and the objective after the step (Tr(H^-1), log det H, or tr(Y^T M_S Y)).

Checkpoints: with ``checkpoint`` (a directory; ``"auto"``: beside a local store) the driver writes the selected
sequence after every step and every block its candidates' numbers every ``checkpoint_every`` steps (atomic
writes); ``resume=True`` continues from there, re-running only the update passes of the steps after the last
complete set of block files. A round that fails because workers were lost rebuilds the block state the same way.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import dataclass, field
from typing import Any

import numba
import numpy as np
import scipy.linalg as sla
import scipy.sparse as sp

from dufs._logging import get_logger
from dufs.engine import Matrix, PerBlock
from dufs.engine.direct import last_timeline
from dufs.engine.dispatch import current_client, shipped
from dufs.engine.graphs import (
    AnchorGraph,
    anchor_graph,
    graph_rows,
    knn_graph,
    laplacian_operator,
    resolve_graph,
)
from dufs.engine.shm import local_array
from dufs.errors import ParameterError
from dufs.kernels.blockops import col_sums, csc_rmatvec
from dufs.kernels.greedy import (
    A_OPTIMAL,
    D_OPTIMAL,
    JCFS,
    anchor_b,
    anchor_step_bits,
    anchor_zt_column,
    best,
    bits_apply,
    bits_eligible,
    bits_row_sums,
    bits_set,
    bits_slot_sums,
    bits_tables,
    cols_apply,
    cols_tapply,
    greedy_update,
    sparse_z,
    tile_cuts,
    xwx_anchor,
    xwx_graph,
)
from dufs.methods.params import (
    CHECKPOINT_PARAMS,
    GRAPH_PARAMS,
    Param,
    StrOptions,
    check_params,
    integer,
    nonnegative,
    positive,
    table,
)
from dufs.methods.solver import atomic_write, checkpoint_dir, recoverable, release
from dufs.scheduling import driver_threads, in_threads, one_blas_thread

log = get_logger(__name__)

#: LapAOFS's and LapDOFS's parameters (the paper's lambda1 = lambda2 = 0.01 and k = 4)
LAPOFS_PARAMS = table(
    Param("criterion", "A", (StrOptions({"A", "D"}),), "A-optimal (LapAOFS) or D-optimal (LapDOFS)", estimator=False),
    Param("lambda1", 0.01, (nonnegative(),), "weight of the graph (manifold) regulariser"),
    Param("lambda2", 0.01, (positive(),), "ridge"),
    GRAPH_PARAMS.values(),
    Param("n_neighbors", 4, (integer(1),), "k of the kNN graph"),
    CHECKPOINT_PARAMS.values(),
    Param("checkpoint_every", 1, (integer(1),), "steps between the blocks' checkpoints", estimator=False),
)

_TINY = 1e-10  # a candidate whose Schur complement fell below this fraction of its start is in the selected span


@dataclass
class GreedyResult:
    """The selected ``indices`` (in the order chosen), the chosen features' ``criterion`` and the ``objective``
    after each step (see the module docstring), and ``diagnostics``."""

    indices: np.ndarray
    criterion: np.ndarray
    objective: np.ndarray
    diagnostics: dict = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------------- blocks
def _diag_terms(b, n, coef, shift, lam2, lam1, W, d, lam_inv, Y, Ysum, mode):
    """Start values (s, v) of a block's candidates: s = ||z||^2 + lambda1 z^T L z + lambda2 (L 1 = 0, so the shift
    drops out of z^T L z), v = 0 (A, D) or ||Z_b^T Y||^2 (JCFS)."""
    B = sp.csc_array((b.data.astype(np.float64), b.indices, b.indptr), shape=(n, b.width))
    colsum = np.asarray(B.sum(axis=0)).ravel()
    sq = np.asarray(B.multiply(B).sum(axis=0)).ravel()
    zz = coef * coef * (sq - 2.0 * shift * colsum + n * shift * shift)
    s = zz + lam2
    if lam1 and W is not None:
        xdx = (B.multiply(B)).T @ d
        # x^T W x per column by numba kernels, O(nnz x neighbours) (SciPy's W^T @ B over 2M rows took minutes)
        if lam_inv is None:
            xwx = xwx_graph(b.indptr, b.indices, b.data, W.indptr, W.indices, np.asarray(W.data, dtype=np.float64),
                            np.zeros(n))
        else:
            xwx = xwx_anchor(b.indptr, b.indices, b.data, W.indptr, W.indices, np.asarray(W.data, dtype=np.float64),
                             np.asarray(lam_inv, dtype=np.float64))
        s = s + lam1 * coef * coef * (xdx - xwx)
    if mode == JCFS:  # X_b^T Y by the engine's kernel (Y float64 or float32, read in place: no copy of it)
        BY = np.zeros((b.width, Y.shape[1]))
        csc_rmatvec(b.indptr, b.indices, b.data, np.ascontiguousarray(Y), BY)
        R = coef[:, None] * (BY - shift[:, None] * Ysum[None, :])
        v = np.einsum("ij,ij->i", R, R)
    else:
        v = np.zeros(b.width)
    return s, v


def _init(blk, state, n, coef, shift, lam2, lam1, W, d, lam_inv, Y, Ysum, mode, selected):
    s, v = _diag_terms(blk, n, coef, shift, lam2, lam1, W, d, lam_inv, Y, Ysum, mode)
    sel = np.zeros(blk.width, dtype=np.bool_)
    if selected is not None and len(selected):
        loc = np.asarray(selected, dtype=np.int64) - blk.start
        sel[loc[(loc >= 0) & (loc < blk.width)]] = True
    # the transform stays beside the block: a step sends only p, V and three numbers
    st = {"s": s, "v": v, "sel": sel, "tiny": _TINY * np.maximum(s, 1e-300), "step": 0,
          **_block_transform(coef, shift)}
    return st, _proposal(blk, st, mode)


def _block_transform(coef: np.ndarray, shift: np.ndarray) -> dict:
    """A block's transform for its state: None for both where it is the identity (coef 1, shift 0: the kernel then
    reads neither, :func:`~dufs.kernels.greedy.greedy_update`)."""
    if not np.any(shift) and np.all(coef == 1.0):
        return {"coef": None, "shift": None}
    return {"coef": np.ascontiguousarray(coef, dtype=np.float64),
            "shift": np.ascontiguousarray(shift, dtype=np.float64)}


# LapAOFS's and LapDOFS's step vectors (V = [B r, B Z_S d], or [B r]) go to the workers in float32 (the products
# accumulate in float64) once they are larger than this in float64: a step's kernel gathers V's row at every
# nonzero, from random rows, and n x 2 float64 outgrows a server's last-level cache at n ~ 1M (2M x 2: 3.5-4x a
# one-vector pass's kernel, in float32 1.2x; docs/methods.md); at kddb size it halves what a step ships. Not JCFS:
# a candidate in the selected span has both its numbers at rounding level and their ratio is its score
_STEP_F32_BYTES = 1 << 23


def _step_dtype(mode: int, shape: tuple) -> Any:
    """The dtype a step's vectors go to the blocks in (:data:`_STEP_F32_BYTES`)."""
    return np.float32 if mode != JCFS and 8 * int(np.prod(shape)) > _STEP_F32_BYTES else np.float64


_INT32_ARRAY = numba.types.int32[::1]
_INT64_ARRAY = numba.types.int64[::1]
_VALUE_ARRAY = {np.dtype(np.float32): numba.types.float32[::1], np.dtype(np.float64): numba.types.float64[::1]}
_DRIVER_THREADS = driver_threads()


def _in_threads(fn: Any, count: int, bounds: Any = None) -> None:
    """``fn(a, b)`` over [0, count) in up to :data:`_DRIVER_THREADS` ranges at once (:func:`dufs.scheduling.in_threads`:
    the driver's products with the selected columns, numba kernels that release the GIL)."""
    in_threads(fn, count, _DRIVER_THREADS, bounds)


def _row_shares(count: int) -> list[int]:
    """Bounds cutting ``count`` rows of a sparse column into a share a driver thread (one share below 64K rows:
    a thread's partial result and its start cost more than it saves), for products that sum partial results."""
    parts = max(1, min(_DRIVER_THREADS, count >> 15))
    return [count * i // parts for i in range(parts + 1)]


_ATTACH = 1 << 15  # a proposal carries its column when it has at most this many nonzeros; the winner's heavier one is
# fetched alone (kddb-like data have columns of millions of nonzeros: every block shipping its best one cost a pass)
_ATTACH_STEP = 1 << 25  # ... except a partition's best, which carries its column up to this many nonzeros shared
# among the partitions (a partition's best is the step's winner often: with 1 worker always). Fetched alone, the
# winner's column was a round of tasks a step, 20 ms of a 0.23 s LapDOFS step for a 1M-row hub column, and at kddb
# size (hubs of 5-18M nonzeros, over the earlier 4M) 0.1-0.5 s of a 4.6 s LapAOFS step against 0.1 s more in the pass
# for carrying them (16M nonzeros a partition on 2 workers: 128 MB through /dev/shm)


def _proposal(blk, st, mode, found=None):
    j, sc = best(mode, st["s"], st["v"], st["sel"], st["tiny"]) if found is None else found
    if j < 0:
        return (-1, -np.inf, None)
    a, c = blk.indptr[j], blk.indptr[j + 1]
    return (blk.start + int(j), float(sc), _column(blk, j) if c - a <= _ATTACH else None)


def _column(blk, j: int) -> tuple[np.ndarray, np.ndarray]:
    """Column j (block-local) of a block: its rows and values (in the data's dtype), copied."""
    a, c = blk.indptr[j], blk.indptr[j + 1]
    return blk.indices[a:c].copy(), blk.data[a:c].copy()


def _swapped(mode: int) -> tuple[str, ...]:
    """The state a step changes: (s, v, sel); LapDOFS's steps leave v (zeros) as it is."""
    return ("s", "sel") if mode == D_OPTIMAL else ("s", "v", "sel")


def _step(blk, state, p, V, vsum, s_p, c2, mode, save):
    """Mark p selected (if it is this block's), update every candidate along V, propose the block's best.

    The step writes into the state's spare arrays (the kernel reads the current s and v and writes the updated ones
    there, in the same sweep that picks the best) and the current ones become the new state's spares: the state
    it was given stays as it was (a task may run again), and no array is allocated (a fresh array's pages fault in
    again every step: 25 bytes a feature)."""
    V = local_array(V)
    swapped = _swapped(mode)
    spare = state.get("spare") or {k: np.empty_like(state[k]) for k in swapped}
    np.copyto(spare["sel"], state["sel"])  # s and v: the kernel reads the state's and writes the spares
    st = {"v": state["v"], **spare, "spare": {k: state[k] for k in swapped}, "tiny": state["tiny"],
          "step": state["step"] + 1, "coef": state["coef"], "shift": state["shift"],
          "tiny_saved": state.get("tiny_saved", False)}
    if blk.start <= p < blk.stop:
        st["sel"][p - blk.start] = True
    found = greedy_update(blk.indptr, blk.indices, blk.data, st["coef"], st["shift"], V, vsum, s_p, c2, state["s"],
                          state["v"], st["sel"], mode, st["tiny"], st["s"], st["v"])
    if save is not None:
        _save_block(save, blk.start, st, mode)
    return st, _proposal(blk, st, mode, found)


def _save_block(directory: str, start: int, st: dict, mode: int) -> None:
    """The block's candidates after step ``st["step"]``: (s, sel, and v but for LapDOFS, whose v stays 0) a step,
    the thresholds ``tiny`` (fixed at the start) once a run, in their own file (at kddb size a step wrote 750 MB,
    a third of it the same thresholds again)."""
    if not st["tiny_saved"]:
        atomic_write(os.path.join(directory, f"block-{start}-tiny.npy"), lambda f: np.save(f, st["tiny"]),
                     fsync=False)
        st["tiny_saved"] = True
    path = os.path.join(directory, f"block-{start}-{st['step']}.npz")
    keep = {"s": st["s"], "sel": st["sel"], **({} if mode == D_OPTIMAL else {"v": st["v"]})}
    atomic_write(path, lambda f: np.savez(f, **keep, step=np.int64(st["step"])), fsync=False)  # every step: no fsync
    # keep the two newest steps of this block (a resume needs one step that every block has written)
    old = os.path.join(directory, f"block-{start}-{st['step'] - 2}.npz")
    with contextlib.suppress(OSError):
        os.unlink(old)


def _load_blocks(blk, state, directory, step, coef, shift):
    path = os.path.join(directory, f"block-{blk.start}-{step}.npz")
    with np.load(path) as z:
        s = np.array(z["s"])
        st = {"s": s, "v": np.array(z["v"]) if "v" in z else np.zeros_like(s), "sel": np.array(z["sel"]),
              "tiny": np.array(z["tiny"]) if "tiny" in z else np.load(os.path.join(directory,
                                                                                   f"block-{blk.start}-tiny.npy")),
              "step": int(z["step"]), "tiny_saved": True, **_block_transform(coef, shift)}
    if st["tiny"].shape != s.shape:
        raise ParameterError(f"the greedy checkpoint {directory} does not match this run's blocks (block {blk.start}: "
                             f"{s.shape[0]} candidates, {st['tiny'].shape[0]} thresholds); delete it or run with "
                             f"resume=False")
    return st, None


def _in_partition(blks, states, fn, per_block, attach, *args):
    """``fn(block, state, *args)`` over the blocks of one partition, one task: ``states`` and the arguments at the
    positions ``per_block`` (PerBlock) are lists with one item per block. Returns (states, proposals), as lists;
    the partition's best proposal carries its column when it has at most ``attach`` nonzeros."""
    states = [None] * len(blks) if states is None else states
    new, props = [], []
    for i, (blk, st) in enumerate(zip(blks, states, strict=True)):
        out = fn(blk, st, *(a[i] if j in per_block else a for j, a in enumerate(args)))
        new.append(out[0])
        props.append(out[1])
    got = [(q[1], -q[0], i) for i, q in enumerate(props) if isinstance(q, tuple) and q[0] >= 0 and np.isfinite(q[1])]
    if got and attach:
        i = max(got)[2]  # the best score, then the lower index (as the driver chooses)
        blk, (p, sc, col) = blks[i], props[i]
        j = p - blk.start
        if col is None and blk.indptr[j + 1] - blk.indptr[j] <= attach:
            props[i] = (p, sc, _column(blk, j))
    return new, props


def _partitions(M: Matrix) -> list[list[int]] | None:
    """The feature blocks cut into one partition per worker thread, each on the worker holding its blocks
    (:meth:`Matrix.partition`), when a distributed client runs the steps and there are more blocks than threads;
    None (one task a block) otherwise. A step then costs a few tasks a thread, not a few a block: at kddb's
    thousands of blocks the scheduler's per-task cost, paid every step, outweighed the step's own work."""
    client = current_client()
    if client is None or M.n_blocks <= 1:
        return None
    try:
        threads = sum(client.nthreads().values())
    except Exception:  # a client that cannot say: one task a block, as before
        return None
    if threads < 1 or threads >= M.n_blocks:
        return None
    return M.partition(threads)


# ---------------------------------------------------------------------------------------------------- the driver
class SelectedColumns:
    """The selected columns on the driver (raw, sparse, one array pair a column, kept as they arrived: adding one
    copies nothing, where growing one buffer reallocated and copied all of them, 60-590 ms at a time for 1M-row hub
    columns) with their transform, and H = G_SS (k x k). Products with them run through the engine's numba
    kernels, by row tiles. A column of one value with at least n / 32 rows (kddb's and the bench's heavy binary
    columns, which a LapAOFS selection takes first) is also kept as one bit of a row-major mask
    (:func:`~dufs.kernels.greedy.bits_eligible`): the products over every row (Z_S c) and over a sparse vector's rows
    (Z_S^T y, :meth:`tapply_rows`) read it instead of the columns' row numbers: a 2M-row bench's first 45 selected
    columns hold 18.9M nonzeros, 76 MB of row numbers, against 16 MB of mask."""

    def __init__(self, n: int, lam2: float, dtype: Any = np.float64):
        self.n = n
        self.lam2 = lam2
        self.ids: list[int] = []
        # (indptr [0, nnz], rows int32, values) a column; the values in the data's own dtype (float32 data stay
        # float32, exactly: a kddb hub column has ~10M rows)
        self.cols: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self.dtype = np.dtype(dtype)
        self.coef = np.zeros(0)
        self.shift = np.zeros(0)
        self.H = np.zeros((0, 0))
        self._nb: tuple | None = None  # :meth:`_numba_lists`
        # the bit mask (n x W uint64, None until a column goes there), each column's slot (-1: none) and the slots'
        # columns; ``_own_words`` False where the mask is the one of the set this one is a head of (read only)
        self._words: np.ndarray | None = None
        self._slot: list[int] = []
        self._slot_cols: list[int] = []
        self._own_words = True

    @property
    def k(self) -> int:
        return len(self.ids)

    def col(self, t: int) -> tuple[np.ndarray, np.ndarray]:
        return self.cols[t][1], self.cols[t][2]

    def head(self, t: int) -> SelectedColumns:
        """The first ``t`` selected columns (sharing this one's arrays)."""
        part = SelectedColumns(self.n, self.lam2, self.dtype)
        part.ids, part.cols = self.ids[:t], self.cols[:t]
        part.coef, part.shift, part.H = self.coef[:t], self.shift[:t], self.H[:t, :t]
        # the mask shared: the head's slots are a prefix of these (slots go in column order), later slots weigh 0
        part._slot = self._slot[:t]
        part._slot_cols = [c for c in self._slot_cols if c < t]
        part._words, part._own_words = self._words, self._words is None
        return part

    def X(self) -> sp.csc_array:
        ptr = np.zeros(self.k + 1, dtype=np.int64)
        ptr[1:] = np.cumsum([len(c[1]) for c in self.cols])
        ind = np.concatenate([c[1] for c in self.cols]) if self.cols else np.zeros(0, np.int32)
        dat = np.concatenate([c[2] for c in self.cols]) if self.cols else np.zeros(0, self.dtype)
        return sp.csc_array((dat, ind, ptr), shape=(self.n, self.k))

    def _numba_lists(self) -> tuple:
        """The columns as numba typed lists (rows, values, tile cuts), extended as columns are added; a column of one
        value (binary data) gives that value alone (the kernels then read its rows only)."""
        from numba.typed import List

        if self._nb is None:
            self._nb = (List.empty_list(_INT32_ARRAY), List.empty_list(_VALUE_ARRAY[self.dtype]),
                        List.empty_list(_INT64_ARRAY))
        inds, dats, cuts = self._nb
        for _, rows, vals in self.cols[len(inds):]:
            inds.append(rows)
            dats.append(vals[:1].copy() if vals.shape[0] and (vals == vals[0]).all() else vals)  # one value: alone
            cuts.append(tile_cuts(rows, self.n))
        return self._nb

    @property
    def slots(self) -> int:
        return len(self._slot_cols)

    def _slot_values(self) -> np.ndarray:
        """The value of each slot's column (its one value), in slot order."""
        return np.array([float(self.cols[t][2][0]) for t in self._slot_cols])

    def _skip(self) -> np.ndarray:
        """1 for the columns in the bit mask (the index kernels leave them out), 0 for the others."""
        return (np.asarray(self._slot, dtype=np.int64) >= 0).astype(np.uint8)

    def mask_bytes(self) -> np.ndarray:
        """The bit mask as bytes, n x 8W (n x 0 without one)."""
        if self._words is None:
            return np.zeros((self.n, 0), dtype=np.uint8)
        return self._words.view(np.uint8).reshape(self.n, -1)

    def apply_parts(self, c: np.ndarray, out: np.ndarray | None = None) -> tuple:
        """Z_S c (``c`` k x p) in parts: (Y, T, offset) with Z_S c = Y + (the rows' sums in the byte tables T) -
        offset, Y the columns outside the bit mask (n x p, into ``out`` when given; of no rows where every column
        is in the mask), T (:func:`~dufs.kernels.greedy.bits_tables`, of no bytes without a mask) and offset the
        shift's part (p)."""
        w = np.ascontiguousarray(self.coef[:, None] * c)
        p = w.shape[1]
        T = np.zeros((0, 256, p))
        if self.slots:
            T = bits_tables(np.ascontiguousarray(self._slot_values()[:, None] * w[self._slot_cols]))
        if self.slots == self.k and self.k:
            Y = np.zeros((0, p))
        else:
            Y = np.empty((self.n, p)) if out is None else out
            if not self.k:
                Y[:] = 0.0
            else:
                inds, dats, cuts = self._numba_lists()
                skip = self._skip()
                _in_threads(lambda a, b: cols_apply(inds, dats, cuts, w, skip, Y, a, b), len(cuts[0]) - 1)
        offset = self.shift @ w if self.shift.any() else np.zeros(p)
        return Y, T, offset

    def apply(self, c: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Z_S c (an n-vector, or n x p for a k x p ``c``; into ``out``, n x p float64, when given)."""
        one = c.ndim == 1
        c2 = c[:, None] if one else c
        Y, T, offset = self.apply_parts(c2, out)
        if Y.shape[0] == 0:  # every column in the mask
            Y = np.empty((self.n, c2.shape[1])) if out is None else out
        if self.slots:
            w8 = self.mask_bytes()
            acc = self.slots < self.k
            _in_threads(lambda a, b: bits_apply(w8, T, Y, acc, a, b), self.n)
        if offset.any():
            Y -= offset[None, :]
        return Y[:, 0] if one else Y

    def gram(self) -> np.ndarray:
        """Z_S^T Z_S (k x k) from the sparse columns: coef_i coef_j (x_i^T x_j - mu_j 1^T x_i - mu_i 1^T x_j +
        n mu_i mu_j)."""
        X = self.X()
        X = sp.csc_array((X.data.astype(np.float64), X.indices, X.indptr), shape=X.shape)  # float64 products
        G = np.asarray((X.T @ X).toarray(), dtype=np.float64)
        cs = np.asarray(X.sum(axis=0)).ravel()
        mu = self.shift
        G = G - np.outer(cs, mu) - np.outer(mu, cs) + self.n * np.outer(mu, mu)
        return self.coef[:, None] * G * self.coef[None, :]

    def tapply(self, V: np.ndarray) -> np.ndarray:
        """Z_S^T V (k, or k x p)."""
        one = V.ndim == 1
        V2 = np.ascontiguousarray(V[:, None] if one else V, dtype=np.float64)
        out = np.zeros((self.k, V2.shape[1]))
        if self.k:
            inds, dats, cuts = self._numba_lists()
            skip = np.zeros(self.k, dtype=np.uint8)  # every column by its rows: V is dense
            _in_threads(lambda a, b: cols_tapply(inds, dats, cuts, V2, skip, out, a, b), self.k,
                        lambda parts: self._nnz_bounds(parts, skip))
            if self.shift.any():  # else out - 0 * sums = out: V's column sums (a sweep over n x p) not needed
                out = out - self.shift[:, None] * col_sums(V2)[None, :]
            out = self.coef[:, None] * out
        return out[:, 0] if one else out

    def tapply_rows(self, rows: np.ndarray, y: np.ndarray, dense: np.ndarray) -> np.ndarray:
        """Z_S^T y (k) for a y nonzero only at ``rows`` (sorted), with its values there ``y`` and the whole of it
        ``dense`` (an n-vector, read by the columns outside the bit mask only): the mask's columns from y's rows of
        the mask (:func:`~dufs.kernels.greedy.bits_row_sums`), the rest by their rows."""
        out = np.zeros((self.k, 1))
        if not self.k:
            return out[:, 0]
        skip = self._skip()
        if self.slots < self.k:
            inds, dats, cuts = self._numba_lists()
            V2 = dense.reshape(-1, 1)
            _in_threads(lambda a, b: cols_tapply(inds, dats, cuts, V2, skip, out, a, b), self.k,
                        lambda parts: self._nnz_bounds(parts, skip))
        if self.slots:
            w8 = self.mask_bytes()
            G = (self.slots + 7) // 8
            cut = _row_shares(rows.shape[0])  # a table each
            Hs = np.zeros((len(cut) - 1, G, 256))
            _in_threads(lambda a, b: [bits_row_sums(w8, rows, y, Hs[i], cut[i], cut[i + 1]) for i in range(a, b)],
                        len(cut) - 1)
            sums = np.empty(self.slots)
            bits_slot_sums(Hs.sum(axis=0), self.slots, sums)
            out[self._slot_cols, 0] = self._slot_values() * sums
        if self.shift.any():
            out[:, 0] -= self.shift * float(np.sum(y, dtype=np.float64))
        return self.coef * out[:, 0]

    def _nnz_bounds(self, parts: int, skip: np.ndarray) -> list[int]:
        """Column bounds splitting the nonzeros of the selected columns not skipped into ``parts`` near-equal
        shares."""
        nnz = np.cumsum([0 if skip[t] else len(c[1]) for t, c in enumerate(self.cols)])
        return [0, *np.searchsorted(nnz, nnz[-1] * np.arange(1, parts) / parts, side="right").tolist(), self.k]

    def solve(self, b: np.ndarray) -> np.ndarray:
        if self.k == 0:
            return np.zeros_like(b)
        return sla.cho_solve(sla.cho_factor(self.H, lower=True), b)

    def append(self, p: int, col: tuple[np.ndarray, np.ndarray], coef: float, shift: float) -> None:
        """Add column ``p`` (its raw rows and values, kept as they are where their dtypes are already int32 and the
        data's) with its transform; H is the caller's."""
        rows = np.ascontiguousarray(col[0], dtype=np.int32)
        vals = np.ascontiguousarray(col[1], dtype=self.dtype)
        slot = -1
        # a head's columns past its own go by their rows: the mask is the full set's (a head is a replay's, for
        # one step)
        if self._own_words and bits_eligible(rows, vals, self.n):
            slot = self.slots
            word, bit = divmod(slot, 64)
            if self._words is None or word >= self._words.shape[1]:
                words = np.zeros((self.n, word + 1), dtype=np.uint64)
                if self._words is not None:
                    words[:, :self._words.shape[1]] = self._words
                self._words = words
            bits_set(self._words, rows, word, bit)
            self._slot_cols.append(self.k)
        self._slot.append(slot)
        self.cols.append((np.array([0, rows.shape[0]], dtype=np.int64), rows, vals))
        self.ids.append(int(p))
        self.coef = np.append(self.coef, coef)
        self.shift = np.append(self.shift, shift)

    def add(self, p: int, col: tuple[np.ndarray, np.ndarray], coef: float, shift: float, u: np.ndarray,
            gpp: float) -> None:
        k = self.k
        H = np.empty((k + 1, k + 1))
        H[:k, :k] = self.H
        H[:k, k] = u
        H[k, :k] = u
        H[k, k] = gpp
        self.H = H
        self.append(p, col, coef, shift)


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
        attach = max(_ATTACH, _ATTACH_STEP // len(self.parts))
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


def _propose(blk, state, mode):
    return state, _proposal(blk, state, mode)


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


# ---------------------------------------------------------------------------------------------------- graphs
def sample_graph(M: Matrix, W: Any = None, *, graph: str = "auto", n_neighbors: int = 4, weights: str = "binary",
                 t: float | None = None, n_anchors: int = 256, anchor_neighbors: int = 3, embed_dim: int = 64,
                 random_state: int = 0) -> Any:
    """``W`` as given (a sparse n x n affinity or an AnchorGraph), else the exact kNN graph of the rows of M
    (``graph="knn"``) or its anchor graph (``graph="anchor"``: a low-rank-plus-diagonal Laplacian for large
    n_samples; of the unstandardized rows when M is sparse, :func:`~dufs.engine.graphs.graph_rows`); ``"auto"``:
    kNN up to :data:`~dufs.engine.graphs.KNN_MAX_SAMPLES` samples, the anchor graph above."""
    n = M.shape[0]
    if W is not None:
        if not isinstance(W, AnchorGraph):
            W = sp.csr_array(W, dtype=np.float64)
        if W.shape != (n, n):
            raise ParameterError(f"W must be {n} x {n}; got {W.shape}")
        return W
    if resolve_graph(graph, n) == "anchor":  # sparse data: on the unstandardized rows (see graph_rows)
        return anchor_graph(graph_rows(M), n_anchors, anchor_neighbors, embed_dim=embed_dim,
                            random_state=random_state, keep_embedding=False)  # E unused: n x embed_dim floats
    return knn_graph(M, n_neighbors, weights=weights, t=t)


# ---------------------------------------------------------------------------------------------------- LapAOFS / LapDOFS
def lapofs(M: Matrix, *, n_features: int, criterion: str = "A", lambda1: float = 0.01, lambda2: float = 0.01,
           W: Any = None, graph: str = "auto", n_neighbors: int = 4, weights: str = "binary", t: float | None = None,
           n_anchors: int = 256, anchor_neighbors: int = 3, embed_dim: int = 64, random_state: int = 0,
           checkpoint: Any = "auto", checkpoint_every: int = 1, resume: bool = False) -> GreedyResult:
    """LapAOFS (``criterion="A"``) or LapDOFS (``"D"``) of He, Ji, Zhang, Bao (TPAMI 2011), sequential scheme:
    ``n_features`` features chosen one at a time in feature space (see the module docstring). The sample graph is
    ``W`` or built from ``graph``, ``n_neighbors``, ``weights`` ("binary" or "heat"), ``t`` (the paper: kNN with
    k = 4); L = D - W."""
    name = "lapaofs" if criterion == "A" else "lapdofs"
    check_params(LAPOFS_PARAMS, {"criterion": criterion, "lambda1": lambda1, "lambda2": lambda2, "graph": graph,
                                 "n_neighbors": n_neighbors, "weights": weights, "t": t, "n_anchors": n_anchors,
                                 "anchor_neighbors": anchor_neighbors, "embed_dim": embed_dim,
                                 "random_state": random_state, "checkpoint_every": checkpoint_every,
                                 "resume": resume}, name)
    lam1, lam2 = float(lambda1), float(lambda2)
    k = check_k(M, n_features)
    t0 = time.perf_counter()
    Wg = sample_graph(M, W, graph=graph, n_neighbors=n_neighbors, weights=weights, t=t, n_anchors=n_anchors,
                      anchor_neighbors=anchor_neighbors, embed_dim=embed_dim, random_state=random_state)
    graph_s = time.perf_counter() - t0
    L = laplacian_operator(Wg, normed=False)
    problem = {"method": name, "shape": list(M.shape), "nnz": int(M.nnz), "standardize": M.standardize,
               "lambda1": lam1, "lambda2": lam2, "graph": graph_key(Wg), "n_features": k}
    directory = checkpoint_dir(M, checkpoint, name, problem)
    if resume and directory is None:
        raise ParameterError(f"{name}(resume=True) needs a checkpoint directory (checkpoint=<directory>)")
    run = GreedyRun(M, k, A_OPTIMAL if criterion == "A" else D_OPTIMAL, lam1, lam2, L, Wg, None, directory,
               int(checkpoint_every), problem)
    res = run_greedy(run, resume, name)
    res.diagnostics.update(graph_time=graph_s, graph="anchor" if isinstance(Wg, AnchorGraph) else "knn")
    return res


def graph_key(W: Any) -> list:
    if isinstance(W, AnchorGraph):  # Zh's rows each sum to 1: its size, anchors and their weights name it
        return ["anchor", int(W.shape[0]), int(W.n_anchors), float(np.sum(W.lam)), float(np.sum(W.anchors))]
    return ["sparse", int(W.nnz), float(W.data.sum())]


def check_k(M: Matrix, n_features: Any) -> int:
    d = M.shape[1]
    if not isinstance(n_features, int | np.integer) or not 1 <= n_features <= d:
        raise ParameterError(f"The 'n_features' parameter must be an int in [1, {d}]; got {n_features!r}.")
    return int(n_features)
