"""engine layer of dufs (docs/architecture.md, "Layers"): the cluster, the feature-blocked matrix, sample graphs."""

from dufs.engine.cluster import get_client
from dufs.engine.matrix import BlockState, ColumnStats, FeatureBlock, Matrix, PerBlock, as_matrix

__all__ = ["BlockState", "ColumnStats", "FeatureBlock", "Matrix", "PerBlock", "as_matrix", "get_client"]
