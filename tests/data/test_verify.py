"""``verify_store``: every chunk of every array read and checked; damage named, all of it.

Stores are written with ``dufs.write_store`` and damaged on disk the way disks and copies damage them: a chunk file
deleted, truncated, emptied or with a byte flipped, a whole array deleted, a shard's index missing an entry, the
completion marker gone. The expected counts (arrays, chunks, bytes) are worked out from the files on disk and their
``zarr.json``, not from dufs.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import tracemalloc
from pathlib import Path

import dask
import google_crc32c
import numpy as np
import pytest
import scipy.sparse as sp
import zarr

import dufs
from dufs.data import VerifyReport, store_kind, verify_store, write_store
from dufs.data.store import write_array
from dufs.errors import CorruptChunkError, IncompleteStoreError, ParameterError, StoreError
from dufs.testing.strategies import Blocking

SMALL = Blocking(row_block=16, granule=4, block_nnz=60, chunk_elements=40)  # 4 x ~6 blocks, several chunks
TAIL = "; the store is damaged: rebuild it (dufs convert) or restore it from a copy"


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> str:
    rng = np.random.default_rng(3)
    X = sp.random_array((60, 30), density=0.3, format="csr", rng=rng)
    path = str(tmp_path_factory.mktemp("verify") / "small.zarr")
    with SMALL.config():
        write_store(X, path, rng.integers(0, 2, 60).astype(np.float64), feature_ids=[f"f{j}" for j in range(30)])
    return path


@pytest.fixture
def copy(small, tmp_path) -> str:
    dst = str(tmp_path / "copy.zarr")
    shutil.copytree(small, dst)
    return dst


def _on_disk(path: str) -> tuple[int, int, int]:
    """(arrays, chunks, bytes of chunk files) counted from the files and their zarr.json alone."""
    arrays = chunks = nbytes = 0
    for meta_file in Path(path).rglob("zarr.json"):
        meta = json.loads(meta_file.read_text())
        if meta["node_type"] != "array":
            continue
        arrays += 1
        grid = meta["chunk_grid"]["configuration"]["chunk_shape"]
        chunks += math.prod(math.ceil(s / c) for s, c in zip(meta["shape"], grid, strict=True))
        nbytes += sum(f.stat().st_size for f in (meta_file.parent / "c").rglob("*") if f.is_file())
    return arrays, chunks, nbytes


def _chunk_files(path: str) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in Path(path).rglob("*") if p.is_file() and "/c/" in
                  "/" + str(p.relative_to(path)))


def _flip(path: str) -> None:
    raw = bytearray(Path(path).read_bytes())
    raw[len(raw) // 2] ^= 0x10
    Path(path).write_bytes(bytes(raw))


def _truncate(path: str, keep: int | None = None) -> None:
    raw = Path(path).read_bytes()
    Path(path).write_bytes(raw[: len(raw) - 5 if keep is None else keep])


DAMAGE = {
    "delete": (os.remove, "is missing"),
    "truncate": (_truncate, r"fails its crc32c checksum \(corrupt or truncated: [0-9,]+ bytes\)"),
    "flip": (_flip, r"fails its crc32c checksum \(corrupt or truncated: [0-9,]+ bytes\)"),
    "empty": (lambda p: _truncate(p, 0), r"is empty \(0 bytes: truncated\)"),
}
CHUNKS = ["csr/1/indices/c/1", "csc/0/data/c/0", "csc/2/indptr/c/0", "y/c/1", "feature_nnz/c/0", "feature_ids/c/0",
          "csr/3/y/c/0"]


# ------------------------------------------------------------------------------------------------------ intact
@pytest.mark.parametrize("where", ["local", "memory"])
def test_an_intact_store_verifies_clean(store_path, where):
    rng = np.random.default_rng(1)
    X = sp.random_array((70, 33), density=0.25, format="csr", rng=rng)
    path = store_path(where)
    with SMALL.config():
        st = write_store(X, path, rng.integers(0, 3, 70).astype(np.float64))
    rep = verify_store(path)
    assert isinstance(rep, VerifyReport) and rep == verify_store(st.path)
    if where == "local":
        assert (rep.arrays, rep.chunks, rep.bytes) == _on_disk(path)
    else:
        arrays = 3 * (st.n_blocks("csr") + st.n_blocks("csc")) + st.n_blocks("csr") + 2  # + csr/<i>/y, y, fnnz
        assert rep.arrays == arrays
    assert rep.chunks > rep.arrays  # several chunks an array
    assert str(rep) == f"{st.path}: intact ({rep.arrays:,} arrays, {rep.chunks:,} chunks, {rep.bytes:,} bytes checked)"


def test_the_small_store_is_intact_and_counted_from_disk(small):
    rep = verify_store(small)
    assert (rep.arrays, rep.chunks, rep.bytes) == _on_disk(small)
    assert rep.path == small


# ------------------------------------------------------------------------------------------------------ damage
@pytest.mark.parametrize("how", list(DAMAGE))
@pytest.mark.parametrize("chunk", CHUNKS)
def test_one_damaged_chunk_is_named(copy, chunk, how):
    damage, what = DAMAGE[how]
    assert chunk in _chunk_files(copy)
    damage(os.path.join(copy, chunk))
    st = dufs.open(copy)  # opens: the damage is only in the data
    with pytest.raises(CorruptChunkError) as ei:
        verify_store(st.path)
    msg = str(ei.value)
    assert "\n" not in msg
    assert msg.startswith(f"{copy}: 1 damaged chunk: {chunk} ")
    assert re.fullmatch(rf"{re.escape(copy)}: 1 damaged chunk: {re.escape(chunk)} {what}{re.escape(TAIL)}", msg), msg
    assert [k for k, _ in ei.value.damage] == [chunk]


def test_all_damage_is_collected_first_named(copy):
    """A deleted, a truncated and a flipped chunk (and a deleted whole array) in one store: every one is listed, the
    first (top-level arrays first, then blocks in order) leading the message with the count."""
    os.remove(os.path.join(copy, "csc/3/data/c/0"))
    _truncate(os.path.join(copy, "csr/2/data/c/1"))
    _flip(os.path.join(copy, "feature_nnz/c/0"))
    shutil.rmtree(os.path.join(copy, "csr/3/indptr"))
    with pytest.raises(CorruptChunkError) as ei:
        verify_store(copy)
    msg = str(ei.value)
    assert "\n" not in msg
    assert msg.startswith(f"{copy}: 4 damaged chunks: feature_nnz/c/0 fails its crc32c checksum")
    assert [k for k, _ in ei.value.damage] == ["feature_nnz/c/0", "csr/2/data/c/1", "csr/3/indptr",
                                               "csc/3/data/c/0"]
    assert dict(ei.value.damage)["csr/3/indptr"] == "is missing (the whole array)"
    assert "also csr/2/data/c/1 fails its crc32c checksum" in msg and "csc/3/data/c/0 is missing" in msg


def test_damage_beyond_the_limit_is_counted_as_at_least(copy):
    files = [f for f in _chunk_files(copy) if f.startswith("csr/")]
    for f in files[:12]:
        os.remove(os.path.join(copy, f))
    with pytest.raises(CorruptChunkError, match=rf"^{copy}: at least 5 damaged chunks: ") as ei:
        verify_store(copy, max_damage=5)
    assert len(ei.value.damage) == 5
    with pytest.raises(CorruptChunkError, match=rf"^{copy}: 12 damaged chunks: .* and 8 more; ") as ei:
        verify_store(copy)
    assert sorted(k for k, _ in ei.value.damage) == sorted(files[:12])
    with pytest.raises(ParameterError, match="'max_damage'"):
        verify_store(copy, max_damage=0)


def test_a_missing_group_is_named(copy):
    os.remove(os.path.join(copy, "csc/1/zarr.json"))
    with pytest.raises(CorruptChunkError, match=r"1 damaged chunk: csc/1/zarr\.json is missing \(the group's "):
        verify_store(copy)
    with pytest.raises(CorruptChunkError, match="the group csc/1 is missing"):  # reading it says so too
        dufs.open(copy).block(1, "csc")


def test_an_array_shorter_than_the_metadata_says_is_named(copy):
    g = zarr.open_group(copy, mode="r+")
    write_array(g["csc/0"], "data", np.asarray(g["csc/0/data"][...])[:-1])  # valid chunks, one value short
    with pytest.raises(CorruptChunkError, match=r"csc/0/data has shape \(\d+,\); the store's metadata says \(\d+,\)"):
        verify_store(copy)


def test_unreadable_array_metadata_is_named(copy):
    Path(copy, "csr/0/data/zarr.json").write_text("{ not json")
    with pytest.raises(CorruptChunkError, match=r"csr/0/data/zarr\.json is unreadable"):
        verify_store(copy)


def test_a_chunk_missing_from_a_shard_is_named(copy):
    """Zarr reads an inner chunk its shard's index does not list as fill values: verify reads the index."""
    g = zarr.open_group(copy, mode="r+")
    write_array(g, "sharded", np.arange(1000), chunk=100, sharded=True)  # one shard of 10 inner chunks
    verify_store(copy)
    shard = Path(copy, "sharded/c/0")
    raw = bytearray(shard.read_bytes())
    n = 16 * 10 + 4  # the index at the end: (offset, nbytes) per inner chunk, then its crc32c
    index = np.frombuffer(bytes(raw[-n:-4]), dtype="<u8").reshape(10, 2).copy()
    index[3] = np.iinfo(np.uint64).max  # "no such chunk"
    body = index.tobytes()
    raw[-n:] = body + np.uint32(google_crc32c.value(body)).tobytes()
    shard.write_bytes(bytes(raw))
    assert np.all(zarr.open_array(str(Path(copy, "sharded")))[300:400] == 0)  # silently zeros
    with pytest.raises(CorruptChunkError, match=r"1 damaged chunk: sharded/c/0 \(inner chunk 3\) is missing from its "
                                                r"shard;"):
        verify_store(copy)
    raw[-2] ^= 0x01  # the index itself damaged
    shard.write_bytes(bytes(raw))
    with pytest.raises(CorruptChunkError, match=r"sharded/c/0 has a shard index that fails its crc32c checksum"):
        verify_store(copy)


# ------------------------------------------------------------------------------------------------------ not a store
def test_no_completion_marker_is_an_incomplete_store(copy):
    meta_file = Path(copy, "zarr.json")
    meta = json.loads(meta_file.read_text())
    meta["attributes"]["dufs"]["complete"] = False
    meta_file.write_text(json.dumps(meta))
    with pytest.raises(IncompleteStoreError, match="no completion marker"):
        verify_store(copy)
    assert store_kind(copy)[0] == "store"  # still dufs' own (overwrite may replace it)
    del meta["attributes"]["dufs"]
    meta_file.write_text(json.dumps(meta))
    with pytest.raises(IncompleteStoreError, match="no completion marker"):
        verify_store(copy)


def test_nothing_there(tmp_path):
    with pytest.raises(StoreError, match="no dufs store at"):
        verify_store(tmp_path / "nothing.zarr")


# ------------------------------------------------------------------------------------------------------ memory
def test_memory_is_bounded_by_a_chunk(tmp_path):
    """Verifying a store of ~34 MB of chunks in chunks of 256 kB allocates a few chunks' worth, not the store."""
    rng = np.random.default_rng(0)
    n, d, nnz = 20_000, 4_000, 1_400_000
    X = sp.csr_array((rng.standard_normal(nnz), (rng.integers(0, n, nnz), rng.integers(0, d, nnz))), shape=(n, d))
    path = str(tmp_path / "big.zarr")
    with dask.config.set({"dufs.store.chunk-elements": 32_768, "dufs.store.compressor": "none",
                          "dufs.store.row-block": 5_000, "dufs.store.feature-granule": 256,
                          "dufs.store.feature-block-nnz": 500_000}):
        write_store(X, path, value_dtype=np.float64)
    chunk_bytes = 32_768 * 8
    tracemalloc.start()
    try:
        rep = verify_store(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert rep.bytes > 30e6
    assert peak < 12 * chunk_bytes, (peak, rep.bytes)
