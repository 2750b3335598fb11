"""MMFS's working sets on the driver: serial DCD epochs over the union of the partitions' working sets (the bias
moving), through their Gram matrix when it is small, and the cache of their columns kept between rounds."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import numpy as np

from dufs.engine import buffer
from dufs.kernels.dcd import (
    add_columns,
    column_gram,
    dcd_epoch,
    dense_dcd,
)
from dufs.methods.mmfs.records import RoundTotals
from dufs.scheduling import driver_threads, in_threads

# block-random visit order (runs of this many consecutive features, the runs and each run shuffled): a round faster
# than in uniformly random order (the per-feature arrays and column buffers of a run stay in cache), to the same gap
# in about as many rounds (docs/measurements.md, "MMFS's solver")
_VISIT_ORDER = 1024


# a serial working set of at most GRAM_MAX columns is solved through its k x k matrix (_gram_epochs) when its
# nonzeros share at most _GRAM_PAIRS pairs of nonzeros in a row per nonzero (_gram_pays), its DCD epochs at most
# _GRAM_FLOPS flops in all
GRAM_MAX = 1024
_GRAM_PAIRS = 4
_GRAM_FLOPS = 50_000_000
_CACHE_MIN_NNZ = 4096  # working-set columns the driver keeps between rounds have at least this many nonzeros


class _ColumnCache:
    """The heavier working-set columns the driver received, kept between rounds (least recently used dropped
    beyond ``limit`` nonzeros): a partition leaves them out of its payload. The support of a kddb-like problem is
    a few heavy columns, sent every round: 1.2M nonzeros (about 10 MB) a round on the 2M x 5M bench store."""

    def __init__(self, limit: int):
        self.limit = int(limit)
        self.cols: OrderedDict = OrderedDict()  # (block start, local index) -> (indices, data)
        self.nnz = 0
        self.reused = 0  # nonzeros not sent because they were here

    def known(self, bounds: np.ndarray) -> list:
        """Per block (by ``bounds``), the sorted local indices of the columns held here."""
        by: dict = {}
        for start, j in self.cols:
            by.setdefault(start, []).append(j)
        return [np.sort(np.asarray(by.get(int(a), []), dtype=np.int64)) for a in bounds[:-1]]

    def complete(self, c: dict) -> dict:
        """The payload ``c`` with every column of its working set (the held ones put back, the heavy new ones
        kept)."""
        sent, counts, start, index = c["sent"], c["counts"], int(c["start"]), c["index"]
        ends = np.cumsum(counts)
        if sent.all():
            full_i, full_d = c["indices"], c["data"]
        else:
            full_i = np.empty(int(ends[-1]), dtype=c["indices"].dtype)
            full_d = np.empty(int(ends[-1]), dtype=c["data"].dtype)
            mask = np.repeat(sent, counts)
            full_i[mask] = c["indices"]
            full_d[mask] = c["data"]
            for j in np.flatnonzero(~sent):
                got = self.cols[(start, int(index[j]))]
                self.cols.move_to_end((start, int(index[j])))
                full_i[ends[j] - counts[j]:ends[j]] = got[0]
                full_d[ends[j] - counts[j]:ends[j]] = got[1]
                self.reused += int(counts[j])
            c = {**c, "indices": full_i, "data": full_d}
        heavy = np.flatnonzero(sent & (counts >= _CACHE_MIN_NNZ))
        if heavy.size:
            for j in heavy:
                a, b = int(ends[j] - counts[j]), int(ends[j])
                self.cols[(start, int(index[j]))] = (full_i[a:b].copy(), full_d[a:b].copy())
                self.nnz += b - a
            while self.nnz > self.limit and self.cols:
                _, (i, _) = self.cols.popitem(last=False)
                self.nnz -= i.shape[0]
        return c


def _driver_epoch(cols: list, ws: np.ndarray, wt: np.ndarray, b: float, m: int, C: float, gamma: float,
                  update_bias: bool, sigma: float, seed: int, epochs: int = 1, held: _GramCache | None = None,
                  out: np.ndarray | None = None) -> tuple:
    """One DCD epoch in this process over working sets sent by the partitions (:func:`_payload`), from (w, b).
    Returns (dws, its :class:`RoundTotals` (dt, dS, ds, slope, updates), [(block start, coordinates, their
    change), ...]); with ``out``, dws is added into it and is ``out``. A serial working set (``update_bias``,
    ``sigma`` 1) that :func:`_gram_pays` for is solved through its k x k matrix instead (``held``: the Gram matrix
    kept between rounds)."""
    indptr, indices, data, per = _stack(cols)
    a = per["alpha"].copy()
    n = a.shape[0]
    rng = np.array([np.uint64(seed) * np.uint64(2) + np.uint64(1)], dtype=np.uint64)
    if update_bias and sigma == 1.0 and n <= GRAM_MAX and _gram_pays(np.diff(indptr), m):
        got = _gram_epochs(indptr, indices, data, per, a, m, C, gamma, rng, driver_threads(), held, out)
        if got is not None:
            return (*got, _moved(cols, a - per["alpha"]))
    wsl, wtl, bias = ws.copy(), wt.copy(), np.array([b])
    visit = np.arange(n, dtype=np.int64)
    n_upd, left = 0, n
    for _ in range(max(1, int(epochs))):  # ``epochs``: as in _epoch
        left, _, _, upd = dcd_epoch(indptr, indices, data, per["coef"], per["shift"], per["colsum"], per["qii"],
                                    per["rho"], a, C, gamma, wsl, wtl, float(m), bias, update_bias, visit, left,
                                    np.zeros(2), rng, _VISIT_ORDER, sigma)
        n_upd += upd
        if upd == 0 or left == 0:
            break
    d = a - per["alpha"]
    dws = wsl  # the epoch's w becomes its change, in place: no n_samples temporaries (16 MB each at 2M samples)
    dws -= ws
    dws /= sigma
    sc = RoundTotals(dt=float((wtl[0] - wt[0]) / sigma), dS=float((wtl[1] - wt[1]) / sigma), ds=float(d.sum()),
                     slope=float((per["g"] - per["rho"]) @ d), updates=float(n_upd))
    if out is not None:
        out += dws
        dws = out
    return dws, sc, _moved(cols, d)


def _stack(cols: list) -> tuple:
    """The working sets ``cols`` (:func:`_payload`) as one CSC set (indptr, indices, data) and their per-coordinate
    numbers (float64)."""
    counts = np.concatenate([c["counts"] for c in cols])
    indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    indices = np.concatenate([c["indices"] for c in cols])
    data = np.concatenate([c["data"] for c in cols])
    per = {k: np.concatenate([c[k] for c in cols]).astype(np.float64) for k in ("coef", "shift", "colsum", "qii",
                                                                                   "rho", "alpha", "g")}
    per["feature"] = np.concatenate([c["start"] + c["index"] for c in cols]).astype(np.int64)
    return indptr, indices, data, per


def _moved(cols: list, d: np.ndarray) -> list:
    """[(block start, its coordinates that moved, their change), ...] for the working sets ``cols``."""
    dal, at = [], 0
    for c in cols:
        k = c["index"].shape[0]
        dc = d[at:at + k]
        keep = dc != 0.0
        dal.append((c["start"], c["index"][keep], dc[keep]))
        at += k
    return dal


def _gram_pays(counts: np.ndarray, m: float) -> bool:
    """Whether columns of ``counts`` nonzeros over ``m`` rows are expected (rows drawn independently) to share at
    most _GRAM_PAIRS pairs of nonzeros in a row per nonzero: checked before their nonzeros are copied together.

    The Gram matrix costs about what an epoch over the nonzeros does, plus a term a pair, and the working-set solve
    it makes exact saves rounds (a gradient pass each; docs/measurements.md, "MMFS's solver")."""
    c = counts.astype(np.float64)
    n = float(c.sum())
    return (n * n - float(c @ c)) / (2.0 * max(float(m), 1.0)) <= _GRAM_PAIRS * n


class _GramCache:
    """The raw Gram matrix X^T X of the last working set solved through it, by feature (global index): a working
    set within that one reads its rows and columns from it (the data does not change between rounds; a support
    stays the working set of round after round)."""

    def __init__(self):
        self.keys = np.zeros(0, dtype=np.int64)
        self.G = np.zeros((0, 0))
        self.hits = 0

    def get(self, keys: np.ndarray) -> np.ndarray | None:
        if not self.keys.size:
            return None
        pos = np.minimum(np.searchsorted(self.keys, keys), self.keys.size - 1)
        if not (self.keys[pos] == keys).all():
            return None
        self.hits += 1
        return self.G[np.ix_(pos, pos)]

    def put(self, keys: np.ndarray, G: np.ndarray) -> None:
        order = np.argsort(keys)
        self.keys, self.G = keys[order], G[np.ix_(order, order)]


def _gram_epochs(indptr, indices, data, per: dict, a: np.ndarray, m: int, C: float, gamma: float,
                 rng: np.ndarray, threads: int = 1, held: _GramCache | None = None, out: np.ndarray | None = None
                 ) -> tuple[np.ndarray, RoundTotals] | None:
    """The serial working-set subproblem (the bias moving) solved through its k x k matrix: Q = F^T F + gamma
    1 1^T from the columns' Gram matrix (:func:`column_gram`), then DCD on Q (:func:`dense_dcd`) from the round's
    exact gradient ``per["g"]`` to a projected-gradient span of 1e-9 times the start's, and w's change made once
    from the coordinates' change (:func:`add_columns`); both sweeps over the nonzeros on ``threads`` threads, a
    range of rows each; ``held``: the Gram matrix kept from an earlier round. ``a`` (alpha's working copy) is updated
    in place. None (the caller runs its epochs over the nonzeros) when the columns share, in a thread's rows, more
    than twice the pairs of nonzeros in a row that :func:`_gram_pays` allowed.

    An epoch over the nonzeros reads each column twice (its dot with w, then w's update); the Gram matrix costs
    about one such epoch, after which an epoch costs k^2 flops. Epochs over the nonzeros kept the workers waiting
    on the driver and left the subproblem unsolved, a round more to the gap than through Q
    (docs/measurements.md, "MMFS's solver")."""
    k = a.shape[0]
    F = None if held is None else held.get(per["feature"])
    if F is None:
        limit = 2 * _GRAM_PAIRS * int(indptr[-1])  # the estimate's pairs, twice over
        parts: dict = {}

        def gram(r0: int, r1: int) -> None:
            G = np.zeros((k, k))
            parts[r0] = (G, column_gram(indptr, indices, data, r0, r1, limit, G))

        in_threads(gram, int(m), threads)
        if not all(ok for _, ok in parts.values()):
            return None
        F = sum(G for G, _ in parts.values())
        F = np.triu(F) + np.triu(F, 1).T  # the pairs went to the upper triangle (a row's columns in increasing order)
        if held is not None:
            held.put(per["feature"], F)  # a copy, in the order of the features
    coef, shift, colsum = per["coef"], per["shift"], per["colsum"]
    if shift.any():  # f_j = coef_j (x_j - shift_j 1)
        F -= np.outer(colsum, shift)
        F -= np.outer(shift, colsum)
        F += float(m) * np.outer(shift, shift)
    F *= np.outer(coef, coef)
    np.fill_diagonal(F, per["qii"])  # the geometry's own sums of squares (centred where standardized)
    F += gamma
    grad = per["g"] - per["rho"]
    a0 = per["alpha"]
    pg = np.where(a0 <= 0.0, np.minimum(grad, 0.0), np.where(a0 >= C, np.maximum(grad, 0.0), grad))
    tol = 1e-9 * float(pg.max(initial=0.0) - pg.min(initial=0.0))
    _, n_upd, _ = dense_dcd(F, grad, a, C, rng, max(10, min(1000, _GRAM_FLOPS // max(k * k, 1))), tol)
    d = a - a0
    dc = d * coef
    dws = buffer(int(m), zero=True) if out is None else out  # the change of ws, or added into ``out``
    in_threads(lambda r0, r1: add_columns(indptr, indices, data, dc, r0, r1, dws[r0:r1]), int(m), threads)
    sc = RoundTotals(dt=-float(dc @ shift), dS=float(dc @ colsum), ds=float(d.sum()),
                     slope=float((per["g"] - per["rho"]) @ d), updates=float(n_upd))
    return dws, sc


def _epochs_over(tl: RoundTotals, cols: list, ws: np.ndarray, wt: np.ndarray, b: float, m: int, C: float,
                 gamma: float, serial: bool, cocoa: bool, sigma: float, seed: int, nnz: int, held: Any, cache: Any,
                 dws: np.ndarray) -> tuple[RoundTotals, list]:
    """The epochs over the working sets ``cols`` (:func:`~dufs.methods.mmfs.gram._driver_epoch`): one serial
    epoch over all of them (``serial``, the bias moving), else one a partition as the partition would have run it;
    their change of ws added into ``dws``. (``tl`` with their totals added, [(block start, coordinates, their
    change), ...])."""
    from dufs.methods.mmfs.partition import inner_epochs  # the partitions' rule (partition imports this module)

    by: dict = {}
    for c in cols:
        by.setdefault(-1 if serial else c["part"], []).append(c if cache is None else cache.complete(c))
    moved: list = []
    for q, cs in sorted(by.items()):
        reps = inner_epochs(sum(int(c["counts"].sum()) for c in cs), nnz) if serial else 1
        _, sc, dl = _driver_epoch(cs, ws, wt, b, m, C, gamma, serial or cocoa, 1.0 if serial else sigma,
                                  seed + q + 2, reps, held, dws)
        tl = tl + sc
        moved.extend(dl)
    return tl, moved
