"""Sample graphs: exact k-nearest-neighbour graphs by blocked distance computations, and anchor graphs.

**Exact kNN** (He, Cai, Niyogi 2005, the Laplacian score; He et al. 2011, eq. (2)): nodes i and j are joined when
either is among the other's k nearest neighbours; weights are 1 ("binary") or the heat kernel
exp(-||x_i - x_j||^2 / t). No self-loops. The graph is a SciPy sparse matrix with at most 2 k n entries, never an
n x n dense matrix. :func:`knn_graph` takes an in-memory array or a :class:`~dufs.engine.Matrix`; for a Matrix the
distances are computed on the workers without gathering the data: a few row blocks a:b a pass
(:meth:`~dufs.engine.Matrix.map_sums`, two a worker), each block's partial Gram ``G[:, a:b] = Z Z[a:b]^T`` (each
feature block adds its own n x r dense partial, summed on the workers by the fixed tree), then its rows' k nearest
picked where it was summed (:func:`dufs.kernels.knn.knn_select`, one sweep of the block keeping a sorted k-list a
row): only n x k neighbours come back. Distances do not see a centre, so the Matrix's implicit standardization
enters as its scaling alone (Y = X_f S_f^-1 for a feature block f), and the squared row norms ``||y_i||^2`` come
from one more pass. A worker holds one n x block_rows Gram block a row block in flight (about 256 MiB by default);
the driver, the n x k neighbours.

**Anchor graph** (Liu, He, Chang, "Large Graph Construction for Scalable Semi-Supervised Learning", ICML 2010),
for large n_samples: samples are embedded by a random projection E = Z R (n x embed_dim; one pass, each feature
block generating its own rows of R from ``(random_state, feature index)``, so no process ever holds an
n_features x embed_dim matrix, see :func:`projection_rows`), anchors are k-means centres of E, and each sample is
linked to its s nearest anchors with kernel weights summing to 1, giving the sparse n x m matrix Zh. Then
W = Zh Lambda^-1 Zh^T with Lambda = diag(Zh^T 1): the Laplacian is a low-rank-plus-diagonal operator
(:meth:`AnchorGraph.laplacian`), never an n x n matrix.
"""

from __future__ import annotations

import contextlib
from typing import Any, Literal

import numpy as np
import scipy.sparse as sp
from scipy.sparse.linalg import LinearOperator

from dufs import config
from dufs.errors import ParameterError
from dufs.kernels.anchor import laplacian_anchor_sums, laplacian_rows, normed_laplacian_vec
from dufs.kernels.knn import knn_select
from dufs.kernels.projection import projection_table
from dufs.scheduling import driver_threads, in_threads

__all__ = ["KNN_MAX_SAMPLES", "SPARSE_GRAPH_DENSITY", "AnchorGraph", "anchor_graph", "graph_rows", "knn_graph",
           "laplacian", "laplacian_operator", "projection_rows", "resolve_graph"]

#: ``graph="auto"`` builds the exact kNN graph up to this many samples and the anchor graph above (exact kNN costs
#: a pass over the data per n_samples x 256 MiB Gram block: 75 passes at 50,000 samples, 11 million at kddb's
#: 19 million)
KNN_MAX_SAMPLES = 50_000
#: data with at most this fraction of nonzeros count as sparse for :func:`graph_rows`
SPARSE_GRAPH_DENSITY = 0.1


def graph_rows(M: Any) -> Any:
    """The rows an anchor graph is built on: ``M`` itself, or, when M is sparse (at most
    :data:`SPARSE_GRAPH_DENSITY` of its entries nonzero) and standardized, the same blocks unstandardized.

    Standardizing a sparse column divides it by its standard deviation, so a feature present in r of n rows takes
    values of order sqrt(n / r) there. The anchor graph's random projection sums every feature of a row with equal
    weight, so the rarest features decide every embedded distance and the graph loses the samples' structure:
    on a 200,000 x 300,000 store with 4 planted clusters (30 nonzeros a row) its spectral embedding has an
    adjusted Rand index of 0.00 with the clusters under "zscore" and "scale" (every eigenvalue 0.308), 0.36 on
    the raw rows. M3FS and JCFS build their exact kNN graph on these rows too (on a 20,000-row store with 2
    planted clusters the z-scored rows' graph led each to none of the cluster features, the raw rows' to 20 of 20;
    JCFS on rcv1_small: LinearSVC accuracy 0.569 -> 0.708, on pcmac 0.555 -> 0.545); LapAOFS's and LapDOFS's keep
    the method's standardization (on that store they chose none either way). Dense data keep the method's
    standardization, as in the papers' experiments. Passes made through the view count on ``M`` (the blocks are
    shared)."""
    if not _is_matrix(M) or M.standardize is None:
        return M
    n, d = M.shape
    if M.nnz > SPARSE_GRAPH_DENSITY * n * d:
        return M
    return M.with_standardize(None)


def resolve_graph(graph: str, n_samples: int, who: str = "graph") -> str:
    """"knn" or "anchor" for a ``graph`` parameter ("auto": kNN up to :data:`KNN_MAX_SAMPLES` samples)."""
    if graph == "auto":
        return "knn" if n_samples <= KNN_MAX_SAMPLES else "anchor"
    if graph not in ("knn", "anchor"):
        raise ParameterError(f"The 'graph' parameter of {who} must be 'auto', 'knn' or 'anchor'; got {graph!r}.")
    return graph

#: bytes of one n x block_rows float64 Gram block by default
_GRAM_BYTES = 1 << 28
#: a Gram block's rows of one feature block are made dense when they take at most this many bytes
_GRAM_DENSE_ROWS_BYTES = 1 << 26
#: features per chunk of the random projection (R is generated chunk by chunk, keyed by the chunk's index)
#: above this many samples the anchors come from MiniBatchKMeans instead of KMeans
_MINIBATCH_ABOVE = 50_000


def _row_sq_norms(X: Any) -> np.ndarray:
    if sp.issparse(X):
        return np.asarray(X.multiply(X).sum(axis=1), dtype=np.float64).ravel()
    return np.einsum("ij,ij->i", X, X, dtype=np.float64)


def _default_block_rows(n: int) -> int:
    return max(1, _GRAM_BYTES // (8 * max(n, 1)))


def _is_matrix(X: Any) -> bool:
    from dufs.engine.matrix import Matrix

    return isinstance(X, Matrix)


# ---------------------------------------------------------------------------------------------------- per-block work
def _block_y(block: Any, n: int, mu: np.ndarray | None, inv: np.ndarray | None) -> tuple[Any, np.ndarray | None]:
    """Y = X_f S_f^-1 (csc, float64) and m = S_f^-1 mu_f (None without centring) of one feature block."""
    Y = sp.csc_array((np.asarray(block.data, dtype=np.float64), block.indices, block.indptr), shape=(n, block.width))
    if inv is not None:
        Y = sp.csc_array(Y @ sp.diags_array(np.asarray(inv, dtype=np.float64)))
    m = None
    if mu is not None:
        m = np.asarray(mu, dtype=np.float64)
        if inv is not None:
            m = m * inv
    return Y, m


def _sqnorm_block(block: Any, n: int, inv: np.ndarray | None) -> np.ndarray:
    """This feature block's part of ||y_i||^2 for every sample i (Y = X_f S_f^-1: distances do not see a centre)."""
    return _row_sq_norms(_block_y(block, n, None, inv)[0])


def projection_rows(start: int, stop: int, embed_dim: int, random_state: int = 0) -> np.ndarray:
    """Rows ``start:stop`` of the random projection R (n_features x embed_dim), dense float64.

    Achlioptas' sparse sign projection: entries +-s with probability 0.16667 each and 0 otherwise (zero mean,
    variance 1 / embed_dim, so E[||x R||^2] = ||x||^2), each from a counter-based hash of (``random_state``,
    feature, column) (:mod:`dufs.kernels.projection`): any row range, any set of features, gives the same rows,
    whatever the feature or row blocking.
    """
    start, stop = int(start), int(stop)
    return projection_table(np.arange(start, max(stop, start), dtype=np.int64), int(embed_dim), int(random_state))


def _embed_block(block: Any, n: int, embed_dim: int, random_state: int, mu: np.ndarray | None,
                 inv: np.ndarray | None) -> np.ndarray:
    """This feature block's n x embed_dim part of E = Z R (R's rows for the block generated here): one sparse-dense
    product (a product per 4096-feature chunk made an n x embed_dim temporary each: minutes on a 2M-row store)."""
    Y, m = _block_y(block, n, mu, inv)
    R = projection_rows(block.start, block.stop, embed_dim, random_state)
    E = np.asarray(Y @ R, dtype=np.float64)
    if m is not None:
        E -= (m @ R)[None, :]
    return E


# ---------------------------------------------------------------------------------------------------- kNN
def _gram_span(block: Any, span: tuple[int, int], n: int, inv: np.ndarray | None) -> np.ndarray:
    """This feature block's n x rows partial of Y Y[a:b]^T, span = (a, b) (a :meth:`~dufs.engine.Matrix.map_sums`
    key; Y = X_f S_f^-1)."""
    return _gram_of_rows(sp.csr_array(_block_y(block, n, None, inv)[0]), span[0], span[1])


def _knn_span(G: np.ndarray, span: tuple[int, int], sq: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k nearest samples of the rows ``span`` from their summed Gram block G (n x rows; None: no features, all
    zero), where it was summed."""
    sq = np.asarray(sq, dtype=np.float64)
    G = np.zeros((sq.shape[0], span[1] - span[0])) if G is None else np.ascontiguousarray(G, dtype=np.float64)
    return knn_select(G, sq, span[0], k)


def _gram_of_rows(X: Any, a: int, b: int) -> np.ndarray:
    """X X[a:b]^T (n x (b - a), dense float64, C order) of X, CSR float64 or dense."""
    if not sp.issparse(X):
        return np.ascontiguousarray(X @ X[a:b].T)
    if not X.nnz:
        return np.zeros((X.shape[0], b - a))
    if (b - a) * X.shape[1] * 8 <= _GRAM_DENSE_ROWS_BYTES:
        # the row block dense (bounded by block_rows x the width): a sparse x dense product makes the n x (b - a)
        # block directly, where sparse x sparse built a nearly dense sparse result first (48,842 x 123 one-hot
        # rows: 0.44 against 2.6 s a block of 686 rows, the same numbers); by rows (CSR), each output row made
        # once, where by columns (CSC) every nonzero added into a scattered row (0.13 against 0.54 s)
        return np.ascontiguousarray(X @ X[a:b].toarray().T)
    return np.ascontiguousarray((X @ X[a:b].T).toarray())


def _k_smallest(D: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Column indices and values of the k smallest entries per row, ties broken by the lower column index."""
    m = D.shape[1]
    part = np.argpartition(D, k - 1, axis=1)[:, :k] if k < m else np.argsort(D, axis=1, kind="stable")[:, :k]
    pd = np.take_along_axis(D, part, axis=1)
    if k < m:
        # rows whose k-th value is tied with entries left out: redo them with a stable full sort (lowest index wins)
        kth = pd.max(axis=1)
        tied = np.flatnonzero((D <= kth[:, None]).sum(axis=1) > k)
        if tied.size:
            # what a stable full sort's first k are, without sorting: every entry below the k-th value, then the
            # lowest-indexed entries equal to it (one-hot data tie at nearly every row: a stable sort of each
            # 48,842-wide row took 3-4 s a block of 686 rows)
            Dt = D[tied]
            kt = kth[tied, None]
            lt, eq = Dt < kt, Dt == kt
            need = k - lt.sum(axis=1)
            take = lt | (eq & (np.cumsum(eq, axis=1, dtype=np.int32) <= need[:, None]))
            cols = np.nonzero(take)[1].reshape(tied.size, k)  # row by row, k a row, in column order
            part[tied] = cols
            pd[tied] = np.take_along_axis(Dt, cols, axis=1)
    order = np.lexsort((part, pd), axis=1)
    return np.take_along_axis(part, order, axis=1), np.take_along_axis(pd, order, axis=1)


def _check_knn(n: int, n_neighbors: Any, weights: Any, t: Any, block_rows: Any) -> None:
    if not isinstance(n_neighbors, int | np.integer) or not 1 <= n_neighbors < max(n, 2):
        raise ParameterError(f"The 'n_neighbors' parameter of knn_graph must be an int in [1, {n - 1}]; "
                             f"got {n_neighbors!r}.")
    if weights not in ("binary", "heat"):
        raise ParameterError(f"The 'weights' parameter of knn_graph must be 'binary' or 'heat'; got {weights!r}.")
    if t is not None and not t > 0:
        raise ParameterError(f"The 't' parameter of knn_graph must be a float > 0; got {t!r}.")
    if block_rows is not None and (not isinstance(block_rows, int | np.integer) or block_rows < 1):
        raise ParameterError(f"The 'block_rows' parameter of knn_graph must be an int >= 1; got {block_rows!r}.")


def knn_graph(X: Any, n_neighbors: int = 5, *, weights: Literal["binary", "heat"] = "binary",
              t: float | None = None, block_rows: int | None = None) -> sp.csr_array:
    """Symmetric kNN graph of the rows of ``X``, exact, computed in row blocks.

    Parameters
    ----------
    X : (n_samples, n_features) array, SciPy sparse matrix or :class:`~dufs.engine.Matrix`
        For a Matrix, the rows of its transformed matrix Z (its ``standardize``), with the Gram blocks computed
        on the workers (two row blocks a worker a pass, plus one pass for the row norms; see the module docstring).
    n_neighbors : int
        k: neighbours of each sample, itself excluded.
    weights : "binary" or "heat"
        1 on every edge, or exp(-d^2 / t).
    t : float, optional
        Heat-kernel width; default the mean squared distance over the kNN edges.
    block_rows : int, optional
        Rows per distance block (memory O(block_rows * n_samples)); default so that one n_samples x block_rows
        float64 block is about 256 MiB.

    Returns
    -------
    W : scipy.sparse.csr_array, symmetric, zero diagonal. Among equally distant candidates the lower sample
    index is taken.

    References
    ----------
    He, Cai, Niyogi, "Laplacian Score for Feature Selection", NIPS 2005; He et al., TPAMI 2011, eq. (2).
    """
    n = X.shape[0]
    _check_knn(n, n_neighbors, weights, t, block_rows)
    k = int(n_neighbors)
    br = int(block_rows) if block_rows is not None else _default_block_rows(n)
    spans = [(a, min(n, a + br)) for a in range(0, n, br)]
    rows = np.empty(n * k, dtype=np.int64)
    cols = np.empty(n * k, dtype=np.int64)
    dist = np.empty(n * k, dtype=np.float64)

    def put(span: tuple[int, int], got: tuple[np.ndarray, np.ndarray]) -> None:
        a, b = span
        rows[a * k:b * k] = np.repeat(np.arange(a, b), k)
        cols[a * k:b * k] = got[0].ravel()
        dist[a * k:b * k] = got[1].ravel()

    if _is_matrix(X):
        from dufs.engine.blocks import PerBlock
        from dufs.engine.dispatch import current_client

        # distances do not change with a centre: rows scaled only (the centring of each Gram block took three
        # sweeps of it, 4 of 20 s over 48,842 z-scored rows, for the same numbers up to rounding)
        inv = X.transform.inv_scale
        pi = None if inv is None else PerBlock(inv)
        sq = X.map_blocks(_sqnorm_block, n, pi, reduce="sum")
        sq = np.zeros(n) if sq is None else np.asarray(sq, dtype=np.float64)
        # a few row blocks a pass, their Gram blocks summed and their neighbours picked on the workers: only the
        # neighbours come back (a Gram block is 256 MiB), and every worker has a block to work on
        client = current_client()
        wave = 2 * max(1, len(client.scheduler_info(n_workers=-1).get("workers", {})) if client is not None else 1)
        for w0 in range(0, len(spans), wave):
            part = spans[w0:w0 + wave]
            for span, got in zip(part, X.map_sums(_gram_span, part, n, pi, then=_knn_span,
                                                  then_args=(sq, k)), strict=True):
                put(span, got)
    else:
        Xf = sp.csr_array(X, dtype=np.float64) if sp.issparse(X) else np.asarray(X, dtype=np.float64)
        sq = _row_sq_norms(Xf)
        for a, b in spans:
            put((a, b), knn_select(_gram_of_rows(Xf, a, b), sq, a, k))
    if weights == "heat":
        width = float(t) if t is not None else float(dist.mean()) if dist.size and dist.mean() > 0 else 1.0
        w = np.exp(-dist / width)
    else:
        w = np.ones_like(dist)
    A = sp.coo_array((w, (rows, cols)), shape=(n, n)).tocsr()
    W = A.maximum(A.T).tocsr()  # i ~ j if either is among the other's neighbours
    W.setdiag(0)
    W.eliminate_zeros()
    W.sort_indices()
    return sp.csr_array(W)


# ---------------------------------------------------------------------------------------------------- Laplacians
def laplacian(W: sp.sparray, *, normed: bool = False) -> tuple[sp.csr_array, np.ndarray]:
    """``L = D - W`` (or the normalised ``I - D^-1/2 W D^-1/2``) and the degree vector ``d``."""
    d = np.asarray(W.sum(axis=1), dtype=np.float64).ravel()
    if not normed:
        return sp.csr_array(sp.diags_array(d) - W), d
    Dm = sp.diags_array(_inv_sqrt(d))
    return sp.csr_array(sp.eye_array(W.shape[0]) - Dm @ W @ Dm), d


def _inv_sqrt(d: np.ndarray) -> np.ndarray:
    inv = np.zeros_like(d, dtype=np.float64)
    nz = d > 0
    inv[nz] = 1.0 / np.sqrt(d[nz])
    return inv


_THREADED_ROWS = 1 << 16  # an anchor Laplacian's product with one vector on the driver's threads from this many rows


def _anchor_laplacian_vec(indptr: np.ndarray, indices: np.ndarray, data: np.ndarray, s: np.ndarray, li: np.ndarray,
                          v: np.ndarray, threads: int) -> np.ndarray:
    """L v for the anchor graph's normalised Laplacian (:func:`~dufs.kernels.anchor.normed_laplacian_vec`), its rows
    in ``threads`` ranges at once: each range's Zh^T (s v) into an n_anchors row of its own, added in range order,
    then each range's rows of the result (200,000 rows, 2 threads: 1.4 against 2.6 ms)."""
    n, m = indptr.shape[0] - 1, li.shape[0]
    out = np.empty(n)
    if threads <= 1:
        return normed_laplacian_vec(indptr, indices, data, s, li, v, np.empty(m), out)
    cut = [n * i // threads for i in range(threads + 1)]
    accs = np.zeros((threads, m))
    in_threads(lambda a, b: [laplacian_anchor_sums(indptr, indices, data, s, v, accs[t], cut[t], cut[t + 1])
                             for t in range(a, b)], threads, threads)
    p = accs[0]
    for t in range(1, threads):
        p += accs[t]
    p *= li
    in_threads(lambda a, b: laplacian_rows(indptr, indices, data, s, p, v, out, a, b), n, threads)
    return out


def _laplacian_op(n: int, matvec_W: Any, d: np.ndarray, normed: bool, Zh: Any = None, li: Any = None
                  ) -> LinearOperator:
    """L = D - W, or I - D^-1/2 W D^-1/2 (a zero degree gives a zero row of D^-1/2), from a product with W; with
    an anchor graph's ``Zh`` here (CSR) and ``li`` = Lambda^-1, the normalised one's products with one vector in
    two sweeps of Zh (:func:`~dufs.kernels.anchor.normed_laplacian_vec`: 2.1 against 2.5 ms at 200,000 samples),
    their rows in ranges on the driver's threads from :data:`_THREADED_ROWS` samples (M3FS makes one or two a
    v-solver iteration while the workers wait)."""
    if normed:
        s = _inv_sqrt(d)
        if Zh is not None:
            zd = np.asarray(Zh.data, dtype=np.float64)
            threads = driver_threads() if n >= _THREADED_ROWS else 1

        def mm(V: np.ndarray) -> np.ndarray:
            V = np.asarray(V, dtype=np.float64)
            if Zh is not None and V.size == n:
                # the n_anchors scratch a call's own: the operator may be applied from several threads
                return _anchor_laplacian_vec(Zh.indptr, Zh.indices, zd, s, li, np.ascontiguousarray(V.ravel()),
                                             threads).reshape(V.shape)
            V2 = V.reshape(n, -1)
            out = np.asarray(matvec_W(s[:, None] * V2), dtype=np.float64).reshape(V2.shape)
            if not out.flags.writeable:
                out = out.copy()
            out *= -s[:, None]  # in place: at kddb size each n x p temporary is 154 MB a column
            out += V2
            return out.reshape(V.shape)
    else:
        def mm(V: np.ndarray) -> np.ndarray:
            V = np.asarray(V, dtype=np.float64)
            V2 = V.reshape(n, -1)
            return (d[:, None] * V2 - matvec_W(V2)).reshape(V.shape)

    return LinearOperator((n, n), matvec=mm, rmatvec=mm, matmat=mm, rmatmat=mm, dtype=np.float64)


def laplacian_operator(W: Any, *, normed: bool = False) -> LinearOperator:
    """The Laplacian of a sparse graph ``W`` (e.g. :func:`knn_graph`) as a SciPy ``LinearOperator``: ``D - W``, or
    ``I - D^-1/2 W D^-1/2`` when ``normed``; the same interface as :meth:`AnchorGraph.laplacian`."""
    if isinstance(W, AnchorGraph):
        return W.laplacian(normed=normed)
    W = sp.csr_array(W, dtype=np.float64)
    n = W.shape[0]
    if W.shape != (n, n):
        raise ParameterError(f"W must be square; got {W.shape}")
    d = np.asarray(W.sum(axis=1), dtype=np.float64).ravel()
    return _laplacian_op(n, lambda V: np.asarray(W @ V), d, normed)


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
                 keep_embedding: bool = True, block_rows: int | None = None) -> AnchorGraph:
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
    moderate n_samples only. ``block_rows`` bounds the rows of the distance blocks of step 3.

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
    from dufs.engine.rows import Rows

    p, seed, m, s = int(embed_dim), int(random_state), int(n_anchors), int(n_neighbors)
    try:
        rows = Rows.of(M)
    except ParameterError:
        return _anchor_graph_by_features(M, m, s, p, seed, keep_embedding, block_rows)
    from dufs.engine.rows import max_task_bytes

    mu, inv = M.transform
    shift = None if mu is None else _projected(np.asarray(mu) * inv, p, seed)
    # E in float64 while it could be held whole; beyond, float32 pieces (half the workers' memory; k-means and
    # the anchor weights need no more)
    single = n * p * 8 > max_task_bytes()
    E = rows.map(_rows_embed, args=(p, seed, inv, shift, single), width=p, itemsize=4 if single else 8)
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


def _rows_embed(X: Any, start: int, p: int, seed: int, inv: Any, shift: Any, single: bool = False) -> np.ndarray:
    from dufs.kernels.projection import csr_embed

    E = csr_embed(X.indptr, X.indices, X.data, p, seed, inv)
    if shift is not None:
        E -= shift[None, :]
    return E.astype(np.float32) if single else E


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
    the CSC form of Z^T (SciPy's ``Z.T @ V`` builds a transposed copy's multi-vector product 3x slower)."""
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
                              block_rows: Any) -> AnchorGraph:
    from dufs.engine.blocks import PerBlock

    n = M.shape[0]
    mu, inv = M.transform
    E = M.map_blocks(_embed_block, n, p, seed, None if mu is None else PerBlock(mu),
                     None if inv is None else PerBlock(inv), reduce="sum")
    E = np.zeros((n, p)) if E is None else np.asarray(E, dtype=np.float64)
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
