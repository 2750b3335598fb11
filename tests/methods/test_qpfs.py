"""QPFS (the hard-margin MMFS special case) against a generic solver of the simplex-constrained QP."""

from __future__ import annotations

import os

import dask
import numpy as np
import pytest
from scipy.optimize import minimize

from dufs.data.datasets import load
from dufs.engine import Matrix, as_matrix
from dufs.errors import ParameterError
from dufs.methods.qpfs import qpfs, solve_simplex
from dufs.testing.references import label_relevance as _relevance
from dufs.testing.references import labelled_problem as _problem
from dufs.testing.references import mmfs_features as _features


def _pid(block):
    """The process a block's task runs in (mapped over the blocks; as tests/engine/test_matrix_props.py)."""
    return os.getpid()


def _ref(Q, r, a):
    """min 1/2 (1 - a) x^T Q x - a r^T x over x >= 0, 1^T x = 1 by SLSQP (a generic constrained solver)."""
    d = r.shape[0]
    res = minimize(lambda x: 0.5 * (1 - a) * x @ Q @ x - a * r @ x, np.full(d, 1.0 / d),
                   jac=lambda x: (1 - a) * Q @ x - a * r, method="SLSQP", bounds=[(0.0, None)] * d,
                   constraints=[{"type": "eq", "fun": lambda x: x.sum() - 1.0, "jac": lambda x: np.ones(d)}],
                   options={"ftol": 1e-15, "maxiter": 5000})
    assert res.success
    return float(res.fun)



def _check(res, Q, r, a, fref):
    x = res.x
    d = res.diagnostics
    f = 0.5 * (1 - a) * x @ Q @ x - a * r @ x
    assert d["converged"]
    assert abs(x.sum() - 1.0) <= 1e-12 and (x >= 0).all()
    assert d["objective"] == pytest.approx(fref, rel=1e-6)
    assert f == pytest.approx(d["objective"], rel=1e-9, abs=1e-12)
    assert f - fref <= d["duality_gap"] + 1e-10  # SLSQP's optimum is itself only ~1e-12 exact
    np.testing.assert_allclose(res.r, r, atol=1e-12)
    np.testing.assert_allclose(res.g, (1 - a) * Q @ x - a * r, atol=1e-9)
    rank = res.ranking()
    assert sorted(rank.tolist()) == list(range(x.size)) and (x[rank[:d["support"]]] > 0).all()


@pytest.mark.parametrize("mode", ["zscore", "scale", None])
@pytest.mark.parametrize("width", [None, 7])
@pytest.mark.parametrize("kind", ["linear", "poly2"])
def test_objective_equals_a_generic_simplex_qp_solver(mode, width, kind):
    X, y = _problem(1)
    F = _features(X, mode)
    Q = F.T @ F if kind == "linear" else (F.T @ F) ** 2
    r = _relevance(F, y)
    a = 0.6
    with dask.config.set(scheduler="sync"):
        res = qpfs(Matrix(X, standardize=mode, block_width=width), y, alpha_mix=a, kernel=kind, tol=1e-10)
    _check(res, Q, r, a, _ref(Q, r, a))


@pytest.mark.parametrize("a", [0.0, 0.3, 0.9])
def test_working_set_path_with_a_small_cache(a):
    X, y = _problem(2, n=70, d=60)
    F = _features(X, "zscore")
    Q = (F.T @ F) ** 2
    r = _relevance(F, y)
    with dask.config.set(scheduler="sync"):
        out = solve_simplex(Matrix(X, standardize="zscore", block_width=11), r, alpha_mix=a, kernel="poly2",
                            tol=1e-10, batch_size=6, cache_bytes=8 * 60 * 8)
    x = out["x"]
    fref = _ref(Q, r, a)
    assert out["converged"] and out["rounds"] > (0 if a == 0.9 else 1) and out["columns"].capacity == 8
    assert out["objective"] == pytest.approx(fref, rel=1e-6)
    assert abs(x.sum() - 1.0) <= 1e-12 and (x >= 0).all()
    assert 0.5 * (1 - a) * x @ Q @ x - a * r @ x - fref <= out["gap"] + 1e-10


@pytest.mark.parametrize("kind", ["linear", "poly2"])
def test_real_set_matches_the_reference(kind):
    X, y = load("allaml")
    X = X[:, :60]  # fewer features than samples: SLSQP (the reference) stalls on the rank-deficient Q beyond that
    F = _features(X, "zscore")
    Q = F.T @ F if kind == "linear" else (F.T @ F) ** 2
    r = _relevance(F, y.astype(float))
    a = 0.5
    with dask.config.set(scheduler="sync"):
        res = qpfs(Matrix(X, standardize="zscore", block_width=25), y, alpha_mix=a, kernel=kind, tol=1e-10)
    _check(res, Q, r, a, _ref(Q, r, a))


def test_frank_wolfe_gap_bounds_the_suboptimality_before_convergence():
    X, y = _problem(3, d=50)
    F = _features(X, "zscore")
    Q = F.T @ F
    r = _relevance(F, y)
    a = 0.2
    fref = _ref(Q, r, a)
    with dask.config.set(scheduler="sync"):
        out = solve_simplex(Matrix(X, standardize="zscore"), r, alpha_mix=a, tol=1e-10, batch_size=2)
    assert out["converged"] and out["rounds"] > 3
    assert out["trace"][0]["duality_gap"] > 1e-3
    for t in out["trace"]:
        assert 0 <= t["objective"] - fref + 1e-10 <= t["duality_gap"] + 1e-10


def test_parameters_are_checked():
    X, y = _problem(0)
    M = Matrix(X, standardize="zscore")
    with pytest.raises(ParameterError, match="alpha_mix"):
        qpfs(M, y, alpha_mix=1.0)
    with pytest.raises(ParameterError, match="kernel"):
        qpfs(M, y, kernel="cubic")
    with pytest.raises(ParameterError, match="max_features"):
        qpfs(M, y, kernel="poly2", max_features=20)


def test_runs_on_a_process_cluster(cluster_client):
    from distributed import get_task_stream

    X, y = _problem(4, n=120, d=48)
    F = _features(X, "scale")
    Q = F.T @ F
    r = _relevance(F, y)
    with cluster_client.as_current():
        M = as_matrix(X, standardize="scale", block_width=12, persist=True)
        assert M.residency["mode"] == "persisted", M.residency
        n_blocks = M.n_blocks
        with get_task_stream(cluster_client) as ts:
            res = qpfs(M, y, alpha_mix=0.4, tol=1e-10)
        pids = M.map_blocks(_pid)
        M.release()
    _check(res, Q, r, 0.4, _ref(Q, r, 0.4))
    # the work ran in the worker processes: the solver's passes are tasks the workers ran (on the driver they would
    # leave the task stream empty), and the blocks' tasks run in the workers' processes, not in this one
    pid_of = cluster_client.run(os.getpid)  # worker address -> its process id
    assert len(ts.data) >= n_blocks and {t["worker"] for t in ts.data} <= set(pid_of)
    assert os.getpid() not in pid_of.values() and len(pids) == n_blocks and set(pids) <= set(pid_of.values())
