"""Scratch memory of the ingest tasks (dufs.data._scratch): reused only once nothing refers to it."""

from __future__ import annotations

import threading

import numpy as np

from dufs.data._scratch import scratch


def _address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def test_reused_once_free_and_never_while_referred_to():
    a = scratch("t-reuse", 1000, np.float64)
    a[:] = 1.0
    held = scratch("t-reuse", 1000, np.float64)  # `a` still refers to it: other memory
    assert not np.shares_memory(a, held)
    held[:] = 2.0
    assert (a == 1.0).all()  # untouched
    where = _address(held)  # the one kept now
    del a, held
    again = scratch("t-reuse", 800, np.int32)  # free now: the same memory, in another dtype and size
    assert _address(again) == where
    assert again.shape == (800,) and again.dtype == np.int32 and again.flags.c_contiguous and again.flags.writeable
    view = again[10:20]
    del again
    other = scratch("t-reuse", 800, np.int32)  # a view of it is still alive: other memory
    assert _address(other) != where and not np.shares_memory(other, view)


def test_grows_for_a_larger_block_and_is_kept_per_thread():
    small = scratch("t-grow", 10, np.uint8)
    del small
    big = scratch("t-grow", 1 << 20, np.uint8)
    assert big.size == 1 << 20
    big[:] = 7
    seen = []
    t = threading.Thread(target=lambda: seen.append(scratch("t-grow", 1 << 20, np.uint8)))
    t.start()
    t.join()
    assert not np.shares_memory(seen[0], big)  # another thread's own
