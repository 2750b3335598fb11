"""Scratch arrays that a process's ingest tasks reuse from one block to the next.

Each parse task reads a block of text, converts and buckets its entries, and lets all of it go; the next task asks
for the same sizes again. A fresh array of more than a few hundred KiB is mapped anew by the allocator (Dask's
workers start with ``MALLOC_TRIM_THRESHOLD_`` set, which makes every such array an ``mmap``/``munmap`` pair) and
its pages fault in again on first touch: on the 2-vCPU test machine a parse task's fresh arrays (about 27 MB for
8 MiB of text) cost 10-28 ms of a 55-68 ms task. :func:`scratch` hands out a view of an array this thread kept
from an earlier task, grown when a block needs more, once nothing else refers to it (as
:mod:`dufs.engine.buffers` decides for a pass's results); memory is one array per name and thread, the size of the
largest block seen, until :func:`release` (the end of a build) lets it all go.
"""

from __future__ import annotations

import sys
import threading

import numpy as np

_LOCK = threading.Lock()
_POOLS: dict[int, dict[str, np.ndarray]] = {}  # thread -> name -> the array kept
# references to a kept array that nobody else holds, as counted in scratch(): the pool's value, the name `kept` and
# getrefcount's own argument
_BASELINE = 3


def scratch(name: str, n: int, dtype: np.dtype | type) -> np.ndarray:
    """An uninitialised 1-D array of ``n`` items of ``dtype``, in memory reused from this thread's earlier call with
    the same ``name`` when that array is no longer referred to (else freshly allocated, and kept in its place)."""
    dtype = np.dtype(dtype)
    need = int(n) * dtype.itemsize
    with _LOCK:
        pool = _POOLS.setdefault(threading.get_ident(), {})
    kept = pool.get(name)
    if kept is None or kept.nbytes < need or sys.getrefcount(kept) > _BASELINE:
        kept = np.empty(max(need + need // 4, 1 << 16), np.uint8)  # room for somewhat larger blocks
        pool[name] = kept
    return kept[:need].view(dtype)


def release() -> None:
    """Let every thread's kept arrays go (those still in use stay valid: they are only no longer kept)."""
    with _LOCK:
        _POOLS.clear()


def kept_bytes() -> int:
    """Bytes of scratch memory this process keeps."""
    with _LOCK:
        return sum(a.nbytes for pool in _POOLS.values() for a in list(pool.values()))
