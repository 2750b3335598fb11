"""A method that fails inside a user's own Client leaves nothing of dufs behind: no keys on the scheduler, no state
kept on the workers by direct calls, no files in /dev/shm, no pooled buffers (on the workers or here)."""

from __future__ import annotations

import os

import dask
import numpy as np
import pytest
import scipy.sparse as sp

import dufs
from dufs.engine.progress import on_pass

pytestmark = pytest.mark.slow

METHODS = {"mmfs": {}, "lapaofs": {}, "jcfs": {}, "ufcm": {}, "m3fs": {"solver": "alternating"}, "laplacian": {}}


class Boom(RuntimeError):
    pass


def _shm_files() -> list[str]:
    return sorted(f for f in os.listdir("/dev/shm") if f.startswith("dufs-")) if os.path.isdir("/dev/shm") else []


def _worker_leftovers(dask_worker=None) -> dict:
    from dufs.engine import buffers, direct

    return {"resident": len(direct._RESIDENT), "pooled": buffers.pooled_bytes(), "shm": _shm_files(),
            "data": sorted(str(k) for k in dask_worker.data)}


def _scheduler_keys(dask_scheduler=None) -> list[str]:
    return sorted(str(k) for k in dask_scheduler.tasks)


def _data():
    rng = np.random.default_rng(0)
    X = sp.random(2000, 3000, density=0.01, format="csr", random_state=1, dtype=np.float64)
    X = sp.csr_array(X)
    y = rng.integers(0, 2, 2000)
    return X, y


@pytest.mark.parametrize("method", list(METHODS))
def test_a_method_that_raises_in_a_users_client_leaves_nothing_behind(cluster_client, tmp_path, method,
                                                                      monkeypatch):
    """The method is stopped mid-run: at its third finished pass or third call of map_blocks (a solver's round or
    step, with state kept on the workers), whichever comes first."""
    from dufs.data import write_store
    from dufs.engine import Matrix, buffers

    X, y = _data()
    path = tmp_path / "s.zarr"
    write_store(X, path, y=y, feature_block=500)
    before_keys = cluster_client.run_on_scheduler(_scheduler_keys)
    before_shm = _shm_files()
    before = cluster_client.run(_worker_leftovers)  # what earlier tests on this cluster left, if anything
    seen = []

    def count(what):
        seen.append(what)
        if len(seen) == 3:
            raise Boom(f"stopped after {seen}")

    def fail_later(name, done, total):
        if done == total:
            count(name)

    map_blocks = Matrix.map_blocks

    def map_then_fail(self, *args, **kwargs):
        out = map_blocks(self, *args, **kwargs)
        count("map_blocks")
        return out

    monkeypatch.setattr(Matrix, "map_blocks", map_then_fail)

    params = {**METHODS[method], **({"checkpoint": None} if method in ("mmfs", "lapaofs") else {})}
    with dask.config.set({"dufs.engine.shared-memory-bytes": 1}), on_pass(fail_later), pytest.raises(Boom):
        dufs.fit(str(path), y, method=method, n_features=5, client=cluster_client, **params)
    assert cluster_client.run_on_scheduler(_scheduler_keys) == before_keys
    for addr, left in cluster_client.run(_worker_leftovers).items():
        assert left["data"] == before[addr]["data"] and left["shm"] == before_shm, addr
        assert left["resident"] <= before[addr]["resident"] and left["pooled"] == 0, addr
    assert _shm_files() == before_shm
    assert buffers.pooled_bytes() == 0
