"""Tests of dufs.evaluate against independent references (brute force, naive loops, scikit-learn)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from dufs import evaluate as ev
from dufs.errors import ParameterError

# ------------------------------------------------------------------------------------------ clustering accuracy


def brute_force_acc(y_true, y_pred) -> float:
    """Max over every injective map of clusters to classes (pad with dummy classes), by enumeration."""
    classes = sorted(set(y_true))
    clusters = sorted(set(y_pred))
    targets = classes + [object()] * max(0, len(clusters) - len(classes))
    best = 0
    for perm in itertools.permutations(targets, len(clusters)):
        mapping = dict(zip(clusters, perm, strict=True))
        best = max(best, sum(mapping[p] == t for t, p in zip(y_true, y_pred, strict=True)))
    return best / len(y_true)


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 25).flatmap(lambda n: st.tuples(
    st.lists(st.integers(0, 3), min_size=n, max_size=n),
    st.lists(st.sampled_from([-7, 2, 5, 11, 40]), min_size=n, max_size=n))))
def test_clustering_accuracy_equals_brute_force(pair):
    y_true, y_pred = pair
    assert ev.clustering_accuracy(y_true, y_pred) == pytest.approx(brute_force_acc(y_true, y_pred))


def test_clustering_accuracy_relabelled_identical_partition_is_one():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 6, size=300)
    relabel = np.array(["f", "a", "z", "q", "b", "m"])
    assert ev.clustering_accuracy(y, relabel[y]) == 1.0
    assert ev.nmi(y, relabel[y]) == pytest.approx(1.0)


def test_clustering_accuracy_different_cluster_counts():
    assert ev.clustering_accuracy([0, 0, 1, 1], [0, 0, 0, 0]) == 0.5
    assert ev.clustering_accuracy([0, 0, 0, 0], [0, 1, 2, 3]) == 0.25


def test_nmi_matches_sklearn_arithmetic():
    from sklearn.metrics import normalized_mutual_info_score

    rng = np.random.default_rng(1)
    a, b = rng.integers(0, 4, 200), rng.integers(0, 5, 200)
    assert ev.nmi(a, b) == pytest.approx(normalized_mutual_info_score(a, b, average_method="arithmetic"))


def _entropy_terms(a, b):
    """I(T; P), H(T), H(P) by naive loops over the contingency counts (natural logs)."""
    n = len(a)
    I = 0.0
    for u in set(a):
        for v in set(b):
            t = sum(1 for x, y in zip(a, b, strict=True) if x == u and y == v)
            if t:
                I += t / n * np.log(n * t / (list(a).count(u) * list(b).count(v)))
    H = [-sum(list(z).count(u) / n * np.log(list(z).count(u) / n) for u in set(z)) for z in (a, b)]
    return I, H[0], H[1]


def test_nmi_normalisations_follow_the_papers_formulas():
    """UFCM's eq. (18) (geometric mean of the entropies), LapAOFS's max, the min and the default arithmetic mean,
    each against the formula evaluated by loops."""
    rng = np.random.default_rng(3)
    a, b = rng.integers(0, 3, 60), rng.integers(0, 5, 60)
    I, Ha, Hb = _entropy_terms(a.tolist(), b.tolist())
    want = {"geometric": I / np.sqrt(Ha * Hb), "arithmetic": 2 * I / (Ha + Hb), "max": I / max(Ha, Hb),
            "min": I / min(Ha, Hb)}
    for method, w in want.items():
        assert ev.nmi(a, b, method) == pytest.approx(w, rel=1e-12), method
    assert ev.nmi(a, b, "geometric") > ev.nmi(a, b) > ev.nmi(a, b, "max")  # unequal entropies: they differ
    with pytest.raises(ParameterError, match="'average_method' parameter of nmi"):
        ev.nmi(a, b, "harmonic")
    with pytest.raises(ParameterError, match="'nmi_average' parameter of kmeans_scores"):
        ev.kmeans_scores(rng.standard_normal((10, 2)), a[:10], nmi_average="sqrt")


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 30).flatmap(lambda n: st.tuples(
    st.lists(st.integers(0, 3), min_size=n, max_size=n),
    st.lists(st.sampled_from([-1, 4, 9]), min_size=n, max_size=n))))
def test_majority_accuracy_labels_each_cluster_with_its_majority_class(pair):
    y_true, y_pred = pair
    correct = 0
    for c in set(y_pred):
        members = [t for t, p in zip(y_true, y_pred, strict=True) if p == c]
        correct += max(members.count(k) for k in set(members))
    got = ev.majority_accuracy(y_true, y_pred)
    assert got == pytest.approx(correct / len(y_true))
    assert got >= ev.clustering_accuracy(y_true, y_pred) - 1e-12


def test_majority_accuracy_exceeds_matching_when_clusters_share_a_class():
    y_true = [0, 0, 0, 0, 1, 1]
    y_pred = [0, 0, 1, 1, 2, 2]  # two clusters of class 0: both labelled 0
    assert ev.majority_accuracy(y_true, y_pred) == 1.0
    assert ev.clustering_accuracy(y_true, y_pred) == pytest.approx(4 / 6)


# ------------------------------------------------------------------------------------------ 1-NN


def naive_one_nn(X, y) -> float:
    n = X.shape[0]
    correct = 0
    for i in range(n):
        best_j, best_d = -1, np.inf
        for j in range(n):
            if j == i:
                continue
            d = float(np.sqrt(np.sum((X[i] - X[j]) ** 2)))
            if d < best_d:
                best_j, best_d = j, d
        correct += y[best_j] == y[i]
    return correct / n


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_one_nn_accuracy_matches_naive_and_sklearn(seed):
    from sklearn.model_selection import LeaveOneOut, cross_val_score
    from sklearn.neighbors import KNeighborsClassifier

    rng = np.random.default_rng(seed)
    X = rng.normal(size=(60, 7))
    y = rng.integers(0, 3, size=60)
    X[y == 1] += 0.8
    got = ev.one_nn_accuracy(X, y)
    assert got == pytest.approx(naive_one_nn(X, y))
    ref = cross_val_score(KNeighborsClassifier(n_neighbors=1), X, y, cv=LeaveOneOut()).mean()
    assert got == pytest.approx(ref)
    Xs = sp.random(60, 40, density=0.2, random_state=seed, format="csr")
    assert ev.one_nn_accuracy(Xs, y) == pytest.approx(naive_one_nn(Xs.toarray(), y))
    assert ev.one_nn_accuracy(sp.csr_array(Xs), y) == pytest.approx(ev.one_nn_accuracy(Xs.toarray(), y))


def test_one_nn_ties_go_to_lower_index():
    X = np.array([[0.0], [1.0], [-1.0]])  # point 0 is equidistant from 1 and 2
    # with the lower-index rule point 0 takes point 1's label (the higher-index rule would give 1/3, then 2/3)
    assert ev.one_nn_accuracy(X, np.array([5, 5, 6])) == pytest.approx(2 / 3)
    assert ev.one_nn_accuracy(X, np.array([6, 5, 6])) == pytest.approx(1 / 3)


# ------------------------------------------------------------------------------------------ k-means


def test_kmeans_scores_on_separated_blobs():
    from sklearn.datasets import make_blobs

    X, y = make_blobs(n_samples=150, centers=4, n_features=5, cluster_std=0.3, center_box=(-20, 20),
                      random_state=3)
    s = ev.kmeans_scores(X, y, n_runs=5, random_state=0)
    assert set(s) == {"acc", "nmi"}
    assert s["acc"] == 1.0
    assert s["nmi"] == pytest.approx(1.0)
    s2 = ev.kmeans_scores(sp.csr_array(X), y + 10, n_runs=3)
    assert s2["acc"] == 1.0


# ------------------------------------------------------------------------------------------ top-K curve


@pytest.fixture(scope="module")
def allaml_slice():
    from dufs.data.datasets import load

    X, y = load("allaml", sparse=False)
    return X[:, :300], y


def test_topk_curve_loo_matches_handwritten_loop(allaml_slice):
    from sklearn.model_selection import LeaveOneOut, cross_val_score
    from sklearn.svm import LinearSVC

    X, y = allaml_slice
    ranking = np.argsort(-X.var(axis=0))
    ks = [2, 5, 10]
    got = ev.topk_curve(X, y, ranking, ks, cv="loo")
    ref = []
    for k in ks:
        clf = LinearSVC(C=1.0, loss="squared_hinge", penalty="l2", dual="auto", random_state=0)
        ref.append(cross_val_score(clf, X[:, ranking[:k]], y, cv=LeaveOneOut()).mean())
    assert got["k"] == ks
    np.testing.assert_allclose(got["accuracy"], ref)


def test_topk_curve_kfold_and_test_set(allaml_slice):
    from sklearn.model_selection import StratifiedKFold, cross_val_score
    from sklearn.svm import LinearSVC

    X, y = allaml_slice
    ranking = np.arange(300)[::-1]
    got = ev.topk_curve(X, y, ranking, [5, 10], cv=4, random_state=0)
    ref = [cross_val_score(LinearSVC(random_state=0), X[:, ranking[:k]], y,
                           cv=StratifiedKFold(4, shuffle=True, random_state=0)).mean() for k in (5, 10)]
    np.testing.assert_allclose(got["accuracy"], ref)

    tr, te = np.arange(0, 72, 2), np.arange(1, 72, 2)
    got = ev.topk_curve(sp.csr_array(X[tr]), y[tr], ranking, 10, test=(X[te], y[te]))
    clf = LinearSVC(random_state=0).fit(X[tr][:, ranking[:10]], y[tr])
    assert got["accuracy"] == [pytest.approx(clf.score(X[te][:, ranking[:10]], y[te]))]


def test_topk_curve_validation(allaml_slice):
    X, y = allaml_slice
    r = np.arange(300)
    with pytest.raises(ParameterError, match=r"The 'ks' parameter of topk_curve must be ints in "
                                             r"\[1, n_features\]; got \[0\]\."):
        ev.topk_curve(X, y, r, [0])
    with pytest.raises(ParameterError, match="'ks'"):
        ev.topk_curve(X, y, r[:10], [11])
    with pytest.raises(ParameterError, match="'ranking'"):
        ev.topk_curve(X, y, [1, 1, 2], [1])
    with pytest.raises(ParameterError, match="'ranking'"):
        ev.topk_curve(X, y, [300], [1])
    with pytest.raises(ParameterError, match="'cv'"):
        ev.topk_curve(X, y, r, [1], cv=1)
    with pytest.raises(ParameterError, match="'C'"):
        ev.topk_curve(X, y, r, [1], C=0)
    with pytest.raises(ParameterError, match="'y'"):
        ev.topk_curve(X, y[:-1], r, [1])
    with pytest.raises(ParameterError, match="'test'"):
        ev.topk_curve(X, y, r, [1], test=(X[:, :10], y))


def test_other_validation():
    with pytest.raises(ParameterError, match="'y_pred'"):
        ev.clustering_accuracy([0, 1], [0])
    with pytest.raises(ParameterError, match="'n_runs'"):
        ev.kmeans_scores(np.eye(3), [0, 1, 2], n_runs=0)
    with pytest.raises(ParameterError, match="'n_clusters'"):
        ev.kmeans_scores(np.eye(3), [0, 1, 2], n_clusters=4)
    with pytest.raises(ParameterError, match="'X_selected'"):
        ev.one_nn_accuracy(np.ones((1, 2)), [0])
    with pytest.raises(ParameterError, match="'X_selected'"):
        ev.one_nn_accuracy(np.array([[np.nan, 1.0], [0.0, 1.0]]), [0, 1])
