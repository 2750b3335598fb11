"""Storage layer: the sparse Zarr store, its layout, builder and writers, libsvm ingest, synthetic data, bundled
datasets."""

from dufs.data import _sizeof  # noqa: F401  (registers dask.sizeof for sparse blocks)
from dufs.data.builder import StoreBuilder
from dufs.data.layout import StoreMeta
from dufs.data.store import RawBlock, SparseStore, open_store, read_block, store_kind
from dufs.data.verify import VerifyReport, verify_store
from dufs.data.writers import write_store

__all__ = ["RawBlock", "SparseStore", "StoreBuilder", "StoreMeta", "VerifyReport", "open_store", "read_block",
           "store_kind", "verify_store", "write_store"]
