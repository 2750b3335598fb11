"""Scratch arrays that a process's ingest tasks reuse from one block to the next.

Each parse task reads a block of text, converts and buckets its entries, and lets all of it go; the next task asks
for the same sizes again. A fresh array of more than a few hundred KiB is mapped anew by the allocator (Dask's
workers start with ``MALLOC_TRIM_THRESHOLD_`` set, which makes every such array an ``mmap``/``munmap`` pair) and
its pages fault in again on first touch, a large part of a parse task's time (docs/measurements.md, "Ingest
scratch arrays"). :func:`scratch` hands out an array over memory this thread kept
from an earlier task, grown when a block needs more, once nothing refers to the array it last handed out (its lease,
:mod:`dufs._lease`, as :mod:`dufs.engine.buffers` decides for a pass's results); memory is one buffer per name and
thread, the size of the largest block seen, until :func:`release` (the end of a build) lets it all go.
"""

from __future__ import annotations

import threading

import numpy as np

from dufs._lease import FREE, lease

_LOCK = threading.Lock()
_POOLS: dict[int, dict[str, list]] = {}  # thread -> name -> [the memory kept, the lease of its last array]


def scratch(name: str, n: int, dtype: np.dtype | type) -> np.ndarray:
    """An uninitialised 1-D array of ``n`` items of ``dtype``, in memory reused from this thread's earlier call with
    the same ``name`` when that array is no longer referred to (else freshly allocated, and kept in its place)."""
    dtype = np.dtype(dtype)
    need = int(n) * dtype.itemsize
    with _LOCK:
        pool = _POOLS.setdefault(threading.get_ident(), {})
    kept = pool.get(name)
    if kept is None or kept[0].nbytes < need or kept[1].active:
        kept = [np.empty(max(need + need // 4, 1 << 16), np.uint8), FREE]  # room for somewhat larger blocks
        pool[name] = kept
    out, kept[1] = lease(kept[0], (int(n),), dtype)
    return out


def release() -> None:
    """Let every thread's kept arrays go (those still in use stay valid: they are only no longer kept)."""
    with _LOCK:
        _POOLS.clear()


def kept_bytes() -> int:
    """Bytes of scratch memory this process keeps."""
    with _LOCK:
        return sum(kept[0].nbytes for pool in _POOLS.values() for kept in list(pool.values()))
