"""StoreBuilder: resume refuses a different layout (granule, dtype) instead of building a wrong CSC side."""

from __future__ import annotations

import dask
import numpy as np
import pytest
import scipy.sparse as sp

from dufs.data.builder import StoreBuilder
from dufs.errors import ParameterError, StoreError


def _half_built(path, X, granule):
    with dask.config.set({"dufs.store.feature-granule": granule}):
        b = StoreBuilder(path, options={"x": 1})
        b.begin()
        b.write_row_block(0, X[:20].indptr, X[:20].indices, X[:20].data)
        b.abort(remove=False)


def test_resume_with_another_granule_is_refused(tmp_path):
    X = sp.random_array((40, 100), density=0.2, format="csr", rng=0, dtype=np.float32)
    path = tmp_path / "g.zarr"
    _half_built(path, X, 16)
    with dask.config.set({"dufs.store.feature-granule": 32}):
        b = StoreBuilder(path, options={"x": 1}, resume=True)
        with pytest.raises(StoreError, match="feature-granule"):
            b.begin()
    # with the same granule the resume completes and both orientations are exact
    with dask.config.set({"dufs.store.feature-granule": 16}):
        b = StoreBuilder(path, options={"x": 1}, resume=True)
        assert b.begin() == {0}
        b.write_row_block(1, X[20:].indptr, X[20:].indices, X[20:].data)
        st = b.finalize(n_features=100)
    assert (st.to_scipy("csc") != X.tocsc()).nnz == 0
    assert (st.to_scipy("csr") != X).nnz == 0


def test_resume_with_another_dtype_is_refused(tmp_path):
    X = sp.random_array((40, 100), density=0.2, format="csr", rng=1, dtype=np.float32)
    path = tmp_path / "d.zarr"
    _half_built(path, X, 16)
    with dask.config.set({"dufs.store.feature-granule": 16}):
        b = StoreBuilder(path, options={"x": 1}, resume=True, value_dtype=np.float64)
        with pytest.raises(StoreError, match="dtype"):
            b.begin()


def test_garbled_lock_is_a_clear_refusal(tmp_path):
    from dufs.errors import StoreLockedError

    X = sp.random_array((40, 100), density=0.2, format="csr", rng=2, dtype=np.float32)
    path = tmp_path / "l.zarr"
    _half_built(path, X, 16)
    (tmp_path / "l.zarr.dufs-partial" / "dufs.lock").write_text('{"host": "x", "pi')
    with dask.config.set({"dufs.store.feature-granule": 16}):
        with pytest.raises(StoreLockedError, match="unreadable.*delete the lock file"):
            StoreBuilder(path, options={"x": 1}, resume=True).begin()
        (tmp_path / "l.zarr.dufs-partial" / "dufs.lock").unlink()
        b = StoreBuilder(path, options={"x": 1}, resume=True)
        assert b.begin() == {0}
        b.abort(remove=True)
    assert not (tmp_path / "l.zarr.dufs-partial").exists()


def test_resume_removes_temporary_files_of_a_killed_write(tmp_path):
    """zarr writes "<name>.<32 hex>.partial" then renames it; a SIGKILL in between leaves the temporary file, which
    must not survive into the finished store (a one-shot build has none)."""
    X = sp.random_array((40, 100), density=0.2, format="csr", rng=1, dtype=np.float32)
    path = tmp_path / "t.zarr"
    _half_built(path, X, 16)
    partial = tmp_path / "t.zarr.dufs-partial"
    stray = [partial / "zarr.b79a641276a340d99da4d707de804018.partial",
             partial / "csr" / "zarr.0123456789abcdef0123456789abcdef.partial"]
    for f in stray:
        f.write_text("{")
    with dask.config.set({"dufs.store.feature-granule": 16}):
        b = StoreBuilder(path, options={"x": 1}, resume=True)
        assert b.begin() == {0}
        b.write_row_block(1, X[20:].indptr, X[20:].indices, X[20:].data)
        st = b.finalize(n_features=100)
    left = [p.name for p in path.rglob("*.partial")]
    assert left == []
    assert (st.to_scipy("csr") != X).nnz == 0


@pytest.mark.parametrize("granule", [0, 65537])
def test_a_granule_a_spill_entry_cannot_address_is_refused_before_anything_is_written(tmp_path, granule):
    with dask.config.set({"dufs.store.feature-granule": granule}):
        with pytest.raises(ParameterError, match=r"'dufs.store.feature-granule' setting must be an int in \[1, 65536"):
            StoreBuilder(tmp_path / "g.zarr", options={"x": 1})
    assert not list(tmp_path.iterdir())
