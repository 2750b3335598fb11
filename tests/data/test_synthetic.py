"""The synthetic kddb-like generator: determinism, structure, power law, labels, learnability."""

from __future__ import annotations

import json

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from dufs.data.synthetic import CHUNK_ROWS, GENERATOR, SyntheticSpec, generate_rows
from dufs.errors import ParameterError

N_ROWS = 20_000
SPEC = SyntheticSpec(n_rows=N_ROWS, n_features=100_000, seed=1)


@pytest.fixture(scope="module")
def big():
    """SPEC's rows as a CSR matrix, its labels and ground truth."""
    indptr, indices, data, y = generate_rows(SPEC, 0, N_ROWS)
    X = sp.csr_array((data, indices, indptr), shape=(N_ROWS, SPEC.n_features))
    return X, y, SPEC.ground_truth()


def _concat(spec, cuts):
    parts = [generate_rows(spec, a, b) for a, b in zip(cuts[:-1], cuts[1:], strict=True)]
    offsets = np.cumsum([0] + [p[0][-1] for p in parts])[:-1]
    indptr = np.concatenate([[0]] + [p[0][1:] + o for p, o in zip(parts, offsets, strict=True)])
    return (indptr, *(np.concatenate([p[i] for p in parts]) for i in (1, 2, 3)))


def _assert_same(a, b):
    for u, v in zip(a, b, strict=True):
        assert u.dtype == v.dtype
        np.testing.assert_array_equal(u, v)


# ------------------------------------------------------------------------------------- determinism
SMALL = SyntheticSpec(n_rows=3 * CHUNK_ROWS + 123, n_features=5000, nnz_per_row=12, seed=7)


@pytest.fixture(scope="module")
def small_whole():
    return generate_rows(SMALL, 0, SMALL.n_rows)


@pytest.mark.parametrize("cuts", [
    [0, 1, 333, 1000, CHUNK_ROWS, CHUNK_ROWS + 1, 2 * CHUNK_ROWS - 1, SMALL.n_rows],
    [0, SMALL.n_rows // 2, SMALL.n_rows],
    [0, 0, 5, 5, 3 * CHUNK_ROWS, SMALL.n_rows, SMALL.n_rows],
])
def test_blocking_does_not_matter(small_whole, cuts):
    _assert_same(_concat(SMALL, cuts), small_whole)


@settings(max_examples=15, deadline=None)
@given(st.lists(st.integers(0, SMALL.n_rows), min_size=0, max_size=6))
def test_any_blocking_gives_the_same_rows(small_whole, inner):
    cuts = [0, *sorted(inner), SMALL.n_rows]
    _assert_same(_concat(SMALL, cuts), small_whole)


def test_rows_do_not_depend_on_n_rows(small_whole):
    longer = SyntheticSpec(n_rows=10 * SMALL.n_rows, n_features=5000, nnz_per_row=12, seed=7)
    _assert_same(generate_rows(longer, 0, SMALL.n_rows), small_whole)
    assert longer.ground_truth()["informative"] == SMALL.ground_truth()["informative"]


def test_same_seed_same_data_different_seed_different_data(small_whole):
    again = SyntheticSpec(n_rows=SMALL.n_rows, n_features=5000, nnz_per_row=12, seed=7)
    _assert_same(generate_rows(again, 0, SMALL.n_rows), small_whole)
    assert again.ground_truth() == SMALL.ground_truth()
    other = SyntheticSpec(n_rows=SMALL.n_rows, n_features=5000, nnz_per_row=12, seed=8)
    a, b = generate_rows(SMALL, 0, 200), generate_rows(other, 0, 200)
    assert not (np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]))
    assert other.ground_truth()["informative"] != SMALL.ground_truth()["informative"]


# --------------------------------------------------------------------------------------- structure
def test_csr_buffers_are_well_formed(small_whole):
    indptr, indices, data, y = small_whole
    n = SMALL.n_rows
    assert indptr.dtype == np.int64 and indices.dtype == np.int32
    assert data.dtype == np.float32 and y.dtype == np.float64
    assert indptr.shape == (n + 1,) and y.shape == (n,)
    assert indptr[0] == 0 and indptr[-1] == indices.size
    assert np.all(np.diff(indptr) >= 1)
    assert np.all(data == 1.0)
    assert indices.min() >= 0 and indices.max() < SMALL.n_features
    row_of = np.repeat(np.arange(n), np.diff(indptr))
    same_row = row_of[1:] == row_of[:-1]
    assert np.all(np.diff(indices.astype(np.int64))[same_row] > 0)  # sorted, no duplicates
    assert set(np.unique(y)) == {-1.0, 1.0}


def test_slice_in_the_middle_starts_at_zero(small_whole):
    indptr, indices, data, y = generate_rows(SMALL, 4000, 4100)
    assert indptr[0] == 0 and indptr.size == 101
    whole = small_whole[0]
    np.testing.assert_array_equal(indptr, whole[4000:4101] - whole[4000])
    np.testing.assert_array_equal(indices, small_whole[1][whole[4000]:whole[4100]])


def test_mean_nnz_per_row_near_spec(big):
    X, _, _ = big
    assert abs(X.nnz / X.shape[0] - SPEC.nnz_per_row) < 0.5


def test_nnz_capped_at_n_features():
    spec = SyntheticSpec(n_rows=500, n_features=8, nnz_per_row=8, n_informative=2)
    indptr, indices, _, _ = generate_rows(spec, 0, 500)
    assert np.diff(indptr).max() <= 8 and indices.max() < 8


def test_power_law(big):
    X, _, gt = big
    freq = np.sort(np.bincount(X.indices, minlength=SPEC.n_features))[::-1]
    assert freq[0] > 0.5 * N_ROWS  # the top feature is in most rows
    assert freq[:10].min() > 100 * max(np.median(freq), 1)
    ranks = np.arange(20, 500)
    slope = np.polyfit(np.log(ranks + 1.0), np.log(freq[ranks]), 1)[0]
    assert abs(slope + SPEC.zipf_exponent) < 0.25, slope
    # frequent features are spread over the id range, not all at low ids
    top = np.argsort(np.bincount(X.indices, minlength=SPEC.n_features))[::-1][:100]
    assert top.max() > SPEC.n_features // 2 and top.min() < SPEC.n_features // 2
    m, c = gt["rank_to_feature"]["multiplier"], gt["rank_to_feature"]["offset"]
    assert top[0] == c and top[1] == (m + c) % SPEC.n_features


# ------------------------------------------------------------------------------------------ labels
def test_ground_truth_is_json_and_consistent(big):
    _, _, gt = big
    assert json.loads(json.dumps(gt)) == gt
    assert gt["generator"] == GENERATOR and gt["seed"] == SPEC.seed
    assert gt["label_noise"] == SPEC.label_noise and gt["zipf_exponent"] == SPEC.zipf_exponent
    inf, w = np.array(gt["informative"]), np.array(gt["weights"])
    assert inf.size == SPEC.n_informative == w.size and np.all(np.diff(inf) > 0)
    assert np.all((np.abs(w) >= 1.0) & (np.abs(w) <= 2.0))
    assert (w > 0).any() and (w < 0).any()
    ranks = np.array(gt["informative_ranks"])
    assert 10 <= ranks.min() and ranks.max() < SPEC.n_features // 100
    m, c = gt["rank_to_feature"]["multiplier"], gt["rank_to_feature"]["offset"]
    np.testing.assert_array_equal((m * ranks + c) % SPEC.n_features, inf)


def test_informative_features_are_frequent_enough(big):
    X, _, gt = big
    counts = np.bincount(X.indices, minlength=SPEC.n_features)[gt["informative"]]
    assert counts.min() >= 0.01 * N_ROWS


def test_both_classes_and_balance(big):
    _, y, _ = big
    assert set(np.unique(y)) == {-1.0, 1.0}
    assert 0.3 <= np.mean(y > 0) <= 0.7


def test_labels_follow_the_model(big):
    X, y, gt = big
    score = X[:, gt["informative"]] @ np.array(gt["weights"]) + gt["bias"]
    agree = np.mean(np.where(score > 0, 1.0, -1.0) == y)
    assert agree > 1 - SPEC.label_noise - 0.03
    assert agree < 1 - SPEC.label_noise / 2  # the flips happened


def test_learnable(big):
    from sklearn.linear_model import LogisticRegression

    X, y, gt = big
    inf = np.array(gt["informative"])
    freq = np.bincount(X.indices, minlength=SPEC.n_features)
    distractors = np.setdiff1d(np.argsort(freq)[::-1][:200], inf)[:100]
    cols = np.concatenate([inf, distractors])
    Xc = X[:, cols]
    n_train = 15_000
    clf = LogisticRegression(C=1.0, max_iter=1000).fit(Xc[:n_train], y[:n_train])
    assert clf.score(Xc[n_train:], y[n_train:]) > 1 - SPEC.label_noise - 0.1
    largest = cols[np.argsort(-np.abs(clf.coef_[0]))[: SPEC.n_informative // 2]]
    assert set(largest) <= set(inf)


# -------------------------------------------------------------------------------------- validation
@pytest.mark.parametrize("kwargs, name", [
    (dict(n_rows=0), "n_rows"),
    (dict(n_rows=1.5), "n_rows"),
    (dict(n_features=0), "n_features"),
    (dict(n_features=2**31), "n_features"),
    (dict(nnz_per_row=0), "nnz_per_row"),
    (dict(nnz_per_row=101), "nnz_per_row"),
    (dict(n_informative=0), "n_informative"),
    (dict(n_informative=True), "n_informative"),
    (dict(seed=-1), "seed"),
    (dict(zipf_exponent=-0.5), "zipf_exponent"),
    (dict(zipf_exponent=float("nan")), "zipf_exponent"),
    (dict(label_noise=0.5), "label_noise"),
    (dict(label_noise="0.1"), "label_noise"),
])
def test_bad_parameters(kwargs, name):
    args = dict(n_rows=10, n_features=100) | kwargs
    with pytest.raises(ParameterError, match=f"The '{name}' parameter of make_synthetic must be"):
        SyntheticSpec(**args)


def test_parameters_are_normalised():
    spec = SyntheticSpec(n_rows=np.int64(10), n_features=100, zipf_exponent=1, seed=np.uint8(3))
    assert type(spec.n_rows) is int and type(spec.zipf_exponent) is float and type(spec.seed) is int
    hash(spec)


def test_nnz_per_row_message():
    with pytest.raises(ParameterError, match=r"must be an int in \[1, n_features\]; got 0\."):
        SyntheticSpec(n_rows=10, n_features=100, nnz_per_row=0)


@pytest.mark.parametrize("start, stop, name", [(-1, 5, "start"), (0, 11, "stop"), (6, 5, "stop"),
                                               (0.0, 5, "start")])
def test_bad_row_range(start, stop, name):
    spec = SyntheticSpec(n_rows=10, n_features=100)
    with pytest.raises(ParameterError, match=f"The '{name}' parameter of generate_rows"):
        generate_rows(spec, start, stop)


def test_clusters_plant_features_of_their_own_and_label_the_rows():
    """Each row's label is its cluster; it holds cluster_nnz distinct features of its cluster's own (more only by
    a power-law draw landing there); the clusters' features are disjoint and none is informative; any row range
    gives the same rows."""
    import scipy.sparse as sp

    spec = SyntheticSpec(n_rows=6000, n_features=50_000, n_clusters=3, cluster_features=8, cluster_nnz=4,
                         n_informative=5, seed=3)
    indptr, indices, data, y = generate_rows(spec, 0, spec.n_rows)
    X = sp.csr_array((data, indices, indptr), shape=(spec.n_rows, spec.n_features))
    gt = spec.ground_truth()
    cf = np.array(gt["cluster_features"])
    assert gt["labels"] == "clusters" and cf.shape == (3, 8)
    assert len(np.unique(cf)) == 24 and not set(cf.ravel()) & set(gt["informative"])
    assert set(np.unique(y)) == {0.0, 1.0, 2.0}
    assert np.all(np.diff(indices[indptr[0]:indptr[1]]) > 0)  # ids sorted and distinct within a row
    for c in range(3):
        own = X[:, cf[c]].toarray()
        mine = y == c
        assert np.all(own[mine].sum(1) >= 4)
        assert own[~mine].mean() < 0.01  # only by chance elsewhere
        assert abs(mine.mean() - 1 / 3) < 0.03
    ip2, ix2, _, y2 = generate_rows(spec, 1234, 4321)
    np.testing.assert_array_equal(ix2, indices[indptr[1234]:indptr[4321]])
    np.testing.assert_array_equal(y2, y[1234:4321])


def test_cluster_parameters_are_checked():
    with pytest.raises(ParameterError, match="n_clusters"):
        SyntheticSpec(n_rows=10, n_features=100, n_clusters=1)
    with pytest.raises(ParameterError, match="cluster_nnz"):
        SyntheticSpec(n_rows=10, n_features=100, n_clusters=2, cluster_features=3, cluster_nnz=4)
    with pytest.raises(ParameterError, match="cluster_features"):
        SyntheticSpec(n_rows=10, n_features=100, n_clusters=20, cluster_features=5)
