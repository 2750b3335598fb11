"""LapAOFS, LapDOFS and JCFS as scikit-learn selectors."""

from __future__ import annotations

from typing import Any, ClassVar

from dufs.api import METHODS
from dufs.errors import ParameterError
from dufs.estimators.base import BASE_CONSTRAINTS, GreedySelector, constraints, estimator_params


class LapAOFS(GreedySelector):
    """Laplacian-regularised A-optimal feature selection (unsupervised, greedy).

    Chooses ``n_features`` features one at a time, each minimising Tr(H^-1) with
    H = X_S^T (I + lambda1 L) X_S + lambda2 I (He et al. eq. (20)), in feature space with O(1) numbers per candidate
    (see :mod:`dufs.methods.greedy`).

    Parameters
    ----------
    n_features : int or "all", default 10
        How many features to select; more than X has, or "all", keeps every feature (the former with a warning,
        as scikit-learn's ``SelectKBest``).
    lambda1 : float >= 0, default 0.01
        Weight of the Laplacian (manifold) regulariser.
    lambda2 : float > 0, default 0.01
        Ridge weight.
    W : sparse (n_samples, n_samples) or AnchorGraph, optional
        The sample graph; default built from ``graph``, ``n_neighbors``, ``weights``, ``t``.
    graph : {"auto", "knn", "anchor"}, default "auto"
        kNN up to 50,000 samples, the anchor graph above ("auto"), or either.
    n_neighbors : int, default 4
        The paper's k.
    weights : {"binary", "heat"}, default "binary"
    t : float > 0 or None, default None
    n_anchors, anchor_neighbors, embed_dim : int
        Anchor graph settings (``graph="anchor"``).
    random_state : int, default 0
    columns : {"raw", "smooth"}, default "raw"
        What the design is made of: "raw", the columns as stored (the paper's); "smooth", each centred and scaled
        to its smoothness on the graph, B on the normalised graph, for sparse counts whose kNN graph follows their
        clusters (docs/methods.md, "What the design is made of").
    standardize : {"zscore", "scale"} or None, default None
    client : distributed.Client, optional

    Attributes
    ----------
    criterion_, objective_ : ndarray
        Per step: the chosen feature's eq. (20) value and Tr(H^-1) after the step.

    References
    ----------
    X. He, M. Ji, C. Zhang, H. Bao, "A Variance Minimization Criterion to Feature Selection Using Laplacian
    Regularization", TPAMI 2011.
    """

    _method = "lapaofs"
    _method_params = estimator_params("lapaofs")
    _parameter_constraints: ClassVar[dict] = {**BASE_CONSTRAINTS, **constraints("lapaofs")}

    def __init__(self, n_features: int = 10, *, lambda1: float = 0.01, lambda2: float = 0.01, W: Any = None,
                 graph: str = "auto", n_neighbors: int = 4, weights: str = "binary", t: float | None = None,
                 n_anchors: int = 256, anchor_neighbors: int = 3, embed_dim: int = 64, random_state: int = 0,
                 columns: str = "raw", standardize: str | None = None, client: Any = None):
        self.n_features = n_features
        self.lambda1 = lambda1
        self.lambda2 = lambda2
        self.W = W
        self.graph = graph
        self.n_neighbors = n_neighbors
        self.weights = weights
        self.t = t
        self.n_anchors = n_anchors
        self.anchor_neighbors = anchor_neighbors
        self.embed_dim = embed_dim
        self.random_state = random_state
        self.columns = columns
        self.standardize = standardize
        self.client = client


class LapDOFS(LapAOFS):
    """Laplacian-regularised D-optimal feature selection (unsupervised, greedy): each step maximises det H
    (He et al. eq. (29)). Parameters and attributes as :class:`LapAOFS` (``criterion_``: the chosen feature's
    eq. (29) value; ``objective_``: log det H)."""

    _method = "lapdofs"


class JCFS(GreedySelector):
    """Joint clustering and feature selection (Du, Shen): alternate the spectral embedding Y (the ``n_clusters``
    smallest eigenvectors of L + lambda_ (X_S X_S^T + gamma I)^-1, L the normalised kNN Laplacian) and the greedy
    Fisher step (eq. (14)) until the selection stops changing.

    Parameters
    ----------
    n_features : int or "all", default 10
        How many features to select; more than X has, or "all", keeps every feature (the former with a warning,
        as scikit-learn's ``SelectKBest``).
    n_clusters : int or "auto", default "auto"
        "auto": estimated by the eigengap of the rows' kNN graph (:func:`dufs.methods.graph.estimate_clusters`).
    lambda_ : float >= 0, default 1e-6
        Trade-off between the spectral and the Fisher terms (the paper searches 1e-6 .. 1e-3); lambda_ / gamma is
        the weight that pulls the embedding into the span of the selected features (0.01 by default, chosen on
        data: at 1 the first selection locks the embedding in).
    gamma : float > 0, default 1e-4
    W, graph, n_neighbors (default 5), weights, t, n_anchors, anchor_neighbors, embed_dim, random_state
        The sample graph, as :class:`LapAOFS`.
    max_iter : int, default 10
    values : {"auto", "raw", "presence", "log1p", "sqrt"}, default "auto"
    rows : {"auto", "raw", "unit"}, default "auto"
        What JCFS reads; "auto": sparse non-negative data (counts) as presence with every row at unit norm (then
        standardized), anything else as it is (docs/methods.md, "What JCFS reads").
    standardize : {"zscore", "scale"} or None, default "zscore"
        JCFS's Fisher criterion assumes centred features; on features of one scale (pixels) None did 1-3 points
        better, on mixed scales (breast cancer) "zscore" 0.90 against 0.76 k-means accuracy.
    client : distributed.Client, optional

    Attributes
    ----------
    n_iter_ : int
        Alternations of the spectral and the greedy step run.
    criterion_, objective_ : ndarray
        Per step of the last greedy pass: the chosen feature's eq. (14) value and tr(Y^T M_S Y) after the step.

    References
    ----------
    L. Du, Y.-D. Shen, "Joint Clustering and Feature Selection", WAIM 2013.
    """

    _method = "jcfs"
    _method_params = estimator_params("jcfs")
    _parameter_constraints: ClassVar[dict] = {**BASE_CONSTRAINTS, **constraints("jcfs")}

    def __init__(self, n_features: int = 10, *, n_clusters: int | str = "auto", lambda_: float = 1e-6,
                 gamma: float = 1e-4, W: Any = None, graph: str = "auto", n_neighbors: int = 5, weights: str = "binary",
                 t: float | None = None, n_anchors: int = 256, anchor_neighbors: int = 3, embed_dim: int = 64,
                 max_iter: int = 10, random_state: int = 0, values: str = "auto", rows: str = "auto",
                 standardize: str | None = METHODS["jcfs"].standardize, client: Any = None):
        self.n_features = n_features
        self.n_clusters = n_clusters
        self.lambda_ = lambda_
        self.gamma = gamma
        self.W = W
        self.graph = graph
        self.n_neighbors = n_neighbors
        self.weights = weights
        self.t = t
        self.n_anchors = n_anchors
        self.anchor_neighbors = anchor_neighbors
        self.embed_dim = embed_dim
        self.max_iter = max_iter
        self.random_state = random_state
        self.values = values
        self.rows = rows
        self.standardize = standardize
        self.client = client

    def fit(self, X: Any, y: Any = None) -> JCFS:
        super().fit(X, y)
        self.n_iter_ = int(self.selection_.diagnostics["iterations"])
        return self

    def __sklearn_is_fitted__(self) -> bool:
        # the parameter lambda_ (the paper's name) ends in "_", which sklearn takes for a fitted attribute
        return hasattr(self, "selection_")

    def _check_samples(self, X: Any) -> None:
        super()._check_samples(X)
        if self.n_clusters != "auto" and self.n_clusters >= X.shape[0]:
            raise ParameterError(f"JCFS needs more samples than clusters: got n_samples={X.shape[0]}, "
                             f"n_clusters={self.n_clusters}.")
