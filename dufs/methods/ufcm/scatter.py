"""UFCM's W step and PCA start: the centred data's scatter S_t = Zc^T Zc as an operator (or dense below a size),
its top directions by subspace iteration, and the largest eigenvectors of S_t - alpha S_w - beta D."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp

from dufs._logging import get_logger
from dufs.engine import Matrix
from dufs.kernels.affine import standardize_rows
from dufs.kernels.blockops import col_sums, tall_gram
from dufs.methods.lowrank import _orth, _residual_norms, _top_dense, _top_lowrank

log = get_logger(__name__)
_LOBPCG_MAXITER = 40  # block iterations of a matrix-free W step
_PCA_MAXITER = 60  # block iterations of the matrix-free PCA start
_PCA_TOL = 1e-3  # its residuals, relative to the largest eigenvalue
_PCA_SAMPLE = 1 << 17  # rows of that sample
_PCA_REFINE = 2  # block iterations on all rows after it
_GRAM_BYTES = 256 << 20  # the n x k slab of columns of Z per chunk when S_t is built densely


# ---------------------------------------------------------------------------------------------------- centred data
class _Centred:
    """Products with Zc = Z - 1 m^T, m the column means of Z (the matrix's own transform, then centred)."""

    def __init__(self, M: Matrix):
        self.M = M
        self.n, self.d = M.shape
        self.centred = M.standardize == "zscore"  # Z centred by construction, exactly, not to rounding
        self._m: np.ndarray | None = None

    @property
    def m(self) -> np.ndarray | None:
        """Z's column means (None where Z is centred by construction), made here when first asked (from the column
        statistics: a path that keeps W in pieces makes its own, :meth:`pieces_m`)."""
        if self.centred:
            return None
        if self._m is None:
            m = np.nan_to_num(self.M.stats.mean(), nan=0.0)
            mu, inv = self.M.transform
            if mu is not None:
                m -= mu
            if inv is not None:
                m *= inv
            self._m = m
        return self._m

    def pieces_m(self) -> np.ndarray | str | None:
        """What W's pieces are given for m: ``"means"`` where Z is X (no transform: each piece makes its features'
        means from its blocks, and the driver holds no statistics), else :attr:`m`."""
        if self._m is None and not self.centred and self.M.standardize is None:
            return "means"
        return self.m

    def matvec(self, V: np.ndarray) -> np.ndarray:
        """Zc V (n x k): one pass."""
        out = self.M.matvec(V)
        if self.m is not None:
            out -= (self.m @ V)[None, :]
        return out

    def matvec_held(self, V: np.ndarray) -> tuple:
        """Zc V left where the pass made it (:meth:`Matrix.matvec` with ``hold``): ((its sum, the transform's
        row), the centring's row m^T V or None), finished by the worker that keeps it
        (:mod:`dufs.methods.ufcm.kept`)."""
        return self.M.matvec(V, hold=True), None if self.m is None else self.m @ V

    def rmatvec(self, T: np.ndarray) -> np.ndarray:
        """Zc^T T (d x k): one pass. The centring is subtracted in place, in slabs of rows (at kddb size a d x k
        temporary is 240 MB a column)."""
        out = self.M.rmatvec(T)
        if self.m is not None:
            self._centre(out, col_sums(T))
        return out

    def rmatvec_kept(self, T: Any, sums: np.ndarray) -> np.ndarray:
        """:meth:`rmatvec` of ``T`` kept on a worker (a future), ``sums`` its column sums (made there)."""
        out = self.M.rmatvec(T, sums=sums)
        if self.m is not None:
            self._centre(out, sums)
        return out

    def _centre(self, out: np.ndarray, s: np.ndarray) -> None:
        """out -= m s^T (s: the column sums of the vectors Z^T was applied to), in place: row by row in one sweep,
        no temporary (:func:`~dufs.kernels.affine.standardize_rows`; the same numbers as NumPy's
        ``out -= m[:, None] * s`` in slabs, which was slower: docs/measurements.md, "UFCM's scatter")."""
        if out.ndim == 1:
            out -= s * self.m
        else:
            standardize_rows(out, self.m, np.ascontiguousarray(s, dtype=np.float64), None)

    def label_rmatvec(self, labels: Any, c: int, counts: np.ndarray) -> np.ndarray:
        """Zc^T U for U the n x c indicator of ``labels`` (d x c), ``counts`` its column sums (the clusters'
        sizes): one pass that ships the labels, not U (:meth:`Matrix.label_rmatvec`); the same numbers as
        :meth:`rmatvec` of U."""
        out = self.M.label_rmatvec(labels, c, counts=counts if hasattr(labels, "key") else None)
        if self.m is not None:
            self._centre(out, counts)
        return out

    def scatter(self) -> np.ndarray:
        """S_t = Zc^T Zc as a dense d x d matrix: two passes per chunk of columns."""
        d, n = self.d, self.n
        from dufs.engine import max_task_bytes

        # Z E is n x k dense: at most _GRAM_BYTES, and half of dufs.engine.max-task-bytes (the pass that takes it
        # also takes its data block)
        k = max(1, min(d, min(_GRAM_BYTES, max_task_bytes() // 2) // max(8 * n, 1)))
        S = np.empty((d, d))
        for a in range(0, d, k):
            E = np.zeros((d, min(k, d - a)))
            E[np.arange(a, a + E.shape[1]), np.arange(E.shape[1])] = 1.0
            S[:, a:a + E.shape[1]] = self.rmatvec(self.matvec(E))
        return 0.5 * (S + S.T)


def _top_scatter(Zc: _Centred, k: int, rng: np.random.Generator, *, tol: float = _PCA_TOL,
                 max_iter: int = _PCA_MAXITER, V0: Start | None = None, side: Any = None
                 ) -> tuple[np.ndarray, np.ndarray, int, bool]:
    """The largest ``k`` eigenpairs of S_t = Zc^T Zc by block subspace iteration with Rayleigh-Ritz: a block of
    k + max(4, k) columns (or ``V0``'s, a start), two passes an iteration (Zc V, then Zc^T of it), which holds two
    d x block arrays and one n x block array (Lanczos over d would hold 20 d-vectors and make two passes per
    vector). Stops when every one of the k residuals ||S v - theta v|| is below ``tol`` times the largest Ritz
    value. With ``side`` (a :class:`~dufs.methods.ufcm.kept.KeptY`) the n x block array stays on the worker that
    keeps it: its Gram matrix and T R made there, T R handed to the pass as a future. Returns (values, vectors,
    products, converged). The same iteration with V's rows in pieces beside the blocks:
    :meth:`~dufs.methods.ufcm.features.FeatureSide.pca`."""
    d = Zc.d
    if V0 is None:
        V0 = random_start(rng, d, min(d, k + max(4, k)))
    b = V0.b
    # in place where the array is ours (a fresh d x b array for each Cholesky QR pass faulted its pages in:
    # docs/measurements.md, "UFCM's scatter")
    V = _orth(V0.rows(0, d), inplace=True)
    products, converged = 0, False
    theta = np.zeros(b)
    for _ in range(max_iter):
        if side is None:
            T = Zc.matvec(V)  # n x b
            G = tall_gram(T)
        else:  # T kept on a worker: only its Gram matrix comes here (made again where its worker was lost)
            Vt = V
            G = side.again(lambda Vt=Vt: side.gram(*Zc.matvec_held(Vt)))
        theta, R = ritz(G)
        V = V @ R  # Ritz vectors
        if side is None:
            S = Zc.rmatvec(T @ R)  # S_t V, d x b
            del T
        else:
            S = side.again(lambda R=R: Zc.rmatvec_kept(*side.times(R)),
                           lambda Vt=Vt: side.gram(*Zc.matvec_held(Vt)))
            del Vt
        products += b
        res = _residual_norms(S, V, theta, k)
        if pca_done(res, theta, tol, products // b):
            converged = True
            break
        del V
        V = _orth(S, inplace=True)
        del S
    return theta[:k], V[:, :k], products, converged


def ritz(G: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The Rayleigh-Ritz step of the PCA start from T's Gram matrix: its eigenvalues, largest first, and
    eigenvectors (C order: the reversed view is taken by matmul in another order, on each side alike)."""
    theta, R = np.linalg.eigh(0.5 * (G + G.T))
    return theta[::-1], np.ascontiguousarray(R[:, ::-1])


def pca_done(res: np.ndarray, theta: np.ndarray, tol: float, it: int) -> bool:
    """Whether every one of the PCA start's residuals is below ``tol`` times its largest Ritz value (logged)."""
    top = max(abs(theta[0]), np.finfo(float).tiny)
    log.info("ufcm: PCA start, block iteration %d: top eigenvalues %s, largest relative residual %.3g", it,
             np.array2string(theta[:res.size], precision=6), float(res.max()) / top)
    return bool(np.all(res <= tol * top))


_NORMAL_CHUNK = 1 << 16  # rows of a start's random columns made from one stream


def normal_rows(seed: int, lo: int, hi: int, w: int) -> np.ndarray:
    """Rows ``lo:hi`` of a standard normal matrix of ``w`` columns fixed by ``seed``: each chunk of
    ``_NORMAL_CHUNK`` rows from its own stream, so that a piece of features makes its rows of a start without
    the others' (:mod:`dufs.methods.ufcm.features`), the same numbers as the driver's whole start."""
    out = np.empty((max(hi - lo, 0), w))
    c = lo // _NORMAL_CHUNK
    while c * _NORMAL_CHUNK < hi:
        a, b = max(lo, c * _NORMAL_CHUNK), min(hi, (c + 1) * _NORMAL_CHUNK)
        R = np.random.default_rng([seed, c]).standard_normal((_NORMAL_CHUNK, w))
        out[a - lo:b - lo] = R[a - c * _NORMAL_CHUNK:b - c * _NORMAL_CHUNK]
        c += 1
    return out


@dataclass
class Start:
    """The PCA start's first block V0 (d x b) without forming it: its first ``E.shape[1]`` columns ``E`` on the
    features ``cols`` (a sample's eigenvectors; zero elsewhere), the others standard normal (:func:`normal_rows`
    of ``seed``). :meth:`rows` makes any rows of it, :meth:`block` the part of it a block of features needs."""

    seed: int
    b: int
    cols: np.ndarray
    E: np.ndarray

    def rows(self, lo: int, hi: int) -> np.ndarray:
        kk = self.E.shape[1]
        V = np.zeros((hi - lo, self.b))
        if kk < self.b:
            V[:, kk:] = normal_rows(self.seed, lo, hi, self.b - kk)
        if kk:
            a, z = np.searchsorted(self.cols, [lo, hi])
            V[self.cols[a:z] - lo, :kk] = self.E[a:z]
        return V

    def block(self, lo: int, hi: int) -> Start:
        a, z = np.searchsorted(self.cols, [lo, hi])
        return Start(self.seed, self.b, self.cols[a:z], self.E[a:z])


def random_start(rng: np.random.Generator, d: int, b: int) -> Start:
    """A start of ``b`` standard normal columns, its seed drawn from ``rng``."""
    return Start(int(rng.integers(0, 2**31 - 1)), b, np.zeros(0, dtype=np.int64), np.zeros((0, 0)))


def _w_step(Zc: _Centred, St: np.ndarray | None, Q: np.ndarray, counts: np.ndarray, Dd: np.ndarray,
            active: np.ndarray, k: int, alpha: float, beta: float, *, tol: float = 0.0, v0: Any = None,
            X0: Any = None, q_scaled: bool = False, out: np.ndarray | None = None
            ) -> tuple[np.ndarray, np.ndarray, int]:
    """The largest ``k`` eigenpairs of A = (1 - alpha) S_t + alpha Q diag(1/n_k) Q^T - beta D on the ``active``
    features (the others held at zero): dense when ``St`` is given, else matrix-free with two passes per product:
    LOBPCG on blocks warm-started from ``X0`` (the previous W on the active features; its Rayleigh-Ritz step keeps
    trace(W^T A W) at least the start's, so the objective stays monotone), or Lanczos (``eigsh``) without ``X0``.
    ``X0`` may also be the previous W over all features: it is then sliced only if LOBPCG runs (at kddb size the
    slice is a d x k copy the secular solve does not need). ``q_scaled``: ``Q`` is already Q diag(1/sqrt(n_k)) (the
    caller scaled it in place: no second d x c array).
    Returns (eigenvalues descending, W (d x k), products made)."""
    d = Zc.d
    Qs = Q if q_scaled else Q / np.sqrt(counts)[None, :]
    idx = np.flatnonzero(active)
    if St is not None:
        A = (1.0 - alpha) * St[np.ix_(idx, idx)] + alpha * (Qs[idx] @ Qs[idx].T)
        A[np.diag_indices_from(A)] -= beta * Dd[idx]
        vals, V = _top_dense(A, k)
        return vals, _on_features(d, idx, V, out), 0
    from scipy.sparse.linalg import LinearOperator, eigsh

    nprod = [0]
    Qa, Da = (Qs, Dd) if idx.size == d else (Qs[idx], Dd[idx])  # no copy when every feature is active
    if alpha == 1.0:  # A = Q diag(1/n_k) Q^T - beta D: a diagonal plus rank c, solved without passes
        got = _top_lowrank(Qa, beta * Da, k)
        if got is not None:
            return got[0], _on_features(d, idx, got[1], out), 0
    if X0 is not None and X0.shape[0] != idx.size:  # the previous W over all features
        X0 = X0[idx]

    def apply(X: np.ndarray) -> np.ndarray:
        X = np.asarray(X, dtype=np.float64)
        one = X.ndim == 1
        X2 = X[:, None] if one else X
        nprod[0] += X2.shape[1]
        out = Qa @ (Qa.T @ X2)
        if alpha != 1.0:  # the scatter's part, two passes over the data from all features' rows
            full = np.zeros((d, X2.shape[1]))
            full[idx] = X2
            out *= alpha
            out += (1.0 - alpha) * Zc.rmatvec(Zc.matvec(full))[idx]
            del full
        # alpha = 1 (the default) needs no d x p array of all features: at kddb size that one, made for every
        # product and not used, was part of the driver's peak (docs/measurements.md, "UFCM's scatter")
        out -= beta * Da[:, None] * X2
        return out[:, 0] if one else out

    op = LinearOperator((idx.size, idx.size), matvec=apply, matmat=apply, dtype=np.float64)
    if X0 is not None:
        import warnings

        from scipy.sparse.linalg import lobpcg

        # a block of k + a few columns: each LOBPCG iteration is one block product (two passes), against one
        # pass pair per vector for Lanczos (docs/measurements.md, "UFCM's scatter")
        rng = np.random.default_rng(0)
        extra = min(max(2, k // 2), max(0, idx.size - k))
        X = np.hstack([X0, rng.standard_normal((idx.size, extra))]) if extra else np.array(X0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "not reaching the requested tolerance": the best block is kept
            vals, V = lobpcg(op, X, largest=True, tol=tol or 1e-6, maxiter=_LOBPCG_MAXITER)
        order = np.argsort(-vals)[:k]
        return vals[order], _on_features(d, idx, V[:, order], out), nprod[0]
    vals, V = eigsh(op, k=k, which="LA", tol=tol, v0=v0)
    order = np.argsort(-vals)
    return vals[order], _on_features(d, idx, V[:, order], out), nprod[0]


def _on_features(d: int, idx: np.ndarray, V: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """W (d x k): ``V``'s rows on the features ``idx``, zero elsewhere (``V`` itself, contiguous, when ``idx`` is
    every feature: no second d x k array at kddb size), written into ``out`` (an array the caller is done with, of
    that shape) when given: a fresh d x k array's pages fault in, which costs several times rewriting one
    (docs/measurements.md, "UFCM's scatter")."""
    if idx.size == d:
        return np.ascontiguousarray(V)
    if out is not None and out.shape == (d, V.shape[1]) and out.dtype == np.float64 and out.flags.c_contiguous \
            and out.flags.writeable and not np.shares_memory(out, V):
        out.fill(0.0)
        out[idx] = V
        return out
    W = np.zeros((d, V.shape[1]))
    W[idx] = V
    return W


def _rows_take(X: Any, start: int, rate: float, seed: int) -> Any:
    """A uniform sample of a row block's rows (each kept with probability ``rate``, seeded by the block)."""
    keep = np.random.default_rng([seed, start]).random(X.shape[0]) < rate
    return X[np.flatnonzero(keep)]


def _sample_pca_start(M: Matrix, Zc: _Centred, k: int, seed: int, rng: np.random.Generator, side: Any = None
                      ) -> tuple[np.ndarray, np.ndarray, int, bool]:
    """The PCA start above ``_PCA_SAMPLE_ABOVE`` samples: :func:`sample_start`, then ``_PCA_REFINE`` block
    iterations on all rows from there (two passes each, k columns), which give every feature with data its row of
    W. A full-data subspace iteration from random would take tens of iterations of two passes at kddb size (the
    top eigenvalues of clustered sparse data are close together)."""
    return _top_scatter(Zc, k, rng, max_iter=_PCA_REFINE, V0=sample_start(M, Zc, k, seed, rng), side=side)


def sample_start(M: Matrix, Zc: _Centred, k: int, seed: int, rng: np.random.Generator) -> Start:
    """The top k principal directions of a uniform sample of ``_PCA_SAMPLE`` rows (taken by the row blocks,
    centred by its own means, in this process: every product is in memory and only the features the sample holds
    take part), as a :class:`Start` (random columns where the sample has too few features)."""
    from scipy.sparse.linalg import LinearOperator, eigsh

    from dufs.engine import Rows

    n, d = Zc.n, Zc.d
    rows = Rows.of(M)
    rate = min(1.0, _PCA_SAMPLE / n)
    Xs = sp.csr_array(rows.map(_rows_take, args=(rate, seed), n_rows=int(rate * n)).gather("the PCA sample"))
    cols = np.unique(Xs.indices).astype(np.int64)
    _, inv = M.transform
    w = np.ones(cols.size) if inv is None else np.asarray(inv, dtype=np.float64)[cols]
    Xc = sp.csc_array(Xs[:, cols] @ sp.diags_array(w)).astype(np.float64)
    del Xs
    ns = Xc.shape[0]
    mean = np.asarray(Xc.sum(axis=0)).ravel() / max(ns, 1)

    def st(v: np.ndarray) -> np.ndarray:  # the sample's centred scatter, never formed
        t = Xc @ v - mean @ v
        return Xc.T @ t - mean * t.sum(axis=0)

    kk = min(k, cols.size - 1)
    start = random_start(rng, d, k)
    if kk >= 1 and ns > 1:
        op = LinearOperator((cols.size, cols.size), matvec=st, matmat=st, dtype=np.float64)
        _, E = eigsh(op, k=kk, which="LA", v0=rng.standard_normal(cols.size))
        start = Start(start.seed, k, cols, np.ascontiguousarray(E, dtype=np.float64))
    log.info("ufcm: PCA start from a sample of %d rows (%d features), refined on all rows", ns, cols.size)
    return start
