"""Selection: support mask, transform on every input kind, faithful JSON round trips, the input's identity and
Selection.check_input."""

from __future__ import annotations

import json

import dask.array as da
import numpy as np
import pytest
import scipy.sparse as sp
import sparse

import dufs
from dufs.api import METHODS
from dufs.errors import DufsWarning, ParameterError
from dufs.selection import Selection


def _no_constant(name):
    raise AssertionError(f"the JSON holds the literal {name}")


def _sel(n=10):
    scores = np.linspace(0, 1, n)
    scores[3] = np.nan
    return Selection("variance", [7, 2, 5], scores, n, params={"k": 3, "arr": np.arange(2)},
                     diagnostics={"passes": 1, "trace": [np.float64(1.5), np.inf]})


def test_support_mask_and_top():
    s = _sel()
    assert s.support_mask.sum() == 3 and s.support_mask[[7, 2, 5]].all()
    assert s.top(2).tolist() == [7, 2]
    with pytest.raises(ParameterError, match="'k' parameter of Selection.top"):
        s.top(0)


def test_transform_every_input_kind():
    rng = np.random.default_rng(0)
    X = rng.random((6, 10))
    s = _sel()
    want = X[:, [7, 2, 5]]
    assert np.array_equal(s.transform(X), want)
    assert np.array_equal(s.transform(sp.csr_array(X)).toarray(), want)
    assert np.array_equal(s.transform(sparse.COO.from_numpy(X)).todense(), want)
    assert np.array_equal(s.transform(da.from_array(X, chunks=(3, 4))).compute(), want)
    with pytest.raises(ParameterError, match="has 9 features"):
        s.transform(X[:, :9])


def test_json_round_trip(tmp_path):
    s = _sel()
    path = tmp_path / "sel.json"
    small = s.to_json(path)
    for text in (small, s.to_json()):
        json.loads(text, parse_constant=_no_constant)  # strict JSON: no NaN or Infinity literals
    assert "scores" not in json.loads(small) and json.loads(small)["sidecars"]["scores"]["file"] == "sel.scores.npy"
    for src in (s.to_json(), path):  # the text form carries every score inline; the file, its sidecar
        t = Selection.from_json(src)
        assert t.method == s.method and t.indices.tolist() == [7, 2, 5] and t.n_features_in == 10
        _same_bits(t.scores, s.scores)
        _same_bits(t.selected_scores, s.scores[[7, 2, 5]])
        assert t.params == {"k": 3, "arr": [0, 1]} and t.diagnostics == {"passes": 1, "trace": [1.5, None]}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sel.json", "sel.scores.npy"]
    assert np.load(tmp_path / "sel.scores.npy").dtype == np.float64


def test_a_file_without_its_sidecar_still_selects(tmp_path):
    """The JSON alone: indices, the selected features' scores and transform; the full scores are None, with a
    warning naming the missing file."""
    s = _sel()
    path = tmp_path / "sel.json"
    s.to_json(path)
    (tmp_path / "sel.scores.npy").unlink()
    with pytest.warns(DufsWarning, match=r"the full scores are missing \(.*sel.scores.npy not found\)"):
        t = Selection.from_json(path)
    assert t.scores is None and t.indices.tolist() == [7, 2, 5]
    _same_bits(t.selected_scores, s.scores[[7, 2, 5]])
    X = np.arange(60.0).reshape(6, 10)
    assert np.array_equal(t.transform(X), X[:, [7, 2, 5]])
    with pytest.raises(ParameterError, match="has no scores to plot"):
        t.plot(tmp_path / "s.png")


def test_a_sidecar_of_another_selection_is_refused(tmp_path):
    a, b = _sel(), Selection("variance", [1], np.arange(10.0), 10)
    a.to_json(tmp_path / "a.json")
    b.to_json(tmp_path / "b.json")
    (tmp_path / "b.scores.npy").replace(tmp_path / "a.scores.npy")
    with pytest.raises(ParameterError, match="a.scores.npy does not belong to .*a.json"):
        Selection.from_json(tmp_path / "a.json")


def test_large_arrays_of_the_diagnostics_go_to_sidecars(tmp_path):
    """Per-sample arrays (cluster labels) leave the JSON for a sidecar and come back; short lists stay inline;
    the JSON of a selection of 200 features out of 300,000 is a few kilobytes."""
    d = 300_000
    labels = np.arange(5000) % 3
    s = Selection("ufcm", np.arange(200), np.linspace(0, 1, d, dtype=np.float32), d,
                  diagnostics={"labels": labels.tolist(), "objective": [3.0, 2.0],
                               "inner": {"trace": list(range(1500))}})
    text = s.to_json(tmp_path / "u.json")
    assert len(text) < 20_000
    assert sorted(p.name for p in tmp_path.iterdir()) == ["u.inner-trace.npy", "u.json", "u.labels.npy",
                                                           "u.scores.npy"]
    t = Selection.from_json(tmp_path / "u.json")
    assert np.array_equal(t.diagnostics["labels"], labels) and t.diagnostics["objective"] == [3.0, 2.0]
    assert np.array_equal(t.diagnostics["inner"]["trace"], np.arange(1500))
    assert t.scores.dtype == np.float32 and np.array_equal(t.scores, s.scores)


def test_bad_selections_are_refused():
    with pytest.raises(ParameterError, match="must lie in"):
        Selection("x", [10], None, 10)
    with pytest.raises(ParameterError, match="distinct"):
        Selection("x", [1, 1], None, 10)
    with pytest.raises(ParameterError, match="not a dufs selection"):
        Selection.from_json('{"format": "other"}')


def test_plot_writes_a_png(tmp_path):
    s = _sel()
    out = s.plot(tmp_path / "s.png")
    assert open(out, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in tmp_path.iterdir()] == ["s.png"]


# ---------------------------------------------------------------------------------------------------- round trips
def _small():
    """40 x 8, two classes: feature 6 is constant, feature 7 is constant within each class (Fisher +inf)."""
    rng = np.random.default_rng(0)
    X = rng.standard_normal((40, 8))
    y = (X[:, 0] + 0.5 * rng.standard_normal(40) > 0).astype(float)
    X[:, 6] = 2.0
    X[:, 7] = np.where(y > 0, 1.5, -0.5)
    return X, y


def _same_bits(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    assert a.shape == b.shape
    assert np.array_equal(np.isnan(a), np.isnan(b))
    assert np.array_equal(a.view(np.int64)[~np.isnan(a)], b.view(np.int64)[~np.isnan(b)])  # bit for bit, inf signs


@pytest.mark.parametrize("method", sorted(METHODS))
def test_every_method_round_trips_bit_for_bit(method, tmp_path):
    X, y = _small()
    sel = dufs.fit(X, y if METHODS[method].supervised else None, method=method, n_features=3)
    path = tmp_path / f"{method}.json"
    json.loads(sel.to_json(path), parse_constant=_no_constant)
    text = sel.to_json()
    for back in (Selection.from_json(text), Selection.from_json(path)):
        assert back.indices.tolist() == sel.indices.tolist() and back.method == method
        _same_bits(back.scores, sel.scores)
        assert back.source == sel.source and back.source["fingerprint"].startswith("sha256-csc:")
        assert back.higher_is_better == sel.higher_is_better
    if method == "fisher":
        assert np.isposinf(sel.scores[7]) and sel.indices[0] == 7  # the best feature, +inf, stays first
        assert dufs.api.rank(Selection.from_json(text).scores)[0] == 7


def test_non_finite_scores_are_strings_and_other_formats_are_refused():
    scores = np.array([1.5, np.inf, -np.inf, np.nan, -0.0, 5e-324])
    s = Selection("fisher", [1, 0], scores, 6)
    d = json.loads(s.to_json(), parse_constant=_no_constant)
    assert d["scores"][:4] == [1.5, "inf", "-inf", "nan"] and d["format"] == "dufs.selection/3"
    _same_bits(Selection.from_json(s.to_json()).scores, scores)
    with pytest.raises(ParameterError, match="format 'dufs.selection/2'; expected 'dufs.selection/3'"):
        Selection.from_json(json.dumps(dict(d, format="dufs.selection/2")))
    with pytest.raises(ParameterError, match="a score is None"):
        Selection.from_json(json.dumps(dict(d, scores=[None] * 6)))
    with pytest.raises(ParameterError, match="a score is the string 'Infinity'"):
        Selection.from_json(json.dumps(dict(d, scores=["Infinity"] * 6)))


# ---------------------------------------------------------------------------------------------------- check_input
@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """A 'training' store with feature ids, the same data rewritten, data of the same shape but other values, one
    with two selected features' ids swapped, and one with more features."""
    tmp = tmp_path_factory.mktemp("identity")
    rng = np.random.default_rng(7)
    X = sp.random_array((300, 30), density=0.2, rng=rng, format="csr")
    y = rng.integers(0, 3, 300).astype(float)
    ids = [f"w{j}" for j in range(30)]
    out = {"train": dufs.write_store(X, tmp / "train.zarr", y, feature_ids=ids),
           "copy": dufs.write_store(X, tmp / "copy.zarr", y, feature_ids=ids)}
    X2 = X.copy()
    X2.data = X2.data[::-1].copy()  # same pattern and block nonzeros, other values
    X3 = sp.random_array((300, 30), density=0.25, rng=rng, format="csr")
    out["other"] = dufs.write_store(X3, tmp / "other.zarr", y, feature_ids=ids)
    out["wide"] = dufs.write_store(sp.random_array((300, 50), density=0.2, rng=rng, format="csr"), tmp / "wide.zarr",
                                   y)
    sel = dufs.fit(out["train"], method="fisher", n_features=5, client=False)
    swapped = list(ids)
    a, b = int(sel.indices[0]), int(sel.indices[0]) ^ 1
    swapped[a], swapped[b] = swapped[b], swapped[a]
    out["swapped"] = dufs.write_store(X, tmp / "swapped.zarr", y, feature_ids=swapped)
    return out, sel, X, X2


def test_the_source_of_a_store_selection(stores):
    out, sel, X, _ = stores
    src = sel.source
    st = out["train"]
    assert src["kind"] == "store" and src["path"] == st.path and src["shape"] == [300, 30] and src["nnz"] == X.nnz
    assert src["fingerprint"].startswith("store-meta:") and src["feature_ids"]
    assert src["selected_feature_ids"] == [f"w{j}" for j in sel.indices]
    assert Selection.from_json(sel.to_json()).source == src


def test_check_input_on_stores(stores):
    out, sel, X, _ = stores
    back = Selection.from_json(sel.to_json())
    assert back.check_input(out["train"].path, same_data=True)["fingerprint"] == sel.source["fingerprint"]
    back.check_input(out["copy"], same_data=True)  # the same data written again: the same metadata
    back.check_input(out["other"])  # a test set with the same features
    with pytest.raises(ParameterError, match=r"^\S*wide.zarr has 50 features; the fisher selection \(made on "
                                             r"\S*train.zarr\) was fitted on 30: give data with the same features in "
                                             r"the same order \(libsvm text: convert it with --n-features 30\)$"):
        back.check_input(out["wide"].path)
    j = int(sel.indices[0])
    with pytest.raises(ParameterError, match=rf"swapped.zarr has other feature ids than the data the fisher selection "
                                             rf"\(made on \S*\) was fitted on: selected feature {j} is 'w{j ^ 1}' "
                                             rf"there, 'w{j}' in that data; give data"):
        back.check_input(out["swapped"])
    with pytest.raises(ParameterError, match=r"other.zarr is not the data the fisher selection \(made on \S*\) was "
                                             r"fitted on: it is 300 x 30, [\d,]+ nonzeros, that was 300 x 30, "):
        back.check_input(out["other"], same_data=True)


def test_check_input_in_memory_and_dask(stores):
    _, _, X, X2 = stores
    y = np.arange(300) % 3
    sel = dufs.fit(X, y, method="fisher", n_features=5)
    assert sel.source["kind"] == "memory" and sel.source["nnz"] == X.nnz
    for same in (X, X.toarray(), sp.csc_matrix(X), sparse.COO.from_scipy_sparse(X)):  # the content, not the kind
        sel.check_input(same, same_data=True)
    with pytest.raises(ParameterError, match=r"^X is not the data the fisher selection was fitted on: same shape "
                                             r"and nonzeros \(300 x 30, [\d,]+ nonzeros\) but its values "
                                             r"\(SHA-256\) differ"):
        sel.check_input(X2, same_data=True)
    sel.check_input(X2)  # the same features: fine without same_data
    with pytest.raises(ParameterError, match=r"^X has 29 features; the fisher selection was fitted on 30"):
        sel.check_input(X[:, :29])
    Xd = da.from_array(X.toarray(), chunks=(100, 10))
    seld = dufs.fit(Xd, y, method="fisher", n_features=5, client=False)
    assert seld.source["kind"] == "dask" and seld.source["fingerprint"] is None
    assert seld.source["chunks"] == [[100, 100, 100], [10, 10, 10]] and seld.source["nnz"] is None  # not counted
    with pytest.warns(DufsWarning, match=r"cannot compare the content of X with the data the fisher selection was "
                                         r"fitted on \(the selection was fitted on a dask input"):
        seld.check_input(X2, same_data=True)
    with pytest.warns(DufsWarning, match=r"X is a dask input, which has no content fingerprint"):
        sel.check_input(Xd, same_data=True)
    old = Selection.from_json(json.dumps(dict(json.loads(sel.to_json()), source=None)))
    old.check_input(X)
    with pytest.warns(DufsWarning, match="records no input identity"):
        old.check_input(X, same_data=True)


def test_a_store_of_other_values_with_the_same_pattern_is_told_apart(stores, tmp_path):
    """The store records a crc32c of every feature block and of its labels: a store of the same sparsity pattern
    but other values (or other labels) has another fingerprint, and the same data written again the same one."""
    out, sel, _, X2 = stores
    other = dufs.write_store(X2, tmp_path / "same-pattern.zarr", np.arange(300) % 3.0,
                             feature_ids=[f"w{j}" for j in range(30)])
    with pytest.raises(ParameterError, match="is not the data"):
        sel.check_input(other, same_data=True)
    train = out["train"]
    X, y = train.to_scipy("csr"), train.y
    again = dufs.write_store(X, tmp_path / "again.zarr", y, feature_ids=train.feature_ids)
    sel.check_input(again, same_data=True)
    relabelled = dufs.write_store(X, tmp_path / "relabelled.zarr", y[::-1].copy(), feature_ids=train.feature_ids)
    with pytest.raises(ParameterError, match="is not the data"):
        sel.check_input(relabelled, same_data=True)
