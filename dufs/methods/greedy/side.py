"""A greedy selection's work over the samples: the selected columns, their k x k system and the n-vectors a step
makes from them (:class:`Side`), here or kept on one worker (:mod:`dufs.engine.kept`), where the workers are on
several machines: the driver then handles a few numbers a step, and the step's vectors go from that worker to the
machines of the blocks without crossing the driver's link."""

from __future__ import annotations

from typing import Any

import numpy as np

from dufs.engine import AnchorGraph
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
from dufs.methods.greedy.columns import SelectedColumns, _in_threads, _row_shares
from dufs.methods.greedy.partition import _step_dtype

__all__ = ["Side", "make_side", "side_call"]


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


class Side:
    """The selected set S (its columns and H = G_SS, :class:`SelectedColumns`), Z_S^T Y (JCFS), A_S = Zh^T Z_S
    (LapAOFS/LapDOFS on an anchor graph) and the objective's running sum; :meth:`take` adds a feature and makes the
    vectors of its update pass. ``L`` is the graph's Laplacian (a kNN graph) and ``W`` the anchor graph (its
    products run here: Zh whole), ``wd`` = 1 + lambda1 d for the anchor graph."""

    def __init__(self, n: int, mode: int, lam1: float, lam2: float, L: Any, W: Any, Y: Any, dtype: Any,
                 wd: np.ndarray | None, li: np.ndarray | None, ysq: float | None = None):
        self.n, self.mode, self.lam1, self.lam2, self.L, self.W, self.Y = n, mode, lam1, lam2, L, W, Y
        self.sel = SelectedColumns(n, lam2, dtype)
        self.criterion: list[float] = []
        self.objective: list[float] = []
        self.trace_obj = 0.0  # Tr(H^-1) (A) or log det H (D)
        self.RS = np.zeros((0, 0 if Y is None else Y.shape[1]))  # Z_S^T Y (JCFS)
        # LapAOFS/LapDOFS on an anchor graph: A_S = Zh^T Z_S (k x n_anchors), 1 + lambda1 d and Lambda^-1
        # (:meth:`_take_anchor`)
        self.AS: np.ndarray | None = None
        if isinstance(W, AnchorGraph) and lam1 and mode != JCFS:
            self.AS = np.zeros((0, W.n_anchors))
            self.wd, self.li = wd, li
        # Y is float64, or float32 at kddb size (n x c, see jcfs._anchor_embedding): its sums are taken once, in
        # float64, and products with it never make a float64 copy of it
        self.Ysum = None if Y is None else col_sums(Y)
        # ||Y||^2 over every sample (``ysq``: given, where this side holds a piece of the rows)
        self.Ysq = ysq if ysq is not None else 0.0 if Y is None else float(sum(np.dot(Y[:, j], Y[:, j].astype(
            np.float64)) for j in range(Y.shape[1])))
        self._ybuf: np.ndarray | None = None  # :meth:`_scratch`
        # n-vectors kept between steps, zero but at the rows they hold now (:func:`sparse_z`, :meth:`_at_rows`)
        self._bufs: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self._pending: tuple | None = None  # what :meth:`partials` leaves for :meth:`finish`
        self._saved: tuple | None = None  # the side a replay set aside (:meth:`replay_partials`)

    def B(self, v: np.ndarray) -> np.ndarray:
        if not self.lam1:
            return v
        return v + self.lam1 * np.asarray(self.L @ v)

    def take(self, p: int, col: tuple, coef: float, shift: float) -> tuple[np.ndarray, float, float]:
        """Add p (its column ``col``, its transform ``coef``, ``shift``) to S: record its criterion and the
        objective; return (V, s_p, c2) for the update pass (V has one column for LapDOFS, two otherwise). Two
        phases: :meth:`partials`, the step's sums over the samples, then :meth:`finish` from those sums, so that
        sides that each hold a piece of the rows can add their partials between the two (with one side, its own)."""
        return self.finish(self.partials(p, col, coef, shift))

    def partials(self, p: int, col: tuple, coef: float, shift: float) -> np.ndarray:
        """The first phase of :meth:`take`: the sums over this side's samples that the step needs, in one float64
        array (Z_S^T B z_p, z_p^T B z_p, and Zh^T z_p on an anchor graph or Z_p^T Y for JCFS); what the second
        phase reuses is kept until :meth:`finish`."""
        if self.AS is not None:
            return self._anchor_partials(p, col, coef, shift)
        z = _dense_z(self.n, col, coef, shift)
        Bz = self.B(z)
        u = self.sel.tapply(Bz)
        extra = _ztY(self.Y, col, coef, shift, self.Ysum) if self.mode == JCFS else np.zeros(0)
        self._pending = (p, col, coef, shift, z, Bz)
        return np.concatenate([u, [float(z @ Bz)], extra])

    def finish(self, sums: np.ndarray) -> tuple[np.ndarray, float, float]:
        """The second phase of :meth:`take`, from ``sums``: :meth:`partials`' sums over every sample."""
        if self.AS is not None:
            return self._anchor_finish(sums)
        S = self.sel
        p, col, coef, shift, z, Bz = self._pending
        self._pending = None
        k = S.k
        u, gpp = sums[:k], float(sums[k]) + self.lam2
        c = S.solve(u)
        s_p = gpp - float(u @ c)
        if self.mode == JCFS:
            Rp = sums[k + 1:]
            Ep = Rp - c @ self.RS
            e2 = float(Ep @ Ep)
            self.criterion.append(e2 / (self.lam2 * s_p))
            # for the next pass: r = z_p - Z_S c, q = Y E_p - Z_S H^-1 R_S E_p (one product with Z_S for both)
            P = S.apply(np.column_stack([c, S.solve(self.RS @ Ep)]))
            YE = self.Y @ Ep.astype(self.Y.dtype)
            V = np.column_stack([z - P[:, 0], YE - P[:, 1]])
            S.add(p, col, coef, shift, u, gpp)
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
        return self._record(p, col, coef, shift, u, gpp, c, s_p, V)

    def _record(self, p: int, col: tuple, coef: float, shift: float, u: np.ndarray, gpp: float, c: np.ndarray,
                s_p: float, V: np.ndarray) -> tuple[np.ndarray, float, float]:
        """LapAOFS's or LapDOFS's criterion and objective for the chosen p; p added to S."""
        v_p = float(c @ c)
        if self.mode == A_OPTIMAL:
            self.criterion.append(1.0 - self.lam2 * (1.0 + v_p) / s_p)
            self.trace_obj += (1.0 + v_p) / s_p
        else:
            self.criterion.append(s_p / self.lam2 - 1.0)
            self.trace_obj += float(np.log(s_p))
        self.objective.append(self.trace_obj)
        self.sel.add(p, col, coef, shift, u, gpp)
        return V, s_p, v_p + 1.0

    def _anchor_partials(self, p: int, col: tuple, coef: float, shift: float) -> np.ndarray:
        """:meth:`partials` for LapAOFS and LapDOFS on an anchor graph W = Zh Lambda^-1 Zh^T, with A_S = Zh^T Z_S
        (k x n_anchors, one row added a step) kept here: B y = (1 + lambda1 d) y - lambda1 Zh Lambda^-1 Zh^T y, and
        every y a step applies B to (z_p, Z_S c, Z_S d) has Zh^T y = a_p, A_S c or A_S d with a_p = Zh^T z_p. So
        a step makes one product Zh^T z_p and one Zh P (P: n_anchors x 1 or 2), where B z_p, then B of the other
        columns, made two of each. Where z_p = coef x_p is sparse (no shift) the products with it read its rows
        only, and z_p is an n-vector kept between steps, zero but at its rows (:func:`sparse_z`). The sums: the
        diagonal part's Z_S^T (1 + lambda1 d) z_p and z_p^T (1 + lambda1 d) z_p, and a_p."""
        S, n, W = self.sel, self.n, self.W
        Zh = W.Zh if W.products_here else None  # Zh here: its products here, row by row
        if not shift:
            rows = np.asarray(col[0])
            z, last = self._bufs.get("z", (None, rows[:0]))
            if z is None:
                z = np.zeros(n)
            wzr = np.empty(rows.shape[0])  # B's diagonal part of z_p, at its rows
            zbz = sparse_z(rows, np.asarray(col[1]), float(coef), self.wd, last, z, wzr)
            self._bufs["z"] = (z, rows)
            wz = self._at_rows("wz", rows, wzr) if S.slots < S.k else None  # for the columns outside the mask
            zbs = S.tapply_rows(rows, wzr, wz)
        else:
            z = _dense_z(n, col, coef, shift)
            wz = self.wd * z
            zbz = float(z @ wz)
            zbs = S.tapply(wz)
        if Zh is not None and not shift:  # Zh^T z from x's rows of Zh alone, a share of them a thread
            rows, vals = np.asarray(col[0]), np.asarray(col[1])
            cut = _row_shares(rows.shape[0])
            A = np.empty((len(cut) - 1, W.n_anchors))
            _in_threads(lambda a, b: [anchor_zt_column(Zh.indptr, Zh.indices, Zh.data, rows[cut[i]:cut[i + 1]],
                                                       vals[cut[i]:cut[i + 1]], float(coef), A[i])
                                      for i in range(a, b)], len(cut) - 1)
            a_p = A.sum(axis=0)
        else:
            a_p = np.asarray(W.zt(z), dtype=np.float64).ravel()
        self._pending = (p, col, coef, shift, z)
        return np.concatenate([zbs, [zbz], a_p])

    def _anchor_finish(self, sums: np.ndarray) -> tuple[np.ndarray, float, float]:
        """:meth:`finish` on an anchor graph (:meth:`_anchor_partials`)."""
        S, n, W, lam1, li = self.sel, self.n, self.W, self.lam1, self.li
        p, col, coef, shift, z = self._pending
        self._pending = None
        k = S.k
        zbs, zbz, a_p = sums[:k], float(sums[k]), sums[k + 1:]
        Zh = W.Zh if W.products_here else None
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
        return self._record(p, col, coef, shift, u, gpp, c, s_p, V)

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
        return self.replay_finish(self.replay_partials(t))

    def replay_partials(self, t: int) -> np.ndarray:
        """The first phase of :meth:`vectors_at`: step t's sums over this side's samples, the side set back to its
        first t features until :meth:`replay_finish`."""
        full = self.sel
        self._saved = (self.sel, self.criterion, self.objective, self.trace_obj, self.RS, self.AS)
        self.sel, self.criterion, self.objective, self.RS = full.head(t), [], [], self.RS[:t]
        self.AS = None if self.AS is None else self.AS[:t]
        try:
            return self.partials(full.ids[t], full.col(t), float(full.coef[t]), float(full.shift[t]))
        except BaseException:
            self._restore()
            raise

    def replay_finish(self, sums: np.ndarray) -> tuple[np.ndarray, float, float]:
        """The second phase of :meth:`vectors_at`, from the sums over every sample; the side as it was after."""
        try:
            return self.finish(sums)
        finally:
            self._restore()

    def _restore(self) -> None:
        self.sel, self.criterion, self.objective, self.trace_obj, self.RS, self.AS = self._saved
        self._saved = None


# ---------------------------------------------------------------------------------------------------- kept on a worker
def make_side(n: int, mode: int, lam1: float, lam2: float, L: Any, zh: Any, anchors: Any, lam: Any, Y: Any,
              dtype: Any, wd: Any, li: Any, ysq: float | None = None) -> tuple:
    """A :class:`Side` made on a worker (``kept_call``; kept there): the anchor graph from its Zh (``zh``: whole,
    or a piece's rows with ``n`` of them, ``ysq`` then ||Y||^2 over every sample)."""
    W = None if zh is None else AnchorGraph(zh, anchors, None, lam)
    return None, [Side(n, mode, lam1, lam2, L, W, Y, dtype, wd, li, ysq)]


def side_call(side: Side, what: str, *args: Any) -> tuple:
    """On the worker that keeps ``side``: ``take`` (a step: V kept, its column sums, s_p, c2, the criterion and the
    objective back) or ``vectors_at`` (a replay: the same without the criterion)."""
    if what == "take":
        V, s_p, c2 = side.take(*args)
        small = (s_p, c2, side.criterion[-1], side.objective[-1])
    elif what == "vectors_at":
        V, s_p, c2 = side.vectors_at(*args)
        small = (s_p, c2, None, None)
    else:
        raise ParameterError(f"side_call: unknown call {what!r}")
    return step_vectors(V, small, mode=side.mode)


def step_vectors(V: np.ndarray, small: tuple, *, mode: int, rows: int | None = None) -> tuple:
    """V in the dtype its pass ships it in and its column sums (read by blocks with a transform) beside ``small``;
    V kept. ``rows``: the whole vector's rows where ``V`` is a piece of it (the dtype is the whole vector's)."""
    V = np.ascontiguousarray(V, dtype=_step_dtype(mode, (V.shape[0] if rows is None else rows, *V.shape[1:])))
    return (*small, col_sums(V)), [V]
