"""The sparse Zarr store: both orientations of a sparse matrix, in blocks, with labels and metadata.

Layout (one Zarr v3 group)::

    zarr.json          attributes["dufs"]: shape, nnz, dtype, block bounds and per-block nnz, provenance,
                       synthetic ground truth, format version, and ``complete: true`` written last
    y                  labels (float64, n_rows), optional
    feature_ids        optional
    feature_nnz        nonzeros per feature (int64, n_features)
    csr/<i>/indptr     row block i: local indptr (int64), indices (int32, columns), data (float32 by default)
    csr/<i>/indices
    csr/<i>/data
    csc/<j>/...        feature block j: local indptr over its features, indices = row numbers, data

Every array carries Zarr's crc32c codec, and every chunk of every array is written (no implicit fill values), so
a flipped bit, a truncated chunk or a missing chunk is an error naming the chunk, never silent zeros;
:func:`verify_store` (``SparseStore.verify``) reads every chunk of a store to find all such damage at once.
A store is built under ``<path>.dufs-partial`` and renamed to ``<path>`` when complete (see ``builder``);
:func:`store_kind` tells a dufs store (which ``overwrite`` may replace) from anything else at a path.
"""

from __future__ import annotations

import itertools
import json
import os
import re
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import zarr
import zarr.codecs as zc

from dufs import config
from dufs.data._fs import LOCK_NAME, Location
from dufs.errors import CorruptChunkError, IncompleteStoreError, ParameterError, StoreError

FORMAT_VERSION = 1
PARTIAL_SUFFIX = ".dufs-partial"
#: where the previous store waits while a new one replaces it, where an atomic exchange is not available
OLD_SUFFIX = ".dufs-old"
# zarr's LocalStore writes each file to "<name>.<32 hex>.partial" and renames it; a process killed in between leaves it
ZARR_TEMP = re.compile(r"\.[0-9a-f]{32}\.partial$")
Orientation = Literal["csr", "csc"]


def _compressors() -> list:
    name = str(config.get("store.compressor")).lower()
    level = int(config.get("store.compression-level"))
    if name in ("none", "null", ""):
        comp = []
    elif name == "zstd":
        comp = [zc.ZstdCodec(level=level)]
    elif name.startswith("blosc"):
        cname = name.split("-", 1)[1] if "-" in name else "lz4"
        comp = [zc.BloscCodec(cname=cname, clevel=level, shuffle="shuffle")]
    else:
        raise ParameterError(f"The 'dufs.store.compressor' setting must be one of none, zstd, blosc-lz4, "
                             f"blosc-zstd; got {name!r}.")
    return [*comp, zc.Crc32cCodec()]


def write_array(group: zarr.Group, name: str, values: np.ndarray, *, chunk: int | None = None,
                sharded: bool = False) -> zarr.Array:
    """Write a 1-D array (every chunk stored, crc32c-checked), replacing any previous one.

    ``sharded=True`` puts all the (small) chunks in one shard object: slices read only the chunks they touch,
    without one file per chunk (used for the transpose's spill, read in many small slices).
    """
    values = np.ascontiguousarray(values)
    chunk = max(1, min(int(chunk or config.get("store.chunk-elements")), max(1, values.size)))
    shards = (-(-max(1, values.size) // chunk) * chunk,) if sharded else None
    arr = group.create_array(
        name, shape=values.shape, dtype=values.dtype, chunks=(chunk,), shards=shards,
        compressors=_compressors(), fill_value=0, overwrite=True, config={"write_empty_chunks": True},
    )
    if values.size:
        arr[...] = values
    return arr


def read_array(arr: zarr.Array, where: str, sl: slice | None = None, *, check_present: bool = True) -> np.ndarray:
    """Read ``arr[sl]`` and turn a missing, truncated or corrupt chunk into a ``CorruptChunkError``.

    ``check_present=False`` skips the listing that detects missing chunks (for arrays checked once already).
    """
    n = arr.shape[0]
    start, stop = (0, n) if sl is None else (sl.start or 0, n if sl.stop is None else sl.stop)
    if stop <= start:
        return np.empty(0, dtype=arr.dtype)
    csize = arr.chunks[0]
    needed = range(start // csize, (stop - 1) // csize + 1)
    try:
        return np.asarray(arr[start:stop])
    except Exception as exc:  # zarr raises ValueError on checksum mismatch, others on truncation
        bad = _find_bad_chunk(arr, needed)
        raise CorruptChunkError(f"{where}: chunk {bad} is corrupt or truncated ({exc}); the store is damaged: "
                                f"rebuild it (dufs convert) or restore it from a copy") from exc
    finally:
        if check_present:
            _check_present(arr, where, needed)


def _chunk_name(arr: zarr.Array, k: int) -> str:
    return f"{arr.path}/c/{k}"


def _find_bad_chunk(arr: zarr.Array, needed: range) -> str:
    csize = arr.chunks[0]
    for k in needed:
        try:
            arr[k * csize:min(arr.shape[0], (k + 1) * csize)]
        except Exception:
            return _chunk_name(arr, k)
    return f"{arr.path}/c/?"


def _check_present(arr: zarr.Array, where: str, needed: range) -> None:
    if arr.nchunks_initialized != arr.nchunks:
        store = arr.store
        import asyncio

        async def missing() -> list[int]:
            out = []
            for k in needed:
                if not await store.exists(_chunk_name(arr, k)):
                    out.append(k)
            return out

        from zarr.core.sync import sync

        gone = sync(missing())
        if gone:
            raise CorruptChunkError(f"{where}: chunk {_chunk_name(arr, gone[0])} is missing; the store is "
                                    f"damaged: rebuild it (dufs convert) or restore it from a copy")
        del asyncio


def store_kind(path: str | os.PathLike | Location) -> tuple[str, str]:
    """What is at ``path``, judged by its metadata alone: ``(kind, description)``.

    ``kind`` is ``"missing"`` (nothing there); ``"store"`` (a dufs store: a Zarr group whose attributes carry
    ``dufs`` with a format version, finished or not); ``"partial"`` (a dufs build, under way or interrupted: a
    Zarr group whose attributes carry ``dufs_partial``, or a directory holding only a build's lock file);
    ``"other"`` (anything else: a regular file, a directory that is no Zarr group, a Zarr array, a Zarr group
    without dufs metadata). Only ``"store"`` and ``"partial"`` are dufs' own, to replace or remove.
    """
    loc = path if isinstance(path, Location) else Location.of(path)
    if loc.local:
        if not os.path.lexists(loc.url):
            return "missing", "nothing"
        if not os.path.isdir(loc.url) or os.path.islink(loc.url):
            what = ("a symbolic link" if os.path.islink(loc.url) else
                    "a regular file" if os.path.isfile(loc.url) else "not a directory")
            return "other", what
    else:
        if not loc.fs.exists(loc.fspath):
            return "missing", "nothing"
        if not loc.fs.isdir(loc.fspath):
            return "other", "a file"
    try:
        names = loc.names()
    except OSError as exc:
        return "other", f"a directory that cannot be listed: {exc}"
    if "zarr.json" not in names:
        rest = [n for n in names if n != LOCK_NAME and not ZARR_TEMP.search(n)]
        if LOCK_NAME in names and not rest:
            return "partial", "a dufs build interrupted before it wrote anything"
        return "other", "an empty directory" if not names else "a directory with no zarr.json"
    try:
        meta = json.loads(loc.read_bytes("zarr.json"))
    except (OSError, ValueError) as exc:
        return "other", f"a directory with an unreadable zarr.json ({type(exc).__name__})"
    if not isinstance(meta, dict) or meta.get("node_type") != "group":
        node = meta.get("node_type", "node") if isinstance(meta, dict) else "node"
        return "other", f"a Zarr {node}"
    attrs = meta.get("attributes") or {}
    done, building = attrs.get("dufs"), attrs.get("dufs_partial")
    if isinstance(done, dict) and "format_version" in done:
        return "store", "a dufs store" if done.get("complete") else "an unfinished dufs store"
    if isinstance(building, dict) and "format_version" in building:
        return "partial", "an unfinished dufs build"
    return "other", "a Zarr group without dufs metadata"


@dataclass(frozen=True)
class RawBlock:
    """One block as raw buffers: ``indptr`` (local, int64), ``indices`` (int32), ``data``.

    For a CSR row block, rows ``start:stop`` and ``indices`` are column numbers; for a CSC feature block,
    features ``start:stop`` and ``indices`` are row numbers.
    """

    orientation: str
    index: int
    start: int
    stop: int
    indptr: np.ndarray
    indices: np.ndarray
    data: np.ndarray
    other_dim: int

    @property
    def nnz(self) -> int:
        return int(self.indptr[-1])

    @property
    def shape(self) -> tuple[int, int]:
        k = self.stop - self.start
        return (k, self.other_dim) if self.orientation == "csr" else (self.other_dim, k)

    def to_scipy(self) -> Any:
        import scipy.sparse as sp

        cls = sp.csr_array if self.orientation == "csr" else sp.csc_array
        return cls((self.data, self.indices, self.indptr), shape=self.shape)

    def to_sparse(self) -> Any:
        import sparse

        axis = 0 if self.orientation == "csr" else 1
        return sparse.GCXS((self.data, self.indices, self.indptr), shape=self.shape, compressed_axes=(axis,))


class SparseStore:
    """A complete dufs store, opened read-only. Use :func:`open_store` (``dufs.open``)."""

    def __init__(self, path: str | os.PathLike):
        self.location = Location.of(path)
        loc = self.location
        if not loc.exists():
            partial, old = loc.sibling(PARTIAL_SUFFIX), loc.sibling(OLD_SUFFIX)
            if store_kind(partial)[0] == "store":
                raise StoreError(
                    f"no dufs store at {loc.url}, but a finished one is at {partial.url} (moving it into place was "
                    f"interrupted): rename {partial.url} to {loc.url}")
            if store_kind(old)[0] == "store":
                raise StoreError(
                    f"no dufs store at {loc.url}, but its previous version is at {old.url} (replacing it was "
                    f"interrupted): rename {old.url} to {loc.url}")
            if partial.exists():
                raise IncompleteStoreError(
                    f"{loc.url} was never finished: its build was interrupted and the partial store is at "
                    f"{partial.url}. Finish it with `dufs convert <inputs> {loc.url} --resume` (the same "
                    f"inputs and options), or delete {partial.url} and start again")
            raise StoreError(f"no dufs store at {loc.url}")
        try:
            self._group = loc.open_group("r")
        except Exception as exc:
            raise StoreError(f"{loc.url} is not a Zarr group ({exc})") from exc
        meta = dict(self._group.attrs).get("dufs")
        if not isinstance(meta, dict) or not meta.get("complete"):
            raise IncompleteStoreError(
                f"{loc.url} has no completion marker: it is not a finished dufs store. If a conversion into "
                f"it was interrupted, finish it with `dufs convert <inputs> {loc.url} --resume`; else rebuild it")
        if int(meta.get("format_version", -1)) > FORMAT_VERSION:
            raise StoreError(f"{loc.url} has format version {meta['format_version']}, newer than this dufs "
                             f"reads ({FORMAT_VERSION}); upgrade dufs")
        self.attrs: dict = meta
        self.shape: tuple[int, int] = (int(meta["shape"][0]), int(meta["shape"][1]))
        self.nnz: int = int(meta["nnz"])
        self.dtype = np.dtype(meta["dtype"])
        self._bounds = {o: np.asarray(meta[o]["bounds"], dtype=np.int64) for o in ("csr", "csc")}
        self._block_nnz = {o: np.asarray(meta[o]["block_nnz"], dtype=np.int64) for o in ("csr", "csc")}

    # ------------------------------------------------------------------ metadata
    @property
    def path(self) -> str:
        return self.location.url

    def __repr__(self) -> str:
        n, d = self.shape
        return (f"<dufs.SparseStore {self.path}: {n} x {d}, nnz={self.nnz}, {self.n_blocks('csr')} row blocks, "
                f"{self.n_blocks('csc')} feature blocks>")

    def __getstate__(self) -> dict:
        return {"path": self.location.url}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["path"])  # type: ignore[misc]

    def bounds(self, orientation: Orientation = "csc") -> np.ndarray:
        """Block boundaries: block i covers rows (csr) or features (csc) ``bounds[i]:bounds[i+1]``."""
        return self._bounds[_check_orientation(orientation)].copy()

    def block_nnz(self, orientation: Orientation = "csc") -> np.ndarray:
        return self._block_nnz[_check_orientation(orientation)].copy()

    def n_blocks(self, orientation: Orientation = "csc") -> int:
        return len(self._bounds[_check_orientation(orientation)]) - 1

    @property
    def provenance(self) -> dict:
        return dict(self.attrs.get("provenance") or {})

    @property
    def ground_truth(self) -> dict | None:
        return self.attrs.get("ground_truth")

    @property
    def has_labels(self) -> bool:
        return bool(self.attrs.get("has_labels"))

    # ------------------------------------------------------------------ reading
    @property
    def y(self) -> np.ndarray | None:
        """Labels (float64, n_rows), or None."""
        if not self.has_labels:
            return None
        return read_array(self._group["y"], f"{self.path}: labels")

    @property
    def feature_ids(self) -> np.ndarray | None:
        if not self.attrs.get("has_feature_ids"):
            return None
        return read_array(self._group["feature_ids"], f"{self.path}: feature_ids")

    @property
    def feature_nnz(self) -> np.ndarray:
        return read_array(self._group["feature_nnz"], f"{self.path}: feature_nnz")

    def block(self, i: int, orientation: Orientation = "csc") -> RawBlock:
        """Block ``i`` as raw buffers (one contiguous read of each of its three arrays)."""
        o = _check_orientation(orientation)
        nb = self.n_blocks(o)
        if not 0 <= i < nb:
            raise ParameterError(f"{o} block {i} does not exist in {self.path} (it has {nb} {o} blocks)")
        where = f"{self.path}: {o} block {i}"
        try:
            g = self._group[f"{o}/{i}"]
        except KeyError:
            raise CorruptChunkError(f"{where}: the group {o}/{i} is missing; the store is damaged: rebuild it "
                                    f"(dufs convert) or restore it from a copy") from None
        indptr = read_array(g["indptr"], where)
        indices = read_array(g["indices"], where)
        data = read_array(g["data"], where)
        b = self._bounds[o]
        other = self.shape[1] if o == "csr" else self.shape[0]
        nnz = int(self._block_nnz[o][i])
        if indptr.shape[0] != b[i + 1] - b[i] + 1 or not indptr[-1] == indices.shape[0] == data.shape[0] == nnz:
            raise CorruptChunkError(f"{where}: array lengths do not match the store's metadata "
                                    f"(indptr {indptr.shape[0]}, indices {indices.shape[0]}, data "
                                    f"{data.shape[0]}, expected {b[i + 1] - b[i] + 1} and {nnz})")
        return RawBlock(o, i, int(b[i]), int(b[i + 1]), indptr, indices, data, other)

    def to_dask(self, orientation: Orientation = "csc", *, kind: Literal["sparse", "scipy"] = "sparse") -> Any:
        """A Dask array over the store: one chunk per block, each chunk a pydata ``sparse.GCXS`` (or SciPy).

        Chunks are read lazily, on the workers, when computed.
        """
        import dask.array as da

        o = _check_orientation(orientation)
        if kind not in ("sparse", "scipy"):
            raise ParameterError(f"The 'kind' parameter of to_dask must be 'sparse' or 'scipy'; got {kind!r}.")
        n, d = self.shape
        b = self._bounds[o]
        sizes = tuple(int(x) for x in np.diff(b))
        name = f"dufs-store-{o}-{kind}-" + _token(self.path, self.attrs.get("created"))
        dsk = {}
        for i in range(len(sizes)):
            key = (name, i, 0) if o == "csr" else (name, 0, i)
            dsk[key] = (_load_chunk, self.path, o, i, kind, self.attrs.get("created"))
        chunks = ((sizes, (d,)) if o == "csr" else ((n,), sizes))
        if kind == "sparse":
            import sparse

            meta = sparse.GCXS.from_numpy(np.zeros((0, 0), dtype=self.dtype), compressed_axes=(0,))
        else:
            import scipy.sparse as sp

            meta = (sp.csr_array if o == "csr" else sp.csc_array)((0, 0), dtype=self.dtype)
        return da.Array(dsk, name, chunks, meta=meta)

    def to_scipy(self, orientation: Orientation = "csr") -> Any:
        """The whole matrix in memory as a SciPy sparse array: for small stores and tests only."""
        import scipy.sparse as sp

        blocks = [self.block(i, orientation).to_scipy() for i in range(self.n_blocks(orientation))]
        if not blocks:
            return (sp.csr_array if orientation == "csr" else sp.csc_array)(self.shape, dtype=self.dtype)
        return (sp.vstack if orientation == "csr" else sp.hstack)(blocks, format=orientation)

    def verify(self, *, max_damage: int = 100) -> VerifyReport:
        """Read and check every chunk of every array (see :func:`verify_store`): a report, or a
        :class:`CorruptChunkError` naming the damaged chunks."""
        return verify_store(self.path, max_damage=max_damage)

    def info(self, top: int = 10) -> dict:
        """A summary: shape, nnz, density, blocks, label counts, most frequent features, provenance."""
        n, d = self.shape
        fnnz = self.feature_nnz
        order = np.argsort(-fnnz, kind="stable")[:top]
        out: dict[str, Any] = {
            "path": self.path, "shape": [n, d], "nnz": self.nnz,
            "density": self.nnz / (n * d) if n and d else 0.0,
            "nnz_per_row": self.nnz / n if n else 0.0,
            "dtype": str(self.dtype),
            "row_blocks": self.n_blocks("csr"), "feature_blocks": self.n_blocks("csc"),
            "max_block_nnz": {o: int(self._block_nnz[o].max(initial=0)) for o in ("csr", "csc")},
            "empty_features": int((fnnz == 0).sum()),
            "top_features": [[int(j), int(fnnz[j])] for j in order],
            "provenance": self.provenance,
            "format_version": self.attrs.get("format_version"),
        }
        if self.has_labels:
            vals, counts = np.unique(self.y, return_counts=True)
            out["labels"] = {_fmt_label(v): int(c) for v, c in zip(vals, counts, strict=False)}
        if self.ground_truth:
            gt = self.ground_truth
            out["ground_truth"] = {"informative": gt.get("informative"), "seed": gt.get("seed")}
        return out


def _fmt_label(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else repr(float(v))


def _token(*parts: Any) -> str:
    from dask.base import tokenize

    return tokenize(*parts)


_STORE_CACHE: dict[str, SparseStore] = {}


def _cached(path: str, created: str | None) -> SparseStore:
    """The open store at ``path`` written at ``created``; reopened when the store there was replaced since."""
    st = _STORE_CACHE.get(path)
    if st is None or st.attrs.get("created") != created:
        st = _STORE_CACHE[path] = SparseStore(path)
        if st.attrs.get("created") != created:
            raise StoreError(f"{path} was replaced (written {st.attrs.get('created')}) after this Dask array "
                             f"was made from it (written {created}); make it again with store.to_dask()")
    return st


def _load_chunk(path: str, orientation: str, i: int, kind: str, created: str | None = None) -> Any:
    blk = _cached(path, created).block(i, orientation)  # type: ignore[arg-type]
    return blk.to_sparse() if kind == "sparse" else blk.to_scipy()


def _check_orientation(o: str) -> str:
    if o not in ("csr", "csc"):
        raise ParameterError(f"The 'orientation' parameter must be 'csr' or 'csc'; got {o!r}.")
    return o


def open_store(path: str | os.PathLike) -> SparseStore:
    """Open a finished dufs store (a local directory or an fsspec URL such as ``memory://x.zarr``)."""
    return SparseStore(path)


# verification ---------------------------------------------------------------------------------------------------
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
        nodes = sorted({k[: -len("zarr.json")].rstrip("/") for k in sizes if k.rsplit("/", 1)[-1] == "zarr.json"},
                       key=_natural)
        expected = self._expected_lengths()
        arrays = []
        for node in nodes:
            if not node:
                continue  # the root group: read by SparseStore already
            try:
                meta = json.loads(self.loc.read_bytes(f"{node}/zarr.json"))
                kind = meta["node_type"]
            except (OSError, ValueError, KeyError, TypeError) as exc:
                self.add(f"{node}/zarr.json", f"is unreadable ({type(exc).__name__})")
                continue
            if kind == "array":
                arrays.append(node)
        groups = ["csr", "csc"] + [f"{o}/{i}" for o in ("csr", "csc") for i in range(self.st.n_blocks(o))]
        for name in groups:
            if f"{name}/zarr.json" not in sizes:
                self.add(f"{name}/zarr.json", "is missing (the group's metadata)")
        for name in sorted(set(expected) - set(arrays), key=_natural):
            if f"{name}/zarr.json" not in sizes:
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

    def _expected_lengths(self) -> dict[str, int]:
        st = self.st
        n, d = st.shape
        out = {"feature_nnz": d}
        if st.has_labels:
            out["y"] = n
        if st.attrs.get("has_feature_ids"):
            out["feature_ids"] = d
        for o in ("csr", "csc"):
            b, nnz = st.bounds(o), st.block_nnz(o)
            for i in range(st.n_blocks(o)):
                out[f"{o}/{i}/indptr"] = int(b[i + 1] - b[i] + 1)
                out[f"{o}/{i}/indices"] = out[f"{o}/{i}/data"] = int(nnz[i])
        return out

    def _check_array(self, name: str, length: int | None, sizes: dict[str, int]) -> None:
        try:
            arr = self.st._group[name]
            grid = tuple(int(c) for c in arr.metadata.chunk_grid.chunk_shape)  # stored objects: shards or chunks
        except Exception as exc:  # unreadable metadata, unknown codec
            self.add(f"{name}/zarr.json", f"cannot be opened ({_one_line(exc)})")
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
    node = re.split(r"/c/|/zarr\.json$", key)[0]

    def parts(text: str) -> list:
        return [(0, int(t)) if t.isdigit() else (1, t) for t in re.split(r"(\d+)", text)]

    nested = "/" in node
    return nested, {"csr": 0, "csc": 1}.get(node.split("/")[0], 2) if nested else 0, parts(node), \
        parts(key[len(node):])
