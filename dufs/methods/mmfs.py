"""MMFS: max-margin feature selection by dual coordinate descent (paper 002; docs/methods.md, "MMFS").

Features are the points. With f_i the MMFS-scaled feature columns (the engine's standardization divided by
sqrt(m) for ``"zscore"`` and ``"scale"``, raw for None), relevance r_i and margins rho = theta / (1 - theta) r:

    primal  min_{w,b} 1/2 ||w||^2 + b^2 / (2 gamma) + C sum_i max(0, rho_i - f_i^T w - b)
    dual    min_{0 <= alpha <= C} D(alpha) = 1/2 alpha^T (K + gamma 1 1^T) alpha - rho^T alpha,

w = sum_j alpha_j f_j, b = gamma sum_j alpha_j. The certificate is the duality gap
gap = sum_i [C max(0, rho_i - g_i) + alpha_i (g_i - rho_i)] with g_i = f_i^T w + b, a sum of per-feature terms;
the solver stops when gap / |D| <= tol. Selected: alpha_i > 0, ranked by alpha_i.

The solve runs in rounds over the Matrix's feature blocks (the partitions), each where its block lives
(``Matrix.map_blocks`` with per-block state): a block first applies the previous round's step to its alphas and
computes its gap terms at the current (w, b), then runs one DCD epoch (random order, shrinking) against a local
copy of w with the bias held at its round-start value, and returns its delta of w. The driver sums the deltas
(a fixed tree on the workers), takes the exact line-search step along the summed direction, and checks the gap.
With one partition the epoch also moves the bias: plain serial DCD (Hsieh et al. 2008).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dufs._logging import get_logger
from dufs.engine.cluster import is_lost as _is_lost
from dufs.engine.matrix import Matrix, PerBlock, StoreBlock, check_labels
from dufs.errors import ParameterError
from dufs.kernels.dcd import active_set, dcd_epoch, dcd_gradient, gap_terms
from dufs.methods.labels import class_labels

log = get_logger(__name__)

# block-random visit order (runs of this many consecutive features, the runs and each run shuffled): measured by
# `dufs bench mmfs` on the 2M x 5M store, 1 worker: 1.61 s a round against 2.38 s in uniformly random order (the
# per-feature arrays and column buffers of a run stay in cache), to the same gap in about as many rounds
_VISIT_ORDER = 1024
_SMALL_NNZ = 2_000_000  # auto_partitions: fewer nonzeros run as one partition
_DENSE = 0.05  # auto_partitions: denser data runs as one partition
# working sets of at most this many nonzeros in all (a round's partitions) go to the driver for one serial DCD
# epoch over their union, the bias moving, instead of an epoch per partition with the bias held
_SERIAL_NNZ = 4_000_000
_TAIL = 14  # scalars of a round's result besides the change of w


@dataclass
class MMFSResult:
    """What :func:`mmfs` found: ``alpha`` (per feature), ``w`` (over samples), ``b``, the ``gamma`` used, the
    relevance ``r`` and margins ``rho``, the gradient ``g`` (f_i^T w + b) at the solution, and ``diagnostics``."""

    alpha: np.ndarray
    w: np.ndarray
    b: float
    gamma: float
    r: np.ndarray
    rho: np.ndarray
    g: np.ndarray
    diagnostics: dict = field(default_factory=dict)

    @property
    def support(self) -> np.ndarray:
        """Features with alpha > 0, ranked by alpha (ties by the lower index)."""
        s = np.flatnonzero(self.alpha > 0)
        return s[np.lexsort((s, -self.alpha[s]))]

    def ranking(self) -> np.ndarray:
        """Every feature: the support by alpha, then the rest by their dual gradient g_i - rho_i, smallest first
        (closest to entering the support)."""
        sup = self.support
        rest = np.flatnonzero(self.alpha <= 0)
        G = self.g[rest] - self.rho[rest]
        return np.concatenate([sup, rest[np.lexsort((rest, G))]])


# ---------------------------------------------------------------------------------------------------- geometry
def geometry(M: Matrix) -> dict[str, np.ndarray]:
    """Per-feature ``coef``, ``shift``, ``colsum`` and ``qii`` = ||f_i||^2 of the MMFS columns
    f_i = coef_i (x_i - shift_i 1): the engine's standardization divided by sqrt(m) (None: raw columns)."""
    st = M.column_stats() if M._stats is None else M._stats
    m = M.shape[0]
    mu, inv = M._transform()
    d = M.shape[1]
    shift = np.zeros(d) if mu is None else np.asarray(mu, dtype=np.float64)
    coef = np.ones(d) if inv is None else np.asarray(inv, dtype=np.float64) / np.sqrt(m)
    colsum = np.asarray(st.sum, dtype=np.float64)
    if mu is not None:
        base = np.where(st.min == st.max, 0.0, np.maximum(st.m2, 0.0))
    else:
        base = np.asarray(st.sumsq, dtype=np.float64)
    return {"coef": coef, "shift": shift, "colsum": colsum, "qii": coef * coef * base}


def encode_labels(y: Any) -> tuple[np.ndarray, np.ndarray]:
    """``(classes, codes)``: the sorted distinct labels and each sample's class index (``np.unique``'s inverse),
    whatever the labels' type (numbers, strings, booleans)."""
    classes, codes = np.unique(np.asarray(y).ravel(), return_inverse=True)
    return classes, codes.astype(np.int64).reshape(-1)


def class_relevance(M: Matrix, codes: np.ndarray, n_classes: int, geo: dict, rule: str = "ratio") -> np.ndarray:
    """Multi-class relevance from one pass of per-class column sums (``column_stats`` with the class codes),
    invariant to how the classes are numbered. With B_i = sum_c n_c (mu_ci - mu_i)^2 the between-class and
    T_i = sum_s (x_si - mu_i)^2 the total sum of squares of the raw feature i:

    - ``"ratio"``: r_i = coef_i sqrt(B_i), the length of f_i's projection on the span of the centred class
      indicators; under "zscore" and "scale" coef_i = 1 / sqrt(T_i), so r_i is the correlation ratio
      eta_i = sqrt(B_i / T_i). For two classes B_i = (x_i^T y~)^2, so r_i is the binary relevance |f_i^T y~|.
    - ``"ovr-max"`` / ``"ovr-mean"``: the largest / mean over the classes c of |f_i^T e~_c|, e~_c the indicator
      of class c centred and scaled to unit norm (|Pearson correlation| with "class c or not" under "zscore").

    A constant feature scores 0."""
    st = M.with_standardize(None).column_stats(codes.astype(np.float64))
    if st.class_count.shape[0] != n_classes:
        raise ParameterError("MMFS: the class codes do not match the number of classes")
    cnt = st.class_count.astype(np.float64)[:, None]
    n = float(M.shape[0])
    mu = st.mean()
    dev = st.class_sum / cnt - mu[None, :]  # mu_c - mu, (n_classes, d)
    const = st.min == st.max
    # the per-class terms are summed in sorted order: renumbering the classes permutes them, and the sum stays
    # bit-for-bit the same
    if rule == "ratio":
        between = np.where(const, 0.0, np.sort(cnt * dev * dev, axis=0).sum(axis=0))
        return geo["coef"] * np.sqrt(np.maximum(between, 0.0))
    if rule in ("ovr-max", "ovr-mean"):
        # x_i^T (e_c - n_c / n 1) = n_c (mu_c - mu), and the centred indicator has norm^2 n_c (n - n_c) / n
        per = np.abs(np.sqrt(cnt * n / (n - cnt)) * dev) * geo["coef"][None, :]
        per[:, const] = 0.0
        return per.max(axis=0) if rule == "ovr-max" else np.sort(per, axis=0).sum(axis=0) / n_classes
    raise ParameterError(f"The multi-class relevance rule must be 'ratio', 'ovr-max' or 'ovr-mean'; got {rule!r}.")


def relevance(M: Matrix, y: Any, geo: dict, kind: Any = "correlation") -> np.ndarray:
    """The relevance r of every feature for MMFS:

    - ``"correlation"``: with two classes, r_i = |f_i^T y~| with y~ the labels centred and scaled to unit norm
      (|Pearson correlation| under "zscore"); with more, the correlation ratio eta_i (:func:`class_relevance`,
      ``"ratio"``), which does not depend on how the classes are numbered and equals the binary rule for two;
    - ``"fisher"``: Fisher scores divided by their largest finite value;
    - a callable ``kind(M, y) -> r``.

    Labels of any type are encoded as classes (``np.unique``); numeric binary labels are used as they are."""
    if callable(kind):
        r = np.asarray(kind(M, y), dtype=np.float64).ravel()
        if r.shape != (M.shape[1],):
            raise ParameterError(f"the relevance callable returned shape {r.shape}; expected ({M.shape[1]},)")
        return r
    if kind == "correlation":
        y = np.asarray(y).ravel()
        classes, codes = encode_labels(y)
        if classes.shape[0] < 2:
            raise ParameterError("MMFS: the labels are constant, so every feature's relevance is 0")
        if classes.shape[0] > 2:
            return class_relevance(M, codes, classes.shape[0], geo, "ratio")
        y = np.asarray(y, dtype=np.float64) if y.dtype.kind in "biuf" else codes.astype(np.float64)
        yc = y - y.mean()
        nrm = np.linalg.norm(yc)
        if nrm == 0:
            raise ParameterError("MMFS: the labels are constant, so every feature's relevance is 0")
        raw = M.with_standardize(None).rmatvec(yc / nrm)
        return np.abs(geo["coef"] * raw)  # 1^T y~ = 0, so the shift drops out
    if kind == "fisher":
        from dufs.methods.filters import fisher_scores

        y = np.asarray(y).ravel()
        f = fisher_scores(M, y if y.dtype.kind in "biuf" else encode_labels(y)[1])
        fin = f[np.isfinite(f)]
        top = fin.max() if fin.size and fin.max() > 0 else 1.0
        return np.where(np.isfinite(f), f / top, 1.0)
    raise ParameterError(f"The 'relevance' parameter of mmfs must be 'correlation', 'fisher' or a callable; "
                         f"got {kind!r}.")


def class_targets(M: Matrix, y: Any, method: str) -> np.ndarray:
    """The labels ``y`` (one per row of ``M``), checked to be classes before any pass over the data: numbers as
    float64, other labels (strings) as given; a continuous target, a single class or a non-finite label is a
    :class:`ParameterError` (:func:`dufs.methods.labels.class_labels`)."""
    if y is None:
        raise ParameterError(f"method {method!r} is supervised: give labels y (or a store with labels)")
    values, classes = check_labels(y, M.shape[0])
    class_labels(values, method)
    return values if classes is None else np.asarray(y).ravel()


def margins(M: Matrix, y: Any, theta: Any, gamma: Any, relevance_kind: Any) -> tuple[bool, dict, np.ndarray,
                                                                                     np.ndarray]:
    """Check ``theta``, ``gamma`` and the labels; return (gamma is "auto", the geometry, the relevance r, the
    margins rho = theta / (1 - theta) r)."""
    if not (isinstance(theta, int | float) and 0 < theta < 1):
        raise ParameterError(f"The 'theta' parameter of mmfs must be a float in (0, 1); got {theta!r}.")
    auto = isinstance(gamma, str)
    if auto and gamma != "auto":
        raise ParameterError(f"The 'gamma' parameter of mmfs must be 'auto' or a float > 0; got {gamma!r}.")
    if not auto and not (isinstance(gamma, int | float) and gamma > 0):
        raise ParameterError(f"The 'gamma' parameter of mmfs must be 'auto' or a float > 0; got {gamma!r}.")
    y = class_targets(M, y, "mmfs")
    geo = geometry(M)
    r = relevance(M, y, geo, relevance_kind)
    return auto, geo, r, theta / (1.0 - theta) * r


# ---------------------------------------------------------------------------------------------------- blocks
def _init_state(block, coef, shift, colsum, qii, rho, alpha0, seed):
    w = block.width
    alpha = np.zeros(w) if alpha0 is None else np.array(alpha0, dtype=np.float64)
    return {"coef": np.ascontiguousarray(coef), "shift": np.ascontiguousarray(shift),
            "colsum": np.ascontiguousarray(colsum), "qii": np.ascontiguousarray(qii),
            "rho": np.ascontiguousarray(rho), "alpha": alpha, "dalpha": _NO_STEP, "g": np.zeros(w),
            "rng": np.array([np.uint64(seed) * np.uint64(2) + np.uint64(1)], dtype=np.uint64)}


def _init(blocks, state, coef, shift, colsum, qii, rho, alpha0, seed):
    return [_init_state(blk, coef[q], shift[q], colsum[q], qii[q], rho[q], None if alpha0 is None else alpha0[q],
                        seed[q]) for q, blk in enumerate(blocks)], None


def _start(blk, st, ws, wt, b, step, m, C, dal=None):
    """A block's part of a round's start: apply last round's step (along ``dal`` when the driver ran the block's
    epoch), the exact gradient and the gap terms at (w, b). Returns (state, [gap, sum alpha, rho^T alpha])."""
    st = dict(st)
    idx, d = st["dalpha"] if dal is None else dal
    if step != 0.0 and idx.size:
        alpha = st["alpha"].copy()  # a new array: the previous state stays as it was (a task may run again)
        alpha[idx] = np.clip(alpha[idx] + step * d, 0.0, C)
        st["alpha"] = alpha
    g = np.empty(blk.width)
    dcd_gradient(blk.indptr, blk.indices, blk.data, st["coef"], st["shift"], st["colsum"], ws, wt, m, b, g)
    st["g"] = g
    st["dalpha"] = _NO_STEP
    return st, gap_terms(g, st["rho"], st["alpha"], C)


def _working_set(blk, st, C) -> np.ndarray:
    index = np.empty(blk.width, dtype=np.int64)
    n_active = active_set(st["g"], st["rho"], st["alpha"], C, 0.0, -0.0, index)
    return index[:n_active]


def _payload(blk, st, index) -> dict:
    """A block's working set for an epoch run by the driver: its columns and per-coordinate numbers."""
    lo, hi = blk.indptr[index], blk.indptr[index + 1]
    take = np.concatenate([np.arange(a, c) for a, c in zip(lo, hi, strict=True)]) if index.size else \
        np.zeros(0, np.int64)
    return {"start": blk.start, "index": index, "counts": hi - lo, "indices": blk.indices[take],
            "data": blk.data[take], **{k: st[k][index] for k in ("coef", "shift", "colsum", "qii", "rho", "alpha",
                                                                  "g")}}


def _epoch(blk, st, wsl, wtl, bias, m, C, gamma, update_bias, sigma, index=None) -> tuple[int, int]:
    """One DCD epoch over a block against the partition's local (wsl, wtl, bias); the block's direction goes to
    ``st["dalpha"]`` (sparse: the visited coordinates and their change). Returns (updates, coordinates visited).

    Working set: the coordinates whose projected gradient at the round's start is not zero (:func:`active_set`
    with thresholds 0: free, or at a bound with the gradient pointing into the box). Measured on the 2M x 5M
    kddb-like store (serial, C = gamma = 1): 15 rounds to a 1e-3 gap in 7.0 s, against 18 rounds in 14.4 s with
    LIBLINEAR's shrinking thresholds (last epoch's extreme projected gradients), whose epochs kept visiting 3-4M
    of the 5M coordinates; the exact gradient of every round catches a coordinate that starts to violate."""
    alpha = st["alpha"]
    if index is None:
        index = _working_set(blk, st, C)
    n_active = index.shape[0]
    if n_active == 0:
        st["dalpha"] = _NO_STEP
        return 0, 0
    a = alpha.copy()
    rng = st["rng"].copy()
    # thresholds 0 in the epoch too: a coordinate whose gradient turned to point out of the box is skipped
    visit = index.copy()
    _, _, _, n_upd = dcd_epoch(blk.indptr, blk.indices, blk.data, st["coef"], st["shift"], st["colsum"], st["qii"],
                               st["rho"], a, C, gamma, wsl, wtl, m, bias, update_bias, visit, n_active,
                               np.zeros(2), rng, _VISIT_ORDER, sigma)
    d = a[index] - alpha[index]
    keep = d != 0.0
    st.update(rng=rng, dalpha=(index[keep], d[keep]))
    return int(n_upd), int(n_active)


_NO_STEP = (np.zeros(0, dtype=np.int64), np.zeros(0))


class _Part:
    """A partition's result of a round, summed over the partitions by ``+`` (the reduce): the change of ws (sparse
    (rows, values) while few rows change, else dense) and the scalars ``tail``."""

    __slots__ = ("m", "rows", "vals", "tail", "cols")

    def __init__(self, m: int, rows: np.ndarray | None, vals: np.ndarray, tail: np.ndarray,
                 cols: list | None = None):
        self.m, self.rows, self.vals, self.tail = m, rows, vals, tail
        self.cols = [] if cols is None else cols  # working sets (:func:`_payload`) for the driver's epochs

    def dense(self) -> np.ndarray:
        if self.rows is None:
            return self.vals
        out = np.zeros(self.m)
        np.add.at(out, self.rows, self.vals)
        return out

    def __add__(self, other: _Part) -> _Part:
        tail = self.tail + other.tail
        cols = self.cols + other.cols
        if self.rows is not None and other.rows is not None and self.rows.size + other.rows.size < self.m // 4:
            return _Part(self.m, np.concatenate([self.rows, other.rows]), np.concatenate([self.vals, other.vals]),
                         tail, cols)
        return _Part(self.m, None, self.dense() + other.dense(), tail, cols)

    @classmethod
    def of(cls, dws: np.ndarray, tail: np.ndarray, cols: list | None = None) -> _Part:
        rows = np.flatnonzero(dws)
        if rows.size < dws.shape[0] // 4:
            return cls(dws.shape[0], rows, dws[rows], tail, cols)
        return cls(dws.shape[0], None, dws, tail, cols)


def _round(blocks, states, ws, wt, b, step, m, C, gamma, update_bias, epoch, sigma, dal=None, budget=0, part=0):
    """One round of a partition (its blocks, in a random order): apply last round's step and compute the gap terms
    at (w, b) on every block, then (if ``epoch``) one DCD epoch over all of them against one local copy of w, with
    the bias held at ``b`` unless ``update_bias`` (one partition: serial DCD; or CoCoA+ with ``sigma`` > 1).

    ``dal`` (one item a block, or None): the blocks' directions when the driver ran their epoch last round.
    When the partition's working sets hold at most ``budget`` nonzeros, it runs no epoch and returns them
    (:func:`_payload`, tagged with ``part``) for the driver's epoch instead.

    Returns the new states and a :class:`_Part`: the change of ws and the scalars [dt, dS, ds,
    dalpha^T (g - rho), gap, sum alpha, rho^T alpha, updates, visited, 1, seconds starting, seconds in epochs,
    seconds in the task, partitions that ran their epoch] (dws, dt, dS: the change of w that the alphas' change
    makes, whatever ``sigma``)."""
    t0 = time.perf_counter()
    part = part[0] if isinstance(part, list) else part
    tail = np.zeros(_TAIL)
    new = []
    for q, (blk, st) in enumerate(zip(blocks, states, strict=True)):
        st, (gap, sa, ra) = _start(blk, st, ws, wt, b, step, m, C, None if dal is None else dal[q])
        tail[4:7] += gap, sa, ra
        new.append(st)
    tail[9] = 1.0
    tail[10] = time.perf_counter() - t0
    if not epoch:
        tail[12] = time.perf_counter() - t0
        return new, _Part(ws.shape[0], np.zeros(0, dtype=np.int64), np.zeros(0), tail)
    sets = [_working_set(blk, st, C) for blk, st in zip(blocks, new, strict=True)]
    nnz = sum(int((blk.indptr[ix + 1] - blk.indptr[ix]).sum()) for blk, ix in zip(blocks, sets, strict=True))
    if nnz <= budget:
        cols = []
        for blk, st, ix in zip(blocks, new, sets, strict=True):
            st["dalpha"] = _NO_STEP
            if ix.size:
                cols.append({"part": part, **_payload(blk, st, ix)})
        tail[8] = sum(ix.size for ix in sets)
        tail[12] = time.perf_counter() - t0
        return new, _Part(ws.shape[0], np.zeros(0, dtype=np.int64), np.zeros(0), tail, cols)
    tail[13] = 1.0
    wsl = ws.copy()
    wtl = wt.copy()
    bias = np.array([b])
    # the blocks' order: from the first block's generator state (deterministic, new every round)
    for q in np.random.default_rng(int(new[0]["rng"][0])).permutation(len(blocks)):
        blk, st = blocks[q], new[q]
        t1 = time.perf_counter()
        n_upd, n_act = _epoch(blk, st, wsl, wtl, bias, m, C, gamma, update_bias, sigma, sets[q])
        tail[11] += time.perf_counter() - t1
        idx, d = st["dalpha"]
        tail[2] += float(d.sum())
        tail[3] += float((st["g"][idx] - st["rho"][idx]) @ d)  # the directional derivative, exact gradient
        tail[7] += n_upd
        tail[8] += n_act
    dws = wsl - ws
    tail[0] = wtl[0] - wt[0]
    tail[1] = wtl[1] - wt[1]
    if sigma != 1.0:
        dws /= sigma
        tail[:2] /= sigma
    tail[12] = time.perf_counter() - t0
    return new, _Part.of(dws, tail)


def _driver_epoch(cols: list, ws: np.ndarray, wt: np.ndarray, b: float, m: int, C: float, gamma: float,
                  update_bias: bool, sigma: float, seed: int) -> tuple[np.ndarray, np.ndarray, list]:
    """One DCD epoch in this process over working sets sent by the partitions (:func:`_payload`), from (w, b).
    Returns (dws, [dt, dS, ds, slope, updates], [(block start, coordinates, their change), ...])."""
    counts = np.concatenate([c["counts"] for c in cols])
    indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    indices = np.concatenate([c["indices"] for c in cols])
    data = np.concatenate([c["data"] for c in cols])
    per = {k: np.concatenate([c[k] for c in cols]).astype(np.float64) for k in ("coef", "shift", "colsum", "qii",
                                                                                   "rho", "alpha", "g")}
    a = per["alpha"].copy()
    n = a.shape[0]
    wsl, wtl, bias = ws.copy(), wt.copy(), np.array([b])
    rng = np.array([np.uint64(seed) * np.uint64(2) + np.uint64(1)], dtype=np.uint64)
    _, _, _, n_upd = dcd_epoch(indptr, indices, data, per["coef"], per["shift"], per["colsum"], per["qii"],
                               per["rho"], a, C, gamma, wsl, wtl, float(m), bias, update_bias,
                               np.arange(n, dtype=np.int64), n, np.zeros(2), rng, _VISIT_ORDER, sigma)
    d = a - per["alpha"]
    dws = (wsl - ws) / sigma
    sc = np.array([(wtl[0] - wt[0]) / sigma, (wtl[1] - wt[1]) / sigma, d.sum(),
                   float((per["g"] - per["rho"]) @ d), float(n_upd)])
    dal, at = [], 0
    for c in cols:
        k = c["index"].shape[0]
        dc = d[at:at + k]
        keep = dc != 0.0
        dal.append((c["start"], c["index"][keep], dc[keep]))
        at += k
    return dws, sc, dal


# ---------------------------------------------------------------------------------------------------- resilience
_MAX_RECOVERIES = 5  # rebuilds of the block state after lost workers, per mmfs call
def _take_alpha(blocks, states, with_g=True):
    out = []
    for blk, st in zip(blocks, states, strict=True):
        nz = np.flatnonzero(st["alpha"])  # alpha is sparse (the support): send its nonzeros
        out.append((blk.start, nz, st["alpha"][nz], st["g"] if with_g else None))
    return states, out


def _init_blocks(M: Matrix, groups: list, geo: dict, rho: np.ndarray, alpha0: np.ndarray | None,
                 seed: int) -> Any:
    state = [None] * len(groups)
    _, state = M.map_blocks(_init, PerBlock(geo["coef"]), PerBlock(geo["shift"]), PerBlock(geo["colsum"]),
                            PerBlock(geo["qii"]), PerBlock(rho), None if alpha0 is None else PerBlock(alpha0),
                            PerBlock([seed * 1000003 + i for i in range(M.n_blocks)]), state=state, groups=groups)
    return state


def _gather_alpha(M: Matrix, groups: list, state: Any, with_g: bool = True) -> tuple[np.ndarray, Any, Any]:
    """(alpha, g) of every feature on the driver (g None unless ``with_g``), and the state to go on with."""
    parts, new = M.map_blocks(_take_alpha, with_g, state=state, groups=groups)
    if hasattr(state, "release"):
        state.release()
    d = M.shape[1]
    alpha = np.zeros(d)
    g = np.zeros(d) if with_g else None
    for part in parts:
        for start, nz, a, gg in part:
            alpha[start + nz] = a
            if with_g:
                g[start:start + gg.shape[0]] = gg
    return alpha, g, new


def _primal(M: Matrix, alpha: np.ndarray, gamma: float) -> tuple[np.ndarray, np.ndarray, float]:
    """(ws, wt, b) from alpha in one pass: w = F alpha (Z alpha / sqrt(m) under a standardization, X alpha raw)."""
    m = M.shape[0]
    ws = np.asarray(M.matvec(alpha), dtype=np.float64)
    if M.standardize is not None:
        ws = ws / np.sqrt(m)
    return ws, np.array([0.0, float(ws.sum())]), float(gamma * alpha.sum())


class _Checkpoint:
    """``<directory>/checkpoint.npz``: alpha and a JSON of the rest (round, gamma, the path position, the trace,
    the problem it belongs to), written to a temporary name and renamed into place (atomic)."""

    NAME = "checkpoint.npz"

    def __init__(self, directory: str, problem: dict):
        self.directory = os.fspath(directory)
        self.path = os.path.join(self.directory, self.NAME)
        self.problem = problem
        self.writes = 0
        self.last_round: int | None = None

    def save(self, alpha: np.ndarray, meta: dict) -> None:
        os.makedirs(self.directory, exist_ok=True)
        meta = {"format": 2, "problem": self.problem, **meta}
        tmp = f"{self.path}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            with open(tmp, "wb") as f:
                nz = np.flatnonzero(alpha)  # the support only: alpha is sparse
                np.savez(f, n=np.int64(alpha.shape[0]), index=nz, value=np.asarray(alpha[nz], dtype=np.float64),
                         meta=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        self.writes += 1
        self.last_round = int(meta.get("round", -1))

    def load(self) -> tuple[np.ndarray, dict] | None:
        """The checkpoint (alpha, meta), None when there is none; a ParameterError naming the file when it is
        unreadable or belongs to another problem."""
        if not os.path.exists(self.path):
            return None
        try:
            with np.load(self.path, allow_pickle=False) as z:
                if "alpha" in z:  # format 1: dense
                    alpha = np.array(z["alpha"], dtype=np.float64)
                else:
                    alpha = np.zeros(int(z["n"]))
                    alpha[np.asarray(z["index"], dtype=np.int64)] = np.asarray(z["value"], dtype=np.float64)
                meta = json.loads(bytes(np.asarray(z["meta"], dtype=np.uint8)).decode())
        except Exception as e:  # noqa: BLE001 - any failure to read means the file is not a usable checkpoint
            raise ParameterError(f"the MMFS checkpoint {self.path} is unreadable ({type(e).__name__}: {e}); "
                                 f"delete it or run with resume=False") from None
        theirs = meta.get("problem", {})
        for key, ours in self.problem.items():
            got = theirs.get(key)
            same = (np.allclose(got, ours, rtol=1e-9, atol=0.0) if key == "rho" and got is not None
                    and len(got) == len(ours) else got == ours)
            if not same:
                raise ParameterError(f"the MMFS checkpoint {self.path} belongs to another problem ({key}: "
                                     f"{got!r} in the file, {ours!r} here); delete it, give another checkpoint "
                                     f"directory, or run with resume=False")
        if alpha.shape != (self.problem["shape"][1],):
            raise ParameterError(f"the MMFS checkpoint {self.path} holds {alpha.shape[0]} alphas for "
                                 f"{self.problem['shape'][1]} features")
        return alpha, meta


def _store_path(M: Matrix) -> str | None:
    p = getattr(M, "store_path", None)
    if p is None:
        for s in getattr(M, "_src", []):
            if isinstance(s, StoreBlock):
                p = s.path
                break
    if p is None:
        return None
    p = os.fspath(p)
    if p.startswith("file://"):
        p = p[len("file://"):]
    return None if "://" in p else p.rstrip("/")


def _problem(M: Matrix, rho: np.ndarray, C: float, theta: float, gamma: Any, relevance_kind: Any) -> dict:
    rel = relevance_kind if isinstance(relevance_kind, str) else \
        f"callable:{getattr(relevance_kind, '__qualname__', type(relevance_kind).__name__)}"
    return {"shape": [int(M.shape[0]), int(M.shape[1])], "nnz": int(M.nnz), "standardize": M.standardize,
            "C": float(C), "theta": float(theta), "gamma": gamma if isinstance(gamma, str) else float(gamma),
            "relevance": rel, "rho": [float(rho.sum()), float(np.sqrt(rho @ rho)), float(rho.max(initial=0.0))]}


def default_checkpoint(M: Matrix, problem: dict) -> str | None:
    """``<store path>.dufs-side/mmfs-<hash of the problem>`` for a Matrix read from a local store, else None.

    The hash covers the shape, nnz, standardization, C, theta, gamma and relevance (not ``tol`` or
    ``max_epochs``: they only decide when to stop, so a resume may change them)."""
    p = _store_path(M)
    if p is None:
        return None
    key = {k: v for k, v in problem.items() if k != "rho"}
    h = hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    return f"{p}.dufs-side/mmfs-{h}"


# ---------------------------------------------------------------------------------------------------- the solver
def solve(M: Matrix, rho: np.ndarray, geo: dict, *, C: float, gamma: float, tol: float, max_epochs: int,
          random_state: int = 0, groups: list | None = None, state: Any = None, w: tuple | None = None,
          trace: list | None = None, alpha0: np.ndarray | None = None, checkpoint: Any = None,
          checkpoint_every: int = 5, checkpoint_meta: dict | None = None, recovery: dict | None = None,
          rule: str = "auto") -> dict:
    """Rounds of block DCD + line search until gap / |D| <= tol or ``max_epochs`` rounds. Returns a dict with the
    final ``state`` (per partition), ``ws``, ``wt``, ``b``, ``gap``, ``objective``, ``rounds``, ``converged``, and
    ``alpha`` and ``g`` gathered to the driver.

    ``groups`` are the partitions (lists of block indices; default: one partition of every block). With one
    partition a round is one serial DCD epoch, the bias moving. With K > 1 each partition runs its epoch with the
    bias held; a round after one whose duality gap did not decrease solves CoCoA+'s safe local subproblems
    (sigma' = K, the bias moving locally) instead (``trace[i]["rule"]``), then the held-bias rule resumes;
    ``rule="cocoa+"`` uses CoCoA+ every round.

    ``alpha0`` is alpha on the driver: the start when ``state`` is None, else what ``state`` holds. Every
    ``checkpoint_every`` rounds (under a distributed client or with a ``checkpoint``) alpha is gathered to the
    driver with the (w, b) it belongs to, and written to ``checkpoint`` (a :class:`_Checkpoint`) with
    ``checkpoint_meta``; when a round fails because workers (and the block state on them) were lost, the state is
    rebuilt from that copy and the rounds go on from there. ``recovery`` (a dict) counts ``recoveries`` and the
    ``rounds_replayed``.
    """
    from dufs.engine.matrix import _client

    m = M.shape[0]
    if groups is None:
        groups = [list(range(M.n_blocks))]
    recovery = {} if recovery is None else recovery
    recovery.setdefault("recoveries", 0)
    recovery.setdefault("rounds_replayed", 0)
    trace = [] if trace is None else trace
    every = max(1, int(checkpoint_every))
    client = _client()
    snap_on = checkpoint is not None or client is not None
    seen = recovery.setdefault("_workers", set())

    def watch() -> None:  # workers that left the cluster during the solve (dask may recompute their work itself)
        if client is not None:
            with contextlib.suppress(Exception):
                now = set(client.scheduler_info(n_workers=-1).get("workers", {}))
                recovery["workers_lost"] = len(seen - now)
                seen.update(now)

    watch()
    seed = int(random_state)
    if w is None:
        ws, wt, b = np.zeros(m), np.zeros(2), 0.0
    else:
        ws, wt, b = w
    if state is None:
        state = _init_blocks(M, groups, geo, rho, alpha0, seed)
        if alpha0 is None and snap_on:
            alpha0 = np.zeros(M.shape[1])
    elif alpha0 is None and snap_on:
        alpha0, _, state = _gather_alpha(M, groups, state)
    # the last copy of alpha on the driver with the (w, b) it belongs to, the rounds and trace entries before it
    snap = (alpha0, ws, wt, b, 0, len(trace))
    K = len(groups)
    step = 0.0
    dal = None  # the blocks' directions when the driver ran their epochs (else each block keeps its own)
    budget = _SERIAL_NNZ // K if K > 1 and rule == "auto" else 0
    owner = [0] * M.n_blocks
    for q, grp in enumerate(groups):
        for i in grp:
            owner[i] = q
    bounds = M.bounds
    if rule not in ("auto", "cocoa+"):
        raise ParameterError(f"The 'rule' parameter of solve must be 'auto' or 'cocoa+'; got {rule!r}.")
    # whether this round solves CoCoA+'s local subproblems (the previous round did not decrease the gap)
    cocoa = rule == "cocoa+" and K > 1
    prev_gap = np.inf
    converged = False
    gap = obj = np.inf
    r = 0
    alpha = g = None
    while True:
        last = r >= max_epochs
        t_round = time.perf_counter()
        try:
            if state is None:
                state = _init_blocks(M, groups, geo, rho, snap[0], seed + 7919 * recovery["recoveries"])
            # under a cluster w travels scattered, not inside the graph: the scheduler keeps the task specs of the
            # whole chain of block states, and an embedded w would stay there once per round (m floats each); a
            # lost chain is rebuilt from the driver's last copy of alpha instead (below)
            t_map = time.perf_counter()
            w_arg = client.scatter(ws, hash=False) if client is not None else ws
            sigma = float(K) if cocoa else 1.0
            res, new_state = M.map_blocks(_round, w_arg, wt, b, step, float(m), C, gamma, K == 1 or cocoa,
                                          not last, sigma, None if dal is None else PerBlock(dal), budget,
                                          PerBlock(owner), state=state, reduce="sum", groups=groups)
            if hasattr(state, "release"):
                state.release()
            if client is not None:
                w_arg.release()
            state = new_state
            t_map = time.perf_counter() - t_map
            dws, tl = res.dense(), res.tail.copy()
            dal = None
            mode = "serial" if K == 1 else "cocoa+" if cocoa else "held-bias"
            if res.cols:
                # the partitions whose working sets were small sent them: with no partition running its own epoch,
                # one serial epoch over all of them, the bias moving (exact DCD on the working set); otherwise an
                # epoch per partition, as the partition would have run it
                serial = tl[13] == 0
                mode = "serial working set" if serial else mode
                by: dict = {}
                for c in res.cols:
                    by.setdefault(-1 if serial else c["part"], []).append(c)
                dal = [None] * M.n_blocks
                for q, cs in sorted(by.items()):
                    dw_q, sc, dl = _driver_epoch(cs, ws, wt, b, m, C, gamma, serial or cocoa,
                                                 1.0 if serial else sigma, seed * 1000003 + 7 * r + q + 2)
                    dws = dws + dw_q
                    tl[[0, 1, 2, 3, 7]] += sc
                    for start, ix, d in dl:
                        dal[int(np.searchsorted(bounds, start, side="right")) - 1] = (ix, d)
                dal = dal if any(v is not None for v in dal) else None  # None: the block keeps its own
            dt, dS, ds, slope, gap, sa, ra = (float(v) for v in tl[:7])
            wnorm2 = float(ws @ ws)  # ws is w itself: the driver folds the constant part in every round
            obj = 0.5 * wnorm2 + b * b / (2.0 * gamma) - ra
            rel = gap / max(abs(obj), 1e-300)
            r += 1
            done = rel <= tol or gap <= 0.0
            fresh = False
            if done or last or (snap_on and r % every == 0):
                # alpha now is the one the round's gap was computed at: it belongs to (ws, wt, b)
                alpha, g, state = _gather_alpha(M, groups, state, with_g=done or last)
                snap = (alpha, ws, wt, b, r - 1, len(trace))
                fresh = True
                watch()
        except Exception as e:
            if not snap_on or snap[0] is None or not _is_lost(e) or recovery["recoveries"] >= _MAX_RECOVERIES:
                raise
            recovery["recoveries"] += 1
            recovery["rounds_replayed"] += r - snap[4]
            recovery.setdefault("errors", []).append(f"{type(e).__name__}: {str(e)[:200]}")
            log.warning("MMFS: the block state was lost (%s: %s); rebuilding it from alpha at round %d",
                        type(e).__name__, str(e)[:200], snap[5])
            with contextlib.suppress(Exception):
                if hasattr(state, "release"):
                    state.release()
            state = None
            _, ws, wt, b, r, n = snap
            del trace[n:]
            step = 0.0
            dal = None
            cocoa = rule == "cocoa+" and K > 1
            prev_gap = np.inf
            continue
        trace.append({"round": len(trace), "objective": obj, "duality_gap": gap, "relative_gap": rel,
                      "updates": int(tl[7]), "active": int(tl[8]), "gamma": gamma,
                      "rule": mode,
                      # seconds: the round on the driver (its checkpoint included), waiting for the partitions'
                      # tasks, and summed over those: starting (step, gradient, gap terms), the DCD epochs, the task
                      "wall_s": time.perf_counter() - t_round, "map_s": t_map, "start_s": float(tl[10]),
                      "epoch_s": float(tl[11]), "task_s": float(tl[12])})
        log.debug("round %d: D = %.10g, gap = %.3g (relative %.3g), %d updates, %d active", len(trace) - 1, obj,
                  gap, rel, int(tl[7]), int(tl[8]))
        if checkpoint is not None and fresh:
            checkpoint.save(snap[0], {"round": snap[5], "gamma": gamma, "trace": trace[:snap[5]],
                                      "converged": bool(done), **(checkpoint_meta or {})})
        if done:
            converged = True
            break
        if last:
            break
        alpha = g = None
        # the fallback: after a round whose gap did not decrease, one round of CoCoA+ (provably safe; Ma et al.).
        # Measured on the 2M x 5M store, 2 partitions: 19 rounds to a 1e-3 gap, against 23 with the fallback
        # only after a round whose line search found no descent (the gap zig-zags under the held-bias rule)
        cocoa = K > 1 and (rule == "cocoa+" or not cocoa and gap >= prev_gap)
        prev_gap = gap
        # exact line search along the summed direction d: the dual is quadratic along it, with slope
        # d^T grad D = sum_j d_j (g_j - rho_j) (summed by the blocks from the exact gradient) and curvature
        # ||dw||^2 + gamma ds^2 (dw = dws + dt 1 formed explicitly: no cancellation between its two parts)
        dw = dws + dt
        den = float(dw @ dw) + gamma * ds * ds
        step = float(np.clip(-slope / den, 0.0, 1.0)) if den > 0 and slope < 0 else 0.0
        ws = ws + step * dw
        wt = np.array([0.0, float(ws.sum())])
        b = b + gamma * step * ds
    return {"state": state, "ws": ws, "wt": wt, "b": b, "gap": gap, "objective": obj, "converged": converged,
            "trace": trace, "alpha": alpha, "g": g}


def auto_partitions(M: Matrix) -> int:
    """The number of partitions for ``n_partitions="auto"``: one per worker holding blocks (one per worker of the
    client when the blocks are not persisted), and one (serial DCD) in this process or for small or dense data.

    Small: under ``_SMALL_NNZ`` nonzeros a serial epoch takes a few tens of milliseconds, less than a round's
    fixed cost on a cluster. Dense: above ``_DENSE`` density the features are strongly coupled and the held-bias
    rule needs 3-4x the rounds of serial DCD (86-138 rounds against 34 epochs on ALLAML, docs/methods.md "MMFS")."""
    from dufs.engine.matrix import _client

    client = _client()
    if client is None or M.n_blocks == 1:
        return 1
    n, d = M.shape
    if M.nnz < _SMALL_NNZ or M.nnz > _DENSE * n * d:
        return 1
    owners = {a for a in M.placement() if a is not None}
    if owners:
        return len(owners)
    with contextlib.suppress(Exception):
        return max(1, len(client.scheduler_info(n_workers=-1)["workers"]))
    return 1


def mmfs(M: Matrix, y: Any, *, n_features: int | None = None, C: float = 1.0, theta: float = 0.5,
         gamma: Any = "auto", relevance_kind: Any = "correlation", tol: float = 1e-3, max_epochs: int = 500,
         random_state: int = 0, n_partitions: Any = "auto", checkpoint: Any = "auto", checkpoint_every: int = 5,
         resume: bool = False) -> MMFSResult:
    """Solve MMFS on ``M`` (its ``standardize`` gives the geometry) with labels ``y``; see the module docstring.

    Defaults, chosen on data (``examples/mmfs_defaults.py``: C, theta, gamma, standardize, the relevance and its
    multi-class rule, on ALLAML, BASEHOCK, PCMAC, RELATHE, COIL20, ORL and Isolet, LinearSVC(C=1) on the top K with
    the selection made inside each of 5 folds): ``C=1``, ``theta=0.5``, ``gamma="auto"``, ``standardize="zscore"``
    (``fit``'s default) and ``relevance_kind="correlation"`` (|corr| on two classes, the correlation ratio on more).
    They beat the |correlation| ranking in 11 of the 14 (set, K in {5, 10}) cells, with a mean accuracy of 68.3%
    against 55.0%; taking the class ids as numbers (the rule before) reached 62.2% and depended on how the classes
    were numbered. No single change of C (0.01 .. 10), theta (0.3 .. 0.9) or a fixed gamma (1 .. 0.001) won more
    cells, and none had a mean more than 0.02 points higher (C=0.3). Recommended settings by kind of data:

    - dense measurements (microarrays, images, audio features): the defaults; ``standardize="zscore"`` matters
      (``"scale"`` lost 10-50 points on COIL20 and ORL, where the pixels' means differ);
    - sparse counts or tf-idf (text, kddb-like): the defaults (centring stays implicit, nothing is densified);
      ``"scale"`` gave the same accuracies on the three text sets and is the paper's kddb setting; at K >= 20 the
      |correlation| filter was as good or better on two of the three text sets, MMFS's gain is at small K;
    - many classes: the default correlation ratio; ``relevance_kind="fisher"`` ranks the same features first
      (eta^2 = F / (1 + F)) but its scale weighs relevance against redundancy differently and lost on ORL.

    ``gamma="auto"`` follows a decreasing path gamma = 1, 1/2, 1/4, ... with warm starts until the support holds
    ``n_features`` features (or gamma reaches 2^-30); a fixed gamma solves once.

    ``n_partitions`` (an int, or ``"auto"``: :func:`auto_partitions`) groups the feature blocks into partitions
    (:meth:`Matrix.partition`: by the worker holding them); each round runs one task a partition.

    The solver state never lives only on the workers: every ``checkpoint_every`` rounds alpha is gathered to the
    driver (under a distributed client) and written to ``checkpoint`` (a directory; ``"auto"``: beside a local
    store, ``<store>.dufs-side/mmfs-<hash of the problem>``, none for in-memory input; None: no file). A round that
    fails because workers were lost rebuilds the block state from that copy and goes on (``diagnostics
    ["recoveries"]``). ``resume=True`` continues from the checkpoint (``diagnostics["resumed_from_round"]``); a
    checkpoint of another problem raises a ParameterError naming the file.
    """
    t0 = time.perf_counter()
    if not (isinstance(C, int | float) and C > 0):
        raise ParameterError(f"The 'C' parameter of mmfs must be a float > 0; got {C!r}.")
    if not (isinstance(theta, int | float) and 0 < theta < 1):
        raise ParameterError(f"The 'theta' parameter of mmfs must be a float in (0, 1); got {theta!r}.")
    if not (isinstance(tol, int | float) and tol > 0):
        raise ParameterError(f"The 'tol' parameter of mmfs must be a float > 0; got {tol!r}.")
    if not (isinstance(max_epochs, int | np.integer) and max_epochs >= 1):
        raise ParameterError(f"The 'max_epochs' parameter of mmfs must be an int >= 1; got {max_epochs!r}.")
    if not (isinstance(checkpoint_every, int | np.integer) and checkpoint_every >= 1):
        raise ParameterError(f"The 'checkpoint_every' parameter of mmfs must be an int >= 1; "
                             f"got {checkpoint_every!r}.")
    if not (checkpoint is None or checkpoint == "auto" or isinstance(checkpoint, str | os.PathLike)):
        raise ParameterError(f"The 'checkpoint' parameter of mmfs must be a directory path, 'auto' or None; "
                             f"got {checkpoint!r}.")
    if not (n_partitions == "auto" or isinstance(n_partitions, int | np.integer) and n_partitions >= 1):
        raise ParameterError(f"The 'n_partitions' parameter of mmfs must be 'auto' or an int >= 1; "
                             f"got {n_partitions!r}.")
    auto, geo, r, rho = margins(M, y, theta, gamma, relevance_kind)
    groups = M.partition(auto_partitions(M) if n_partitions == "auto" else int(n_partitions))
    problem = _problem(M, rho, C, theta, gamma, relevance_kind)
    directory = default_checkpoint(M, problem) if checkpoint == "auto" else checkpoint
    ck = None if directory is None else _Checkpoint(directory, problem)
    if resume and ck is None:
        raise ParameterError("mmfs(resume=True) needs a checkpoint directory: give checkpoint=<directory> (the "
                             "default is beside a local store only)")
    trace: list = []
    gammas = [float(gamma)] if not auto else [2.0 ** -k for k in range(31)]
    want = n_features if n_features is not None else 1
    state = None
    w = None
    alpha0 = None
    first = 0
    resumed_from = None
    if resume:
        got = ck.load()
        if got is None:
            log.info("mmfs(resume=True): no checkpoint at %s; starting from alpha = 0", ck.path)
        else:
            alpha0, meta = got
            first = int(meta.get("gamma_index", 0))
            trace = list(meta.get("trace", []))
            resumed_from = int(meta["round"])
            w = _primal(M, alpha0, gammas[first])
            log.info("mmfs: resuming from %s at round %d (gamma %.3g)", ck.path, resumed_from, gammas[first])
    recovery: dict = {}
    support = 0
    for k in range(first, len(gammas)):
        gk = gammas[k]
        if w is not None and alpha0 is not None:  # warm start: w depends on alpha only; b = gamma sum(alpha)
            w = (w[0], w[1], gk * float(alpha0.sum()))
        out = solve(M, rho, geo, C=float(C), gamma=gk, tol=float(tol), max_epochs=int(max_epochs),
                    random_state=int(random_state), groups=groups, state=state, w=w, trace=trace, alpha0=alpha0,
                    checkpoint=ck, checkpoint_every=int(checkpoint_every), checkpoint_meta={"gamma_index": k},
                    recovery=recovery)
        state = out["state"]
        alpha0 = out["alpha"]
        w = (out["ws"], out["wt"], out["b"])
        support = int((alpha0 > 0).sum())
        log.info("gamma %.3g: %d features in the support, gap %.3g after %d rounds", gk, support, out["gap"],
                 len(trace))
        if support >= want:
            break
    alpha, g = out["alpha"], out["g"]
    if hasattr(state, "release"):
        state.release()
    ws, wt, b = out["ws"], out["wt"], out["b"]
    diagnostics = {
        "objective": out["objective"], "duality_gap": out["gap"],
        "relative_gap": out["gap"] / max(abs(out["objective"]), 1e-300), "converged": out["converged"],
        "rounds": len(trace), "gamma": gk, "gamma_path": auto, "support": support, "n_partitions": len(groups),
        "n_blocks": M.n_blocks, "cocoa_rounds": sum(t.get("rule") == "cocoa+" for t in trace),
        "trace": trace, "solve_time": time.perf_counter() - t0,
        "recoveries": int(recovery.get("recoveries", 0)), "rounds_replayed": int(recovery.get("rounds_replayed", 0)),
        "checkpoint": None if ck is None else ck.path, "checkpoint_writes": 0 if ck is None else ck.writes,
        "resumed_from_round": resumed_from, "workers_lost": int(recovery.get("workers_lost", 0)),
    }
    if recovery.get("errors"):
        diagnostics["recovery_errors"] = recovery["errors"]
    if n_features is not None and support < n_features:
        diagnostics["filled_by_gradient"] = int(n_features - support)
        log.info("the support holds %d features; the other %d are the closest to entering it (dual gradient)",
                 support, n_features - support)
    return MMFSResult(alpha=alpha, w=ws + wt[0], b=float(b), gamma=gk, r=r, rho=rho, g=g, diagnostics=diagnostics)
