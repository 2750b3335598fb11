"""dufs: distributed, out-of-core feature selection for huge sparse data, on Dask.

>>> import dufs
>>> store = dufs.open("kddb.zarr")          # a sparse store made by `dufs convert` or `dufs.data.write_store`
>>> X = store.to_dask("csc")                # a Dask array of sparse feature blocks
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from dufs import config  # noqa: F401  (registers the dufs namespace in dask.config)
from dufs._version import __version__
from dufs.data import _sizeof  # noqa: F401  (registers dask.sizeof for sparse blocks, on workers too)

# The public names load on first use (PEP 562), so that a worker process unpickling one kernel, or the CLI, does not
# import scikit-learn and every method to get there.
_LAZY = {
    "fit": "dufs.api",
    "SparseStore": "dufs.data", "open_store": "dufs.data", "write_store": "dufs.data",
    "JCFS": "dufs.estimators", "M3FS": "dufs.estimators", "MMFS": "dufs.estimators", "UFCM": "dufs.estimators",
    "CorrelationSelector": "dufs.estimators", "FisherScore": "dufs.estimators", "LapAOFS": "dufs.estimators",
    "LapDOFS": "dufs.estimators", "LaplacianScore": "dufs.estimators", "VarianceSelector": "dufs.estimators",
    "Selection": "dufs.selection", "load_selection": "dufs.selection",
    "open": "dufs.data:open_store",
}

if TYPE_CHECKING:
    from dufs.api import fit
    from dufs.data import SparseStore, open_store, write_store
    from dufs.estimators import (
        JCFS,
        M3FS,
        MMFS,
        UFCM,
        CorrelationSelector,
        FisherScore,
        LapAOFS,
        LapDOFS,
        LaplacianScore,
        VarianceSelector,
    )
    from dufs.selection import Selection, load_selection

    open = open_store  # noqa: A001  (dufs.open(path), like zarr.open)


#: the subpackages and modules reachable as attributes (``dufs.api.METHODS`` after ``import dufs``), imported on use
_SUBMODULES = frozenset({"api", "bench", "cli", "data", "engine", "errors", "estimators", "evaluate", "kernels",
                         "memory", "methods", "plot", "scheduling", "selection", "testing"})


def __getattr__(name: str):
    if name in _SUBMODULES:
        return importlib.import_module(f"dufs.{name}")
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module 'dufs' has no attribute {name!r}")
    module, _, attr = target.partition(":")
    value = getattr(importlib.import_module(module), attr or name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY) | _SUBMODULES)


__all__ = ["JCFS", "M3FS", "MMFS", "UFCM", "CorrelationSelector", "FisherScore", "LapAOFS", "LapDOFS", "LaplacianScore",
           "Selection", "SparseStore", "VarianceSelector", "__version__", "fit", "load_selection", "open", "open_store",
           "write_store"]
