"""MMFS as a scikit-learn selector."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from dufs.api import METHODS, rank
from dufs.estimators.base import BASE_CONSTRAINTS, DufsSelector, constraints, estimator_params


class MMFS(DufsSelector):
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
    _method_params = estimator_params("mmfs")
    _parameter_constraints: ClassVar[dict] = {**BASE_CONSTRAINTS, **constraints("mmfs")}

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
