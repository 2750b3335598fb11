"""get_client: the given client, the active one, a scheduler address, or an embedded LocalCluster of processes."""

from __future__ import annotations

import os

import pytest
from distributed import Client, LocalCluster

from dufs.engine.cluster import get_client
from dufs.errors import ParameterError
from dufs.scheduling import distributed_client


def test_synchronous_needs_no_cluster():
    with get_client(synchronous=True) as c:
        assert c is None


def test_given_and_active_clients_are_used_and_left_open(cluster_client):
    with get_client(cluster_client) as c:
        assert c is cluster_client
    assert cluster_client.status == "running"
    with cluster_client.as_current():
        assert distributed_client() is cluster_client
        with get_client() as c:
            assert c is cluster_client
    assert cluster_client.status == "running"


def test_scheduler_address_connects_and_closes_only_its_client(cluster_client):
    addr = cluster_client.scheduler.address
    with get_client(scheduler_address=addr) as c:
        assert c is not cluster_client and c.scheduler.address == addr
        assert c.submit(os.getpid).result() != os.getpid()  # ran in a worker process
    assert c.status == "closed"
    assert cluster_client.status == "running"


def _housekeeping(dask_worker=None, dask_scheduler=None):
    server = dask_worker or dask_scheduler
    return server._tick_interval, "profile" in server.periodic_callbacks


def test_embedded_local_cluster_of_processes_is_closed_afterwards():
    """Its workers are processes; its scheduler and workers run under dufs.cluster.dask-config (the workers'
    profiler off, a tick every 0.5 s), this process's config untouched; {} keeps Dask's defaults."""
    import dask

    before = dask.config.get("distributed.admin.tick.interval")
    with get_client(n_workers=2) as c:
        pids = set(c.run(os.getpid).values())
        assert len(pids) == 2 and os.getpid() not in pids
        assert set(c.run(_housekeeping).values()) == {(0.5, False)}
        assert c.run_on_scheduler(_housekeeping)[0] == 0.5
        assert dask.config.get("distributed.admin.tick.interval") == before
        cluster = c.cluster
    assert c.status == "closed" and cluster.status.name == "closed"
    default = dask.config.get("distributed.admin.tick.interval", override_with=None)
    with dask.config.set({"dufs.cluster.dask-config": {}}), get_client(n_workers=1) as c:
        tick, profiled = next(iter(c.run(_housekeeping).values()))
        assert tick == dask.utils.parse_timedelta(default, default="ms") and profiled == dask.config.get(
            "distributed.worker.profile.enabled")
    with dask.config.set({"dufs.cluster.dask-config": "fast"}), \
            pytest.raises(ParameterError, match="dufs.cluster.dask-config must be a mapping"), get_client(n_workers=1):
        pass


def test_bad_client_is_refused():
    with pytest.raises(ParameterError, match="'client' parameter"), get_client("tcp://x"):
        pass


def test_local_cluster_fixture_is_a_real_cluster(cluster_client):
    assert isinstance(cluster_client, Client) and isinstance(cluster_client.cluster, LocalCluster)


def test_persist_waits_for_a_worker_and_names_an_empty_cluster():
    """A cluster still starting (no workers yet) is waited for; one that stays empty is a clear error."""
    import dask
    import numpy as np

    from dufs.engine import Matrix

    X = np.arange(12.0).reshape(4, 3)
    with (LocalCluster(n_workers=0, processes=True, dashboard_address=":0", silence_logs=50) as cluster,
          Client(cluster, set_as_default=False) as client, client.as_current()):
        with dask.config.set({"dufs.engine.wait-for-workers": "0.5s"}), \
                pytest.raises(ParameterError, match=f"{cluster.scheduler_address} has no workers"):
            Matrix(X).persist()
        cluster.scale(1)  # starts in the background; persist waits for it
        M = Matrix(X, block_width=2).persist()
        assert M.residency["mode"] == "persisted" and M.residency["n_workers"] == 1
        np.testing.assert_allclose(M.matvec(np.ones(3)), X.sum(1))
