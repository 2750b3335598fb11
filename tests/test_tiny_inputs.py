"""Defaults fit the data: a kNN graph's default size on fewer samples than it has neighbours."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from typer.testing import CliRunner

import dufs
from dufs.api import METHODS
from dufs.cli import app
from dufs.errors import ParameterError

X = sp.random_array((3, 8), density=0.6, rng=3, format="csr") + sp.eye_array(3, 8, format="csr")
GRAPH_METHODS = ["laplacian", "lapaofs", "lapdofs", "jcfs"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("tiny") / "tiny.zarr"
    dufs.write_store(X, path, np.array([0, 1, 0]))
    return str(path)


@pytest.mark.parametrize("method", GRAPH_METHODS)
def test_a_default_graph_fits_three_samples(tiny, method):
    assert METHODS[method].params["n_neighbors"].default > 2  # the default is more than 3 samples have
    kw = {"checkpoint": None} if "checkpoint" in METHODS[method].params else {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dufs.errors.DufsWarning)  # 3 samples make poor clusters: not the point
        sel = dufs.fit(tiny, method=method, n_features=2, client=False, **kw)
        same = dufs.fit(tiny, method=method, n_features=2, client=False, n_neighbors=2, **kw)
    assert sel.provenance["params"]["n_neighbors"] == 2  # each sample's 2 others
    assert sel.indices.tolist() == same.indices.tolist()
    np.testing.assert_array_equal(sel.scores, same.scores)


def test_a_graph_size_the_user_sets_is_still_checked(tiny):
    with pytest.raises(ParameterError, match="'n_neighbors'.*got 5"):
        dufs.fit(tiny, method="laplacian", n_features=2, client=False, n_neighbors=5)


def test_dufs_select_on_a_three_row_store(tiny):
    res = CliRunner().invoke(app, ["select", tiny, "-m", "laplacian", "-k", "2", "--workers", "0"])
    assert res.exit_code == 0, res.stderr
    assert "laplacian: 2 features of 8" in res.stdout
