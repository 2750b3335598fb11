"""The anchor graph of the samples for large n: a random projection of the rows, k-means anchors, each sample linked
to its s nearest anchors, so that W = Zh Lambda^-1 Zh^T and the Laplacian is low rank plus diagonal; its row
pieces stay beside the CSR row blocks where the graph is too large for the driver."""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np
import scipy.sparse as sp
from scipy.sparse.linalg import LinearOperator

from dufs import config
from dufs.engine.knn import _default_block_rows, _embed_block, _is_matrix, _k_smallest
from dufs.engine.laplacian import _inv_sqrt, _laplacian_op
from dufs.errors import ParameterError
from dufs.kernels.projection import projection_table

#: features per chunk of the random projection (R is generated chunk by chunk, keyed by the chunk's index)
#: above this many samples the anchors come from MiniBatchKMeans instead of KMeans
_MINIBATCH_ABOVE = 50_000


# ---------------------------------------------------------------------------------------------------- anchor graph
class AnchorGraph:
    """An anchor graph W = Zh Lambda^-1 Zh^T (Liu, He, Chang, ICML 2010), kept in factored form.

    Attributes
    ----------
    Zh : scipy.sparse.csr_array (n_samples x n_anchors)
        Each row has exactly s nonzeros (its s nearest anchors), summing to 1. Built by row blocks, it stays in
        row pieces beside them (``pieces``) and is assembled here only when asked for (refused above
        ``dufs.engine.max-task-bytes``; :meth:`zh_shared` assembles it on a worker instead).
    anchors : (n_anchors, embed_dim) array
        The k-means centres in the random-projection embedding.
    embedding : (n_samples, embed_dim) array or None
        E = Z R, kept unless ``anchor_graph(..., keep_embedding=False)`` (it is n_samples x embed_dim floats,
        far more than Zh; only needed to place new samples).
    lam : (n_anchors,) array
        Zh^T 1, the diagonal of Lambda (an anchor no sample links to has 0 and is left out of W).
    """

    def __init__(self, Zh: Any = None, anchors: Any = None, embedding: Any = None, lam: Any = None, *,
                 pieces: Any = None, embedding_pieces: Any = None, n: int | None = None):
        self._Zh = Zh
        self.anchors = anchors
        self._embedding = embedding
        self.lam = lam
        self.pieces = pieces
        self.embedding_pieces = embedding_pieces
        self._n = int(Zh.shape[0]) if Zh is not None else int(n)
        self._degrees: np.ndarray | None = None

    @property
    def Zh(self) -> sp.csr_array:  # noqa: N802 (the paper's name)
        if self._Zh is None:
            self._Zh = sp.csr_array(self.pieces.gather("the anchor graph's Zh"))
        return self._Zh

    @property
    def embedding(self) -> np.ndarray | None:
        if self._embedding is None and self.embedding_pieces is not None:
            self._embedding = np.asarray(self.embedding_pieces.gather("the anchor graph's embedding"))
        return self._embedding

    def zh_shared(self) -> Any:
        """Zh whole where the work runs: this process's array, or (built by row blocks under a distributed client)
        a future of it assembled on a worker, so the driver never holds it."""
        if self._Zh is not None or self.pieces is None:
            return self.Zh
        return self.pieces.assembled()

    @property
    def shape(self) -> tuple[int, int]:
        return self._n, self._n

    @property
    def in_pieces(self) -> bool:
        """Whether products run piece by piece on the row blocks (built so, and Zh not gathered here)."""
        return self._Zh is None and self.pieces is not None

    @property
    def n_anchors(self) -> int:
        return int(self.anchors.shape[0])

    @property
    def lam_inv(self) -> np.ndarray:
        """Lambda^-1 (0 for an anchor without samples)."""
        out = np.zeros_like(self.lam)
        nz = self.lam > 0
        out[nz] = 1.0 / self.lam[nz]
        return out

    def matvec_W(self, V: Any) -> np.ndarray:
        """W V = Zh Lambda^-1 Zh^T V for V of shape (n,) or (n, p), without forming W (:meth:`zt`, then
        :meth:`zp`)."""
        V = np.asarray(V, dtype=np.float64)
        li = self.lam_inv if V.ndim == 1 else self.lam_inv[:, None]
        return self.zp(li * self.zt(V))

    def _by_pieces(self) -> bool:
        """Whether products run piece by piece: the graph is in pieces of at least ``dufs.engine.graph-driver-bytes``
        or ``dufs.engine.max-task-bytes``. A large Zh (0.7 GB at kddb size) stays in pieces; a smaller one is
        gathered once, since a solver making thousands of products (M3FS's, a greedy step's) would otherwise pay a
        round of tasks for each."""
        from dufs.engine.rows import max_task_bytes

        return self.in_pieces and self.pieces.nbytes >= min(
            config.parse_bytes(config.get("engine.graph-driver-bytes")), max_task_bytes())

    @property
    def products_here(self) -> bool:
        """Whether products with Zh run in this process (:attr:`Zh` here or gathered once), not piece by piece on the
        workers (:meth:`_by_pieces`): a caller may then work on Zh's rows itself."""
        return not self._by_pieces()

    def zt(self, V: Any) -> np.ndarray:
        """Zh^T V (n_anchors, or n_anchors x p) for V of shape (n,) or (n, p): piece by piece (V shared with the row
        blocks, one all-reduce of an n_anchors x p matrix) when :meth:`_by_pieces`."""
        V = np.asarray(V, dtype=np.float64)
        if self._by_pieces():
            from dufs.engine.dispatch import shipped, tree_sum_values

            # one task a worker over its pieces, V through /dev/shm where the workers share it (a kddb-size V is
            # 154 MB: scattered, it went to every worker by TCP); the pieces' products summed here in the fixed
            # tree of Rows.reduce
            with shipped(V, broadcast=True, shared=True) as Vs:
                parts = self.pieces.rows.map_held(_rows_zt, self.pieces, args=(Vs,), with_rows=False)
            return tree_sum_values(parts)
        return _zh_t(self.Zh, V)

    def zp(self, P: Any, dtype: Any = np.float64) -> np.ndarray:
        """Zh P (n, or n x p) for P of shape (n_anchors,) or (n_anchors, p), in ``dtype`` (float64 or float32: a
        caller that rounds the result to float32 anyway has it written so, half the bytes): piece by piece when
        :meth:`_by_pieces` (n x p within ``dufs.engine.max-task-bytes``; written by the workers into a file in
        /dev/shm where they share this machine's, else gathered)."""
        P = np.asarray(P, dtype=np.float64)
        if not self._by_pieces():
            return np.asarray(_zh_p(self.Zh, P), dtype=dtype)
        from dufs.engine.rows import check_gather
        from dufs.engine.shm import receive_eligible, receive_or_none

        rows = self.pieces.rows
        width = 1 if P.ndim == 1 else P.shape[1]
        nbytes = self._n * width * np.dtype(dtype).itemsize
        check_gather("W V", self._n, width, nbytes)
        if receive_eligible(rows.live_client(), nbytes):
            with contextlib.ExitStack() as stack:
                got = receive_or_none(stack, (self._n, width), dtype)
                if got is not None:
                    rows.map_held(_rows_zp_into, self.pieces, args=(P.reshape(P.shape[0], -1), got[0]),
                                  with_rows=False)
                    out = np.array(got[1])
                    return out[:, 0] if P.ndim == 1 else out
        parts = rows.map_held(_rows_zp, self.pieces, args=(P,), with_rows=False)
        return np.asarray(np.concatenate(parts), dtype=dtype)

    @property
    def degrees(self) -> np.ndarray:
        """W 1 = Zh Lambda^-1 Zh^T 1 (all ones when every row of Zh sums to 1 and every anchor is used)."""
        if self._degrees is None:
            if self._Zh is None and self.pieces is not None:  # Zh (Lambda^-1 lam), piece by piece: an n-vector
                w = self.lam_inv * self.lam
                deg = self.pieces.rows.map(_rows_degrees, self.pieces, args=(w,), with_rows=False)
                self._degrees = np.asarray(deg.gather("the degrees"), dtype=np.float64)
            else:
                self._degrees = self.matvec_W(np.ones(self.shape[0]))
        return self._degrees

    def laplacian(self, normed: bool = False) -> LinearOperator:
        """L = D - W, or I - D^-1/2 W D^-1/2, as a SciPy ``LinearOperator`` (never an n x n matrix)."""
        here = normed and self.products_here
        return _laplacian_op(self.shape[0], self.matvec_W, self.degrees, normed, self.Zh if here else None,
                             self.lam_inv if here else None)

    # ------------------------------------------------------------ the normalised graph's factor
    def _used(self) -> np.ndarray:
        return (self.lam > 0).astype(np.float64)

    def normalized_grams(self, S: Any = None, shift: Any = None, coef: Any = None, XS: Any = None
                         ) -> tuple[np.ndarray, Any, Any]:
        """With B = D^-1/2 Zh Lambda^-1/2 (so that D^-1/2 W D^-1/2 = B B^T, an anchor without samples left out):
        B^T B (n_anchors x n_anchors) and, for the selected columns Z_S = (X_S - 1 shift^T) diag(coef), B^T Z_S
        (n_anchors x k) and Z_S^T Z_S (k x k) (None without columns). X_S is columns ``S`` of the matrix's rows,
        taken by each row block from its own CSR rows when the graph is in pieces (nothing n-sized reaches the
        driver; each block sends n_anchors x (n_anchors + k + 1) + k x (k + 1) numbers), else ``XS`` (n x k,
        raw), the columns themselves."""
        w = self._used()
        S = None if S is None or len(S) == 0 else np.asarray(S, dtype=np.int64)
        if self.in_pieces:  # each row block takes columns S of its own rows
            G, P, c, XtX, cs = self.pieces.rows.reduce(_rows_normalized_gram, self.pieces, args=(w, S, None),
                                                       with_rows=S is not None)
        else:
            if XS is None and S is not None:
                raise ParameterError("normalized_grams: a graph held whole needs the columns themselves (XS)")
            G, P, c, XtX, cs = _rows_normalized_gram(None, 0, self.Zh, w, None, XS)
        li = np.sqrt(self.lam_inv)
        BtB = li[:, None] * G * li[None, :]
        k = P.shape[1]
        if not k:
            return BtB, None, None
        mu = np.zeros(k) if shift is None else np.asarray(shift, dtype=np.float64)
        cf = np.ones(k) if coef is None else np.asarray(coef, dtype=np.float64)
        BtZ = li[:, None] * (P - np.outer(c, mu)) * cf[None, :]
        n = self.shape[0]
        ZtZ = cf[:, None] * (XtX - np.outer(cs, mu) - np.outer(mu, cs) + n * np.outer(mu, mu)) * cf[None, :]
        return BtB, BtZ, 0.5 * (ZtZ + ZtZ.T)

    def normalized_apply(self, A: np.ndarray, dtype: Any = np.float64, S: Any = None, shift: Any = None,
                         coef: Any = None, C: Any = None, XS: Any = None) -> Any:
        """B A + Z_S C (n x p, in ``dtype``) for an n_anchors x p ``A`` and, optionally, the selected columns as in
        :meth:`normalized_grams` with a k x p ``C``: row pieces (:class:`~dufs.engine.rows.Pieces`) when the graph is
        in pieces (each block takes its own rows of X_S), else an n x p array."""
        A = np.sqrt(self.lam_inv)[:, None] * np.asarray(A, dtype=np.float64)
        w = self._used()
        S = None if S is None or len(S) == 0 or C is None else np.asarray(S, dtype=np.int64)
        cC = off = None
        if C is not None and (S is not None or XS is not None):
            k = np.asarray(C).shape[0]
            cC = (np.ones(k) if coef is None else np.asarray(coef, dtype=np.float64))[:, None] * np.asarray(C)
            off = (np.zeros(k) if shift is None else np.asarray(shift, dtype=np.float64)) @ cC
        if self.in_pieces:  # each row block takes columns S of its own rows
            return self.pieces.rows.map(_rows_normalized_apply, self.pieces, args=(w, A, dtype, S, None, cC, off),
                                        width=A.shape[1], itemsize=np.dtype(dtype).itemsize, with_rows=S is not None)
        return _rows_normalized_apply(None, 0, self.Zh, w, A, dtype, None, XS if cC is not None else None, cC, off)

    def toarray(self) -> np.ndarray:
        """W as a dense n x n array: for small graphs and tests only."""
        Zd = self.Zh.toarray()
        return (Zd * self.lam_inv[None, :]) @ Zd.T

    def release(self) -> None:
        """Drop the row pieces held on the workers (after :attr:`Zh` or :attr:`embedding` was gathered, or when
        done)."""
        for p in (self.pieces, self.embedding_pieces):
            if p is not None:
                p.release()


def anchor_graph(M: Any, n_anchors: int = 256, n_neighbors: int = 3, *, embed_dim: int = 64, random_state: int = 0,
                 keep_embedding: bool = True, block_rows: int | None = None, metric: str = "euclidean",
                 values: str = "raw") -> AnchorGraph:
    """Anchor graph of the samples of ``M`` (a :class:`~dufs.engine.Matrix`, its transformed rows Z).

    Built row block by row block (:class:`~dufs.engine.rows.Rows`: a store's CSR row blocks, or in-memory rows):

    1. Each row block embeds its own rows, E_b = Z_b R (n_b x ``embed_dim``), R the sparse sign projection of
       :func:`projection_rows` generated per nonzero from a hash (R is never formed; a standardization's centring
       is the constant row (mu S^-1)^T R subtracted, the data are never centred). E stays in row pieces.
    2. Anchors: the ``n_anchors`` k-means centres of E (seeded with ``random_state``): for at most
       :data:`KMEANS_SAMPLE` samples, scikit-learn's ``KMeans`` on all of E; above, ``KMeans`` (k-means++) on a
       uniform sample of that many rows, then :data:`LLOYD_STEPS` Lloyd steps over all rows as map-reduce (each
       row block returns per-anchor sums and counts).
    3. Each sample i is linked to its s = ``n_neighbors`` nearest anchors <i> (ties: lower anchor index) with
       Liu et al.'s kernel weights Zh_ik = K(e_i, u_k) / sum_{k' in <i>} K(e_i, u_k'), K the heat kernel
       exp(-||e_i - u_k||^2 / sigma_i) whose width sigma_i is sample i's mean squared distance to its s anchors
       (per sample, so the weights do not depend on the data's scale; all weights 1/s when that mean is 0). Every
       weight is at least exp(-s) / s > 0: each row has exactly s nonzeros and sums to 1. Zh stays in row pieces.

    A matrix whose rows are neither in a store nor in this process (a Dask array's blocks, persisted) is embedded
    by feature blocks instead (one ``map_blocks(..., reduce="sum")`` pass of n x ``embed_dim`` partials): for
    moderate n_samples only. ``block_rows`` bounds the rows of the distance blocks of step 3. ``metric="cosine"``
    embeds the rows scaled to unit norm (each e_i divided by ||z_i||, no centring; an empty row stays at 0).
    ``values`` ("raw", "presence", "log1p", "sqrt"): what the embedding reads of each nonzero value
    (:func:`dufs.engine.knn.read_values`); other than raw, no centring.

    References
    ----------
    Liu, He, Chang, "Large Graph Construction for Scalable Semi-Supervised Learning", ICML 2010.
    """
    if not _is_matrix(M):
        raise ParameterError(f"anchor_graph needs a dufs.engine.Matrix; got {type(M).__name__}")
    n = M.shape[0]
    if not isinstance(n_anchors, int | np.integer) or not 1 <= n_anchors <= n:
        raise ParameterError(f"The 'n_anchors' parameter of anchor_graph must be an int in [1, {n}]; "
                             f"got {n_anchors!r}.")
    if not isinstance(n_neighbors, int | np.integer) or not 1 <= n_neighbors <= n_anchors:
        raise ParameterError(f"The 'n_neighbors' parameter of anchor_graph must be an int in [1, {n_anchors}]; "
                             f"got {n_neighbors!r}.")
    if not isinstance(embed_dim, int | np.integer) or embed_dim < 1:
        raise ParameterError(f"The 'embed_dim' parameter of anchor_graph must be an int >= 1; got {embed_dim!r}.")
    from dufs.engine.knn import _BUILT, check_metric, check_values
    from dufs.engine.rows import Rows

    cosine = check_metric(metric, "anchor_graph") == "cosine"
    values = check_values(values, "anchor_graph")
    _BUILT.set({"kind": "anchor", "metric": metric, "values": values})
    p, seed, m, s = int(embed_dim), int(random_state), int(n_anchors), int(n_neighbors)
    try:
        rows = Rows.of(M)
    except ParameterError:
        return _anchor_graph_by_features(M, m, s, p, seed, keep_embedding, block_rows, cosine, values)
    from dufs.engine.rows import max_task_bytes

    mu, inv = M.transform
    shift = None if mu is None or cosine or values != "raw" else _projected(np.asarray(mu) * inv, p, seed)
    # E in float64 while it could be held whole; beyond, float32 pieces (half the workers' memory; k-means and
    # the anchor weights need no more)
    single = n * p * 8 > max_task_bytes()
    E = rows.map(_rows_embed, args=(p, seed, inv, shift, single, cosine, values), width=p, itemsize=4 if single else 8)
    anchors = _kmeans_rows(rows, E, m, seed)
    Zh = rows.map(_rows_weights, E, args=(anchors, s, block_rows), width=s, itemsize=12, with_rows=False)
    lam = np.asarray(rows.reduce(_rows_colsum, Zh, args=(m,), with_rows=False), dtype=np.float64)
    if not keep_embedding:
        E.release()
        E = None
    return AnchorGraph(anchors=anchors, lam=lam, pieces=Zh, embedding_pieces=E, n=n)


#: k-means on all rows up to this many samples; above, on a uniform sample of this many, then Lloyd steps
KMEANS_SAMPLE = 50_000


#: Lloyd steps over all rows after the sample's k-means (above KMEANS_SAMPLE samples)
LLOYD_STEPS = 3


def _projected(v: np.ndarray, p: int, seed: int, chunk: int = 1 << 16) -> np.ndarray:
    """v^T R (a p-vector) with R's rows generated chunk by chunk (never whole)."""
    out = np.zeros(p)
    nz = np.flatnonzero(v)
    for a in range(0, nz.shape[0], chunk):
        f = nz[a:a + chunk]
        out += v[f] @ projection_table(f, p, seed)
    return out


def _rows_embed(X: Any, start: int, p: int, seed: int, inv: Any, shift: Any, single: bool = False,
                cosine: bool = False, values: str = "raw") -> np.ndarray:
    from dufs.engine.knn import read_values
    from dufs.kernels.projection import csr_embed

    data = X.data if values == "raw" else read_values(X.data, values)
    E = csr_embed(X.indptr, X.indices, data, p, seed, inv)
    if shift is not None:
        E -= shift[None, :]
    if cosine:  # the rows scaled to unit norm: the projection is linear, so e_i / ||z_i||
        v = np.asarray(data, dtype=np.float64)
        if inv is not None:
            v = v * np.asarray(inv, dtype=np.float64)[X.indices]
        rows = np.repeat(np.arange(E.shape[0]), np.diff(np.asarray(X.indptr)))
        sq = np.bincount(rows, weights=v * v, minlength=E.shape[0])
        _unit_rows(E, sq)
    return E.astype(np.float32) if single else E


def _unit_rows(E: np.ndarray, sq: np.ndarray) -> None:
    """E's rows divided in place by sqrt(``sq``) (rows of zero norm left as they are: zero)."""
    nz = sq > 0
    E[nz] /= np.sqrt(sq[nz])[:, None]


def _rows_sample(X: Any, start: int, E: np.ndarray, rate: float, seed: int) -> np.ndarray:
    keep = np.random.default_rng([seed, start]).random(E.shape[0]) < rate
    return E[keep]


def _nearest(E: np.ndarray, U: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row's nearest centre (ties: the lower index) and its squared distance."""
    D = np.einsum("ij,ij->i", E, E)[:, None] + np.einsum("ij,ij->i", U, U)[None, :] - 2.0 * (E @ U.T)
    np.maximum(D, 0.0, out=D)
    lab = np.argmin(D, axis=1)
    return lab, D[np.arange(E.shape[0]), lab]


def _rows_lloyd(X: Any, start: int, E: np.ndarray, U: np.ndarray) -> tuple:
    m, p = U.shape
    sums = np.zeros((m, p))
    counts = np.zeros(m)
    inertia = np.zeros(1)
    for a in range(0, E.shape[0], 16384):
        Eb = np.asarray(E[a:a + 16384], dtype=np.float64)
        lab, dist = _nearest(Eb, U)
        np.add.at(sums, lab, Eb)
        counts += np.bincount(lab, minlength=m)
        inertia += dist.sum()
    return sums, counts, inertia


def _kmeans_rows(rows: Any, E: Any, m: int, seed: int) -> np.ndarray:
    from dufs.engine.rows import max_task_bytes

    n = rows.n
    if n <= KMEANS_SAMPLE and E.nbytes <= max_task_bytes():
        return _kmeans(np.asarray(E.gather("the embedding")), m, seed)
    take = min(KMEANS_SAMPLE, max(m, max_task_bytes() // (8 * E.width)))
    sample = rows.map(_rows_sample, E, args=(min(1.0, take / n), seed), width=E.width, n_rows=take,
                      with_rows=False)
    S = np.asarray(sample.gather("the k-means sample"))
    sample.release()
    U = _kmeans(S, min(m, S.shape[0]), seed)
    if U.shape[0] < m:  # a sample smaller than the anchors asked for: pad with its rows
        U = np.vstack([U, S[:m - U.shape[0]]])
    for _ in range(LLOYD_STEPS):
        sums, counts, _inertia = rows.reduce(_rows_lloyd, E, args=(U,), with_rows=False)
        used = counts > 0
        U = U.copy()
        U[used] = sums[used] / counts[used, None]  # an anchor without rows keeps its place
    return U


def _rows_weights(X: Any, start: int, E: np.ndarray, U: np.ndarray, s: int, block_rows: Any) -> sp.csr_array:
    return _anchor_weights(E, U, s, block_rows)


def _rows_colsum(X: Any, start: int, Z: Any, m: int) -> np.ndarray:
    return np.asarray(Z.sum(axis=0), dtype=np.float64).ravel() if Z.shape[0] else np.zeros(m)


def _zh_t(Z: Any, V: np.ndarray) -> np.ndarray:
    """Z^T V for a CSR ``Z`` (n x m) and V (n,) or (n, p), float64, by the engine's kernel on Z's buffers read as
    the CSC form of Z^T (SciPy's ``Z.T @ V`` builds a transposed copy and is slower: docs/measurements.md, "Wide
    products")."""
    from dufs.kernels.blockops import csc_matvec

    V2 = np.ascontiguousarray(V.reshape(V.shape[0], -1), dtype=np.float64)
    out = np.zeros((Z.shape[1], V2.shape[1]))
    csc_matvec(Z.indptr, Z.indices, np.asarray(Z.data, dtype=np.float64), V2, out)
    return out[:, 0] if V.ndim == 1 else out


def _zh_p(Z: Any, P: np.ndarray) -> np.ndarray:
    """Z P for a CSR ``Z`` (n x m) and P (m,) or (m, p), float64, by the engine's kernel (each row of Z a column of
    Z^T in CSC: one sweep over Z's nonzeros for every column of P)."""
    from dufs.kernels.blockops import csc_rmatvec

    P2 = np.ascontiguousarray(P.reshape(P.shape[0], -1), dtype=np.float64)
    out = np.empty((Z.shape[0], P2.shape[1]))
    csc_rmatvec(Z.indptr, Z.indices, np.asarray(Z.data, dtype=np.float64), P2, out)
    return out[:, 0] if P.ndim == 1 else out


def _rows_zt(X: Any, start: int, Z: Any, V: Any) -> np.ndarray:
    """Zh_b^T V_b: this piece's share of Zh^T V (V whole, or its shared reference, sliced to the piece's rows)."""
    from dufs.engine.shm import local_array

    return _zh_t(Z, local_array(V)[start:start + Z.shape[0]])


def _rows_zp(X: Any, start: int, Z: Any, P: np.ndarray) -> np.ndarray:
    """Zh_b P: this piece's rows of Zh P."""
    return _zh_p(Z, P)


def _rows_zp_into(X: Any, start: int, Z: Any, P: np.ndarray, out: Any) -> None:
    """Zh_b P written into this piece's rows of the results file ``out`` (n x p, :func:`~dufs.engine.shm.receive`)."""
    from dufs.engine.shm import writable_array

    writable_array(out)[start:start + Z.shape[0]] = _zh_p(Z, P)


def _rows_degrees(X: Any, start: int, Z: Any, w: np.ndarray) -> np.ndarray:
    return np.asarray(Z @ w, dtype=np.float64)


def _inv_sqrt_degrees(Z: Any, w: np.ndarray) -> np.ndarray:
    return _inv_sqrt(np.asarray(Z @ w, dtype=np.float64))


def _selected_rows(X: Any, S: Any, XS: Any) -> Any:
    """This block's rows of the selected columns: ``XS`` (its slice), else columns ``S`` of its CSR rows."""
    if XS is not None:
        return sp.csr_array(XS, dtype=np.float64)
    if S is not None:
        return sp.csr_array(sp.csc_array(X)[:, S], dtype=np.float64)
    return None


def _rows_normalized_gram(X: Any, start: int, Z: Any, w: np.ndarray, S: Any, XS: Any) -> tuple:
    """Zh_b^T D_b^-1 Zh_b and, with this block's rows X_b of the selected columns, Zh_b^T D_b^-1/2 X_b,
    Zh_b^T D_b^-1/2 1 (for their centring), X_b^T X_b and X_b^T 1."""
    Zs = sp.csr_array(sp.diags_array(_inv_sqrt_degrees(Z, w)) @ Z)
    G = np.asarray((Zs.T @ Zs).toarray(), dtype=np.float64)
    m = Z.shape[1]
    Xb = _selected_rows(X, S, XS)
    if Xb is None:
        return G, np.zeros((m, 0)), np.zeros(m), np.zeros((0, 0)), np.zeros(0)
    P = np.asarray((Zs.T @ Xb).toarray(), dtype=np.float64)
    XtX = np.asarray((Xb.T @ Xb).toarray(), dtype=np.float64)
    return (G, P, np.asarray(Zs.sum(axis=0), dtype=np.float64).ravel(), XtX,
            np.asarray(Xb.sum(axis=0), dtype=np.float64).ravel())


def _rows_normalized_apply(X: Any, start: int, Z: Any, w: np.ndarray, A: np.ndarray, dtype: Any = np.float64,
                           S: Any = None, XS: Any = None, cC: Any = None, off: Any = None) -> np.ndarray:
    out = _inv_sqrt_degrees(Z, w)[:, None] * np.asarray(Z @ A, dtype=np.float64)
    if cC is not None:
        Xb = _selected_rows(X, S, XS)
        out += np.asarray(Xb @ cC, dtype=np.float64) - off[None, :]
    return out.astype(dtype, copy=False)


def _anchor_graph_by_features(M: Any, m: int, s: int, p: int, seed: int, keep_embedding: bool,
                              block_rows: Any, cosine: bool = False, values: str = "raw") -> AnchorGraph:
    from dufs.engine.blocks import PerBlock
    from dufs.engine.knn import _sqnorm_block

    n = M.shape[0]
    mu, inv = M.transform
    pi = None if inv is None else PerBlock(inv)
    centre = None if mu is None or cosine or values != "raw" else PerBlock(mu)
    E = M.map_blocks(_embed_block, n, p, seed, centre, pi, values, reduce="sum")
    E = np.zeros((n, p)) if E is None else np.asarray(E, dtype=np.float64)
    if cosine:
        sq = M.map_blocks(_sqnorm_block, n, pi, values, reduce="sum")
        _unit_rows(E, np.zeros(n) if sq is None else np.asarray(sq, dtype=np.float64))
    anchors = _kmeans(E, m, seed)
    Zh = _anchor_weights(E, anchors, s, block_rows)
    lam = np.asarray(Zh.sum(axis=0), dtype=np.float64).ravel()
    return AnchorGraph(Zh=Zh, anchors=anchors, embedding=E if keep_embedding else None, lam=lam)


def _kmeans(E: np.ndarray, m: int, random_state: int) -> np.ndarray:
    from sklearn.cluster import KMeans, MiniBatchKMeans

    if E.shape[0] > _MINIBATCH_ABOVE:
        km = MiniBatchKMeans(n_clusters=m, random_state=random_state, batch_size=4096, n_init=3)
    else:
        km = KMeans(n_clusters=m, random_state=random_state, n_init=1)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # fewer distinct points than clusters (duplicate samples)
        km.fit(E)
    return np.asarray(km.cluster_centers_, dtype=np.float64)


def _anchor_weights(E: np.ndarray, U: np.ndarray, s: int, block_rows: int | None) -> sp.csr_array:
    n, m = E.shape[0], U.shape[0]
    br = int(block_rows) if block_rows is not None else _default_block_rows(m)
    ue = np.einsum("ij,ij->i", U, U)
    cols = np.empty((n, s), dtype=np.int64)
    vals = np.empty((n, s), dtype=np.float64)
    for a in range(0, n, br):
        b = min(n, a + br)
        Eb = np.asarray(E[a:b], dtype=np.float64)
        D = np.einsum("ij,ij->i", Eb, Eb)[:, None] + ue[None, :] - 2.0 * (Eb @ U.T)
        np.maximum(D, 0.0, out=D)
        part, pd = _k_smallest(D, s)
        sigma = pd.mean(axis=1)
        K = np.ones_like(pd)
        pos = sigma > 0
        K[pos] = np.exp(-pd[pos] / sigma[pos, None])
        cols[a:b] = part
        vals[a:b] = K / K.sum(axis=1, keepdims=True)
    small = n * s < 2 ** 31 - 1 and m < 2 ** 31 - 1  # int32 indices: 12 bytes a link, not 16
    itype = np.int32 if small else np.int64
    indptr = np.arange(0, n * s + 1, s, dtype=itype)
    Zh = sp.csr_array((vals.ravel(), cols.ravel().astype(itype), indptr), shape=(n, m))
    Zh.sort_indices()
    return Zh
