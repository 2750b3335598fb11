"""The scikit-learn estimators: sklearn's conformance suite, agreement with dufs.fit, use in a Pipeline, and
parameter-validation messages."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.pipeline import Pipeline
from sklearn.svm import LinearSVC
from sklearn.utils.estimator_checks import parametrize_with_checks

import dufs
from dufs.data.datasets import load
from dufs.errors import DufsWarning
from dufs.estimators import (
    JCFS,
    M3FS,
    MMFS,
    UFCM,
    CorrelationSelector,
    FisherScore,
    LapAOFS,
    LapDOFS,
    LaplacianScore,
    VarianceSelector,
)

ESTIMATORS = {
    "variance": VarianceSelector,
    "correlation": CorrelationSelector,
    "fisher": FisherScore,
    "laplacian": LaplacianScore,
    "mmfs": MMFS,
}


def _expected_failed_checks(est):
    # A fit on too few samples for LaplacianScore raises a ValueError naming n_samples, which check_fit2d_1sample
    # accepts. Five checks set n_clusters = 1 on any estimator that has it; a max-margin clustering into one
    # cluster is no clustering, and M3FS rejects it by its parameter table.
    if isinstance(est, M3FS):
        why = "the check sets n_clusters = 1; M3FS needs n_clusters >= 2 (a margin between clusters)"
        return dict.fromkeys(("check_dont_overwrite_parameters", "check_methods_subset_invariance",
                              "check_fit2d_1sample", "check_fit2d_1feature", "check_fit2d_predict1d"), why)
    return {}


@parametrize_with_checks([LapAOFS(n_features=1, n_neighbors=2), LapDOFS(n_features=1, n_neighbors=2),
                          JCFS(n_features=1, n_neighbors=2, max_iter=2), UFCM(n_features=1, max_iter=3, n_init=2),
                          M3FS(n_features=1, solver="alternating", n_neighbors=2, max_iter=3, polish=0),
                          VarianceSelector(n_features=1), CorrelationSelector(n_features=1),
                          FisherScore(n_features=1), LaplacianScore(n_features=1, n_neighbors=1),
                          MMFS(n_features=1)],
                         expected_failed_checks=_expected_failed_checks)
# sklearn's checks feed standardised data to every transformer (equal variances: the VarianceSelector's ranking
# is then arbitrary, and says so with a DufsWarning); the warning is tested in tests/test_defaults.py
@pytest.mark.filterwarnings("ignore:variance. every feature has the same score:dufs.errors.DufsWarning")
def test_sklearn_compatible(estimator, check):
    check(estimator)


@pytest.fixture(scope="module")
def pcmac():
    X, y = load("pcmac")
    return sp.csr_array(X[:, :500]), y


@pytest.mark.parametrize("method", sorted(ESTIMATORS))
def test_support_equals_functional_api(pcmac, method):
    X, y = pcmac
    est = ESTIMATORS[method](n_features=25).fit(X, y)
    sel = dufs.fit(X, y if dufs.api.METHODS[method].supervised else None, method=method, n_features=25)
    np.testing.assert_array_equal(est.get_support(indices=True), np.sort(sel.indices))
    np.testing.assert_array_equal(est.selection_.indices, sel.indices)
    np.testing.assert_array_equal(est.ranking_[:25], sel.indices)
    assert est.n_features_in_ == 500 and est.transform(X).shape == (X.shape[0], 25)


@pytest.mark.parametrize("method", sorted(ESTIMATORS))
def test_in_a_pipeline_with_linear_svc(pcmac, method):
    X, y = pcmac
    pipe = Pipeline([("select", ESTIMATORS[method](n_features=50)), ("svc", LinearSVC())]).fit(X, y)
    assert pipe[-1].n_features_in_ == 50
    assert 0.5 < pipe.score(X, y) <= 1.0


def test_n_features_larger_than_x_warns_and_keeps_all():
    """SelectKBest(k=10) on 5 features warns and keeps all of them; a grid search over k across data sets relies on
    it. FisherScore does the same, and n_features="all" keeps all without a warning."""
    from sklearn.feature_selection import SelectKBest, f_classif

    rng = np.random.default_rng(0)
    X = rng.normal(size=(30, 5))
    y = np.arange(30) % 2
    with pytest.warns(UserWarning, match="k=10 is greater than n_features=5"):
        ref = SelectKBest(f_classif, k=10).fit(X, y)
    with pytest.warns(DufsWarning, match="n_features=10 is greater than the 5 features of the input"):
        est = FisherScore(n_features=10).fit(X, y)
    assert est.transform(X).shape == ref.transform(X).shape == (30, 5)
    np.testing.assert_array_equal(est.transform(X), X)
    assert FisherScore(n_features="all").fit(X, y).transform(X).shape == (30, 5)


@pytest.mark.parametrize(("est", "match"), [
    (VarianceSelector(n_features=0), r"The 'n_features' parameter of VarianceSelector must be an int in the range "
                                     r"\[1, inf\) or a str among \{'all'\}\. Got 0 instead\."),
    (CorrelationSelector(standardize="l2"), r"The 'standardize' parameter of CorrelationSelector must be"),
    (LaplacianScore(weights="gauss"), r"The 'weights' parameter of LaplacianScore must be a str among"),
    (LaplacianScore(t=0.0), r"The 't' parameter of LaplacianScore must be None or a float in the range"),
])
def test_parameter_validation_messages(est, match):
    X = np.random.default_rng(0).normal(size=(30, 5))
    with pytest.raises(ValueError, match=match):
        est.fit(X, np.arange(30) % 2)


def test_laplacian_needs_more_samples_than_neighbours():
    X = np.random.default_rng(0).normal(size=(4, 3))
    with pytest.raises(ValueError, match=r"n_samples=4, n_neighbors=5"):
        LaplacianScore(n_features=1).fit(X)


def test_m3fs_estimator_equals_the_functional_api_and_finds_iris():
    """M3FS on iris plus 10 N(0,1) noise features (paper 000, Figure 1): both solvers' supports equal dufs.fit's,
    the labels are a 2-clustering of the samples, and a parameter of the other solver is a clear error."""
    pytest.importorskip("cvxpy", reason="the faithful M3FS solver needs dufs[m3fs]")
    from sklearn.datasets import load_iris

    X, _ = load_iris(return_X_y=True)
    Xn = np.hstack([X, np.random.default_rng(0).standard_normal((150, 10))])
    for solver in ("faithful", "alternating"):
        est = M3FS(n_features=4, solver=solver, C=10.0, lambda_=0.01).fit(Xn)
        sel = dufs.fit(Xn, method="m3fs", n_features=4, solver=solver, C=10.0, lambda_=0.01)
        np.testing.assert_array_equal(est.get_support(indices=True), np.sort(sel.indices[:4]))
        np.testing.assert_allclose(est.scores_, sel.scores)
        assert est.labels_.shape == (150,) and set(est.labels_) == {0, 1}
        assert est.transform(Xn).shape == (150, 4)
    with pytest.raises(ValueError, match="'max_iter' do not apply to the faithful"):
        M3FS(n_features=4, solver="faithful", max_iter=3).fit(Xn)
