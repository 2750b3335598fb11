"""``dask.sizeof`` for the sparse block types dufs produces.

Without it dask counts a pydata ``sparse.GCXS`` (and, in some dask versions, a SciPy sparse array) as a few dozen
bytes, so memory accounting and spilling never start. Registered eagerly: both libraries are dependencies.
"""

from __future__ import annotations

import scipy.sparse as sp
import sparse
from dask.sizeof import sizeof


def _nbytes(*arrays) -> int:
    return int(sum(getattr(a, "nbytes", 0) for a in arrays)) + 64


@sizeof.register((sp.csr_array, sp.csc_array, sp.csr_matrix, sp.csc_matrix, sp.bsr_array, sp.bsr_matrix))
def _scipy_compressed(x) -> int:
    return _nbytes(x.data, x.indices, x.indptr)


@sizeof.register((sp.coo_array, sp.coo_matrix))
def _scipy_coo(x) -> int:
    return _nbytes(x.data, *x.coords)


@sizeof.register(sparse.GCXS)
def _gcxs(x) -> int:
    return _nbytes(x.data, x.indices, x.indptr)


@sizeof.register(sparse.COO)
def _pydata_coo(x) -> int:
    return _nbytes(x.data, x.coords)
