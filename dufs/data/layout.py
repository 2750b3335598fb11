"""The store layout: the one module that spells a store's paths, names and metadata, and reads its format versions.

Everything else in dufs reaches a store's nodes and attributes through the names and functions here. A finished
store (one Zarr v3 group)::

    zarr.json          attributes["dufs"]: the store's metadata (:class:`StoreMeta`), "complete: true" last
    y                  labels (float64, n_rows), optional
    feature_ids        optional
    feature_nnz        nonzeros per feature (int64, n_features)
    csr/<i>/indptr     row block i: local indptr (int64), indices (int32, columns), data
    csr/<i>/indices
    csr/<i>/data
    csr/<i>/y          row block i's labels, as the build wrote them (left in place)
    csc/<j>/...        feature block j: local indptr over its features, indices = row numbers, data

A build writes under ``<path>.dufs-partial`` (attributes["dufs_partial"]: :class:`PartialMeta`), holding the lock
file ``dufs.lock``; each row block's group records :class:`RowBlockMeta`, each feature block's
:class:`FeatureBlockMeta`, and the file ``spill/<i>`` holds row block i's entries bucketed by feature for the
transpose (:class:`SpillHeader`: raw buffers, not Zarr; scratch, removed before the completion marker goes in). A
replaced store waits under ``<path>.dufs-old`` where an atomic exchange is not available.

Format versions: :data:`FORMAT_VERSION` is the one this dufs writes (:func:`meta_attrs`); :func:`read_meta` reads
every version in ``_READERS`` (one reader a version: to add version 2, write ``_read_v2`` and register it) and
refuses any other in one line naming the store and the versions it reads.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from dufs.errors import IncompleteStoreError, StoreError

#: the format version this dufs writes
FORMAT_VERSION = 1
#: the largest magnitude a value may have (stored or given): beyond it, its square and the sums of squares, variances
#: and distances it enters overflow float64 (1.8e308 holds the sum of 1e8 squares of 1e150)
MAX_ABS = 1e150
#: what a refused value beyond :data:`MAX_ABS` is told (after its row and feature)
TOO_LARGE = (f"beyond {MAX_ABS:.0e} in magnitude its square, and the feature's variance and every distance it enters, "
             f"overflow float64: scale the feature or the data down (divide by a constant)")

# ---------------------------------------------------------------------------------------------------- names
#: Zarr's metadata document of every group and array
NODE_FILE = "zarr.json"
#: where a store is built before it is moved into place
PARTIAL_SUFFIX = ".dufs-partial"
#: where the previous store waits while a new one replaces it, where an atomic exchange is not available
OLD_SUFFIX = ".dufs-old"
#: a build's lock file, in the partial store (and briefly in the final one while it is moved into place)
LOCK_NAME = "dufs.lock"
# zarr's LocalStore writes each file to "<name>.<32 hex>.partial" and renames it; a process killed in between leaves it
ZARR_TEMP = re.compile(r"\.[0-9a-f]{32}\.partial$")

Orientation = Literal["csr", "csc"]
ROWS: Orientation = "csr"  # the group of the row blocks (CSR); an orientation is named as its group
FEATURES: Orientation = "csc"  # the group of the feature blocks (CSC)
ORIENTATIONS: tuple[Orientation, Orientation] = (ROWS, FEATURES)
LABELS = "y"
FEATURE_IDS = "feature_ids"
FEATURE_NNZ = "feature_nnz"
INDPTR, INDICES, DATA = "indptr", "indices", "data"
BLOCK_ARRAYS = (INDPTR, INDICES, DATA)
ROW_LABELS = "y"  # a row block's labels, written by the build (and left in the finished store)
INDICES_FIX = "indices_fix"  # a row block's indices rewritten for the final index base, before they replace them
SPILL = "spill"  # the directory of the transpose's spill files (not a Zarr node)
#: the spill's format: a resume refuses a partial build whose spill files another format wrote
SPILL_FORMAT = 4
_CHUNK_PREFIX = "c"  # Zarr v3's default chunk key encoding: "<array>/c/<k>"

# attributes
_STORE_ATTR = "dufs"
_PARTIAL_ATTR = "dufs_partial"
_VERSION = "format_version"
_COMPLETE = "complete"


def block_path(orientation: str, i: int) -> str:
    """The group of block ``i``: ``csr/<i>`` or ``csc/<i>``."""
    return f"{orientation}/{i}"


def block_array_path(orientation: str, i: int, name: str) -> str:
    """The array ``name`` (:data:`BLOCK_ARRAYS`, :data:`ROW_LABELS`, :data:`INDICES_FIX`) of block ``i``."""
    return f"{block_path(orientation, i)}/{name}"


def chunk_key(array_path: str, k: int) -> str:
    """The stored object of chunk ``k`` of a 1-D array."""
    return f"{array_path}/{_CHUNK_PREFIX}/{k}"


def node_file(node: str) -> str:
    """The metadata document of a group or array (``""``: the root group)."""
    return f"{node}/{NODE_FILE}" if node else NODE_FILE


def node_of(key: str) -> str:
    """The group or array a stored object (a chunk, a metadata document) belongs to."""
    return re.split(rf"/{_CHUNK_PREFIX}/|/{re.escape(NODE_FILE)}$", key)[0]


def is_node_file(key: str) -> bool:
    return key.rsplit("/", 1)[-1] == NODE_FILE


def node_of_file(key: str) -> str:
    """The group or array whose metadata document is ``key`` (``""``: the root group)."""
    return key[: -len(NODE_FILE)].rstrip("/")


def orientation_rank(name: str) -> int:
    """Sort rank of a top-level name: the row blocks' group, then the feature blocks', then anything else."""
    return ORIENTATIONS.index(name) if name in ORIENTATIONS else len(ORIENTATIONS)  # type: ignore[arg-type]


def partial_location(final: Any) -> Any:
    """Where the store at ``final`` (a ``Location``) is built."""
    return final.sibling(PARTIAL_SUFFIX)


def old_location(final: Any) -> Any:
    """Where the store at ``final`` waits while it is replaced by two renames."""
    return final.sibling(OLD_SUFFIX)


# ---------------------------------------------------------------------------------------------------- nodes
def create_build_groups(root: Any) -> None:
    """The groups a new build starts with: both orientations."""
    root.require_group(ROWS)
    root.require_group(FEATURES)


def block_group(root: Any, orientation: str, i: int) -> Any:
    """Block ``i``'s group (``KeyError`` when it is missing)."""
    return root[block_path(orientation, i)]


def new_block_group(root: Any, orientation: str, i: int) -> Any:
    """Block ``i``'s group, created when missing."""
    return root[orientation].require_group(str(i))


def finished_blocks(root: Any, orientation: str) -> set[int]:
    """The blocks of a partial store whose group carries its completion marker. A block's folder without its
    metadata (a conversion killed between the two) is an unfinished block, listed quietly (Zarr warns that such a
    folder "is not recognized as a component of a Zarr hierarchy"): a resume writes it again."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Object at .* is not recognized as a component of a Zarr hierarchy")
        return {int(name) for name, sub in root[orientation].groups() if sub.attrs.get(_COMPLETE)}


def spill_file(i: int) -> str:
    """Row block ``i``'s spill file, relative to the partial store."""
    return f"{SPILL}/{i}"


@dataclass(frozen=True)
class SpillHeader:
    """The head of a spill file: what its sections hold, so that a slice of any section is one read.

    A spill file is this header (:data:`SPILL_HEADER_BYTES`), then ``goff`` (int64, ``n_offsets``: where each granule
    of ``feature-granule`` raw columns starts) and ``entries`` (``nnz`` records of
    :func:`dufs.kernels.sparse.entry_dtype`: the column's offset in its granule (uint16), the int32 row within the
    row block and the value in ``value_dtype``): the block's entries bucketed by granule, rows ascending in each
    bucket. Raw little-endian buffers, no compression and no Zarr: the spill is scratch, written once, read in
    slices once and removed.
    """

    n_offsets: int
    nnz: int
    value_dtype: np.dtype

    def sections(self) -> dict[str, tuple[int, np.dtype]]:
        """``{name: (byte offset, dtype)}`` of ``goff`` and ``entries``."""
        from dufs.kernels.sparse import entry_dtype

        entry = entry_dtype(self.value_dtype)
        return {"goff": (SPILL_HEADER_BYTES, np.dtype("<i8")),
                "entries": (SPILL_HEADER_BYTES + self.n_offsets * 8, entry)}

    @property
    def file_bytes(self) -> int:
        """The size of the whole file."""
        from dufs.kernels.sparse import entry_dtype

        return SPILL_HEADER_BYTES + self.n_offsets * 8 + self.nnz * entry_dtype(self.value_dtype).itemsize

    def encode(self) -> bytes:
        dt = self.value_dtype.newbyteorder("<").str.encode()
        return _SPILL_MAGIC + np.array([self.n_offsets, self.nnz], "<i8").tobytes() + dt.ljust(8, b"\0")

    @classmethod
    def decode(cls, raw: bytes, where: str) -> SpillHeader:
        if len(raw) < SPILL_HEADER_BYTES or raw[:8] != _SPILL_MAGIC:
            raise StoreError(f"{where} is not a dufs spill file (format {SPILL_FORMAT}): the partial build is "
                             f"damaged; start again with --overwrite")
        n_offsets, nnz = (int(v) for v in np.frombuffer(raw[8:24], "<i8"))
        return cls(n_offsets, nnz, np.dtype(raw[24:32].rstrip(b"\0").decode()))


SPILL_HEADER_BYTES = 32
_SPILL_MAGIC = b"dufsspl" + bytes([SPILL_FORMAT])


# ---------------------------------------------------------------------------------------------------- a finished store
@dataclass(frozen=True)
class StoreMeta:
    """A finished store's metadata, whatever its format version (read by :func:`read_meta`).

    Bounds: block ``i`` covers rows (``row_bounds``) or features (``feature_bounds``) ``bounds[i]:bounds[i+1]``.
    ``feature_checksums`` (a ``crc32c:<hex>`` per feature block) and ``y_checksum`` are None in stores written
    before they were recorded. ``raw`` is the metadata document as stored (for display), not compared.
    """

    version: int
    shape: tuple[int, int]
    nnz: int
    dtype: np.dtype
    row_bounds: tuple[int, ...]
    row_block_nnz: tuple[int, ...]
    feature_bounds: tuple[int, ...]
    feature_block_nnz: tuple[int, ...]
    feature_checksums: tuple[str | None, ...] | None = None
    y_checksum: str | None = None
    has_labels: bool = False
    has_feature_ids: bool = False
    provenance: dict = field(default_factory=dict)
    ground_truth: dict | None = None
    created: str | None = None
    dufs_version: str | None = None
    index_dtype: str = "int32"
    indptr_dtype: str = "int64"
    raw: Mapping | None = field(default=None, compare=False, repr=False)

    def bounds(self, orientation: str) -> tuple[int, ...]:
        return self.row_bounds if orientation == ROWS else self.feature_bounds

    def block_nnz(self, orientation: str) -> tuple[int, ...]:
        return self.row_block_nnz if orientation == ROWS else self.feature_block_nnz

    def n_blocks(self, orientation: str) -> int:
        return len(self.bounds(orientation)) - 1

    def fingerprint_fields(self) -> dict:
        """What identifies the store's content without reading it: shape, nnz, dtype, block bounds and nonzeros
        per block, the crc32c of every feature block and of the labels (as format version 1 writes them, so that
        the same content gives the same fields whatever version stored it)."""
        full = meta_attrs(self)
        return {k: full.get(k) for k in ("shape", "nnz", "dtype", ROWS, FEATURES, "y_checksum")}

    def expected_arrays(self) -> dict[str, int]:
        """Every array the store must hold, with its length."""
        n, d = self.shape
        out = {FEATURE_NNZ: d}
        if self.has_labels:
            out[LABELS] = n
        if self.has_feature_ids:
            out[FEATURE_IDS] = d
        for o in ORIENTATIONS:
            b, nnz = self.bounds(o), self.block_nnz(o)
            for i in range(self.n_blocks(o)):
                out[block_array_path(o, i, INDPTR)] = int(b[i + 1] - b[i] + 1)
                out[block_array_path(o, i, INDICES)] = out[block_array_path(o, i, DATA)] = int(nnz[i])
        return out

    def expected_groups(self) -> list[str]:
        """Every group the store must hold, below the root."""
        return [*ORIENTATIONS, *(block_path(o, i) for o in ORIENTATIONS for i in range(self.n_blocks(o)))]


def meta_attrs(m: StoreMeta) -> dict:
    """The metadata document of :data:`FORMAT_VERSION` for ``m`` (without the completion marker)."""
    feature = {"bounds": list(m.feature_bounds), "block_nnz": list(m.feature_block_nnz)}
    if m.feature_checksums is not None:
        feature["checksums"] = list(m.feature_checksums)
    return {
        _VERSION: FORMAT_VERSION,
        "shape": [int(m.shape[0]), int(m.shape[1])],
        "nnz": int(m.nnz),
        "dtype": str(m.dtype), "index_dtype": m.index_dtype, "indptr_dtype": m.indptr_dtype,
        ROWS: {"bounds": list(m.row_bounds), "block_nnz": list(m.row_block_nnz)},
        FEATURES: feature,
        "y_checksum": m.y_checksum,
        "has_labels": m.has_labels, "has_feature_ids": m.has_feature_ids,
        "provenance": m.provenance,
        "ground_truth": m.ground_truth,
        "created": m.created,
        "dufs_version": m.dufs_version,
    }


def finished_root_attrs(root_attrs: Mapping, m: StoreMeta) -> dict:
    """The root group's attributes once the build is done: the partial build's record dropped, the store's
    metadata in, with the completion marker (written last, in one write with the rest)."""
    attrs = dict(root_attrs)
    attrs.pop(_PARTIAL_ATTR, None)
    attrs[_STORE_ATTR] = {**meta_attrs(m), _COMPLETE: True}
    return attrs


def _ints(values: Any) -> tuple[int, ...]:
    return tuple(int(v) for v in values)


def _read_v1(meta: Mapping) -> StoreMeta:
    csr, csc = meta[ROWS], meta[FEATURES]
    checksums = csc.get("checksums")
    return StoreMeta(
        version=1,
        shape=(int(meta["shape"][0]), int(meta["shape"][1])),
        nnz=int(meta["nnz"]),
        dtype=np.dtype(meta["dtype"]),
        row_bounds=_ints(csr["bounds"]), row_block_nnz=_ints(csr["block_nnz"]),
        feature_bounds=_ints(csc["bounds"]), feature_block_nnz=_ints(csc["block_nnz"]),
        feature_checksums=None if checksums is None else tuple(checksums),
        y_checksum=meta.get("y_checksum"),
        has_labels=bool(meta.get("has_labels")),
        has_feature_ids=bool(meta.get("has_feature_ids")),
        provenance=dict(meta.get("provenance") or {}),
        ground_truth=meta.get("ground_truth"),
        created=meta.get("created"),
        dufs_version=meta.get("dufs_version"),
        index_dtype=str(meta.get("index_dtype", "int32")),
        indptr_dtype=str(meta.get("indptr_dtype", "int64")),
        raw=meta,
    )


#: one reader per format version this dufs reads
_READERS: dict[int, Callable[[Mapping], StoreMeta]] = {1: _read_v1}
READ_VERSIONS = tuple(sorted(_READERS))


def read_meta(root_attrs: Mapping, where: str) -> StoreMeta:
    """The metadata of the finished store ``where`` from its root group's attributes, by its format version.

    Raises :class:`IncompleteStoreError` without a completion marker, :class:`StoreError` for a format version
    this dufs does not read.
    """
    meta = root_attrs.get(_STORE_ATTR)
    if not isinstance(meta, dict) or not meta.get(_COMPLETE):
        raise IncompleteStoreError(
            f"{where} has no completion marker: it is not a finished dufs store. If a conversion into "
            f"it was interrupted, finish it with `dufs convert <inputs> {where} --resume`; else rebuild it")
    version = meta.get(_VERSION)
    reader = _READERS.get(version) if type(version) is int else None
    if reader is None:
        reads = ("version " if len(READ_VERSIONS) == 1 else "versions ") + ", ".join(map(str, READ_VERSIONS))
        newer = type(version) is int and version > READ_VERSIONS[-1]
        raise StoreError(f"{where} has format version {version!r}, " + (
            f"newer than this dufs reads ({reads}); upgrade dufs" if newer else
            f"which this dufs does not read (it reads {reads})"))
    try:
        return reader(meta)
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise StoreError(f"{where}: its metadata (format version {version}) is malformed ({type(exc).__name__}: "
                         f"{exc})") from None


def classify(root_attrs: Mapping) -> tuple[str, str]:
    """``(kind, description)`` of a Zarr group by its attributes: ``"store"`` (a dufs store, finished or not),
    ``"partial"`` (a dufs build) or ``"other"``."""
    done, building = root_attrs.get(_STORE_ATTR), root_attrs.get(_PARTIAL_ATTR)
    if isinstance(done, dict) and _VERSION in done:
        return "store", "a dufs store" if done.get(_COMPLETE) else "an unfinished dufs store"
    if isinstance(building, dict) and _VERSION in building:
        return "partial", "an unfinished dufs build"
    return "other", "a Zarr group without dufs metadata"


# ---------------------------------------------------------------------------------------------------- a partial build
@dataclass(frozen=True)
class PartialMeta:
    """What a build records in its partial store's root attributes: the format version it writes, the options it
    was asked for (a resume must ask for the same), the settings that shape the store, and the feature block
    bounds once the transpose has begun. Fields are None where the record lacks them."""

    version: int | None = None
    options: Any = None
    value_dtype: str | None = None
    granule: int | None = None
    csc_bounds: list | None = None
    spill: int | None = None  # the format of its spill files (None: the Zarr spill groups of earlier builds)

    @property
    def settings(self) -> dict:
        return build_settings(self.value_dtype, self.granule, self.spill)


def build_settings(value_dtype: str | None, granule: int | None, spill: int | None = SPILL_FORMAT) -> dict:
    """The settings a resume must share with the build it continues (``spill``: the spill files' format)."""
    return {"value_dtype": value_dtype, "granule": granule, "spill": spill}


def new_partial(options: Any, value_dtype: str, granule: int) -> tuple[str, dict]:
    """``(attribute, value)`` to put on a new partial store's root group."""
    return _PARTIAL_ATTR, {_VERSION: FORMAT_VERSION, "options": options, **build_settings(value_dtype, granule)}


def read_partial(root_attrs: Mapping) -> PartialMeta:
    rec = root_attrs.get(_PARTIAL_ATTR, {})
    return PartialMeta(rec.get(_VERSION), rec.get("options"), rec.get("value_dtype"), rec.get("granule"),
                       rec.get("csc_bounds"), rec.get("spill"))


def with_csc_bounds(root_attrs: Mapping, bounds: list[int]) -> dict:
    """The root attributes with the feature block bounds the transpose uses recorded."""
    attrs = dict(root_attrs)
    attrs[_PARTIAL_ATTR] = {**attrs.get(_PARTIAL_ATTR, {}), "csc_bounds": bounds}
    return attrs


# the builder's own keys of a row block's attributes (anything else there is the writer's ``extra``)
_ROW_KEYS = (_COMPLETE, "n_rows", "nnz", "has_y", "raw_indices", "indices_shift", "min_index", "max_index",
             "fix_pending")


@dataclass(frozen=True)
class RowBlockMeta:
    """A written row block, as its group's attributes record it (``complete: true`` in the same write).

    ``raw_indices``: its column indices await an index base decided at the end (``indices_shift`` is the base its
    CSR indices were written with; ``fix_pending``: a rewrite for the final base is under way). ``extra``: what the
    writer recorded besides (a converter's :class:`IngestRecord`).
    """

    index: int
    n_rows: int
    nnz: int
    min_index: int
    max_index: int
    has_y: bool = False
    raw_indices: bool | None = None
    indices_shift: int | None = None
    fix_pending: bool = False
    extra: Mapping = field(default_factory=dict)


def row_block_attrs(m: RowBlockMeta) -> dict:
    """The attributes of a finished row block (the completion marker in the same write)."""
    return {_COMPLETE: True, "n_rows": m.n_rows, "nnz": m.nnz, "has_y": m.has_y, "raw_indices": m.raw_indices,
            "indices_shift": m.indices_shift, "min_index": m.min_index, "max_index": m.max_index, **m.extra}


def read_row_block(attrs: Mapping, index: int) -> RowBlockMeta:
    return RowBlockMeta(index=index, n_rows=attrs["n_rows"], nnz=attrs["nnz"], min_index=attrs["min_index"],
                        max_index=attrs["max_index"], has_y=bool(attrs.get("has_y")),
                        raw_indices=attrs.get("raw_indices"), indices_shift=attrs.get("indices_shift"),
                        fix_pending=bool(attrs.get("fix_pending")),
                        extra={k: v for k, v in attrs.items() if k not in _ROW_KEYS})


def unfinished_block_attrs() -> dict:
    """The attributes of a block being written (replaced by its record, with ``complete: true``, at the end)."""
    return {_COMPLETE: False}


def reindex_pending_attrs(attrs: Mapping, shift: int) -> dict:
    """A row block's attributes once its indices for base ``shift`` are written beside the old ones."""
    return {**attrs, "indices_shift": shift, "fix_pending": True}


def reindex_done_attrs(attrs: Mapping) -> dict:
    """A row block's attributes once its rewritten indices are in place."""
    return {**attrs, "fix_pending": False}


@dataclass(frozen=True)
class FeatureBlockMeta:
    """A written feature block: features ``start:stop``, ``nnz`` nonzeros, the crc32c of its content."""

    nnz: int
    start: int
    stop: int
    checksum: str | None = None


def feature_block_attrs(m: FeatureBlockMeta) -> dict:
    return {_COMPLETE: True, "nnz": m.nnz, "start": m.start, "stop": m.stop, "checksum": m.checksum}


def read_feature_block(attrs: Mapping) -> FeatureBlockMeta:
    return FeatureBlockMeta(int(attrs["nnz"]), attrs.get("start"), attrs.get("stop"), attrs.get("checksum"))


@dataclass(frozen=True)
class IngestRecord:
    """What a converter's parse of one row block saw, kept in the block's attributes (its ``extra``) so that a
    resumed conversion counts the blocks done before without reading them again."""

    n_lines: int
    n_blank: int
    n_comment: int
    n_skipped: int
    n_qid: int
    bytes: int
    max_index_line: int
    skipped: list  # [line, byte offset, reason] of the first few skipped lines
    unit: list  # [input number, start byte, stop byte]

    def attrs(self) -> dict:
        return {"n_lines": self.n_lines, "n_blank": self.n_blank, "n_comment": self.n_comment,
                "n_skipped": self.n_skipped, "n_qid": self.n_qid, "bytes": self.bytes,
                "max_index_line": self.max_index_line, "skipped": self.skipped, "unit": self.unit}

    @classmethod
    def from_attrs(cls, attrs: Mapping) -> IngestRecord:
        return cls(attrs["n_lines"], attrs["n_blank"], attrs["n_comment"], attrs["n_skipped"],
                   attrs.get("n_qid", 0), attrs["bytes"], attrs["max_index_line"], list(attrs.get("skipped", [])),
                   attrs["unit"])

