"""Leases on pooled memory (dufs._lease): a lease stays active exactly as long as anything made from the leased
array lives, whatever holds it; and a pass's result held past later passes keeps its numbers."""

from __future__ import annotations

import gc
import pickle

import numpy as np
import pytest
import scipy.sparse as sp

from dufs._lease import lease

HOLDERS = {
    "the array": lambda a: a,
    "a view": lambda a: a[3:7],
    "a view of a view": lambda a: a[2:][1:5].T,
    "a reinterpreting view": lambda a: a.view(np.int64),
    "a memoryview": memoryview,
    "an array over its memoryview": lambda a: np.frombuffer(memoryview(a), np.uint8),
    "a pickle buffer": lambda a: pickle.PickleBuffer(a),
    "a container": lambda a: {"x": [a]},
}


@pytest.mark.parametrize("holder", list(HOLDERS))
def test_a_lease_is_active_while_anything_made_from_its_array_lives(holder):
    memory = np.zeros(1 << 12, np.uint8)
    a, held = lease(memory, (16, 4), np.float64)
    assert np.shares_memory(a, memory) and a.flags.writeable and a.flags.c_contiguous
    kept = HOLDERS[holder](a)
    del a
    gc.collect()
    assert held.active
    del kept
    gc.collect()
    assert not held.active


def test_pickled_frames_in_flight_keep_the_lease():
    memory = np.zeros(1 << 12, np.uint8)
    a, held = lease(memory, (32,), np.float64)
    frames: list = []
    pickle.dumps(a, protocol=5, buffer_callback=frames.append)  # what Dask sends: out-of-band buffers of a
    del a
    assert held.active
    frames.clear()
    assert not held.active


def test_a_lease_refuses_memory_too_small_or_not_contiguous():
    with pytest.raises(ValueError, match="lease of 800 bytes"):
        lease(np.zeros(100, np.uint8), (100,), np.float64)
    with pytest.raises(ValueError, match="contiguous"):
        lease(np.zeros((100, 100), np.uint8)[:, :50], (10,), np.uint8)


def test_a_pass_result_held_past_the_next_passes_is_not_overwritten(cluster_client):
    """On a process cluster, passes as tasks (the workers' outputs from dufs.engine.buffers): per-block results kept
    on the workers (gather=False) keep their numbers through later passes of the same shape, which would reuse
    their memory if a held buffer were taken as free; results gathered to this process likewise. Against SciPy."""
    import dask

    from dufs.engine import as_matrix

    X = sp.csc_array(sp.random(200, 100_000, density=0.01, format="csc", random_state=1))
    vs = np.random.default_rng(1).standard_normal((4, 200, 2))
    with cluster_client.as_current(), dask.config.set({"dufs.engine.shared-memory": "off",
                                                        "dufs.engine.direct-passes": "off"}):
        M = as_matrix(X, block_width=20_000, standardize=None, persist=True)
        held = M.rmatvec(vs[0], gather=False)  # (20,000, 2) float64 a block: 320 kB, from the workers' pools
        later = [M.rmatvec(v) for v in vs[1:]]
        for _ in range(3):
            M.rmatvec(vs[1], gather=False).release()
        first = np.concatenate(held.gather())
        held.release()
        np.testing.assert_allclose(first, X.T @ vs[0], rtol=1e-12, atol=1e-12)
        for r, v in zip(later, vs[1:], strict=True):
            np.testing.assert_allclose(r, X.T @ v, rtol=1e-12, atol=1e-12)
        M.release()


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.dtype([("off", "<u2"), ("row", "<i4"), ("val", "<f8")])])
def test_a_leased_array_has_its_dtype_and_shape(dtype):
    memory = np.zeros(4096, np.uint8)
    a, held = lease(memory, (5, 3), dtype, offset=64)
    assert a.dtype == np.dtype(dtype) and a.shape == (5, 3)
    assert a.__array_interface__["data"][0] == memory.ctypes.data + 64
    b, _ = lease(memory, (0,), dtype)
    assert b.shape == (0,)
