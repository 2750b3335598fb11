"""Vectors kept in a worker's memory between passes (dufs.engine.kept): what stays there, what comes back, what a
lost worker's vectors say, and that they are dropped once let go."""

from __future__ import annotations

import gc

import dask
import numpy as np
import pytest

from dufs.engine import kept
from dufs.engine.cluster import is_lost


def _halves(v):
    """Keeps v's two halves; brings back their sums."""
    h = v.shape[0] // 2
    return (float(v[:h].sum()), float(v[h:].sum())), [v[:h].copy(), v[h:].copy()]


def _dot(a, b):
    return float(a @ b), []


def _kept_tokens():
    return sorted(kept._KEPT)


def _forget():
    kept._KEPT.clear()


def test_a_call_keeps_its_arrays_on_its_worker_and_brings_back_only_its_result(cluster_client):
    client = cluster_client
    v = np.arange(10.0)
    f = client.scatter(v, hash=False, workers=[sorted(client.scheduler_info()["workers"])[0]])
    small, (a, b) = kept.kept_call(client, _halves, f, keep=2)
    assert small == (10.0, 35.0)
    assert a.address == b.address == next(iter(client.who_has([f])[f.key]))
    held = client.run(_kept_tokens)
    assert {a.token, b.token} <= set(held[a.address])
    assert not {a.token, b.token} & {t for w, ts in held.items() if w != a.address for t in ts}
    np.testing.assert_array_equal(kept.fetch(client, b), v[5:])
    # two kept vectors in one call, on their worker: the values themselves (a^T b by NumPy)
    assert kept.kept_call(client, _dot, a, b)[0] == float(v[:5] @ v[5:])
    tokens = {a.token, b.token}
    del a, b, f
    gc.collect()
    kept.flush(client)
    assert not tokens & {t for ts in client.run(_kept_tokens).values() for t in ts}


def test_a_vector_kept_on_another_worker_is_brought_to_the_call(cluster_client):
    client = cluster_client
    w0, w1 = sorted(client.scheduler_info()["workers"])[:2]
    # large enough that the scheduler runs each call where its argument is (a few bytes may go anywhere)
    x = client.scatter(np.ones(1 << 20), hash=False, workers=[w0])
    y = client.scatter(np.full(1 << 20, 2.0), hash=False, workers=[w1])
    _, (kx,) = kept.kept_call(client, lambda v: (None, [v]), x, keep=1)
    _, (ky,) = kept.kept_call(client, lambda v: (None, [v]), y, keep=1)
    assert (kx.address, ky.address) == (w0, w1)
    assert kept.kept_call(client, _dot, kx, ky)[0] == 2.0 * (1 << 20)


def test_a_lost_vector_says_it_was_lost(cluster_client):
    client = cluster_client
    _, (k,) = kept.kept_call(client, lambda v: (None, [v]), client.scatter(np.ones(4), hash=False), keep=1)
    client.run(_forget)
    with pytest.raises(Exception) as err:
        kept.kept_call(client, _dot, k, k)
    assert is_lost(err.value)
    with pytest.raises(Exception) as err:
        kept.fetch(client, k)
    assert is_lost(err.value)


def test_kept_vectors_are_used_where_workers_are_on_several_machines_or_when_asked(cluster_client):
    client = cluster_client
    assert not kept.kept_vectors(None)
    assert not kept.kept_vectors(client)  # one machine, its results through /dev/shm
    with dask.config.set({"dufs.engine.shared-memory": "off"}):
        assert not kept.kept_vectors(client)  # auto: one machine
        with dask.config.set({"dufs.engine.kept-vectors": "on"}):
            assert kept.kept_vectors(client)
    with dask.config.set({"dufs.engine.kept-vectors": "on"}):
        assert not kept.kept_vectors(client)  # the results come back through /dev/shm: nothing to keep
