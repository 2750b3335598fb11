"""Evaluation of feature selections, following the papers' protocols (docs/architecture.md, "Results and evaluation").

* Supervised (MMFS, paper 002): top-K accuracy of an L2-regularised L2-loss linear SVM
  (``LinearSVC(C=1, loss="squared_hinge", penalty="l2")``) trained on the K best features, on a held-out test set,
  or by leave-one-out cross-validation on the tiny microarray sets (ALLAML) -- :func:`topk_curve`.
* Unsupervised (JCFS 001, UFCM 003, LapAOFS/LapDOFS 004): k-means on the selected features, repeated and keeping the
  run of best objective, scored by clustering accuracy (best one-to-one matching of clusters to classes, Hungarian
  algorithm) and normalised mutual information -- :func:`kmeans_scores`, :func:`clustering_accuracy`, :func:`nmi`;
  and leave-one-out 1-nearest-neighbour accuracy -- :func:`one_nn_accuracy`.
* Figures of these results: :mod:`dufs.plot`.

Every input check raises :class:`dufs.errors.ParameterError` naming the parameter.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence

import numpy as np
import scipy.sparse as sp

from dufs._logging import get_logger
from dufs.errors import ParameterError

__all__ = [
    "clustering_accuracy",
    "majority_accuracy",
    "nmi",
    "kmeans_scores",
    "one_nn_accuracy",
    "topk_curve",
]

log = get_logger(__name__)

# Row block of the leave-one-out 1-NN distance computation: keeps the (block, n) distance slab small.
_NN_BLOCK = 1024


# --------------------------------------------------------------------------------------------------- validation


def _labels(y, name: str, func: str) -> np.ndarray:
    arr = np.asarray(y)
    if arr.ndim != 1:
        raise ParameterError(f"The '{name}' parameter of {func} must be a 1-D array of labels; "
                             f"got shape {arr.shape}.")
    if arr.shape[0] == 0:
        raise ParameterError(f"The '{name}' parameter of {func} must not be empty.")
    return arr


def _matrix(X, name: str, func: str):
    if sp.issparse(X):
        X = sp.csr_array(X)
        if X.nnz < 2**31 and X.indices.dtype != np.int32:  # scikit-learn's liblinear wants 32-bit indices
            X = sp.csr_array((X.data, X.indices.astype(np.int32), X.indptr.astype(np.int32)), shape=X.shape)
    else:
        X = np.asarray(X)
        if X.ndim != 2:
            raise ParameterError(f"The '{name}' parameter of {func} must be a 2-D array or sparse matrix; "
                                 f"got shape {X.shape}.")
    if X.shape[0] == 0 or X.shape[1] == 0:
        raise ParameterError(f"The '{name}' parameter of {func} must have at least one row and one column; "
                             f"got shape {X.shape}.")
    if X.dtype.kind not in "biuf":
        raise ParameterError(f"The '{name}' parameter of {func} must be numeric; got dtype {X.dtype}.")
    data = X.data if sp.issparse(X) else X
    if data.size and not np.all(np.isfinite(data)):
        raise ParameterError(f"The '{name}' parameter of {func} must contain only finite values.")
    return X


def _same_length(X, y, func: str, xname: str = "X", yname: str = "y") -> None:
    if X.shape[0] != y.shape[0]:
        raise ParameterError(f"The '{yname}' parameter of {func} must have one label per row of '{xname}'; "
                             f"got {y.shape[0]} labels for {X.shape[0]} rows.")


def _int(value, name: str, func: str, low: int, high: int | None = None) -> int:
    ok = isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= low
    if ok and high is not None:
        ok = value <= high
    if not ok:
        rng = f"[{low}, {high}]" if high is not None else f">= {low}"
        raise ParameterError(f"The '{name}' parameter of {func} must be an int {rng}; got {value!r}.")
    return int(value)


def _seed(value, func: str):
    if value is None or isinstance(value, np.random.RandomState):
        return value
    if isinstance(value, numbers.Integral) and not isinstance(value, bool) and 0 <= value < 2**32:
        return int(value)
    raise ParameterError(f"The 'random_state' parameter of {func} must be None, an int in [0, 2**32) or a "
                         f"numpy RandomState; got {value!r}.")


# --------------------------------------------------------------------------------------------------- clustering


def _label_pair(y_true, y_pred, owner: str) -> tuple[np.ndarray, np.ndarray]:
    """Both labelings validated, of one length."""
    t = _labels(y_true, "y_true", owner)
    p = _labels(y_pred, "y_pred", owner)
    if t.shape[0] != p.shape[0]:
        raise ParameterError(f"The 'y_pred' parameter of {owner} must have the length of 'y_true'; "
                             f"got {p.shape[0]} and {t.shape[0]}.")
    return t, p


def _contingency(t: np.ndarray, p: np.ndarray) -> np.ndarray:
    """Counts of points per (cluster, class): rows the distinct values of ``p``, columns those of ``t``."""
    _, ti = np.unique(t, return_inverse=True)
    _, pi = np.unique(p, return_inverse=True)
    counts = np.zeros((pi.max() + 1, ti.max() + 1), dtype=np.int64)
    np.add.at(counts, (pi.ravel(), ti.ravel()), 1)
    return counts


def clustering_accuracy(y_true, y_pred) -> float:
    """Clustering accuracy (ACC): the fraction of points whose cluster maps to their class.

    The map is the best one-to-one matching of clusters to classes, found by the Hungarian algorithm
    (:func:`scipy.optimize.linear_sum_assignment`) on the cluster/class contingency table, as in the
    evaluation of JCFS (paper 001), UFCM (paper 003) and LapAOFS/LapDOFS (paper 004)::

        ACC = max_map sum_i delta(y_true_i, map(y_pred_i)) / n

    Parameters
    ----------
    y_true : array-like, (n_samples,)
        Class labels, any hashable-sortable values.
    y_pred : array-like, (n_samples,)
        Cluster labels, any values; the number of clusters may differ from the number of classes (points of a
        cluster left unmatched count as errors).

    Returns
    -------
    float
        ACC in [0, 1]; 1.0 exactly when the two partitions are equal up to relabelling.

    Raises
    ------
    ParameterError
        When the label arrays are not 1-D, are empty or differ in length.
    """
    from scipy.optimize import linear_sum_assignment

    t, p = _label_pair(y_true, y_pred, "clustering_accuracy")
    counts = _contingency(t, p)
    rows, cols = linear_sum_assignment(counts, maximize=True)
    return float(counts[rows, cols].sum()) / t.shape[0]


def majority_accuracy(y_true, y_pred) -> float:
    """Clustering accuracy by majority labelling (purity): each cluster is labelled with its most frequent class
    and the fraction of points labelled correctly is returned.

    The protocol of M3FS (paper 000, section 4.1: "we label each of the resulting clusters with the majority class
    according to the original labels"). Several clusters may take the same class, so it is never below
    :func:`clustering_accuracy` (the one-to-one matching) and equals it when the majority classes are distinct.

    Parameters
    ----------
    y_true, y_pred : array-like, (n_samples,)
        Class and cluster labels.

    Returns
    -------
    float
        In [0, 1].

    Raises
    ------
    ParameterError
        When the label arrays are not 1-D, are empty or differ in length.
    """
    t, p = _label_pair(y_true, y_pred, "majority_accuracy")
    return float(_contingency(t, p).max(axis=1).sum()) / t.shape[0]


_NMI_AVERAGES = ("arithmetic", "geometric", "max", "min")


def _check_nmi_average(value: str, name: str, func: str) -> None:
    if value not in _NMI_AVERAGES:
        raise ParameterError(f"The '{name}' parameter of {func} must be one of {list(_NMI_AVERAGES)}; "
                             f"got {value!r}.")


def nmi(y_true, y_pred, average_method: str = "arithmetic") -> float:
    """Normalised mutual information of two labelings, ``I(T; P) / mean(H(T), H(P))``.

    :func:`sklearn.metrics.normalized_mutual_info_score`. The papers normalise differently: UFCM (003, eq. (18))
    by the geometric mean of the two entropies, LapAOFS/LapDOFS (004) by their maximum, JCFS (001) does not say;
    the default, the arithmetic mean, lies between the two. All coincide when the two entropies are equal.

    Parameters
    ----------
    y_true, y_pred : array-like, (n_samples,)
        Class and cluster labels.
    average_method : {"arithmetic", "geometric", "max", "min"}, default "arithmetic"
        The mean of H(T) and H(P) that divides I(T; P).

    Returns
    -------
    float
        NMI in [0, 1].

    Raises
    ------
    ParameterError
        When the label arrays are not 1-D, are empty or differ in length, or on an unknown ``average_method``.
    """
    from sklearn.metrics import normalized_mutual_info_score

    _check_nmi_average(average_method, "average_method", "nmi")
    t, p = _label_pair(y_true, y_pred, "nmi")
    return float(normalized_mutual_info_score(t, p, average_method=average_method))


def kmeans_scores(X_selected, y, n_clusters: int | None = None, n_runs: int = 10,
                  random_state=0, nmi_average: str = "arithmetic") -> dict[str, float]:
    """k-means ACC and NMI on the selected features.

    The protocol of papers 001, 003 and 004: k-means with as many clusters as classes is run ``n_runs`` times from
    random initialisations (k-means++ seeding, one initialisation per run) and the run of best objective (lowest
    inertia) is kept; its clusters are scored by :func:`clustering_accuracy` and :func:`nmi` against ``y``.

    Parameters
    ----------
    X_selected : ndarray or scipy sparse, (n_samples, n_selected)
        The data restricted to the selected features.
    y : array-like, (n_samples,)
        Class labels.
    n_clusters : int or None, default None
        Number of clusters; ``None`` uses the number of distinct labels in ``y``.
    n_runs : int, default 10
        Number of k-means runs (each :class:`sklearn.cluster.KMeans` with ``n_init=1``).
    random_state : int, RandomState or None, default 0
        Seeds the runs' initialisations.
    nmi_average : str, default "arithmetic"
        The ``average_method`` of :func:`nmi` (UFCM's paper uses "geometric").

    Returns
    -------
    dict
        ``{"acc": float, "nmi": float}`` of the best-objective run.

    Raises
    ------
    ParameterError
        On a malformed ``X_selected``/``y``, or ``n_clusters``/``n_runs``/``random_state`` out of range.
    """
    from sklearn.cluster import KMeans

    func = "kmeans_scores"
    X = _matrix(X_selected, "X_selected", func)
    y = _labels(y, "y", func)
    _same_length(X, y, func, "X_selected")
    if n_clusters is None:
        n_clusters = int(np.unique(y).size)
    n_clusters = _int(n_clusters, "n_clusters", func, 1, X.shape[0])
    n_runs = _int(n_runs, "n_runs", func, 1)
    _check_nmi_average(nmi_average, "nmi_average", func)
    seed = _seed(random_state, func)
    rng = seed if isinstance(seed, np.random.RandomState) else np.random.RandomState(seed)
    X = X.astype(np.float64)
    best_inertia, best_labels = np.inf, None
    for run in range(n_runs):
        km = KMeans(n_clusters=n_clusters, n_init=1, random_state=int(rng.randint(0, 2**31 - 1)))
        km.fit(X)
        log.debug("kmeans run %d: inertia %.6g", run, km.inertia_)
        if km.inertia_ < best_inertia:
            best_inertia, best_labels = km.inertia_, km.labels_
    return {"acc": clustering_accuracy(y, best_labels), "nmi": nmi(y, best_labels, nmi_average)}


# --------------------------------------------------------------------------------------------------- 1-NN


def one_nn_accuracy(X_selected, y) -> float:
    """Leave-one-out 1-nearest-neighbour accuracy on the selected features.

    Each point is classified by the label of its nearest other point (Euclidean distance, the point itself
    excluded; among equally near points the one of lower index wins), the 1-NN protocol of the unsupervised
    feature-selection papers. Distances are computed in row blocks from ``|a|^2 + |b|^2 - 2 a.b``, so dense and
    sparse inputs alike take matrix products only.

    Parameters
    ----------
    X_selected : ndarray or scipy sparse, (n_samples, n_selected)
        The data restricted to the selected features; at least two rows.
    y : array-like, (n_samples,)
        Class labels.

    Returns
    -------
    float
        The fraction of points whose nearest neighbour has their label.

    Raises
    ------
    ParameterError
        On a malformed ``X_selected``/``y`` or fewer than two samples.
    """
    func = "one_nn_accuracy"
    X = _matrix(X_selected, "X_selected", func)
    y = _labels(y, "y", func)
    _same_length(X, y, func, "X_selected")
    n = X.shape[0]
    if n < 2:
        raise ParameterError(f"The 'X_selected' parameter of {func} must have at least two rows; got {n}.")
    X = X.astype(np.float64)
    if sp.issparse(X):
        sq = np.asarray(X.multiply(X).sum(axis=1)).ravel()
    else:
        sq = np.einsum("ij,ij->i", X, X)
    correct = 0
    for start in range(0, n, _NN_BLOCK):
        stop = min(start + _NN_BLOCK, n)
        gram = X[start:stop] @ X.T
        gram = gram.toarray() if sp.issparse(gram) else np.asarray(gram)
        d = sq[start:stop, None] + sq[None, :] - 2.0 * gram
        np.maximum(d, 0.0, out=d)
        d[np.arange(stop - start), np.arange(start, stop)] = np.inf
        nearest = np.argmin(d, axis=1)  # first minimum: ties go to the lower index
        correct += int(np.count_nonzero(y[nearest] == y[start:stop]))
    return correct / n


# --------------------------------------------------------------------------------------------------- top-K curve


def topk_curve(X, y, ranking, ks, *, test=None, cv="loo", C: float = 1.0, random_state=0) -> dict[str, list]:
    """Top-K classification accuracy curve of a feature ranking.

    The MMFS protocol (paper 002): for each K in ``ks``, an L2-regularised L2-loss linear SVM
    (``LinearSVC(C=C, loss="squared_hinge", penalty="l2", dual="auto")``, C=1 in the paper) is trained on the K
    best features of ``ranking`` and its accuracy measured on the test set when one is given, else by
    cross-validation: leave-one-out on the tiny microarray sets (ALLAML), or stratified k-fold.

    Parameters
    ----------
    X : ndarray or scipy sparse, (n_samples, n_features)
        Training data (all features).
    y : array-like, (n_samples,)
        Training labels.
    ranking : array-like of int
        Feature indices, best first, distinct, in ``[0, n_features)``; may be shorter than ``n_features``.
    ks : int or sequence of int
        The K values, each in ``[1, len(ranking)]``.
    test : tuple (X_test, y_test) or None, default None
        When given, train on ``X, y`` and score on ``X_test, y_test`` (same features as ``X``); ``cv`` is ignored.
    cv : "loo", int or None, default "loo"
        Without ``test``: ``"loo"`` leave-one-out; an int >= 2 stratified k-fold (shuffled with ``random_state``);
        ``None`` chooses leave-one-out below 100 samples, else stratified 5-fold. The accuracy is the mean of the
        folds' accuracies (for leave-one-out, the fraction of points classified right).
    C : float, default 1.0
        The SVM's regularisation constant, > 0.
    random_state : int, RandomState or None, default 0
        Seeds the k-fold shuffling and the SVM.

    Returns
    -------
    dict
        ``{"k": [K, ...], "accuracy": [float, ...]}`` in the order of ``ks``.

    Raises
    ------
    ParameterError
        On malformed data, a ranking with repeats or out-of-range indices, ``ks`` out of range, a bad ``cv``,
        ``C`` <= 0 or a test set of other width.
    """
    func = "topk_curve"
    X = _matrix(X, "X", func)
    y = _labels(y, "y", func)
    _same_length(X, y, func)
    n, m = X.shape
    seed = _seed(random_state, func)

    r = _ranking(ranking, m, func)
    ks_list = _ks(ks, r, m, func)
    if not isinstance(C, numbers.Real) or isinstance(C, bool) or not np.isfinite(C) or C <= 0:
        raise ParameterError(f"The 'C' parameter of {func} must be a finite float > 0; got {C!r}.")

    if test is not None:
        Xt, yt = _test_set(test, m, func)
        splits = None
    else:
        Xt = yt = None
        splits = _cv_splits(cv, n, y, seed, func)
    accuracy = [_topk_accuracy(X, y, r[:k], splits, Xt, yt, C, seed) for k in ks_list]
    return {"k": ks_list, "accuracy": accuracy}


def _ranking(ranking, m: int, func: str) -> np.ndarray:
    """The ranking as an array, checked: distinct int feature indices in ``[0, m)``."""
    r = np.asarray(ranking)
    if r.ndim != 1 or r.size == 0 or (r.dtype.kind not in "iu") or r.min() < 0 or r.max() >= m \
            or np.unique(r).size != r.size:
        shown = r.tolist() if r.size <= 10 else f"array of shape {r.shape} and dtype {r.dtype}"
        raise ParameterError(f"The 'ranking' parameter of {func} must be distinct int feature indices in "
                             f"[0, n_features) with n_features={m}; got {shown}.")
    return r


def _ks(ks, r: np.ndarray, m: int, func: str) -> list[int]:
    """The K values as a list of ints, each checked to be in ``[1, len(ranking)]``."""
    if isinstance(ks, numbers.Integral):
        ks_list = [ks]
    elif isinstance(ks, np.ndarray):
        ks_list = ks.ravel().tolist()
    elif isinstance(ks, Sequence) and not isinstance(ks, str):
        ks_list = list(ks)
    else:
        ks_list = None
    bad = ks_list is None or len(ks_list) == 0 or any(
        not isinstance(k, numbers.Integral) or isinstance(k, bool) or not 1 <= k <= r.size for k in ks_list)
    if bad:
        bound = "n_features" if r.size == m else f"len(ranking)={r.size}"
        raise ParameterError(f"The 'ks' parameter of {func} must be ints in [1, {bound}]; got {ks!r}.")
    return [int(k) for k in ks_list]


def _test_set(test, m: int, func: str) -> tuple:
    """The test set ``(X_test, y_test)``, checked: as many labels as rows, the ``m`` features of ``X``."""
    if not isinstance(test, (tuple, list)) or len(test) != 2:
        raise ParameterError(f"The 'test' parameter of {func} must be a tuple (X_test, y_test) or None; "
                             f"got {type(test).__name__}.")
    Xt = _matrix(test[0], "test", func)
    yt = _labels(test[1], "test", func)
    _same_length(Xt, yt, func, "test[0]", "test")
    if Xt.shape[1] != m:
        raise ParameterError(f"The 'test' parameter of {func} must have the {m} features of 'X'; "
                             f"got {Xt.shape[1]}.")
    return Xt, yt


def _cv_splits(cv, n: int, y: np.ndarray, seed, func: str) -> list:
    """The (train, test) index pairs of the cross-validation ``cv`` (``None``: leave-one-out below 100 samples,
    else stratified 5-fold)."""
    from sklearn.model_selection import LeaveOneOut, StratifiedKFold

    if cv is None:
        cv = "loo" if n < 100 else 5
    if cv == "loo":
        splitter = LeaveOneOut()
    elif isinstance(cv, numbers.Integral) and not isinstance(cv, bool) and 2 <= cv <= n:
        splitter = StratifiedKFold(n_splits=int(cv), shuffle=True, random_state=seed)
    else:
        raise ParameterError(f"The 'cv' parameter of {func} must be 'loo', an int in [2, n_samples] or None; "
                             f"got {cv!r}.")
    return list(splitter.split(np.zeros((n, 1)), y))


def _topk_accuracy(X, y: np.ndarray, cols: np.ndarray, splits: list | None, Xt, yt, C: float, seed) -> float:
    """The SVM's accuracy on the features ``cols``: on the test set when there is one (``splits`` None), else the
    mean of the folds' accuracies."""
    from sklearn.svm import LinearSVC

    def svm():
        return LinearSVC(C=float(C), loss="squared_hinge", penalty="l2", dual="auto", random_state=seed)

    Xk = X[:, cols]
    if splits is None:
        clf = svm().fit(Xk, y)
        acc = float(np.mean(clf.predict(Xt[:, cols]) == yt))
    else:
        fold_acc = [float(np.mean(svm().fit(Xk[tr], y[tr]).predict(Xk[te]) == y[te])) for tr, te in splits]
        acc = float(np.mean(fold_acc))
    log.debug("top-%d accuracy %.4f", cols.shape[0], acc)
    return acc
