"""The emulated multi-machine cluster (issue 57): machines in network namespaces that dufs must treat as remote,
their links counted, and nothing left behind."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest
import scipy.sparse as sp

import dufs
from dufs.testing.emulated import EmulatedCluster, unavailable

pytestmark = [pytest.mark.slow, pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))]


def _leftovers(token: str) -> list[str]:
    """Namespaces and links of the cluster ``token`` still on this machine."""
    ns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    return [line for line in (ns + links).splitlines() if token in line]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    rng = np.random.default_rng(3)
    X = sp.random(3000, 600, density=0.02, format="csr", random_state=rng, dtype=np.float64)
    y = np.where(X[:, :10].sum(axis=1) > 0, 1.0, -1.0)
    path = tmp_path_factory.mktemp("emulated") / "x.zarr"
    dufs.write_store(X, path, y, feature_block=100)
    return str(path)


def test_machines_are_remote_their_links_counted_and_removed(store):
    from distributed import Client

    from dufs.engine.shm import workers_share_memory

    want = {m: dufs.fit(store, method=m, n_features=15) for m in ("variance", "fisher")}
    with EmulatedCluster(machines=2, procs=1) as cluster:
        token = cluster.token
        assert _leftovers(token)
        with Client(cluster.address) as client:
            # the workers do not see this process's /dev/shm: every shortcut of a shared machine is off
            assert workers_share_memory(client) == 0
            hosts = {w["host"] for w in client.scheduler_info(n_workers=-1)["workers"].values()}
            assert hosts == set(cluster.machine_addresses)
            before = cluster.link_bytes()
            got = {m: dufs.fit(store, method=m, n_features=15, client=client) for m in want}
            moved = EmulatedCluster.since(before, cluster.link_bytes())
    for m, sel in got.items():
        np.testing.assert_array_equal(sel.indices, want[m].indices)
        np.testing.assert_allclose(sel.scores, want[m].scores, rtol=1e-12)
    # every machine read its blocks' tasks and sent results back over its link
    assert all(b.into > 0 and b.out_of > 0 for b in moved), moved
    assert _leftovers(token) == []


def test_a_cluster_that_cannot_start_leaves_nothing():
    cluster = EmulatedCluster(machines=2, procs=1, memory_limit="not-a-size")
    with pytest.raises(RuntimeError, match="ended|did not get"):
        with cluster:
            pass
    assert _leftovers(cluster.token) == []


_HOLD = """
import sys, time
from dufs.testing.emulated import EmulatedCluster
with EmulatedCluster(machines=1, procs=1) as c:
    print(c.token, flush=True)
    time.sleep(600)
"""


@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL"])
def test_a_killed_driver_leaves_nothing_for_long(how):
    """SIGTERM: the cluster cleans up before the driver exits; SIGKILL: the next cluster (or remove_leftovers)
    removes what the dead driver left."""
    import signal
    import sys

    from dufs.testing import patience
    from dufs.testing.emulated import remove_leftovers

    p = subprocess.Popen([sys.executable, "-c", _HOLD], stdout=subprocess.PIPE, text=True)
    try:
        token = p.stdout.readline().strip()
        assert token and _leftovers(token)
        p.send_signal(getattr(signal, how))
        p.wait(timeout=patience(60))
    finally:
        if p.poll() is None:
            p.kill()
    if how == "SIGTERM":
        assert p.returncode != 0 and _leftovers(token) == []
    else:
        assert _leftovers(token)  # nothing ran: the namespaces are still there
        assert token in remove_leftovers()
        assert _leftovers(token) == []
