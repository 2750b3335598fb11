"""engine layer of dufs (docs/architecture.md, "Layers"): the cluster, the feature-blocked matrix, sample graphs.

What the methods may use is exported here (a contract in ``pyproject.toml`` keeps them off the engine's modules):
the matrix and its blocks, per-block statistics and rankings, sample graphs and row pieces, and the checks a solver
needs to recover from lost workers.
"""

from dufs.engine.blocks import FeatureBlock, PerBlock, StoreBlock, ranked_head
from dufs.engine.cluster import get_client, is_lost
from dufs.engine.dispatch import current_client, tree_sum_values
from dufs.engine.graphs import AnchorGraph, anchor_graph, graph_rows, knn_graph, laplacian_operator, resolve_graph
from dufs.engine.inputs import check_finite, check_labels, input_identity
from dufs.engine.matrix import STANDARDIZE, Matrix, Transform, as_matrix, transform_of
from dufs.engine.rows import Rows, max_task_bytes
from dufs.engine.state import BlockState
from dufs.engine.stats import ColumnStats, block_stats

__all__ = ["STANDARDIZE", "AnchorGraph", "BlockState", "ColumnStats", "FeatureBlock", "Matrix", "PerBlock", "Rows",
           "StoreBlock", "Transform", "anchor_graph", "as_matrix", "block_stats", "check_finite", "check_labels",
           "current_client", "get_client", "graph_rows", "input_identity", "is_lost", "knn_graph",
           "laplacian_operator", "max_task_bytes", "ranked_head", "resolve_graph", "transform_of", "tree_sum_values"]
