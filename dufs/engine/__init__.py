"""engine layer of dufs (docs/architecture.md, "Layers"): the cluster, the feature-blocked matrix, sample graphs.

What the methods may use is exported here (a contract in ``pyproject.toml`` keeps them off the engine's modules):
the matrix and its blocks, per-block statistics and rankings, sample graphs and row pieces, the checks a solver
needs to recover from lost workers, and the few words of transport a solver with state on the workers says: ship
an array to the workers (:func:`shipped`, :func:`in_shared_memory`), have results written into one array here
(:func:`receiving`), take a pooled output array (:func:`buffer`).
"""

from dufs.engine.blocks import (
    FeatureBlock,
    PerBlock,
    StoreBlock,
    partition_matvec,
    partition_rmatvec,
    ranked_head,
    thread_runs,
)
from dufs.engine.buffers import buffer
from dufs.engine.cluster import get_client, is_lost
from dufs.engine.direct import last_timeline
from dufs.engine.dispatch import (
    current_client,
    in_shared_memory,
    mark_spread,
    shipped,
    tree_sum_into,
    tree_sum_values,
)
from dufs.engine.exchange import (
    AllSum,
    HeldPieces,
    abort_exchange,
    allreduce_sum,
    ensure_plugin,
    fetch_kept,
    piece_bounds,
)
from dufs.engine.executor import Executor
from dufs.engine.graphs import (
    AnchorGraph,
    anchor_graph,
    graph_metric,
    graph_rows,
    graph_values,
    knn_graph,
    laplacian_operator,
    resolve_graph,
    sparse_counts,
)
from dufs.engine.inputs import check_finite, check_labels, input_identity
from dufs.engine.kept import (
    Kept,
    as_future,
    distinct_workers,
    fetch,
    flush,
    joined,
    kept_call,
    kept_calls,
    kept_vectors,
    piece_workers,
)
from dufs.engine.knn import graph_built
from dufs.engine.matrix import ROWS, STANDARDIZE, VALUES, Matrix, Transform, as_matrix, transform_of
from dufs.engine.rows import Rows, max_task_bytes
from dufs.engine.shm import Receiving, receiving
from dufs.engine.state import BlockState
from dufs.engine.stats import ColumnStats, block_stats
from dufs.engine.touched import Pieced

__all__ = ["AllSum", "AnchorGraph", "BlockState", "ColumnStats", "Executor", "FeatureBlock", "HeldPieces", "Kept",
           "Matrix", "PerBlock", "Pieced", "ROWS", "Receiving", "Rows", "STANDARDIZE", "StoreBlock", "Transform",
           "VALUES",
           "abort_exchange", "allreduce_sum", "anchor_graph", "as_future", "as_matrix", "block_stats", "buffer",
           "check_finite", "check_labels", "current_client", "distinct_workers", "ensure_plugin", "fetch",
           "fetch_kept", "flush", "get_client", "graph_built", "graph_metric", "graph_rows", "graph_values",
           "in_shared_memory", "input_identity", "is_lost", "joined", "kept_call", "kept_calls", "kept_vectors",
           "knn_graph",
           "laplacian_operator", "last_timeline", "mark_spread", "max_task_bytes", "partition_matvec",
           "partition_rmatvec", "piece_bounds", "piece_workers", "ranked_head", "receiving", "resolve_graph", "shipped",
           "sparse_counts", "thread_runs", "transform_of", "tree_sum_into", "tree_sum_values"]
