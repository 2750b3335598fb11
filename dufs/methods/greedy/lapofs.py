"""LapAOFS and LapDOFS (He et al. 2011, paper 004): the sequential A- and D-optimal Laplacian selectors."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import scipy.sparse as sp

from dufs.engine import AnchorGraph, Matrix, Transform, laplacian_operator
from dufs.errors import ParameterError
from dufs.kernels.greedy import (
    A_OPTIMAL,
    D_OPTIMAL,
)
from dufs.methods.graph import graph_key, sample_graph
from dufs.methods.greedy.run import GreedyResult, GreedyRun, check_k, run_greedy
from dufs.methods.params import (
    CHECKPOINT_PARAMS,
    GRAPH_PARAMS,
    Param,
    StrOptions,
    check_params,
    integer,
    nonnegative,
    positive,
    table,
)
from dufs.methods.solver import checkpoint_dir, finish_checkpoint

#: what the design's columns are (docs/methods.md, "LapAOFS and LapDOFS", "What the design is made of"): the stored
#: columns (the paper's), or each one centred and scaled to its smoothness on the graph
COLUMNS = ("raw", "smooth")

#: LapAOFS's and LapDOFS's parameters (the paper's lambda1 = lambda2 = 0.01 and k = 4)
LAPOFS_PARAMS = table(
    Param("criterion", "A", (StrOptions({"A", "D"}),), "A-optimal (LapAOFS) or D-optimal (LapDOFS)", estimator=False),
    Param("lambda1", 0.01, (nonnegative(),), "weight of the graph (manifold) regulariser"),
    Param("lambda2", 0.01, (positive(),), "ridge"),
    GRAPH_PARAMS.values(),
    Param("n_neighbors", 4, (integer(1),), "k of the kNN graph"),
    Param("columns", "raw", (StrOptions(set(COLUMNS)),),
          "'raw': the columns as read (the paper's); 'smooth': every candidate column centred and scaled so that "
          "its squared norm is its smoothness on the graph (f~^T W f~ / f^T L f = 1 / its Laplacian score - 1), B "
          "on the graph D^-1/2 W D^-1/2: for sparse counts whose kNN graph follows their clusters"),
    CHECKPOINT_PARAMS.values(),
    Param("checkpoint_every", 1, (integer(1),), "steps between the blocks' checkpoints", estimator=False),
)


# ---------------------------------------------------------------------------------------------------- LapAOFS / LapDOFS
def lapofs(M: Matrix, *, n_features: int, criterion: str = "A", lambda1: float = 0.01, lambda2: float = 0.01,
           W: Any = None, graph: str = "auto", n_neighbors: int = 4, weights: str = "binary", t: float | None = None,
           n_anchors: int = 256, anchor_neighbors: int = 3, embed_dim: int = 64, random_state: int = 0,
           columns: str = "raw", checkpoint: Any = "auto", checkpoint_every: int = 1,
           resume: bool = False) -> GreedyResult:
    """LapAOFS (``criterion="A"``) or LapDOFS (``"D"``) of He, Ji, Zhang, Bao (TPAMI 2011), sequential scheme:
    ``n_features`` features chosen one at a time in feature space (see the module docstring). The sample graph is
    ``W`` or built from ``graph``, ``n_neighbors``, ``weights`` ("binary" or "heat"), ``t`` (the paper: kNN with
    k = 4); L = D - W.

    ``columns``: what the design is made of. ``"raw"`` (the default) is the paper's; ``"smooth"``: every column
    centred and scaled to its smoothness on the graph (:func:`smooth_columns`), with B = I + lambda1 L of the
    symmetrically normalised graph (:func:`normalized_graph`), a departure from the paper for sparse counts whose
    kNN graph follows their clusters: there the paper's criterion ranks by a column's energy, so the most frequent
    features come first and the graph term hardly counts; where the graph does not follow the classes (real text
    sets) the smooth columns are at chance, hence not the default (docs/methods.md, "What the design is made of").
    ``diagnostics["columns"]`` records the choice."""
    name = "lapaofs" if criterion == "A" else "lapdofs"
    check_params(LAPOFS_PARAMS, {"criterion": criterion, "lambda1": lambda1, "lambda2": lambda2, "graph": graph,
                                 "n_neighbors": n_neighbors, "weights": weights, "t": t, "n_anchors": n_anchors,
                                 "anchor_neighbors": anchor_neighbors, "embed_dim": embed_dim,
                                 "random_state": random_state, "columns": columns,
                                 "checkpoint_every": checkpoint_every, "resume": resume}, name)
    lam1, lam2 = float(lambda1), float(lambda2)
    k = check_k(M, n_features)
    t0 = time.perf_counter()
    Wg = sample_graph(M, W, graph=graph, n_neighbors=n_neighbors, weights=weights, t=t, n_anchors=n_anchors,
                      anchor_neighbors=anchor_neighbors, embed_dim=embed_dim, random_state=random_state)
    graph_s = time.perf_counter() - t0
    read = columns
    D, Wb = M, Wg
    if read == "smooth":
        centre, coef = smooth_columns(M, Wg)
        D, Wb = _FixedTransform(M, centre, coef), normalized_graph(Wg)
    L = laplacian_operator(Wb, normed=False)
    problem = {"method": name, "shape": list(M.shape), "nnz": int(M.nnz), "standardize": M.standardize,
               "lambda1": lam1, "lambda2": lam2, "graph": graph_key(Wg), "n_features": k}
    if read != "raw":
        problem["columns"] = read
    directory = checkpoint_dir(M, checkpoint, name, problem)
    if resume and directory is None:
        raise ParameterError(f"{name}(resume=True) needs a checkpoint directory (checkpoint=<directory>)")
    run = GreedyRun(D, k, A_OPTIMAL if criterion == "A" else D_OPTIMAL, lam1, lam2, L, Wb, None, directory,
                    int(checkpoint_every), problem)
    res = run_greedy(run, resume, name)
    res.diagnostics.update(graph_time=graph_s, graph="anchor" if isinstance(Wg, AnchorGraph) else "knn",
                           checkpoint_kept=directory is not None and finish_checkpoint(directory, checkpoint),
                           columns=read)
    return res


# ---------------------------------------------------------------------------------------------------- smooth columns
def smooth_columns(M: Matrix, W: Any) -> tuple[np.ndarray, np.ndarray]:
    """(centre, coef) of every column's smooth design column z = coef (f - centre 1) (f as M reads it, whatever
    its ``standardize``): centre = f^T d / 1^T d, the Laplacian score's degree-weighted mean (d: the degrees of
    ``W``), and coef such that ||z||^2 = f~^T W f~ / f^T L f (f~ = f - centre 1): the part of f's weighted variance
    f~^T D f~ that the graph's edges carry, over the part they do not, 1 / LS - 1 with LS f's Laplacian score.
    A feature no smoother than chance (LS >= 1) or constant gets coef 0; a column of zero roughness is taken at
    1e-6 times its weighted variance. One pass."""
    n = M.shape[0]
    if isinstance(W, AnchorGraph):
        d = np.asarray(W.degrees, dtype=np.float64)
        parts = M.map_blocks(_smooth_block, W.zh_shared(), d, n, np.asarray(W.lam_inv, dtype=np.float64))
    else:
        Ws = sp.csr_array(W, dtype=np.float64)
        d = np.asarray(Ws.sum(axis=1), dtype=np.float64).ravel()
        parts = M.map_blocks(_smooth_block, Ws, d, n, None)
    if not parts:
        return np.zeros(0), np.zeros(0)
    got = np.concatenate([np.asarray(p, dtype=np.float64) for p in parts], axis=1)
    return got[0], got[1]


def _smooth_block(b: Any, W: Any, d: np.ndarray, n: int, lam_inv: np.ndarray | None) -> np.ndarray:
    """(centre, coef) of :func:`smooth_columns` for one feature block (2 x width; runs where the block lives).
    With ``lam_inv``, ``W`` is an anchor graph's Zh and f^T W f = sum_k lam_inv_k (Zh^T f)_k^2."""
    B = sp.csc_array((b.data.astype(np.float64), b.indices, b.indptr), shape=(n, b.width))
    B2 = B.multiply(B)
    vol = float(d.sum())
    fd = B.T @ d
    fdf = B2.T @ d
    if lam_inv is None:
        fwf = np.asarray((B.multiply(W @ B)).sum(axis=0), dtype=np.float64).ravel()
    else:
        P = sp.csr_array(W.T @ B)
        fwf = np.asarray((P.multiply(P)).T @ lam_inv, dtype=np.float64).ravel()
    centre = fd / vol if vol > 0 else np.zeros(b.width)
    den = fdf - fd * centre  # f~^T D f~, f~ = f - centre 1
    num = np.maximum(fdf - fwf, 1e-6 * den)  # f^T L f (= f~^T L f~: L 1 = 0)
    colsum = np.asarray(B.sum(axis=0), dtype=np.float64).ravel()
    sq = np.asarray(B2.sum(axis=0), dtype=np.float64).ravel()
    ff = sq - 2.0 * centre * colsum + n * centre * centre  # ||f~||^2
    ok = (den > 1e-12 * np.maximum(fdf, 1e-300)) & (ff > 0) & (den > num)
    coef = np.zeros(b.width)
    coef[ok] = np.sqrt((den[ok] - num[ok]) / num[ok] / ff[ok])  # f~^T W f~ = f~^T D f~ - f^T L f
    return np.vstack([centre, coef])


def normalized_graph(W: Any) -> Any:
    """D^-1/2 W D^-1/2 (D: the degrees of W; an isolated sample keeps its zero row): its Laplacian's diagonal,
    sum_j W_ij / sqrt(d_i d_j), is about 1 where that of a kNN graph is a row's degree (hundreds at a hub). An
    anchor graph (degrees 1 by construction) is returned as it is."""
    if isinstance(W, AnchorGraph):
        return W
    W = sp.csr_array(W, dtype=np.float64)
    d = np.asarray(W.sum(axis=1), dtype=np.float64).ravel()
    s = np.zeros_like(d)
    np.divide(1.0, np.sqrt(d), out=s, where=d > 0)
    S = sp.diags_array(s)
    return sp.csr_array(S @ W @ S)


class _FixedTransform(Matrix):
    """A view of M's blocks under a fixed per-feature transform z_j = coef_j (x_j - centre_j 1), for a greedy run
    (which reads :attr:`transform` alone)."""

    def __init__(self, M: Matrix, centre: np.ndarray, coef: np.ndarray):
        super().__init__(M, standardize=M.standardize)
        self._fixed = Transform(np.asarray(centre, dtype=np.float64), np.asarray(coef, dtype=np.float64))

    @property
    def transform(self) -> Transform:
        return self._fixed
