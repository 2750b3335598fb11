"""The ``dufs`` command line: convert (threads, an embedded LocalCluster), info, make-synthetic, errors."""

from __future__ import annotations

import bz2
import contextlib
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import dask
import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.datasets import dump_svmlight_file, load_svmlight_file
from typer.testing import CliRunner

import dufs
import dufs.cli.selecting
from dufs.api import METHODS
from dufs.cli import app
from dufs.testing import patience

ENV = {**os.environ, "DASK_DUFS__STORE__FEATURE_GRANULE": "16", "DASK_DUFS__STORE__FEATURE_BLOCK_NNZ": "1000"}


@pytest.fixture(autouse=True)
def small_blocks():
    with dask.config.set({"dufs.store.feature-granule": 16, "dufs.store.feature-block-nnz": 1000}):
        yield


def run(*args: str, code: int = 0):
    res = CliRunner().invoke(app, [str(a) for a in args])
    assert res.exit_code == code, f"exit {res.exit_code}\nstdout: {res.stdout}\nstderr: {res.stderr}\n" \
                                  f"{res.exception!r}"
    return res


def text_of(n: int, d: int, seed: int, zero_based: bool = False) -> bytes:
    rng = np.random.default_rng(seed)
    X = sp.random_array((n, d), density=0.1, format="csr", rng=rng)
    buf = io.BytesIO()
    dump_svmlight_file(X, rng.integers(0, 2, n), buf, zero_based=zero_based)
    return buf.getvalue()


def write(path: Path, text: bytes) -> Path:
    with (bz2.open if path.suffix == ".bz2" else open)(path, "wb") as f:
        f.write(text)
    return path


def assert_loads_as_sklearn(store_path: Path, text: bytes, **kw) -> None:
    st = dufs.open(store_path)
    X, y = load_svmlight_file(io.BytesIO(text), **kw)
    assert st.shape == X.shape
    np.testing.assert_array_equal(st.to_scipy("csr").toarray(), X.toarray().astype(st.dtype))
    np.testing.assert_array_equal(st.to_scipy("csc").toarray(), X.toarray().astype(st.dtype))
    np.testing.assert_array_equal(st.y, y)


@pytest.fixture(scope="module")
def text() -> bytes:
    return text_of(200, 50, seed=0)


@pytest.mark.parametrize("suffix", ["", ".bz2"])
def test_convert(tmp_path, text, suffix):
    src = write(tmp_path / f"in.svm{suffix}", text)
    out = tmp_path / "out.zarr"
    res = run("convert", src, out, "--workers", "0", "--block-bytes", "3000", "--dtype", "float64")
    assert res.stdout.strip() == str(out)  # only the store's path on stdout
    assert "converted 200 rows" in res.stderr and "(one-based)" in res.stderr
    assert_loads_as_sklearn(out, text)
    st = dufs.open(out)
    assert st.dtype == np.float64 and st.n_blocks("csr") > 3
    # again: refused, unless --overwrite
    res = run("convert", src, out, "--workers", "0", code=2)
    assert "exists" in res.stderr and "--overwrite" in res.stderr
    run("convert", src, out, "--workers", "0", "--overwrite", "--zero-based", "true", "--n-features", "60")
    st = dufs.open(out)
    assert st.shape == (200, 60) and st.dtype == np.float32
    assert_loads_as_sklearn(out, text, zero_based=True, n_features=60)


def test_convert_paths_and_messages_print_as_they_are(tmp_path, text):
    """Long paths are not wrapped, brackets are not markup, ``:100:`` is not an emoji."""
    deep = tmp_path / ("a_rather_long_directory_name_" * 4) / "[bold]odd[/] :100: name"
    deep.mkdir(parents=True)
    src = write(deep / "in.svm", text)
    res = run("convert", src, deep / "out.zarr", "--workers", "0")
    assert res.stdout == f"{deep / 'out.zarr'}\n"
    info = run("info", deep / "out.zarr").stdout
    assert "".join(str(deep).split()) in "".join(info.split())  # (the table may wrap it)
    lines = text.splitlines(keepends=True)
    lines[99] = b"1 2:x\n"
    bad = write(deep / "bad.svm", b"".join(lines))
    res = run("convert", bad, deep / "bad.zarr", "--workers", "0", code=2)
    assert f"{bad}:100: a feature value is not a number" in res.stderr


def test_convert_each(tmp_path):
    a_text, b_text = text_of(100, 30, seed=1, zero_based=True), text_of(80, 50, seed=2)
    a = write(tmp_path / "a.svm", a_text)
    b = write(tmp_path / "b.svm.bz2", b_text)
    dest = tmp_path / "stores"
    res = run("convert", a, b, dest, "--each", "--workers", "0", "--block-bytes", "2000")
    assert res.stdout.split() == [str(dest / "a.zarr"), str(dest / "b.zarr")]
    sa, sb = dufs.open(dest / "a.zarr"), dufs.open(dest / "b.zarr")
    assert sa.shape == (100, 51) and sb.shape == (80, 51)  # a shared n_features and index base (zero)
    assert_loads_as_sklearn(dest / "a.zarr", a_text, zero_based=True, n_features=51)
    assert_loads_as_sklearn(dest / "b.zarr", b_text, zero_based=True, n_features=51)



def test_convert_each_names_a_store_after_the_whole_file_name(tmp_path):
    """``adult.trn.bz2`` and ``adult.tst.bz2`` become ``adult.trn.zarr`` and ``adult.tst.zarr`` (the compression and
    a libsvm suffix dropped, nothing more); inputs that would still share a store are refused in one line naming
    both, before anything is written."""
    trn_text, tst_text = text_of(60, 20, seed=4), text_of(40, 20, seed=5)
    (tmp_path / "a").mkdir()
    trn = write(tmp_path / "a" / "adult.trn.bz2", trn_text)
    tst = write(tmp_path / "a" / "adult.tst.bz2", tst_text)
    dest = tmp_path / "out"
    res = run("convert", trn, tst, dest, "--each", "--workers", "0")
    assert res.stdout.split() == [str(dest / "adult.trn.zarr"), str(dest / "adult.tst.zarr")]
    assert_loads_as_sklearn(dest / "adult.trn.zarr", trn_text, n_features=20)
    assert_loads_as_sklearn(dest / "adult.tst.zarr", tst_text, n_features=20)
    # x.svm and x.svm.bz2 (or a/x.svm and b/x.svm) would both be x.zarr: refused, OUT not even made
    plain = write(tmp_path / "a" / "x.svm", trn_text)
    packed = write(tmp_path / "a" / "x.svm.bz2", tst_text)
    res = run("convert", plain, packed, tmp_path / "clash", "--each", "--workers", "0", code=2)
    line = one_error_line(res)
    assert str(plain) in line and str(packed) in line and "x.zarr" in line
    assert not (tmp_path / "clash").exists()
    # the converter itself refuses one output given twice, naming both inputs
    from dufs.data.convert import convert_libsvm
    from dufs.errors import ParameterError

    with pytest.raises(ParameterError, match=f"{re.escape(str(plain))} and {re.escape(str(packed))} are both"):
        convert_libsvm([plain, packed], [tmp_path / "y.zarr", tmp_path / "." / "y.zarr"])
    assert not (tmp_path / "y.zarr").exists() and not list(tmp_path.glob("y.zarr*"))

def test_convert_bad_input(tmp_path, text):
    lines = text.splitlines(keepends=True)
    lines[36] = b"1 3:1 3:2\n"
    bad = b"".join(lines)
    for name in ("in.svm", "in.svm.bz2"):
        src = write(tmp_path / name, bad)
        res = run("convert", src, tmp_path / "out.zarr", "--workers", "0", "--block-bytes", "2000", code=2)
        assert f"{src}:37: a feature index appears twice in the line (byte offset " in res.stderr
        assert res.stdout == ""
        assert not (tmp_path / "out.zarr").exists() and not (tmp_path / "out.zarr.dufs-partial").exists()
    res = run("convert", src, tmp_path / "a.svm", tmp_path / "each", "--each", "--workers", "0", code=2)
    assert "no such file" in res.stderr
    assert not (tmp_path / "each").exists()  # the directory --each made is gone again
    for args, what in [(["--zero-based", "maybe"], "--zero-based"), (["--on-error", "warn"], "--on-error"),
                       (["--dtype", "int32"], "float dtype"), (["--dtype", "nonsense"], "float dtype")]:
        res = run("convert", src, tmp_path / "out.zarr", "--workers", "0", *args, code=2)
        assert what in res.stderr
    res = run("convert", src, "--workers", "0", code=2)
    assert "IN... OUT" in res.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.svm", "in.svm.bz2"]


def test_convert_skip(tmp_path, text):
    lines = text.splitlines(keepends=True)
    for k, bad in [(4, b"1 3:nan\n"), (150, b"abc 1:1\n"), (151, b"\n"), (160, b"1 0:1\n")]:
        lines[k] = bad
    src = write(tmp_path / "in.svm", b"".join(lines))
    out = tmp_path / "out.zarr"
    res = run("convert", src, out, "--workers", "0", "--on-error", "skip", "--zero-based", "false",
              "--block-bytes", "2500", "--dtype", "float64")
    assert "skipped 3 bad lines" in res.stderr
    for line, why in [(5, "a feature value is nan or infinite"), (151, "the label is not a number"),
                      (161, "feature index 0 in one-based data")]:
        assert f"  {src}:{line}: {why}" in res.stderr
    assert "blank lines 1" in res.stderr
    kept = b"".join(ln for k, ln in enumerate(lines) if k not in (4, 150, 160))
    assert_loads_as_sklearn(out, kept, zero_based=False)


def one_error_line(res) -> str:
    """The whole of stderr: one line ``error: ...`` (no traceback), and nothing on stdout."""
    assert res.stdout == ""
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    return lines[0]


def test_convert_summary_counts_the_data_lines(tmp_path):
    src = write(tmp_path / "in.svm", b"# comment\n1 1:2 3:4\n0 2:1\n")
    res = run("convert", src, tmp_path / "out.zarr", "--workers", "0")
    assert dufs.open(tmp_path / "out.zarr").shape == (2, 3)
    summary = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(summary) == 1, res.stderr  # one line, not wrapped into a misleading "lines 0, comment lines 1"
    assert summary[0].startswith("converted 2 rows, 3 nonzeros, 3 features (one-based) in ")
    assert summary[0].endswith("; data lines 2, blank lines 0, comment lines 1")


@pytest.mark.parametrize("name, text", [("empty.svm", b""), ("comments.svm", b"# a comment\n\n# another\n"),
                                        ("empty.svm.bz2", b"")])
@pytest.mark.parametrize("opts", [[], ["--zero-based", "true"], ["--zero-based", "false"], ["--n-features", "4"]])
def test_convert_no_data_lines(tmp_path, name, text, opts):
    src = write(tmp_path / name, text)
    res = run("convert", src, tmp_path / "out.zarr", "--workers", "0", *opts, code=2)
    assert one_error_line(res) == f"error: no data lines in {src}"
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]  # no out.zarr, no out.zarr.dufs-partial
    # --each: the empty input is named, and neither store nor the directory made for them is left
    other = write(tmp_path / "other.svm", b"1 1:1\n")
    res = run("convert", other, src, tmp_path / "each", "--each", "--workers", "0", *opts, code=2)
    assert one_error_line(res) == f"error: no data lines in {src}"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([name, "other.svm"])


@contextlib.contextmanager
def _no_cluster(scheduler, workers):
    raise AssertionError(f"a cluster was started (scheduler={scheduler}, workers={workers})")
    yield  # pragma: no cover


@pytest.fixture
def stores(tmp_path):
    """A labelled store of 10 features, an unlabelled one, a directory that is no store, an unfinished one."""
    X = sp.random_array((30, 10), density=0.3, rng=0, format="csr")
    dufs.write_store(X, tmp_path / "s.zarr", np.arange(30) % 2)
    dufs.write_store(X, tmp_path / "nolabels.zarr")
    (tmp_path / "plain").mkdir()
    from dufs.data.builder import StoreBuilder

    b = StoreBuilder(tmp_path / "half.zarr")
    b.begin()
    b.abort(remove=False)
    return tmp_path


@pytest.mark.parametrize("args, says", [
    (["missing.zarr", "-m", "fisher", "-k", "3"], "no dufs store at {tmp}/missing.zarr"),
    (["plain", "-m", "fisher", "-k", "3"], "{tmp}/plain"),
    (["half.zarr", "-m", "fisher", "-k", "3"], "--resume"),
    (["s.zarr", "-m", "nosuch", "-k", "3"], "got 'nosuch'"),
    (["s.zarr", "-m", "fisher", "-k", "3", "-p", "foo=1"], "['foo'] that method 'fisher' does not take"),
    (["s.zarr", "-m", "laplacian", "-k", "3", "-p", "n_neighbours=5"], "['n_neighbours']"),
    (["s.zarr", "-m", "fisher", "-k", "3", "--n-neighbors", "5"], "['n_neighbors'] that method 'fisher'"),
    (["s.zarr", "-m", "fisher", "-k", "3", "-p", "foo"], "--param wants name=value; got 'foo'"),
    (["s.zarr", "-m", "fisher", "-k", "0"], "-k (--n-features) must be >= 1; got 0"),
    (["s.zarr", "-m", "fisher", "-k", "11"], "at most the 10 features of {tmp}/s.zarr; got 11"),
    (["s.zarr", "-m", "fisher", "-k", "3", "--standardize", "bogus"], "zscore, scale, none or auto; got 'bogus'"),
    (["nolabels.zarr", "-m", "fisher", "-k", "3"], "'fisher' is supervised but {tmp}/nolabels.zarr has no labels"),
])
def test_select_checks_before_starting_a_cluster(stores, monkeypatch, args, says):
    """Without --workers these would start a LocalCluster: each is refused first, in one line."""
    monkeypatch.setattr(dufs.cli.selecting, "cluster", _no_cluster)
    args = [str(stores / args[0]) if not args[0].startswith("-") else args[0], *args[1:]]
    res = run("select", *args, code=2)
    assert says.format(tmp=stores) in one_error_line(res)


def test_select_valid_arguments_reach_the_cluster(stores, monkeypatch):
    """The other side of the test above: valid arguments (a method's own parameters, an unlabelled store for an
    unsupervised method, any case of --standardize) do get to ``cluster``."""
    calls = []
    real = dufs.cli.selecting.cluster

    @contextlib.contextmanager
    def recording(scheduler, workers):
        calls.append((scheduler, workers))
        with real(scheduler, workers) as c:
            yield c

    monkeypatch.setattr(dufs.cli.selecting, "cluster", recording)
    res = run("select", stores / "nolabels.zarr", "-m", "laplacian", "-k", "4", "-p", "n_neighbors=3",
              "--standardize", "ZScore", "--workers", "0")
    assert calls == [(None, 0)]
    assert res.stdout.startswith("laplacian: 4 features of 10")
    ref = dufs.fit(dufs.open(stores / "nolabels.zarr"), method="laplacian", n_features=4, n_neighbors=3,
                   standardize="zscore")
    assert [int(j) for j in re.findall(r"│\s+\d+\s+│\s+(\d+)\s+│", res.stdout)] == ref.indices.tolist()


def _record_clusters(monkeypatch, module) -> list:
    """The (scheduler, workers) of every ``cluster`` the command module asks for, recorded; the embedded cluster
    (workers None) is not started: an AssertionError, the call being what is tested."""
    calls = []
    real = module.cluster

    @contextlib.contextmanager
    def recording(scheduler, workers):
        calls.append((scheduler, workers))
        if workers is None:
            raise AssertionError
        with real(scheduler, workers) as c:
            yield c

    monkeypatch.setattr(module, "cluster", recording)
    return calls


def test_select_runs_a_small_store_in_this_process(stores, monkeypatch):
    """No --workers and no --scheduler: a store of at most ``dufs.engine.inline-nnz`` nonzeros runs in this process
    (as ``fit`` does), saying so; a larger one goes to the embedded cluster (``cluster`` with workers None)."""
    calls = _record_clusters(monkeypatch, dufs.cli.selecting)
    path = stores / "s.zarr"
    res = run("select", path, "-m", "fisher", "-k", "3")
    assert calls == [(None, 0)] and f"{path} is small" in " ".join(res.stderr.split())
    ref = dufs.fit(dufs.open(path), method="fisher", n_features=3, client=False)
    assert [int(j) for j in re.findall(r"│\s+\d+\s+│\s+(\d+)\s+│", res.stdout)] == ref.indices.tolist()
    assert dufs.open(path).nnz > 10
    with dask.config.set({"dufs.engine.inline-nnz": 10}):
        res = run("select", path, "-m", "fisher", "-k", "3", code=1)
    assert calls[-1] == (None, None) and "is small" not in res.stderr


def test_select_help_lists_every_method():
    res = run("select", "--help")
    words = set(re.findall(r"[a-z0-9_]+", res.stdout))
    assert len(METHODS) == 11 and set(METHODS) <= words, set(METHODS) - words


@pytest.mark.parametrize("command", ["select", "convert", "make-synthetic"])
@pytest.mark.parametrize("address, why", [
    ("tcp://127.0.0.1:1", "Timed out trying to connect to tcp://127.0.0.1:1 after 1 s"),
    ("localhost", "missing port number in address 'localhost'"),
    ("nonsense://x", "unknown address scheme 'nonsense'"),
])
def test_unreachable_scheduler_is_one_line(stores, command, address, why):
    """Within dufs.cluster.connect-timeout (here 1 s, not distributed's 30 s: its message names the timeout it
    used), and nothing is written."""
    args = {"select": [stores / "s.zarr", "-m", "fisher", "-k", "3"],
            "convert": [write(stores / "in.svm", b"1 1:1\n"), stores / "out.zarr"],
            "make-synthetic": [stores / "syn.zarr", "--rows", "100", "--features", "50"]}[command]
    with dask.config.set({"dufs.cluster.connect-timeout": "1s"}):
        res = run(command, *args, "--scheduler", address, code=2)
    assert one_error_line(res).startswith(f"error: cannot connect to the Dask scheduler at {address}: {why}")
    assert not any(p.name.startswith(("out.zarr", "syn.zarr")) for p in stores.iterdir())


@pytest.mark.slow
def test_unreachable_scheduler_in_a_process(tmp_path):
    """The real command: exit 2, one line on stderr, no traceback, the timeout from the environment."""
    X = sp.random_array((30, 10), density=0.3, rng=0, format="csr")
    dufs.write_store(X, tmp_path / "s.zarr", np.arange(30) % 2)
    res = subprocess.run([sys.executable, "-m", "dufs.cli", "select", str(tmp_path / "s.zarr"), "-m", "fisher",
                          "-k", "3", "--scheduler", "tcp://127.0.0.1:1"], capture_output=True, timeout=patience(120),
                         env={**ENV, "DASK_DUFS__CLUSTER__CONNECT_TIMEOUT": "2s"})
    assert res.returncode == 2 and res.stdout == b""
    # distributed names the timeout it used: the environment's 2 s, not its default 30 s (no wall-clock check: on a
    # loaded machine the interpreter's start-up alone can take longer than that)
    assert res.stderr.decode() == ("error: cannot connect to the Dask scheduler at tcp://127.0.0.1:1: Timed out "
                                   "trying to connect to tcp://127.0.0.1:1 after 2 s\n")


@pytest.mark.slow
def test_select_on_a_running_scheduler(stores, cluster_client):
    """A reachable --scheduler: the connection check lets it through and the work runs there."""
    address = cluster_client.scheduler.address
    res = run("select", stores / "s.zarr", "-m", "fisher", "-k", "3", "--scheduler", address)
    assert res.stdout.startswith("fisher: 3 features of 10")
    assert "on 2 workers" in res.stderr


def test_info(tmp_path, text):
    src = write(tmp_path / "in.svm", text)
    out = tmp_path / "out.zarr"
    run("convert", src, out, "--workers", "0")
    res = run("info", out)
    assert "200 rows x 50 features" in res.stdout
    assert "labels" in res.stdout and "source=libsvm" in res.stdout
    d = json.loads(run("info", out, "--json", "--top", "3").stdout)
    st = dufs.open(out)
    assert d["shape"] == [200, 50] and d["nnz"] == st.nnz and d["path"] == str(out)
    assert len(d["top_features"]) == 3
    assert d["top_features"][0][1] == int(st.feature_nnz.max())
    assert sum(d["labels"].values()) == 200
    assert d["provenance"]["inputs"] == [str(src)]
    res = run("info", tmp_path / "nothing.zarr", code=2)
    assert "no dufs store" in res.stderr
    # an interrupted build: info says how to resume
    from dufs.data.builder import StoreBuilder

    b = StoreBuilder(tmp_path / "half.zarr")
    b.begin()
    b.abort(remove=False)
    res = run("info", tmp_path / "half.zarr", code=2)
    assert "--resume" in res.stderr


def test_make_synthetic_and_info(tmp_path):
    out = tmp_path / "syn.zarr"
    res = run("make-synthetic", out, "--rows", "2000", "--features", "5000", "--workers", "0")
    assert res.stdout.strip() == str(out)
    st = dufs.open(out)
    assert st.shape == (2000, 5000)
    res = run("info", out)
    assert "2,000 rows x 5,000 features" in res.stdout
    assert "ground truth" in res.stdout
    d = json.loads(run("info", out, "--json").stdout)
    assert d["shape"] == [2000, 5000]
    assert d["ground_truth"]["informative"] == st.ground_truth["informative"]
    assert len(d["ground_truth"]["informative"]) == 20 and d["ground_truth"]["seed"] == 0
    res = run("make-synthetic", out, "--rows", "2000", "--features", "5000", "--workers", "0", code=2)
    assert "exists" in res.stderr
    clu = tmp_path / "clu.zarr"
    run("make-synthetic", clu, "--rows", "2000", "--features", "5000", "--clusters", "3", "--workers", "0")
    assert "3 clusters (the labels), each with 20 features of its own" in run("info", clu).stdout
    d = json.loads(run("info", clu, "--json").stdout)["ground_truth"]
    assert d["cluster_features"] == dufs.open(clu).ground_truth["cluster_features"] and len(d["cluster_features"]) == 3
    assert sorted(set(dufs.open(clu).y.tolist())) == [0.0, 1.0, 2.0]


def test_convert_runs_small_inputs_on_threads(tmp_path, text, monkeypatch):
    """No --workers and no --scheduler: inputs of at most ``dufs.convert.local-bytes`` (a compressed file counted at
    5 times its size) convert on this process's threads, saying so; larger ones on the embedded cluster
    (``cluster`` called with workers None)."""
    import dufs.cli.stores

    calls = _record_clusters(monkeypatch, dufs.cli.stores)
    src = write(tmp_path / "in.svm", text)
    res = run("convert", src, tmp_path / "out.zarr", "--block-bytes", "3000")
    assert calls == [(None, 0)] and "the input is small" in " ".join(res.stderr.split())
    assert_loads_as_sklearn(tmp_path / "out.zarr", text)
    gz = write(tmp_path / "in.svm.bz2", text)
    for limit, want in ((len(text) - 1, None), (5 * gz.stat().st_size, 0), (5 * gz.stat().st_size - 1, None)):
        with dask.config.set({"dufs.convert.local-bytes": limit}):
            source = src if limit == len(text) - 1 else gz
            res = run("convert", source, tmp_path / f"o{len(calls)}.zarr", code=0 if want == 0 else 1)
        assert calls[-1] == (None, want) and ("the input is small" in res.stderr) == (want == 0)


@pytest.mark.slow
def test_convert_on_the_default_local_cluster(tmp_path, text):
    """No --workers, an input larger than ``dufs.convert.local-bytes``: an embedded LocalCluster of processes (one
    worker a core)."""
    src = write(tmp_path / "in.svm", text)
    out = tmp_path / "out.zarr"
    res = subprocess.run([sys.executable, "-m", "dufs.cli", "convert", str(src), str(out), "--block-bytes",
                          "3000"], env={**ENV, "DASK_DUFS__CONVERT__LOCAL_BYTES": "100"}, capture_output=True,
                         timeout=patience(300))
    assert res.returncode == 0, res.stderr.decode()
    assert res.stdout.decode().strip() == str(out)
    assert_loads_as_sklearn(out, text)
    assert dufs.open(out).n_blocks("csr") > 3


@pytest.mark.slow
def test_convert_on_two_workers(tmp_path, text):
    a = write(tmp_path / "a.svm.bz2", text)
    b_text = text_of(120, 40, seed=3)
    b = write(tmp_path / "b.svm", b_text)
    res = run("convert", a, b, tmp_path / "each", "--each", "--workers", "2", "--block-bytes", "2500")
    assert res.stdout.split() == [str(tmp_path / "each" / "a.zarr"), str(tmp_path / "each" / "b.zarr")]
    assert_loads_as_sklearn(tmp_path / "each" / "a.zarr", text, n_features=50)
    assert_loads_as_sklearn(tmp_path / "each" / "b.zarr", b_text, n_features=50)
    # an error on the cluster: exit code 2 naming the line, nothing left behind
    lines = text.splitlines(keepends=True)
    lines[99] = b"1 5:1e400\n"
    src = write(tmp_path / "bad.svm", b"".join(lines))
    res = run("convert", src, tmp_path / "bad.zarr", "--workers", "2", "--block-bytes", "2500", code=2)
    assert f"{src}:100: a feature value is nan or infinite" in res.stderr
    assert not (tmp_path / "bad.zarr").exists() and not (tmp_path / "bad.zarr.dufs-partial").exists()


def test_version_names_dufs_and_the_libraries_it_runs_on():
    """``dufs --version``: dufs's version, then dask's, distributed's, numpy's, scipy's, zarr's, numba's and
    scikit-learn's, then Python's, one a line."""
    import platform
    from importlib.metadata import version

    res = run("--version")
    lines = res.stdout.splitlines()
    assert lines[0] == f"dufs {dufs.__version__}"
    names = ("dask", "distributed", "numpy", "scipy", "zarr", "numba", "scikit-learn")
    assert lines[1:-1] == [f"{name} {version(name)}" for name in names]
    assert lines[-1] == f"python {platform.python_version()}"
