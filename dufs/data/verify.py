"""Verifying a store: every chunk of every array read, decoded and checked, and all the damage named at once.

A dufs store writes every chunk of every array with Zarr's crc32c codec, so a flipped bit, a truncated chunk or a
missing chunk (which Zarr would read back as fill values) is damage :func:`verify_store` finds, one chunk at a
time (memory bounded by one chunk, not by the store). ``dufs verify`` and ``dufs info --verify`` call it.
"""

from __future__ import annotations

import itertools
import json
import os
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from dufs.data import layout
from dufs.data._fs import Location
from dufs.data.store import SparseStore
from dufs.errors import CorruptChunkError, ParameterError

__all__ = ["VerifyReport", "verify_store"]


@dataclass(frozen=True)
class VerifyReport:
    """What :func:`verify_store` checked in an intact store."""

    path: str
    arrays: int  # arrays checked
    chunks: int  # chunks read and decoded (for sharded arrays: inner chunks)
    bytes: int  # bytes of stored chunk objects read

    def __str__(self) -> str:
        return (f"{self.path}: intact ({self.arrays:,} arrays, {self.chunks:,} chunks, {self.bytes:,} bytes "
                f"checked)")


def verify_store(path: str | os.PathLike, *, max_damage: int = 100) -> VerifyReport:
    """Read and decode every chunk of every array of the store at ``path``; report, or raise naming the damage.

    Checks that the store is finished (its completion marker), that every array its metadata requires exists
    (``csr/<i>/{indptr,indices,data}``, ``csc/<j>/...``, ``feature_nnz``, ``y`` and ``feature_ids`` when it has
    them) with the lengths the metadata gives, that every chunk the shape and chunk grid of every array in the
    store require is stored (a dufs store writes every chunk, so a missing one is damage: Zarr would read it back as
    fill values; in sharded arrays, every inner chunk a shard's index must list), and that every chunk passes its
    crc32c checksum and decodes. Chunks are read one at a time, so memory use is bounded by one chunk, not by the
    store.

    Parameters
    ----------
    path : str or path-like
        A local directory or an fsspec URL.
    max_damage : int, default 100
        Stop after this many damaged chunks or arrays (the error then says "at least").

    Returns
    -------
    VerifyReport
        ``path``, ``arrays``, ``chunks`` and ``bytes`` checked; ``str(report)`` is a one-line summary.

    Raises
    ------
    IncompleteStoreError
        The store has no completion marker (its build never finished).
    StoreError
        No dufs store at ``path`` (or its group metadata is unreadable).
    CorruptChunkError
        Damage was found. The one-line message names the first damaged chunk (``csr/1/indices/c/0``), says what is
        wrong with it and how many were found; ``exc.damage`` lists ``(chunk or array, what is wrong)`` for each.
    """
    if isinstance(max_damage, bool) or not isinstance(max_damage, int) or max_damage < 1:
        raise ParameterError(f"The 'max_damage' parameter of verify_store must be an int >= 1; got {max_damage!r}.")
    st = SparseStore(path)  # StoreError / IncompleteStoreError (no completion marker)
    return _Verifier(st, max_damage).run()


class _Verifier:
    def __init__(self, st: SparseStore, max_damage: int):
        self.st = st
        self.loc = st.location
        self.group = self.loc.open_group("r")
        self.max_damage = max_damage
        self.damage: list[tuple[str, str]] = []
        self.arrays = self.chunks = self.nbytes = 0

    def add(self, key: str, what: str) -> None:
        self.damage.append((key, what))

    @property
    def full(self) -> bool:
        return len(self.damage) >= self.max_damage

    def run(self) -> VerifyReport:
        sizes = self._listing()
        nodes = sorted({layout.node_of_file(k) for k in sizes if layout.is_node_file(k)}, key=_natural)
        expected = self.st.meta.expected_arrays()
        arrays = []
        for node in nodes:
            if not node:
                continue  # the root group: read by SparseStore already
            try:
                meta = json.loads(self.loc.read_bytes(layout.node_file(node)))
                kind = meta["node_type"]
            except (OSError, ValueError, KeyError, TypeError) as exc:
                self.add(layout.node_file(node), f"is unreadable ({type(exc).__name__})")
                continue
            if kind == "array":
                arrays.append(node)
        for name in self.st.meta.expected_groups():
            if layout.node_file(name) not in sizes:
                self.add(layout.node_file(name), "is missing (the group's metadata)")
        for name in sorted(set(expected) - set(arrays), key=_natural):
            if layout.node_file(name) not in sizes:
                self.add(name, "is missing (the whole array)")
        for name in arrays:
            if self.full:
                break
            self._check_array(name, expected.get(name), sizes)
        self.damage.sort(key=lambda d: _natural(d[0]))
        del self.damage[self.max_damage:]
        if self.damage:
            raise self._error()
        return VerifyReport(self.st.path, self.arrays, self.chunks, self.nbytes)

    def _listing(self) -> dict[str, int]:
        """Every stored object of the store, relative to its root, with its size in bytes."""
        fs, root = self.loc.fs, self.loc.fspath.rstrip("/")
        found = fs.find(root, detail=True)
        out = {}
        for p, info in found.items():
            p = p.rstrip("/")
            rel = p[len(root):].lstrip("/") if p.startswith(root) else p
            if info.get("type", "file") == "file":
                out[rel] = int(info.get("size") or 0)
        return out

    def _check_array(self, name: str, length: int | None, sizes: dict[str, int]) -> None:
        try:
            arr = self.group[name]
            grid = tuple(int(c) for c in arr.metadata.chunk_grid.chunk_shape)  # stored objects: shards or chunks
        except Exception as exc:  # unreadable metadata, unknown codec
            self.add(layout.node_file(name), f"cannot be opened ({_one_line(exc)})")
            return
        self.arrays += 1
        shape = tuple(int(s) for s in arr.shape)
        if length is not None and shape != (length,):
            self.add(name, f"has shape {shape}; the store's metadata says ({length},)")
        inner = tuple(int(c) for c in arr.chunks)
        sharding = arr.shards is not None
        for coords in itertools.product(*(range(-(-s // g)) for s, g in zip(shape, grid, strict=True))):
            if self.full:
                return
            key = f"{name}/{arr.metadata.encode_chunk_key(coords)}"
            size = sizes.get(key)
            if size is None:
                self.add(key, "is missing")
                continue
            self.nbytes += size
            if size == 0:
                self.add(key, "is empty (0 bytes: truncated)")
                continue
            origin = tuple(c * g for c, g in zip(coords, grid, strict=True))
            if sharding:
                self._check_shard(arr, key, size, origin, grid, inner, shape)
            else:
                self._read(arr, key, origin, grid, shape, size)

    def _read(self, arr: Any, key: str, origin: tuple, extent: tuple, shape: tuple, size: int) -> bool:
        region = tuple(slice(o, min(o + e, s)) for o, e, s in zip(origin, extent, shape, strict=True))
        try:
            arr[region]
        except Exception as exc:
            why = _one_line(exc)
            if "checksum" in why.lower():
                self.add(key, f"fails its crc32c checksum (corrupt or truncated: {size:,} bytes)")
            else:
                self.add(key, f"cannot be decoded ({why}; {size:,} bytes)")
            return False
        self.chunks += 1
        return True

    def _check_shard(self, arr: Any, key: str, size: int, origin: tuple, grid: tuple, inner: tuple,
                     shape: tuple) -> None:
        per = tuple(g // c for g, c in zip(grid, inner, strict=True))
        n_inner = int(np.prod(per))
        present = self._shard_index(arr, key, size, n_inner)
        if present is None:
            return
        for k, sub in enumerate(itertools.product(*(range(p) for p in per))):
            if self.full:
                return
            o = tuple(a + b * c for a, b, c in zip(origin, sub, inner, strict=True))
            if any(x >= s for x, s in zip(o, shape, strict=True)):
                continue  # wholly outside the array: never stored
            if not present[k]:
                self.add(f"{key} (inner chunk {'.'.join(map(str, sub))})", "is missing from its shard")
                continue
            self._read(arr, f"{key} (inner chunk {'.'.join(map(str, sub))})", o, inner, shape, size)

    def _shard_index(self, arr: Any, key: str, size: int, n_inner: int) -> np.ndarray | None:
        """Which inner chunks the shard's index lists, or None (damage recorded, or an index layout not known
        here: then the shard is read whole through Zarr, and only its checksums are checked)."""
        import zarr.codecs as zc

        codec = arr.metadata.codecs[0]
        idx_codecs = tuple(getattr(codec, "index_codecs", ()))
        if not (len(idx_codecs) == 2 and isinstance(idx_codecs[0], zc.BytesCodec)
                and isinstance(idx_codecs[1], zc.Crc32cCodec)
                and str(getattr(idx_codecs[0], "endian", "little")).endswith("little")):
            self._read(arr, key, (0,) * arr.ndim, arr.shape, arr.shape, size)  # pragma: no cover
            return None
        nbytes = 16 * n_inner + 4
        if size < nbytes:
            self.add(key, f"is truncated ({size:,} bytes, less than its index of {nbytes:,})")
            return None
        at_end = str(getattr(codec, "index_location", "end")).endswith("end")
        start = size - nbytes if at_end else 0
        fs, fp = _fs_of(self.loc, key)
        raw = fs.cat_file(fp, start=start, end=start + nbytes)
        import google_crc32c

        if np.uint32(google_crc32c.value(raw[:-4])).tobytes() != raw[-4:]:
            self.add(key, "has a shard index that fails its crc32c checksum (corrupt or truncated)")
            return None
        entries = np.frombuffer(raw[:-4], dtype="<u8").reshape(n_inner, 2)
        return ~np.all(entries == np.iinfo(np.uint64).max, axis=1)

    def _error(self) -> CorruptChunkError:
        dmg = self.damage
        n = len(dmg)
        count = (f"at least {n}" if self.full else f"{n}") + (" damaged chunk" if n == 1 else " damaged chunks")
        first_key, first_what = dmg[0]
        more = ""
        if n > 1:
            shown = "; ".join(f"{k} {w}" for k, w in dmg[1:4])
            more = f"; also {shown}" + (f" and {n - 4} more" if n > 4 else "")
        return CorruptChunkError(f"{self.st.path}: {count}: {first_key} {first_what}{more}; the store is damaged: "
                                 f"rebuild it (dufs convert) or restore it from a copy", damage=list(dmg))


def _fs_of(loc: Location, key: str) -> tuple[Any, str]:
    import fsspec

    return fsspec.core.url_to_fs(loc.child(key))


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:200] or type(exc).__name__


def _natural(key: str) -> tuple:
    """Sort key of a node, chunk or metadata file: top-level arrays, then the row blocks', then the feature
    blocks'; numbers by value (csr/2 before csr/10); a node's chunks in their order."""
    node = layout.node_of(key)

    def parts(text: str) -> list:
        return [(0, int(t)) if t.isdigit() else (1, t) for t in re.split(r"(\d+)", text)]

    nested = "/" in node
    return nested, layout.orientation_rank(node.split("/")[0]) if nested else 0, parts(node), \
        parts(key[len(node):])
