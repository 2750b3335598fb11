"""A greedy selection killed by SIGKILL resumes from its checkpoint (the selected sequence every step, the blocks'
candidate numbers every ``checkpoint_every`` steps) and ends exactly where an uninterrupted run does."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import dask
import numpy as np
import pytest
import scipy.sparse as sp

from dufs.data import write_store
from dufs.engine import Matrix
from dufs.errors import ParameterError
from dufs.methods.greedy import lapofs
from dufs.testing import patience


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    rng = np.random.default_rng(7)
    X = sp.random(300, 400, density=0.08, random_state=rng, format="csr") * 10.0
    path = tmp_path_factory.mktemp("greedy") / "x.zarr"
    write_store(sp.csr_array(X), path, y=np.zeros(300))
    return str(path), X


def _steps(path) -> int:
    try:
        with open(path) as f:
            return len(json.load(f)["indices"])
    except (OSError, ValueError):
        return 0


@pytest.mark.parametrize("every,criterion", [(1, "A"), (3, "A"), (3, "D")])
def test_killed_job_resumes_without_repeating_finished_steps(store, tmp_path, every, criterion):
    path, X = store
    ck = tmp_path / "ck"
    k = 40
    script = textwrap.dedent(f"""
        import logging, time
        import dask
        from dufs.engine import Matrix
        from dufs.methods.greedy import lapofs

        class Slow(logging.Handler):
            def emit(self, record):
                time.sleep(0.05)

        lg = logging.getLogger("dufs.methods.greedy.run")
        lg.setLevel(logging.DEBUG)
        lg.addHandler(Slow())
        with dask.config.set(scheduler="sync"):
            lapofs(Matrix({path!r}), n_features={k}, criterion={criterion!r}, n_neighbors=4,
                   checkpoint={str(ck)!r}, checkpoint_every={every})
        print("FINISHED")
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + patience(90)
        while time.time() < deadline and proc.poll() is None and _steps(ck / "selection.json") < 15:
            time.sleep(0.02)
        assert proc.poll() is None, proc.communicate()
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    done = _steps(ck / "selection.json")
    assert 15 <= done < k
    # a step's block files hold what changes (LapDOFS's v stays 0); the thresholds are written once a block
    steps = sorted(ck.glob("block-*-*.npz"))
    assert steps and len(list(ck.glob("block-*-tiny.npy"))) == len({f.name.split("-")[1] for f in steps})
    with np.load(steps[0]) as z:
        assert set(z.files) == ({"s", "sel", "step"} if criterion == "D" else {"s", "v", "sel", "step"})
    with dask.config.set(scheduler="sync"):
        ref = lapofs(Matrix(path), n_features=k, criterion=criterion, n_neighbors=4, checkpoint=None)
        res = lapofs(Matrix(path), n_features=k, criterion=criterion, n_neighbors=4, checkpoint=str(ck),
                     checkpoint_every=every, resume=True)
    np.testing.assert_array_equal(res.indices, ref.indices)
    np.testing.assert_allclose(res.criterion, ref.criterion, rtol=1e-10)
    np.testing.assert_allclose(res.objective, ref.objective, rtol=1e-10)
    # the finished steps were not chosen again; at most every - 1 update passes were replayed
    assert res.diagnostics["resumed_steps"] >= done - 1
    assert res.diagnostics["passes_replayed"] <= every - 1 + 1
    # a checkpoint of another problem is refused, naming the file
    with dask.config.set(scheduler="sync"), pytest.raises(ParameterError, match="selection.json"):
        lapofs(Matrix(path), n_features=k, criterion=criterion, lambda2=0.5, n_neighbors=4, checkpoint=str(ck),
               resume=True)


@pytest.mark.parametrize("criterion", ["A", "D"])
@pytest.mark.parametrize("standardize", [None, "zscore"])
def test_anchor_graph_matches_its_dense_form_and_the_paper(criterion, standardize):
    """The anchor-graph path (x^T W x through Zh, B r through the factored Laplacian and Zh^T Z_S kept a step at a
    time) selects what the same graph given densely does, and what the paper's sample-space algorithm does with
    it, on the raw columns and on standardized ones (the transform applied implicitly)."""
    from dufs.engine.graphs import anchor_graph
    from tests.methods.greedy_paper import lapaofs_paper, lapdofs_paper

    rng = np.random.default_rng(3)
    X = rng.standard_normal((150, 40)) * rng.uniform(0.5, 3.0, 40) + rng.uniform(-1.0, 1.0, 40)
    Xz = X if standardize is None else (X - X.mean(axis=0)) / X.std(axis=0)
    with dask.config.set(scheduler="sync"):
        M = Matrix(X, block_width=9, standardize=standardize)
        A = anchor_graph(M, 20, 3, embed_dim=8, random_state=0)
        a = lapofs(M, n_features=15, criterion=criterion, W=A, checkpoint=None)
        b = lapofs(Matrix(X, block_width=13, standardize=standardize), n_features=15, criterion=criterion,
                   W=sp.csr_array(A.toarray()), checkpoint=None)
    ref = (lapaofs_paper if criterion == "A" else lapdofs_paper)(Xz, A.toarray(), 15)
    np.testing.assert_array_equal(a.indices, b.indices)
    np.testing.assert_array_equal(a.indices, ref[0])
    np.testing.assert_allclose(a.criterion, ref[1], rtol=1e-8)
