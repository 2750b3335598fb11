"""The store layout (``dufs.data.layout``): one reader per format version, metadata round trips, ``read_block``."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import scipy.sparse as sp

from dufs.data import StoreBuilder, StoreMeta, layout, open_store, read_block, write_store
from dufs.data._exec import Executor
from dufs.errors import IncompleteStoreError, StoreError


@pytest.fixture
def small(store_path):
    X = sp.random_array((40, 30), density=0.2, format="csr", rng=3, dtype=np.float32)
    y = np.arange(40) % 3.0
    return write_store(X, store_path(), y, row_block=16, feature_block=8)


def _set_root_meta(path: str, **changes) -> None:
    with open(os.path.join(path, "zarr.json")) as f:
        doc = json.load(f)
    meta = doc["attributes"]["dufs"]
    for k, v in changes.items():
        if v is None:
            meta.pop(k, None)
        else:
            meta[k] = v
    with open(os.path.join(path, "zarr.json"), "w") as f:
        json.dump(doc, f)


def test_meta_is_typed_and_round_trips(small):
    m = small.meta
    assert isinstance(m, StoreMeta) and m.version == layout.FORMAT_VERSION
    assert m.shape == (40, 30) and m.nnz == small.nnz and m.dtype == np.float32 and m.has_labels
    assert np.array_equal(small.bounds("csr"), m.row_bounds) and np.array_equal(small.bounds("csc"), m.feature_bounds)
    assert len(m.feature_checksums) == small.n_blocks("csc") and m.y_checksum.startswith("crc32c:")
    # what this dufs writes is what it reads back, key for key and in order
    stored = {k: v for k, v in small.attrs.items() if k != "complete"}
    assert json.dumps(layout.meta_attrs(m)) == json.dumps(stored)
    assert layout.read_meta({"dufs": {**layout.meta_attrs(m), "complete": True}}, "x") == m
    assert m.fingerprint_fields() == {k: small.attrs.get(k) for k in ("shape", "nnz", "dtype", "csr", "csc",
                                                                      "y_checksum")}


def test_expected_nodes_are_the_stores(small):
    got = {os.path.relpath(dp, small.path) for dp, _, fn in os.walk(small.path) if "zarr.json" in fn} - {"."}
    want = set(small.meta.expected_arrays()) | set(small.meta.expected_groups())
    # and the labels of each row block, written by the build and left in place
    assert got == want | {layout.block_array_path("csr", i, layout.ROW_LABELS) for i in range(small.n_blocks("csr"))}
    assert small.meta.expected_arrays()["csc/0/indptr"] == small.bounds("csc")[1] + 1


@pytest.mark.parametrize("version, says", [(2, r"format version 2, newer than this dufs reads \(version 1\); "
                                               r"upgrade dufs"),
                                           (0, r"format version 0, which this dufs does not read \(it reads "
                                               r"version 1\)"),
                                           ("1", r"format version '1', which this dufs does not read"),
                                           (None, r"format version None, which this dufs does not read")])
def test_a_version_without_a_reader_is_one_line_naming_the_store(small, version, says):
    _set_root_meta(small.path, format_version=version)
    with pytest.raises(StoreError, match=says) as err:
        open_store(small.path)
    assert small.path in str(err.value) and "\n" not in str(err.value)


def test_a_reader_per_version(small, monkeypatch):
    """A new version is one more reader: the dispatch picks it by the stored version."""
    seen = []

    def read_v2(meta):
        seen.append(meta["format_version"])
        return layout._READERS[1](meta)  # noqa: SLF001 - a test of the dispatch table itself

    monkeypatch.setitem(layout._READERS, 2, read_v2)  # noqa: SLF001 - as above
    _set_root_meta(small.path, format_version=2)
    st = open_store(small.path)
    assert seen == [2] and st.shape == (40, 30)


def test_malformed_metadata_is_a_store_error(small):
    _set_root_meta(small.path, csc=None)
    with pytest.raises(StoreError, match="metadata .*malformed"):
        open_store(small.path)


def test_no_completion_marker(small):
    _set_root_meta(small.path, complete=False)
    with pytest.raises(IncompleteStoreError, match="no completion marker"):
        open_store(small.path)


def test_read_block_is_the_stores_block(small):
    for o in layout.ORIENTATIONS:
        for i in range(small.n_blocks(o)):
            want = small.block(i, o)
            for got in (read_block(small.path, o, i), read_block(small.path, o, i, created=small.meta.created)):
                assert (got.start, got.stop, got.orientation, got.index) == (want.start, want.stop, o, i)
                for a, b in zip((got.indptr, got.indices, got.data), (want.indptr, want.indices, want.data),
                                strict=True):
                    np.testing.assert_array_equal(a, b, strict=True)


def test_read_block_refuses_a_replaced_store(small):
    created = small.meta.created
    write_store(sp.random_array((40, 30), density=0.1, format="csr", rng=4), small.path, overwrite=True)
    with pytest.raises(StoreError, match="was replaced"):
        read_block(small.path, "csc", 0, created=created)
    assert read_block(small.path, "csc", 0).nnz == open_store(small.path).block(0, "csc").nnz


def test_row_block_meta_and_resume_of_another_format_version(store_path):
    path = store_path()
    b = StoreBuilder(path, options={"x": 1})
    b.begin()
    info = b.write_row_block(0, np.array([0, 1, 3]), np.array([2, 0, 5]), np.array([1.0, 2.0, 3.0]),
                             extra={"note": "mine"})
    got = b.row_block_meta(0)
    assert got == info and got.extra == {"note": "mine"} and (got.n_rows, got.nnz, got.max_index) == (2, 3, 5)
    assert b.row_block_infos() == [info]
    b.abort(remove=False)
    partial = path + layout.PARTIAL_SUFFIX
    with open(os.path.join(partial, "zarr.json")) as f:
        doc = json.load(f)
    doc["attributes"]["dufs_partial"]["format_version"] = 99
    with open(os.path.join(partial, "zarr.json"), "w") as f:
        json.dump(doc, f)
    with pytest.raises(StoreError, match="format version 99, this one writes 1"):
        StoreBuilder(path, options={"x": 1}, resume=True).begin()


def test_ingest_record_round_trips_and_reads_old_records():
    rec = layout.IngestRecord(3, 1, 0, 1, 2, 100, 2, [[2, 10, "bad"]], [0, 0, 100])
    assert layout.IngestRecord.from_attrs(rec.attrs()) == rec
    old = {k: v for k, v in rec.attrs().items() if k not in ("n_qid", "skipped")}  # before qid fields were kept
    assert layout.IngestRecord.from_attrs(old) == layout.IngestRecord(3, 1, 0, 1, 0, 100, 2, [], [0, 0, 100])


def test_executor_threads():
    with Executor(max_workers=3) as ex:
        assert ex.client is not None or ex.n_workers == 3


def test_finished_blocks_skip_a_block_folder_without_metadata_quietly(tmp_path):
    """A conversion killed between a block's folder and its metadata leaves the folder alone: the block is
    unfinished (a resume writes it again), and listing it raises no Zarr warning."""
    import warnings

    import zarr

    root = zarr.open_group(str(tmp_path / "p.zarr"), mode="w")
    rows = root.require_group("csr")
    for i, done in ((0, True), (1, False), (2, True)):
        g = rows.require_group(str(i))
        if done:
            g.attrs["complete"] = True
    os.makedirs(tmp_path / "p.zarr" / "csr" / "8")  # the folder of block 8, killed before its zarr.json
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = layout.finished_blocks(zarr.open_group(str(tmp_path / "p.zarr"), mode="r"), "csr")
    assert got == {0, 2}
