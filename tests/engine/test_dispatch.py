"""Which client a pass runs on (``dufs.scheduling``, ``dufs.engine.dispatch``): one decision, honoured everywhere.

Inside an active ``distributed.Client``, ``dufs.fit(..., client=False)`` runs in this process: nothing is scattered
to, or computed on, the active cluster. Before the decision lived in one place, the Laplacian score and MMFS failed
there with "Missing dependency" (an argument scattered to the client while the pass ran with ``scheduler="sync"``).
"""

from __future__ import annotations

import dask
import numpy as np
import pytest
from dask.delayed import Delayed
from distributed import Future

import dufs
from dufs.api import METHODS
from dufs.engine import dispatch
from dufs.scheduling import current_client, distributed_client

X = np.random.default_rng(0).random((300, 20))
Y = np.arange(300) % 2


@pytest.mark.parametrize("method", sorted(METHODS))
def test_client_false_inside_an_active_client(cluster_client, method):
    kw = {"n_clusters": 2} if method in ("jcfs", "ufcm", "m3fs") else {}
    y = Y if METHODS[method].supervised else None
    ref = dufs.fit(X, y, method=method, n_features=5, client=False, **kw)  # no client is active here
    with cluster_client.as_current():
        before = set(cluster_client.who_has())
        sel = dufs.fit(X, y, method=method, n_features=5, client=False, **kw)
        # nothing was scattered to or computed on the cluster (keys of earlier tests may go meanwhile)
        assert set(cluster_client.who_has()) <= before
    assert sel.diagnostics["n_workers"] == 0
    np.testing.assert_array_equal(sel.indices, ref.indices)
    np.testing.assert_array_equal(sel.scores, ref.scores)


def test_the_active_client_runs_a_pass_unless_dask_config_says_otherwise(cluster_client):
    with cluster_client.as_current():
        assert distributed_client() is cluster_client and current_client() is cluster_client
        for local in ("sync", "threads", "synchronous"):
            with dask.config.set(scheduler=local):
                assert current_client() is None and distributed_client() is cluster_client
                big = np.zeros(1 << 14)
                key = dispatch.ship(big)
                assert isinstance(key, Delayed) and not isinstance(key, Future)  # a graph key, not scattered
                with dispatch.shipped(big) as got:
                    assert got is big  # nothing scattered


def test_inline_passes_take_values():
    with dispatch.inline_pass(True):
        assert dispatch.is_inline()
        f = dispatch.delayed(np.add)
        assert f is np.add
        assert dispatch.tree_sum([1, 2, 3, 4, 5]) == 15
        assert dispatch.compute([1, 2]) == [1, 2]
        big = np.zeros(1 << 14)
        assert dispatch.ship(big) is big
    assert not dispatch.is_inline()
    parts = [dask.delayed(v) for v in (1.0, 2.0, 3.0)]
    assert dispatch.compute([dispatch.tree_sum(parts)]) == [6.0]
    assert dispatch.tree_sum_values([0.1, 0.2, 0.3]) == (0.1 + 0.2) + 0.3


@pytest.mark.parametrize("count", [1, 2, 3, 5, 8, 11])
def test_tree_sum_into_adds_the_same_pairs_as_the_tree_of_values(count):
    """The in-place tree (a matrix product's per-block partials summed in their results file) gives exactly the
    numbers of the tree of fresh sums, pair for pair (values of mixed magnitudes, so that another order would show
    in the last bits), and the plain sum within rounding; ``out`` is what it returns."""
    rng = np.random.default_rng(count)
    vals = [rng.standard_normal((50, 3)) * 10.0 ** rng.integers(-8, 8, size=(50, 3)) for _ in range(count)]
    ref = dispatch.tree_sum_values([v.copy() for v in vals])
    out = np.empty((50, 3))
    got = dispatch.tree_sum_into([v.copy() for v in vals], out)
    assert got is out
    np.testing.assert_array_equal(got, ref)
    np.testing.assert_allclose(got, np.sum(vals, axis=0), rtol=1e-12, atol=1e-12 * np.abs(vals).max())
