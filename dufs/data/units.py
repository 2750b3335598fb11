"""How ``dufs convert`` cuts its input into units of work: byte ranges of plain text cut at line boundaries,
blocks of decompressed lines of a compressed stream, or ranges of a ``.bz2`` file's bzip2 blocks; and reading a
unit's bytes (local files and fsspec URLs)."""

from __future__ import annotations

import bz2
import gzip
import lzma
import os
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import fsspec
import numpy as np

from dufs import config
from dufs.data import bz2blocks
from dufs.data._fs import RangeReader
from dufs.data._scratch import scratch
from dufs.data.bz2blocks import Bz2Range
from dufs.errors import InputFormatError

_OPENERS = {".bz2": bz2.open, ".gz": gzip.open, ".xz": lzma.open, ".lzma": lzma.open}


@dataclass(frozen=True)
class Unit:
    """One row block's worth of input: a byte range of a plain file, or a block of decompressed text."""

    block: int  # row block number within its store
    file: int  # input number
    start: int  # byte offset in the (decompressed) stream
    stop: int
    first_line: int = -1  # 1-based line of the block's first line, when known (compressed streams)
    # a range of bzip2 blocks: start and stop are bit offsets in the compressed file, and the unit's decompressed
    # offset and first line are those of the units before it (its task reports offsets within its own text)
    relative: bool = False


def _compressed(path: str) -> bool:
    return os.path.splitext(path)[1].lower() in _OPENERS


def _open_stream(path: str):
    ext = os.path.splitext(path)[1].lower()
    raw = fsspec.open(path, "rb").open()
    return _OPENERS[ext](raw, "rb") if ext in _OPENERS else raw


def _file_size(path: str) -> int:
    fs, p = fsspec.core.url_to_fs(path)
    return int(fs.size(p))


def _plain_units(path: str, file_no: int, block_bytes: int, first_block: int) -> list[Unit]:
    """Byte ranges of about ``block_bytes`` cut just after a newline."""
    size = _file_size(path)
    cuts = [0]
    with fsspec.open(path, "rb") as f:
        pos = block_bytes
        while pos < size:
            f.seek(pos)
            nl = -1
            while True:
                chunk = f.read(1 << 16)
                if not chunk:
                    break
                k = chunk.find(b"\n")
                if k >= 0:
                    nl = f.tell() - len(chunk) + k
                    break
            if nl < 0 or nl + 1 >= size:
                break
            cuts.append(nl + 1)
            pos = nl + 1 + block_bytes
    cuts.append(size)
    return [Unit(first_block + k, file_no, a, b) for k, (a, b) in enumerate(zip(cuts[:-1], cuts[1:], strict=False))]


def _stream_blocks(path: str, block_bytes: int) -> Iterator[tuple[int, int, bytes]]:
    """Blocks of whole lines from a compressed stream: (start offset, first line, bytes).

    A stream that ends early (a truncated file) or does not decompress is an :class:`InputFormatError` naming the
    file and how far it got, raised after the blocks before it were yielded.
    """
    start, line, carry = 0, 1, b""
    with _open_stream(path) as f:
        while True:
            chunk = _read_exactly(f, block_bytes, path, start + len(carry), line)
            if not chunk:
                break
            buf = carry + chunk
            k = buf.rfind(b"\n")
            if k < 0:
                carry = buf
                continue
            out, carry = buf[:k + 1], buf[k + 1:]
            yield start, line, out
            start += len(out)
            line += out.count(b"\n")
    if carry:
        yield start, line, carry


def _read_exactly(f: Any, n: int, path: str, offset: int, line: int) -> bytes:
    """``n`` bytes of a decompressing stream (fewer only at its end), as ``f.read(n)`` but keeping every byte
    that decompressed before an error, to say how far the data went (``offset``, ``line``: where ``f`` is)."""
    parts: list[bytes] = []
    got = 0
    while got < n:
        try:
            piece = f.read1(n - got)
        except (EOFError, OSError, lzma.LZMAError, zlib.error) as exc:
            seen = b"".join(parts)
            at = offset + len(seen)
            at_line = line + seen.count(b"\n")
            if isinstance(exc, EOFError):
                msg = (f"{path}: compressed stream ends early (truncated file?) after {at:,} bytes of data, line "
                       f"{at_line}; download or copy the file again, or decompress what is left and convert that")
                reason = "truncated compressed stream"
            else:
                why = " ".join(str(exc).split()) or type(exc).__name__
                msg = (f"{path}: compressed data is corrupt after {at:,} bytes of data, line {at_line} ({why}); "
                       f"download or copy the file again")
                reason = "corrupt compressed stream"
            raise InputFormatError(msg, path=path, line=at_line, offset=at, reason=reason) from None
        if not piece:
            break
        parts.append(piece)
        got += len(piece)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def _read_range(path: str, start: int, stop: int) -> np.ndarray:
    if not _is_url(path):  # into this process's scratch memory (no fresh pages a block: dufs.data._scratch)
        out = scratch("text", stop - start, np.uint8)
        with RangeReader(path, local=True) as r:  # a short file: EOFError
            r.read_into(start, out)
        return out
    with fsspec.open(path, "rb") as f:
        f.seek(start)
        return np.frombuffer(f.read(stop - start), dtype=np.uint8)


def _is_url(path: str) -> bool:
    return "://" in path


def _parallel_bz2(path: str, block_bytes: int) -> bool:
    """Whether ``path`` is a .bz2 file to decompress in ranges of its blocks on the cluster: with
    ``dufs.convert.parallel-bz2`` on, row blocks of ``block_bytes`` at least a bzip2 block (a range is one or
    more of them), and a file that ends with an end-of-stream marker (a truncated one goes the sequential way,
    which parses what there is and then says where it ends)."""
    if os.path.splitext(path)[1].lower() != ".bz2" or not config.get("convert.parallel-bz2"):
        return False
    try:
        big_enough = block_bytes >= bz2blocks.level(path) * 100_000
    except ValueError:  # not a bzip2 stream: the sequential way says so
        return False
    return big_enough and bz2blocks.tail_is_complete(path, _file_size(path))


def _units(path: str, file_no: int, block_bytes: int, first_block: int, in_ranges: bool) -> Iterator[tuple]:
    """The units of an input from row block ``first_block`` on, each with what its task gets besides the path: a
    range of bzip2 blocks (``in_ranges``), a block of text decompressed here (other compressed input), or nothing
    (a byte range of a plain file, which the task reads)."""
    if in_ranges:
        yield from _bz2_units(path, file_no, block_bytes, first_block)
    elif _compressed(path):
        for k, (start, line, buf) in enumerate(_stream_blocks(path, block_bytes)):
            yield Unit(first_block + k, file_no, start, start + len(buf), first_line=line), buf
    else:
        for u in _plain_units(path, file_no, block_bytes, first_block):
            yield u, None


def _bz2_units(path: str, file_no: int, block_bytes: int, first_block: int) -> Iterator[tuple[Unit, Bz2Range]]:
    """The units of a .bz2 file, a range of its bzip2 blocks each (:func:`dufs.data.bz2blocks.ranges`)."""
    size = _file_size(path)
    try:
        for k, r in enumerate(bz2blocks.ranges(path, size, block_bytes)):
            yield Unit(first_block + k, file_no, r.blocks[0].start, r.blocks[-1].stop, relative=True), r
    except ValueError as exc:
        _decompress_error(path, block_bytes, str(exc))


def _decompress_error(path: str, block_bytes: int, why: str) -> None:
    """Raise the error of a .bz2 file whose blocks did not decompress on their own: decompressed as one stream it
    says where the data is corrupt or ends (as the sequential way does). If it decompresses whole, a block magic
    was found by chance inside compressed data: say so, and how to convert the file anyway."""
    for _ in _stream_blocks(path, block_bytes):
        pass
    raise InputFormatError(
        f"{path}: the file decompresses as a whole, but not in ranges of its bzip2 blocks ({why}): a block "
        f"boundary was found by chance inside compressed data; convert it with the configuration "
        f"dufs.convert.parallel-bz2 set to false (DASK_DUFS__CONVERT__PARALLEL_BZ2=false)",
        path=path, reason="bzip2 block boundary")


def _lines_before(path: str, offset: int) -> int:
    """Newlines in the first ``offset`` bytes of a plain file (only on the error path)."""
    n = 0
    with fsspec.open(path, "rb") as f:
        left = offset
        while left > 0:
            chunk = f.read(min(left, 1 << 24))
            if not chunk:
                break
            n += chunk.count(b"\n")
            left -= len(chunk)
    return n
