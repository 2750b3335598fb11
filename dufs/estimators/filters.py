"""The filters as scikit-learn selectors: variance, |correlation|, Fisher score, Laplacian score."""

from __future__ import annotations

from typing import Any, ClassVar

from dufs.api import METHODS
from dufs.engine.graphs import resolve_graph
from dufs.errors import ParameterError
from dufs.estimators.base import BASE_CONSTRAINTS, DufsSelector, constraints, estimator_params


class VarianceSelector(DufsSelector):
    """The ``n_features`` features of largest variance (unsupervised; ``y`` is ignored).

    Parameters
    ----------
    n_features : int or "all", default 10
    standardize : {"zscore", "scale"} or None, default None
        The implicit transform of the data (the variance is always of the raw features).
    client : distributed.Client, optional
        Default: the active client, else a synchronous run for in-memory input.
    """

    _method = "variance"

    def __init__(self, n_features: int = 10, *, standardize: str | None = METHODS["variance"].standardize,
                 client: Any = None):
        self.n_features = n_features
        self.standardize = standardize
        self.client = client


class CorrelationSelector(DufsSelector):
    """The ``n_features`` features of largest |Pearson correlation| with ``y`` (supervised).

    Parameters
    ----------
    n_features : int or "all", default 10
        How many features to select; more than X has, or "all", keeps every feature (the former with a warning,
        as scikit-learn's ``SelectKBest``).
    standardize : {"zscore", "scale"} or None, default "zscore"
    client : distributed.Client, optional
    """

    _method = "correlation"

    def __init__(self, n_features: int = 10, *, standardize: str | None = METHODS["correlation"].standardize,
                 client: Any = None):
        self.n_features = n_features
        self.standardize = standardize
        self.client = client


class FisherScore(DufsSelector):
    """The ``n_features`` features of largest Fisher score S_b / S_w with the classes ``y`` (supervised).

    Parameters
    ----------
    n_features : int or "all", default 10
        How many features to select; more than X has, or "all", keeps every feature (the former with a warning,
        as scikit-learn's ``SelectKBest``).
    standardize : {"zscore", "scale"} or None, default None
    client : distributed.Client, optional

    References
    ----------
    Gu, Li, Han, "Generalized Fisher Score for Feature Selection", UAI 2011 (the Fisher score, section 2).
    """

    _method = "fisher"

    def __init__(self, n_features: int = 10, *, standardize: str | None = METHODS["fisher"].standardize,
                 client: Any = None):
        self.n_features = n_features
        self.standardize = standardize
        self.client = client

    def _labels(self, y: Any) -> Any:
        # classes of any kind (strings, booleans, numbers): dufs.fit encodes them; a continuous y is an error there
        self._set_classes(y)
        return y


class LaplacianScore(DufsSelector):
    """The ``n_features`` features of smallest Laplacian score on a kNN graph of the samples (unsupervised).

    Parameters
    ----------
    n_features : int or "all", default 10
        How many features to select; more than X has, or "all", keeps every feature (the former with a warning,
        as scikit-learn's ``SelectKBest``).
    W : sparse (n_samples, n_samples) or AnchorGraph, optional
        A precomputed sample graph (then the graph parameters below are not used).
    n_neighbors : int, default 5
        Neighbours of each sample in the graph; needs n_samples > n_neighbors.
    weights : {"binary", "heat"}, default "binary"
    t : float > 0 or None, default None
        Heat-kernel width; default the mean squared distance over the kNN edges.
    graph : {"auto", "knn", "anchor"}, default "auto"
        The exact kNN graph, or the scalable anchor graph (Liu et al. 2010) for large n_samples; "auto": kNN up to
        50,000 samples, the anchor graph above.
    n_anchors : int, default 256
        Anchors of the anchor graph (k-means centres in a random-projection embedding).
    anchor_neighbors : int, default 3
        Anchors each sample is linked to.
    embed_dim : int, default 64
        Dimension of the random projection the anchor graph is built in.
    random_state : int, default 0
        Seed of the projection and of k-means (anchor graph).
    standardize : {"zscore", "scale"} or None, default None
    client : distributed.Client, optional

    References
    ----------
    He, Cai, Niyogi, "Laplacian Score for Feature Selection", NIPS 2005; He et al., TPAMI 2011, eq. (3).
    Liu, He, Chang, "Large Graph Construction for Scalable Semi-Supervised Learning", ICML 2010.
    """

    _method = "laplacian"
    _method_params = estimator_params("laplacian")
    _parameter_constraints: ClassVar[dict] = {**BASE_CONSTRAINTS, **constraints("laplacian")}

    def __init__(self, n_features: int = 10, *, W: Any = None, n_neighbors: int = 5, weights: str = "binary",
                 t: float | None = None, graph: str = "auto", n_anchors: int = 256, anchor_neighbors: int = 3,
                 embed_dim: int = 64, random_state: int = 0,
                 standardize: str | None = METHODS["laplacian"].standardize, client: Any = None):
        self.n_features = n_features
        self.W = W
        self.n_neighbors = n_neighbors
        self.weights = weights
        self.t = t
        self.graph = graph
        self.n_anchors = n_anchors
        self.anchor_neighbors = anchor_neighbors
        self.embed_dim = embed_dim
        self.random_state = random_state
        self.standardize = standardize
        self.client = client

    def _check_samples(self, X: Any) -> None:
        n = X.shape[0]
        if resolve_graph(self.graph, n, type(self).__name__) == "anchor":
            if n < max(self.n_anchors, self.anchor_neighbors):
                raise ParameterError(f"LaplacianScore(graph='anchor') needs at least n_anchors samples: got "
                                 f"n_samples={n}, n_anchors={self.n_anchors}; lower n_anchors.")
            return
        if n <= self.n_neighbors:
            raise ParameterError(f"LaplacianScore needs more samples than neighbours: got n_samples={n}, "
                             f"n_neighbors={self.n_neighbors}; lower n_neighbors or give more samples.")
