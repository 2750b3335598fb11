"""MMFS, max-margin feature selection (paper 002; docs/methods.md, "MMFS"), as a package of its parts:

- :mod:`~dufs.methods.mmfs.problem`: the parameters, the columns' geometry, the relevances and the margins;
- :mod:`~dufs.methods.mmfs.solver`: the distributed dual coordinate descent (rounds, the plane search, the gap);
- :mod:`~dufs.methods.mmfs.partition`: a partition's side of a round, where its blocks live;
- :mod:`~dufs.methods.mmfs.gram`: serial epochs over the working sets on the driver;
- :mod:`~dufs.methods.mmfs.records`, :mod:`~dufs.methods.mmfs.checkpoint`: what a round reports, what is saved;
- :mod:`~dufs.methods.mmfs.method`: :func:`mmfs` as ``dufs.fit`` runs it (gamma path, partitions, checkpoints);
- :mod:`~dufs.methods.mmfs.nonlinear`: MMFS with a nonlinear similarity between features.
"""

from dufs.methods.mmfs.method import MMFSResult, auto_partitions, mmfs
from dufs.methods.mmfs.problem import (
    MMFS_PARAMS,
    block_margins,
    class_relevance,
    class_targets,
    encode_labels,
    geometry,
    margin_spec,
    margins,
    relevance,
)
from dufs.methods.mmfs.solver import solve

__all__ = ["MMFS_PARAMS", "MMFSResult", "auto_partitions", "block_margins", "class_relevance", "class_targets",
           "encode_labels", "geometry", "margin_spec", "margins", "mmfs", "relevance", "solve"]
