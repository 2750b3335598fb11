"""engine layer of dufs (docs/architecture.md, "Layers"): the cluster, the feature-blocked matrix, sample graphs."""

from dufs.engine.blocks import FeatureBlock, PerBlock, StoreBlock
from dufs.engine.cluster import get_client
from dufs.engine.inputs import check_finite, check_labels, input_identity
from dufs.engine.matrix import STANDARDIZE, Matrix, Transform, as_matrix, transform_of
from dufs.engine.state import BlockState
from dufs.engine.stats import ColumnStats

__all__ = ["STANDARDIZE", "BlockState", "ColumnStats", "FeatureBlock", "Matrix", "PerBlock", "StoreBlock",
           "Transform", "as_matrix", "check_finite", "check_labels", "get_client", "input_identity", "transform_of"]
