"""A selection file records how it was made (every parameter in force, standardize, graph, versions), and
``dufs info sel.json`` shows it."""

from __future__ import annotations

import json
import platform
import re
from importlib.metadata import version

import dask
import numpy as np
import pytest
from typer.testing import CliRunner

import dufs
from dufs.cli import app
from dufs.methods.filters import LAPLACIAN_PARAMS
from dufs.methods.mmfs import MMFS_PARAMS

X = np.random.RandomState(0).rand(40, 12)
Y = np.arange(40) % 2
# method -> (its parameter table, the labels it needs, the parameters given, its standardize, its graph)
CASES = {"laplacian": (LAPLACIAN_PARAMS, None, {}, None, "knn"),
         "mmfs": (MMFS_PARAMS, Y, {"checkpoint": None}, "zscore", None)}


def _saved(tmp_path, method):
    table, y, given, _, _ = CASES[method]
    sel = dufs.fit(X, y, method=method, n_features=3, **given)
    path = tmp_path / f"{method}.json"
    sel.to_json(path)
    return path, json.loads(path.read_text())


@pytest.mark.parametrize("method", sorted(CASES))
def test_the_file_records_every_default_in_force_and_the_versions(tmp_path, method):
    table, _, given, std, graph = CASES[method]
    _, raw = _saved(tmp_path, method)
    prov = raw["provenance"]
    want = {name: given.get(name, p.default) for name, p in table.items()}
    assert prov["params"] == want  # each default of the method's table, and what was given
    assert raw["params"] == {"n_features": 3, "standardize": std, **given}  # as before: what was given
    assert prov["standardize"] == std
    assert prov["graph"] == graph
    if graph == "knn":  # dense rows as they are: Euclidean distances of the raw values
        assert (prov["graph_metric"], prov["graph_values"]) == ("euclidean", "raw")
    else:
        assert "graph_metric" not in prov and "graph_values" not in prov
    assert prov["versions"] == {"dufs": version("dufs"), "dask": version("dask"),
                                "distributed": version("distributed"), "numpy": np.__version__,
                                "scipy": version("scipy"), "zarr": version("zarr"), "numba": version("numba"),
                                "scikit-learn": version("scikit-learn"), "python": platform.python_version()}


def test_dufs_info_prints_the_parameters_in_force_and_the_versions(tmp_path):
    path, _ = _saved(tmp_path, "laplacian")
    res = CliRunner().invoke(app, ["info", str(path)])
    assert res.exit_code == 0, res.output
    text = " ".join(re.sub(r"[│┃┌┐└┘─├┤┬┴┼]", " ", res.stdout).split())
    for name, p in LAPLACIAN_PARAMS.items():
        assert f"{name}={p.default!r}" in text
    assert "standardize None" in text and "graph knn (metric euclidean, values raw)" in text
    for lib in ("dask", "numpy", "scipy"):
        assert version(lib) in text
    assert platform.python_version() in text
    res = CliRunner().invoke(app, ["info", str(path), "--json"])
    d = json.loads(res.stdout)
    assert d["params_in_force"]["n_neighbors"] == 5 and d["graph"] == "knn"
    assert d["versions"]["numpy"] == np.__version__


@pytest.mark.parametrize("method", ["laplacian", "jcfs", "lapdofs"])
def test_the_graph_of_sparse_counts_is_recorded_as_built(method):
    """Sparse counts: the methods' graphs are cosine graphs of the rows read as presence (docs/methods.md, "The
    graph's values"), and the provenance says so; a graph given as W records no metric (none was chosen)."""
    import scipy.sparse as sp

    from dufs.engine.graphs import graph_values

    C = sp.random_array((120, 300), density=0.03, rng=1, format="csr")
    C.data = np.ceil(C.data * 20)
    params = {"n_clusters": "auto"} if method == "jcfs" else {}
    with dask.config.set({"dufs.graph.values": "sqrt"}):  # the setting, so that the record is not the default's
        prov = dufs.fit(C, method=method, n_features=3, **params).provenance
        assert graph_values(dufs.engine.Matrix(C)) == "sqrt"
    assert (prov["graph"], prov["graph_metric"], prov["graph_values"]) == ("knn", "cosine", "sqrt")
    W = sp.eye_array(120, k=1, format="csr")
    given = dufs.fit(C, method=method, n_features=3, W=W + W.T, **params).provenance
    assert given["graph"] == "given" and "graph_values" not in given


def test_dufs_info_says_why_an_iterative_method_stopped(tmp_path):
    path, raw = _saved(tmp_path, "mmfs")
    assert raw["diagnostics"]["converged"] is True
    res = CliRunner().invoke(app, ["info", str(path)])
    assert res.exit_code == 0, res.output
    assert "stopped" in res.stdout and "converged" in res.stdout


def test_an_old_file_without_the_record_still_loads_and_shows(tmp_path):
    path, raw = _saved(tmp_path, "laplacian")
    del raw["provenance"]
    path.write_text(json.dumps(raw))
    sel = dufs.load_selection(path)
    assert sel.provenance is None and sel.indices.tolist() == raw["indices"]
    res = CliRunner().invoke(app, ["info", str(path)])
    assert res.exit_code == 0, res.output
    assert "not recorded" in res.stdout


def test_dufs_info_on_a_missing_selection_file_names_it(tmp_path):
    missing = tmp_path / "nothere.json"
    res = CliRunner().invoke(app, ["info", str(missing)])
    assert res.exit_code == 2
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert lines == [f"error: no such selection file: {missing}"], res.output
