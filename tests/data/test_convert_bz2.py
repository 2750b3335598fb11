"""bzip2 input decompressed in ranges of its blocks by the tasks (dufs.data.bz2blocks): the ranges' texts tile
the file's text exactly, and a conversion in ranges equals scikit-learn's reading, names bad lines and corrupt data
as the sequential way does (the reference: Python's bz2 module on the whole file)."""

from __future__ import annotations

import bz2
import importlib.util
import re

import dask
import pytest

from dufs.data import bz2blocks
from dufs.data.convert import convert_libsvm
from dufs.errors import InputFormatError
from tests.data.test_convert import (
    assert_equals_sklearn,
    assert_no_output,
    line_span,
    lines_of,
    random_data,
    sk_load,
    svm_text,
    with_line,
)

SEQUENTIAL = {"dufs.convert.parallel-bz2": False}
DECODERS = ["stdlib"] + (["indexed_bzip2"] if importlib.util.find_spec("indexed_bzip2") else [])


@pytest.fixture(autouse=True, params=DECODERS)
def decoder(request):
    """Every test here with the ranges decompressed by each decompressor (``dufs.convert.bz2-decoder``; workers of a
    process cluster started before keep their own, the default)."""
    with dask.config.set({"dufs.convert.bz2-decoder": request.param}):
        yield request.param


@pytest.fixture(scope="module")
def text() -> bytes:
    """About 450 kB of libsvm text (4 to 5 bzip2 blocks at level 1)."""
    X, y = random_data(3000, 2000, 0.012, seed=41)
    return svm_text(X, y)


def _files(tmp_path, text: bytes) -> dict:
    """The text as one level-1 stream, as two streams of other levels (as parallel bzip2 writes), and with a
    line longer than a range in the middle."""
    cut = len(text) // 3 + 17
    long_line = b"1 " + b" ".join(b"%d:1" % j for j in range(1, 40_000)) + b"\n"
    k = text.index(b"\n", len(text) // 2) + 1
    with_long = text[:k] + long_line + text[k:]
    out = {}
    for name, data, raw in [("one", bz2.compress(text, 1), text),
                            ("two", bz2.compress(text[:cut], 1) + bz2.compress(text[cut:], 2), text),
                            ("long", bz2.compress(with_long, 1), with_long)]:
        p = tmp_path / f"{name}.svm.bz2"
        p.write_bytes(data)
        out[name] = (str(p), raw)
    return out


@pytest.mark.parametrize("block_bytes", [100_000, 250_000, 10**9])
def test_ranges_tile_the_text(tmp_path, text, block_bytes):
    for name, (path, raw) in _files(tmp_path, text).items():
        size = len(open(path, "rb").read())
        assert bz2blocks.tail_is_complete(path, size)
        rs = list(bz2blocks.ranges(path, size, block_bytes))
        assert rs[0].first and rs[-1].last and not any(r.first for r in rs[1:])
        if block_bytes == 100_000:
            assert len(rs) >= 4, (name, len(rs))
        texts = [bz2blocks.range_text(path, r) for r in rs]
        assert b"".join(texts) == raw, name
        assert all(t.endswith(b"\n") for t in texts if t), name  # whole lines
        if name == "long" and block_bytes == 100_000:
            assert b"" in texts  # a range inside the long line has no text of its own


def test_truncated_or_garbled_tail_is_not_split(tmp_path, text):
    data = bz2.compress(text, 1)
    cut = tmp_path / "cut.bz2"
    cut.write_bytes(data[:-7])
    assert not bz2blocks.tail_is_complete(str(cut), len(data) - 7)
    bad = bytearray(data)
    bad[-3] ^= 0x21  # the stream's combined CRC
    garbled = tmp_path / "crc.bz2"
    garbled.write_bytes(bytes(bad))
    with pytest.raises(ValueError, match="combined CRC"):
        list(bz2blocks.scan(str(garbled), len(bad)))


def test_conversion_in_ranges_equals_sklearn(tmp_path, text):
    """In ranges (several row blocks from one file, on local threads), the same store as scikit-learn's reading and
    the same report as the sequential way."""
    for name, (path, raw) in _files(tmp_path, text).items():
        st, rep = convert_libsvm(path, tmp_path / f"{name}.zarr", value_dtype="float64", block_bytes=100_000)
        assert st.n_blocks("csr") >= 3
        assert_equals_sklearn(st, *sk_load(raw))
        with dask.config.set(SEQUENTIAL):
            _, seq = convert_libsvm(path, tmp_path / f"{name}-seq.zarr", value_dtype="float64", block_bytes=100_000)
        assert (rep.rows, rep.lines, rep.nnz, rep.bytes) == (seq.rows, seq.lines, seq.nnz, seq.bytes) == (
            len(lines_of(raw)), len(lines_of(raw)), st.nnz, len(raw))
        # a resume must cut the file the same way: the options it compares say how
        assert st.provenance["options"]["inputs"][0][-1] == "bz2 ranges"


@pytest.mark.slow
def test_conversion_in_ranges_on_a_process_cluster(tmp_path, text, cluster_client):
    path, raw = _files(tmp_path, text)["two"]
    st, _ = convert_libsvm(path, tmp_path / "out.zarr", value_dtype="float64", block_bytes=100_000,
                           client=cluster_client)
    assert_equals_sklearn(st, *sk_load(raw))


def test_bad_line_in_a_later_range_is_named(tmp_path, text):
    """The line number and byte offset come from the ranges before the bad one: the same as in the text."""
    bad_text = with_line(with_line(text, 2400, b"1 3:1 9:x"), 2900, b"1 0:1")
    src = tmp_path / "bad.svm.bz2"
    src.write_bytes(bz2.compress(bad_text, 1))
    with pytest.raises(InputFormatError, match=rf"^{re.escape(str(src))}:2400: a feature value is not a number "
                                               rf"\(byte offset \d+\)$") as ei:
        convert_libsvm(src, tmp_path / "out.zarr", block_bytes=100_000)
    a, b = line_span(bad_text, 2400)
    assert ei.value.line == 2400 and a <= ei.value.offset < b
    assert_no_output(tmp_path / "out.zarr")


def test_skipped_lines_are_numbered_across_ranges(tmp_path, text):
    bad = {7: b"1 3:abc", 1500: b"nan 3:1", 2201: b"1 2:1 2:1", 2999: b"3:1"}
    bad_text = text
    for line, b in bad.items():
        bad_text = with_line(bad_text, line, b)
    src = tmp_path / "skip.svm.bz2"
    src.write_bytes(bz2.compress(bad_text, 1))
    st, rep = convert_libsvm(src, tmp_path / "out.zarr", value_dtype="float64", block_bytes=100_000,
                             on_error="skip")
    assert st.n_blocks("csr") >= 4
    assert [line for _, line, _, _ in rep.skipped] == sorted(bad)
    for _, line, offset, _ in rep.skipped:
        a, b = line_span(bad_text, line)
        assert a <= offset < b, (line, offset, a, b)
    kept = b"".join(ln for k, ln in enumerate(lines_of(bad_text), 1) if k not in bad)
    assert_equals_sklearn(st, *sk_load(kept, n_features=st.shape[1]))


@pytest.mark.parametrize("where", ["combined CRC", "a block's data"])
def test_corrupt_data_is_named(tmp_path, text, where):
    """Corrupt data is one error naming the file and how far the data went. With only the stream's combined CRC
    garbled (the data are right), it is the sequential way's error word for word; garbled data in a block is
    found by that block's CRC (the sequential way may instead parse the garbage a decompressor gives out before its
    CRC check, and name a bad line)."""
    raw = bytearray(bz2.compress(text, 1))
    if where == "combined CRC":
        raw[-2] ^= 0x5A
    else:  # a byte well inside the third block
        starts = [b.start // 8 for b in bz2blocks.scan(str(_write(tmp_path / "ok.bz2", bytes(raw))), len(raw))]
        raw[(starts[2] + starts[3]) // 2] ^= 0x5A
    src = _write(tmp_path / "bad.svm.bz2", bytes(raw))
    with pytest.raises(InputFormatError) as ei:
        convert_libsvm(src, tmp_path / "out.zarr", block_bytes=100_000)
    msg = str(ei.value)
    assert re.match(rf"{re.escape(str(src))}: compressed data is corrupt after [0-9,]+ bytes of data, line \d+ "
                    rf"\(.+\); download or copy the file again$", msg), msg
    assert ei.value.path == str(src) and ei.value.reason == "corrupt compressed stream"
    assert_no_output(tmp_path / "out.zarr")
    if where == "combined CRC":
        with dask.config.set(SEQUENTIAL), pytest.raises(InputFormatError) as seq:
            convert_libsvm(src, tmp_path / "out.zarr", block_bytes=100_000)
        assert str(seq.value) == msg


def _write(path, data: bytes):
    path.write_bytes(data)
    return path


def test_either_decompressor_gives_the_standard_librarys_bytes_and_refuses_corrupt_streams(text, decoder):
    """A multi-block stream rebuilt from a range of blocks decompresses to Python's bz2 bytes with the decompressor
    in use; a garbled block (its CRC) or a garbled combined CRC raises OSError with either; an unknown
    decompressor is a ParameterError naming the setting."""
    import os
    import tempfile

    from dufs.errors import ParameterError

    assert bz2blocks.decoder() == decoder
    raw = bz2.compress(text, 1)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "t.bz2")
        with open(path, "wb") as f:
            f.write(raw)
        blocks = list(bz2blocks.scan(path, len(raw)))
        assert len(blocks) >= 3
        stream = bz2blocks.stream_of(path, blocks[1:3])
        assert bz2blocks.decompress(stream) == bz2.decompress(stream)
        assert bz2blocks.decompress(bz2blocks.stream_of(path, blocks)) == text
    for pos in (len(stream) // 2, len(stream) - 2):
        bad = bytearray(stream)
        bad[pos] ^= 0x5A
        with pytest.raises(OSError):
            bz2blocks.decompress(bytes(bad))
    with dask.config.set({"dufs.convert.bz2-decoder": "zlib"}), pytest.raises(ParameterError, match="bz2-decoder"):
        bz2blocks.decoder()
