"""What the iterative solvers (MMFS's distributed DCD, the greedy selectors, whatever comes next) share: one
answer each to the questions every long job on a cluster meets.

- **State per partition**, kept where the blocks are (``Matrix.map_blocks(..., state=)``), released with
  :func:`release` when a newer one replaces it.
- **Lost workers**: a failure :func:`recoverable` says was the loss of workers (and of the state they held) is
  recovered by rebuilding the state from the driver's last copy, at most :data:`MAX_RECOVERIES` times a call.
- **Checkpoints**: for a local store, under one naming scheme (:func:`checkpoint_dir`:
  ``<store>.dufs-side/<method>-<hash of the problem>`` beside it where its folder is writable, else under
  ``dufs.checkpoint.dir`` or a per-user cache, :func:`checkpoint_root`), every file written atomically
  (:func:`atomic_write`: a temporary name, flushed and renamed into place), so a killed job leaves the last
  complete checkpoint; removed after a successful run unless ``dufs.checkpoint.keep`` (:func:`finish_checkpoint`).
- **What travels**: a solver's per-round record is a small dataclass with named fields (e.g. MMFS's
  ``RoundTotals``), and every method returns the same :class:`~dufs.methods.registry.MethodResult` to ``fit``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterable
from typing import IO, Any

from dufs import config
from dufs._logging import get_logger
from dufs.engine import is_lost
from dufs.errors import ParameterError

__all__ = ["MAX_RECOVERIES", "atomic_write", "checkpoint_dir", "checkpoint_root", "finish_checkpoint", "recoverable",
           "release", "store_dir"]

log = get_logger(__name__)

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
    for ``"auto"`` ``<folder>/<method>-<12 hex digits of the problem's SHA-1>`` for a local store, ``<folder>`` its
    :func:`checkpoint_root` (None for other input, or where no folder can be written). ``unhashed``: keys of
    ``problem`` that a resume may change (they do not name the directory).
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
    root = checkpoint_root(p)
    if root is None:
        return None
    skip = set(unhashed)
    key = {k: v for k, v in problem.items() if k not in skip}
    h = hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    return os.path.join(root, f"{method}-{h}")


def checkpoint_root(store: str) -> str | None:
    """The folder the checkpoints of the local store ``store`` go in (``dufs.checkpoint.dir``).

    ``auto`` (the default): ``<store>.dufs-side`` beside the store where this process can write there (tried by
    creating and removing a file, as mode bits say nothing for root or on a read-only mount), else
    ``<cache>/<store's name>-<hash of its real path>``, ``<cache>`` ``$XDG_CACHE_HOME/dufs/checkpoints`` or
    ``~/.cache/dufs/checkpoints`` (None, no checkpoint, where that cannot be written either). Any other value: that
    folder, with the same per-store subfolder (a ParameterError where it cannot be written). The same store and
    setting give the same folder on the next run, where a resume looks."""
    setting = config.get("checkpoint.dir")
    real = os.path.realpath(store)
    sub = f"{os.path.basename(real) or 'store'}-{hashlib.sha1(real.encode()).hexdigest()[:12]}"
    if setting is None or str(setting).strip().lower() in ("", "auto"):
        side = f"{store}.dufs-side"
        if _writable(side if os.path.isdir(side) else os.path.dirname(os.path.abspath(store))):
            return side
        base = _cache_dir()
        if not _writable(base, create=True):
            log.warning("no checkpoints for %s: neither its folder nor %s can be written (set dufs.checkpoint.dir "
                        "to a folder that can)", store, base)
            return None
        log.info("checkpoints of %s go to %s (its folder cannot be written)", store, base)
        return os.path.join(base, sub)
    base = os.path.abspath(os.path.expanduser(os.path.expandvars(os.fspath(setting))))
    if not _writable(base, create=True):
        raise ParameterError(f"dufs.checkpoint.dir is {base}, a folder this process cannot write; set it to one "
                             f"it can, or to auto")
    return os.path.join(base, sub)


def _cache_dir() -> str:
    """The per-user folder of checkpoints: ``$XDG_CACHE_HOME/dufs/checkpoints``, else ``~/.cache/...``."""
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    cache = xdg if os.path.isabs(xdg) else os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "dufs", "checkpoints")


def _writable(folder: str, *, create: bool = False) -> bool:
    """Whether this process can create (and remove) a file in ``folder`` (made first with ``create``): tried, since
    root passes every mode check and a read-only mount fails them all."""
    try:
        if create:
            os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".dufs-write-test-", dir=folder)
        os.close(fd)
        os.unlink(tmp)
    except OSError:
        return False
    return True


def keep_checkpoints() -> bool:
    """``dufs.checkpoint.keep``: whether a successful run keeps the checkpoint dufs placed itself."""
    v = config.get("checkpoint.keep")
    return v.strip().lower() in ("true", "yes", "on", "1") if isinstance(v, str) else bool(v)


def finish_checkpoint(directory: str | None, checkpoint: Any) -> bool:
    """After a successful run: the checkpoint folder ``directory`` that ``checkpoint="auto"`` placed is removed,
    and the per-store folder above it where that became empty, unless ``dufs.checkpoint.keep``; a folder the
    caller named (``checkpoint=<directory>``) is theirs and stays. A failed or interrupted run never gets here, so
    its checkpoint stays for ``resume=True``. Returns whether the checkpoint (if any) was kept."""
    if directory is None or checkpoint != "auto" or keep_checkpoints():
        return True
    shutil.rmtree(directory, ignore_errors=True)
    with contextlib.suppress(OSError):
        os.rmdir(os.path.dirname(directory))  # only where empty: another problem's checkpoint may be there
    return os.path.exists(directory)


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
