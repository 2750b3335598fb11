"""A real `dask scheduler` and two `dask worker` processes started from the command line: `dufs convert
--scheduler` runs its parse tasks on them."""

from __future__ import annotations

import io
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.datasets import dump_svmlight_file, load_svmlight_file

import dufs
from dufs.testing import patience
from tests._scripts import console_script

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def dask_cluster_processes(tmp_path):
    dask_cli = console_script("dask")  # beside this interpreter, whatever PATH holds (issue 60)
    assert dask_cli is not None, "dask's command line is not installed (it comes with dask, a dependency)"
    port = _free_port()
    addr = f"tcp://127.0.0.1:{port}"
    procs = [subprocess.Popen([*dask_cli, "scheduler", "--host", "127.0.0.1", "--port", str(port),
                               "--no-dashboard"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    try:
        for _ in range(2):
            procs.append(subprocess.Popen([*dask_cli, "worker", addr, "--nworkers", "1", "--nthreads", "1",
                                           "--no-dashboard", "--local-directory", str(tmp_path / "w")],
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        from distributed import Client

        deadline = time.monotonic() + patience(60)
        while True:
            try:
                with Client(addr, timeout=patience(5)) as c:
                    c.wait_for_workers(2, timeout=patience(60))
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        yield addr
    finally:
        # the workers first, each waited for, then the scheduler: a worker whose scheduler went first with it
        # spent about 8 s trying to reach it before it exited
        for p in reversed(procs):
            p.terminate()
            try:
                p.wait(timeout=patience(20))
            except subprocess.TimeoutExpired:
                p.kill()


def test_convert_runs_on_a_command_line_cluster(tmp_path, dask_cluster_processes):
    addr = dask_cluster_processes
    rng = np.random.default_rng(5)
    X = sp.random(3000, 400, density=0.03, format="csr", random_state=rng)
    y = rng.integers(0, 2, 3000) * 2 - 1
    buf = io.BytesIO()
    dump_svmlight_file(X, y, buf, zero_based=False)
    src = tmp_path / "in.svm"
    src.write_bytes(buf.getvalue())
    out = tmp_path / "out.zarr"
    res = subprocess.run([sys.executable, "-m", "dufs.cli", "convert", str(src), str(out), "--scheduler", addr,
                          "--dtype", "float64", "--block-bytes", "20000"], capture_output=True, text=True,
                         timeout=patience(300))
    assert res.returncode == 0, res.stderr
    st = dufs.open(out)
    Xs, ys = load_svmlight_file(str(src))
    assert (st.to_scipy("csr") != Xs).nnz == 0 and (st.to_scipy("csc") != Xs).nnz == 0
    assert np.array_equal(st.y, ys)
    assert st.n_blocks("csr") > 2
    # the parse tasks ran on the command-line workers
    from distributed import Client

    with Client(addr) as c:
        done = c.run_on_scheduler(lambda dask_scheduler: sorted(
            {str(t[0]).split("-")[0] for t in dask_scheduler.transition_log}))
    assert "_parse_and_write" in done, done


def test_select_runs_on_a_command_line_cluster(tmp_path, dask_cluster_processes):
    """`dufs select --scheduler` on a real scheduler + 2 workers: the blocks are persisted there (not on an
    embedded cluster) and the selection equals a dense NumPy Fisher score."""
    addr = dask_cluster_processes
    rng = np.random.default_rng(11)
    X = sp.random(1500, 300, density=0.05, format="csr", random_state=rng, dtype=np.float64)
    y = rng.integers(0, 3, 1500).astype(np.float64)
    X = X + sp.csr_matrix((y[:, None] * (np.arange(300) % 7 == 0)).astype(np.float64) * 0.3)
    store = tmp_path / "s.zarr"
    import dask

    with dask.config.set({"dufs.store.feature-block-nnz": 4000, "dufs.store.feature-granule": 50}):
        dufs.write_store(sp.csr_array(X), store, y, value_dtype=np.float64)
    out = tmp_path / "sel.json"
    res = subprocess.run([sys.executable, "-m", "dufs.cli", "select", str(store), "--method", "fisher", "-k", "30",
                          "--scheduler", addr, "-o", str(out)], capture_output=True, text=True, timeout=patience(300))
    assert res.returncode == 0, res.stderr
    sel = dufs.Selection.from_json(out)
    assert sel.diagnostics["n_workers"] == 2 and sel.diagnostics["blocks"]["mode"] == "persisted"
    assert sel.diagnostics["n_blocks"] > 2
    D = X.toarray()
    classes = np.unique(y)
    mu = D.mean(0)
    sb = sum((y == c).sum() * (D[y == c].mean(0) - mu) ** 2 for c in classes)
    sw = sum((y == c).sum() * D[y == c].var(0) for c in classes)
    want = np.argsort(-(sb / sw), kind="stable")[:30]
    assert sel.indices.tolist() == want.tolist()
