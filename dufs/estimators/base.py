"""The shared base of the scikit-learn estimators: validate (parameters from the method's table, input), call
:func:`dufs.api.fit`, keep what it found in attributes ending in ``_``."""

from __future__ import annotations

import os
from numbers import Integral
from typing import Any, ClassVar

import numpy as np
import scipy.sparse as sp
from sklearn.base import BaseEstimator, _fit_context
from sklearn.feature_selection import SelectorMixin
from sklearn.utils._param_validation import Interval, InvalidParameterError, StrOptions
from sklearn.utils.validation import check_consistent_length, check_is_fitted, column_or_1d, validate_data

from dufs.api import METHODS, check_frame, fit, rank
from dufs.data import open_store
from dufs.engine.graphs import resolve_graph
from dufs.engine.inputs import is_dask_array
from dufs.errors import ParameterError
from dufs.methods.params import ParameterConstraintError, constraints_of
from dufs.selection import take_columns

__all__ = ["BASE_CONSTRAINTS", "DufsSelector", "GreedySelector", "constraints", "estimator_params"]

_STANDARDIZE = [StrOptions({"zscore", "scale", "auto"}), None]


EstimatorParameterError = ParameterConstraintError  # a parameter of an estimator out of its constraints


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


# the parameters every estimator has (the method's own come from its table)
BASE_CONSTRAINTS = {
    "n_features": [Interval(Integral, 1, None, closed="left"), StrOptions({"all"})],
    "standardize": _STANDARDIZE,
    "client": [None, object],
}


def estimator_params(method: str) -> tuple[str, ...]:
    """The parameters of ``method``'s estimator: its table's entries marked for the estimator, in table order."""
    return tuple(k for k, p in METHODS[method].params.items() if p.estimator)


def constraints(method: str) -> dict:
    """scikit-learn's ``_parameter_constraints`` of ``method``'s estimator, from its parameter table."""
    return constraints_of(METHODS[method].params, estimator=True)


def _is_dask(X: Any) -> bool:
    return type(X).__module__.startswith("dask")


def _direct(X: Any) -> bool:
    """Whether ``X`` goes to :func:`dufs.fit` as it is: a store, a store path, a Dask array or pydata ``sparse``."""
    return (isinstance(X, str | os.PathLike) or type(X).__name__ == "SparseStore" or is_dask_array(X)
            or type(X).__module__.split(".")[0] == "sparse")


def _open(X: Any) -> Any:
    """The store ``X`` is (a path opened: its metadata only), else None."""
    if isinstance(X, str | os.PathLike):
        return open_store(X)
    return X if type(X).__name__ == "SparseStore" else None


class _Shape:
    """Only a shape, for the method checks of an input that is not loaded."""

    def __init__(self, shape: tuple[int, int]):
        self.shape = shape


class DufsSelector(SelectorMixin, BaseEstimator):
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
    _parameter_constraints: ClassVar[dict] = BASE_CONSTRAINTS

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
        check_frame(X, type(self).__name__)  # a non-numeric column: the message of dufs.fit
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

    def _validate_direct(self, X: Any, y: Any) -> tuple[Any, Any, tuple[int, int]]:
        """An input :func:`dufs.fit` reads as it is (a store, a store path, a Dask array, pydata ``sparse``): never
        converted here, so never densified. Returns ``X`` as given, the labels (None: a store's own) and the
        shape."""
        store = _open(X)
        shape = tuple(int(s) for s in (store if store is not None else X).shape)
        if len(shape) != 2:
            raise ParameterError(f"The 'X' parameter of {type(self).__name__} must be 2-D; got shape {shape}")
        self.n_features_in_ = shape[1]
        if hasattr(self, "feature_names_in_"):
            del self.feature_names_in_
        if not METHODS[self._method].supervised:
            return X, None, shape
        if y is None:
            if store is None or not store.has_labels:
                raise ParameterError(f"{type(self).__name__} requires y to be passed, but the target y is None "
                                     f"and X is no store with labels: it is a supervised selector, give the labels")
            self._labels(store.y)  # classes_; dufs.fit reads the store's labels itself
            return X, None, shape
        try:
            y = column_or_1d(np.asarray(y.compute() if _is_dask(y) else y), warn=True)
        except ValueError as exc:
            raise ParameterError(_one_line(exc)) from None
        if y.shape[0] != shape[0]:
            raise ParameterError(f"Found input variables with inconsistent numbers of samples: [{shape[0]}, "
                                 f"{y.shape[0]}]")
        return X, self._labels(y), shape

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X: Any, y: Any = None) -> DufsSelector:
        """Score every feature of ``X`` and select the best ``n_features``.

        Parameters
        ----------
        X : {array-like, sparse matrix, Dask array, SparseStore, store path} of shape (n_samples, n_features)
            What :func:`dufs.fit` takes, through the same path: a store, a store path or a Dask array (sparse or
            dense chunks) is read block by block, never whole. Finite numbers: a NaN or infinity is a
            :class:`~dufs.errors.ParameterError` naming its row and feature.
        y : array-like of shape (n_samples,)
            Labels; required by the supervised methods (default for a store: its own), ignored by the others.
            Classes may be numbers, strings or booleans; the Fisher score and MMFS refuse a continuous target, the
            correlation filter takes it.

        Returns
        -------
        self
        """
        spec = METHODS[self._method]
        if _direct(X):
            X, y, shape = self._validate_direct(X, y)
            self._check_samples(_Shape(shape))
        else:
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

    def transform(self, X: Any) -> Any:
        """The selected columns of ``X``, in column order (as ``get_support``).

        A store or store path gives SciPy CSR (only the feature blocks holding selected columns are read), a
        Dask array stays lazy, SciPy sparse keeps its format; NumPy and DataFrames as scikit-learn's selectors.
        """
        if _direct(X) or sp.issparse(X):
            check_is_fitted(self)
            if sp.issparse(X):  # the number of features checked as scikit-learn does; the format kept
                validate_data(self, X, reset=False, accept_sparse=True, dtype=None, ensure_all_finite=False)
            return take_columns(X, self.get_support(indices=True), self.n_features_in_)
        return super().transform(X)

    def _get_support_mask(self) -> np.ndarray:
        check_is_fitted(self)
        return self.selection_.support_mask

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True
        tags.target_tags.required = METHODS[self._method].supervised
        return tags


class GreedySelector(DufsSelector):
    """Greedy selectors: ``ranking_`` is the order of choice, then the features not chosen (by index)."""

    def fit(self, X: Any, y: Any = None) -> GreedySelector:
        super().fit(X, y)
        head = np.asarray(self.selection_.indices, dtype=np.int64)
        rest = np.setdiff1d(np.arange(self.n_features_in_), head, assume_unique=True)
        self.ranking_ = np.concatenate([head, rest])
        self.criterion_ = np.asarray(self.selection_.diagnostics["criterion"])
        self.objective_ = np.asarray(self.selection_.diagnostics["objective"])
        return self

    def _check_samples(self, X: Any) -> None:
        n = X.shape[0]
        graph = resolve_graph(self.graph, n, type(self).__name__)
        if self.W is None and graph == "knn" and n <= self.n_neighbors:
            raise ParameterError(f"{type(self).__name__} needs more samples than neighbours: got n_samples={n}, "
                             f"n_neighbors={self.n_neighbors}; lower n_neighbors or give more samples.")
        if self.W is None and graph == "anchor" and n < self.n_anchors:
            raise ParameterError(f"{type(self).__name__}(graph='anchor') needs at least n_anchors samples: got "
                             f"n_samples={n}, n_anchors={self.n_anchors}; lower n_anchors.")
