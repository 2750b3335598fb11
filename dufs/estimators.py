"""scikit-learn estimators over the functional API, one per method.

Each estimator validates its parameters (one ``_parameter_constraints`` table) and its input, calls the plain
function :func:`dufs.api.fit`, and stores what it found in attributes ending in ``_``. Choosing the columns
(``transform``, ``get_support``, ``get_feature_names_out``) comes from
:class:`~sklearn.feature_selection.SelectorMixin`.

>>> from dufs.estimators import FisherScore
>>> FisherScore(n_features=20).fit(X, y).get_support(indices=True)   # doctest: +SKIP
"""

from __future__ import annotations

from numbers import Integral, Real
from typing import Any, ClassVar

import numpy as np
from sklearn.base import BaseEstimator, _fit_context
from sklearn.feature_selection import SelectorMixin
from sklearn.utils._param_validation import Interval, InvalidParameterError, StrOptions
from sklearn.utils.validation import check_consistent_length, check_is_fitted, column_or_1d, validate_data

from dufs.api import METHODS, fit, rank
from dufs.errors import ParameterError

__all__ = ["JCFS", "M3FS", "MMFS", "UFCM", "CorrelationSelector", "FisherScore", "LapAOFS", "LapDOFS", "LaplacianScore",
           "VarianceSelector"]

_STANDARDIZE = [StrOptions({"zscore", "scale"}), None]


class EstimatorParameterError(ParameterError, InvalidParameterError):
    """A parameter of a dufs estimator is out of range: a dufs :class:`~dufs.errors.ParameterError` and, for
    scikit-learn's tools, its ``InvalidParameterError``."""


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


class _DufsSelector(SelectorMixin, BaseEstimator):
    """Shared base: validate, call :func:`dufs.api.fit`, keep the :class:`~dufs.selection.Selection`.

    Subclasses set ``_method`` (a key of :data:`dufs.api.METHODS`), define ``__init__`` with their own
    parameters, and list extra method parameters in ``_method_params``.

    Attributes
    ----------
    scores_ : ndarray of float64, (n_features_in_,)
        The method's score of every feature (see ``higher_is_better_``).
    ranking_ : ndarray of int64, (n_features_in_,)
        Every feature index, best first (NaN scores last, ties by the lower index).
    selection_ : dufs.Selection
        The result of :func:`dufs.fit`, with its diagnostics.
    higher_is_better_ : bool
    n_features_in_ : int
    feature_names_in_ : ndarray of str
        Only when ``X`` has string column names.
    """

    _method: ClassVar[str]
    _method_params: ClassVar[tuple[str, ...]] = ()
    _parameter_constraints: ClassVar[dict] = {
        "n_features": [Interval(Integral, 1, None, closed="left"), StrOptions({"all"})],
        "standardize": _STANDARDIZE,
        "client": [None, object],
    }

    def _labels(self, y: Any) -> Any:
        return y

    def _set_classes(self, y: Any) -> None:
        try:
            self.classes_ = np.unique(y)
        except TypeError:  # labels of mixed types: dufs.fit names the row
            pass

    def _validate_params(self) -> None:
        # scikit-learn's parameter table, its errors made dufs errors; a bool is no count of features (as in fit)
        try:
            super()._validate_params()
        except InvalidParameterError as exc:
            raise EstimatorParameterError(_one_line(exc)) from None
        if isinstance(self.n_features, bool | np.bool_):
            raise EstimatorParameterError(f"The 'n_features' parameter of {type(self).__name__} must be an int in "
                                          f"the range [1, inf) or a str among {{'all'}}. Got {self.n_features!r} "
                                          f"instead.")

    def _validate_input(self, X: Any, y: Any) -> tuple[Any, Any]:
        """X as float64 (NumPy or SciPy CSR/CSC) and, for a supervised method, y as a vector of labels of any type
        (numbers, strings, booleans). Non-finite values are left to :func:`dufs.fit`, which names the first (row,
        feature); scikit-learn's other refusals become one-line :class:`~dufs.errors.ParameterError` s."""
        supervised = METHODS[self._method].supervised
        if supervised and y is None:
            raise ParameterError(f"{type(self).__name__} requires y to be passed, but the target y is None: it is a "
                                 f"supervised selector, give the labels")
        try:
            X = validate_data(self, X, accept_sparse=["csr", "csc"], dtype=np.float64, ensure_all_finite=False)
            if not supervised:
                return X, None
            y = column_or_1d(y, warn=True)  # a column vector warns (DataConversionWarning), as in scikit-learn
            check_consistent_length(X, y)
        except ParameterError:
            raise
        except ValueError as exc:
            raise ParameterError(_one_line(exc)) from None
        return X, self._labels(y)

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X: Any, y: Any = None) -> _DufsSelector:
        """Score every feature of ``X`` and select the best ``n_features``.

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features)
            Finite numbers: a NaN or infinity is a :class:`~dufs.errors.ParameterError` naming its row and feature.
        y : array-like of shape (n_samples,)
            Labels; required by the supervised methods, ignored by the others. Classes may be numbers, strings or
            booleans; the Fisher score and MMFS refuse a continuous target, the correlation filter takes it.

        Returns
        -------
        self
        """
        spec = METHODS[self._method]
        X, y = self._validate_input(X, y)
        self._check_samples(X)
        params = self._fit_params()
        # more than X has (or "all"): every feature, with a DufsWarning for the former (as SelectKBest)
        self.selection_ = fit(X, y, method=self._method, n_features=self.n_features, client=self.client,
                              standardize=self.standardize, **params)
        self.scores_ = self.selection_.scores
        self.higher_is_better_ = spec.higher_is_better
        self.ranking_ = rank(self.scores_, spec.higher_is_better)
        return self

    def _fit_params(self) -> dict:
        return {p: getattr(self, p) for p in self._method_params}

    def _check_samples(self, X: Any) -> None:
        """Method-specific checks of the validated input (raise a one-line ParameterError, a ValueError)."""

    def _get_support_mask(self) -> np.ndarray:
        check_is_fitted(self)
        return self.selection_.support_mask

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True
        tags.target_tags.required = METHODS[self._method].supervised
        return tags


class VarianceSelector(_DufsSelector):
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


class CorrelationSelector(_DufsSelector):
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


class FisherScore(_DufsSelector):
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


class LaplacianScore(_DufsSelector):
    """The ``n_features`` features of smallest Laplacian score on a kNN graph of the samples (unsupervised).

    Parameters
    ----------
    n_features : int or "all", default 10
        How many features to select; more than X has, or "all", keeps every feature (the former with a warning,
        as scikit-learn's ``SelectKBest``).
    n_neighbors : int, default 5
        Neighbours of each sample in the graph; needs n_samples > n_neighbors.
    weights : {"binary", "heat"}, default "binary"
    t : float > 0 or None, default None
        Heat-kernel width; default the mean squared distance over the kNN edges.
    graph : {"knn", "anchor"}, default "knn"
        The exact kNN graph, or the scalable anchor graph (Liu et al. 2010) for large n_samples.
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
    _method_params = ("n_neighbors", "weights", "t", "graph", "n_anchors", "anchor_neighbors", "embed_dim",
                      "random_state")
    _parameter_constraints: ClassVar[dict] = {
        **_DufsSelector._parameter_constraints,
        "n_neighbors": [Interval(Integral, 1, None, closed="left")],
        "weights": [StrOptions({"binary", "heat"})],
        "t": [None, Interval(Real, 0, None, closed="neither")],
        "graph": [StrOptions({"knn", "anchor"})],
        "n_anchors": [Interval(Integral, 1, None, closed="left")],
        "anchor_neighbors": [Interval(Integral, 1, None, closed="left")],
        "embed_dim": [Interval(Integral, 1, None, closed="left")],
        "random_state": [Interval(Integral, 0, None, closed="left")],
    }

    def __init__(self, n_features: int = 10, *, n_neighbors: int = 5, weights: str = "binary",
                 t: float | None = None, graph: str = "knn", n_anchors: int = 256, anchor_neighbors: int = 3,
                 embed_dim: int = 64, random_state: int = 0,
                 standardize: str | None = METHODS["laplacian"].standardize, client: Any = None):
        self.n_features = n_features
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
        if self.graph == "anchor":
            if n < max(self.n_anchors, self.anchor_neighbors):
                raise ParameterError(f"LaplacianScore(graph='anchor') needs at least n_anchors samples: got "
                                 f"n_samples={n}, n_anchors={self.n_anchors}; lower n_anchors.")
            return
        if n <= self.n_neighbors:
            raise ParameterError(f"LaplacianScore needs more samples than neighbours: got n_samples={n}, "
                             f"n_neighbors={self.n_neighbors}; lower n_neighbors or give more samples.")


class MMFS(_DufsSelector):
    """Max-margin feature selection by dual coordinate descent (Prasad, Khandelwal, Biswas; supervised).

    Features are the points of a soft-margin problem with one margin per feature (its relevance); the features
    with a positive dual variable alpha are selected, ranked by alpha (docs/methods.md, "MMFS").

    Parameters
    ----------
    n_features : int or "all", default 10
        How many features to select; more than X has, or "all", keeps every feature (the former with a warning,
        as scikit-learn's ``SelectKBest``).
    C : float > 0, default 1.0
        Soft-margin constant (the box 0 <= alpha <= C).
    theta : float in (0, 1), default 0.5
        Relevance against redundancy: margins rho = theta / (1 - theta) * relevance.
    gamma : "auto" or float > 0, default "auto"
        The bias regulariser; smaller gamma, more features in the support. "auto" follows gamma = 1, 1/2, 1/4, ...
        with warm starts until the support holds ``n_features``; with a fixed gamma and a smaller support the rest
        are the features closest to entering it (dual gradient).
    relevance : {"correlation", "fisher"}, default "correlation"
        |f_i^T y~| (|Pearson correlation| under "zscore") or normalised Fisher scores.
    kernel : {"linear", "poly2", "rbf"}, default "linear"
        Similarity between features: f_i^T f_j (the correlation under "zscore"), its square (the paper's
        squared-correlation kernel) or a Gaussian; the nonlinear kernels are for up to ~1e5 features.
    tol : float > 0, default 1e-3
        Relative duality gap at which the solver stops.
    max_epochs : int, default 500
        Rounds (epochs) per gamma.
    random_state : int, default 0
        Seed of the coordinate orders.
    n_partitions : int or "auto", default "auto"
        Feature partitions solved side by side each round (linear kernel): "auto" is one per worker holding
        blocks, and one (serial DCD) in this process or for small or dense data.
    standardize : {"zscore", "scale"} or None, default "zscore"
        "zscore" makes the linear kernel the Pearson correlation (the paper's setting); "scale" is the paper's
        setting for large sparse data (no centring).
    client : distributed.Client, optional

    Attributes
    ----------
    alpha_ : ndarray (n_features_in_,)
    w_ : ndarray (n_samples,)
        sum_j alpha_j f_j.
    b_ : float
        gamma * sum_j alpha_j.
    diagnostics_ : dict
        Objective, duality gap, rounds, gamma used, support size, trace per round.
    classes_ : ndarray
        The labels seen.

    References
    ----------
    Y. Prasad, D. Khandelwal, K. K. Biswas, "Max-Margin Feature Selection", Pattern Recognition Letters 2017.
    """

    _method = "mmfs"
    _method_params = ("C", "theta", "gamma", "relevance", "kernel", "tol", "max_epochs", "random_state",
                      "n_partitions")
    _parameter_constraints: ClassVar[dict] = {
        **_DufsSelector._parameter_constraints,
        "C": [Interval(Real, 0, None, closed="neither")],
        "theta": [Interval(Real, 0, 1, closed="neither")],
        "gamma": [StrOptions({"auto"}), Interval(Real, 0, None, closed="neither")],
        "relevance": [StrOptions({"correlation", "fisher"})],
        "kernel": [StrOptions({"linear", "poly2", "rbf"})],
        "tol": [Interval(Real, 0, None, closed="neither")],
        "max_epochs": [Interval(Integral, 1, None, closed="left")],
        "random_state": [Interval(Integral, 0, None, closed="left")],
        "n_partitions": [StrOptions({"auto"}), Interval(Integral, 1, None, closed="left")],
    }

    def __init__(self, n_features: int = 10, *, C: float = 1.0, theta: float = 0.5, gamma: Any = "auto",
                 relevance: str = "correlation", kernel: str = "linear", tol: float = 1e-3, max_epochs: int = 500,
                 random_state: int = 0, n_partitions: Any = "auto",
                 standardize: str | None = METHODS["mmfs"].standardize, client: Any = None):
        self.n_features = n_features
        self.C = C
        self.theta = theta
        self.gamma = gamma
        self.relevance = relevance
        self.kernel = kernel
        self.tol = tol
        self.max_epochs = max_epochs
        self.random_state = random_state
        self.n_partitions = n_partitions
        self.standardize = standardize
        self.client = client

    def _labels(self, y: Any) -> Any:
        # classes of any kind, as given: the relevance encodes them (|corr| on two, the correlation ratio on more),
        # so renumbering them changes nothing; one class or a continuous y is an error in dufs.fit
        self._set_classes(y)
        return y

    def fit(self, X: Any, y: Any = None) -> MMFS:
        super().fit(X, y)
        d = self.selection_.diagnostics
        self.alpha_ = self.scores_
        self.diagnostics_ = d
        # the ranking of the solver (support by alpha, then the dual gradient) for the selected, the rest by alpha
        head = np.asarray(self.selection_.indices)
        rest = np.setdiff1d(rank(self.scores_, True), head, assume_unique=True)
        rest = rest[np.argsort(-self.scores_[rest], kind="stable")]
        self.ranking_ = np.concatenate([head, rest])
        return self


class _GreedySelector(_DufsSelector):
    """Greedy selectors: ``ranking_`` is the order of choice, then the features not chosen (by index)."""

    def fit(self, X: Any, y: Any = None) -> _GreedySelector:
        super().fit(X, y)
        head = np.asarray(self.selection_.indices, dtype=np.int64)
        rest = np.setdiff1d(np.arange(self.n_features_in_), head, assume_unique=True)
        self.ranking_ = np.concatenate([head, rest])
        self.criterion_ = np.asarray(self.selection_.diagnostics["criterion"])
        self.objective_ = np.asarray(self.selection_.diagnostics["objective"])
        return self

    def _check_samples(self, X: Any) -> None:
        n = X.shape[0]
        if self.W is None and self.graph == "knn" and n <= self.n_neighbors:
            raise ParameterError(f"{type(self).__name__} needs more samples than neighbours: got n_samples={n}, "
                             f"n_neighbors={self.n_neighbors}; lower n_neighbors or give more samples.")
        if self.W is None and self.graph == "anchor" and n < self.n_anchors:
            raise ParameterError(f"{type(self).__name__}(graph='anchor') needs at least n_anchors samples: got "
                             f"n_samples={n}, n_anchors={self.n_anchors}; lower n_anchors.")


_GRAPH_CONSTRAINTS = {
    "W": [None, object],
    "graph": [StrOptions({"knn", "anchor"})],
    "n_neighbors": [Interval(Integral, 1, None, closed="left")],
    "weights": [StrOptions({"binary", "heat"})],
    "t": [None, Interval(Real, 0, None, closed="neither")],
    "n_anchors": [Interval(Integral, 1, None, closed="left")],
    "anchor_neighbors": [Interval(Integral, 1, None, closed="left")],
    "embed_dim": [Interval(Integral, 1, None, closed="left")],
    "random_state": [Interval(Integral, 0, None, closed="left")],
}


class LapAOFS(_GreedySelector):
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
    graph : {"knn", "anchor"}, default "knn"
    n_neighbors : int, default 4
        The paper's k.
    weights : {"binary", "heat"}, default "binary"
    t : float > 0 or None, default None
    n_anchors, anchor_neighbors, embed_dim : int
        Anchor graph settings (``graph="anchor"``).
    random_state : int, default 0
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
    _method_params = ("lambda1", "lambda2", "W", "graph", "n_neighbors", "weights", "t", "n_anchors",
                      "anchor_neighbors", "embed_dim", "random_state")
    _parameter_constraints: ClassVar[dict] = {
        **_DufsSelector._parameter_constraints, **_GRAPH_CONSTRAINTS,
        "lambda1": [Interval(Real, 0, None, closed="left")],
        "lambda2": [Interval(Real, 0, None, closed="neither")],
    }

    def __init__(self, n_features: int = 10, *, lambda1: float = 0.01, lambda2: float = 0.01, W: Any = None,
                 graph: str = "knn", n_neighbors: int = 4, weights: str = "binary", t: float | None = None,
                 n_anchors: int = 256, anchor_neighbors: int = 3, embed_dim: int = 64, random_state: int = 0,
                 standardize: str | None = None, client: Any = None):
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
        self.standardize = standardize
        self.client = client


class LapDOFS(LapAOFS):
    """Laplacian-regularised D-optimal feature selection (unsupervised, greedy): each step maximises det H
    (He et al. eq. (29)). Parameters and attributes as :class:`LapAOFS` (``criterion_``: the chosen feature's
    eq. (29) value; ``objective_``: log det H)."""

    _method = "lapdofs"


class JCFS(_GreedySelector):
    """Joint clustering and feature selection (Du, Shen): alternate the spectral embedding Y (the ``n_clusters``
    smallest eigenvectors of L + lambda_ (X_S X_S^T + gamma I)^-1, L the normalised kNN Laplacian) and the greedy
    Fisher step (eq. (14)) until the selection stops changing.

    Parameters
    ----------
    n_features : int or "all", default 10
        How many features to select; more than X has, or "all", keeps every feature (the former with a warning,
        as scikit-learn's ``SelectKBest``).
    n_clusters : int, default 2
    lambda_ : float >= 0, default 1e-6
        Trade-off between the spectral and the Fisher terms (the paper searches 1e-6 .. 1e-3); lambda_ / gamma is
        the weight that pulls the embedding into the span of the selected features (0.01 by default, chosen on
        data: at 1 the first selection locks the embedding in).
    gamma : float > 0, default 1e-4
    W, graph, n_neighbors (default 5), weights, t, n_anchors, anchor_neighbors, embed_dim, random_state
        The sample graph, as :class:`LapAOFS`.
    max_iter : int, default 10
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
    _method_params = ("n_clusters", "lambda_", "gamma", "W", "graph", "n_neighbors", "weights", "t", "n_anchors",
                      "anchor_neighbors", "embed_dim", "max_iter", "random_state")
    _parameter_constraints: ClassVar[dict] = {
        **_DufsSelector._parameter_constraints, **_GRAPH_CONSTRAINTS,
        "n_clusters": [Interval(Integral, 1, None, closed="left")],
        "lambda_": [Interval(Real, 0, None, closed="left")],
        "gamma": [Interval(Real, 0, None, closed="neither")],
        "max_iter": [Interval(Integral, 1, None, closed="left")],
    }

    def __init__(self, n_features: int = 10, *, n_clusters: int = 2, lambda_: float = 1e-6, gamma: float = 1e-4,
                 W: Any = None, graph: str = "knn", n_neighbors: int = 5, weights: str = "binary",
                 t: float | None = None, n_anchors: int = 256, anchor_neighbors: int = 3, embed_dim: int = 64,
                 max_iter: int = 10, random_state: int = 0, standardize: str | None = METHODS["jcfs"].standardize,
                 client: Any = None):
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
        if self.n_clusters >= X.shape[0]:
            raise ParameterError(f"JCFS needs more samples than clusters: got n_samples={X.shape[0]}, "
                             f"n_clusters={self.n_clusters}.")


class UFCM(_DufsSelector):
    """Unsupervised feature analysis with class margin optimisation (Wang et al.): alternate k-means pseudo-labels
    and the top eigenvectors of S_t - alpha S_w - beta D (an l2,p reweighting); features ranked by the row norms of
    the projection W.

    Parameters
    ----------
    n_features : int or "all", default 10
        How many features to select; more than X has, or "all", keeps every feature (the former with a warning,
        as scikit-learn's ``SelectKBest``).
    n_clusters : int, default 2
    n_components : int or None, default None
        d', the columns of W (< n_features); default ``n_clusters`` (at most n_features - 1).
    alpha, beta : float >= 0, default 1.0
        Weights of the within-cluster scatter and of the l2,p penalty.
    p : float in (0, 2], default 1.0
    max_iter : int, default 30
    n_init : int, default 10
        Random restarts of the cluster update.
    random_state : int, default 0
    standardize : {"zscore", "scale"} or None, default None
    client : distributed.Client, optional

    References
    ----------
    S. Wang, F. Nie, X. Chang, L. Yao, X. Li, Q. Z. Sheng, "Unsupervised Feature Analysis with Class Margin
    Optimization", ECML PKDD 2015.
    """

    _method = "ufcm"
    _method_params = ("n_clusters", "n_components", "alpha", "beta", "p", "max_iter", "n_init", "random_state")
    _parameter_constraints: ClassVar[dict] = {
        **_DufsSelector._parameter_constraints,
        "n_clusters": [Interval(Integral, 1, None, closed="left")],
        "n_components": [None, Interval(Integral, 1, None, closed="left")],
        "alpha": [Interval(Real, 0, None, closed="left")],
        "beta": [Interval(Real, 0, None, closed="left")],
        "p": [Interval(Real, 0, 2, closed="right")],
        "max_iter": [Interval(Integral, 1, None, closed="left")],
        "n_init": [Interval(Integral, 1, None, closed="left")],
        "random_state": [Interval(Integral, 0, None, closed="left")],
    }

    def __init__(self, n_features: int = 10, *, n_clusters: int = 2, n_components: int | None = None,
                 alpha: float = 1.0, beta: float = 1.0, p: float = 1.0, max_iter: int = 30, n_init: int = 10,
                 random_state: int = 0, standardize: str | None = None, client: Any = None):
        self.n_features = n_features
        self.n_clusters = n_clusters
        self.n_components = n_components
        self.alpha = alpha
        self.beta = beta
        self.p = p
        self.max_iter = max_iter
        self.n_init = n_init
        self.random_state = random_state
        self.standardize = standardize
        self.client = client

    def fit(self, X: Any, y: Any = None) -> UFCM:
        super().fit(X, y)
        self.n_iter_ = int(self.selection_.diagnostics.get("iterations", 1))
        return self

    def _check_samples(self, X: Any) -> None:
        n, d = X.shape
        if self.n_clusters >= n:
            raise ParameterError(f"UFCM needs more samples than clusters: got n_samples={n}, "
                             f"n_clusters={self.n_clusters}.")
        if d < 2 or self.n_components is not None and self.n_components >= d:
            raise ParameterError(f"UFCM needs n_components < n_features (and at least 2 features): got "
                             f"n_components={self.n_components}, n_features={d}.")


class M3FS(_DufsSelector):
    """Unsupervised max-margin feature selection with manifold regularisation (Guo et al.): maximum-margin
    clustering with feature saliencies sigma (0 <= sigma <= 1, sum sigma = m = ``n_features``) and a Laplacian
    term; the features of largest saliency are selected.

    Parameters
    ----------
    n_features : int or "all", default 10
        How many features to select; more than X has, or "all", keeps every feature (the former with a warning,
        as scikit-learn's ``SelectKBest``).
        m, the saliency budget and the number of features selected.
    n_clusters : int, default 2
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
        alternating: a heat-kernel kNN graph), "gaussian" (faithful), "knn", or "anchor" (alternating, for large
        n_samples).
    n_neighbors : int or None, default None
        kNN graph neighbours (None: the solver's default, 10 faithful / 5 alternating).
    max_iter : int or None, default None
        Outer iterations of the alternating solver (None: 50).
    polish : int, "auto" or None, default None
        Label flips the alternating solver tries after it stops (None: its default "auto", 8 up to 5000 samples).
    random_state : int, default 0
    standardize : {"zscore", "scale"} or None, default "zscore"
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
    _method_params = ("n_clusters", "solver", "C", "lambda_", "l", "epsilon", "graph", "n_neighbors", "max_iter",
                      "polish", "random_state")
    _parameter_constraints: ClassVar[dict] = {
        **_DufsSelector._parameter_constraints,
        "n_clusters": [Interval(Integral, 2, None, closed="left")],
        "solver": [StrOptions({"auto", "faithful", "alternating"})],
        "C": [Interval(Real, 0, None, closed="neither")],
        "lambda_": [None, Interval(Real, 0, None, closed="left")],
        "l": [None, Interval(Real, 0, None, closed="neither")],
        "epsilon": [None, Interval(Real, 0, None, closed="neither")],
        "graph": [None, StrOptions({"gaussian", "knn", "anchor"})],
        "n_neighbors": [None, Interval(Integral, 1, None, closed="left")],
        "max_iter": [None, Interval(Integral, 1, None, closed="left")],
        "polish": [None, StrOptions({"auto"}), Interval(Integral, 0, None, closed="left")],
        "random_state": [Interval(Integral, 0, None, closed="left")],
    }

    def __init__(self, n_features: int = 10, *, n_clusters: int = 2, solver: str = "auto", C: float = 1.0,
                 lambda_: float | None = None, l: float | None = None, epsilon: float | None = None,
                 graph: str | None = None, n_neighbors: int | None = None, max_iter: int | None = None,
                 polish: int | str | None = None, random_state: int = 0,
                 standardize: str | None = "zscore", client: Any = None):
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
        if self.n_clusters >= X.shape[0]:
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
