"""Pass outputs reused from a pool (``dufs.engine.buffers``): a buffer is handed out again only once nothing else
refers to it, and the pool stays under ``dufs.engine.buffer-bytes``."""

from __future__ import annotations

import dask
import numpy as np
import pytest

from dufs.engine import buffers

SHAPE = (100_000, 2)  # 1.6 MB: pooled


@pytest.fixture(autouse=True)
def _empty_pool():
    buffers.clear()
    yield
    buffers.clear()


def test_a_buffer_is_reused_once_released_and_never_while_referenced():
    a = buffers.buffer(SHAPE)
    a.fill(7.0)
    b = buffers.buffer(SHAPE)
    assert b is not a and not np.shares_memory(a, b)  # a is still held here
    del b
    c = buffers.buffer(SHAPE)  # b's buffer is free again: reused (a is not)
    assert c is not a
    assert (a == 7.0).all()


@pytest.mark.parametrize("holder", ["view", "memoryview", "container", "column"])
def test_what_holds_a_buffer_keeps_it_from_reuse(holder):
    a = buffers.buffer(SHAPE)
    a.fill(1.0)
    held = {"view": lambda x: x[10:20], "memoryview": memoryview, "container": lambda x: [x],
            "column": lambda x: x[:, 0]}[holder](a)
    ptr = a.__array_interface__["data"][0]
    del a
    for _ in range(3):
        got = buffers.buffer(SHAPE)
        assert got.__array_interface__["data"][0] != ptr
        got.fill(-1.0)
    out = np.asarray(held[0] if holder == "container" else held)
    assert (out == 1.0).all()


def test_zero_fills_a_reused_buffer():
    a = buffers.buffer(SHAPE)
    a.fill(3.0)
    ptr = a.__array_interface__["data"][0]
    del a
    z = buffers.buffer(SHAPE, zero=True)
    assert z.__array_interface__["data"][0] == ptr  # the same memory, zeroed
    assert not z.any()


def test_the_pool_is_bounded_and_small_arrays_are_not_pooled():
    with dask.config.set({"dufs.engine.buffer-bytes": 4 * 1_600_000}):
        held = [buffers.buffer(SHAPE) for _ in range(6)]  # all in use: only 4 fit in the pool
        assert buffers.pooled_bytes() == 4 * 1_600_000
        del held
        big = buffers.buffer((300_000, 2))  # 4.8 MB: the unused ones make room for it
        assert buffers.pooled_bytes() <= 4 * 1_600_000
        assert big.shape == (300_000, 2)
    small = buffers.buffer((10, 3), np.float32)
    assert small.dtype == np.float32 and small.shape == (10, 3)
    assert buffers.pooled_bytes() <= 4 * 1_600_000
