"""bzip2 input decompressed in parallel, a range of its blocks per task.

A bzip2 file is one or more streams (``BZh`` and a level digit, then blocks, then an end-of-stream marker with
the stream's combined CRC, padded to a byte). Each block starts with the 48-bit magic ``0x314159265359`` at any
bit offset, followed by the CRC of its own data, and decompresses independently of the others. The driver finds
the blocks (:func:`scan`: the magics at every bit offset, read in chunks) and groups consecutive ones into
ranges; a task rebuilds a range as a standalone stream (a header, the blocks' bits, an end-of-stream marker and
the combined CRC of those blocks: ``crc = rotl(crc, 1) ^ block_crc`` over them) and decompresses it with the
standard library, so libbz2 still checks every block's CRC and the combined one.

Ranges are cut at block boundaries, lines are not: a task drops the text before its range's first newline (it
belongs to the line the previous range ends with; the first range of a file keeps it) and reads on past its
range's end, block by block, to the first newline after it (:func:`range_text`). The texts of the ranges so tile
the decompressed stream exactly, line by line.

A range decompresses with ``indexed_bzip2`` where it is installed (``pip install 'dufs[fast-bz2]'``; one thread a
task, somewhat faster than libbz2: docs/measurements.md, "bzip2"; every block's CRC and the stream's checked as
libbz2 does), else with the standard library (``dufs.convert.bz2-decoder``: ``auto``, or ``stdlib`` for libbz2
always).

The 48-bit magic can occur by chance inside compressed data (about once in 2**48 bit positions, and a block
header must follow it); a range whose rebuilt stream does not decompress is reported to the driver, which
decompresses the file sequentially to say where it is corrupt, or, if it is not, reports the false boundary.
"""

from __future__ import annotations

import bz2
import importlib.util
import itertools
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from dufs import config
from dufs.errors import ParameterError

BLOCK_MAGIC = 0x314159265359
EOS_MAGIC = 0x177245385090
_MASK48 = (1 << 48) - 1
_SCAN_CHUNK = 8 << 20  # bytes of compressed data read and searched at a time
_OVERLAP = 16  # bytes shared by consecutive chunks: a magic and the 32 bits after it fit in 11


@dataclass(frozen=True)
class Block:
    """One bzip2 block: its bits are ``[start, stop)`` of the file (``stop`` is the next magic), ``crc`` its
    data's CRC (the 32 bits after its magic), ``level`` the block size of its stream (1 to 9, x 100 kB)."""

    start: int
    stop: int
    crc: int
    level: int


@dataclass(frozen=True)
class Bz2Range:
    """A task's share of a bzip2 file (of ``size`` bytes): consecutive blocks, whether it is the file's first (it
    keeps the text before its first newline) and whether it is the last (there is nothing to read on past it)."""

    blocks: tuple[Block, ...]
    first: bool
    last: bool
    size: int


def _prefilters() -> tuple[np.ndarray, dict[int, list[tuple[int, int]]]]:
    """A table over 16-bit values marking those that bytes 1 and 2 of a window holding a magic ``shift`` bits into
    its byte 0 can have, and for each such value its (shift, magic) pairs: both magics, all 8 shifts."""
    table = np.zeros(1 << 16, dtype=bool)
    pairs: dict[int, list[tuple[int, int]]] = {}
    for magic in (BLOCK_MAGIC, EOS_MAGIC):
        for s in range(8):
            key = (magic >> (24 + s)) & 0xFFFF
            table[key] = True
            pairs.setdefault(key, []).append((s, magic))
    return table, pairs


_KEYS, _PAIRS = _prefilters()


def find_magics(raw: bytes, base_bit: int = 0) -> list[tuple[int, int]]:
    """Every block or end-of-stream magic in ``raw``: sorted ``(bit position, magic)``, positions counted
    from ``base_bit`` (the bit offset of its first byte in the file). Magics that do not end inside it are not found.
    Vectorized: bytes 1 and 2 of every 7-byte window looked up in a table of the 16 values a magic can put there
    (one window in 4,096 passes), then the passing windows checked whole."""
    a = np.frombuffer(raw, dtype=np.uint8)
    n = a.shape[0]
    if n < 7:
        return []
    pair = a[1:n - 5].astype(np.uint16)
    pair <<= 8
    pair |= a[2:n - 4]  # bytes i+1, i+2 of windows starting at i < n - 6
    found: list[tuple[int, int]] = []
    for i in np.flatnonzero(_KEYS[pair]).tolist():
        w = int.from_bytes(raw[i:i + 7], "big")  # 56 bits
        for s, magic in _PAIRS[(raw[i + 1] << 8) | raw[i + 2]]:
            if (w >> (8 - s)) & _MASK48 == magic:
                found.append((base_bit + 8 * i + s, magic))
    found.sort()
    return found


def _read(path: str, start: int, stop: int) -> bytes:
    import fsspec

    with fsspec.open(path, "rb") as f:
        f.seek(start)
        return f.read(stop - start)


def _bits(data: bytes, first_bit: int, start: int, n: int) -> int:
    """The ``n`` bits at file bit ``start`` of ``data`` (whose first byte is file bit ``first_bit``)."""
    off = start - first_bit
    lo, hi = off // 8, (off + n + 7) // 8
    v = int.from_bytes(data[lo:hi], "big")
    return (v >> (8 * (hi - lo) - (off - 8 * lo) - n)) & ((1 << n) - 1)


def tail_is_complete(path: str, size: int) -> bool:
    """Whether the file ends with an end-of-stream marker (a truncated file does not)."""
    if size < 14:
        return False
    tail = _read(path, size - 11, size)
    for pos, magic in find_magics(tail, 8 * (size - 11)):
        if magic == EOS_MAGIC and (pos + 80 + 7) // 8 == size:
            return True
    return False


def level(path: str) -> int:
    """The block size (1 to 9, x 100 kB) of a bzip2 file's first stream; :class:`ValueError` if it has none."""
    return _header_level(_read(path, 0, 4), path, 0)


def scan(path: str, size: int) -> Iterator[Block]:
    """The blocks of a bzip2 file, in order. Raises :class:`ValueError` on a file that is not a sequence of
    well-formed bzip2 streams (no ``BZh`` header where a stream starts, no end-of-stream marker at the end: a
    truncated file; a stream whose combined CRC does not match its blocks'), after the blocks before that point;
    the caller then decompresses it sequentially, which says what is wrong."""
    yield from _blocks_from(path, size, 32, level(path), _SCAN_CHUNK, strict=True)


def _blocks_from(path: str, size: int, from_bit: int, level: int, chunk: int, strict: bool) -> Iterator[Block]:
    """The blocks whose magic is at or after bit ``from_bit``, in order, reading ``chunk`` bytes at a time.
    ``level`` is the block size of the stream ``from_bit`` is in. ``strict``: raise :class:`ValueError` when the
    data ends without an end-of-stream marker after the last block."""
    pending: tuple[int, int] | None = None  # (start bit, crc) of a block whose stop is the next magic
    combined = 0  # the stream's combined CRC so far (checked against its end-of-stream marker when strict)
    header_at = -1  # byte where the next stream's header is, after an end-of-stream marker
    last = from_bit - 1
    pos = from_bit // 8
    while pos < size:
        stop = min(size, pos + chunk + _OVERLAP)
        data = _read(path, pos, stop)
        for bit, magic in find_magics(data, 8 * pos):
            if bit <= last:
                continue  # before the start, or found again in the previous chunk's overlap
            if (bit + 80 + 7) // 8 > stop and stop < size:
                break  # its CRC is in the next chunk: find it there
            last = bit
            if header_at >= 0:
                if bit < 8 * (header_at + 4):
                    continue
                level = _header_level(_slice(path, data, pos, header_at, 4), path, header_at)
                header_at = -1
            if pending is not None:
                yield Block(pending[0], bit, pending[1], level)
                pending = None
            crc = _bits(data, 8 * pos, bit + 48, 32)
            if magic == BLOCK_MAGIC:
                pending = (bit, crc)
                combined = (((combined << 1) | (combined >> 31)) & 0xFFFFFFFF) ^ crc
                continue
            if strict and crc != combined:
                raise ValueError(f"{path}: the combined CRC of the bzip2 stream ending at byte {(bit + 80 + 7) // 8} "
                                 f"does not match its blocks'")
            combined = 0
            if (bit + 80 + 7) // 8 >= size:
                return
            header_at = (bit + 80 + 7) // 8
        pos += chunk
    if strict:
        raise ValueError(f"{path}: does not end with a bzip2 end-of-stream marker (truncated?)")
    if pending is not None:  # read on past the data (not strict): the last block runs to the end
        yield Block(pending[0], 8 * size, pending[1], level)


def _slice(path: str, data: bytes, pos: int, at: int, n: int) -> bytes:
    """``n`` bytes at byte ``at`` of the file, from ``data`` (the file's bytes from ``pos``) when it has them."""
    if pos <= at and at + n <= pos + len(data):
        return data[at - pos:at - pos + n]
    return _read(path, at, at + n)


def _header_level(head: bytes, path: str, at: int) -> int:
    if len(head) < 4 or head[:3] != b"BZh" or not 0x31 <= head[3] <= 0x39:
        raise ValueError(f"{path}: no bzip2 stream header at byte {at}")
    return head[3] - 0x30


def ranges(path: str, size: int, block_bytes: int) -> Iterator[Bz2Range]:
    """The blocks of a bzip2 file of ``size`` bytes (:func:`scan`) grouped into ranges of about ``block_bytes``
    of text (a block holds at most its level x 100 kB), in order."""
    cur: list[Block] = []
    text = 0
    first = True
    for b in scan(path, size):
        if cur and text + b.level * 100_000 > block_bytes:
            yield Bz2Range(tuple(cur), first, False, size)
            cur, text, first = [], 0, False
        cur.append(b)
        text += b.level * 100_000
    if cur:
        yield Bz2Range(tuple(cur), first, True, size)


def stream_of(path: str, blocks: tuple[Block, ...] | list[Block]) -> bytes:
    """A standalone bzip2 stream of ``blocks`` (consecutive blocks of ``path``): a level-9 header, their bits,
    an end-of-stream marker and their combined CRC."""
    lo, hi = blocks[0].start // 8, (blocks[-1].stop + 7) // 8
    data = _read(path, lo, hi)
    acc = 0
    n = 0
    crc = 0
    run_start = blocks[0].start
    for k, b in enumerate(blocks):  # contiguous runs of blocks (a stream boundary breaks a run)
        crc = (((crc << 1) | (crc >> 31)) & 0xFFFFFFFF) ^ b.crc
        if k + 1 == len(blocks) or blocks[k + 1].start != b.stop:
            width = b.stop - run_start
            acc = (acc << width) | _bits(data, 8 * lo, run_start, width)
            n += width
            if k + 1 < len(blocks):
                run_start = blocks[k + 1].start
    acc = (((acc << 48) | EOS_MAGIC) << 32) | crc
    n += 80
    pad = -n % 8
    return b"BZh9" + (acc << pad).to_bytes((n + pad) // 8, "big")


def decoder() -> str:
    """The decompressor :func:`decompress` uses here: ``"indexed_bzip2"`` where it is installed and
    ``dufs.convert.bz2-decoder`` is ``auto``, else ``"stdlib"`` (libbz2 through Python's :mod:`bz2`)."""
    choice = str(config.get("convert.bz2-decoder")).lower()
    if choice not in ("auto", "stdlib", "indexed_bzip2"):
        raise ParameterError(f"dufs.convert.bz2-decoder must be 'auto', 'stdlib' or 'indexed_bzip2'; got {choice!r}.")
    if choice != "stdlib" and importlib.util.find_spec("indexed_bzip2") is not None:
        return "indexed_bzip2"
    if choice == "indexed_bzip2":
        raise ParameterError("dufs.convert.bz2-decoder is 'indexed_bzip2' but it is not installed: pip install "
                             "'dufs[fast-bz2]', or set it to 'auto'")
    return "stdlib"


def decompress(stream: bytes, how: str | None = None) -> bytes:
    """A standalone bzip2 stream (:func:`stream_of`) decompressed by ``how`` (default :func:`decoder`), one
    thread. Either decompressor checks every block's CRC and the stream's combined one; a stream that does not
    decompress raises :class:`OSError` (or :class:`EOFError` where it ends early), as :mod:`bz2` does."""
    if (how or decoder()) == "stdlib":
        return bz2.decompress(stream)
    import io

    import indexed_bzip2

    try:
        with indexed_bzip2.open(io.BytesIO(stream), parallelization=1) as f:
            return f.read()
    except (RuntimeError, ValueError) as exc:  # a CRC or a header that does not match, data that end early
        raise OSError(f"Invalid data stream ({' '.join(str(exc).split())})") from exc


def _next_blocks(path: str, size: int, after: Block, count: int) -> list[Block]:
    """Up to ``count`` blocks following ``after`` (found by reading on from its stop, 1 MiB at a time)."""
    return list(itertools.islice(_blocks_from(path, size, after.stop, after.level, 1 << 20, strict=False), count))


def range_text(path: str, r: Bz2Range) -> bytes:
    """The text of a range, whole lines: from just after its first newline (from its start for a file's first
    range) to the first newline after its end (read on block by block), or the file's end. A range with no
    newline (inside a line longer than itself) has no text: the range that line starts in reads on through it.

    Raises :class:`OSError` or :class:`EOFError` (as :mod:`bz2`) when the range does not decompress."""
    how = decoder()
    text = decompress(stream_of(path, r.blocks), how)
    if not r.first:
        k = text.find(b"\n")
        if k < 0:
            return b""
        text = text[k + 1:]
    if r.last:
        return text
    parts = [text]
    after = r.blocks[-1]
    while True:
        nxt = _next_blocks(path, r.size, after, 1)
        if not nxt:
            break
        more = decompress(stream_of(path, nxt), how)
        k = more.find(b"\n")
        if k >= 0:
            parts.append(more[:k + 1])
            break
        parts.append(more)
        after = nxt[0]
    return b"".join(parts)
