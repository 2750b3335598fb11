"""UFCM's U step: k-means candidates on the projection Y = Zc W (the current partition, Lloyd from the current
centroids, restarts), each judged by the k-means term with its own centroids."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from dufs.errors import ParameterError
from dufs.kernels.clusters import cluster_means, kmeans_term, nearest
from dufs.scheduling import results_in_threads, thread_limits

_KMEANS_SAMPLE_ABOVE = 1 << 17  # samples above which a random k-means start is first fitted on a sample


# rows of that sample: 2^14 made a start faster than 2^15, its candidates as good (docs/measurements.md, "UFCM's
# k-means")
_KMEANS_SAMPLE = 1 << 14


# ---------------------------------------------------------------------------------------------------- pieces
def _centroids(Y: np.ndarray, labels: np.ndarray, c: int) -> tuple[np.ndarray, np.ndarray]:
    """Centroids (c x d') of the clusters of Y and their sizes (eq. (10) for one U): one sweep over Y."""
    return cluster_means(np.ascontiguousarray(Y, dtype=np.float64), np.asarray(labels, dtype=np.int64), int(c))


def _km_term(Y: np.ndarray, labels: np.ndarray, C: np.ndarray) -> float:
    """||Y - U G^T||_F^2 with G^T = C: one sweep over Y, no n x d' temporary."""
    return float(kmeans_term(np.ascontiguousarray(Y, dtype=np.float64), np.asarray(labels, dtype=np.int64),
                             np.ascontiguousarray(C, dtype=np.float64)))


def _kmeans(Y: np.ndarray, c: int, init: Any, seed: int, *, refine: bool = True) -> np.ndarray:
    """Labels of one k-means run on Y (Lloyd, in this process: Y is n x d' with n x max(d', c) x 8 bytes within
    ``dufs.engine.max-task-bytes``), from ``init`` (centroids, c x d') or "k-means++". One OpenMP thread (the
    runs of a U step go side by side in threads instead: :func:`_in_threads`); BLAS is held to one thread by the
    caller. A random start on more than ``_KMEANS_SAMPLE_ABOVE`` rows runs k-means++ and Lloyd on a uniform sample
    of ``_KMEANS_SAMPLE`` rows first; ``refine`` False then stops at one assignment of all rows to the sample's
    centres (:func:`_choose` refines the candidate that wins)."""
    from sklearn.cluster import KMeans

    # one thread: on an n x d' problem this small OpenMP's spin-waits cost more than they give (docs/measurements.md,
    # "UFCM's k-means"). OpenMP's thread count is per calling thread, so this holds in a pool's thread too
    with thread_limits(1, "openmp"):
        if isinstance(init, str) and _sampled(Y.shape[0]):
            init = _sample_centres(Y[_sample_rows(Y.shape[0], seed)], c, seed)
            if not refine:
                return nearest(np.ascontiguousarray(Y, dtype=np.float64), np.ascontiguousarray(init, dtype=np.float64))
        km = KMeans(n_clusters=c, init=init, n_init=1, random_state=seed, algorithm="lloyd")
        km.fit(Y)
    return km.labels_.astype(np.int64)


def _sampled(n: int) -> bool:
    """Whether a random start on ``n`` rows is fitted on a sample of them (:func:`_kmeans`)."""
    return n > _KMEANS_SAMPLE_ABOVE


def _sample_rows(n: int, seed: int) -> np.ndarray:
    """The rows (sorted) that a random start seeded by ``seed`` is fitted on."""
    return np.sort(np.random.default_rng(seed).choice(n, size=_KMEANS_SAMPLE, replace=False))


def _sample_centres(Ys: np.ndarray, c: int, seed: int) -> np.ndarray:
    """k-means++ and Lloyd on the sample's rows ``Ys``: the start's centres (one OpenMP thread)."""
    from sklearn.cluster import KMeans

    with thread_limits(1, "openmp"):
        return KMeans(n_clusters=c, init="k-means++", n_init=1, random_state=seed, algorithm="lloyd").fit(
            Ys).cluster_centers_


def _choose(Y: np.ndarray, c: int, fixed: list[Any], starts: list[int], seed: int) -> tuple[np.ndarray, float, int]:
    """The U step's choice (eq. (14)): the best by the k-means term (each candidate with its own centroids) of the
    ``fixed`` candidates (label vectors, or functions of no argument that make one) and of k-means runs from
    k-means++ starts seeded by ``starts``; returns (labels, term, index of the candidate chosen).

    On more than ``_KMEANS_SAMPLE_ABOVE`` rows a random start is fitted on a sample of rows and judged after one
    assignment of all rows to its centres; the one chosen, if a random start wins, then runs Lloyd on all rows
    from its own centroids (kept when it lowers the term, which it does not raise in theory). The term only falls
    from the judged one, so the step never increases it, and one Lloyd run on all rows is made instead of one a
    start (docs/measurements.md, "UFCM's k-means")."""
    sampled = _sampled(Y.shape[0])
    calls = [f if callable(f) else (lambda f=f: f) for f in fixed] + [
        functools.partial(_kmeans, Y, c, "k-means++", s, refine=not sampled) for s in starts]
    labels, km, j = _best_partition(Y, c, results_in_threads([functools.partial(_judged, Y, c, f) for f in calls]))
    if sampled and j >= len(fixed):
        lab = _kmeans(Y, c, _centroids(Y, labels, c)[0], seed)
        v = _own_term(Y, lab, c)
        if v is not None and v <= km:
            labels, km = lab, v
    return labels, km, j


def _own_term(Y: np.ndarray, labels: np.ndarray, c: int) -> float | None:
    """The k-means term of a partition with its own centroids; None when a cluster is empty (an empty cluster
    makes (U^T U)^-1 undefined)."""
    C, counts = _centroids(Y, labels, c)
    return None if counts.min() == 0 else _km_term(Y, labels, C)


def _judged(Y: np.ndarray, c: int, call: Any) -> tuple[np.ndarray, float | None]:
    """A candidate made by ``call`` and its k-means term (:func:`_own_term`), in the thread that made it."""
    lab = call()
    return lab, _own_term(Y, lab, c)


def _best_partition(Y: np.ndarray, c: int, candidates: Any) -> tuple[np.ndarray, float, int]:
    """The candidate of smallest k-means term (each with its own centroids); ties keep the earlier one.
    ``candidates``: (labels, term or None) pairs (:func:`_judged`), perhaps a generator: only the best so far and
    the one at hand are held (n-vectors each)."""
    best, best_v, best_j = None, np.inf, -1
    for j, (lab, v) in enumerate(candidates):
        if v is not None and v < best_v:
            best, best_v, best_j = lab, v, j
    if best is None:
        raise ParameterError(f"k-means left a cluster empty in every candidate: n_clusters = {c} is too many for "
                             f"these data")
    return best, best_v, best_j
