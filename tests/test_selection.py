"""Selection: support mask, transform on every input kind, JSON round trip."""

from __future__ import annotations

import json

import dask.array as da
import numpy as np
import pytest
import scipy.sparse as sp
import sparse

from dufs.errors import ParameterError
from dufs.selection import Selection


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
    text = s.to_json(path)
    json.loads(text)  # strict JSON: NaN and inf became null
    for src in (text, path):
        t = Selection.from_json(src)
        assert t.method == s.method and t.indices.tolist() == [7, 2, 5] and t.n_features_in == 10
        assert np.array_equal(np.isnan(t.scores), np.isnan(s.scores))
        assert np.allclose(t.scores[~np.isnan(t.scores)], s.scores[~np.isnan(s.scores)])
        assert t.params == {"k": 3, "arr": [0, 1]} and t.diagnostics == {"passes": 1, "trace": [1.5, None]}
    assert [p.name for p in tmp_path.iterdir()] == ["sel.json"]


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
