"""Sums over machines in pieces, peer to peer (:mod:`dufs.engine.exchange`): the pieces added where they arrive
equal the fixed tree's sum of the whole partials, bit for bit, for arrays and for MMFS's partition results; a
receiver that lost its pieces says so. An all-reduce among tasks running at once gives every rank the tree's sum,
bit for bit, and a rank that fails or never comes makes the others give up rather than wait."""

from __future__ import annotations

import dask
import numpy as np
import pytest

from dufs.engine.direct import HeldLost
from dufs.engine.dispatch import tree_sum_values
from dufs.engine.exchange import WHOLE_BYTES, _reduce, abort_exchange, allreduce_sum, ensure_plugin, reduce_scatter_sum
from dufs.methods.mmfs.records import PartitionResult, RoundTotals


@pytest.fixture(scope="module")
def client():
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=3, threads_per_worker=2, processes=True, dashboard_address=None) as lc, \
            Client(lc) as c:
        ensure_plugin(c)
        yield c


def _sum(client, parts):
    workers = sorted(client.scheduler_info(n_workers=-1)["workers"])
    level = [dask.delayed(np.copy if isinstance(p, np.ndarray) else _same, pure=False)(p) for p in parts]
    return client.compute(reduce_scatter_sum(level, workers, client)).result()


def _same(x):
    return x


@pytest.mark.parametrize("shape", [(100_003,), (40_001, 3), (7,), (WHOLE_BYTES // 8 - 1,)])
def test_arrays_sum_as_the_tree_does(client, shape):
    rng = np.random.default_rng(sum(shape))
    parts = [rng.standard_normal(shape) * 10.0 ** rng.integers(-8, 8, shape) for _ in range(3)]
    got = _sum(client, parts)
    want = tree_sum_values(parts)
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    assert not np.array_equal(got, (parts[0] + parts[2]) + parts[1])  # the order is the tree's, and it matters


def _partition(i, m, dense):
    rng = np.random.default_rng(i)
    v = np.zeros(m)
    idx = rng.choice(m, m // 2 if dense else 40, replace=False)
    v[idx] = rng.standard_normal(idx.size)
    return PartitionResult.of(v, RoundTotals(dt=0.1 * i, updates=1.0, tlo=-1.0 - i, thi=2.0 + i), [("cols", i)])


@pytest.mark.parametrize("m", [100, 100_000])
def test_mmfs_partition_results_sum_as_the_tree_does(client, m):
    """Dense and sparse changes of w mixed (a machine's partial may be either): the dense sum, the totals (with
    their max and min) and the working sets are the tree's."""
    parts = [_partition(0, m, True), _partition(1, m, False), _partition(2, m, True)]
    got = _sum(client, parts)
    want = tree_sum_values(parts)
    assert got.m == m
    np.testing.assert_array_equal(got.dense(), want.dense())
    assert got.tail == want.tail
    assert got.cols == want.cols


def test_a_receiver_without_its_pieces_says_they_were_lost():
    with pytest.raises(HeldLost, match="was lost"):
        _reduce([(0, False), (1, False), (2, False)], 1, "no-such-exchange")


def _rank(value, token, rank, peers, fail, timeout):
    if fail:
        raise RuntimeError("this rank failed before it sent")
    return allreduce_sum(value, token, rank, peers, timeout=timeout)


def _allreduce(client, values, peers, token, fail=(), timeout=60.0):
    return [client.submit(_rank, v, token, r, peers, r in fail, timeout, workers=[peers[r]], pure=False)
            for r, v in enumerate(values)]


@pytest.mark.parametrize("W", [1, 2, 3, 5, 6])
def test_an_allreduce_gives_every_rank_the_tree_sum(client, W):
    """Ranks on three processes (two a process from W = 4: sent in place there): every rank gets the sum of
    :func:`tree_sum_values`, the same bits; values of mixed magnitudes, so that another order would differ."""
    workers = sorted(client.scheduler_info(n_workers=-1)["workers"])
    peers = [workers[r % len(workers)] for r in range(W)]
    rng = np.random.default_rng(W)
    values = [rng.standard_normal(9) * 10.0 ** rng.integers(-12, 12, 9) for _ in range(W)]
    got = client.gather(_allreduce(client, values, peers, f"t{W}"))
    want = tree_sum_values(values)
    for g in got:
        np.testing.assert_array_equal(g, want)
    if W >= 5:
        assert not np.array_equal(want, values[0] + tree_sum_values(values[1:]))


def test_the_other_ranks_give_up_when_one_fails_or_never_comes(client):
    from distributed import wait

    workers = sorted(client.scheduler_info(n_workers=-1)["workers"])
    values = [np.full(3, float(r)) for r in range(3)]
    futs = _allreduce(client, values, workers, "failed", fail={2})
    wait(futs[2])
    abort_exchange(client, "failed", workers)
    for f in futs:
        with pytest.raises((HeldLost, RuntimeError)) as e:
            f.result(timeout=30)
        assert isinstance(e.value, RuntimeError if f is futs[2] else HeldLost)
    # a rank that never comes, and nobody says so: its partners wait their timeout, then say it was lost
    futs = _allreduce(client, values[:2], workers[:3], "absent", timeout=0.5)
    with pytest.raises(HeldLost, match="no message from rank 2"):
        futs[0].result(timeout=30)
