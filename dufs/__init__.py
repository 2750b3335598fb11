"""dufs: distributed, out-of-core feature selection for huge sparse data, on Dask.

>>> import dufs
>>> store = dufs.open("kddb.zarr")          # a sparse store made by `dufs convert` or `dufs.data.write_store`
>>> X = store.to_dask("csc")                # a Dask array of sparse feature blocks
"""

from dufs import config  # noqa: E402,F401  (registers the dufs namespace in dask.config)
from dufs._version import __version__  # noqa: E402
from dufs.api import fit  # noqa: E402
from dufs.data import SparseStore, open_store, write_store  # noqa: E402
from dufs.estimators import (  # noqa: E402
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
from dufs.selection import Selection, load_selection  # noqa: E402

open = open_store  # noqa: A001  (dufs.open(path), like zarr.open)

__all__ = ["JCFS", "M3FS", "MMFS", "UFCM", "CorrelationSelector", "FisherScore", "LapAOFS", "LapDOFS", "LaplacianScore",
           "Selection", "SparseStore", "VarianceSelector", "__version__", "fit", "load_selection", "open", "open_store",
           "write_store"]
