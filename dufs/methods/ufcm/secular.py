"""The W step's secular solve over W's pieces beside the blocks (:mod:`dufs.methods.ufcm.features`):
:func:`dufs.methods.lowrank._top_lowrank` of a diagonal plus low rank whose rows are spread over the pieces, every
sum over the rows all-reduced among them and the few rows the search needs whole gathered, so that every piece
takes the same decisions from the same bits."""

from __future__ import annotations

from typing import Any

import numpy as np

from dufs.engine import AllSum
from dufs.methods.lowrank import (
    _DEFLATE_MAX,
    _MODEL_ROWS,
    _Secular,
    _secular_m_and_slope,
    _secular_roots,
    _SecularMoments,
    moment_sums,
)

__all__ = ["orth_pieces", "top_lowrank_pieces"]


def orth_pieces(S: np.ndarray, allsum: AllSum) -> np.ndarray | None:
    """:func:`~dufs.methods.lowrank._orth` of the rows of S over every piece (Cholesky QR twice, the Gram matrix
    all-reduced); None where it is not positive definite."""
    for _ in range(2):
        G = allsum(S.T @ S)
        try:
            Lc = np.linalg.cholesky(0.5 * (G + G.T))
        except np.linalg.LinAlgError:
            return None
        S = S @ np.linalg.inv(Lc).T
    return S


class _Beyond(Exception):
    """The search asked for a diagonal value past the smallest ones gathered: the W step goes to the driver."""


class _Head:
    """The smallest diagonal values over every piece, ascending (as ``np.sort(D)`` over them all would begin), the
    number of values in all, and counts below a value past them made by an all-reduce."""

    def __init__(self, local: np.ndarray, head: int, allsum: AllSum):
        self.local = np.sort(local)
        self.allsum = allsum
        self.size = int(allsum([float(local.size)])[0])
        mine = self.local[:head]
        self.vals = np.sort(allsum.gather(mine[:, None])[:, 0])[:head]

    def __getitem__(self, i: int) -> float:
        if i < self.vals.size:
            return float(self.vals[i])
        raise _Beyond(f"diagonal value {i} of {self.size}")

    def below(self, x: float) -> int:
        """#{D_i < x} over every piece."""
        if self.vals.size == self.size or (self.vals.size and x <= self.vals[-1]):
            return int(np.searchsorted(self.vals, x, side="left"))
        return int(self.allsum([float(np.searchsorted(self.local, x, side="left"))])[0])

    def holds(self, x: float) -> bool:
        """Whether some D_i == x."""
        if self.vals.size == self.size or (self.vals.size and x <= self.vals[-1]):
            i = int(np.searchsorted(self.vals, x, side="left"))
            return i < self.vals.size and self.vals[i] == x
        i = int(np.searchsorted(self.local, x, side="left"))
        return self.allsum([float(i < self.local.size and self.local[i] == x)])[0] > 0


class _PieceSecular(_Secular):
    """:class:`dufs.methods.lowrank._Secular` over a piece's rows, every sum all-reduced among the pieces."""

    def __init__(self, Ql: np.ndarray, Dl: np.ndarray, B: np.ndarray, kk: int, scale: float, dmax: float,
                 allsum: AllSum):
        self.Ql, self.Dl, self.B, self.c, self.allsum = Ql, Dl, B, B.shape[1], allsum
        nn = kk + 1 + _MODEL_ROWS
        self.asc = _Head(Dl, nn + 64, allsum)
        self.cache: dict[float, tuple[np.ndarray, np.ndarray]] = {}
        d_k, floor = self.asc[kk - 1], 1e-9 * scale
        top = dmax - d_k if self.asc.size else 0.0
        ex = np.flatnonzero(Dl - d_k <= floor)
        E = allsum.gather(np.hstack([Dl[ex, None], Ql[ex] @ B]))
        packed, count = moment_sums(Ql, Dl, d_k, floor, top)
        tot = allsum(np.concatenate([packed.ravel(), count.astype(np.float64)]))
        packed = tot[:packed.size].reshape(packed.shape)
        count = np.rint(tot[packed.size:]).astype(np.int64)
        self.moments = _SecularMoments.from_sums(E[:, 1:], E[:, 0], packed, count, Ql.shape[1], B, d_k, floor, top)
        # the rows of the smallest diagonal values over every piece, in the basis B (the model's exact terms)
        nn = min(self.asc.size, nn)
        near = np.argsort(Dl, kind="stable")[:nn]
        N = allsum.gather(np.hstack([Dl[near, None], Ql[near] @ B]))
        N = N[np.argsort(N[:, 0], kind="stable")[:nn]]
        self.QnB, self.Dn = np.ascontiguousarray(N[:, 1:]), N[:, 0].copy()

    def poles(self, t: float) -> int:
        return self.asc.below(-t)

    def on_pole(self, t: float) -> bool:
        return self.asc.holds(-t)

    def m_at(self, t: float) -> tuple[np.ndarray, np.ndarray]:
        got = self.cache.get(t)
        if got is None:
            got = self.moments.at(t)
            if got is None:
                Mt, Pt = _secular_m_and_slope(self.Ql, self.Dl, t)
                both = self.allsum(np.stack([Mt, Pt]))
                got = (self.B.T @ both[0] @ self.B, self.B.T @ both[1] @ self.B)
            self.cache[t] = got
        return got


def _deflate_pieces(Qa: np.ndarray, Da: np.ndarray, gidx: np.ndarray, head: int, allsum: AllSum) -> list:
    """:func:`dufs.methods.lowrank._deflate` over the pieces: the groups of equal diagonal values among the
    ``head`` smallest of all, deflated in place on the rows this piece holds. Returns [(the group's features, U,
    this piece's rows of it as they were, their positions here)]."""
    local = Da if Da.size <= head else Da[Da <= np.partition(Da, head - 1)[head - 1]]
    sel = np.flatnonzero(Da <= (local.max() if local.size else -np.inf))
    C = allsum.gather(np.hstack([Da[sel, None], gidx[sel, None].astype(np.float64), Qa[sel]]))
    if C.shape[0] > head:
        C = C[C[:, 0] <= np.partition(C[:, 0], head - 1)[head - 1]]
    C = C[np.argsort(C[:, 1], kind="stable")]  # by feature: the driver's order of the rows
    vals, inv, counts = np.unique(C[:, 0], return_inverse=True, return_counts=True)
    out = []
    for g in np.flatnonzero((counts > 1) & (counts <= _DEFLATE_MAX)):
        rows = np.flatnonzero(inv == g)
        G = C[rows, 2:]
        U, sv, Wt = np.linalg.svd(G, full_matrices=True)
        r = int(np.sum(sv > 1e-13 * max(float(sv[0]) if sv.size else 0.0, np.finfo(float).tiny)))
        if r >= rows.shape[0]:
            continue
        new = np.zeros_like(G)
        new[:r] = sv[:r, None] * Wt[:r]
        feats = C[rows, 1].astype(np.int64)
        here = np.searchsorted(gidx, feats)
        mine = (here < gidx.size) & (gidx[np.minimum(here, gidx.size - 1)] == feats)
        pos = here[mine]
        old = Qa[pos].copy()
        Qa[pos] = new[mine]
        out.append((feats, U, old, pos, mine))
    return out


def top_lowrank_pieces(Qa: np.ndarray, Da: np.ndarray, gidx: np.ndarray, k: int, allsum: AllSum
                       ) -> tuple[np.ndarray, np.ndarray] | None:
    """:func:`dufs.methods.lowrank._top_lowrank` of the rows of Qa and Da over every piece (this piece's rows,
    features ``gidx`` ascending): the largest ``k`` eigenvalues of Qa Qa^T - diag(Da) over all of them and this
    piece's rows of their eigenvectors; None (on every piece alike) where the driver's solver is needed."""
    m = int(allsum([float(Qa.shape[0])])[0])
    c = Qa.shape[1]
    groups = _deflate_pieces(Qa, Da, gidx, k + c + 1, allsum) if m > k else []
    try:
        got = _top_deflated(Qa, Da, gidx, k, m, allsum)
    except _Beyond:
        got = None
    finally:
        for _, _, old, pos, _ in groups:
            Qa[pos] = old
    if got is not None:
        V = got[1]
        for feats, U, _, pos, mine in groups:  # v[rows] = U v[rows], the group's rows over every piece
            rows = np.zeros((feats.size, V.shape[1]))
            rows[mine] = V[pos]
            rows = allsum(rows)
            V[pos] = (U @ rows)[mine]
    return got


def _top_deflated(Qa: np.ndarray, Da: np.ndarray, gidx: np.ndarray, k: int, m: int, allsum: AllSum
                  ) -> tuple[np.ndarray, np.ndarray] | None:
    """:func:`dufs.methods.lowrank._top_lowrank_deflated` over the pieces (m rows in all)."""
    c = Qa.shape[1]
    if m <= k:
        return None
    zero = ~np.any(Qa != 0.0, axis=1)
    live = np.flatnonzero(~zero)
    Ql, Dl = (Qa, Da) if live.size == Qa.shape[0] else (Qa[live], Da[live])
    n_live = int(allsum([float(live.size)])[0])
    g_ev, B = np.linalg.eigh(allsum(Ql.T @ Ql)) if n_live else (np.zeros(c), np.eye(c))
    top = float(g_ev[-1]) if n_live else 0.0
    B = B[:, g_ev > 1e-13 * c * top] if top > 0.0 else B
    dmax = allsum.max(float(Da.max()) if Da.size else -np.inf)
    scale = max(top, dmax, np.finfo(float).tiny)
    cand_vals: list[float] = []
    cand_ys: list[Any] = []
    if n_live and top > 0.0:
        sec = _PieceSecular(Ql, Dl, B, min(k, n_live), scale, allsum.max(float(Dl.max()) if Dl.size else -np.inf),
                            allsum)
        cand_vals, cand_ys = _secular_roots(sec, min(k, n_live), top, scale)
    # the rows exactly zero: eigenvectors e_i (eigenvalue -D_i), the k smallest D_i over every piece
    zi = np.flatnonzero(zero)
    zi = zi[np.argsort(Da[zi], kind="stable")[:k]]
    Z = allsum.gather(np.column_stack([Da[zi], gidx[zi].astype(np.float64)]))
    Z = Z[np.lexsort((Z[:, 1], Z[:, 0]))][:k]
    for dz, f in Z:
        cand_vals.append(-float(dz))
        cand_ys.append(int(f))
    if len(cand_vals) < k:
        return None
    order = np.argsort(-np.asarray(cand_vals), kind="stable")[:k]
    vals = np.asarray(cand_vals)[order]
    V = np.zeros((Qa.shape[0], k))
    cols = [j for j, i in enumerate(order) if not isinstance(cand_ys[i], int)]
    if cols:
        Yk = np.column_stack([cand_ys[order[j]] for j in cols])
        V[np.ix_(live, cols)] = (Ql @ Yk) / (vals[cols][None, :] + Dl[:, None])
    for j, i in enumerate(order):
        if isinstance(cand_ys[i], int):
            at = np.searchsorted(gidx, cand_ys[i])
            if at < gidx.size and gidx[at] == cand_ys[i]:
                V[at, j] = 1.0
    V = orth_pieces(V, allsum)  # orthonormal: Cholesky QR twice, the Gram matrix all-reduced
    if V is None:
        return None
    QtV = allsum(Qa.T @ V)
    R = Qa @ QtV - (Da[:, None] + vals[None, :]) * V
    res = np.sqrt(allsum(np.einsum("ij,ij->j", R, R)))
    if not np.all(np.isfinite(res)) or np.any(res > 1e-8 * scale):
        return None
    return vals, V

