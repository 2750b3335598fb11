"""UFCM's vectors over the features kept beside the blocks, one piece a worker process (docs/scaling.md, "UFCM's W
step beside the blocks").

On the driver an iteration brings Q = Zc^T U (d x c) back from the workers, solves the W step there (the largest
eigenvectors of Q diag(1/n_k) Q^T - beta D: a diagonal plus rank c, :mod:`dufs.methods.lowrank`) and sends W (d x
k) out for Y = Zc W: 8 (c + k) d bytes through the driver, O(d) of its CPU and memory an iteration, whatever the
number of machines. Here each worker that holds blocks keeps its features' rows of W (and of Q), and one task a
worker makes an iteration's feature side: its rows of Q from the labels (read from the worker that keeps them),
the D step, and the W step by the same secular equation, every sum over the features (c x c Gram matrices, the
bins' moments, M(t) where the moments do not reach, the eigenvectors' Gram matrices and residuals) all-reduced
among the tasks worker to worker (:func:`~dufs.engine.allreduce_sum`), the few rows the search needs whole (the
smallest diagonal values' rows) gathered by the same means. Every task then takes the same decisions from the same
bits; the driver gets the eigenvalues, G (k x c) and the objective's sums. A second call makes each piece's part of
Zc W, summed over the machines and left on the worker that keeps Y. The W step is the driver's up to the order of
additions over the features. Only for the default alpha = 1 (the W step without passes over the data); a W step
the secular equation cannot finish (a residual above rounding) is run on the driver from the pieces' Q, once."""

from __future__ import annotations

import uuid
from typing import Any

import numpy as np

from dufs._logging import get_logger
from dufs.engine import (
    AllSum,
    PerBlock,
    abort_exchange,
    current_client,
    ensure_plugin,
    partition_matvec,
    partition_rmatvec,
)
from dufs.kernels.affine import standardize_rows
from dufs.kernels.blockops import csc_column_stats, csc_label_sums
from dufs.methods.ufcm.scatter import Start
from dufs.methods.ufcm.secular import orth_pieces, top_lowrank_pieces

__all__ = ["FeatureSide", "NoPieces", "feature_pieces"]

log = get_logger(__name__)
_RESULT_CALLS = 8  # calls that bring the scores here, each from a group of the pieces


def feature_pieces(M: Any) -> tuple[list[list[int]], list[str]] | None:
    """The blocks in one piece a worker process that holds them, and those workers, where M's blocks are persisted
    on workers of a distributed client, each worker's blocks in one piece of its own (the pieces' tasks all-reduce
    among themselves, so each must run on its own worker at once); None otherwise, or where
    ``dufs.engine.side-pieces`` is off."""
    from dufs import config

    client = current_client()
    if client is None or M.residency.get("mode") != "persisted" or M.n_blocks < 2 or \
            str(config.get("engine.side-pieces")).lower() in ("off", "false", "no", "never"):
        return None
    where = M.placement()
    if any(a is None for a in where):
        return None
    parts: dict[str, list[int]] = {}
    for i, a in enumerate(where):
        parts.setdefault(a, []).append(i)
    if len(parts) < 2:
        return None
    peers = sorted(parts, key=lambda a: parts[a][0])
    return [parts[a] for a in peers], peers


class NoPieces(Exception):
    """W cannot be kept in pieces, one a worker (:class:`FeatureSide`): it stays on the driver."""


class FeatureSide:
    """W's rows (and Q's) kept in pieces beside the blocks (the module docstring): :meth:`iterate` runs an
    iteration's Q, D and W steps there, :meth:`y_held` makes Zc W for the worker that keeps Y, :meth:`result`
    brings W back once."""

    def __init__(self, M: Any, m: np.ndarray | str | None, W0: np.ndarray | Start, parts: list[list[int]],
                 peers: list[str]):
        """``W0``: W's start (d x k), or the PCA start's first block (:meth:`pca` then makes W); ``m``: the
        centring (None: none), or ``"means"``: the columns' means, made by each piece from its blocks."""
        self.M, self.parts, self.peers = M, parts, peers
        if isinstance(W0, Start):  # each block makes its rows of it
            self.k = W0.b
            bounds = M.bounds
            start = PerBlock([W0.block(int(bounds[i]), int(bounds[i + 1])) for i in range(M.n_blocks)])
        else:
            self.k = int(W0.shape[1])
            start = PerBlock(np.ascontiguousarray(W0, dtype=np.float64))
        self.client = current_client()
        ensure_plugin(self.client)
        mu, inv = M.transform
        rank = [0] * M.n_blocks
        for r, part in enumerate(parts):
            for i in part:
                rank[i] = r
        per = [None if v is None or isinstance(v, str) else PerBlock(np.asarray(v, dtype=np.float64))
               for v in (mu, inv, m)]
        _, self.state = M.map_blocks(_init, start, *per, PerBlock(rank), M.shape[0] if isinstance(m, str) else None,
                                     state=[None] * len(parts), partitions=parts)
        M.count_passes(-1)  # it sweeps no nonzeros
        # the pieces' tasks run where their state is kept, and all-reduce among those workers: the blocks may have
        # moved since ``peers`` was read from their placement (a task that needed one elsewhere, and the memory
        # manager dropping the first copy), so the workers are the state's, one a piece, or no pieces at all
        homes = [getattr(it, "address", None) for it in self.state.items]
        if None in homes or len(set(homes)) != len(homes):
            self.state.release()
            raise NoPieces(f"ufcm: W's pieces would share workers ({homes}); W stays on the driver")
        self.peers = homes
        self.fallbacks = 0

    def _call(self, fn: Any, *args: Any) -> Any:
        """``fn`` on every piece at once, its all-reduces under a fresh token (given up on the others where one
        fails, so that none waits); the results of the first piece (every piece returns the same)."""
        token = uuid.uuid4().hex
        try:
            got, self.state = self.M.map_blocks(fn, *args, token, self.peers, state=self.state,
                                                partitions=self.parts)
        except BaseException:
            abort_exchange(self.client, token, self.peers)
            raise
        self.M.count_passes(-1)
        return got[0]

    def pca(self, side: Any, k: int, p: float, max_iter: int, tol: float) -> dict:
        """The PCA start's block subspace iteration (:func:`~dufs.methods.ufcm.scatter._top_scatter`) with V's
        rows here, from the start given: T = Zc V summed where ``side`` (a
        :class:`~dufs.methods.ufcm.kept.KeptY`) keeps it, its Gram matrix's Rayleigh-Ritz step on the driver
        (b x b), then on every piece V R, S = Zc^T (T R) from T R's future, the residuals and the Cholesky QR of S
        all-reduced; W is then the first k columns. The driver holds nothing over the features. Returns W's
        l2,p penalty and centring rows, the operator products and whether it converged; raises
        :class:`NoPieces` (nothing changed on the driver) where S is not of full rank, as the driver's QR
        would then take over."""
        from dufs.methods.ufcm.scatter import pca_done, ritz

        b = self.k
        got = self._call(_pca_orth)
        products, converged = 0, False
        for _ in range(max_iter):
            if not got["ok"]:
                raise NoPieces("ufcm: the PCA start's block is not of full rank in pieces; made on the driver")
            mv = got["mV"], got["shift"]

            def held(mv: tuple = mv) -> tuple:
                return (self.y_held(), mv[1]), mv[0]

            G = side.again(lambda: side.gram(*held()))
            theta, R = ritz(G)
            TR, sums = side.again(lambda R=R: side.times(R), lambda: side.gram(*held()))
            got = self._call(_pca_step, TR, sums, R, theta, int(k), float(tol))
            self.M.count_passes(1)  # Zc^T (T R)
            products += b
            if pca_done(got["res"], theta, tol, products // b):
                converged = True
                break
        self.k = int(k)
        out = self._call(_pca_finish, int(k), float(p))
        out.update(products=products, converged=converged)
        return out

    def iterate(self, labels: Any, counts: np.ndarray, c: int, beta: float, p: float, eps: float) -> dict:
        """Steps 6 to 9 of an iteration on the features (Q from the labels' future, D from W, the W step): the W
        step's eigenvalues, G = W^T Q diag(1/n_k) (k x c), the l2,p penalty of the new W and its centring rows
        (m^T W, and centre diag(inv) W where the transform centres), the features active."""
        got = self._call(_iterate, labels, np.asarray(counts, dtype=np.float64), int(c), self.k, float(beta),
                         float(p), float(eps))
        if got["vals"] is None:  # the secular equation did not finish: the W step on the driver, once
            self.fallbacks += 1
            got = self._driver_w_step(got, beta)
        self.M.count_passes(1)  # Zc^T U
        return got

    def _driver_w_step(self, got: dict, beta: float) -> dict:
        from dufs.methods.ufcm.scatter import _w_step

        log.warning("ufcm: the W step in pieces did not finish; made on the driver from the pieces' Q")
        d, bounds = self.M.shape[1], self.M.bounds
        Q, Dd, W0, active = np.zeros((d, got["c"])), np.zeros(d), np.zeros((d, self.k)), np.zeros(d, dtype=bool)
        pieces, self.state = self.M.map_blocks(_gather, state=self.state, partitions=self.parts)
        for part, (q, dd, w, act) in zip(self.parts, pieces, strict=True):
            o = 0
            for i in part:
                a, b = bounds[i], bounds[i + 1]
                Q[a:b], Dd[a:b], W0[a:b], active[a:b] = q[o:o + b - a], dd[o:o + b - a], w[o:o + b - a], \
                    act[o:o + b - a]
                o += b - a

        class _Plain:  # the W step reads only the features' count from its operator (alpha = 1 makes no pass)
            pass

        op = _Plain()
        op.d = d
        vals, W, _ = _w_step(op, None, Q, np.ones(got["c"]), Dd, active, self.k, 1.0, beta, X0=W0, q_scaled=True)
        del Q, W0
        _, self.state = self.M.map_blocks(_set_w, PerBlock(W), state=self.state, partitions=self.parts)
        return self._call(_finish_w, np.asarray(vals, dtype=np.float64), float(got["p"]))

    def y_held(self) -> tuple:
        """(Zc W's sum over the pieces left where it was made (its future, or its pieces of rows on the machines
        where a reduce-scatter made it: a :class:`~dufs.engine.HeldPieces`), the transform's centring row or None),
        as :meth:`Matrix.matvec` with ``hold`` gives it."""
        got, self.state = self.M.map_blocks(_zc_w, self.M.shape[0], state=self.state, partitions=self.parts,
                                            reduce="sum", hold="pieces", rows_touched=True)
        return got

    def result(self) -> np.ndarray:
        """W (d x k), brought here once."""
        pieces, self.state = self.M.map_blocks(_result, state=self.state, partitions=self.parts)
        self.M.count_passes(-1)
        return self._assemble(pieces, np.empty((self.M.shape[1], self.k)))

    def scores(self) -> np.ndarray:
        """W's row norms (d), brought here once: the scores, from at most ``_RESULT_CALLS`` groups of pieces in
        turn, so that the pieces in flight here add at most 1 / ``_RESULT_CALLS`` of them to the result."""
        out = np.empty(self.M.shape[1])
        K = len(self.parts)
        per = -(-K // min(K, _RESULT_CALLS))
        for g in range(0, K, per):
            pieces, self.state = self.M.map_blocks(_row_norms, g, g + per, state=self.state, partitions=self.parts)
            self.M.count_passes(-1)
            self._assemble(pieces, out)
            del pieces
        return out

    def _assemble(self, pieces: list, out: np.ndarray) -> np.ndarray:
        """The pieces' rows placed at their blocks' features in ``out`` (a piece given as None: left alone)."""
        bounds = self.M.bounds
        for part, w in zip(self.parts, pieces, strict=True):
            if w is None:
                continue
            o = 0
            for i in part:
                a, b = bounds[i], bounds[i + 1]
                out[a:b] = w[o:o + b - a]
                o += b - a
        return out

    def release(self) -> None:
        self.state.release()


# ---------------------------------------------------------------------------------------------------- on a worker
def _cat(vs: list) -> np.ndarray | None:
    return None if vs[0] is None else np.ascontiguousarray(np.concatenate(vs), dtype=np.float64)


def _init(blks, st, W0, mu, inv, m, rank, n_rows):
    """A piece's state: its blocks' rows of W's start and of the transform and centring, its features' numbers.
    ``n_rows`` given (m None): m is its features' means, made here from its blocks (as the column statistics
    make them)."""
    gidx = np.concatenate([np.arange(b.start, b.stop, dtype=np.int64) for b in blks])
    if n_rows is not None:
        m = [np.nan_to_num(csc_column_stats(b.indptr, b.indices, b.data, n_rows)[0] / n_rows, nan=0.0)
             for b in blks]
    if isinstance(W0[0], Start):
        W0 = [s.rows(b.start, b.stop) for s, b in zip(W0, blks, strict=True)]
    st = {"W": _cat(W0), "mu": _cat(mu) if mu is not None else None, "inv": _cat(inv) if inv is not None else None,
          "m": _cat(m) if m is not None else None, "rank": int(rank[0]), "gidx": gidx,
          "widths": [b.stop - b.start for b in blks], "Q": None, "Dd": None, "active": None}
    return st, None


def _iterate(blks, st, labels, counts, c, k, beta, p, eps, token, peers):
    """On a piece, steps 6-9 of an iteration over its features (:meth:`FeatureSide.iterate`)."""
    allsum = AllSum(token, st["rank"], peers)
    W = st["W"]
    # step 7's product: Q = Zc^T U diag(1/sqrt(n_k)) on these features (as Matrix.label_rmatvec and _Centred make it)
    Q = st["Q"] if st["Q"] is not None and st["Q"].shape == (W.shape[0], c) else np.empty((W.shape[0], c))
    vsum = counts if st["mu"] is not None else None
    o = 0
    for b, w in zip(blks, st["widths"], strict=True):
        out = Q[o:o + w]
        csc_label_sums(b.indptr, b.indices, b.data, labels, out)
        mu = None if st["mu"] is None else st["mu"][o:o + w]
        inv = None if st["inv"] is None else st["inv"][o:o + w]
        standardize_rows(out, mu, vsum, inv)
        o += w
    if st["m"] is not None:
        standardize_rows(Q, st["m"], np.ascontiguousarray(counts), None)
    Q /= np.sqrt(counts)[None, :]
    st["Q"] = Q
    # step 6: D (eq. (7)) from W's rows; rows at zero stay there (unless no more than k are left)
    r = np.sqrt(np.einsum("ij,ij->i", W, W))
    active = r > eps
    if allsum([float(active.sum())])[0] <= k:
        active = np.ones(W.shape[0], dtype=bool)
    Dd = np.zeros(W.shape[0])
    Dd[active] = p / (2.0 * np.maximum(r[active], eps) ** (2.0 - p))
    st["Dd"], st["active"] = Dd, active
    idx = np.flatnonzero(active)
    Qa = Q if idx.size == Q.shape[0] else Q[idx]
    got = top_lowrank_pieces(Qa, beta * Dd[idx], st["gidx"][idx], k, allsum)
    if got is None:
        return st, {"vals": None, "c": c, "p": p}
    vals, V = got
    if idx.size == W.shape[0]:
        W[:] = V
    else:
        W.fill(0.0)
        W[idx] = V
    return st, _after_w(st, vals, p, allsum)


def _after_w(st: dict, vals: np.ndarray, p: float, allsum: AllSum) -> dict:
    """G, the penalty and the centring rows of the new W (all-reduced)."""
    W, Q = st["W"], st["Q"]
    r = np.sqrt(np.einsum("ij,ij->i", W, W))
    pen = float(np.sum(r[r > 0] ** p))
    k = W.shape[1]
    tot = allsum(np.concatenate([(W.T @ Q).ravel(), [pen], *_centring_parts(st, W)]))
    c = Q.shape[1]
    mW, shift = _centring_of(st, tot[k * c + 1:], k)
    return {"vals": vals, "WtQ": tot[:k * c].reshape(k, c), "penalty": float(tot[k * c]), "mW": mW,
            "shift": shift, "active": int(allsum([float(np.count_nonzero(st["active"]))])[0])}


def _centring_parts(st: dict, V: np.ndarray) -> list:
    """This piece's parts of V's centring rows (m^T V, zeros without m; then the transform's centre times
    diag(inv) V where it centres), to be all-reduced (:func:`_centring_of` reads their sum)."""
    parts = [np.zeros(V.shape[1]) if st["m"] is None else st["m"] @ V]
    if st["mu"] is not None:
        parts.append((st["mu"] * st["inv"]) @ V if st["inv"] is not None else st["mu"] @ V)
    return parts


def _centring_of(st: dict, tot: np.ndarray, b: int) -> tuple:
    """(m^T V, the transform's row) from the sum of :func:`_centring_parts`; None where absent."""
    return None if st["m"] is None else tot[:b], None if st["mu"] is None else tot[b:]


def _centring(st: dict, V: np.ndarray, allsum: AllSum) -> tuple:
    """V's centring rows, all-reduced (:func:`_centring_parts`)."""
    return _centring_of(st, allsum(np.concatenate(_centring_parts(st, V))), V.shape[1])


def _pca_orth(blks, st, token, peers):
    """The PCA start's first block made orthonormal over the pieces, and its centring rows."""
    allsum = AllSum(token, st["rank"], peers)
    V = orth_pieces(st["W"], allsum)
    if V is None:
        return st, {"ok": False}
    st["W"] = V
    mV, shift = _centring(st, V, allsum)
    return st, {"ok": True, "mV": mV, "shift": shift}


def _pca_step(blks, st, TR, sums, R, theta, k, tol, token, peers):
    """An iteration of the PCA start on a piece after the driver's Rayleigh-Ritz step: S = Zc^T (T R) on its
    features (as :meth:`_Centred.rmatvec_kept` makes it), V R, the residuals all-reduced, and where they do not
    all meet ``tol`` V = S made orthonormal over the pieces (:func:`_top_scatter`'s order)."""
    allsum = AllSum(token, st["rank"], peers)
    starts = np.concatenate([[0], np.cumsum(st["widths"])])
    tfs = [(None if st["mu"] is None else st["mu"][a:z], None if st["inv"] is None else st["inv"][a:z])
           for a, z in zip(starts[:-1], starts[1:], strict=True)]
    S = np.array(partition_rmatvec(blks, TR, sums if st["mu"] is not None else None, tfs))  # (a pooled buffer)
    if st["m"] is not None:
        standardize_rows(S, st["m"], np.ascontiguousarray(sums, dtype=np.float64), None)
    V = st["W"] @ R  # the Ritz vectors
    Rk = S[:, :k] - theta[None, :k] * V[:, :k]
    res = np.sqrt(allsum(np.einsum("ij,ij->j", Rk, Rk)))
    top = max(abs(theta[0]), np.finfo(float).tiny)
    if np.all(res <= tol * top):
        st["W"] = V
        return st, {"res": res, "ok": True}
    del V
    V = orth_pieces(S, allsum)
    if V is None:
        return st, {"res": res, "ok": False}
    st["W"] = V
    mV, shift = _centring(st, V, allsum)
    return st, {"res": res, "ok": True, "mV": mV, "shift": shift}


def _pca_finish(blks, st, k, p, token, peers):
    """W = the PCA start's first k columns; its l2,p penalty and centring rows."""
    allsum = AllSum(token, st["rank"], peers)
    W = st["W"] = np.ascontiguousarray(st["W"][:, :k])
    r = np.sqrt(np.einsum("ij,ij->i", W, W))
    tot = allsum(np.concatenate([[float(np.sum(r[r > 0] ** p))], *_centring_parts(st, W)]))
    mW, shift = _centring_of(st, tot[1:], k)
    return st, {"penalty": float(tot[0]), "mW": mW, "shift": shift}


def _finish_w(blks, st, vals, p, token, peers):
    return st, _after_w(st, vals, p, AllSum(token, st["rank"], peers))


def _gather(blks, st):
    return st, (st["Q"], st["Dd"], st["W"], st["active"])


def _set_w(blks, st, W):
    st["W"][:] = np.concatenate(W)
    return st, None


def _result(blks, st):
    return st, st["W"]


def _row_norms(blks, st, lo, hi):
    """W's row norms on the pieces of ranks ``lo`` to ``hi`` (the others: None)."""
    if not lo <= st["rank"] < hi:
        return st, None
    W = st["W"]
    return st, np.sqrt(np.einsum("ij,ij->i", W, W))


def _zc_w(blks, st, n):
    """This piece's X diag(inv) W (n x k), as a partition's part of :meth:`Matrix.matvec` makes it (its rows of W
    scaled by inv, the blocks in a run a thread, the runs added by the fixed tree)."""
    W, inv = st["W"], st["inv"]
    starts = np.concatenate([[0], np.cumsum(st["widths"])])
    Ws = [W[a:b] if inv is None else W[a:b] * inv[a:b, None] for a, b in zip(starts[:-1], starts[1:], strict=True)]
    return st, partition_matvec(blks, Ws, n)
