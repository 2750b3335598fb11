"""A partition's side of a greedy step, where its blocks live: its candidates' numbers (s_g and v_g or ||E_g||^2),
their update by the step's pass, its proposal, and its checkpoint files."""

from __future__ import annotations

import contextlib
import os
from typing import Any

import numpy as np
import scipy.sparse as sp

from dufs.engine import Matrix, current_client
from dufs.errors import ParameterError
from dufs.kernels.blockops import csc_rmatvec
from dufs.kernels.greedy import (
    D_OPTIMAL,
    JCFS,
    best,
    greedy_update,
    xwx_anchor,
    xwx_graph,
)
from dufs.methods.solver import atomic_write
from dufs.scheduling import each_in_threads, task_threads

_TINY = 1e-10  # a candidate whose Schur complement fell below this fraction of its start is in the selected span


# ---------------------------------------------------------------------------------------------------- blocks
# a proposal carries its column when it has at most ATTACH nonzeros, the winner's heavier one fetched alone
# (kddb-like data have columns of millions of nonzeros: every block shipping its best one cost a pass), except a
# partition's best, which carries its column up to ATTACH_STEP nonzeros shared
ATTACH = 1 << 15
ATTACH_STEP = 1 << 25


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


def _init(blk, state, n, coef, shift, lam2, lam1, W, d, lam_inv, Y, Ysum, mode, selected, attach=None):
    s, v = _diag_terms(blk, n, coef, shift, lam2, lam1, W, d, lam_inv, Y, Ysum, mode)
    sel = np.zeros(blk.width, dtype=np.bool_)
    if selected is not None and len(selected):
        loc = np.asarray(selected, dtype=np.int64) - blk.start
        sel[loc[(loc >= 0) & (loc < blk.width)]] = True
    # the transform stays beside the block: a step sends only p, V and three numbers
    st = {"s": s, "v": v, "sel": sel, "tiny": _TINY * np.maximum(s, 1e-300), "step": 0,
          **_block_transform(coef, shift)}
    return st, _proposal(blk, st, mode, attach=attach)


def _block_transform(coef: np.ndarray, shift: np.ndarray) -> dict:
    """A block's transform for its state: None for both where it is the identity (coef 1, shift 0: the kernel then
    reads neither, :func:`~dufs.kernels.greedy.greedy_update`)."""
    if not np.any(shift) and np.all(coef == 1.0):
        return {"coef": None, "shift": None}
    return {"coef": np.ascontiguousarray(coef, dtype=np.float64),
            "shift": np.ascontiguousarray(shift, dtype=np.float64)}


# LapAOFS's and LapDOFS's step vectors (V = [B r, B Z_S d], or [B r]) go to the workers in float32 (the products
# accumulate in float64) once they are larger than this in float64: a step's kernel gathers V's row at every
# nonzero, from random rows, and n x 2 float64 outgrows a server's last-level cache at n ~ 1M (docs/methods.md,
# "LapAOFS and LapDOFS"); at kddb size it halves what a step ships. Not JCFS:
# a candidate in the selected span has both its numbers at rounding level and their ratio is its score
_STEP_F32_BYTES = 1 << 23


def _step_dtype(mode: int, shape: tuple) -> Any:
    """The dtype a step's vectors go to the blocks in (:data:`_STEP_F32_BYTES`)."""
    return np.float32 if mode != JCFS and 8 * int(np.prod(shape)) > _STEP_F32_BYTES else np.float64


def _proposal(blk, st, mode, found=None, attach=None):
    """The block's best (feature, score, its column where it has at most ``attach`` nonzeros (None: ATTACH), else
    None)."""
    attach = ATTACH if attach is None else attach
    j, sc = best(mode, st["s"], st["v"], st["sel"], st["tiny"]) if found is None else found
    if j < 0:
        return (-1, -np.inf, None)
    a, c = blk.indptr[j], blk.indptr[j + 1]
    return (blk.start + int(j), float(sc), _column(blk, j) if c - a <= attach else None)



def _column(blk, j: int) -> tuple[np.ndarray, np.ndarray]:
    """Column j (block-local) of a block: its rows and values (in the data's dtype), copied."""
    a, c = blk.indptr[j], blk.indptr[j + 1]
    return blk.indices[a:c].copy(), blk.data[a:c].copy()


def _swapped(mode: int) -> tuple[str, ...]:
    """The state a step changes: (s, v, sel); LapDOFS's steps leave v (zeros) as it is."""
    return ("s", "sel") if mode == D_OPTIMAL else ("s", "v", "sel")


def _step(blk, state, p, V, vsum, s_p, c2, mode, save, attach=None):
    """Mark p selected (if it is this block's), update every candidate along V, propose the block's best.

    The step writes into the state's spare arrays (the kernel reads the current s and v and writes the updated ones
    there, in the same sweep that picks the best) and the current ones become the new state's spares: the state
    it was given stays as it was (a task may run again), and no array is allocated (a fresh array's pages fault in
    again every step: 25 bytes a feature)."""
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
    return st, _proposal(blk, st, mode, found, attach)


def _save_block(directory: str, start: int, st: dict, mode: int) -> None:
    """The block's candidates after step ``st["step"]``: (s, sel, and v but for LapDOFS, whose v stays 0) a step,
    the thresholds ``tiny`` (fixed at the start) once a run, in their own file (saved with every step, they were a
    third of what a step wrote: docs/measurements.md, "Greedy steps")."""
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


def _in_partition(blks, states, fn, per_block, best_attach, *args, **kw):
    """``fn(block, state, *args)`` over the blocks of one partition, one task, the blocks side by side on the
    worker's threads (each block's work its own: the same results on any number): ``states`` and the arguments at
    the positions ``per_block`` (PerBlock) are lists with one item per block. Returns (states, proposals), as
    lists; the partition's best proposal carries its column when it has at most ``best_attach`` nonzeros (``kw``:
    ``fn``'s)."""
    states = [None] * len(blks) if states is None else states

    def one(i):
        return fn(blks[i], states[i], *(a[i] if j in per_block else a for j, a in enumerate(args)), **kw)

    outs = each_in_threads(one, len(blks), task_threads())
    new = [o[0] for o in outs]
    props = [o[1] for o in outs]
    got = [(q[1], -q[0], i) for i, q in enumerate(props) if isinstance(q, tuple) and q[0] >= 0 and np.isfinite(q[1])]
    if got and best_attach:
        i = max(got)[2]  # the best score, then the lower index (as the driver chooses)
        blk, (p, sc, col) = blks[i], props[i]
        j = p - blk.start
        if col is None and blk.indptr[j + 1] - blk.indptr[j] <= best_attach:
            props[i] = (p, sc, _column(blk, j))
    return new, props


def _partitions(M: Matrix) -> list[list[int]] | None:
    """The feature blocks cut into one partition per worker process, each on the worker holding its blocks
    (:meth:`Matrix.partition`; a worker of several threads runs its partition's blocks side by side,
    :func:`_in_partition`), when a distributed client runs the steps and there are more blocks than worker threads;
    None (one task a block) otherwise. A step then costs a few tasks a worker, not a few a block: at kddb's
    thousands of blocks the scheduler's per-task cost, paid every step, outweighed the step's own work; a machine
    of one worker process of many threads costs a few tasks a step."""
    client = current_client()
    if client is None or M.n_blocks <= 1:
        return None
    try:
        nthreads = client.nthreads()
    except Exception:  # a client that cannot say: one task a block, as before
        return None
    if not nthreads or sum(nthreads.values()) >= M.n_blocks:
        return None
    return M.partition(len(nthreads))


def _propose(blk, state, mode, attach=None):
    return state, _proposal(blk, state, mode, attach=attach)
