"""Bad arguments to every subcommand: exit 2, exactly one line on stderr (``error: ...``), nothing on stdout, no
traceback, and no file left behind that was not there before.

Each case is a row of ``CASES``: the command line (``{tmp}`` is the test's folder, where ``workspace`` put a
labelled store, an unlabelled one, a libsvm file, a malformed one, a plain folder, a file, a selection ...), and
a piece of the expected message. The rows run in-process through typer's runner; ``test_in_a_process`` runs a
few through the installed entry point, and ``test_debug_shows_the_traceback`` checks ``--debug``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
from typer.testing import CliRunner

import dufs
from dufs.cli import app
from dufs.testing import patience


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("cli-errors")
    X = sp.random_array((40, 12), density=0.3, rng=0, format="csr")
    dufs.write_store(X, tmp / "s.zarr", np.arange(40) % 2)
    dufs.write_store(X, tmp / "nolabels.zarr")
    dufs.write_store(sp.random_array((40, 20), density=0.3, rng=1, format="csr"), tmp / "wide.zarr", np.arange(40) % 2)
    (tmp / "in.svm").write_text("1 1:2 3:4\n0 2:1\n")
    (tmp / "bad.svm").write_text("1 1:2\n0 2:x\n")
    (tmp / "table.csv").write_text("f1,f2,label\n0.5,1.5,1\n")  # what pandas' to_csv writes
    (tmp / "headless.csv").write_text("1,0.5,1.5\n0,2.5,0\n")
    import scipy.io

    scipy.io.savemat(tmp / "data.mat", {"X": np.eye(3), "Y": np.arange(3)})
    (tmp / "plain").mkdir()
    (tmp / "plain" / "thesis.txt").write_text("four years of work")
    (tmp / "file.txt").write_text("not a folder")
    (tmp / "notjson.json").write_text("hello")
    (tmp / "other.json").write_text(json.dumps({"format": "something else"}))
    dufs.fit(X, np.arange(40) % 2, method="fisher", n_features=5).to_json(tmp / "sel.json")
    return tmp


CASES = [
    # convert
    (["convert"], "Missing argument"),
    (["convert", "{tmp}/in.svm"], "give at least one input and the output"),
    (["convert", "{tmp}/nosuch.svm", "{tmp}/out.zarr"], "{tmp}/nosuch.svm: no such file"),
    (["convert", "{tmp}/plain", "{tmp}/out.zarr"], "{tmp}/plain: is a directory, not a libsvm file"),
    (["convert", "{tmp}/in.svm", "{tmp}/nodir/out.zarr"], "the folder {tmp}/nodir does not exist"),
    (["convert", "{tmp}/in.svm", "{tmp}/file.txt/out.zarr"], "{tmp}/file.txt is not a folder"),
    (["convert", "{tmp}/in.svm", "{tmp}/out.zarr", "--zero-based", "maybe"], "--zero-based must be auto, true or"),
    (["convert", "{tmp}/in.svm", "{tmp}/out.zarr", "--on-error", "ignore"], "--on-error must be 'raise' or 'skip'"),
    (["convert", "{tmp}/in.svm", "{tmp}/out.zarr", "--dtype", "int8"], "--dtype must be a float dtype; got int8"),
    (["convert", "{tmp}/in.svm", "{tmp}/out.zarr", "--block-bytes", "lots"], "--block-bytes must be a size"),
    (["convert", "{tmp}/bad.svm", "{tmp}/out.zarr"], "{tmp}/bad.svm:2:"),
    (["convert", "{tmp}/in.svm", "{tmp}/s.zarr"], "exists; pass --overwrite to replace it"),
    (["convert", "{tmp}/in.svm", "{tmp}/out.zarr", "--n-features", "2"], "beyond --n-features 2"),
    (["convert", "{tmp}/table.csv", "{tmp}/out.zarr"], "{tmp}/table.csv looks like CSV (comma-separated values), "
                                                       "not libsvm/svmlight text, lines of 'label index:value"),
    (["convert", "{tmp}/headless.csv", "{tmp}/out.zarr", "--on-error", "skip"], "{tmp}/headless.csv looks like CSV"),
    (["convert", "{tmp}/data.mat", "{tmp}/out.zarr"], "{tmp}/data.mat is a MATLAB .mat file, not libsvm/svmlight "
                                                      "text, lines of 'label index:value index:value ...' (plain, "
                                                      ".bz2, .gz or .xz): load it with scipy.io.loadmat"),
    (["convert", "{tmp}/in.svm", "{tmp}/out.zarr", "--scheduler", "notanaddress"],
     "cannot connect to the Dask scheduler at notanaddress"),
    # info
    (["info", "{tmp}/nosuch.zarr"], "no dufs store at {tmp}/nosuch.zarr"),
    (["info", "{tmp}/plain"], "{tmp}/plain is not a dufs store (a directory with no zarr.json); to make one from "
                              "libsvm/svmlight text, run `dufs convert IN... OUT.zarr`"),
    (["info", "{tmp}/in.svm"], "{tmp}/in.svm is not a dufs store (a regular file); to make one from libsvm/svmlight "
                               "text, run `dufs convert {tmp}/in.svm OUT.zarr`"),
    (["info", "{tmp}/s.zarr", "--top", "-1"], "Invalid value for '--top'"),
    # make-synthetic
    (["make-synthetic", "{tmp}/m.zarr", "--rows", "0"], "--rows must be an int in [1, inf); got 0."),
    (["make-synthetic", "{tmp}/m.zarr", "--rows", "100", "--features", "10", "--nnz-per-row", "50"],
     "--nnz-per-row must be an int in [1, --features]; got 50."),
    (["make-synthetic", "{tmp}/m.zarr", "--rows", "100", "--features", "50", "--label-noise", "2"],
     "--label-noise must be a float in [0, 0.5); got 2.0."),
    (["make-synthetic", "{tmp}/nodir/m.zarr", "--rows", "100", "--features", "50"], "{tmp}/nodir does not exist"),
    (["make-synthetic", "{tmp}/m.zarr", "--rows", "many"], "Invalid value for '--rows'"),
    (["make-synthetic", "{tmp}/m.zarr", "--rows", "10", "--features", "50", "--clusters", "3",
      "--cluster-features", "20"], "--cluster-features must be an int >= 1 with --clusters * --cluster-features + "
                                   "--informative <= --features; got 20."),
    (["make-synthetic", "{tmp}/s.zarr", "--rows", "10", "--features", "50"], "exists; pass --overwrite to replace"),
    # select
    (["select", "{tmp}/in.svm", "-m", "fisher", "-k", "1"], "{tmp}/in.svm is not a dufs store (a regular file); to "
                                                             "make one from libsvm/svmlight text, run `dufs convert "
                                                             "{tmp}/in.svm OUT.zarr`"),
    (["select", "{tmp}/s.zarr", "-m", "fisher", "-k", "3", "-o", "{tmp}/nodir/x.json"],
     "-o {tmp}/nodir/x.json: the folder {tmp}/nodir does not exist"),
    (["select", "{tmp}/s.zarr", "-m", "fisher", "-k", "3", "-o", "{tmp}/plain"], "is a directory; give a file name"),
    (["select", "{tmp}/s.zarr", "-m", "jcfs", "-k", "3", "-p", "n_clusters=two", "--workers", "0"],
     "The 'n_clusters' parameter of jcfs must be an int"),
    (["select", "{tmp}/s.zarr", "-m", "fisher", "-k", "abc"], "Invalid value for '-k'"),
    (["select", "{tmp}/s.zarr", "-m", "fisher", "-k", "3", "--bogus"], "No such option: --bogus"),
    (["select", "{tmp}/s.zarr", "-k", "3"], "Missing option"),
    (["select", "{tmp}/s.zarr", "-m", "fisher", "-k", "3", "--scheduler", "notanaddress"],
     "cannot connect to the Dask scheduler at notanaddress"),
    # evaluate
    (["evaluate", "{tmp}/s.zarr", "{tmp}/nosuch.json"], "{tmp}/nosuch.json: no such selection file"),
    (["evaluate", "{tmp}/s.zarr", "{tmp}/notjson.json"], "{tmp}/notjson.json is not a dufs selection: not JSON"),
    (["evaluate", "{tmp}/s.zarr", "{tmp}/other.json"], "not a dufs selection"),
    (["evaluate", "{tmp}/s.zarr", "{tmp}/sel.json", "--ks", "0,abc"], "--ks must be comma-separated integers"),
    (["evaluate", "{tmp}/s.zarr", "{tmp}/sel.json", "--ks", ""], "--ks must be comma-separated integers"),
    (["evaluate", "{tmp}/s.zarr", "{tmp}/sel.json", "--figure", "{tmp}/nodir/a.png"], "{tmp}/nodir does not exist"),
    (["evaluate", "{tmp}/nolabels.zarr", "{tmp}/sel.json"], "has no labels to evaluate against"),
    (["evaluate", "{tmp}/nosuch.zarr", "{tmp}/sel.json"], "no dufs store at {tmp}/nosuch.zarr"),
    (["evaluate", "{tmp}/s.zarr", "{tmp}/sel.json", "--test", "{tmp}/wide.zarr"],
     "{tmp}/wide.zarr has 20 features; the fisher selection"),
    (["evaluate", "{tmp}/wide.zarr", "{tmp}/sel.json"], "{tmp}/wide.zarr has 20 features"),
    (["evaluate", "{tmp}/s.zarr", "{tmp}/sel.json", "--test", "{tmp}/nolabels.zarr"],
     "{tmp}/nolabels.zarr has no labels to evaluate against"),
    # bench, demo, the group
    (["bench", "nosuch"], "unknown benchmark 'nosuch'"),
    (["bench", "greedy", "--ks", "1"], "--ks must be comma-separated integers >= 2"),
    (["demo", "--dataset", "nosuch", "--out", "{tmp}/demo"], "--dataset must be one of"),
    (["demo", "--out", "{tmp}/file.txt"], "--out {tmp}/file.txt: is a file, not a folder"),
    (["nosuch"], "No such command 'nosuch'"),
]


def _listing(root: Path) -> dict[str, bytes | None]:
    """Every path under ``root`` with the bytes of each file (None for a folder)."""
    return {str(p.relative_to(root)): (None if p.is_dir() else p.read_bytes()) for p in sorted(root.rglob("*"))}


@pytest.mark.parametrize("args, says", CASES, ids=[" ".join(a)[:60] for a, _ in CASES])
def test_bad_arguments_give_one_line(workspace, args, says):
    before = _listing(workspace)
    res = CliRunner().invoke(app, [a.format(tmp=workspace) for a in args])
    assert res.exit_code == 2, (res.exit_code, res.stdout, res.stderr, res.exception)
    assert res.stdout == "", res.stdout
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    assert "Traceback" not in res.stderr
    assert says.format(tmp=workspace) in lines[0]
    # the command line's flags, not the library's parameter names
    assert not any(name in lines[0] for name in ("n_rows", "overwrite=True", "n_features=", "'value_dtype'"))
    assert _listing(workspace) == before  # nothing written, nothing removed, nothing changed


def test_no_arguments_print_the_help():
    res = CliRunner().invoke(app, [])
    assert res.exit_code == 2 and "Usage: " in res.stdout and "convert" in res.stdout


def test_internal_errors_are_one_line_too(workspace, monkeypatch):
    """A failure that is no bad input (a bug) is still one line, saying so and how to see the traceback; exit 1."""
    import dufs.data.store

    def broken(*a, **k):
        raise KeyError("a bug")

    monkeypatch.setattr(dufs.data.store.SparseStore, "info", broken)
    res = CliRunner().invoke(app, ["info", str(workspace / "s.zarr")])
    assert res.exit_code == 1
    assert res.stderr == "error: internal error (KeyError: 'a bug'); run with --debug for the traceback\n"


def test_debug_shows_the_traceback(workspace):
    res = CliRunner().invoke(app, ["--debug", "evaluate", str(workspace / "s.zarr"), str(workspace / "notjson.json")])
    assert res.exit_code == 1 and isinstance(res.exception, dufs.errors.ParameterError)
    assert "not a dufs selection" in str(res.exception)


@pytest.mark.parametrize("args, says, usage", [
    (["evaluate", "{tmp}/s.zarr", "{tmp}/notjson.json"], "is not a dufs selection: not JSON", False),
    (["select", "{tmp}/s.zarr", "-m", "fisher", "-k", "abc"], "Invalid value for '-k'", True),
    (["convert", "{tmp}/in.svm", "{tmp}/nodir/out.zarr"], "does not exist", False),
])
@pytest.mark.slow
def test_in_a_process(workspace, args, says, usage):
    """The installed entry point (``python -m dufs.cli``): the same one line and exit 2, and with DUFS_DEBUG=1 a
    traceback (a usage error, found before any code of ours runs, stays one line)."""
    cmd = [sys.executable, "-m", "dufs.cli", *[a.format(tmp=workspace) for a in args]]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=patience(120))
    assert res.returncode == 2 and res.stdout == ""
    assert len(res.stderr.splitlines()) == 1 and res.stderr.startswith("error: ") and says in res.stderr
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=patience(120),
                         env={**os.environ, "DUFS_DEBUG": "1"})
    assert res.returncode != 0 and ("Traceback (most recent call last)" in res.stderr) != usage


# ------------------------------------------------------------------------------------------------ verify
def _damaged(workspace: Path, tmp_path: Path, how: str) -> tuple[Path, str]:
    """A copy of the labelled store with one chunk of the first feature block's data deleted or truncated."""
    import shutil

    st = tmp_path / f"{how}.zarr"
    shutil.copytree(workspace / "s.zarr", st)
    chunk = sorted((st / "csc" / "0" / "data" / "c").rglob("*"))[0]
    key = chunk.relative_to(st).as_posix()
    if how == "deleted":
        chunk.unlink()
    else:
        chunk.write_bytes(chunk.read_bytes()[:-3])
    return st, key


def test_verify_an_intact_store(workspace):
    res = CliRunner().invoke(app, ["verify", str(workspace / "s.zarr")])
    assert res.exit_code == 0 and res.stderr == ""
    assert res.stdout.startswith(f"{workspace / 's.zarr'}: intact (") and "chunks" in res.stdout
    res = CliRunner().invoke(app, ["verify", str(workspace / "s.zarr"), "--json"])
    d = json.loads(res.stdout)
    assert res.exit_code == 0 and d["intact"] and d["chunks"] > 0 and d["bytes"] > 0


@pytest.mark.parametrize("how", ["deleted", "truncated"])
def test_verify_names_the_damage(workspace, tmp_path, how):
    """``dufs info`` alone reads metadata and says nothing; ``dufs verify`` and ``dufs info --verify`` read every
    chunk, exit 2 and name the damaged one."""
    st, key = _damaged(workspace, tmp_path, how)
    assert CliRunner().invoke(app, ["info", str(st)]).exit_code == 0
    for args in (["verify", str(st)], ["info", str(st), "--verify"]):
        res = CliRunner().invoke(app, args)
        assert res.exit_code == 2 and res.stdout == ""
        lines = res.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and key in lines[0], (key, res.stderr)
    res = CliRunner().invoke(app, ["verify", str(st), "--json"])
    d = json.loads(res.stdout)
    assert res.exit_code == 2 and not d["intact"] and any(k == key for k, _ in d["damage"])


# ------------------------------------------------------------------------------------------------ ingest
@pytest.mark.parametrize("suffix", [".gz", ".bz2"])
def test_truncated_compressed_input(tmp_path, suffix):
    """A truncated compressed file: one line naming it (not click's bare "Aborted."), and no partial store."""
    import bz2
    import gzip

    rng = np.random.default_rng(0)
    text = "".join(f"{i % 2} " + " ".join(f"{j}:{rng.random():.4f}" for j in sorted(rng.choice(50, 8) + 1)) + "\n"
                   for i in range(3000)).encode()
    blob = (gzip.compress if suffix == ".gz" else bz2.compress)(text)
    src = tmp_path / f"in.svm{suffix}"
    src.write_bytes(blob[: len(blob) // 2])
    before = _listing(tmp_path)
    res = CliRunner().invoke(app, ["convert", str(src), str(tmp_path / "out.zarr"), "--workers", "0"])
    assert res.exit_code == 2 and res.stdout == ""
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {src}: compressed stream ends early"), res.stderr
    assert _listing(tmp_path) == before
