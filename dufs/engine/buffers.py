"""Reused output buffers for the per-block work of a pass (the one place that decides how a pass's results are
allocated where the blocks live).

Every pass writes each block's (or partition's) result into a fresh array of the same shape as the previous pass's.
A fresh array of more than a few hundred KiB is mapped anew by the allocator, and its pages fault in again on first
touch: Dask's workers start with ``MALLOC_TRIM_THRESHOLD_`` set (``distributed.nanny.pre-spawn-environ``), which turns
glibc's dynamic mmap threshold off, so every such array is an ``mmap``/``munmap`` pair. Faulting fresh pages in
costs more than overwriting them, and by an amount that varies from run to run (docs/measurements.md, "Pooled
buffers").

:func:`buffer` hands out an array over memory that an earlier pass of this process allocated, once nothing
refers to the array it was last handed out as: the result of a pass lives in the worker's memory
(``dask_worker.data``) until the driver has it and releases its key, and every view, memoryview (serialisation frames
in flight included) or container of it keeps the lease (:mod:`dufs._lease`) active. Memory is bounded: at most
``dufs.engine.buffer-bytes`` of buffers per process are kept (least recently used dropped), and a buffer smaller
than :data:`MIN_BYTES` is allocated as usual (the allocator reuses small ones itself).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

import numpy as np

from dufs import config
from dufs._lease import lease

__all__ = ["MIN_BYTES", "buffer", "clear", "pooled_bytes"]

#: arrays smaller than this are not pooled
MIN_BYTES = 1 << 18

_LOCK = threading.Lock()
# (shape, dtype) -> [memory, its last lease] of that shape, least recently handed out first
_POOL: OrderedDict[tuple, list[list]] = OrderedDict()
_HELD = [0]  # bytes in the pool


def _limit() -> int:
    return int(config.parse_bytes(config.get("engine.buffer-bytes")))


def _free_one(lst: list[list]) -> list | None:
    for entry in lst:
        if not entry[1].active:
            return entry
    return None


def _evict(need: int, limit: int) -> None:
    """Drop unused buffers, least recently used first, until ``need`` more bytes fit under ``limit``."""
    for key in list(_POOL):
        if _HELD[0] + need <= limit:
            return
        lst = _POOL[key]
        keep = []
        for entry in lst:
            if _HELD[0] + need > limit and not entry[1].active:
                _HELD[0] -= entry[0].nbytes
            else:
                keep.append(entry)
        if keep:
            _POOL[key] = keep
        else:
            del _POOL[key]


def buffer(shape: Any, dtype: Any = np.float64, *, zero: bool = False) -> np.ndarray:
    """A C-ordered array of ``shape`` and ``dtype`` for a pass's result, uninitialised (``zero``: filled with
    zeros), taken from this process's pool when one is free (see the module docstring)."""
    shape = tuple(int(s) for s in np.atleast_1d(shape)) if not isinstance(shape, tuple) else tuple(map(int, shape))
    dt = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    if nbytes < MIN_BYTES:
        return np.zeros(shape, dt) if zero else np.empty(shape, dt)
    key = (shape, dt.str)
    with _LOCK:
        lst = _POOL.get(key)
        entry = _free_one(lst) if lst else None
        if entry is not None:
            _POOL.move_to_end(key)
            out, entry[1] = lease(entry[0], shape, dt)
            if zero:
                out.fill(0)
            return out
        limit = _limit()
        memory = np.zeros(nbytes, np.uint8) if zero else np.empty(nbytes, np.uint8)
        out, held = lease(memory, shape, dt)
        if nbytes <= limit:
            if _HELD[0] + nbytes > limit:
                _evict(nbytes, limit)
            if _HELD[0] + nbytes <= limit:
                _POOL.setdefault(key, []).append([memory, held])
                _POOL.move_to_end(key)
                _HELD[0] += nbytes
        return out


def pooled_bytes() -> int:
    """Bytes of buffers this process keeps for reuse."""
    return _HELD[0]


def clear() -> None:
    """Forget every pooled buffer (arrays still in use stay valid: they are only no longer reused)."""
    with _LOCK:
        _POOL.clear()
        _HELD[0] = 0
