"""Labels are classes, whatever their names: renumbering the classes of a multi-class set (or naming them by strings)
changes no selection of MMFS, QPFS, the Fisher score or the correlation filter, in memory or from a store, through
dufs.fit or the estimators. A continuous target is refused by the methods that need classes and is Pearson's for the
correlation filter; ``n_features`` must be a count, not a bool."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.datasets import load_digits, load_iris
from sklearn.utils._param_validation import InvalidParameterError

import dufs
from dufs.errors import ParameterError
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

CLASSIFYING = ("mmfs", "qpfs", "fisher", "correlation")
ESTIMATORS = {"mmfs": MMFS, "fisher": FisherScore, "correlation": CorrelationSelector}  # QPFS has none
K = 6


def _iris_noise():
    X, y = load_iris(return_X_y=True)
    return np.hstack([X, np.random.default_rng(0).standard_normal((150, 10))]), y


def _digits():
    X, y = load_digits(return_X_y=True)
    return X[::2], y[::2]  # 899 samples, 10 classes, 64 pixels (some constant)


SETS = {"iris+noise": (_iris_noise, np.array([1, 0, 2])),  # swap class ids 0 and 1
        "digits": (_digits, np.array([3, 7, 0, 9, 1, 5, 2, 8, 6, 4]))}


@pytest.fixture(scope="module", params=sorted(SETS))
def relabelled(request, tmp_path_factory):
    """A multi-class set, its labels under three namings (the original ids, permuted ids, strings) and stores
    written with dufs.write_store under the two numeric namings."""
    load, perm = SETS[request.param]
    X, y = load()
    names = np.array([f"class-{c}" for c in "qwertyuiop"[:perm.size]])
    labels = {"ids": y, "permuted": perm[y], "strings": names[perm[y]]}
    tmp = tmp_path_factory.mktemp(request.param)
    stores = {k: dufs.write_store(X, tmp / f"{k}.zarr", labels[k]) for k in ("ids", "permuted")}
    return request.param, X, labels, stores


def _same(sels: dict) -> None:
    first = next(iter(sels.values()))
    for name, s in sels.items():
        assert s.indices.tolist() == first.indices.tolist(), name
        np.testing.assert_array_equal(s.scores, first.scores, err_msg=name)  # bit for bit, NaN where NaN


@pytest.mark.parametrize("method", CLASSIFYING)
def test_permuted_class_ids_give_the_identical_selection(relabelled, method):
    """The required test: permuting the class ids (and naming the classes by strings) gives the identical
    selection and scores, in memory and from a store, through dufs.fit and through the estimators."""
    name, X, labels, stores = relabelled
    sels = {f"fit {k}": dufs.fit(X, y, method=method, n_features=K) for k, y in labels.items()}
    sels.update({f"store {k}": dufs.fit(st, method=method, n_features=K, client=False) for k, st in stores.items()})
    if method in ESTIMATORS:
        for k, y in labels.items():
            est = ESTIMATORS[method](n_features=K).fit(X, y)
            sels[f"estimator {k}"] = est.selection_
            assert est.get_support(indices=True).tolist() == sorted(sels["fit ids"].indices.tolist())
    _same(sels)
    if name == "iris+noise":  # and the selection is the informative one: the four iris measurements first
        assert sorted(sels["fit ids"].indices[:4].tolist()) == [0, 1, 2, 3] or method == "mmfs"


def test_string_labels_give_the_dense_fisher_score_and_correlation_ratio():
    """Against dense NumPy definitions on iris with string classes: Fisher S_b / S_w, and the correlation ratio as
    the root of R^2 of each feature's least-squares fit on the class indicators."""
    X, y = _iris_noise()
    ys = np.array(["setosa", "versicolor", "virginica"])[y]
    mu = X.mean(axis=0)
    sb = sum((y == c).sum() * (X[y == c].mean(axis=0) - mu) ** 2 for c in range(3))
    sw = sum((y == c).sum() * X[y == c].var(axis=0) for c in range(3))
    np.testing.assert_allclose(dufs.fit(X, ys, method="fisher", n_features=3).scores, sb / sw, rtol=1e-10)
    H = (y[:, None] == np.arange(3)[None, :]).astype(float)
    coef, *_ = np.linalg.lstsq(H, X, rcond=None)
    eta = np.sqrt(1 - ((X - H @ coef) ** 2).sum(axis=0) / ((X - mu) ** 2).sum(axis=0))
    got = dufs.fit(X, ys, method="correlation", n_features=3)
    np.testing.assert_allclose(got.scores, eta, rtol=1e-9)
    assert CorrelationSelector(n_features=3).fit(X, ys).selection_.indices.tolist() == got.indices.tolist()


@pytest.mark.parametrize("labels", ["bool", "signed", "strings"])
def test_two_classes_of_any_kind_agree(labels):
    """Booleans, -1/+1 floats and strings name the same two classes: identical selections (the correlation is
    |Pearson| on two classes, the same for any coding)."""
    rng = np.random.default_rng(1)
    X = rng.standard_normal((120, 12))
    yb = X[:, 4] + 0.5 * X[:, 9] + 0.3 * rng.standard_normal(120) > 0
    y = {"bool": yb, "signed": np.where(yb, 1.0, -1.0), "strings": np.where(yb, "spam", "ham")}[labels]
    for method in CLASSIFYING:
        want = dufs.fit(X, yb.astype(int), method=method, n_features=3)
        got = dufs.fit(X, y, method=method, n_features=3)
        assert got.indices.tolist() == want.indices.tolist(), method
        np.testing.assert_allclose(got.scores, want.scores, rtol=1e-12, atol=1e-15, err_msg=method)
    assert dufs.fit(X, y, method="fisher", n_features=2).indices.tolist() == [4, 9]


@pytest.mark.parametrize("method", ["fisher", "mmfs", "qpfs"])
def test_a_continuous_target_is_refused_by_the_methods_that_need_classes(method):
    rng = np.random.default_rng(2)
    X = rng.standard_normal((80, 6))
    t = X[:, 0] + 0.1 * rng.standard_normal(80)
    msg = (rf"^method '{method}' needs class labels; y looks continuous \(80 distinct values, not all whole "
           rf"numbers\): give class labels \(ints or strings\), or use method='correlation'")
    with pytest.raises(ParameterError, match=msg):
        dufs.fit(X, t, method=method, n_features=2)
    if method in ESTIMATORS:
        with pytest.raises(ParameterError, match=msg):
            ESTIMATORS[method](n_features=2).fit(X, t)


def test_a_continuous_target_is_pearson_for_the_correlation_filter(tmp_path):
    rng = np.random.default_rng(3)
    X = rng.standard_normal((90, 7))
    t = 2 * X[:, 5] - X[:, 1] + rng.standard_normal(90)
    want = np.array([abs(np.corrcoef(X[:, j], t)[0, 1]) for j in range(7)])
    store = dufs.write_store(X, tmp_path / "t.zarr", t)
    for sel in (dufs.fit(X, t, method="correlation", n_features=2),
                dufs.fit(store, method="correlation", n_features=2, client=False),
                CorrelationSelector(n_features=2).fit(X, t).selection_):
        np.testing.assert_allclose(sel.scores, want, rtol=1e-9)
        assert sel.indices.tolist() == [5, 1]


@pytest.mark.parametrize("method", ["fisher", "mmfs", "qpfs"])
def test_one_class_is_refused(method):
    X = np.random.default_rng(4).standard_normal((30, 4))
    with pytest.raises(ParameterError, match=rf"^method '{method}' needs at least two classes in y; got 1 class"):
        dufs.fit(X, np.full(30, "a"), method=method, n_features=2)


ALL_ESTIMATORS = [VarianceSelector, CorrelationSelector, FisherScore, LaplacianScore, MMFS, LapAOFS, LapDOFS, JCFS,
                  UFCM, M3FS]


@pytest.mark.parametrize("bad", [True, False, np.True_])
def test_n_features_must_not_be_a_bool(bad):
    rng = np.random.default_rng(5)
    X = rng.standard_normal((40, 5))
    y = np.arange(40) % 2
    with pytest.raises(ParameterError, match=r"^The 'n_features' parameter of fisher must be an int >= 1 or 'all'"):
        dufs.fit(X, y, method="fisher", n_features=bad)
    for cls in ALL_ESTIMATORS:
        with pytest.raises(ParameterError, match=rf"^The 'n_features' parameter of {cls.__name__} must be an int in "
                                                 rf"the range \[1, inf\)") as info:
            cls(n_features=bad).fit(X, y)
        assert isinstance(info.value, InvalidParameterError)  # what scikit-learn's tools expect
