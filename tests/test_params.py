"""Each method's parameters are declared once, in a table beside the method (``dufs.methods.params``), and
everything else follows from it or is checked against it here: ``dufs.fit``'s names and values, the estimators'
parameters, defaults and constraints, the functions' defaults, and the CLI's ``--param``."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
from typer.testing import CliRunner

import dufs
import dufs.estimators as est
from dufs.api import METHODS, check_method
from dufs.errors import ParameterError
from dufs.methods import filters, greedy, jcfs, m3fs, mmfs, qpfs, ufcm

ESTIMATORS = {"variance": est.VarianceSelector, "correlation": est.CorrelationSelector, "fisher": est.FisherScore,
              "laplacian": est.LaplacianScore, "mmfs": est.MMFS, "lapaofs": est.LapAOFS, "lapdofs": est.LapDOFS,
              "jcfs": est.JCFS, "ufcm": est.UFCM, "m3fs": est.M3FS}
# the plain function behind each table, and the names the function spells differently
FUNCTIONS = {"laplacian": (filters.laplacian_scores, {}), "mmfs": (mmfs.mmfs, {"relevance": "relevance_kind"}),
             "qpfs": (qpfs.qpfs, {"relevance": "relevance_kind"}), "lapaofs": (greedy.lapofs, {}),
             "jcfs": (jcfs.jcfs, {}), "ufcm": (ufcm.ufcm, {})}


@pytest.mark.parametrize("method", sorted(ESTIMATORS))
def test_estimators_take_their_tables_parameters_with_their_defaults(method):
    E = ESTIMATORS[method]
    table = {k: p for k, p in METHODS[method].params.items() if p.estimator}
    sig = inspect.signature(E.__init__).parameters
    own = [k for k in sig if k not in ("self", "n_features", "standardize", "client")]
    assert sorted(own) == sorted(table) == sorted(E._method_params)  # noqa: SLF001 - the estimator's declaration
    for k, p in table.items():
        assert sig[k].default == p.default, (method, k)
    assert sig["standardize"].default == METHODS[method].standardize
    assert set(E._parameter_constraints) == set(table) | {"n_features", "standardize", "client"}  # noqa: SLF001


@pytest.mark.parametrize("method", sorted(FUNCTIONS))
def test_functions_defaults_are_the_tables(method):
    fn, alias = FUNCTIONS[method]
    sig = inspect.signature(fn).parameters
    for k, p in METHODS[method].params.items():
        name = alias.get(k, k)
        if name in sig and sig[name].default is not inspect.Parameter.empty:
            assert sig[name].default == p.default, (method, k, sig[name].default, p.default)


def test_m3fs_solvers_accept_every_parameter_of_the_table():
    from dufs.methods.m3fs import m3fs_alternating

    both = set(inspect.signature(m3fs.m3fs_faithful).parameters) | set(inspect.signature(m3fs_alternating).parameters)
    assert set(METHODS["m3fs"].params) - {"solver"} <= both


@pytest.mark.parametrize("method, params, says", [
    ("lapaofs", {"lambda1": -1.0}, "The 'lambda1' parameter of lapaofs must be a float in the range [0.0, inf)"),
    ("mmfs", {"theta": 1.5}, "The 'theta' parameter of mmfs must be a float in the range (0.0, 1.0)"),
    ("mmfs", {"C": True}, "The 'C' parameter of mmfs must not be a bool"),
    ("jcfs", {"n_clusters": "two"}, "The 'n_clusters' parameter of jcfs must be an int in the range [1, inf)"),
    ("ufcm", {"p": 3}, "The 'p' parameter of ufcm must be a float in the range (0.0, 2.0]"),
    ("m3fs", {"solver": "magic"}, "The 'solver' parameter of m3fs must be a str among"),
    ("laplacian", {"weights": "gauss"}, "The 'weights' parameter of laplacian must be a str among"),
    ("fisher", {"n_neighbors": 3}, "['n_neighbors'] that method 'fisher' does not take"),
])
def test_values_are_checked_before_any_data_is_read(method, params, says):
    with pytest.raises(ParameterError, match=None) as e:
        check_method(method, params)
    assert says in str(e.value)
    with pytest.raises(ParameterError) as e2:  # fit checks first: the "data" here is never looked at
        dufs.fit(object(), method=method, n_features=1, **params)
    assert str(e2.value) == str(e.value)


def test_the_cli_checks_parameters_from_the_table(tmp_path):
    import scipy.sparse as sp

    from dufs.cli import app

    dufs.write_store(sp.random_array((20, 6), density=0.5, rng=0, format="csr"), tmp_path / "s.zarr",
                     np.arange(20) % 2)
    res = CliRunner().invoke(app, ["select", str(tmp_path / "s.zarr"), "-m", "lapaofs", "-k", "2", "-p",
                                   "lambda1=-1", "--workers", "0"])
    assert res.exit_code == 2
    assert res.stderr.startswith("error: The 'lambda1' parameter of lapaofs must be a float in the range [0.0, inf)")
