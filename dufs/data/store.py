"""The sparse Zarr store: both orientations of a sparse matrix, in blocks, with labels and metadata.

The layout (names, paths, metadata and format versions) is :mod:`dufs.data.layout`'s; this module reads stores
(:class:`SparseStore`, :func:`read_block`) and holds the array I/O every writer uses (:func:`write_array`,
:func:`read_array`). Every array carries Zarr's crc32c codec, and every chunk of every array is written (no implicit
fill values), so a flipped bit, a truncated chunk or a missing chunk is an error naming the chunk, never silent
zeros; :func:`dufs.data.verify.verify_store` reads every chunk of a store to find all such
damage at once. A store is built under ``<path>.dufs-partial`` and renamed to ``<path>`` when complete (see
``builder``); :func:`store_kind` tells a dufs store (which ``overwrite`` may replace) from anything else at a path.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import zarr
import zarr.codecs as zc

from dufs import config
from dufs.data import layout
from dufs.data._fs import Location
from dufs.data.layout import FORMAT_VERSION, ORIENTATIONS, Orientation, StoreMeta
from dufs.errors import CorruptChunkError, IncompleteStoreError, ParameterError, StoreError

__all__ = ["FORMAT_VERSION", "Orientation", "RawBlock", "SparseStore", "check_stored", "compressors", "open_store",
           "read_array", "read_block", "store_kind", "write_array", "write_arrays"]


def compressors() -> list:
    """The codecs of every array a store writes: the configured compressor, then Zarr's crc32c checksum."""
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
    spec = _array_spec(values, chunk, sharded)
    if not sharded and _write_direct(group, name, values, spec):
        return group[name]
    arr = group.create_array(name, **spec)
    if values.size:
        arr[...] = values
    return arr


def _write_direct(group: zarr.Group | str, name: str, values: np.ndarray, spec: dict) -> bool:
    """Write the array as files where the group is a local directory (:mod:`dufs.data._direct`); False where it is
    not, or its codecs are not ones written that way (then Zarr writes it)."""
    from zarr.storage import LocalStore

    from dufs.data import _direct

    if isinstance(group, str):
        where = group
    elif isinstance(group.store, LocalStore) and not group.store.read_only:
        where = os.path.join(str(group.store.root), group.path)
    else:
        return False
    return values.ndim == 1 and _direct.write_local(where, name, values, spec)


def _array_spec(values: np.ndarray, chunk: int | None, sharded: bool = False) -> dict:
    """How :func:`write_array` and :func:`write_arrays` lay out a 1-D array: chunks of ``chunk`` items (default
    ``dufs.store.chunk-elements``), the store's codecs, every chunk stored."""
    chunk = max(1, min(int(chunk or config.get("store.chunk-elements")), max(1, values.size)))
    shards = (-(-max(1, values.size) // chunk) * chunk,) if sharded else None
    return {"shape": values.shape, "dtype": values.dtype, "chunks": (chunk,), "shards": shards,
            "compressors": compressors(), "fill_value": 0, "overwrite": True, "config": {"write_empty_chunks": True}}


def write_arrays(group: zarr.Group | str, arrays: dict[str, np.ndarray], *, chunk: int | None = None) -> None:
    """:func:`write_array` of several arrays of one group (or of the group at a local directory) at once: written
    as files where the group is local (:mod:`dufs.data._direct`), else created and written concurrently in one call
    to Zarr's event loop (its codecs run on its threads), not one array after another (on a local disk, a row
    block's four arrays took 2-3 times as long one by one)."""
    import asyncio

    from zarr.core.sync import sync

    arrays = {k: np.ascontiguousarray(v) for k, v in arrays.items()}
    arrays = {k: v for k, v in arrays.items() if not _write_direct(group, k, v, _array_spec(v, chunk))}
    if not arrays:
        return
    if isinstance(group, str):
        group = zarr.open_group(group, mode="r+", zarr_format=3)
    agroup = zarr.AsyncGroup(metadata=group.metadata, store_path=group.store_path)

    async def one(name: str, values: np.ndarray) -> None:
        arr = await agroup.create_array(name, **_array_spec(values, chunk))
        if values.size:
            await arr.setitem(slice(None), values)

    async def all_of() -> None:
        await asyncio.gather(*(one(k, np.ascontiguousarray(v)) for k, v in arrays.items()))

    sync(all_of())


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
            check_stored(arr, where, needed)


def _chunk_name(arr: zarr.Array, k: int) -> str:
    return layout.chunk_key(arr.path, k)


def _find_bad_chunk(arr: zarr.Array, needed: range) -> str:
    csize = arr.chunks[0]
    for k in needed:
        try:
            arr[k * csize:min(arr.shape[0], (k + 1) * csize)]
        except Exception:
            return _chunk_name(arr, k)
    return layout.chunk_key(arr.path, "?")  # type: ignore[arg-type]


def check_stored(arr: zarr.Array, where: str, needed: range) -> None:
    """Raise a ``CorruptChunkError`` if any chunk of ``needed`` is not stored (Zarr would read it as fill values)."""
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
    if layout.NODE_FILE not in names:
        rest = [n for n in names if n != layout.LOCK_NAME and not layout.ZARR_TEMP.search(n)]
        if layout.LOCK_NAME in names and not rest:
            return "partial", "a dufs build interrupted before it wrote anything"
        return "other", "an empty directory" if not names else f"a directory with no {layout.NODE_FILE}"
    try:
        meta = json.loads(loc.read_bytes(layout.NODE_FILE))
    except (OSError, ValueError) as exc:
        return "other", f"a directory with an unreadable {layout.NODE_FILE} ({type(exc).__name__})"
    if not isinstance(meta, dict) or meta.get("node_type") != "group":
        node = meta.get("node_type", "node") if isinstance(meta, dict) else "node"
        return "other", f"a Zarr {node}"
    attrs = meta.get("attributes") or {}
    return layout.classify(attrs if isinstance(attrs, dict) else {})


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
    """A complete dufs store, opened read-only. Use :func:`open_store` (``dufs.open``).

    Parameters
    ----------
    path : str or path-like
        The store's directory or fsspec URL.

    Attributes
    ----------
    shape : tuple of int
        (n_samples, n_features).
    nnz : int
        Nonzeros.
    dtype : numpy.dtype
        The values' type.
    y : ndarray or None
        The labels, when the store has them.
    feature_ids : ndarray or None
        The original feature ids, when the input had them.
    meta : StoreMeta
        The store's metadata (block bounds and nonzeros, checksums, provenance).
    """

    def __init__(self, path: str | os.PathLike):
        self.location = Location.of(path)
        loc = self.location
        if not loc.exists():
            partial, old = layout.partial_location(loc), layout.old_location(loc)
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
            kind, what = store_kind(loc)
            if kind == "other":  # most often the libsvm text itself, given where its store was meant
                text = loc.url if what in ("a regular file", "a file") else "IN..."
                raise StoreError(f"{loc.url} is not a dufs store ({what}); to make one from libsvm/svmlight text, "
                                 f"run `dufs convert {text} OUT.zarr`") from exc
            raise StoreError(f"{loc.url} is not a Zarr group ({exc})") from exc
        #: the store's metadata, read by the reader of its format version
        self.meta: StoreMeta = layout.read_meta(dict(self._group.attrs), loc.url)
        #: the metadata document as stored (for display; code reads :attr:`meta`)
        self.attrs: dict = dict(self.meta.raw or {})
        self.shape: tuple[int, int] = self.meta.shape
        self.nnz: int = self.meta.nnz
        self.dtype = self.meta.dtype
        self._bounds = {o: np.asarray(self.meta.bounds(o), dtype=np.int64) for o in ORIENTATIONS}
        self._block_nnz = {o: np.asarray(self.meta.block_nnz(o), dtype=np.int64) for o in ORIENTATIONS}

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
        return dict(self.meta.provenance)

    @property
    def ground_truth(self) -> dict | None:
        return self.meta.ground_truth

    @property
    def has_labels(self) -> bool:
        return self.meta.has_labels

    # ------------------------------------------------------------------ reading
    @property
    def y(self) -> np.ndarray | None:
        """Labels (float64, n_rows), or None."""
        if not self.has_labels:
            return None
        return read_array(self._group[layout.LABELS], f"{self.path}: labels")

    @property
    def feature_ids(self) -> np.ndarray | None:
        if not self.meta.has_feature_ids:
            return None
        return read_array(self._group[layout.FEATURE_IDS], f"{self.path}: feature_ids")

    @property
    def feature_nnz(self) -> np.ndarray:
        return read_array(self._group[layout.FEATURE_NNZ], f"{self.path}: feature_nnz")

    def feature_nnz_of(self, start: int, stop: int) -> np.ndarray:
        """The nonzeros of features ``start:stop`` (a read of that range only)."""
        return read_array(self._group[layout.FEATURE_NNZ], f"{self.path}: feature_nnz", slice(start, stop))

    def block(self, i: int, orientation: Orientation = "csc") -> RawBlock:
        """Block ``i`` as raw buffers (one contiguous read of each of its three arrays)."""
        o = _check_orientation(orientation)
        nb = self.n_blocks(o)
        if not 0 <= i < nb:
            raise ParameterError(f"{o} block {i} does not exist in {self.path} (it has {nb} {o} blocks)")
        where = f"{self.path}: {o} block {i}"
        try:
            g = layout.block_group(self._group, o, i)
        except KeyError:
            raise CorruptChunkError(f"{where}: the group {layout.block_path(o, i)} is missing; the store is damaged: "
                                    f"rebuild it (dufs convert) or restore it from a copy") from None
        indptr, indices, data = (read_array(g[name], where) for name in layout.BLOCK_ARRAYS)
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
        name = f"dufs-store-{o}-{kind}-" + _token(self.path, self.meta.created)
        dsk = {}
        for i in range(len(sizes)):
            key = (name, i, 0) if o == "csr" else (name, 0, i)
            dsk[key] = (_load_chunk, self.path, o, i, kind, self.meta.created)
        chunks = ((sizes, (d,)) if o == "csr" else ((n,), sizes))
        if kind == "sparse":
            import sparse

            meta = sparse.GCXS.from_numpy(np.zeros((0, 0), dtype=self.dtype), compressed_axes=(0,))
        else:
            import scipy.sparse as sp

            meta = (sp.csr_array if o == "csr" else sp.csc_array)((0, 0), dtype=self.dtype)
        return da.Array(dsk, name, chunks, meta=meta)

    def to_scipy(self, orientation: Orientation = "csr") -> Any:
        """The whole matrix in memory as a SciPy sparse array: for small stores and tests only.

        Its ``indices`` and ``indptr`` are int32 when the nonzeros and both dimensions fit (scikit-learn's
        liblinear estimators and ``dump_svmlight_file`` refuse int64 ones), int64 otherwise.
        """
        import scipy.sparse as sp

        cls = sp.csr_array if orientation == "csr" else sp.csc_array
        blocks = [self.block(i, orientation).to_scipy() for i in range(self.n_blocks(orientation))]
        if not blocks:
            return cls(self.shape, dtype=self.dtype)
        M = (sp.vstack if orientation == "csr" else sp.hstack)(blocks, format=orientation)
        if max(M.nnz, *M.shape) > np.iinfo(np.int32).max:
            return M
        return cls((M.data, M.indices.astype(np.int32), M.indptr.astype(np.int32)), shape=M.shape)

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
            "max_block_nnz": {o: int(self._block_nnz[o].max(initial=0)) for o in ORIENTATIONS},
            "empty_features": int((fnnz == 0).sum()),
            "top_features": [[int(j), int(fnnz[j])] for j in order],
            "provenance": self.provenance,
            "format_version": self.meta.version,
        }
        if self.has_labels:
            vals, counts = np.unique(self.y, return_counts=True)
            out["labels"] = {_fmt_label(v): int(c) for v, c in zip(vals, counts, strict=False)}
        if self.ground_truth:
            gt = self.ground_truth
            out["ground_truth"] = {"informative": gt.get("informative"), "seed": gt.get("seed")}
            if gt.get("n_clusters"):
                out["ground_truth"].update(n_clusters=gt["n_clusters"], cluster_features=gt.get("cluster_features"))
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
    if st is None or st.meta.created != created:
        st = _STORE_CACHE[path] = SparseStore(path)
        if st.meta.created != created:
            raise StoreError(f"{path} was replaced (written {st.meta.created}) after this Dask array "
                             f"was made from it (written {created}); make it again with store.to_dask()")
    return st


def _load_chunk(path: str, orientation: str, i: int, kind: str, created: str | None = None) -> Any:
    blk = _cached(path, created).block(i, orientation)  # type: ignore[arg-type]
    return blk.to_sparse() if kind == "sparse" else blk.to_scipy()


def _check_orientation(o: str) -> str:
    if o not in ORIENTATIONS:
        raise ParameterError(f"The 'orientation' parameter must be 'csr' or 'csc'; got {o!r}.")
    return o


def open_store(path: str | os.PathLike) -> SparseStore:
    """Open a finished dufs store, read-only (``dufs.open``).

    Parameters
    ----------
    path : str or path-like
        A local directory or an fsspec URL such as ``memory://x.zarr`` or ``s3://bucket/x.zarr``, written by
        ``dufs convert``, :func:`dufs.write_store` or ``dufs make-synthetic``.

    Returns
    -------
    SparseStore
        Its shape, nonzeros, labels and blocks; give it (or its path) to :func:`dufs.fit`.

    Raises
    ------
    StoreError
        No finished store at ``path`` (a build interrupted, a directory of something else), saying what is there
        and what to do.
    """
    return SparseStore(path)


def read_block(path: str | os.PathLike, orientation: Orientation, index: int, *,
               created: str | None = None) -> RawBlock:
    """Block ``index`` of the store at ``path`` as raw buffers, read where this is called (on a worker, say).

    ``orientation``: ``"csr"`` (row blocks) or ``"csc"`` (feature blocks). The :class:`RawBlock` holds ``start``,
    ``stop``, ``indptr`` (local, int64), ``indices`` (int32) and ``data``, checked against the store's metadata.

    ``created``: the ``meta.created`` of the store the caller planned with. Given, the open store is kept per
    process (no metadata read per block) and a store replaced since is refused with a :class:`StoreError`; not
    given, the store is opened for this read alone.
    """
    if created is None:
        return SparseStore(path).block(index, orientation)
    return _cached(Location.of(path).url, created).block(index, orientation)
