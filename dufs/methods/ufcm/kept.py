"""UFCM's vectors over the samples kept on one worker (:mod:`dufs.engine.kept`; workers on several machines).

An iteration of UFCM made Y = Zc W (n x d') and the U step's k-means on the driver: Y came back through its link
(the partitions' sum), the labels went out again for Zc^T U, and the k-means runs (1 + n_init candidates) were
O(n d' c) of its CPU, whatever the number of machines. Here Y and the labels stay in the memory of the worker that
keeps them: the pass Zc W leaves its sum where it was made (``Matrix.matvec(hold=True)``), the centring and the
U step (:func:`~dufs.methods.ufcm.clusters._choose`, the same candidates from the same seeds) run there, the
labels go to the pass Zc^T U as a future, and the driver gets the clusters' sizes, the k-means term, the centroids
(c x d') and ||Y||^2. The same functions in the same order: the run is the driver's, bit for bit. The labels come
to the driver once, at the end (the result)."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from dufs._logging import get_logger
from dufs.engine import HeldPieces, as_future, current_client, fetch, is_lost, kept_call
from dufs.kernels.blockops import col_sums, tall_gram
from dufs.kernels.clusters import nearest
from dufs.methods.ufcm.clusters import _centroids, _choose, _km_term, _kmeans

__all__ = ["KeptY"]

log = get_logger(__name__)


class KeptY:
    """Y = Zc W and the labels on one worker (see the module docstring)."""

    def __init__(self) -> None:
        self.client = current_client()
        self.Y: Any = None
        self.labels: Any = None  # (int64 for k-means, int32 codes for the pass)

    def _future(self, held: tuple) -> tuple:
        """A held pass's (sum, transform's row) with the sum a future (sent from here where the pass ran inline)."""
        out, shift = held
        if isinstance(out, HeldPieces):  # left in pieces over the machines: joined on the first
            return out.whole(self.client), shift
        return (out if hasattr(out, "key") else self.client.scatter(out, hash=False)), shift

    def new_y(self, held: tuple, mW: np.ndarray | None, G: np.ndarray | None = None) -> tuple:
        """Y from the pass's held sum ``held`` (``Matrix.matvec(hold=True)``: its future and the transform's row)
        less ``mW`` (the centring: m^T W), kept in place of the last; (||Y||^2, the k-means term of the labels kept
        with centroids ``G^T``), the term None without ``G``."""
        out, shift = self._future(held)
        c = self.client
        lab = None if self.labels is None else self.labels[0]
        (yy, km), (self.Y,) = kept_call(c, _new_y, out, shift, mW, lab, G, keep=1)
        return yy, km

    def gram(self, held: tuple, mW: np.ndarray | None) -> np.ndarray:
        """The PCA start's T = Zc V kept (as Y is: :meth:`new_y`, in its place), T^T T back."""
        out, shift = self._future(held)
        c = self.client
        G, (self.Y,) = kept_call(c, _gram, out, shift, mW, keep=1)
        return G

    def times(self, R: np.ndarray) -> tuple:
        """T R kept beside T: (a future of it, its column sums) for the pass Zc^T (T R)."""
        sums, (TR,) = kept_call(self.client, _times, self.Y, R, keep=1)
        return as_future(self.client, TR), sums

    def start(self, k: int, starts: list[int], seed: int) -> tuple:
        """The first U step on Y (:func:`_choose` of k-means runs alone): (centroids, sizes, k-means term of the
        centroids' own)."""
        (C, counts, km), (lab, codes) = kept_call(self.client, _start, self.Y, k, starts, seed, keep=2)
        self.labels = (lab, codes)
        return C, counts, km

    def u_step(self, k: int, C: np.ndarray, s1: int, starts: list[int]) -> tuple:
        """The U step (eq. (14)) from the labels kept and the centroids ``C``: (term, candidate chosen, sizes)."""
        (km, chosen, counts), (lab, codes) = kept_call(self.client, _u_step, self.Y, self.labels[0], k, C, s1,
                                                       starts, keep=2)
        self.labels = (lab, codes)
        return km, chosen, counts

    def rebuild(self, held: tuple, mW: np.ndarray | None, C: np.ndarray) -> tuple:
        """Y and the labels made again after their worker was lost: Y from the pass's held sum (as :meth:`new_y`),
        the labels each sample's nearest of the centroids ``C`` (c x d'), which do not raise the k-means term of the
        labels lost (their centroids' are ``C``): (||Y||^2, the k-means term with ``C``)."""
        out, shift = self._future(held)
        c = self.client
        (yy, km), (self.Y, lab, codes) = kept_call(c, _rebuild, out, shift, mW, C, keep=3)
        self.labels = (lab, codes)
        return yy, km

    def again(self, fn: Any, rebuild: Any = None, *, rerun: bool = True, tries: int = 3) -> Any:
        """``fn()``; where the worker that kept Y (or the PCA start's T) and the labels was lost meanwhile,
        ``rebuild()`` (they are made again on another) and ``fn()`` once more (``rerun``), or what ``rebuild``
        gave; up to ``tries`` times, as the first passes after a loss can meet it again (the scheduler may not
        have removed the dead worker yet)."""
        try:
            return fn()
        except Exception as e:
            if not is_lost(e):
                raise
            log.warning("ufcm: %s; Y and the labels made again on another worker", e)
        for left in range(tries, 0, -1):
            try:
                got = None if rebuild is None else rebuild()
                return fn() if rerun else got
            except Exception as e:
                if not is_lost(e) or left == 1:
                    raise
                log.warning("ufcm: %s; made again once more", e)
        return None  # tries < 1: nothing tried again

    def codes(self, pieced: bool = False) -> Any:
        """A future of the labels' int32 codes, for the pass Zc^T U (``pieced``: read by a pass over the blocks;
        one worker keeps them here, so the same)."""
        return as_future(self.client, self.labels[1])

    def result(self) -> np.ndarray:
        return np.asarray(fetch(self.client, self.labels[0]))


# ---------------------------------------------------------------------------------------------------- on a worker
def _finish(out, shift, mW):
    """As :meth:`_Centred.matvec` finishes Z W: the transform's row less, then the centring's."""
    Y = np.array(out) if shift is None else out - shift[None, :]
    if mW is not None:
        Y -= mW[None, :]
    return Y


def _new_y(out, shift, mW, labels, G):
    Y = _finish(out, shift, mW)
    km = None if G is None else _km_term(Y, labels, G.T)
    return (np.einsum("ij,ij->", Y, Y), km), [Y]


def _gram(out, shift, mW):
    T = _finish(out, shift, mW)
    return tall_gram(T), [T]


def _times(T, R):
    TR = T @ R
    return col_sums(TR), [TR]


def _rebuild(out, shift, mW, C):
    Y = _finish(out, shift, mW)
    yy = np.einsum("ij,ij->", Y, Y)
    labels = nearest(Y, np.ascontiguousarray(C, dtype=np.float64)).astype(np.int64)
    return (yy, _km_term(Y, labels, C)), [Y, labels, _codes(labels)]


def _codes(lab):
    return np.ascontiguousarray(lab, dtype=np.int32)


def _start(Y, k, starts, seed):
    labels, _, _ = _choose(Y, k, [], starts, seed)
    C, counts = _centroids(Y, labels, k)
    return (C, counts, _km_term(Y, labels, C)), [labels, _codes(labels)]


def _u_step(Y, labels, k, C, s1, starts):
    labels, km, chosen = _choose(Y, k, [labels, functools.partial(_kmeans, Y, k, C, s1)], starts, s1)
    counts = np.bincount(labels, minlength=k).astype(np.float64)
    return (km, chosen, counts), [labels, _codes(labels)]
