"""Leases on reused memory: an array handed out of a pool, and a way for the pool to know when it is free again.

A pool (:mod:`dufs.engine.buffers`, the results' files of :mod:`dufs.engine.shm`, the ingest's scratch memory) hands
out arrays over memory it keeps, and may hand that memory out again only once nobody uses the array any more: a
pass's result lives in a worker's memory until the driver has it and releases its key, in views, memoryviews,
serialisation frames in flight and containers that the pool cannot see.

:func:`lease` makes the handed-out array over a small owner object (its ``base``): every view of the array, every
memoryview or pickle buffer of it and every array made from those refers to the owner, directly or through its
base chain, so the owner lives exactly as long as anything made from the array does. The pool keeps a
:class:`Lease` (a weak reference to the owner) and takes the memory back once :attr:`Lease.active` is false. Weak
references are a stable interface of the language, unlike reference counts (immortal objects, deferred counting in
the free-threaded build), so a buffer in use is never handed out twice whatever the Python version.
"""

from __future__ import annotations

import math
import weakref
from typing import Any

import numpy as np

__all__ = ["FREE", "Lease", "lease"]


class _Owner:
    """The base of a leased array: exposes ``nbytes`` of ``memory`` from ``offset`` as bytes
    (``__array_interface__``) and keeps ``memory`` alive while any array made from it lives."""

    __slots__ = ("__array_interface__", "__weakref__", "memory")

    def __init__(self, memory: np.ndarray, offset: int, nbytes: int):
        self.memory = memory
        self.__array_interface__ = {"data": (memory.__array_interface__["data"][0] + offset,
                                             not memory.flags.writeable),
                                    "shape": (nbytes,), "typestr": "|u1", "version": 3}


class Lease:
    """A pool's hold on memory it handed out (:func:`lease`): :attr:`active` while any array made from it lives."""

    __slots__ = ("_ref",)

    def __init__(self, ref: weakref.ref | None):
        self._ref = ref

    @property
    def active(self) -> bool:
        """Whether some array made from the leased one (a view, a memoryview, a pickle buffer...) still lives."""
        return self._ref is not None and self._ref() is not None


#: a lease that holds nothing (memory not handed out yet)
FREE = Lease(None)


def lease(memory: np.ndarray, shape: Any, dtype: Any, offset: int = 0) -> tuple[np.ndarray, Lease]:
    """A C-ordered array of ``shape`` and ``dtype`` over ``memory``'s bytes from ``offset`` (no copy; writable where
    ``memory`` is), and the :class:`Lease` that says when nothing made from it lives any more. ``memory`` must be
    C-contiguous and hold the array's bytes."""
    dt = np.dtype(dtype)
    shape = tuple(int(s) for s in shape)
    nbytes = math.prod(shape) * dt.itemsize
    if not memory.flags.c_contiguous or memory.nbytes < offset + nbytes:
        raise ValueError(f"a lease of {offset + nbytes} bytes over a buffer of {memory.nbytes} (contiguous: "
                         f"{memory.flags.c_contiguous})")
    owner = _Owner(memory, offset, nbytes)
    return np.asarray(owner).view(dt).reshape(shape), Lease(weakref.ref(owner))
