"""Kernel MMFS (poly2, rbf) against a generic box-QP solver on the explicit dense kernel matrix (DESIGN.md 7.1)."""

from __future__ import annotations

import os

import dask
import numpy as np
import pytest
from scipy.optimize import minimize

from dufs.data.datasets import load
from dufs.engine import Matrix, as_matrix
from dufs.errors import ParameterError
from dufs.methods.mmfs.nonlinear import MAX_KERNEL_FEATURES, mmfs_kernel, solve_kernel
from dufs.testing.references import labelled_problem as _problem
from dufs.testing.references import mmfs_features as _features


def _pid(block):
    """The process a block's task runs in (mapped over the blocks; as tests/engine/test_matrix_props.py)."""
    return os.getpid()


def _kernel(F, kind, rbf_gamma=None):
    """The dense kernel matrix of the columns of F, from its definition."""
    d = F.shape[1]
    if kind == "linear":
        return F.T @ F
    if kind == "poly2":
        return (F.T @ F) ** 2
    if rbf_gamma is None:
        sq = (F * F).sum(0)
        rbf_gamma = 1.0 / sq[sq > 0].mean()
    K = np.empty((d, d))
    for i in range(d):
        K[:, i] = np.exp(-rbf_gamma * ((F - F[:, [i]]) ** 2).sum(0))
    return K


def _rho(F, y, theta=0.5):
    yc = y - y.mean()
    yc = yc / np.linalg.norm(yc)
    return theta / (1 - theta) * np.abs(F.T @ yc)


def _qp(K, rho, C, gamma):
    """min 1/2 a^T (K + gamma 1 1^T) a - rho^T a over 0 <= a <= C by L-BFGS-B (a generic box-QP solver)."""
    Kg = K + gamma
    res = minimize(lambda a: 0.5 * a @ Kg @ a - rho @ a, np.zeros(K.shape[0]), jac=lambda a: Kg @ a - rho,
                   method="L-BFGS-B", bounds=[(0.0, C)] * K.shape[0],
                   options={"ftol": 1e-16, "gtol": 1e-13, "maxiter": 100000, "maxcor": 50})
    return float(res.fun)



def _check(out, K, rho, C, gamma, fref):
    a = out["alpha"]
    D = 0.5 * a @ (K + gamma) @ a - rho @ a
    assert out["converged"]
    assert out["objective"] == pytest.approx(fref, rel=1e-6)
    assert D == pytest.approx(out["objective"], rel=1e-9, abs=1e-12)
    assert -1e-12 <= D - fref <= out["gap"] + 1e-12
    np.testing.assert_allclose(out["G"], (K + gamma) @ a - rho, atol=1e-9)
    assert ((a >= 0) & (a <= C)).all()


@pytest.mark.parametrize("mode", ["zscore", "scale", None])
@pytest.mark.parametrize("width", [None, 7])
@pytest.mark.parametrize("kind", ["poly2", "rbf"])
def test_objective_equals_a_generic_qp_solver(mode, width, kind):
    X, y = _problem(1)
    F = _features(X, mode)
    K = _kernel(F, kind)
    rho = _rho(F, y)
    gamma = 0.3
    fref = _qp(K, rho, 1.0, gamma)
    with dask.config.set(scheduler="sync"):
        out = solve_kernel(Matrix(X, standardize=mode, block_width=width), rho, kernel=kind, C=1.0, gamma=gamma,
                           tol=1e-9, max_epochs=200, batch_size=8)
    _check(out, K, rho, 1.0, gamma, fref)
    assert out["rounds"] > 1  # the working-set path, not one dense solve


@pytest.mark.parametrize("kind", ["poly2", "rbf", "linear"])
def test_small_cache_evicts_and_still_matches(kind):
    X, y = _problem(4, n=60, d=50)
    F = _features(X, "zscore")
    K = _kernel(F, kind, rbf_gamma=2.5 if kind == "rbf" else None)
    rho = _rho(F, y, theta=0.6)
    fref = _qp(K, rho, 0.5, 0.1)
    with dask.config.set(scheduler="sync"):
        out = solve_kernel(Matrix(X, standardize="zscore", block_width=13), rho, kernel=kind, C=0.5, gamma=0.1,
                           tol=1e-9, max_epochs=500, rbf_gamma=2.5, cache_bytes=8 * 50 * 6)
    _check(out, K, rho, 0.5, 0.1, fref)
    assert out["columns"].capacity == 6 and out["columns_fetched"] > 6  # columns were evicted and fetched again


@pytest.mark.parametrize("kind", ["poly2", "rbf"])
@pytest.mark.parametrize("mode", ["zscore", None])
def test_real_set_matches_the_qp(kind, mode):
    X, y = load("allaml")
    X = X[:, :150]
    if mode is None:
        X = X / np.abs(X).max()  # raw expression values: keep the rbf kernel away from the identity
    F = _features(X, mode)
    K = _kernel(F, kind)
    rho = _rho(F, y.astype(float))
    fref = _qp(K, rho, 1.0, 0.5)
    with dask.config.set(scheduler="sync"):
        out = solve_kernel(Matrix(X, standardize=mode, block_width=40), rho, kernel=kind, C=1.0, gamma=0.5,
                           tol=1e-9, max_epochs=500, batch_size=32)
    _check(out, K, rho, 1.0, 0.5, fref)


def test_gap_certificate_is_an_upper_bound_before_convergence():
    X, y = _problem(2)
    F = _features(X, "zscore")
    K = _kernel(F, "poly2")
    rho = _rho(F, y, theta=0.8)
    fref = _qp(K, rho, 5.0, 0.01)
    with dask.config.set(scheduler="sync"):
        out = solve_kernel(Matrix(X, standardize="zscore", block_width=9), rho, kernel="poly2", C=5.0,
                           gamma=0.01, tol=1e-10, max_epochs=50, batch_size=1)
    assert out["converged"] and out["rounds"] > 10
    trace = out["trace"]
    assert trace[0]["duality_gap"] > 1e-3  # the bound is tested away from the optimum too
    for t in trace:  # every round's certificate (from the maintained gradient) bounds the distance to D*
        assert 0 <= t["objective"] - fref + 1e-12 <= t["duality_gap"] + 2e-12
    with dask.config.set(scheduler="sync"):
        early = solve_kernel(Matrix(X, standardize="zscore", block_width=9), rho, kernel="poly2", C=5.0,
                             gamma=0.01, tol=1e-15, max_epochs=1, batch_size=1)
    assert early["rounds"] == 40 and not early["converged"]
    assert 0 <= early["objective"] - fref <= early["gap"] + 1e-12 and early["gap"] > 1e-8


def test_limit_error_names_the_parameter():
    X, y = _problem(0)
    M = Matrix(X, standardize="zscore")
    rho = np.ones(40)
    with pytest.raises(ParameterError, match=r"max_features=10.*kernel=\"linear\".*relevance"):
        solve_kernel(M, rho, kernel="poly2", C=1.0, gamma=1.0, tol=1e-3, max_epochs=10, max_features=10)
    with pytest.raises(ParameterError, match="max_features"):
        mmfs_kernel(M, y, kernel="rbf", max_features=39)
    assert MAX_KERNEL_FEATURES == 100_000
    with pytest.raises(ParameterError, match="kernel"):
        solve_kernel(M, rho, kernel="cubic", C=1.0, gamma=1.0, tol=1e-3, max_epochs=10)


def test_linear_kernel_agrees_with_the_linear_dcd_solver():
    from dufs.methods.mmfs import mmfs

    X, y = _problem(5)
    with dask.config.set(scheduler="sync"):
        lin = mmfs(Matrix(X, standardize="scale", block_width=10), y, gamma=0.2, tol=1e-10, max_epochs=5000)
        ker = mmfs_kernel(Matrix(X, standardize="scale", block_width=10), y, kernel="linear", gamma=0.2, tol=1e-10)
    assert ker.diagnostics["objective"] == pytest.approx(lin.diagnostics["objective"], rel=1e-8)
    np.testing.assert_allclose(ker.g, lin.g, atol=1e-7)


def test_gamma_path_reaches_the_requested_support():
    X, y = _problem(6, d=60)
    F = _features(X, "zscore")
    K = _kernel(F, "poly2")
    rho = _rho(F, y)
    with dask.config.set(scheduler="sync"):
        res = mmfs_kernel(Matrix(X, standardize="zscore"), y, kernel="poly2", n_features=12, tol=1e-9)
    d = res.diagnostics
    assert d["support"] >= 12 and res.support.size == d["support"]
    assert d["objective"] == pytest.approx(_qp(K, rho, 1.0, res.gamma), rel=1e-6)
    np.testing.assert_allclose(res.g, K @ res.alpha + res.b, atol=1e-9)
    assert res.b == pytest.approx(res.gamma * res.alpha.sum())


def test_runs_on_a_process_cluster(cluster_client):
    from distributed import get_task_stream

    X, y = _problem(3, n=120, d=48)
    F = _features(X, "scale")
    K = _kernel(F, "poly2")
    rho = _rho(F, y)
    fref = _qp(K, rho, 1.0, 0.2)
    with cluster_client.as_current():
        M = as_matrix(X, standardize="scale", block_width=12, persist=True)
        assert M.residency["mode"] == "persisted", M.residency
        n_blocks = M.n_blocks
        with get_task_stream(cluster_client) as ts:
            out = solve_kernel(M, rho, kernel="poly2", C=1.0, gamma=0.2, tol=1e-9, max_epochs=200, batch_size=16)
        pids = M.map_blocks(_pid)
        M.release()
    _check(out, K, rho, 1.0, 0.2, fref)
    # the work ran in the worker processes: the solver's passes are tasks the workers ran (on the driver they would
    # leave the task stream empty), and the blocks' tasks run in the workers' processes, not in this one
    pid_of = cluster_client.run(os.getpid)  # worker address -> its process id
    assert len(ts.data) >= n_blocks and {t["worker"] for t in ts.data} <= set(pid_of)
    assert os.getpid() not in pid_of.values() and len(pids) == n_blocks and set(pids) <= set(pid_of.values())
