"""LapAOFS and LapDOFS (He et al. 2011, paper 004): the sequential A- and D-optimal Laplacian selectors."""

from __future__ import annotations

import time
from typing import Any

from dufs.engine import AnchorGraph, Matrix, laplacian_operator
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

#: LapAOFS's and LapDOFS's parameters (the paper's lambda1 = lambda2 = 0.01 and k = 4)
LAPOFS_PARAMS = table(
    Param("criterion", "A", (StrOptions({"A", "D"}),), "A-optimal (LapAOFS) or D-optimal (LapDOFS)", estimator=False),
    Param("lambda1", 0.01, (nonnegative(),), "weight of the graph (manifold) regulariser"),
    Param("lambda2", 0.01, (positive(),), "ridge"),
    GRAPH_PARAMS.values(),
    Param("n_neighbors", 4, (integer(1),), "k of the kNN graph"),
    CHECKPOINT_PARAMS.values(),
    Param("checkpoint_every", 1, (integer(1),), "steps between the blocks' checkpoints", estimator=False),
)


# ---------------------------------------------------------------------------------------------------- LapAOFS / LapDOFS
def lapofs(M: Matrix, *, n_features: int, criterion: str = "A", lambda1: float = 0.01, lambda2: float = 0.01,
           W: Any = None, graph: str = "auto", n_neighbors: int = 4, weights: str = "binary", t: float | None = None,
           n_anchors: int = 256, anchor_neighbors: int = 3, embed_dim: int = 64, random_state: int = 0,
           checkpoint: Any = "auto", checkpoint_every: int = 1, resume: bool = False) -> GreedyResult:
    """LapAOFS (``criterion="A"``) or LapDOFS (``"D"``) of He, Ji, Zhang, Bao (TPAMI 2011), sequential scheme:
    ``n_features`` features chosen one at a time in feature space (see the module docstring). The sample graph is
    ``W`` or built from ``graph``, ``n_neighbors``, ``weights`` ("binary" or "heat"), ``t`` (the paper: kNN with
    k = 4); L = D - W."""
    name = "lapaofs" if criterion == "A" else "lapdofs"
    check_params(LAPOFS_PARAMS, {"criterion": criterion, "lambda1": lambda1, "lambda2": lambda2, "graph": graph,
                                 "n_neighbors": n_neighbors, "weights": weights, "t": t, "n_anchors": n_anchors,
                                 "anchor_neighbors": anchor_neighbors, "embed_dim": embed_dim,
                                 "random_state": random_state, "checkpoint_every": checkpoint_every,
                                 "resume": resume}, name)
    lam1, lam2 = float(lambda1), float(lambda2)
    k = check_k(M, n_features)
    t0 = time.perf_counter()
    Wg = sample_graph(M, W, graph=graph, n_neighbors=n_neighbors, weights=weights, t=t, n_anchors=n_anchors,
                      anchor_neighbors=anchor_neighbors, embed_dim=embed_dim, random_state=random_state)
    graph_s = time.perf_counter() - t0
    L = laplacian_operator(Wg, normed=False)
    problem = {"method": name, "shape": list(M.shape), "nnz": int(M.nnz), "standardize": M.standardize,
               "lambda1": lam1, "lambda2": lam2, "graph": graph_key(Wg), "n_features": k}
    directory = checkpoint_dir(M, checkpoint, name, problem)
    if resume and directory is None:
        raise ParameterError(f"{name}(resume=True) needs a checkpoint directory (checkpoint=<directory>)")
    run = GreedyRun(M, k, A_OPTIMAL if criterion == "A" else D_OPTIMAL, lam1, lam2, L, Wg, None, directory,
               int(checkpoint_every), problem)
    res = run_greedy(run, resume, name)
    res.diagnostics.update(graph_time=graph_s, graph="anchor" if isinstance(Wg, AnchorGraph) else "knn",
                           checkpoint_kept=directory is not None and finish_checkpoint(directory, checkpoint))
    return res
