"""UFCM's Y = Zc W and labels in a piece of rows a machine (docs/scaling.md, "UFCM's U step in pieces of rows"), where
:mod:`dufs.methods.ufcm.kept` keeps them on one worker.

Kept on one worker, the U step (k-means candidates on Y: the current labels, Lloyd from the current centroids,
``n_init`` random restarts, each judged by its k-means term with its own centroids) is O(n) on one process whatever
the number of machines: what UFCM's scaling misses on once its W step is beside the blocks. Here each machine's
first worker keeps its rows [a_j, b_j) of Y and of the labels, reads them from the Zc W pass's sum where it is held,
and each call runs on every piece at once, its sums over the samples (the clusters' sums and sizes, the k-means
terms, ||Y||^2, the Lloyd steps' changes) all-reduced among the pieces (:func:`~dufs.engine.allreduce_sum`, worker
to worker), so that every piece takes the same decisions from the same bits. A random restart above
``_KMEANS_SAMPLE_ABOVE`` samples is fitted on a sample of rows, which every piece draws alike and gathers (the
driver's sample, row for row), by one piece (the restarts dealt round them), then every piece assigns its rows;
Lloyd on all rows (from the current centroids, and from a winning restart's) runs as sklearn's Lloyd does, each
step's centroids from the all-reduced sums (an empty cluster keeps its centroid, where sklearn moves it to a far
sample). At or below that size Y is gathered whole on every piece and the driver's U step is run as it is. The
labels go to the W step's pass Zc^T U from their pieces, each machine getting the rows its blocks touch
(:class:`~dufs.engine.Pieced`), and joined on the first machine for a pass that needs them whole."""

from __future__ import annotations

import uuid
from typing import Any

import numpy as np

from dufs.engine import (
    AllSum,
    HeldPieces,
    Pieced,
    abort_exchange,
    distinct_workers,
    ensure_plugin,
    fetch_kept,
    joined,
    kept_call,
    kept_calls,
    piece_bounds,
)
from dufs.errors import ParameterError
from dufs.kernels.clusters import cluster_sums, kmeans_term, nearest
from dufs.methods.ufcm.clusters import _choose as _choose_whole
from dufs.methods.ufcm.clusters import _kmeans, _sample_centres, _sample_rows, _sampled
from dufs.methods.ufcm.kept import KeptY, _codes, _finish

__all__ = ["PieceY"]

_LLOYD_MAX_ITER = 300  # sklearn's KMeans default
_LLOYD_TOL = 1e-4  # sklearn's: of the mean of the columns' variances


class PieceY(KeptY):
    """:class:`~dufs.methods.ufcm.kept.KeptY`'s calls with Y and the labels in a piece of rows on each of
    ``workers`` (the module docstring)."""

    def __init__(self, workers: list[str], n: int, width: int):
        super().__init__()
        ensure_plugin(self.client)
        self.workers, self.n, self.width = list(workers), int(n), int(width)
        self.bounds = piece_bounds(self.n, len(self.workers))
        self.pieces: list | None = None
        self.peers: list[str] = []
        self.kept_codes: list | None = None

    def _held(self, held: tuple) -> tuple:
        """Where each piece reads its rows of the pass's sum: the piece of a reduce-scatter on its own worker (a
        future each, where the pass left its sum in pieces on the pieces' workers), else the sum kept on its
        worker ((address, token) for every piece); (that, the transform's row, what to keep until the call ends)."""
        out, shift = held
        if isinstance(out, HeldPieces):
            if self.pieces is None and set(out.receivers) == set(self.workers):  # the pieces where the sums are
                self.workers = list(out.receivers)
                self._make()
            if out.receivers == self.peers and out.in_pieces(8 * self.n * self.width):
                return list(out.futures), shift, out
            out = out.whole(self.client)
        if self.pieces is None:
            self._make()
        if not hasattr(out, "key"):  # made here after all (a pass run inline)
            out = self.client.scatter(out, hash=False, workers=[self.workers[0]])
        _, (h,) = kept_call(self.client, _hold, out, keep=1)
        return [(h.address, h.token)] * len(self.pieces), shift, h

    def _make(self) -> None:
        self.bounds = piece_bounds(self.n, len(self.workers))
        calls = [(j, (self.bounds[j], self.bounds[j + 1]), self.n) for j in range(len(self.workers))]
        self.pieces = [h[0] for _, h in kept_calls(self.client, _make, calls, keep=1, where=self.workers)]
        self.peers = distinct_workers(self.pieces)

    def _call(self, what: str, *args: Any, keep: int = 0, each: list | None = None) -> list:
        """``what`` on every piece at once, its all-reduces under a fresh token (given up on the others where one
        fails, so that none waits); ``each``: a first argument of each piece's own."""
        token = uuid.uuid4().hex
        calls = [(p, what, token, j, self.peers, *([] if each is None else [each[j]]), *args)
                 for j, p in enumerate(self.pieces)]
        try:
            return kept_calls(self.client, _run, calls, keep=keep)
        except BaseException:
            abort_exchange(self.client, token, self.peers)
            raise

    def _with_codes(self, got: list) -> Any:
        self.kept_codes = [kept[0] for _, kept in got]
        return got[0][0]

    def new_y(self, held: tuple, mW: np.ndarray | None, G: np.ndarray | None = None) -> tuple:
        at, shift, h = self._held(held)
        got = self._call("new_y", shift, mW, G, each=at)
        del h
        return got[0][0]

    def start(self, k: int, starts: list[int], seed: int) -> tuple:
        return self._with_codes(self._call("start", k, starts, seed, keep=1))

    def u_step(self, k: int, C: np.ndarray, s1: int, starts: list[int]) -> tuple:
        return self._with_codes(self._call("u_step", k, C, s1, starts, keep=1))

    def rebuild(self, held: tuple, mW: np.ndarray | None, C: np.ndarray) -> tuple:
        """The pieces made afresh on the machines there are now (a worker left): Y's rows from the pass's sum, the
        labels from the centroids ``C``; (||Y||^2, the k-means term)."""
        from dufs.engine import piece_workers

        workers = piece_workers(self.client, self.n)
        if len(workers) > 1:
            self.workers, self.bounds = workers, piece_bounds(self.n, len(workers))
        self.pieces = None
        at, shift, h = self._held(held)
        got = self._with_codes(self._call("rebuild", shift, mW, np.ascontiguousarray(C, dtype=np.float64), keep=1,
                                          each=at))
        del h
        return got

    def codes(self, pieced: bool = False) -> Any:
        """A future of the labels' int32 codes joined on the first machine, for the pass Zc^T U; ``pieced``: left
        in their pieces for a pass over the blocks (:class:`~dufs.engine.Pieced`: each machine gets the rows its
        blocks touch)."""
        if pieced:
            return Pieced(self.kept_codes, self.bounds, _join, self.peers[0])
        return joined(self.client, self.kept_codes, _join, self.peers[0])

    def result(self) -> np.ndarray:
        """The labels (int32), a piece at a time into one array: no second copy of them here at once."""
        out = np.empty(self.n, dtype=np.int32)
        for j, p in enumerate(self.pieces):
            out[self.bounds[j]:self.bounds[j + 1]] = kept_call(self.client, _run, p, "labels", "", j, self.peers)[0]
        return out

    def gram(self, held: tuple, mW: np.ndarray | None) -> np.ndarray:  # the PCA start stays on one worker
        raise ParameterError("ufcm: the PCA start's block is kept on one worker (KeptY), not in pieces")


def _hold(x):
    return None, [np.asarray(x)]


def _join(*parts):
    return np.concatenate(parts)


# ---------------------------------------------------------------------------------------------------- on a worker
class _Piece:
    """A piece's rows [a, b) of Y and of the labels (of n samples)."""

    def __init__(self, rank: int, rows: tuple[int, int], n: int):
        self.rank, self.rows, self.n = rank, rows, n
        self.Y: np.ndarray | None = None
        self.labels: np.ndarray | None = None
        self.allsum: AllSum | None = None


def _make(rank, rows, n):
    return None, [_Piece(rank, rows, n)]


def _read(s: _Piece, at: Any, shift: Any, mW: Any) -> None:
    """Y's rows of this piece: its piece of the pass's sum (made here by the reduce-scatter), or its rows of the
    sum kept under ``at`` = (address, token)."""
    if isinstance(at, np.ndarray):
        rows = at
    else:
        a, b = s.rows
        (rows,) = fetch_kept([(at[0], at[1], a, b)])
    s.Y = _finish(rows, shift, mW)


def _new_y(s, at, shift, mW, G):
    _read(s, at, shift, mW)
    parts = [np.einsum("ij,ij->", s.Y, s.Y)]
    if G is not None and s.labels is not None:
        parts.append(kmeans_term(s.Y, s.labels, np.ascontiguousarray(G.T, dtype=np.float64)))
    tot = s.allsum(np.asarray(parts))
    return (float(tot[0]), float(tot[1]) if len(parts) > 1 else None), []


def _rebuild(s, at, shift, mW, C):
    _read(s, at, shift, mW)
    s.labels = nearest(s.Y, C).astype(np.int64)
    tot = s.allsum([np.einsum("ij,ij->", s.Y, s.Y), kmeans_term(s.Y, s.labels, C)])
    return (float(tot[0]), float(tot[1])), [_codes(s.labels)]


def _start(s, k, starts, seed):
    km = _choose(s, k, [], starts, seed)[0]
    C, counts = _own_centroids(s, s.labels, k)
    return (C, counts, km), [_codes(s.labels)]


def _u_step(s, k, C, s1, starts):
    km, chosen = _choose(s, k, [s.labels, ("lloyd", np.ascontiguousarray(C, dtype=np.float64), s1)], starts, s1)
    counts = s.allsum(np.bincount(s.labels, minlength=k).astype(np.float64))
    return (km, chosen, counts), [_codes(s.labels)]


def _labels(s):
    return s.labels.astype(np.int32), []


_CALLS = {"new_y": _new_y, "rebuild": _rebuild, "start": _start, "u_step": _u_step, "labels": _labels}


def _run(s: _Piece, what: str, token: str, rank: int, peers: list[str], *args: Any) -> tuple:
    fn = _CALLS.get(what)
    if fn is None:
        raise ParameterError(f"ufcm piece of Y: unknown call {what!r}")
    s.allsum = AllSum(token, rank, peers)
    try:
        return fn(s, *args)
    finally:
        s.allsum = None


# ---------------------------------------------------------------------------------------------------- the U step
def _own_centroids(s: _Piece, labels: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    S, counts = cluster_sums(s.Y, labels, k)
    tot = s.allsum(np.concatenate([S.ravel(), counts]))
    S, counts = tot[:S.size].reshape(S.shape), tot[S.size:]
    with np.errstate(invalid="ignore", divide="ignore"):
        C = S / counts[:, None]
    return C, counts


def _own_term(s: _Piece, labels: np.ndarray, k: int) -> tuple[float | None, np.ndarray]:
    """:func:`dufs.methods.ufcm.clusters._own_term` over the pieces, with the centroids."""
    C, counts = _own_centroids(s, labels, k)
    if counts.min() == 0:
        return None, C
    return float(s.allsum([kmeans_term(s.Y, labels, np.ascontiguousarray(C))])[0]), C


def _choose(s: _Piece, k: int, fixed: list, starts: list[int], seed: int) -> tuple[float, int]:
    """:func:`dufs.methods.ufcm.clusters._choose` over the pieces; the labels chosen kept in ``s``; (the term, the
    candidate's index)."""
    a, b = s.rows
    if not _sampled(s.n):  # Y whole on every piece: the driver's U step as it is
        Y = s.allsum.gather(s.Y)
        whole = []
        for f in fixed:
            if isinstance(f, tuple):
                whole.append(lambda f=f: _kmeans(Y, k, f[1], f[2]))
            else:
                whole.append(s.allsum.gather(f.astype(np.float64)[:, None])[:, 0].astype(np.int64))
        labels, km, j = _choose_whole(Y, k, whole, starts, seed)
        s.labels = np.ascontiguousarray(labels[a:b])
        return km, j
    best, best_v, best_j, best_C = None, np.inf, -1, None
    cands = [(lambda f=f: f) if not isinstance(f, tuple) else (lambda f=f: _lloyd(s, f[1], k)) for f in fixed]
    cands += [lambda C=C: nearest(s.Y, C).astype(np.int64) for C in _sampled_centres(s, k, starts)]
    for j, make in enumerate(cands):
        lab = make()
        v, C = _own_term(s, lab, k)
        if v is not None and v < best_v:
            best, best_v, best_j, best_C = lab, v, j, C
    if best is None:
        raise ParameterError(f"k-means left a cluster empty in every candidate: n_clusters = {k} is too many for "
                             f"these data")
    if best_j >= len(fixed):  # a sampled restart won: Lloyd on all rows from its centroids, kept if not worse
        lab = _lloyd(s, best_C, k)
        v, _ = _own_term(s, lab, k)
        if v is not None and v <= best_v:
            best, best_v = lab, v
    s.labels = best
    return best_v, best_j


def _sampled_centres(s: _Piece, k: int, starts: list[int]) -> list[np.ndarray]:
    """The centres of :func:`dufs.methods.ufcm.clusters._kmeans` 's sampled random starts: each start's sample of
    rows (drawn alike on every piece, gathered in row order: the driver's sample), its k-means++ and Lloyd run by
    one piece (the starts dealt round the pieces), the centres then all-reduced to every piece."""
    a, b = s.rows
    W, p = len(s.allsum.peers), s.Y.shape[1]
    out = np.zeros((len(starts), k, p))
    for i, seed in enumerate(starts):
        pick = _sample_rows(s.n, seed)
        Ys = s.allsum.gather(s.Y[pick[(pick >= a) & (pick < b)] - a])
        if i % W == s.allsum.rank:
            out[i] = _sample_centres(Ys, k, seed)
    out = s.allsum(out) if len(starts) else out
    return [np.ascontiguousarray(C) for C in out]


def _lloyd(s: _Piece, C0: np.ndarray, k: int) -> np.ndarray:
    """Lloyd's iterations on all rows from the centroids ``C0``, as sklearn's (stopped when no label changes or the
    centroids move by at most 1e-4 of the mean of the columns' variances; the labels assigned to the last
    centroids), each step's centroids from the all-reduced sums; this piece's labels."""
    Y = s.Y
    p = Y.shape[1]
    m = s.allsum(np.concatenate([Y.sum(axis=0), [float(Y.shape[0])]]))
    mean = m[:p] / m[p]
    var = s.allsum(((Y - mean) ** 2).sum(axis=0)) / m[p]
    tol = float(np.mean(var)) * _LLOYD_TOL
    C = np.ascontiguousarray(C0, dtype=np.float64).copy()
    old = None
    strict = False
    for _ in range(_LLOYD_MAX_ITER):
        lab = nearest(Y, C).astype(np.int64)
        S, counts = cluster_sums(Y, lab, k)
        changed = float(Y.shape[0]) if old is None else float(np.count_nonzero(lab != old))
        tot = s.allsum(np.concatenate([S.ravel(), counts, [changed]]))
        S, counts, changed = tot[:S.size].reshape(S.shape), tot[S.size:S.size + k], tot[-1]
        new = C.copy()
        full = counts > 0
        new[full] = S[full] / counts[full, None]  # an empty cluster keeps its centroid
        shift = float(((new - C) ** 2).sum())
        C = new
        if changed == 0:
            strict = True
            break
        if shift <= tol:
            break
        old = lab
    return lab if strict else nearest(Y, C).astype(np.int64)
