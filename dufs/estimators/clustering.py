"""UFCM and M3FS as scikit-learn selectors."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from dufs.api import METHODS
from dufs.errors import ParameterError
from dufs.estimators.base import BASE_CONSTRAINTS, DufsSelector, constraints, estimator_params


class UFCM(DufsSelector):
    """Unsupervised feature analysis with class margin optimisation (Wang et al.): alternate k-means pseudo-labels
    and the top eigenvectors of S_t - alpha S_w - beta D (an l2,p reweighting); features ranked by the row norms of
    the projection W.

    Parameters
    ----------
    n_features : int or "all", default 10
        How many features to select; more than X has, or "all", keeps every feature (the former with a warning,
        as scikit-learn's ``SelectKBest``).
    n_clusters : int or "auto", default "auto"
        "auto": estimated by the eigengap of the rows' kNN graph (:func:`dufs.methods.graph.estimate_clusters`).
    n_components : int or None, default None
        d', the columns of W (< n_features); default ``n_clusters`` (at most n_features - 1).
    alpha, beta : float >= 0, default 1.0
        Weights of the within-cluster scatter and of the l2,p penalty.
    p : float in (0, 2], default 1.0
    max_iter : int, default 30
    n_init : int, default 10
        Random restarts of the cluster update.
    random_state : int, default 0
    values : {"auto", "raw", "presence", "log1p", "sqrt"}, default "auto"
        What UFCM reads of each stored value; "auto": presence (1 for every stored value) for sparse non-negative
        data taken unstandardized (counts), raw values otherwise (docs/methods.md, "What UFCM reads").
    standardize : {"zscore", "scale", "auto"} or None, default "auto"
        "auto": None for sparse data (at most 10% nonzeros), "zscore" for dense.
    client : distributed.Client, optional

    References
    ----------
    S. Wang, F. Nie, X. Chang, L. Yao, X. Li, Q. Z. Sheng, "Unsupervised Feature Analysis with Class Margin
    Optimization", ECML PKDD 2015.
    """

    _method = "ufcm"
    _method_params = estimator_params("ufcm")
    _parameter_constraints: ClassVar[dict] = {**BASE_CONSTRAINTS, **constraints("ufcm")}

    def __init__(self, n_features: int = 10, *, n_clusters: int | str = "auto", n_components: int | None = None,
                 alpha: float = 1.0, beta: float = 1.0, p: float = 1.0, max_iter: int = 30, n_init: int = 10,
                 random_state: int = 0, values: str = "auto",
                 standardize: str | None = METHODS["ufcm"].standardize, client: Any = None):
        self.n_features = n_features
        self.n_clusters = n_clusters
        self.n_components = n_components
        self.alpha = alpha
        self.beta = beta
        self.p = p
        self.max_iter = max_iter
        self.n_init = n_init
        self.random_state = random_state
        self.values = values
        self.standardize = standardize
        self.client = client

    def fit(self, X: Any, y: Any = None) -> UFCM:
        super().fit(X, y)
        self.n_iter_ = int(self.selection_.diagnostics.get("iterations", 1))
        return self

    def _check_samples(self, X: Any) -> None:
        n, d = X.shape
        if self.n_clusters != "auto" and self.n_clusters >= n:
            raise ParameterError(f"UFCM needs more samples than clusters: got n_samples={n}, "
                             f"n_clusters={self.n_clusters}.")
        if d < 2 or self.n_components is not None and self.n_components >= d:
            raise ParameterError(f"UFCM needs n_components < n_features (and at least 2 features): got "
                             f"n_components={self.n_components}, n_features={d}.")


class M3FS(DufsSelector):
    """Unsupervised max-margin feature selection with manifold regularisation (Guo et al.): maximum-margin
    clustering with feature saliencies sigma (0 <= sigma <= 1, sum sigma = m = ``n_features``) and a Laplacian
    term; the features of largest saliency are selected.

    Parameters
    ----------
    n_features : int or "all", default 10
        How many features to select; more than X has, or "all", keeps every feature (the former with a warning,
        as scikit-learn's ``SelectKBest``).
        m, the saliency budget and the number of features selected.
    n_clusters : int or "auto", default "auto"
        "auto": estimated by the eigengap of the rows' kNN graph (:func:`dufs.methods.graph.estimate_clusters`).
        2 is the two-class problem (eqs. (7)-(12)), more the multi-class one (eqs. (16)-(17)).
    solver : {"auto", "faithful", "alternating"}, default "auto"
        "faithful": the paper's cutting plane over CCCP with SOCP steps (needs cvxpy and Clarabel, ``dufs[m3fs]``;
        dense, moderate size); "alternating": labels, a Laplacian-regularised hinge v-step through the engine and
        the closed-form sigma step (any size); "auto": faithful up to 5000 samples x 1000 features.
    C : float > 0, default 1.0
    lambda_ : float >= 0 or None, default None
        The manifold weight; None for the solver's default (faithful 1e-4, alternating 1e-2: chosen on digits
        pairs, iris with noise and breast cancer, where 1.0 put every sample in one cluster).
    l : float or None, default None
        The class-balance bound of eq. (5) (default 0.1 n_samples).
    epsilon : float > 0 or None, default None
        The cutting-plane tolerance of the faithful solver (None: 1e-2).
    graph : str or None, default None
        The sample graph: None for the solver's default (faithful: the paper's fully connected Gaussian graph;
        alternating: a heat-kernel kNN graph up to 50,000 samples, the anchor graph above), "gaussian" (faithful),
        "knn", or "anchor" (alternating, for large n_samples).
    n_neighbors : int or None, default None
        kNN graph neighbours (None: the solver's default, 10 faithful / 5 alternating).
    max_iter : int or None, default None
        Outer iterations of the alternating solver (None: 50).
    polish : int, "auto" or None, default None
        Label flips the alternating solver tries after it stops (None: its default "auto", 8 up to 5000 samples).
    random_state : int, default 0
    standardize : {"zscore", "scale", "auto"} or None, default "zscore"
        "auto": None for sparse data (at most 10% nonzeros), "zscore" for dense.
    client : distributed.Client, optional

    Attributes
    ----------
    labels_ : ndarray of int, (n_samples,)
        The cluster of every sample.
    n_iter_ : int
        Outer iterations (cutting-plane rounds of the faithful solver, alternations of the scalable one).
    scores_ : ndarray
        The saliencies sigma.

    References
    ----------
    Zhao, Kwok, Wang, Zhang, "Unsupervised Maximum Margin Feature Selection with Manifold Regularization",
    CVPR 2009.
    """

    _method = "m3fs"
    _method_params = estimator_params("m3fs")
    _parameter_constraints: ClassVar[dict] = {**BASE_CONSTRAINTS, **constraints("m3fs")}

    def __init__(self, n_features: int = 10, *, n_clusters: int | str = "auto", solver: str = "auto", C: float = 1.0,
                 lambda_: float | None = None, l: float | None = None, epsilon: float | None = None,
                 graph: str | None = None, n_neighbors: int | None = None, max_iter: int | None = None,
                 polish: int | str | None = None, random_state: int = 0,
                 standardize: str | None = METHODS["m3fs"].standardize, client: Any = None):
        self.n_features = n_features
        self.n_clusters = n_clusters
        self.solver = solver
        self.C = C
        self.lambda_ = lambda_
        self.l = l
        self.epsilon = epsilon
        self.graph = graph
        self.n_neighbors = n_neighbors
        self.max_iter = max_iter
        self.polish = polish
        self.random_state = random_state
        self.standardize = standardize
        self.client = client

    def _fit_params(self) -> dict:
        params = super()._fit_params()
        for name in ("lambda_", "graph", "n_neighbors", "l", "epsilon", "max_iter", "polish"):  # None: the solver's
            if params[name] is None:
                del params[name]
        return params

    def _check_samples(self, X: Any) -> None:
        if self.n_clusters != "auto" and self.n_clusters >= X.shape[0]:
            raise ParameterError(f"M3FS needs more samples than clusters: got n_samples={X.shape[0]}, "
                             f"n_clusters={self.n_clusters}.")

    def fit(self, X: Any, y: Any = None) -> M3FS:
        super().fit(X, y)
        d = self.selection_.diagnostics
        self.labels_ = np.asarray(d["labels"], dtype=np.int64)
        self.n_iter_ = int(d.get("iterations", d.get("cutting_planes", 1)))
        return self

    def __sklearn_is_fitted__(self) -> bool:
        # the parameter lambda_ (the paper's name) ends in "_", which sklearn takes for a fitted attribute
        return hasattr(self, "selection_")
