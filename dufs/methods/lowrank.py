"""The algebraically largest eigenvectors of a diagonal-plus-low-rank matrix A = Q diag(w) Q^T - diag(D) (d x d,
never formed), by its secular equation: c x c eigenproblems and sweeps over Q's rows, no pass over the data; and
the dense case (``numpy.linalg.eigh``). UFCM's W step with alpha = 1 is such a problem (docs/methods.md, "UFCM")."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from dufs.kernels.clusters import bin_moments
from dufs.scheduling import results_in_threads


def _top_dense(A: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    vals, vecs = np.linalg.eigh(A)
    return vals[::-1][:k], vecs[:, ::-1][:, :k]


# rows of Q per slab while M(lambda) is summed: temporaries of 8 c x 16K bytes stay in cache, a sweep faster than
# in larger slabs (docs/measurements.md, "Low-rank eigenproblems")
_SECULAR_CHUNK = 1 << 14
_MODEL_ROWS = 32  # rows beyond the k + 1 smallest diagonal values whose terms the root model keeps exact


def _slabs(Q: np.ndarray) -> Any:
    return (Q[a:a + _SECULAR_CHUNK] for a in range(0, Q.shape[0], _SECULAR_CHUNK))


# row ranges of the W step's sweeps over Q (d x c), computed side by side in this process's threads while the
# workers wait: a fixed number, so the order of every sum (and the result) does not depend on the cores
_PIECES = 4


def _over_pieces(fn: Any, m: int) -> list:
    """``[fn(a, b), ...]`` over up to ``_PIECES`` contiguous row ranges [a, b) of m rows (cut at multiples of
    ``_SECULAR_CHUNK``, so each range's slabs are the serial sweep's), computed in threads (:func:`_in_threads`)."""
    slabs = -(-m // _SECULAR_CHUNK)
    k = max(1, min(_PIECES, slabs))
    cuts = [min(m, (slabs * i // k) * _SECULAR_CHUNK) for i in range(k + 1)]
    return list(results_in_threads([functools.partial(fn, cuts[i], cuts[i + 1]) for i in range(k)]))


def _gram(Q: np.ndarray) -> np.ndarray:
    """Q^T Q of a tall Q, in slabs over the row pieces (:func:`_over_pieces`)."""
    def part(a: int, b: int) -> np.ndarray:
        return sum((q.T @ q for q in _slabs(Q[a:b])), np.zeros((Q.shape[1], Q.shape[1])))
    return sum(_over_pieces(part, Q.shape[0]), np.zeros((Q.shape[1], Q.shape[1])))


def _secular_m_and_slope(Qa: np.ndarray, Da: np.ndarray, lam: float) -> tuple[np.ndarray, np.ndarray]:
    """M(lambda) and P(lambda) = Qa^T diag(1 / (lambda + Da)^2) Qa = -dM/dlambda, from one sweep over Qa."""
    c = Qa.shape[1]
    M, P = np.zeros((c, c)), np.zeros((c, c))
    for a in range(0, Qa.shape[0], _SECULAR_CHUNK):
        q = Qa[a:a + _SECULAR_CHUNK]
        r = q / (lam + Da[a:a + _SECULAR_CHUNK])[:, None]
        M += r.T @ q
        P += r.T @ r
    return 0.5 * (M + M.T), 0.5 * (P + P.T)


# M(t) from moments: rows of Q binned geometrically by their distance D_i - D_(k) to the k-th smallest diagonal
# value (bins of this ratio), each bin's terms a Taylor series in D_i - D_b of this many terms around its centre:
# for every t the roots are searched at (t >= -D_(k)) the series' ratio is at most sqrt(1.02) - 1 < 0.01, so the
# terms left out are below 0.01^9 (1e-18) of the row's own: rounding rules. Finer bins, fewer terms: built in one
# sweep, faster than coarser bins of more terms built by GEMMs a bin (docs/measurements.md, "Low-rank eigenproblems")
_BIN_RATIO = 1.02
_BIN_TERMS = 9


def _bin_centres(floor: float, top: float) -> np.ndarray:
    """D_b - D_(k) of :class:`_SecularMoments`' bins: their geometric centres from ``floor`` up to ``top``."""
    lr = np.log(_BIN_RATIO)
    n_bins = int(np.floor(np.log(top / floor) / lr)) + 1 if top > floor else 0
    return floor * np.exp(lr * (np.arange(n_bins) + 0.5))


def moment_sums(Q: np.ndarray, D: np.ndarray, d_k: float, floor: float, top: float) -> tuple[np.ndarray, np.ndarray]:
    """The bins' packed moments and row counts of :class:`_SecularMoments` over the rows (``Q``, ``D``) given: one
    sweep (in threads, :func:`_over_pieces`); sums, so that pieces of the rows add theirs (``top``: the largest D
    less d_k over all the rows, which sets the bins)."""
    centre = _bin_centres(floor, top)
    Qc, Dc = np.ascontiguousarray(Q), np.ascontiguousarray(D, dtype=np.float64)
    lr = np.log(_BIN_RATIO)
    parts = _over_pieces(lambda a, b: bin_moments(Qc[a:b], Dc[a:b], d_k, floor, lr, d_k + centre, _BIN_TERMS),
                         Q.shape[0])
    if not parts:
        c = Q.shape[1]
        return np.zeros((centre.size, _BIN_TERMS, c * (c + 1) // 2)), np.zeros(centre.size, dtype=np.int64)
    packed, count = parts[0]
    for more, n_more in parts[1:]:
        packed += more
        count += n_more
    return packed, count


class _SecularMoments:
    """M(t) = B^T Q^T (t I + D)^-1 Q B and P(t) = -dM/dt for any t >= -D_(k), without a sweep over Q: the rows
    with D_i within ``floor`` of D_(k) exact (a handful), every other row through its bin's moments
    sum_i q_i q_i^T (D_i - D_b)^j, j < _BIN_TERMS, made in one sweep over Q (:func:`bin_moments`): then
    1 / (t + D_i) = sum_j (-(D_i - D_b))^j / (t + D_b)^(j+1), a series whose ratio |D_i - D_b| / (t + D_b) is at most
    sqrt(_BIN_RATIO) - 1 for every such t. An evaluation costs (bins x terms) c x c additions: the secular solve's
    30-odd sweeps over Q became one (docs/measurements.md, "Low-rank eigenproblems")."""

    def __init__(self, Q: np.ndarray, D: np.ndarray, B: np.ndarray, d_k: float, floor: float):
        ex = np.flatnonzero(D - d_k <= floor)  # a few rows (no temporary over all of them beyond this test)
        top = float(D.max()) - d_k if D.size else 0.0
        packed, count = moment_sums(Q, D, d_k, floor, top)
        self._assemble(Q[ex] @ B, D[ex], packed, count, Q.shape[1], B, d_k, floor, top)

    @classmethod
    def from_sums(cls, XE: np.ndarray, DE: np.ndarray, packed: np.ndarray, count: np.ndarray, c: int,
                  B: np.ndarray, d_k: float, floor: float, top: float) -> _SecularMoments:
        """The moments from their sums over pieces of the rows (:func:`moment_sums` of each, added; ``XE``, ``DE``
        every piece's exact rows in the basis B; ``top`` the largest D less d_k over all of them)."""
        self = cls.__new__(cls)
        self._assemble(XE, DE, packed, count, c, B, d_k, floor, top)
        return self

    def _assemble(self, XE: np.ndarray, DE: np.ndarray, packed: np.ndarray, count: np.ndarray, c: int,
                  B: np.ndarray, d_k: float, floor: float, top: float) -> None:
        self.XE, self.DE = XE, DE
        centre = _bin_centres(floor, top)
        keep = np.flatnonzero(count)
        iu = np.triu_indices(c)
        full = np.zeros((keep.shape[0], _BIN_TERMS, c, c))
        full[:, :, iu[0], iu[1]] = packed[keep]
        full[:, :, iu[1], iu[0]] = packed[keep]
        r = B.shape[1]
        # in the basis B, each bin's terms one (terms x r^2) row block: an M(t) is then one matrix-vector product
        self.mom = (B.T @ full @ B).reshape(keep.shape[0] * _BIN_TERMS, r * r)
        self.r = r
        self.half = centre[keep] * (np.sqrt(_BIN_RATIO) - 1.0)  # |D_i - D_b| at most
        self.Db = d_k + centre[keep]
        self.sign = (-1.0) ** np.arange(_BIN_TERMS)

    def at(self, t: float) -> tuple[np.ndarray, np.ndarray] | None:
        """(M(t), P(t)) in the basis B; None where t is below the range the series hold in."""
        s = t + self.Db
        if s.size and not np.all(self.half <= 0.05 * s):
            return None
        inv = 1.0 / s
        pw = inv[:, None] ** np.arange(1, _BIN_TERMS + 1)[None, :]  # 1 / (t + D_b)^(j+1)
        cm = self.sign[None, :] * pw
        cp = cm * inv[:, None] * np.arange(1, _BIN_TERMS + 1)[None, :]
        re = self.XE / (t + self.DE)[:, None]
        M = self.XE.T @ re + (cm.ravel() @ self.mom).reshape(self.r, self.r)
        P = re.T @ re + (cp.ravel() @ self.mom).reshape(self.r, self.r)
        return 0.5 * (M + M.T), 0.5 * (P + P.T)


def _model_root(mod: Any, i: int, lo: float, hi: float, tol: float) -> float | None:
    """The s in (lo, hi) where the (i+1)-th largest eigenvalue of ``mod(s)`` crosses 1 (it decreases in s there),
    by Illinois' false position on c x c eigenproblems; None when the model does not change sign in the bracket."""

    def g(s: float) -> float:
        return float(np.linalg.eigvalsh(mod(s))[::-1][i]) - 1.0

    a, b = lo, hi  # points evaluated or chosen off the diagonal's values, never on a pole
    ga, gb = g(a), g(b)
    if not ga > 0.0 > gb:
        return None
    side = 0
    for _ in range(100):
        x = a + (b - a) * ga / (ga - gb)
        if not a < x < b:
            x = 0.5 * (a + b)
        gx = g(x)
        if gx > 0.0:
            a, ga = x, gx
            if side == 1:
                gb *= 0.5
            side = 1
        else:
            b, gb = x, gx
            if side == -1:
                ga *= 0.5
            side = -1
        if b - a <= tol or gx == 0.0:
            break
    x = 0.5 * (a + b)
    return x if lo < x < hi else None


def _secular_root(m_at: Any, i: int, lo: float, hi: float, eps: float, pole: float | None = None,
                  above: float | None = None, model: Any = None) -> float:
    """The t in [lo, hi] where the (i+1)-th largest eigenvalue mu_i(t) of M(t) crosses 1, with no diagonal value
    -Dl inside the bracket (mu_i(lo) >= 1 > mu_i(hi)): safeguarded Newton, a bisection step whenever Newton's
    leaves the bracket. Each step is one sweep over Ql. The step solves a one-pole model mu(s) = b + a / (s - p)
    through the point's value and slope (p the nearer of ``pole`` and ``above``: exact for one pole's term plus a
    constant, and close to lambda / t far above every pole), else Newton's step on 1/mu_i(t) - 1 where mu_i > 0 or
    on mu_i(t) - 1: one to three steps a root, where Newton on mu_i alone took four or five and Brent's method ten
    or more. The slope comes from the same sweep: mu_i'(t) = -y^T P(t) y
    for its unit eigenvector y (Hellmann-Feynman). ``m_at(t)``: (M(t), P(t)) (:func:`_secular_m_and_slope`,
    cached by the caller). Newton starts at ``hi`` (the previous, larger root, whose M is cached, or the bound
    above them all). ``pole``: the nearest diagonal value -Dl below the bracket (None: none): where Newton's step
    leaves the bracket, the bracket is split at the geometric mean of its ends' distances to it, which takes a
    bracket spanning orders of magnitude (a root close to a pole, the bound far above) down in a few steps where
    halving it takes tens; ``above``: the nearest one above (None: none). The t returned is the last t evaluated,
    within ``eps`` of the root and within 1e-12 of its distance to the nearest pole (down to t's own rounding): the
    eigenvector (t I + D)^-1 Q y of a root close to a pole moves with t.

    ``model(t)`` (a root between two diagonal values, ``pole`` and ``above`` both given): a function of s that
    models M(s) from the sweep at t, the terms of the few rows with the smallest diagonal values exact and the
    rest's to first order (their poles are far from the bracket). The next t is then the model's own root in the
    bracket (bisection on c x c eigenproblems, no sweep): a root among the poles is bent by several of them at
    once, where the one-pole step converged linearly (8 sweeps for a root 2e-7 below a pole on a bench W step)."""
    t = hi
    glo = ghi = None  # mu - 1 at the bracket's ends, once evaluated there (Illinois' false position)
    side = 0
    for _ in range(200):
        M, P = m_at(t)
        w, Y = np.linalg.eigh(M)
        mu = float(w[-1 - i])
        g = mu - 1.0
        if g >= 0.0:
            lo, glo = t, g
            if side == 1 and ghi is not None:
                ghi *= 0.5  # the same end kept twice: halve the other's weight (Illinois)
            side = 1
        else:
            hi, ghi = t, g
            if side == -1 and glo is not None:
                glo *= 0.5
            side = -1
        # the tolerance on t: ``eps``, and within 1e-12 of the distance to the nearest pole (the eigenvector
        # (t I + D)^-1 Q y moves with t in proportion to 1 / that distance), down to t's own rounding
        gap = min(t - pole if pole is not None else np.inf, above - t if above is not None else np.inf)
        tol_t = max(min(eps, 1e-12 * gap), 4.0 * np.finfo(float).eps * abs(t))
        # and mu_i - 1 at the rounding level of M(t)'s eigenvalues (about eps ||M(t)||): no step can do better
        noise = 16.0 * np.finfo(float).eps * max(abs(float(w[0])), abs(float(w[-1])), 1.0)
        if abs(g) <= noise or hi - lo <= tol_t:
            break
        y = Y[:, -1 - i]
        slope = -float(y @ P @ y)
        nxt = None
        if model is not None and pole is not None and above is not None:
            nxt = _model_root(model(t), i, lo, hi, tol_t)
        if slope < 0.0 and nxt is None:
            # the model mu(s) = b + a / (s - p) through (t, mu, slope), p the nearer pole: exact for one pole's term
            # plus a constant, and for lambda / t far above them all
            for p in sorted((q for q in (pole, above) if q is not None), key=lambda q: abs(t - q)):
                a = -slope * (t - p) ** 2
                b = mu - a / (t - p)
                if b != 1.0 and lo < p + a / (1.0 - b) < hi:
                    nxt = p + a / (1.0 - b)
                    break
            if nxt is None:  # Newton on mu - 1, or on 1/mu - 1 (the same step scaled by mu) where mu > 0
                nxt = t - g / slope * (mu if mu > 0.0 else 1.0)
        if nxt is None or not lo < nxt < hi:
            if glo is not None and ghi is not None and glo > 0.0 > ghi:
                # false position between the ends (Illinois): superlinear where mu_i has a kink (two eigenvalues of
                # M(t) crossing near the root), where Newton's steps leave the bracket and halving took 30 sweeps
                nxt = lo + (hi - lo) * glo / (glo - ghi)
            else:
                geometric = pole is not None and lo > pole
                nxt = pole + float(np.sqrt((lo - pole) * (hi - pole))) if geometric else 0.5 * (lo + hi)
            if not lo < nxt < hi:
                nxt = 0.5 * (lo + hi)
        if abs(nxt - t) <= tol_t:
            break  # keep the t evaluated (its M gives the eigenvector)
        t = nxt
    return t


_DEFLATE_MAX = 4096  # rows of one group of equal diagonal values that the secular solve deflates (more: none)


def _deflate(Qa: np.ndarray, Da: np.ndarray, head: int) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Groups of rows with equal diagonal values among the ``head`` smallest, deflated in place: a group's rows G
    (g x c, rank r) become U^T G = [Sigma W^T; 0] (G = U Sigma W^T), r rows that carry its part of M(t) and g - r
    rows exactly zero, whose eigenvectors (e_i, eigenvalue -D of the group) need no root. Without this a pole of
    multiplicity g > r (duplicated features have equal rows of Q and of D: six at the smallest D of a kddb-size W
    step) is an eigenvalue the secular equation does not have: its search converged onto the pole and the residual
    check failed, and the fallback, LOBPCG over all features, ran out of memory. Returns [(rows, U, the rows as they
    were)]: :func:`_top_lowrank` restores Qa and rotates its eigenvectors back (v[rows] = U v[rows])."""
    if Da.size <= head:
        cand = np.arange(Da.size)
    else:
        cand = np.flatnonzero(Da <= np.partition(Da, head - 1)[head - 1])
    vals, inv, counts = np.unique(Da[cand], return_inverse=True, return_counts=True)
    out = []
    for g in np.flatnonzero((counts > 1) & (counts <= _DEFLATE_MAX)):
        rows = cand[inv == g]
        G = Qa[rows]  # a copy (fancy indexing): the rows as they were
        U, sv, Wt = np.linalg.svd(G, full_matrices=True)
        r = int(np.sum(sv > 1e-13 * max(float(sv[0]) if sv.size else 0.0, np.finfo(float).tiny)))
        if r >= rows.shape[0]:
            continue
        Qa[rows] = 0.0
        Qa[rows[:r]] = sv[:r, None] * Wt[:r]
        out.append((rows, U, G))
    return out


def _top_lowrank(Qa: np.ndarray, Da: np.ndarray, k: int, use_moments: bool = True
                 ) -> tuple[np.ndarray, np.ndarray] | None:
    """:func:`_top_lowrank_deflated` with the groups of equal diagonal values deflated first (:func:`_deflate`);
    ``Qa`` is as it was on return."""
    groups = _deflate(Qa, Da, k + Qa.shape[1] + 1) if Qa.shape[0] > k else []
    try:
        got = _top_lowrank_deflated(Qa, Da, k, use_moments)
    finally:
        for rows, _, G in groups:
            Qa[rows] = G
    if got is not None:
        for rows, U, _ in groups:
            got[1][rows] = U @ got[1][rows]
    return got


def _top_lowrank_deflated(Qa: np.ndarray, Da: np.ndarray, k: int, use_moments: bool = True
                          ) -> tuple[np.ndarray, np.ndarray] | None:
    """The largest ``k`` eigenpairs of A = Qa Qa^T - diag(Da) (Qa m x c, Da >= 0) without an eigensolver over m.

    A diagonal plus a rank-c matrix: with M(t) = Qa^T (t I + diag(Da))^-1 Qa (c x c), Sylvester's law of inertia
    on the block matrix [[-diag(Da) - t I, Qa], [Qa^T, -I]] gives the number of eigenvalues of A above t as
    #{i: -Da_i > t} + #{eigenvalues of M(t) above 1}, for any t off the diagonal's values. The j-th eigenvalue is
    where that count drops below j, searched between the j-th largest -Da_i (A >= -diag(Da)) and the (j-1)-th
    eigenvalue (or -min(Da) + ||Qa||_2^2 for the first), each step a c x c eigenproblem and one sweep over Qa:
    first a point just above every -Da_i (M(t) positive definite there: when the root is above it, no diagonal
    value is inside the bracket), else bisection over the diagonal values inside (halving their number, not the
    interval), then :func:`_secular_root` on that mu once none is left inside. Its eigenvector is
    (t I + diag(Da))^-1 Qa y, y the eigenvector of M(t) for the eigenvalue 1 (the secular equation). Rows of Qa that
    are exactly zero are eigenvectors e_i (eigenvalue -Da_i) and are set apart first. Returns None when a residual
    ||A v - t v|| is not at rounding level (the caller uses an iterative solver then)."""
    m, c = Qa.shape
    if m <= k:
        return None
    zero = ~np.any(Qa != 0.0, axis=1)
    live = np.flatnonzero(~zero)
    Ql, Dl = (Qa, Da) if live.size == m else (Qa[live], Da[live])  # no copy when every row takes part
    # Q^T Q's eigenvectors B of non-negligible eigenvalues span the rows of Q (its rank is c - 1 when the data are
    # centred: Q 1 = Zc^T 1 = 0). M(t) is B (B^T M(t) B) B^T: the secular functions below are the r x r matrices
    # B^T M(t) B, without the zero eigenvalue M(t) keeps at every t (among the poles it sits between the
    # eigenvalues that cross 1, and Newton's method on the i-th would follow it)
    g_ev, B = np.linalg.eigh(_gram(Ql)) if live.size else (np.zeros(c), np.eye(c))
    top = float(g_ev[-1]) if live.size else 0.0  # ||Qa||_2^2
    B = B[:, g_ev > 1e-13 * c * top] if top > 0.0 else B
    scale = max(top, float(Da.max()), np.finfo(float).tiny)
    cand_vals: list[float] = []
    cand_ys: list[Any] = []  # each root's y (its eigenvector is (t I + D)^-1 Q y), or the row i of an e_i
    if live.size and top > 0.0:
        sec = _Secular(Ql, Dl, B, min(k, live.size), scale, use_moments)
        cand_vals, cand_ys = _secular_roots(sec, min(k, live.size), top, scale)
    for i in np.flatnonzero(zero)[np.argsort(Da[zero])][:k]:
        cand_vals.append(-float(Da[i]))
        cand_ys.append(int(i))
    if len(cand_vals) < k:
        return None
    vals, V = _eigenvectors(Ql, Dl, live, m, k, cand_vals, cand_ys)
    QtV = Qa.T @ V
    res = _column_norms(m, k, lambda sl: Qa[sl] @ QtV - (Da[sl, None] + vals[None, :]) * V[sl])  # ||A v - t v||
    if not np.all(np.isfinite(res)) or np.any(res > 1e-8 * scale):
        return None
    return vals, V


class _Secular:
    """The secular functions of :func:`_top_lowrank_deflated` over the rows of Q that take part (``Ql``, ``Dl``),
    in the basis ``B`` of Q's row space: M(t) = B^T Q^T (t I + diag(D))^-1 Q B and its minus derivative P(t) (from
    the moments, :class:`_SecularMoments`, or a sweep over Q), the number of eigenvalues above t, and the model of
    :func:`_secular_root`, exact in the rows of the diagonal values nearest the ``kk`` roots."""

    def __init__(self, Ql: np.ndarray, Dl: np.ndarray, B: np.ndarray, kk: int, scale: float, use_moments: bool):
        self.Ql, self.Dl, self.B, self.c = Ql, Dl, B, B.shape[1]
        self.asc = np.sort(Dl)  # D ascending: -D_i > t iff D_i < -t
        # each M(t) is a sweep over Ql (d x c: 80 MB at a million features), the eigenproblems c x c: every t
        # evaluated is kept (c x c each), since the roots' brackets and searches meet the same points again
        self.cache: dict[float, tuple[np.ndarray, np.ndarray]] = {}
        self.moments = _SecularMoments(Ql, Dl, B, float(self.asc[kk - 1]), 1e-9 * scale) if use_moments else None
        # the rows of the smallest diagonal values (the poles nearest the roots among them), ascending, in the
        # basis B: their terms of M(t) exact in the model of _secular_root, the rest's to first order
        nn = min(Dl.size, kk + 1 + _MODEL_ROWS)
        near = np.argpartition(Dl, nn - 1)[:nn] if nn < Dl.size else np.arange(Dl.size)
        self.QnB, self.Dn = Ql[near] @ B, Dl[near]

    def poles(self, t: float) -> int:
        return int(np.searchsorted(self.asc, -t, side="left"))  # #{-D_i > t}

    def on_pole(self, t: float) -> bool:
        i = int(np.searchsorted(self.asc, -t, side="left"))
        return i < self.asc.size and self.asc[i] == -t

    def m_at(self, t: float) -> tuple[np.ndarray, np.ndarray]:
        got = self.cache.get(t)
        if got is None:
            got = self.moments.at(t) if self.moments is not None else None
            if got is None:
                Mt, Pt = _secular_m_and_slope(self.Ql, self.Dl, t)
                got = (self.B.T @ Mt @ self.B, self.B.T @ Pt @ self.B)
            self.cache[t] = got
        return got

    def mus(self, t: float) -> np.ndarray:
        return np.linalg.eigvalsh(self.m_at(t)[0])[::-1]

    def count(self, t: float) -> int:
        return self.poles(t) + int(np.sum(self.mus(t) > 1.0))

    def near_terms(self, t: float) -> tuple[np.ndarray, np.ndarray]:
        r = self.QnB / (t + self.Dn)[:, None]
        return r.T @ self.QnB, r.T @ r

    def model(self, t0: float) -> Any:
        M0, P0 = self.m_at(t0)
        Mn, Pn = self.near_terms(t0)
        Mf, Pf = M0 - Mn, P0 - Pn

        def at(s: float) -> np.ndarray:
            return Mf - (s - t0) * Pf + self.near_terms(s)[0]
        return at


def _secular_roots(sec: _Secular, kk: int, top: float, scale: float) -> tuple[list[float], list[Any]]:
    """The ``kk`` largest eigenvalues t of A (``top`` = ||Q||_2^2 bounds the first), each searched between the j-th
    largest -D_i and the (j-1)-th eigenvalue (:func:`_root`), with the vector y (its eigenvector is
    (t I + D)^-1 Q y): the eigenvector of M(t) for the eigenvalue 1."""
    asc, c = sec.asc, sec.c
    cand_vals: list[float] = []
    cand_ys: list[Any] = []
    hi0 = -float(asc[0]) + top * (1.0 + 1e-9) + scale * 1e-12
    eps = 4.0 * np.finfo(float).eps * scale
    above = -float(asc[0]) + scale * 1e-12  # just above every pole: where M(t) is positive definite
    for j in range(1, kk + 1):
        lo, hi = -float(asc[j - 1]) - scale * 1e-12, hi0  # count(lo) >= j > count(hi)
        prev = cand_vals[-1] if cand_vals else None
        if prev is not None and prev < hi:
            hi = prev  # the j-th eigenvalue is at most the (j-1)-th (M(prev) is cached)
        if lo < above < hi and sec.count(above) >= j:
            lo = above  # no pole inside: one sweep (the same t for every root), no bisection over the poles
        t = _root(sec, j, lo, hi, prev, eps)
        w, Y = np.linalg.eigh(sec.m_at(t)[0])
        # a repeated eigenvalue: the next eigenvector of M(t) near 1 not taken yet
        same = sum(1 for v in cand_vals if abs(v - t) <= 1e3 * eps)
        order = np.argsort(np.abs(w - 1.0))
        cand_vals.append(t)
        cand_ys.append(sec.B @ Y[:, order[min(same, c - 1)]])
    return cand_vals, cand_ys


def _root(sec: _Secular, j: int, lo: float, hi: float, prev: float | None, eps: float) -> float:
    """The j-th eigenvalue in [lo, hi] (count(lo) >= j > count(hi); ``prev`` the (j-1)-th): bisection over the
    diagonal values inside the bracket (:func:`_split`) until none is left, then :func:`_secular_root` on the mu
    that crosses 1 there."""
    asc, c = sec.asc, sec.c
    t = None
    while True:
        P = sec.poles(hi)
        inside = sec.poles(lo) - P - (1 if sec.on_pole(lo) else 0)  # diagonal values strictly inside (lo, hi)
        if inside <= 0 and 1 <= j - P <= c:
            # no diagonal value inside: the root is where the (j - P)-th mu crosses 1, a continuous
            # decreasing function here, so Newton's method (safeguarded) finishes it in a few steps
            i = j - P - 1
            glo, ghi = float(sec.mus(lo)[i]) - 1.0, float(sec.mus(hi)[i]) - 1.0
            if hi == prev and ghi >= 0.0:
                t = prev  # count(prev) >= j: a repeated eigenvalue (to rounding)
                break
            if glo >= 0.0 > ghi:
                pole = -float(asc[P]) if P < asc.size else None  # the nearest diagonal values below
                up = -float(asc[P - 1]) if P >= 1 else None  # and above
                t = _secular_root(sec.m_at, i, lo, hi, eps, pole, up, sec.model) if glo > 0.0 else lo
                break
        # a bracket narrower than eps ends the search only with no diagonal value inside: a root closer to a pole
        # than eps (eps is relative to the largest of D, which may be 1e8 times the smallest) is isolated from it
        # first, then found by _secular_root to within its distance to the pole (a root 1e-9 from one was left at
        # the bracket's end, 3e-8 away, its residual 8 times the bound: the W step went to LOBPCG)
        if hi - lo <= eps and inside <= 0 or hi - lo <= 4.0 * np.finfo(float).eps * max(abs(lo), abs(hi)):
            break
        mid, hi = _split(sec, j, lo, hi, P, inside)
        if mid in (lo, hi):
            break
        if sec.on_pole(mid) or sec.count(mid) >= j:
            lo = mid
        else:
            hi = mid
    if t is None:
        t = lo if lo in sec.cache else hi if hi in sec.cache else 0.5 * (lo + hi)
    return t


def _split(sec: _Secular, j: int, lo: float, hi: float, P: int, inside: int) -> tuple[float, float]:
    """The next point of :func:`_root`'s bisection of (lo, hi), with ``inside`` diagonal values strictly inside
    (``P`` above it), and the bracket's upper end (lowered where a point tried on the way is above the root)."""
    asc = sec.asc
    if inside >= 2:
        # split the diagonal values inside in half: mid between the middle one and the next below it
        a_ = P + (inside - 1) // 2
        mid = 0.5 * (-float(asc[a_]) - float(asc[a_ + 1]))
        if not lo < mid < hi or sec.on_pole(mid):
            mid = 0.5 * (lo + hi)
    elif inside == 1:
        # one value -D inside: which side of it is the root? a point close above it first (the root
        # above it: a bracket without poles), then one close below; a root closer to the pole than that
        # brings both in by the same factor
        q = -float(asc[P])
        mid = q + 1e-3 * (hi - q)
        if not lo < mid < hi or sec.on_pole(mid):
            mid = 0.5 * (lo + hi)
        elif sec.count(mid) < j:
            hi = mid
            mid = q - 1e-3 * (q - lo)
            if not lo < mid < hi or sec.on_pole(mid):
                mid = 0.5 * (lo + hi)
    else:
        mid = 0.5 * (lo + hi)
    return mid, hi


def _eigenvectors(Ql: np.ndarray, Dl: np.ndarray, live: np.ndarray, m: int, k: int, cand_vals: list[float],
                  cand_ys: list[Any]) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` largest of the eigenvalues found and their eigenvectors, orthonormal: (t I + D)^-1 Q y of a root
    (on the rows ``live``), e_i of a zero row i."""
    order = np.argsort(-np.asarray(cand_vals), kind="stable")[:k]
    vals = np.asarray(cand_vals)[order]
    cols = [j for j, i in enumerate(order) if not isinstance(cand_ys[i], int)]
    whole = len(cols) == k and live.size == m
    V = np.empty((m, k)) if whole else np.zeros((m, k))  # every row written below when whole
    if cols:  # every root's eigenvector in one sweep over Ql (one product with its c x k y's), not one a root
        Yk = np.column_stack([cand_ys[order[j]] for j in cols])
        tk = vals[cols]

        def vectors(lo: int, hi: int) -> None:
            for a in range(lo, hi, _SECULAR_CHUNK):
                sl = slice(a, min(a + _SECULAR_CHUNK, hi))
                blk = (Ql[sl] @ Yk) / (tk[None, :] + Dl[sl, None])
                if whole:
                    V[sl] = blk
                else:
                    V[live[sl][:, None], cols] = blk
        _over_pieces(vectors, live.size)
    for j, i in enumerate(order):
        if isinstance(cand_ys[i], int):
            V[cand_ys[i], j] = 1.0
    return vals, _orth(V, inplace=True)  # orthonormal (already so, up to rounding, for distinct eigenvalues)


def _orth(S: np.ndarray, *, inplace: bool = False) -> np.ndarray:
    """An orthonormal basis of the columns of a tall S (d x b), by Cholesky QR twice: one b x b Gram and one d x b
    array at a time (LAPACK's QR of a 30M x 6 array holds four copies of it); ``inplace``: S itself is overwritten,
    slab by slab, and no d x b array is made (unless the Gram is not numerically positive definite: then
    ``numpy.linalg.qr``, as without ``inplace``)."""
    Q = S
    for _ in range(2):
        G = _gram(Q) if inplace else Q.T @ Q
        try:
            Lc = np.linalg.cholesky(0.5 * (G + G.T))
        except np.linalg.LinAlgError:
            return np.linalg.qr(S)[0]
        T = np.linalg.inv(Lc).T
        if inplace:
            def apply(lo: int, hi: int, Q: np.ndarray = Q, T: np.ndarray = T) -> None:
                for a in range(lo, hi, _SECULAR_CHUNK):
                    Q[a:min(a + _SECULAR_CHUNK, hi)] = Q[a:min(a + _SECULAR_CHUNK, hi)] @ T
            _over_pieces(apply, Q.shape[0])
        else:
            Q = Q @ T
    return Q


def _column_norms(m: int, k: int, rows: Any) -> np.ndarray:
    """The norms of the k columns of an m x k matrix given by ``rows(slice)`` (its rows in that slice), made and
    summed in row slabs side by side in threads (:func:`_over_pieces`): no m x k temporary, every row read once."""
    def part(lo: int, hi: int) -> np.ndarray:
        r2 = np.zeros(k)
        for a in range(lo, hi, _SECULAR_CHUNK):
            R = rows(slice(a, min(a + _SECULAR_CHUNK, hi)))
            r2 += np.einsum("ij,ij->j", R, R)
        return r2
    return np.sqrt(sum(_over_pieces(part, m), np.zeros(k)))


def _residual_norms(S: np.ndarray, V: np.ndarray, theta: np.ndarray, k: int) -> np.ndarray:
    """||S[:, j] - theta_j V[:, j]|| for the first k columns of the d x b arrays S and V (:func:`_column_norms`;
    column by column, each norm read a column of a C-order array, a cache line for 8 bytes, a large share of an
    iteration of the PCA start: docs/measurements.md, "Low-rank eigenproblems")."""
    return _column_norms(S.shape[0], k, lambda sl: S[sl, :k] - theta[None, :k] * V[sl, :k])
