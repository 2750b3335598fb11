"""The sparse Zarr store: exact round trips, Dask views, sizeof, integrity, completion, locking."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import dask
import numpy as np
import pytest
import scipy.sparse as sp
import sparse
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import dufs
from dufs.data import StoreBuilder, open_store, write_store
from dufs.data.datasets import load
from dufs.errors import (
    CorruptChunkError,
    IncompleteStoreError,
    ParameterError,
    StoreError,
    StoreLockedError,
)
from dufs.testing import assert_store_matches, canonical
from dufs.testing.strategies import Blocking, blockings, sparse_matrices

SMALL = Blocking(row_block=16, granule=4, block_nnz=60, chunk_elements=40)  # 4 x ~6 blocks, several chunks
FAST = settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _labels(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 3, n).astype(np.float64)


# round trips --------------------------------------------------------------------------------------
@FAST
@given(data=st.data(), where=st.sampled_from(["local", "memory"]), with_y=st.booleans())
def test_round_trip_is_exact(store_path, data, where, with_y):
    """Any matrix, any blocking, both orientations: exactly the (canonicalised) input comes back."""
    X = data.draw(sparse_matrices(max_rows=24, max_cols=24, canonical=data.draw(st.booleans())), label="X")
    y = (
        data.draw(
            hnp.arrays(np.float64, X.shape[0], elements=st.floats(allow_nan=False, allow_infinity=False)),
            label="y",
        )
        if with_y
        else None
    )
    before = [a.copy() for a in (X.data, X.indices, X.indptr)]
    fixed = data.draw(
        blockings(n_rows=X.shape[0], n_cols=X.shape[1], nnz=X.nnz, max_blocks=3, feature_block=True),
        label="blocking",
    )
    # a fixed feature_block, then the nnz-balanced default
    for b in (fixed, fixed.with_feature_block(None)):
        with b.config():
            st_ = write_store(X, store_path(where), y, feature_block=b.feature_block)
        assert_store_matches(st_, X, y)
        bounds, nnz = st_.bounds("csc"), st_.block_nnz("csc")
        if b.feature_block is None:  # balanced: a block over its nnz target is a single granule
            assert all(
                z <= b.block_nnz or hi - lo <= b.granule for lo, hi, z in zip(bounds[:-1], bounds[1:], nnz, strict=True)
            )
        else:  # fixed: feature_block rounded to whole granules
            step = max(1, round(b.feature_block / b.granule)) * b.granule
            assert np.all(np.diff(bounds)[:-1] == step) and 0 < bounds[-1] - bounds[-2] <= step
        st_.location.remove()  # keeps memory:// small (its listings scan every file in it)
    # the input was not canonicalised in place
    for a, b in zip(before, (X.data, X.indices, X.indptr), strict=True):
        np.testing.assert_array_equal(a, b)


EDGE = {
    "single_row": sp.csr_array(np.array([[0.0, 1.5, 0.0, -2.0, 0.0]])),
    "single_col": sp.csr_array(np.array([[0.0], [3.0], [0.0], [0.0], [1e-300], [7.0]])),
    "all_zero": sp.csr_array((6, 5)),
    "empty_rows_and_cols": sp.csr_array(np.array([[0, 0, 0, 0], [0, 1, 0, 2], [0, 0, 0, 0], [0, 3, 0, 0.5]])),
    "one_by_one": sp.csr_array(np.array([[4.25]])),
    "one_by_one_zero": sp.csr_array((1, 1)),
    "no_rows": sp.csr_array((0, 5)),
    "no_cols": sp.csr_array((5, 0)),
    "dense": sp.csr_array(np.arange(1.0, 31.0).reshape(5, 6)),
}


@pytest.mark.parametrize(
    ("dtype", "where", "feature_block"),
    [(np.float64, "local", 2), (np.float32, "memory", None)],  # fixed blocks; nnz-balanced blocks
)
@pytest.mark.parametrize("case", list(EDGE))
def test_round_trip_edge_cases(store_path, case, dtype, where, feature_block):
    X = EDGE[case].astype(dtype)
    y = _labels(X.shape[0])
    with Blocking(row_block=2, granule=2, block_nnz=2, chunk_elements=4).config():
        st_ = write_store(X, store_path(where), y, feature_block=feature_block)
    assert_store_matches(st_, X, y)
    for o in ("csr", "csc"):
        D = st_.to_dask(o)
        assert D.shape == X.shape
        np.testing.assert_array_equal(D.compute(scheduler="sync").todense(), X.toarray())


@pytest.mark.parametrize("name", ["allaml", "coil20", "basehock"])
def test_bundled_datasets_round_trip_exactly(store_path, name):
    X, y = load(name)
    assert X.dtype == np.float64
    blocking = Blocking(row_block=600, granule=256, block_nnz=200_000, chunk_elements=100_000)
    with blocking.config():
        st_ = write_store(X, store_path(name=name), y)
    assert st_.dtype == np.float64 and st_.shape == X.shape
    assert_store_matches(st_, X, y, check_blocks=False)
    assert st_.n_blocks("csr") == -(-X.shape[0] // 600)
    np.testing.assert_array_equal(st_.y, y.astype(np.float64))
    reopened = dufs.open(st_.path)
    assert reopened.info()["labels"] == {
        str(int(k)): int(c) for k, c in zip(*np.unique(y, return_counts=True), strict=True)
    }


def test_float32_store_of_float64_input(store_path):
    X = sp.csr_array(np.array([[0.1, 0.0], [0.0, 1 / 3]]))
    st_ = write_store(X, store_path(), value_dtype=np.float32)
    assert st_.dtype == np.float32 and st_.to_scipy("csc").dtype == np.float32
    assert_store_matches(st_, X, value_dtype=np.float32)


def test_feature_ids_and_info(store_path):
    X = sp.csr_array(np.array([[1.0, 0, 2], [0, 0, 3]]))
    st_ = write_store(X, store_path(), [1, 2], feature_ids=np.array(["a", "bb", "c"]))
    np.testing.assert_array_equal(st_.feature_ids, ["a", "bb", "c"])
    st2 = write_store(X, store_path(), feature_ids=np.array([10, 20, 30]))
    np.testing.assert_array_equal(st2.feature_ids, [10, 20, 30])
    assert st2.y is None and "labels" not in st2.info()
    info = st_.info()
    assert info["shape"] == [2, 3] and info["nnz"] == 3 and info["empty_features"] == 1
    assert info["top_features"][0] == [2, 2] and info["labels"] == {"1": 1, "2": 1}
    with pytest.raises(ParameterError, match="feature_ids"):
        write_store(X, store_path(), feature_ids=[1, 2])
    for s in (st_, st2):  # feature ids are checked like every array: a lost chunk is an error
        os.remove(os.path.join(s.path, "feature_ids", "c", "0"))
        with pytest.raises(CorruptChunkError, match="feature_ids/c/0 is missing"):
            _ = dufs.open(s.path).feature_ids


@pytest.mark.parametrize("o", ["csr", "csc"])
def test_to_scipy_has_int32_indices_scikit_learn_accepts(store_path, o):
    """A store whose nonzeros and dimensions fit in int32 comes back with int32 ``indices`` and ``indptr``:
    scikit-learn's LinearSVC and ``dump_svmlight_file`` refuse int64 ones."""
    import io

    from sklearn.datasets import dump_svmlight_file, load_svmlight_file
    from sklearn.svm import LinearSVC

    X = sp.random_array((60, 25), density=0.2, format="csr", rng=np.random.default_rng(1))
    y = np.arange(60) % 2
    with SMALL.config():  # several blocks a side, stacked by to_scipy
        st_ = write_store(X, store_path(), y)
    assert st_.n_blocks(o) > 1
    M = st_.to_scipy(o)
    assert M.indices.dtype == np.int32 and M.indptr.dtype == np.int32
    np.testing.assert_array_equal(M.toarray(), X.toarray())
    LinearSVC().fit(M, st_.y)
    buf = io.BytesIO()
    dump_svmlight_file(M, st_.y, buf)
    back, yb = load_svmlight_file(io.BytesIO(buf.getvalue()), n_features=25)
    np.testing.assert_allclose(back.toarray(), X.toarray())
    np.testing.assert_array_equal(yb, y)


# to_dask ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def small_store(tmp_path_factory):
    """A labelled local store of a 60 x 23 matrix in several row and feature blocks and chunks."""
    X = sp.lil_array(sp.random_array((60, 23), density=0.3, format="csr", rng=np.random.default_rng(1)))
    X[5] = 0  # an empty row (in a lil array: a csr array warns that its structure changes)
    X[:, 7] = 0  # an empty column
    X = canonical(sp.csr_array(X))
    y = _labels(60, 1)
    with SMALL.config():
        st_ = write_store(X, tmp_path_factory.mktemp("small") / "small.zarr", y)
    assert st_.n_blocks("csr") == 4 and st_.n_blocks("csc") > 2
    return st_, X, y


def _check_dask_view(st_, X, o, kind, scheduler, whole=True):
    D = st_.to_dask(o, kind=kind)
    b = st_.bounds(o)
    sizes = tuple(int(s) for s in np.diff(b))
    assert D.shape == X.shape and D.dtype == st_.dtype
    assert D.chunks == ((sizes, (X.shape[1],)) if o == "csr" else ((X.shape[0],), sizes))
    want_type = sparse.GCXS if kind == "sparse" else (sp.csr_array if o == "csr" else sp.csc_array)
    assert isinstance(D._meta, want_type)
    blocks = dask.compute(
        *[D.blocks[(i, 0) if o == "csr" else (0, i)] for i in range(len(sizes))],
        scheduler=scheduler,
    )
    for i, blk in enumerate(blocks):
        assert isinstance(blk, want_type)
        part = X[b[i] : b[i + 1]] if o == "csr" else X[:, b[i] : b[i + 1]]
        got = blk.to_scipy_sparse() if kind == "sparse" else blk
        assert got.shape == part.shape
        assert (canonical(got) != canonical(part)).nnz == 0
    if not whole:
        return
    whole = D.compute(scheduler=scheduler)
    got = canonical(whole.to_scipy_sparse() if kind == "sparse" else whole)
    want = canonical(X)
    assert got.shape == want.shape
    np.testing.assert_array_equal(got.indptr, want.indptr)
    np.testing.assert_array_equal(got.indices, want.indices)
    np.testing.assert_array_equal(got.data, want.data)


@pytest.mark.parametrize("scheduler", ["sync", "threads"])
@pytest.mark.parametrize("kind", ["sparse", "scipy"])
@pytest.mark.parametrize("o", ["csr", "csc"])
def test_to_dask_local_schedulers(small_store, o, kind, scheduler):
    st_, X, _ = small_store
    _check_dask_view(st_, X, o, kind, scheduler)


def test_to_dask_default_is_csc_of_gcxs(small_store):
    st_, X, _ = small_store
    D = st_.to_dask()
    assert D.chunks[0] == (X.shape[0],) and isinstance(D._meta, sparse.GCXS)
    with pytest.raises(ParameterError, match="'kind'"):
        st_.to_dask("csc", kind="dense")
    with pytest.raises(ParameterError, match="'orientation'"):
        st_.to_dask("coo")


@pytest.mark.slow
def test_to_dask_on_a_process_cluster(small_store, cluster_client):
    """Chunks are read on the workers (each process opens the store itself) and come back whole.

    Whole ``sparse`` arrays are concatenated by pydata sparse, whose numba compilation costs ~10 s
    in each fresh worker: that step (the same under every scheduler) is checked under the local
    schedulers; here the ``sparse`` chunks are gathered one by one and the ``scipy`` views
    computed whole.
    """
    from distributed import get_task_stream

    st_, X, _ = small_store
    workers = set(cluster_client.scheduler_info()["workers"])
    for o in ("csr", "csc"):
        for kind in ("sparse", "scipy"):
            with get_task_stream(cluster_client) as ts:
                _check_dask_view(st_, X, o, kind, cluster_client, whole=kind == "scipy")
            ran = [t for t in ts.data if "dufs-store" in str(t["key"])]
            assert len(ran) >= st_.n_blocks(o) and {t["worker"] for t in ran} <= workers


def test_dask_graph_survives_a_replaced_store(store_path):
    """A store overwritten at the same path is read afresh, never with the old store's metadata."""
    path = store_path()
    X1 = sp.csr_array(np.eye(6))
    X2 = sp.csr_array(np.arange(1.0, 41.0).reshape(10, 4))
    with Blocking(row_block=4, granule=2, block_nnz=4, chunk_elements=5).config():
        s1 = write_store(X1, path)
        np.testing.assert_array_equal(s1.to_dask("csr").compute(scheduler="sync").todense(), X1.toarray())
        stale = s1.to_dask("csr")
        s2 = write_store(X2, path, overwrite=True)
    for o in ("csr", "csc"):
        np.testing.assert_array_equal(s2.to_dask(o).compute(scheduler="sync").todense(), X2.toarray())
    with pytest.raises(StoreError, match="replaced"):
        stale.compute(scheduler="sync")


# sizeof -------------------------------------------------------------------------------------------
def _buffers(x):
    if isinstance(x, sparse.COO):
        return x.data.nbytes + x.coords.nbytes
    return x.data.nbytes + x.indices.nbytes + x.indptr.nbytes


def test_sizeof_counts_sparse_buffers():
    from dask.sizeof import sizeof

    sizeof(sp.lil_matrix((2, 2)))  # let dask's own lazy scipy registration run first: ours must still win
    A = sp.random_array((400, 300), density=0.1, format="csr", rng=np.random.default_rng(0))
    blocks = [
        sp.csr_array(A),
        sp.csc_array(A),
        sp.csr_matrix(A),
        sp.csc_matrix(A),
        sparse.GCXS.from_scipy_sparse(A),
        sparse.GCXS.from_scipy_sparse(A.tocsc()),
        sparse.COO.from_scipy_sparse(A),
    ]
    for x in blocks:
        assert sizeof(x) >= _buffers(x) > 100_000, type(x)
    coo = sp.coo_array(A)
    assert sizeof(coo) >= coo.data.nbytes + sum(c.nbytes for c in coo.coords)


def test_sizeof_of_store_blocks(small_store):
    from dask.sizeof import sizeof

    st_, _, _ = small_store
    for o in ("csr", "csc"):
        blk = st_.block(0, o)
        want = blk.data.nbytes + blk.indices.nbytes + blk.indptr.nbytes
        assert sizeof(blk.to_scipy()) >= want and sizeof(blk.to_sparse()) >= want


# integrity ----------------------------------------------------------------------------------------
@pytest.fixture
def damaged(small_store, tmp_path):
    """A fresh copy of ``small_store`` to damage, as (store path, X, y)."""
    st_, X, y = small_store
    dst = tmp_path / "copy.zarr"
    shutil.copytree(st_.path, dst)
    return str(dst), X, y


def _damage(path: str, how: str) -> None:
    if how == "delete":
        os.remove(path)
        return
    raw = bytearray(open(path, "rb").read())
    if how == "flip":
        raw[len(raw) // 2] ^= 0x04
    elif how == "flip-first":
        raw[0] ^= 0x80
    elif how == "truncate":
        raw = raw[: len(raw) - 3]
    elif how == "empty":
        raw = bytearray()
    with open(path, "wb") as f:
        f.write(raw)


CHUNKS = [
    ("csc", 0, "csc/0/data/c/0"),
    ("csc", 1, "csc/1/indptr/c/0"),
    ("csr", 1, "csr/1/indices/c/1"),
    ("csr", 3, "csr/3/data/c/0"),
]


@pytest.mark.parametrize("how", ["flip", "flip-first", "truncate", "empty", "delete"])
@pytest.mark.parametrize(("o", "i", "chunk"), CHUNKS)
def test_damaged_chunk_is_an_error_naming_it(damaged, o, i, chunk, how):
    path, X, _ = damaged
    assert os.path.isfile(os.path.join(path, chunk)), sorted(os.listdir(os.path.dirname(os.path.join(path, chunk))))
    _damage(os.path.join(path, chunk), how)
    st_ = dufs.open(path)
    what = "missing" if how == "delete" else "corrupt"
    with pytest.raises(CorruptChunkError, match=f"{chunk}.*{what}"):
        st_.block(i, o)
    with pytest.raises(CorruptChunkError, match=f"{chunk}.*{what}"):
        st_.to_dask(o).compute(scheduler="sync")
    with pytest.raises(CorruptChunkError, match=chunk):
        st_.to_dask(o, kind="scipy").compute(scheduler="threads")
    with pytest.raises(CorruptChunkError, match=chunk):
        st_.to_scipy(o)
    other = 0 if i else 1  # blocks that were not damaged still read correctly
    blk = st_.block(other, o)
    part = X[blk.start : blk.stop] if o == "csr" else X[:, blk.start : blk.stop]
    assert (canonical(blk.to_scipy()) != canonical(part)).nnz == 0


@pytest.mark.parametrize("how", ["flip", "delete"])
@pytest.mark.parametrize("array", ["y", "feature_nnz"])
def test_damaged_labels_or_feature_nnz(damaged, array, how):
    path, _, _ = damaged
    _damage(os.path.join(path, array, "c", "0"), how)
    st_ = dufs.open(path)
    with pytest.raises(CorruptChunkError, match=f"{array}/c/0"):
        getattr(st_, array)


def test_block_lengths_checked_against_metadata(damaged):
    """A block whose arrays disagree with the store's metadata is refused, not misread."""
    import zarr

    path, _, _ = damaged
    g = zarr.open_group(path, mode="r+")
    data = np.asarray(g["csc/0/data"][...])
    from dufs.data.store import write_array

    write_array(g["csc/0"], "data", data[:-1])  # a valid array (checksums fine), one value short
    st_ = dufs.open(path)
    with pytest.raises(CorruptChunkError, match="csc block 0.*do not match"):
        st_.block(0, "csc")
    st_.block(1, "csc")
    with pytest.raises(ParameterError, match="does not exist"):
        st_.block(st_.n_blocks("csc"), "csc")


# completion ---------------------------------------------------------------------------------------
def _begin_and_write_one_block(path):
    b = StoreBuilder(path, value_dtype=np.float64, options={"test": 1})
    assert b.begin() == set()
    b.write_row_block(0, np.array([0, 1, 2]), np.array([1, 0]), np.array([2.0, 3.0]), np.array([0.0, 1.0]))
    return b


@pytest.mark.parametrize("where", ["local", "memory"])
def test_unfinished_store_is_refused(store_path, where):
    path = store_path(where)
    b = _begin_and_write_one_block(path)
    with pytest.raises(IncompleteStoreError, match=r"interrupted(.|\n)*--resume"):
        dufs.open(path)
    with pytest.raises(IncompleteStoreError, match=r"dufs-partial"):
        open_store(path)
    b.abort(remove=False)  # the writer dies; the partial stays
    # someone moves the partial into place by hand: still no completion marker
    from dufs.data._fs import Location

    part, final = Location.of(path).sibling(".dufs-partial"), Location.of(path)
    part.fs.copy(part.fspath, final.fspath, recursive=True)
    with pytest.raises(IncompleteStoreError, match=r"completion marker(.|\n)*--resume"):
        dufs.open(path)
    final.remove()
    # a plain (non-resuming) build refuses to clobber the partial; a resuming one finishes it
    with pytest.raises(StoreError, match="--resume"):
        StoreBuilder(path, value_dtype=np.float64, options={"test": 1}).begin()
    with pytest.raises(StoreError, match="other options"):
        StoreBuilder(path, value_dtype=np.float64, resume=True, options={"test": 2}).begin()
    b2 = StoreBuilder(path, value_dtype=np.float64, resume=True, options={"test": 1})
    assert b2.begin() == {0}
    b2.write_row_block(1, np.array([0, 1]), np.array([2]), np.array([5.0]), np.array([2.0]))
    st_ = b2.finalize(n_features=3)
    assert_store_matches(st_, np.array([[0, 2.0, 0], [3.0, 0, 0], [0, 0, 5.0]]), [0.0, 1.0, 2.0])
    assert not part.exists()


def test_block_completion_is_one_metadata_write(store_path, monkeypatch):
    """A block's "complete" lands in the same write as its counts: a kill cannot split them."""
    import json

    from zarr.storage import LocalStore

    seen, orig = [], LocalStore.set

    async def spy(self, key, value, *args, **kwargs):
        if key.startswith(("csr/", "csc/")) and key.endswith("/zarr.json") and key.count("/") == 2:
            seen.append(json.loads(value.to_bytes()).get("attributes", {}))
        return await orig(self, key, value, *args, **kwargs)

    from dufs.data import _direct

    direct = _direct.write_group

    def spy_direct(path, attributes):  # a local build writes its block groups' metadata as files
        if os.path.basename(os.path.dirname(path)) in ("csr", "csc"):
            seen.append(dict(attributes))
        return direct(path, attributes)

    monkeypatch.setattr(LocalStore, "set", spy)
    monkeypatch.setattr(_direct, "write_group", spy_direct)
    with SMALL.config():
        st_ = write_store(sp.csr_array(np.eye(20)), store_path(), np.ones(20))
    done = [a for a in seen if a.get("complete")]
    assert len(done) == st_.n_blocks("csr") + st_.n_blocks("csc") and all("nnz" in a for a in done)


def test_missing_store():
    with pytest.raises(StoreError, match="no dufs store"):
        dufs.open("memory://dufs-test-does-not-exist.zarr")


def test_not_a_group(tmp_path):
    (tmp_path / "x.zarr").mkdir()
    with pytest.raises(StoreError):
        dufs.open(tmp_path / "x.zarr")


# locking ------------------------------------------------------------------------------------------
HOLDER = textwrap.dedent("""
    import sys, time
    from dufs.data import StoreBuilder
    StoreBuilder(sys.argv[1]).begin()
    print("locked", flush=True)
    time.sleep(120)
""")


@pytest.mark.slow
def test_lock_held_by_a_live_process_then_stale(store_path):
    path = store_path()
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, path], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "locked"
        for resume in (False, True):
            with pytest.raises(StoreLockedError, match=f"pid {proc.pid}"):
                StoreBuilder(path, resume=resume).begin()
        assert os.path.exists(path + ".dufs-partial/dufs.lock")
    finally:
        proc.kill()
        proc.wait()
    # the holder is gone: its lock is stale; a resuming builder takes it over and finishes the store
    with pytest.raises(StoreError, match="--resume"):
        StoreBuilder(path).begin()
    b = StoreBuilder(path, resume=True)
    assert b.begin() == set()
    b.write_row_block(0, np.array([0, 1]), np.array([0]), np.array([1.0]))
    st_ = b.finalize(n_features=2)
    assert st_.shape == (1, 2) and not os.path.exists(path + ".dufs-partial")
