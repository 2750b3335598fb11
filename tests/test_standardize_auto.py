"""``standardize="auto"``: None for sparse data (at most 10% nonzeros), "zscore" for dense, resolved when the data are
loaded and recorded where the run is described (diagnostics, parameters, provenance, the CLI's selection file)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import scipy.sparse as sp
from typer.testing import CliRunner

import dufs
from dufs.cli import app
from dufs.engine import Matrix
from dufs.errors import ParameterError

SPARSE = sp.random_array((300, 400), density=0.03, rng=0, format="csr")  # 3% nonzero
DENSE = np.random.default_rng(1).standard_normal((120, 9))


def test_auto_is_none_for_sparse_and_zscore_for_dense_inputs():
    assert Matrix(SPARSE, standardize="auto").standardize is None
    assert Matrix(DENSE, standardize="auto").standardize == "zscore"
    # 11% nonzero counts as dense (the same bound as the sample graphs'), a view resolves it too
    eleven = sp.random_array((100, 100), density=0.11, rng=2, format="csr")
    assert Matrix(eleven, standardize="auto").standardize == "zscore"
    assert Matrix(Matrix(SPARSE, standardize="zscore"), standardize="auto").standardize is None
    with pytest.raises(ParameterError, match="'zscore', 'scale', None or 'auto'"):
        Matrix(SPARSE, standardize="Auto")


@pytest.mark.parametrize(("X", "want"), [(SPARSE, None), (DENSE, "zscore")])
def test_fit_with_auto_is_the_fit_with_what_it_chose_and_says_so(X, want):
    got = dufs.fit(X, method="laplacian", n_features=5, standardize="auto")
    ref = dufs.fit(X, method="laplacian", n_features=5, standardize=want)
    np.testing.assert_array_equal(got.indices, ref.indices)
    np.testing.assert_array_equal(got.scores, ref.scores)
    assert got.diagnostics["standardize"] == want and got.provenance["standardize"] == want


def test_the_estimators_and_the_cli_take_auto(tmp_path):
    from dufs.estimators import VarianceSelector

    sel = VarianceSelector(n_features=3, standardize="auto").fit(SPARSE)
    want = np.argsort(-np.asarray(SPARSE.power(2).mean(axis=0) - np.square(SPARSE.mean(axis=0))).ravel(),
                      kind="stable")[:3]
    assert set(np.flatnonzero(sel.get_support())) == set(want.tolist())
    store = str(tmp_path / "s.zarr")
    dufs.write_store(SPARSE, store)
    out = tmp_path / "sel.json"
    res = CliRunner().invoke(app, ["select", store, "-m", "variance", "-k", "3", "--standardize", "auto",
                                   "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert json.loads(out.read_text())["provenance"]["standardize"] is None
    bad = CliRunner().invoke(app, ["select", store, "-m", "variance", "-k", "3", "--standardize", "robust"])
    assert bad.exit_code != 0 and "zscore, scale, none or auto" in bad.output
