"""Where the iterative methods keep their checkpoints and when they go: beside the store where its folder can be
written, else the per-user cache (``dufs.checkpoint.dir: auto``) or the folder that setting names; removed after a
successful run unless ``dufs.checkpoint.keep``, kept after a failure for ``resume=True``, which finds it there."""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import textwrap

import dask
import numpy as np
import pytest
import scipy.sparse as sp
from typer.testing import CliRunner

import dufs
from dufs.cli import app
from dufs.errors import ParameterError
from dufs.methods.greedy.run import GreedyRun
from dufs.methods.mmfs.checkpoint import Checkpoint
from dufs.testing import patience

METHODS = ("mmfs", "lapdofs")


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    """A labelled store of 300 x 80 (MMFS takes 8 rounds on it, LapDOFS its 5 steps in this process)."""
    rng = np.random.default_rng(0)
    X = sp.random_array((300, 80), density=0.2, rng=rng, format="csr")
    y = np.where(X[:, :3].toarray().sum(1) + 0.3 * rng.standard_normal(300) > 0.3, 1, -1)
    path = tmp_path_factory.mktemp("ckpt") / "x.zarr"
    dufs.write_store(X, path, y)
    return path


@pytest.fixture
def store(template, tmp_path):
    """A fresh copy of the store, alone in its folder ``tmp_path / "data"``."""
    path = tmp_path / "data" / "x.zarr"
    shutil.copytree(template, path)
    return path


def _fit(store, method, **kw):
    return dufs.fit(str(store), method=method, n_features=5, client=False, checkpoint_every=1, **kw)


# ---------------------------------------------------------------------------------------------------- a read-only store
@functools.cache
def _read_only_mount() -> str | None:
    """Why a folder cannot be made read-only for a child process here (None: ``unshare -m`` with a read-only bind
    mount works). The tests run as root, which passes every mode check, so chmod would prove nothing."""
    if shutil.which("unshare") is None:
        return "no unshare(1)"
    probe = "mount --bind /tmp /tmp && mount -o remount,bind,ro /tmp && ! touch /tmp/.dufs-ro-probe 2>/dev/null"
    try:
        r = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", probe], capture_output=True,
                           text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unshare -m failed ({e})"
    if r.returncode != 0:
        return f"unshare -m with a read-only bind mount is not allowed here ({r.stderr.strip()[:200]})"
    return None


def _run_read_only(folder, script: str, env: dict) -> subprocess.CompletedProcess:
    """``script`` in a child Python where ``folder`` is a read-only bind mount (for root too)."""
    why = _read_only_mount()
    if why is not None:
        pytest.skip(f"cannot make a store read-only for a child process: {why}")
    f = str(folder)
    sh = f'mount --bind "{f}" "{f}" && mount -o remount,bind,ro "{f}" && exec "$0" -c "$1"'
    return subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", sh, sys.executable, script],
                          capture_output=True, text=True, env=env, timeout=patience(240))


def test_a_read_only_store_selects_with_defaults_and_resumes_from_the_users_cache(store, tmp_path):
    """``dufs select`` and ``dufs.fit`` with their defaults on a store whose folder cannot be written: the
    checkpoints go to $XDG_CACHE_HOME/dufs/checkpoints/<x.zarr-hash>/ and are removed after each successful run;
    a run that fails keeps its checkpoint there, and ``resume=True`` finds it and ends as an uninterrupted run."""
    data, cache = store.parent, tmp_path / "cache"
    script = textwrap.dedent(f"""
        import json, os
        import dufs
        from typer.testing import CliRunner
        from dufs.cli import app
        from dufs.methods.greedy.run import GreedyRun
        from dufs.methods.mmfs.checkpoint import Checkpoint

        store, cache = {str(store)!r}, {str(cache)!r}
        try:
            open(os.path.join(os.path.dirname(store), "probe"), "w")
            raise SystemExit("the store's folder is writable")
        except OSError:
            pass
        out = {{}}
        for m in ("mmfs", "lapdofs"):
            r = CliRunner().invoke(app, ["select", store, "-m", m, "-k", "5"])
            out["cli-" + m] = [r.exit_code, r.output[-3000:]]
            d = dufs.fit(store, method=m, n_features=5).diagnostics
            out["fit-" + m] = [d["checkpoint"], d["checkpoint_kept"]]

        def fail(real, when):
            def f(self, *a, **kw):
                real(self, *a, **kw)
                if when(self):
                    raise RuntimeError("killed mid-run")
            return f

        real = Checkpoint.save, GreedyRun.save_driver
        Checkpoint.save = fail(Checkpoint.save, lambda ck: ck.writes >= 2)
        GreedyRun.save_driver = fail(GreedyRun.save_driver, lambda run: len(run.ids) >= 3)
        for m in ("mmfs", "lapdofs"):
            try:
                dufs.fit(store, method=m, n_features=5, checkpoint_every=1)
                out["failed-" + m] = None
            except RuntimeError as e:
                out["failed-" + m] = str(e)
        Checkpoint.save, GreedyRun.save_driver = real
        out["kept"] = sorted(os.path.relpath(os.path.join(p, f), cache)
                             for p, _, fs in os.walk(cache) for f in fs)
        for m in ("mmfs", "lapdofs"):
            s = dufs.fit(store, method=m, n_features=5, checkpoint_every=1, resume=True)
            d = s.diagnostics
            out["resumed-" + m] = [s.indices.tolist(), d["checkpoint"], d.get("resumed_from_round"),
                                   d.get("resumed_steps"), d["checkpoint_kept"]]
            out["ref-" + m] = dufs.fit(store, method=m, n_features=5, checkpoint=None).indices.tolist()
        out["left"] = sorted(os.path.relpath(os.path.join(p, f), cache) for p, ds, fs in os.walk(cache)
                             for f in fs + ds)
        print("RESULT " + json.dumps(out))
    """)
    env = {**os.environ, "XDG_CACHE_HOME": str(cache)}
    r = _run_read_only(data, script, env)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
    assert r.returncode == 0 and lines, r.stdout[-3000:] + r.stderr[-3000:]
    out = json.loads(lines[0][len("RESULT "):])
    assert os.listdir(data) == ["x.zarr"]  # nothing was written beside the store
    root = str(cache / "dufs" / "checkpoints") + os.sep
    for m in METHODS:
        code, text = out["cli-" + m]
        assert code == 0 and f"{m}: 5 features of 80" in text, text
        where, kept = out["fit-" + m]
        assert where.startswith(root + "x.zarr-") and not kept
        assert out["failed-" + m] == "killed mid-run"
    # the failed runs' checkpoints in the cache, in the store's subfolder
    sub = {p.split(os.sep)[2] for p in out["kept"]}
    assert len(sub) == 1 and sub.pop().startswith("x.zarr-"), out["kept"]
    assert any(p.endswith(os.sep + "checkpoint.npz") for p in out["kept"])
    assert any(p.endswith(os.sep + "selection.json") for p in out["kept"])
    ind, where, from_round, _, kept = out["resumed-mmfs"]
    assert where.startswith(root) and from_round is not None and from_round >= 1 and not kept and ind == out["ref-mmfs"]
    ind, where, _, steps, kept = out["resumed-lapdofs"]
    assert where.startswith(root) and steps == 3 and not kept and ind == out["ref-lapdofs"]
    assert out["left"] == ["dufs", os.path.join("dufs", "checkpoints")]  # all removed after the successes


# ---------------------------------------------------------------------------------------------------- keep, dir
@pytest.mark.parametrize("method", METHODS)
def test_a_successful_run_removes_its_checkpoint_and_keep_keeps_it(store, method):
    side = f"{store}.dufs-side"
    d = _fit(store, method).diagnostics
    assert d["checkpoint"].startswith(side + os.sep) and not d["checkpoint_kept"]
    assert not os.path.exists(side)  # the run's folder, and the side folder it left empty
    with dask.config.set({"dufs.checkpoint.keep": True}):
        kept = _fit(store, method, lambda2=0.5) if method == "lapdofs" else _fit(store, method, C=0.5)
    assert kept.diagnostics["checkpoint_kept"] and os.path.exists(kept.diagnostics["checkpoint"])
    d = _fit(store, method).diagnostics  # another problem's: removed, the kept one stays beside it
    assert not d["checkpoint_kept"] and not os.path.exists(d["checkpoint"])
    assert os.path.exists(kept.diagnostics["checkpoint"]) and len(os.listdir(side)) == 1
    # a folder the caller named is theirs: it stays
    d = _fit(store, method, checkpoint=str(store.parent / "mine")).diagnostics
    assert d["checkpoint_kept"] and os.listdir(store.parent / "mine")


def test_the_checkpoint_dir_setting_puts_each_stores_checkpoints_in_their_own_subfolder(store, template, tmp_path):
    ck = tmp_path / "ck"
    other = tmp_path / "other" / "x.zarr"  # a store of the same name in another folder
    shutil.copytree(template, other)
    with dask.config.set({"dufs.checkpoint.dir": str(ck), "dufs.checkpoint.keep": True}):
        a = _fit(store, "mmfs").diagnostics["checkpoint"]
        b = _fit(other, "mmfs").diagnostics["checkpoint"]
        c = _fit(store, "lapdofs").diagnostics["checkpoint"]
    assert a.startswith(str(ck) + os.sep + "x.zarr-") and os.path.exists(a)
    a, b = os.path.dirname(a), os.path.dirname(b)  # MMFS names its file, the greedy methods their folder
    assert os.path.dirname(a) == os.path.dirname(c)  # one subfolder a store
    assert os.path.dirname(a) != os.path.dirname(b)  # never shared
    assert os.listdir(store.parent) == ["x.zarr"] and os.listdir(other.parent) == ["x.zarr"]
    with dask.config.set({"dufs.checkpoint.dir": str(ck)}):
        _fit(store, "lapdofs")  # not kept: its folder goes, the store's subfolder keeps mmfs's
    assert not os.path.exists(c) and os.path.exists(a)
    (tmp_path / "file").write_text("")
    with dask.config.set({"dufs.checkpoint.dir": str(tmp_path / "file" / "ck")}), \
            pytest.raises(ParameterError, match="dufs.checkpoint.dir"):
        _fit(store, "mmfs")


@pytest.mark.parametrize("method", METHODS)
def test_a_failed_run_keeps_its_checkpoint_where_resume_finds_it(store, tmp_path, monkeypatch, method):
    ck = tmp_path / "ck"
    ref = _fit(store, method, checkpoint=None).indices
    real = Checkpoint.save if method == "mmfs" else GreedyRun.save_driver

    def failing(self, *a, **kw):
        real(self, *a, **kw)
        if (self.writes >= 2) if method == "mmfs" else (len(self.ids) >= 3):
            raise RuntimeError("killed mid-run")

    with dask.config.set({"dufs.checkpoint.dir": str(ck)}):
        with monkeypatch.context() as mp:
            mp.setattr(Checkpoint if method == "mmfs" else GreedyRun, "save" if method == "mmfs" else
                       "save_driver", failing)
            with pytest.raises(RuntimeError, match="killed mid-run"):
                _fit(store, method)
        (sub,) = os.listdir(ck)
        (run,) = os.listdir(ck / sub)
        assert run.startswith(method + "-") and os.listdir(ck / sub / run)
        sel = _fit(store, method, resume=True)
    d = sel.diagnostics
    if method == "mmfs":  # the second write's round (the first is round 0)
        assert d["resumed_from_round"] is not None and d["resumed_from_round"] >= 1
    else:
        assert d["resumed_steps"] == 3
    assert d["checkpoint"].startswith(str(ck / sub / run)) and not d["checkpoint_kept"]
    np.testing.assert_array_equal(sel.indices, ref)
    assert os.listdir(ck) == [] and os.listdir(store.parent) == ["x.zarr"]


# ---------------------------------------------------------------------------------------------------- the CLI
def test_the_cli_leaves_no_checkpoint_by_default_and_writes_none_for_none_or_null(store):
    r = CliRunner().invoke(app, ["select", str(store), "-m", "lapdofs", "-k", "5"])
    assert r.exit_code == 0, r.output
    assert os.listdir(store.parent) == ["x.zarr"]
    with dask.config.set({"dufs.checkpoint.keep": True}):
        for word in ("none", "null", "None"):
            r = CliRunner().invoke(app, ["select", str(store), "-m", "lapdofs", "-k", "5", "-p",
                                         f"checkpoint={word}"])
            assert r.exit_code == 0, r.output
            assert os.listdir(store.parent) == ["x.zarr"], word
    r = CliRunner().invoke(app, ["select", "--help"])
    assert "parsed as JSON" in " ".join(r.output.replace("│", " ").split())
