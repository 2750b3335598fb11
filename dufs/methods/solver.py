"""What the iterative solvers (MMFS's distributed DCD, the greedy selectors, whatever comes next) share: one
answer each to the questions every long job on a cluster meets.

- **State per partition**, kept where the blocks are (``Matrix.map_blocks(..., state=)``), released with
  :func:`release` when a newer one replaces it.
- **Lost workers**: a failure :func:`recoverable` says was the loss of workers (and of the state they held) is
  recovered by rebuilding the state from the driver's last copy, at most :data:`MAX_RECOVERIES` times a call.
- **Checkpoints**: beside a local store, under one naming scheme (:func:`checkpoint_dir`:
  ``<store>.dufs-side/<method>-<hash of the problem>``), every file written atomically (:func:`atomic_write`:
  a temporary name, flushed and renamed into place), so a killed job leaves the last complete checkpoint.
- **What travels**: a solver's per-round record is a small dataclass with named fields (e.g. MMFS's
  ``RoundTotals``), and every method returns the same :class:`~dufs.methods.registry.MethodResult` to ``fit``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import uuid
from collections.abc import Callable, Iterable
from typing import IO, Any

from dufs.engine import is_lost
from dufs.errors import ParameterError

__all__ = ["MAX_RECOVERIES", "atomic_write", "checkpoint_dir", "recoverable", "release", "store_dir"]

#: rebuilds of a solver's block state after lost workers, per call
MAX_RECOVERIES = 5


def recoverable(exc: BaseException, recoveries: int) -> bool:
    """Whether a solver should rebuild its state and go on after ``exc``: the loss of workers (or of what they
    held), with fewer than :data:`MAX_RECOVERIES` rebuilds made so far."""
    return is_lost(exc) and recoveries < MAX_RECOVERIES


def release(state: Any) -> None:
    """Free a per-partition state kept on the workers (a no-op for state kept in this process)."""
    if hasattr(state, "release"):
        state.release()


def store_dir(M: Any) -> str | None:
    """The local path of the store ``M`` was read from, or None (in-memory data, a Dask array, a remote URL)."""
    p = M.store_path
    if p is None:
        return None
    p = os.fspath(p)
    if p.startswith("file://"):
        p = p[len("file://"):]
    return None if "://" in p else p.rstrip("/")


def checkpoint_dir(M: Any, checkpoint: Any, method: str, problem: dict, *, unhashed: Iterable[str] = ()) -> str | None:
    """Where a solver of ``method`` keeps its checkpoints: ``checkpoint`` itself (a directory), None for None, and
    for ``"auto"`` ``<store>.dufs-side/<method>-<12 hex digits of the problem's SHA-1>`` beside a local store (None
    for other input). ``unhashed``: keys of ``problem`` that a resume may change (they do not name the directory).
    """
    if checkpoint is None:
        return None
    if checkpoint != "auto":
        if not isinstance(checkpoint, str | os.PathLike):
            raise ParameterError(f"The 'checkpoint' parameter of {method} must be a directory path, 'auto' or "
                                 f"None; got {checkpoint!r}.")
        return os.fspath(checkpoint)
    p = store_dir(M)
    if p is None:
        return None
    skip = set(unhashed)
    key = {k: v for k, v in problem.items() if k not in skip}
    h = hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    return f"{p}.dufs-side/{method}-{h}"


def atomic_write(path: str, write: Callable[[IO[bytes]], None], *, fsync: bool = True) -> None:
    """Write ``path`` through ``write(file)`` under a temporary name in the same folder, flushed (and fsynced) and
    renamed into place: readers see the old file or the new one, never a part; a failure leaves no temporary."""
    tmp = f"{path}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            if fsync:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
