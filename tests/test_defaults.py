"""Every method with its default parameters, as a new user meets it: ``dufs.fit(X, method=m, n_features=k)`` (plus
``n_clusters`` where the method clusters) and the scikit-learn estimator ``Est(n_features=k)``, on small real data.

The reference is selection without information: ``N_RANDOM`` random k-subsets of the same data, scored the same way,
by scikit-learn alone. A method passes when its selection beats the ``PERCENTILE``-th percentile of those random
subsets, i.e. it does better than 3 random selections out of 4 (a selector that knows nothing passes with
probability 1/4). Scores: LinearSVC(C=1) 5-fold accuracy with the selection made inside each fold for supervised
methods, as in the MMFS paper's protocol; k-means clustering accuracy (Hungarian matching, sklearn's KMeans) on the
selected features for unsupervised methods, as in the other papers' protocol. A selection that scores as well as
all the features (within 0.005) passes as well: it lost nothing. On iris with 10 N(0, 1) noise columns
the truth is known, so there a method must recover at least 3 of the 4 real features (chance: 4 x 4/14 = 1.1).

Where a method cannot beat the reference by construction, the pair is left out with its reason (``SKIP``):
the test then still checks that the default call runs without a degenerate-result warning. Where the defaults,
chosen on data over a wider set, still fall short, the pair is a strict expected failure with the figures
(``WEAK``).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.optimize import linear_sum_assignment
from sklearn.cluster import KMeans
from sklearn.datasets import load_breast_cancer, load_digits, load_iris
from sklearn.metrics import adjusted_rand_score
from sklearn.model_selection import StratifiedKFold
from sklearn.svm import LinearSVC
from threadpoolctl import threadpool_limits

import dufs
import dufs.estimators as est
from dufs.api import METHODS
from dufs.data.datasets import load
from dufs.testing.references import planted_clusters

N_RANDOM = 40
PERCENTILE = 75

ESTIMATOR = {"variance": est.VarianceSelector, "correlation": est.CorrelationSelector, "fisher": est.FisherScore,
             "laplacian": est.LaplacianScore, "mmfs": est.MMFS, "lapaofs": est.LapAOFS, "lapdofs": est.LapDOFS,
             "jcfs": est.JCFS, "ufcm": est.UFCM, "m3fs": est.M3FS}
CLUSTERING = {"jcfs", "ufcm", "m3fs"}  # methods that take n_clusters

SKIP = {
    # the real columns are standardised to variance 1 and the noise columns are N(0, 1): variance cannot tell them
    # apart (on raw iris it would prefer petal length and whichever noise columns came out widest)
    ("variance", "iris+noise"): "equal variances by construction",
    # k-means on term counts finds no topic (0.505 on all 3289 words, 0.51 on random 20-word subsets), so
    # unsupervised methods on the text set are scored by LinearSVC accuracy instead (see _score); the Laplacian
    # score on a Euclidean kNN graph of raw counts prefers words that occur in a handful of documents (zero almost
    # everywhere, hence smooth on any graph): 0.536 against 0.532 for random subsets (n_neighbors=10: 0.604)
    ("laplacian", "pcmac"): "the Laplacian score on raw term counts picks rare words",
}

# Cells where a method's defaults, chosen on data (examples/greedy_defaults.py: six sets, its whole parameter grid),
# stay below the bar. Each runs and must still fail (strict xfail): when one starts to pass, move it out of here.
WEAK = {
    # A- and D-optimal designs favour large, mutually uncorrelated columns (and, through lambda1 X^T L X, columns
    # that vary across graph neighbours): the noise columns have variance 1 like the real ones and are uncorrelated,
    # while three of the four iris features are correlated at 0.8-0.96. No (standardize, lambda1, lambda2, graph)
    # setting of the sweep picked more than 1 real feature.
    ("lapaofs", "iris+noise"): "optimal design picks uncorrelated columns: noise",
    ("lapdofs", "iris+noise"): "optimal design picks uncorrelated columns: noise",
    # with 3 clusters the third spectral eigenvector of the 14-column kNN graph follows noise columns (|corr|
    # 0.4-0.6 with columns 5, 6, 7 and 12; the real features load on the second), and JCFS fits features to Y
    ("jcfs", "iris+noise"): "the third spectral direction of the graph is noise",
    # D-optimal on raw pixels, 10 features: k-means 0.834 (20 features: 0.992). Only lambda1 = 0.1 reached 0.894,
    # at an equal mean rank over the six sets (lower on Isolet): no setting did better overall than the paper's.
    ("lapdofs", "digits1v7"): "D-optimal design on raw pixels at K = 10",
}


def _datasets() -> dict:
    d = load_digits()
    keep = np.isin(d.target, [1, 7])
    iris = load_iris()
    z = (iris.data - iris.data.mean(axis=0)) / iris.data.std(axis=0)
    noise = np.random.default_rng(0).standard_normal((150, 10))
    bc = load_breast_cancer()
    Xp, yp = load("pcmac")
    return {"digits1v7": (d.data[keep], d.target[keep], 10),
            "iris+noise": (np.hstack([z, noise]), iris.target, 4),
            "breast": (bc.data, bc.target, 5),
            "pcmac": (sp.csr_array(Xp), yp, 20)}


DATA = _datasets()


def _kmeans_acc(X: np.ndarray, y: np.ndarray) -> float:
    """Mean Hungarian-matched accuracy of sklearn's KMeans over 5 seeds (2 starts each)."""
    classes, yi = np.unique(y, return_inverse=True)
    k = classes.size
    accs = []
    for seed in range(5):
        lab = KMeans(k, n_init=2, random_state=seed).fit_predict(X)
        cont = np.zeros((k, k))
        np.add.at(cont, (lab, yi), 1)
        r, c = linear_sum_assignment(-cont)
        accs.append(cont[r, c].sum() / y.size)
    return float(np.mean(accs))


def _folds(name: str) -> list:
    X, y, _ = DATA[name]
    return list(StratifiedKFold(5, shuffle=True, random_state=0).split(X, y))


def _svm_acc(name: str, select) -> float:
    """Mean LinearSVC(C=1) accuracy over the 5 folds, ``select(train_rows)`` choosing the columns in each."""
    X, y, _ = DATA[name]
    accs = []
    for tr, te in _folds(name):
        idx = select(tr)
        accs.append(LinearSVC(C=1.0).fit(X[tr][:, idx], y[tr]).score(X[te][:, idx], y[te]))
    return float(np.mean(accs))


def _by_svm(name: str, method: str) -> bool:
    return METHODS[method].supervised or name == "pcmac"


def _score(name: str, method: str, idx: np.ndarray) -> float:
    """The score of a fixed column set (a random subset, all features, an unsupervised selection)."""
    X, y, _ = DATA[name]
    if _by_svm(name, method):
        return _svm_acc(name, lambda tr: idx)
    with threadpool_limits(1):
        return _kmeans_acc(X[:, idx].toarray() if sp.issparse(X) else X[:, idx], y)


_REFERENCE: dict = {}


def _reference(name: str, method: str) -> float:
    """The PERCENTILE-th percentile of the score of N_RANDOM random k-subsets."""
    kind = "svm" if _by_svm(name, method) else "kmeans"
    if (name, kind) not in _REFERENCE:
        X, _, k = DATA[name]
        rng = np.random.default_rng(1)
        scores = [_score(name, "correlation" if kind == "svm" else "variance", rng.choice(X.shape[1], k, replace=False))
                  for _ in range(N_RANDOM)]
        _REFERENCE[name, kind] = float(np.percentile(scores, PERCENTILE))
    return _REFERENCE[name, kind]


def _all_features(name: str, method: str) -> float:
    """The score of every feature: a selection that keeps the data's cluster structure whole (breast cancer's k-means
    accuracy is 0.854 on all 30 features and on every unsupervised method's 5) passes too."""
    return _score(name, method, np.arange(DATA[name][0].shape[1]))


def _fit(name: str, method: str, rows=None):
    """The default call: ``dufs.fit(X[rows], y[rows] or None, method=method, n_features=k[, n_clusters])``."""
    X, y, k = DATA[name]
    kw = {"n_clusters": np.unique(y).size} if method in CLUSTERING else {}
    rows = slice(None) if rows is None else rows
    supervised = METHODS[method].supervised
    with warnings.catch_warnings():
        warnings.simplefilter("error", dufs.errors.DufsWarning)  # a degenerate result fails here
        return dufs.fit(X[rows], y[rows] if supervised else None, method=method, n_features=k, **kw)


CASES = [pytest.param(m, n, marks=pytest.mark.xfail(reason=WEAK[m, n], strict=True)) if (m, n) in WEAK else (m, n)
         for m in ESTIMATOR for n in DATA]


@pytest.mark.parametrize(("method", "name"), CASES)
def test_default_selection_beats_random_selection(method, name):
    sel = _fit(name, method)
    k = DATA[name][2]
    assert sel.indices.shape == (k,) and "degenerate" not in sel.diagnostics
    if (method, name) in SKIP:
        return
    if name == "iris+noise":
        real = int(np.isin(sel.indices, [0, 1, 2, 3]).sum())
        assert real >= 3, f"{method} recovered {real} of the 4 real iris features: {sel.indices.tolist()}"
        return
    if METHODS[method].supervised:  # the selection made inside each fold
        got = _svm_acc(name, lambda tr: _fit(name, method, tr).indices)
    else:
        got = _score(name, method, sel.indices)
    ref, full = _reference(name, method), _all_features(name, method)
    assert got > ref or got >= full - 0.005, (f"{method} on {name}: {got:.3f}; random {k}-subsets' {PERCENTILE}th "
                                              f"percentile {ref:.3f}, all features {full:.3f}")


@pytest.mark.parametrize("method", sorted(ESTIMATOR))
def test_estimator_defaults_equal_fit_defaults(method):
    """The estimator with only n_features (and n_clusters) set makes the same selection as dufs.fit's defaults."""
    name = "digits1v7"
    X, y, k = DATA[name]
    kw = {"n_clusters": 2} if method in CLUSTERING else {}
    e = ESTIMATOR[method](n_features=k, **kw).fit(X, y if METHODS[method].supervised else None)
    np.testing.assert_array_equal(e.get_support(indices=True), np.sort(_fit(name, method).indices))


def test_m3fs_default_on_digits_1_vs_7():
    """The issue's own bar: the default M3FS call on digits 1 vs 7 no longer puts every sample in one cluster, and
    k-means on its 10 features reaches at least 0.95 (all 64 features: 1.00)."""
    X, y, _ = DATA["digits1v7"]
    sel = dufs.fit(X, method="m3fs", n_features=10, n_clusters=2)
    assert np.unique(sel.diagnostics["labels"]).size == 2
    assert _kmeans_acc(X[:, sel.indices], y) >= 0.95


def test_a_collapsed_m3fs_run_warns_naming_the_parameter():
    """lambda_ = 1 (the old default) makes the constant labelling optimal on digits 1 vs 7: a DufsWarning says so
    and names lambda_, and the diagnostics record it."""
    pytest.importorskip("cvxpy")
    X, _, _ = DATA["digits1v7"]
    with pytest.warns(dufs.errors.DufsWarning, match="every sample fell in one cluster.*lambda_"):
        sel = dufs.fit(X, method="m3fs", n_features=10, n_clusters=2, solver="faithful", lambda_=1.0)
    assert "one cluster" in sel.diagnostics["degenerate"]


def test_a_clustering_of_outliers_warns_and_names_the_fix():
    """UFCM on the raw values of term counts (PCMAC, values="raw", standardize None) puts all but 3 of 1,943
    documents in one cluster (2 under zscore, where a rare word's nonzero becomes sqrt(n / its count), so a document
    with one is far from all): a DufsWarning says so, names what to change, and the diagnostics record it; with that
    change (values="auto", the default: presence on sparse counts; or rows of unit norm and standardize=None) the
    clusters are no longer outliers and nothing is said."""
    from sklearn.preprocessing import normalize

    X, _, k = DATA["pcmac"]
    with pytest.warns(dufs.errors.DufsWarning, match="almost every sample fell in one cluster.*values='auto'"):
        sel = dufs.fit(X, method="ufcm", n_features=k, n_clusters=2, values="raw")
    counts = np.bincount(sel.diagnostics["labels"])
    assert counts.min() * 100 < counts.sum() and "outliers" in sel.diagnostics["degenerate"]
    for fixed in ({}, {"standardize": None, "values": "raw"}):
        with warnings.catch_warnings():
            warnings.simplefilter("error", dufs.errors.DufsWarning)
            sel = dufs.fit(normalize(X) if fixed else X, method="ufcm", n_features=k, n_clusters=2, **fixed)
        assert np.bincount(sel.diagnostics["labels"]).min() * 100 >= X.shape[0]


def test_a_cluster_of_under_one_percent_is_degenerate():
    """The rule behind that warning: one cluster holding all but under 1% of the samples (199 + 1) is degenerate, all
    but 1% itself (198 + 2) is not, nor are many small clusters; empty cluster indices are not clusters; labels of
    any type."""
    from dufs.api import _degenerate

    def said(labels):
        return _degenerate("jcfs", None, False, {"labels": labels}, {}) or ""

    assert "almost every sample" in said(np.r_[np.zeros(199, int), 1])
    assert said(np.r_[np.zeros(198, int), np.ones(2, int)]) == ""
    assert said(np.r_[np.zeros(198, int), np.full(2, 5)]) == ""
    assert "almost every sample" in said(np.array(["a"] * 200 + ["b"]))
    assert said(np.arange(1000) % 200) == ""  # many small clusters, none holding almost every sample
    assert "every sample fell in one cluster" in said(np.full(10, 3))


def test_constant_scores_warn():
    """Variance on standardised columns: every score is 1 and the ranking is by index alone; a DufsWarning says so."""
    X = DATA["breast"][0]
    X = (X - X.mean(axis=0)) / X.std(axis=0)
    with pytest.warns(dufs.errors.DufsWarning, match="every feature has the same score"):
        dufs.fit(X, method="variance", n_features=4)


@pytest.mark.parametrize("method", ["m3fs", "jcfs", "ufcm"])
def test_clustering_defaults_find_clusters_planted_in_sparse_rows(method):
    """kddb-like rows (power-law binary background, 5 of its cluster's 20 features a row; NumPy alone): the
    default selection holds at least 15 of the 20 chosen among the 40 cluster features. M3FS and JCFS build their
    kNN graph of sparse data on the raw rows: on the z-scored rows' graph both chose none (M3FS's labels then
    974 / 3,026 on 4,000 rows); by chance about 20 x 40 / 3,000 = 0.3."""
    X, z, truth = planted_clusters(3000, 3000)
    kw = {"n_components": 2} if method == "ufcm" else {}
    with warnings.catch_warnings():
        warnings.simplefilter("error", dufs.errors.DufsWarning)
        sel = dufs.fit(X, method=method, n_features=20, n_clusters=2, **kw)
    assert np.isin(sel.indices, truth).sum() >= 15, sel.indices.tolist()
    if method == "m3fs":
        assert adjusted_rand_score(z, sel.diagnostics["labels"]) > 0.9
