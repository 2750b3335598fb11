"""Arrays written straight into a local directory (dufs.data._direct) are Zarr's own: the same chunk bytes, read
back through Zarr, for every compressor the store offers; anything else goes through Zarr."""

from __future__ import annotations

import os

import dask
import numpy as np
import pytest
import zarr
from zarr.storage import MemoryStore

from dufs.data import _direct
from dufs.data.store import _array_spec, write_array, write_arrays

ARRAYS = {
    "i32": np.random.default_rng(0).integers(0, 1 << 24, 1001).astype(np.int32),
    "f32": np.random.default_rng(1).random(1001).astype(np.float32),
    "i64": np.arange(257, dtype=np.int64),  # chunks of 100: a last chunk of 57, stored whole as Zarr stores it
    "f64": np.random.default_rng(2).random(3),
    "empty": np.zeros(0, np.float64),
}


@pytest.mark.parametrize("compressor", ["blosc-lz4", "blosc-zstd", "zstd", "none"])
def test_chunks_are_the_bytes_zarr_writes_and_read_back_through_zarr(tmp_path, compressor):
    with dask.config.set({"dufs.store.compressor": compressor, "dufs.store.compression-level": 3}):
        for values in ARRAYS.values():  # written the direct way, not handed to Zarr
            assert _direct._template(values.dtype, _array_spec(values, 100)) is not None
        local = zarr.open_group(str(tmp_path / "a.zarr"), mode="w", zarr_format=3).create_group("blk")
        write_arrays(local, ARRAYS, chunk=100)
        held: dict = {}  # Zarr's own writing of the same arrays, in memory (never the direct way)
        zarr_way = zarr.open_group(MemoryStore(held), mode="w", zarr_format=3).create_group("blk")
        write_arrays(zarr_way, ARRAYS, chunk=100)
    back = zarr.open_group(str(tmp_path / "a.zarr"), mode="r")["blk"]
    for name, values in ARRAYS.items():
        arr = back[name]
        assert arr.dtype == values.dtype and arr.shape == values.shape
        assert arr.chunks == (min(100, max(1, values.size)),)
        np.testing.assert_array_equal(arr[:], values)
        assert arr.nchunks_initialized == arr.nchunks  # every chunk stored
        chunks = {k: v.to_bytes() for k, v in held.items() if k.startswith(f"blk/{name}/c/")}
        assert len(chunks) == arr.nchunks
        for key, want in chunks.items():
            with open(tmp_path / "a.zarr" / key, "rb") as f:
                assert f.read() == want, key
        assert arr.metadata.to_dict() == zarr.open_group(MemoryStore(held), mode="r")["blk"][name].metadata.to_dict()


def test_a_corrupt_chunk_is_caught_by_zarrs_checksum(tmp_path):
    g = zarr.open_group(str(tmp_path / "a.zarr"), mode="w", zarr_format=3)
    write_array(g, "x", np.arange(1000, dtype=np.int32), chunk=300)
    path = tmp_path / "a.zarr" / "x" / "c" / "1"
    raw = bytearray(path.read_bytes())
    raw[5] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.raises(Exception, match="(?i)checksum|crc"):
        zarr.open_group(str(tmp_path / "a.zarr"), mode="r")["x"][:]


def test_a_shorter_array_replaces_a_longer_one_without_leftover_chunks(tmp_path):
    g = zarr.open_group(str(tmp_path / "a.zarr"), mode="w", zarr_format=3)
    write_array(g, "x", np.arange(1000, dtype=np.int64), chunk=100)
    write_array(g, "x", np.arange(150, dtype=np.int64) * 2, chunk=100)
    assert sorted(os.listdir(tmp_path / "a.zarr" / "x" / "c")) == ["0", "1"]
    np.testing.assert_array_equal(zarr.open_group(str(tmp_path / "a.zarr"), mode="r")["x"][:], np.arange(150) * 2)


def test_codecs_it_does_not_write_go_through_zarr(tmp_path):
    """A codec chain with one the module does not encode (here a shuffle filter before blosc's) is refused without
    writing anything, and write_array then writes it through Zarr; sharded arrays always go through Zarr."""
    import zarr.codecs as zc

    spec = _array_spec(np.arange(10, dtype=np.int32), None)
    spec["compressors"] = [zc.GzipCodec(level=1), zc.Crc32cCodec()]
    assert _direct.write_local(str(tmp_path), "x", np.arange(10, dtype=np.int32), spec) is False
    assert not (tmp_path / "x").exists()
    g = zarr.open_group(str(tmp_path / "s.zarr"), mode="w", zarr_format=3)
    arr = write_array(g, "sh", np.arange(500, dtype=np.int32), chunk=100, sharded=True)
    assert arr.shards == (500,)
    np.testing.assert_array_equal(zarr.open_group(str(tmp_path / "s.zarr"), mode="r")["sh"][:], np.arange(500))
