"""The driver's memory during a selection against the model's bound (docs/memory.md, dufs.memory)."""

from __future__ import annotations

import tracemalloc

import dask
import numpy as np
import pytest
import scipy.sparse as sp

import dufs
from dufs.memory import memory_model

N, D = 3000, 2_500_000


@pytest.fixture(scope="module")
def wide_store(tmp_path_factory):
    """A store with many features and few nonzeros: the driver's per-feature vectors dominate its memory."""
    rng = np.random.default_rng(0)
    nnz = 60_000
    rows = rng.integers(0, N, nnz)
    cols = rng.integers(0, D, nnz)
    X = sp.csr_array((rng.random(nnz) + 0.1, (rows, cols)), shape=(N, D))
    X.sum_duplicates()
    y = (np.asarray(X[:, :64].sum(axis=1)).ravel() + rng.random(N) > 0.5).astype(np.int64)
    path = str(tmp_path_factory.mktemp("memory") / "wide.zarr")
    dufs.write_store(X, path, y)
    return path, X.nnz


@pytest.mark.parametrize("method", ["variance", "correlation", "fisher"])
@pytest.mark.parametrize("many", [False, True], ids=["float64-scores", "float32-scores"])
def test_driver_peak_of_a_filter_selection_is_within_the_model(cluster_client, wide_store, tmp_path, method, many):
    """Traced allocations on the driver (NumPy's included) while a filter selects and its selection is written,
    against the model's driver figure; the peak must also hold the scores (the measurement sees them)."""
    path, nnz = wide_store
    limit = 0 if many else 10 * D
    with cluster_client.as_current(), dask.config.set({"dufs.engine.driver-features": limit}):
        dufs.fit(path, method=method, n_features=5)  # imports, compiled kernels and caches before measuring
        tracemalloc.start()
        try:
            sel = dufs.fit(path, method=method, n_features=100)
            sel.to_json(str(tmp_path / "sel.json"))
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        bound = memory_model(N, D, nnz, method).driver
    score_bytes = 4 if many else 8
    assert sel.scores.dtype.itemsize == score_bytes
    assert peak >= score_bytes * D  # the scores were traced
    assert peak <= bound, f"driver peak {peak / 2**20:.1f} MiB over the model's {bound / 2**20:.1f} MiB"
    # whole: gathering the per-feature column statistics (6 vectors) and concatenating block results would not fit
    assert 6 * 8 * D > bound
    back = dufs.load_selection(tmp_path / "sel.json")
    np.testing.assert_array_equal(back.scores, sel.scores)
