"""Sums over machines in pieces, peer to peer (:mod:`dufs.engine.exchange`): the pieces added where they arrive
equal the fixed tree's sum of the whole partials, bit for bit, for arrays and for MMFS's partition results; a
receiver that lost its pieces says so."""

from __future__ import annotations

import dask
import numpy as np
import pytest

from dufs.engine.direct import HeldLost
from dufs.engine.dispatch import tree_sum_values
from dufs.engine.exchange import WHOLE_BYTES, _reduce, reduce_scatter_sum
from dufs.methods.mmfs.records import PartitionResult, RoundTotals


@pytest.fixture(scope="module")
def client():
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=3, threads_per_worker=1, processes=True, dashboard_address=None) as lc, \
            Client(lc) as c:
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
