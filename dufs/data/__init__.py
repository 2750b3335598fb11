"""Storage layer: the sparse Zarr store, its builder and writers, libsvm ingest, synthetic data, bundled datasets."""

from dufs.data import _sizeof  # noqa: F401  (registers dask.sizeof for sparse blocks)
from dufs.data.builder import StoreBuilder
from dufs.data.store import RawBlock, SparseStore, VerifyReport, open_store, store_kind, verify_store
from dufs.data.writers import write_store

__all__ = ["RawBlock", "SparseStore", "StoreBuilder", "VerifyReport", "open_store", "store_kind", "verify_store",
           "write_store"]
