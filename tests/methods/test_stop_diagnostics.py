"""What stopped an iterative method, and how close it was: M3FS's pass budget from the data and the machine
(``max_passes="auto"``: docs/methods.md, "M3FS", "The pass budget"), the stop and closeness of M3FS, UFCM and MMFS
in their diagnostics, and the words `dufs select`, `dufs info` and the notebook summary make of them."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from typer.testing import CliRunner

import dufs
from dufs.engine import Matrix
from dufs.errors import ParameterError
from dufs.methods.m3fs import alternating as ms
from dufs.methods.m3fs import budget
from dufs.selection import stop_reason


def _two_clusters(n=60, d=15, seed=4):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    X[: n // 2, :3] += 2.0
    return X


_KW = dict(n_features=4, n_clusters=2, C=10.0, n_neighbors=6, init="random", polish=0)


# ---------------------------------------------------------------------------------------------------- the rule
@pytest.mark.parametrize("seconds, time_budget, want", [
    (8.0, 1200.0, 150),      # kddb's ~8 s a pass: 20 minutes of passes
    (0.06, 1200.0, 20000),   # the 200,000 x 300,000 store's ~0.06 s a pass
    (100.0, 1200.0, 50),     # 12 passes' worth: the floor
    (8.0, 600.0, 75),
    (0.0, 1200.0, 2**62),    # a pass below the clock's resolution: no bound to speak of
])
def test_auto_budget_is_time_budget_over_seconds_per_pass_at_least_50(seconds, time_budget, want):
    assert budget.TIME_BUDGET == 1200.0 and budget.MIN_PASSES == 50
    assert (budget.MEASURED_PASSES, budget.MEASURE_SECONDS) == (5, 30.0)
    assert budget.passes_for(seconds, time_budget) == want


class _Passes:
    passes = 0


def test_auto_budget_is_fixed_after_5_passes_and_30_seconds_from_the_first_check(monkeypatch):
    """The clock marked at the first check after a pass; the budget fixed at the first check at least 5 passes and
    30 s later, from the seconds a pass over that stretch: 2^-10 s a pass (the first pass 3 s: a compilation) gives
    1200 / 2^-10 passes, fixed 30 s after the mark; 100 s a pass gives the floor, 50, fixed 5 passes after it."""
    for first, each, want_at, want in ((3.0, 2.0**-10, 30_721, 1_228_800), (100.0, 100.0, 6, 50)):
        M = _Passes()
        t = {"now": 0.0}
        monkeypatch.setattr(budget, "_clock", lambda t=t: t["now"])
        b = budget.PassBudget(M, "auto")
        b.start()
        assert not b.spent() and b.mark is None  # no pass yet
        M.passes, t["now"] = 1, first
        assert not b.spent() and b.mark == (1, first)
        while b.limit is None:
            M.passes += 1
            t["now"] += each
            assert not b.spent() or b.limit is not None
        assert M.passes == want_at and b.limit == want
        assert b.seconds_per_pass == pytest.approx(each)
        M.passes = want
        assert b.spent()


def test_auto_budget_binds_where_passes_are_slow(monkeypatch):
    """Each pass made to take 100 s on the budget's clock: the auto budget is max(50, 1200 / 100) = 50 passes, the
    run stops there and says so, with the speed it measured; with a 10,000 s budget, 100 passes."""
    X = _two_clusters()
    free = ms.m3fs_alternating(Matrix(X, standardize="zscore"), max_passes=None, **_KW)
    assert free.diagnostics["stopped"] == "converged" and sum(free.diagnostics["passes_per_iteration"]) > 200
    for time_budget, want in ((1200.0, 50), (10000.0, 100)):
        M = Matrix(X, standardize="zscore")
        monkeypatch.setattr(budget, "_clock", lambda M=M: 100.0 * M.passes)
        res = ms.m3fs_alternating(M, time_budget=time_budget, **_KW)
        d = res.diagnostics
        assert d["stopped"] == "max_passes" and d["converged"] is False
        assert d["budget"] == {"rule": "auto", "max_passes": want, "time_budget": time_budget,
                               "seconds_per_pass": pytest.approx(100.0), "min_passes": 50}
        assert want <= sum(d["passes_per_iteration"]) <= want + 6  # the FISTA iteration under way finishes
        # how close it was: the last iteration's relative decrease of J_mu, from the objective's history
        J = res.objective
        c = d["convergence"]
        assert c["measure"] == "relative decrease of J_mu" and c["tol"] == 1e-4
        if len(J) >= 2:
            assert c["value"] == pytest.approx((J[-2] - J[-1]) / abs(J[-1]), rel=1e-12)
        text = stop_reason(d)
        assert text.startswith("max_passes") and f"pass budget {want} (auto: {time_budget:g} s at 100 s a pass" in text


def test_auto_budget_does_not_bind_on_small_data():
    """With the real clock a small problem's passes take milliseconds: the auto budget is far above what it needs,
    and the run is the unbudgeted one, converged."""
    X = _two_clusters()
    free = ms.m3fs_alternating(Matrix(X, standardize="zscore"), max_passes=None, **_KW)
    auto = ms.m3fs_alternating(Matrix(X, standardize="zscore"), **_KW)
    d = auto.diagnostics
    assert d["stopped"] == "converged" and d["converged"] is True
    assert d["budget"]["rule"] == "auto"
    assert d["budget"]["max_passes"] is None or d["budget"]["max_passes"] > 10 * d["passes"]
    np.testing.assert_array_equal(auto.sigma, free.sigma)
    np.testing.assert_array_equal(auto.objective, free.objective)
    c = d["convergence"]
    assert c["labels_changed"] == 0 and c["value"] <= c["tol"]
    assert free.diagnostics["budget"] == {"rule": "none", "max_passes": None}
    assert "no pass budget" in stop_reason(free.diagnostics)


def test_given_budget_is_recorded_as_given():
    d = ms.m3fs_alternating(Matrix(_two_clusters(), standardize="zscore"), max_passes=30, **_KW).diagnostics
    assert d["stopped"] == "max_passes" and d["budget"] == {"rule": "given", "max_passes": 30}
    assert "pass budget 30 (given)" in stop_reason(d)


def test_fit_runs_m3fs_with_the_auto_budget_and_records_it():
    X = _two_clusters()
    sel = dufs.fit(X, method="m3fs", n_features=4, n_clusters=2, solver="alternating")
    assert sel.provenance["params"]["max_passes"] == "auto" and sel.provenance["params"]["time_budget"] == 1200.0
    assert sel.diagnostics["budget"]["rule"] == "auto" and sel.diagnostics["stopped"] == "converged"
    none = dufs.fit(X, method="m3fs", n_features=4, n_clusters=2, solver="alternating", max_passes=None)
    assert none.diagnostics["budget"]["rule"] == "none"
    with pytest.raises(ParameterError, match="max_passes"):
        dufs.fit(X, method="m3fs", n_features=4, n_clusters=2, solver="faithful", max_passes=10)


def test_faithful_m3fs_says_what_stopped_it():
    pytest.importorskip("cvxpy")
    from dufs.methods.m3fs import m3fs_faithful, m3fs_laplacian

    X = _two_clusters(40, 8, seed=0)
    L = m3fs_laplacian(X)
    d = m3fs_faithful(X, n_features=3, L=L).diagnostics
    assert d["stopped"] == "converged" and d["convergence"]["value"] == d["violations"][-1] <= 1e-2
    cut = m3fs_faithful(X, n_features=3, L=L, epsilon=1e-9, max_cutting_planes=1).diagnostics
    assert cut["stopped"] == "max_cutting_planes" and cut["convergence"] == {
        "measure": "most violated constraint's excess over xi", "value": cut["violations"][-1], "tol": 1e-9}
    assert cut["violations"][-1] > 1e-9


# ---------------------------------------------------------------------------------------------------- UFCM, MMFS
def test_ufcm_says_what_stopped_it_and_how_close():
    X = _two_clusters(80, 12, seed=1)
    done = dufs.fit(X, method="ufcm", n_features=4, n_clusters=2)
    d = done.diagnostics
    f = np.asarray(d["objective"])
    change = abs(f[-1] - f[-2]) / max(1.0, abs(f[-1]))  # the rule: |rise| <= tol max(1, |f|)
    assert d["stopped"] == "converged" and d["convergence"]["tol"] == 1e-6
    assert d["convergence"]["value"] == pytest.approx(change, rel=1e-9, abs=1e-300) and change <= 1e-6
    cut = dufs.fit(X, method="ufcm", n_features=4, n_clusters=2, max_iter=1, tol=0.0).diagnostics
    f = np.asarray(cut["objective"])
    assert cut["stopped"] == "max_iter" and cut["converged"] is False and cut["iterations"] == 1
    assert cut["convergence"]["value"] == pytest.approx(abs(f[1] - f[0]) / max(1.0, abs(f[1])), rel=1e-9)
    assert stop_reason(cut).startswith("max_iter (iterations 1); relative change of the objective")


def test_mmfs_says_what_stopped_it_and_how_close():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((120, 30))
    y = (X[:, 2] - X[:, 7] + 0.3 * rng.standard_normal(120) > 0).astype(int)
    d = dufs.fit(X, y, method="mmfs", n_features=5).diagnostics
    assert d["stopped"] == "converged" and d["convergence"] == {"measure": "relative duality gap",
                                                                "value": d["relative_gap"], "tol": 1e-3}
    assert d["relative_gap"] <= 1e-3
    cut = dufs.fit(X, y, method="mmfs", n_features=5, gamma=1.0, tol=1e-12, max_epochs=1).diagnostics
    assert cut["stopped"] == "max_epochs" and cut["converged"] is False
    assert cut["convergence"]["value"] == cut["duality_gap"] / abs(cut["objective"]) > 1e-12
    assert stop_reason(cut).startswith("max_epochs (rounds ") and "relative duality gap" in stop_reason(cut)


@pytest.mark.parametrize("method,measure,extra", [
    ("qpfs", "relative Frank-Wolfe gap", {}),
    ("mmfs", "relative duality gap", {"kernel": "poly2"}),
])
def test_qpfs_and_kernel_mmfs_say_what_stopped_them_and_how_close(method, measure, extra):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((120, 30))
    y = (X[:, 2] - X[:, 7] + 0.3 * rng.standard_normal(120) > 0).astype(int)
    d = dufs.fit(X, y, method=method, n_features=5, **extra).diagnostics
    tol = d["convergence"]["tol"]
    assert d["stopped"] == "converged" and d["converged"] is True
    assert d["convergence"] == {"measure": measure, "value": d["relative_gap"], "tol": tol} and d["relative_gap"] <= tol
    cut = dufs.fit(X, y, method=method, n_features=5, tol=1e-300, max_epochs=1, **extra).diagnostics
    assert cut["stopped"] == "max_epochs" and cut["converged"] is False
    assert cut["convergence"]["value"] == cut["relative_gap"] > 1e-300
    assert stop_reason(cut).startswith("max_epochs (rounds ") and measure in stop_reason(cut)


# ---------------------------------------------------------------------------------------------------- the words
def test_stop_reason_words():
    diag = {"stopped": "max_passes", "iterations": 7,
            "convergence": {"measure": "relative decrease of J_mu", "value": 3.2e-3, "tol": 1e-4, "labels_changed": 5},
            "budget": {"rule": "auto", "max_passes": 150, "time_budget": 1200.0, "seconds_per_pass": 8.0,
                       "min_passes": 50}}
    assert stop_reason(diag) == ("max_passes (iterations 7); relative decrease of J_mu 0.0032 against tol 0.0001, 5 "
                                 "labels changed in the last iteration; pass budget 150 (auto: 1200 s at 8 s a pass, "
                                 "at least 50)")
    # without the new keys, as before
    assert stop_reason({"converged": False, "rounds": 500, "relative_gap": 0.25}) == \
        "not converged (iteration limit) (rounds 500, relative gap 0.25)"


def test_dufs_select_and_info_say_what_stopped_m3fs(tmp_path):
    X = sp.csr_array(_two_clusters(200, 40, seed=2))
    dufs.write_store(X, tmp_path / "s.zarr")
    out = tmp_path / "sel.json"
    r = CliRunner().invoke(app_(), ["select", str(tmp_path / "s.zarr"), "-m", "m3fs", "-k", "5", "-p",
                                    "solver=alternating", "-p", "n_clusters=2", "-p", "max_passes=20", "-o",
                                    str(out), "--workers", "0"], env={"COLUMNS": "400"})
    assert r.exit_code == 0, r.output
    line = next(x for x in r.output.splitlines() if x.startswith("stopped: "))
    assert line.startswith("stopped: max_passes (iterations ") and "pass budget 20 (given)" in line
    assert "relative decrease of J_mu" in line
    r = CliRunner().invoke(app_(), ["info", str(out)], env={"COLUMNS": "400"})
    assert r.exit_code == 0 and "pass budget 20 (given)" in r.output, r.output


def app_():
    from dufs.cli import app

    return app
