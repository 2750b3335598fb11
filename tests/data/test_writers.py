"""``write_store`` from every input kind, out of core on a cluster; what failing writes leave."""

from __future__ import annotations

import os
import time

import dask.array as da
import fsspec
import numpy as np
import pytest
import scipy.sparse as sp
import sparse
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dufs
from dufs.data import write_store
from dufs.errors import ParameterError, StoreError
from dufs.testing import DriverComputeError, assert_store_matches, canonical, lazy_sparse_dask
from dufs.testing.strategies import Blocking, sparse_matrices

BLOCKING = Blocking(row_block=10, granule=4, block_nnz=40, chunk_elements=50)


def _reference() -> tuple[sp.csr_array, np.ndarray]:
    rng = np.random.default_rng(7)
    X = sp.random_array((37, 19), density=0.25, format="csr", rng=rng).tolil()
    X[4, :] = 0  # an empty row
    X[:, 11] = 0  # an empty column
    X[36, 18] = 2.5  # the last cell
    return canonical(X), rng.integers(0, 2, 37).astype(np.float64)


X_REF, Y_REF = _reference()


def _coo_with_duplicates(X):
    """The same matrix as COO with one entry split in two (duplicates must be summed)."""
    C = sp.coo_array(X)
    half = C.data[0] / 2
    return sp.coo_array(
        (
            np.r_[C.data[1:], half, C.data[0] - half],
            (np.r_[C.row[1:], C.row[0], C.row[0]], np.r_[C.col[1:], C.col[0], C.col[0]]),
        ),
        shape=C.shape,
    )


INPUTS = {
    "numpy": lambda X: X.toarray(),
    "csr_array": sp.csr_array,
    "csr_matrix": sp.csr_matrix,
    "csc_array": sp.csc_array,
    "csc_matrix": sp.csc_matrix,
    "coo_array": _coo_with_duplicates,
    "coo_matrix": lambda X: sp.coo_matrix(_coo_with_duplicates(X)),
    "sparse.COO": sparse.COO.from_scipy_sparse,
    "sparse.GCXS-rows": lambda X: sparse.GCXS.from_scipy_sparse(sp.csr_array(X)),
    "sparse.GCXS-cols": lambda X: sparse.GCXS.from_scipy_sparse(sp.csc_array(X)),
    "dask-dense": lambda X: da.from_array(X.toarray(), chunks=(8, 7)),
    "dask-sparse.COO": lambda X: da.from_array(X.toarray(), chunks=(8, 7)).map_blocks(sparse.COO.from_numpy),
}


@pytest.fixture(scope="module")
def reference_store(tmp_path_factory):
    with BLOCKING.config():
        st_ = write_store(X_REF, tmp_path_factory.mktemp("ref") / "ref.zarr", Y_REF)
    assert st_.n_blocks("csr") == 4 and st_.n_blocks("csc") >= 2
    return st_


@pytest.mark.parametrize("kind", list(INPUTS))
def test_every_input_kind_gives_the_same_store(store_path, reference_store, kind):
    X = INPUTS[kind](X_REF)
    y = da.from_array(Y_REF, chunks=9) if kind.startswith("dask") and kind.endswith("COO") else Y_REF
    with BLOCKING.config():
        st_ = write_store(X, store_path(), y)
    assert_store_matches(st_, X_REF, Y_REF, check_blocks=False)  # blocks: same bounds and nnz as the reference
    for o in ("csr", "csc"):
        np.testing.assert_array_equal(st_.bounds(o), reference_store.bounds(o))
        np.testing.assert_array_equal(st_.block_nnz(o), reference_store.block_nnz(o))
    assert st_.provenance["source"] == "write_store"


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_dask_input_any_chunking(store_path, data):
    """Dask arrays of sparse chunks, chunked any way in both dimensions, with any row_block."""
    X = data.draw(sparse_matrices(max_rows=30, max_cols=20), label="X")
    n, d = X.shape
    rc = data.draw(st.integers(1, max(1, n)), label="row chunk")
    cc = data.draw(st.integers(1, max(1, d)), label="col chunk")
    row_block = data.draw(st.integers(max(1, n // 3), max(1, n)), label="row_block")
    D = da.from_array(sparse.COO.from_scipy_sparse(X), chunks=(rc, cc), asarray=False)
    with Blocking(row_block=row_block, granule=max(1, d // 3), block_nnz=20, chunk_elements=64).config():
        st_ = write_store(D, store_path())
    assert_store_matches(st_, X)
    assert st_.n_blocks("csr") == max(1, -(-n // row_block))


@pytest.mark.slow
def test_dask_input_is_written_on_the_workers(store_path, cluster_client):
    """Out of core: chunks are made and row blocks written on the workers, never on the driver."""
    from distributed import get_task_stream

    shape, chunks = (300, 50), (64, 20)
    X = lazy_sparse_dask(shape, chunks, density=0.1, seed=3, forbid_pid=os.getpid())
    with pytest.raises(DriverComputeError):  # the guard works: the driver cannot make a chunk
        X.blocks[0, 0].compute(scheduler="sync")
    X_ref = canonical(lazy_sparse_dask(shape, chunks, density=0.1, seed=3))
    y = np.arange(shape[0], dtype=np.float64) % 3
    path = store_path()
    with cluster_client.as_current(), get_task_stream(cluster_client) as ts, BLOCKING.config():
        st_ = write_store(X, path, y, row_block=64)
    assert_store_matches(st_, X_ref, y)
    assert st_.n_blocks("csr") == 5
    workers = set(cluster_client.scheduler_info()["workers"])
    writes = [t for t in ts.data if "_write_slab" in str(t["key"])]
    made = [t for t in ts.data if "lazy-sparse" in str(t["key"])]
    assert len(writes) == 5 and {t["worker"] for t in writes} <= workers
    assert len(made) == X.npartitions and {t["worker"] for t in made} <= workers
    for i in range(5):  # every row block is in the store, complete
        assert os.path.isfile(os.path.join(path, "csr", str(i), "data", "zarr.json"))


# bad writes ---------------------------------------------------------------------------------------
def _leftovers(path: str) -> list[str]:
    fs, p = fsspec.core.url_to_fs(path)
    return [q for q in (p, p + ".dufs-partial", p + ".dufs-old") if fs.exists(q)]


def _with_nan_in_last_block(X):
    A = X.toarray()
    A[-1, 3] = np.nan
    return A


BAD = {
    "y-nan": (lambda: X_REF, lambda: np.where(np.arange(37) == 30, np.nan, Y_REF), "NaN"),
    "y-inf-dask": (
        lambda: da.from_array(X_REF.toarray(), chunks=10),
        lambda: da.from_array(np.where(np.arange(37) == 36, np.inf, Y_REF), chunks=10),
        "NaN or inf",
    ),
    "y-length": (lambda: X_REF, lambda: Y_REF[:-1], "36 labels"),
    "x-nan-last-block": (
        lambda: _with_nan_in_last_block(X_REF),
        lambda: Y_REF,
        r"X has a non-finite value \(nan\) at row 36, feature 3;",
    ),
    "x-nan-dask": (
        lambda: da.from_array(_with_nan_in_last_block(X_REF), chunks=(5, 19)),
        lambda: None,
        r"X has a non-finite value \(nan\) at row 36, feature 3;",
    ),
    "x-overflows-float32": (
        lambda: np.array([[1e39, 0.0], [0.0, 1.0]]),
        lambda: None,
        "beyond the range",
    ),
    "x-1d": (lambda: np.ones(3), lambda: None, "2-D"),
}


@pytest.mark.parametrize("where", ["local", "memory"])
@pytest.mark.parametrize("case", list(BAD))
def test_a_failing_write_leaves_nothing(store_path, case, where):
    make_x, make_y, msg = BAD[case]
    path = store_path(where)
    value_dtype = np.float32 if case == "x-overflows-float32" else None
    with BLOCKING.config(), pytest.raises(ParameterError, match=msg):
        write_store(make_x(), path, make_y(), value_dtype=value_dtype)
    assert _leftovers(path) == []


def _dask_input_failing_in_its_last_rows():
    """A Dask array whose last chunk fails (while the other row blocks are being written)."""
    import dask

    good = da.from_array(X_REF.toarray()[:33], chunks=(3, 19))
    bad = dask.delayed(np.reshape)(np.arange(6.0), (4, 19))  # ValueError when computed
    return da.concatenate([good, da.from_delayed(bad, shape=(4, 19), dtype=np.float64)])


@pytest.mark.parametrize("scheduler", ["threads", pytest.param("cluster", marks=pytest.mark.slow)])
def test_a_failing_dask_input_leaves_nothing(store_path, scheduler, request):
    """The input's own error comes out (not a clean-up error); nothing is written after clean-up."""
    import contextlib

    client = request.getfixturevalue("cluster_client") if scheduler == "cluster" else None
    path = store_path()
    for y in (Y_REF, None):  # twice: the first failure left nothing to clash with
        ctx = client.as_current() if client is not None else contextlib.nullcontext()
        with ctx, Blocking(row_block=3, granule=4, block_nnz=40, chunk_elements=50).config():
            with pytest.raises(ValueError, match="reshape") as failed:
                write_store(_dask_input_failing_in_its_last_rows(), path, y)
        assert _leftovers(path) == []
        if client is not None:  # the written slabs' results gone from the workers, the traceback still alive
            assert failed.value is not None
            deadline = time.monotonic() + 5
            while any(str(k).startswith("_write_slab") for d in client.run(_worker_keys).values() for k in d) \
                    and time.monotonic() < deadline:
                time.sleep(0.05)
            assert not [k for d in client.run(_worker_keys).values() for k in d if str(k).startswith("_write_slab")]


def _worker_keys(dask_worker=None) -> list:
    return list(dask_worker.data)


@pytest.mark.parametrize("where", ["local", "memory"])
def test_overwrite(store_path, where):
    path = store_path(where)
    with BLOCKING.config():
        write_store(X_REF, path, Y_REF)
        with pytest.raises(StoreError, match="exists.*overwrite"):
            write_store(X_REF[:5], path)
        assert_store_matches(dufs.open(path), X_REF, Y_REF)  # untouched
        # a failing overwrite leaves the old store as it was
        with pytest.raises(ParameterError, match=r"non-finite value \(nan\) at row 36, feature 3"):
            write_store(_with_nan_in_last_block(X_REF), path, overwrite=True)
        assert_store_matches(dufs.open(path), X_REF, Y_REF)
        assert len(_leftovers(path)) == 1
        st_ = write_store(X_REF[:5], path, overwrite=True)
    assert_store_matches(st_, X_REF[:5])
    assert_store_matches(dufs.open(path), X_REF[:5])
    assert len(_leftovers(path)) == 1  # no partial, no old copy


def test_parameters_are_checked(store_path):
    for bad in (0, -1):
        with pytest.raises(ParameterError, match="'row_block'"):
            write_store(X_REF, store_path(), row_block=bad)
    path = store_path()
    with pytest.raises(ParameterError, match="'value_dtype'"):
        write_store(X_REF, path, value_dtype=np.int32)
    assert _leftovers(path) == []


def test_default_value_dtypes(store_path):
    assert write_store(X_REF.astype(np.float32), store_path()).dtype == np.float32
    assert write_store(X_REF, store_path()).dtype == np.float64
    half = X_REF.toarray().astype(np.float16)
    st_ = write_store(half, store_path())
    assert st_.dtype == np.float32
    assert_store_matches(st_, half.astype(np.float32))
    assert write_store(sparse.COO.from_numpy(half), store_path()).dtype == np.float32
    ints = sp.csr_array(np.array([[0, 3], [1, 0]]))
    st_ = write_store(ints, store_path())
    assert st_.dtype == np.float32
    assert_store_matches(st_, ints, value_dtype=np.float32)


@pytest.mark.parametrize("kind", ["numpy", "scipy", "dask"])
def test_non_finite_values_are_named_by_row_and_feature(tmp_path, kind):
    """The first non-finite value in (row, feature) order is named (a Dask input: the first of the block of rows
    that fails first), and nothing is left behind."""
    X = np.random.default_rng(0).random((20, 5))
    X[13, 4], X[9, 1], X[13, 2] = np.inf, np.nan, -np.inf
    Xk = {"numpy": X, "scipy": sp.csr_array(X), "dask": da.from_array(X, chunks=(7, 5))}[kind]
    first = r"\(nan\) at row 9, feature 1" if kind != "dask" else \
        r"\((nan\) at row 9, feature 1|-inf\) at row 13, feature 2)"
    with pytest.raises(ParameterError, match=rf"^X has a non-finite value {first}( \(3 in all\))?( \(2 in this "
                                             rf"block of rows\))?; dufs stores finite numbers only"):
        write_store(Xk, tmp_path / "w.zarr", row_block=6)
    with pytest.raises(ParameterError, match=r"at row 13, feature 2 \(2 in (all|this block of rows)\)"):
        write_store(np.where(np.isnan(X), 0.5, X), tmp_path / "w.zarr", row_block=6)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("kind", ["numpy", "scipy", "dask"])
def test_values_whose_squares_overflow_are_named_by_row_and_feature(tmp_path, kind):
    """A finite value beyond 1e150 in magnitude (its square and every variance or distance it enters overflow) is
    refused like a non-finite one, whatever the store's value dtype; 1e150 itself is stored."""
    X = np.random.default_rng(0).random((20, 5))
    X[9, 3], X[9, 1], X[2, 0] = 3e150, -1e200, 1e150
    Xk = {"numpy": X, "scipy": sp.csr_array(X), "dask": da.from_array(X, chunks=(7, 5))}[kind]
    for dtype in (np.float64, np.float32):
        with pytest.raises(ParameterError, match=r"^X has a value too large to compute with \(-1e\+200\) at row 9, "
                                                 r"feature 1 \(2 in (all|this block of rows)\); beyond 1e\+150 in "
                                                 r"magnitude its square"):
            write_store(Xk, tmp_path / "w.zarr", row_block=10, value_dtype=dtype)
        assert list(tmp_path.iterdir()) == []
    X[9, 3], X[9, 1] = 0.5, 0.5
    st = write_store(X, tmp_path / "w.zarr", value_dtype=np.float64)
    assert st.block(0, "csr").data.max() == 1e150


def test_labels_that_are_not_numbers_are_refused(tmp_path):
    X = sp.random_array((10, 4), density=0.5, rng=0, format="csr")
    with pytest.raises(ParameterError, match=r"y holds labels of dtype <U3; a store keeps numeric labels: encode"):
        write_store(X, tmp_path / "w.zarr", np.array(["cat", "dog"] * 5))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("cls", [sp.csr_array, sp.csr_matrix])
def test_unsorted_csr_input_is_not_sorted_in_place(store_path, cls):
    """A CSR input whose indices are unsorted is stored canonical, and the caller's array stays as it was."""
    X = cls((np.array([1.0, 2.0, 3.0]), np.array([2, 11, 10]), np.array([0, 3])), shape=(1, 14))
    st = write_store(X, store_path())
    np.testing.assert_array_equal(X.indices, [2, 11, 10])
    np.testing.assert_array_equal(st.block(0, "csr").indices, [2, 10, 11])
