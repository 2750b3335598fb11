"""Dense vectors shared through the host's shared memory with the worker processes on the driver's machine.

A pass reads its vector V at random rows, so V's place in the cache decides the pass's speed. Scattered, every
worker process holds its own copy: on this project's 2-core test machine two float64 copies of a 2M-row V (16 MB
each) did not fit the shared L3 cache together, and a pass on 2 workers ran 1.06x faster than on 1 (the kernel
alone, each process over half the blocks). With one copy in shared memory that every worker maps, the same two
kernels ran 2.04x faster than one (docs/architecture.md, "Measured facts").

:func:`publish` writes an array to a file under ``/dev/shm`` (one ``write``: no pickling, no transfer) and yields a
:class:`SharedArray`, a small picklable reference that travels in the graph; :func:`local_array` in the task maps
it read-only (a worker keeps its mappings of the files that still exist: the blocks of one pass map it once). The
file is removed when the ``with`` block ends. It is used where it pays (:func:`shared_eligible`): two or more
workers, all of which see the driver's ``/dev/shm`` (:func:`workers_share_memory`, asked once per set of workers:
LocalCluster workers, or ``dask worker`` processes started on the driver's machine), and a vector of at least
``dufs.engine.shared-memory-bytes`` (and at most ``dufs.engine.shared-memory-max-bytes``: no limit by default). Other
vectors, and workers on other machines, get the array scattered as before, and so does a vector whose file cannot
be written (a full /dev/shm: a container's is often 64 MB); ``dufs.engine.shared-memory: off`` scatters
everything.
"""

from __future__ import annotations

import atexit
import contextlib
import mmap
import os
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from dufs import config
from dufs.data._fs import pid_alive

__all__ = ["SharedArray", "local_array", "publish", "receive", "receive_eligible", "receive_or_none", "shared_eligible",
           "writable_array", "workers_share_memory"]

_DIR = "/dev/shm"
_PREFIX = "dufs-"


@dataclass(frozen=True)
class SharedArray:
    """A C-ordered array in the file ``path`` (under ``/dev/shm``): what a task receives in place of the array;
    :func:`local_array` maps it."""

    path: str
    shape: tuple
    dtype: str

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


# ------------------------------------------------------------------------------------------------ in the tasks
_MAPS: OrderedDict[str, np.ndarray] = OrderedDict()
_MAPS_LOCK = threading.Lock()
_KEEP = 4  # mappings kept per process at most (those whose file was removed are dropped first)


def _mapped(x: SharedArray, maps: OrderedDict, writable: bool, what: str) -> np.ndarray:
    """The bytes of ``x``'s file mapped in this process (read-only or for writing), kept in ``maps`` (once per
    process and file; a file removed since is dropped first, its memory goes back)."""
    with _MAPS_LOCK:
        got = maps.get(x.path)
        if got is not None and got.nbytes >= x.nbytes:
            maps.move_to_end(x.path)
            return got[:x.nbytes]
        for p in [p for p in maps if not os.path.exists(p)]:
            del maps[p]
        try:
            fd = os.open(x.path, os.O_RDWR if writable else os.O_RDONLY)
        except FileNotFoundError:
            raise FileNotFoundError(
                f"the shared {what} {x.path} is not visible in this worker process (is it on another machine than "
                f"the client? set dufs.engine.shared-memory to 'off')") from None
        try:
            # the whole file: a results file reused for a smaller result is larger than this one's bytes
            size = max(x.nbytes, os.fstat(fd).st_size)
            if size == 0:
                raw = np.zeros(0, dtype=np.uint8)
            else:
                flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)  # its pages mapped in one call
                prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
                raw = np.frombuffer(mmap.mmap(fd, size, flags=flags, prot=prot), dtype=np.uint8)
        finally:
            os.close(fd)
        maps[x.path] = raw
        while len(maps) > _KEEP:
            maps.popitem(last=False)
        return raw[:x.nbytes]


def local_array(x: Any) -> Any:
    """``x`` itself, or for a :class:`SharedArray` the array it refers to, mapped read-only (once per process and
    file)."""
    if not isinstance(x, SharedArray):
        return x
    return _mapped(x, _MAPS, False, "vector").view(x.dtype).reshape(x.shape)


_WMAPS: OrderedDict[str, np.ndarray] = OrderedDict()  # results' files, mapped for writing


def writable_array(x: SharedArray) -> np.ndarray:
    """The array of a results' file (:func:`receive`), mapped for writing (once per process and file: the files
    are reused pass after pass, so a worker's writes land on pages it has mapped before)."""
    return _mapped(x, _WMAPS, True, "results file").view(x.dtype).reshape(x.shape)


# ------------------------------------------------------------------------------------------------ on the driver
_LIVE: set[str] = set()
_LIVE_LOCK = threading.Lock()
_SWEPT = False


def _cleanup() -> None:
    for p in list(_LIVE):
        with contextlib.suppress(OSError):
            os.unlink(p)
    _LIVE.clear()


atexit.register(_cleanup)


_STALE_S = 3600.0  # a pass's file lives for the pass: one this old, of a process that is gone, was left behind


def _sweep_stale() -> None:
    """Remove files left in /dev/shm by dufs processes that no longer run (killed during a pass) and that are
    older than an hour (a /dev/shm shared with containers whose process numbers are not ours: a live file of
    another driver is young)."""
    global _SWEPT
    if _SWEPT:
        return
    _SWEPT = True
    now = time.time()
    with contextlib.suppress(OSError):
        for name in os.listdir(_DIR):
            if not name.startswith(_PREFIX):
                continue
            try:
                pid = int(name[len(_PREFIX):].split("-", 1)[0])
            except ValueError:
                continue
            path = os.path.join(_DIR, name)
            with contextlib.suppress(OSError):
                if pid != os.getpid() and not pid_alive(pid) and now - os.stat(path).st_mtime > _STALE_S:
                    os.unlink(path)


def _new_path() -> str:
    return os.path.join(_DIR, f"{_PREFIX}{os.getpid()}-{uuid.uuid4().hex}")


def _write(path: str, x: np.ndarray) -> None:
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    try:
        view = memoryview(np.ascontiguousarray(x)).cast("B")
        done = 0
        while done < len(view):
            done += os.write(fd, view[done:])
    finally:
        os.close(fd)


@contextlib.contextmanager
def publish(x: np.ndarray) -> Iterator[SharedArray]:
    """``x`` written to a new file in /dev/shm for the duration of the ``with`` block, as a :class:`SharedArray`
    (the file is removed after, also when the block raises; a process killed before leaves it to the next dufs
    driver on the machine, which removes the files of dead processes)."""
    _sweep_stale()
    x = np.ascontiguousarray(x)
    path = _new_path()
    with _LIVE_LOCK:
        _LIVE.add(path)
    try:
        _write(path, x)
        yield SharedArray(path, tuple(int(s) for s in x.shape), x.dtype.str)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
        with _LIVE_LOCK:
            _LIVE.discard(path)


def _sees(path: str) -> bool:
    return os.path.exists(path)


_ELIGIBLE: dict[tuple, int] = {}


def workers_share_memory(client: Any) -> int:
    """How many workers ``client`` has when every one of them sees this process's /dev/shm, else 0 (asked once per
    set of workers: a probe file written here, looked for there)."""
    if not os.path.isdir(_DIR):
        return 0
    try:
        workers = tuple(sorted(client.scheduler_info(n_workers=-1).get("workers", {})))
    except Exception:
        return 0
    if not workers:
        return 0
    key = (client.id, workers)
    got = _ELIGIBLE.get(key)
    if got is None:
        path = _new_path()
        try:
            with open(path, "wb"):
                pass
            seen = client.run(_sees, path, workers=list(workers))
            got = len(workers) if len(seen) == len(workers) and all(seen.values()) else 0
        except Exception:
            got = 0
        finally:
            with contextlib.suppress(OSError):
                os.unlink(path)
        if len(_ELIGIBLE) > 16:
            _ELIGIBLE.clear()
        _ELIGIBLE[key] = got
    return got


def _largest() -> float:
    """``dufs.engine.shared-memory-max-bytes``; ``auto``: no limit (a vector whose file /dev/shm cannot hold is
    scattered instead, :func:`dufs.engine.dispatch.shipped`)."""
    got = config.get("engine.shared-memory-max-bytes")
    return float("inf") if str(got).lower() in ("auto", "none") else config.parse_bytes(got)


def _switched_off() -> bool:
    return str(config.get("engine.shared-memory")).lower() in ("off", "false", "no", "never")


def shared_eligible(client: Any, x: Any) -> bool:
    """Whether :func:`publish` should carry ``x`` to ``client``'s workers: a numeric ndarray of at least
    ``dufs.engine.shared-memory-bytes`` and at most ``dufs.engine.shared-memory-max-bytes``, shared memory not
    switched off, and at least two workers, every one on this machine.

    One worker has nothing to share (its private copy sits in huge pages: on the 2-core test machine a 1-worker
    pass over a shared float64 2M-row vector ran about 8% slower than over its own copy). Two workers over a
    shared vector larger than the cache ran their kernels no faster than over their own copies, but a copy each
    costs a transfer each: a 2-worker pass over a 2M x 2 float64 V (30 MiB) took 192 ms shared against 238 ms
    scattered, 2M x 10 (152 MiB) 1041 against 1187 ms, so there is no upper limit by default."""
    if client is None or not isinstance(x, np.ndarray) or x.dtype.kind not in "biuf" or _switched_off():
        return False
    if not config.parse_bytes(config.get("engine.shared-memory-bytes")) <= x.nbytes <= _largest():
        return False
    return workers_share_memory(client) >= 2


# ------------------------------------------------------------------------------------------------ results back
_POOL: list[tuple[str, np.ndarray]] = []  # free results' files: (path, the driver's mapping of the whole file)
_POOL_LOCK = threading.Lock()
_POOL_KEEP = 2  # free files kept at most (the smallest removed beyond)


def _new_results_file(nbytes: int) -> tuple[str, np.ndarray]:
    path = _new_path()
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    with _LIVE_LOCK:
        _LIVE.add(path)
    try:
        # the pages reserved now: a full /dev/shm fails here (OSError), not later with a SIGBUS in a worker
        os.posix_fallocate(fd, 0, nbytes)
        mm = mmap.mmap(fd, nbytes, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0),
                       prot=mmap.PROT_READ | mmap.PROT_WRITE)
    except BaseException:
        _drop(path)
        raise
    finally:
        os.close(fd)
    return path, np.frombuffer(mm, dtype=np.uint8)


def _drop(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)
    with _LIVE_LOCK:
        _LIVE.discard(path)


@contextlib.contextmanager
def receive(shape: tuple, dtype: Any) -> Iterator[tuple[SharedArray, np.ndarray]]:
    """A file in /dev/shm for a pass's results, written by the tasks in place (:func:`writable_array`) instead of
    sent back: yields (its reference for the tasks, this process's view of it, read once they have all finished).
    The view is valid inside the ``with`` block only: the file goes back to a small pool after, and a later pass
    whose results fit in it writes into it (a new file costs the allocation of its pages, 47 ms for 40 MB on the
    test machine, more than sending the results; the pool keeps the largest files, so passes of several sizes
    stop allocating). Raises OSError where /dev/shm cannot hold it."""
    _sweep_stale()
    dt = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    with _POOL_LOCK:  # the smallest free file that holds it (results of several sizes share the pool)
        fits = [f for f in _POOL if f[1].nbytes >= nbytes]
        got = min(fits, key=lambda f: f[1].nbytes) if fits else None
        if got is not None:
            _POOL.remove(got)
    if got is None:
        got = _new_results_file(nbytes)
    path, raw = got
    ok = False
    try:
        yield SharedArray(path, tuple(int(x) for x in shape), dt.str), raw[:nbytes].view(dt).reshape(shape)
        ok = True
    finally:
        drop = [] if ok else [got]  # a failed pass's file: a task may still write into it
        with _POOL_LOCK:
            if ok:
                _POOL.append(got)
                _POOL.sort(key=lambda f: f[1].nbytes)
                while len(_POOL) > _POOL_KEEP:
                    drop.append(_POOL.pop(0))
        for f in drop:
            _drop(f[0])


def receive_or_none(stack: contextlib.ExitStack, shape: tuple, dtype: Any) -> tuple[SharedArray, np.ndarray] | None:
    """:func:`receive` entered on ``stack``, or None where /dev/shm cannot hold the file (the caller has the
    results sent back as messages instead)."""
    try:
        return stack.enter_context(receive(shape, dtype))
    except OSError:
        return None


def release_results_files() -> None:
    """Remove the pooled results' files (their memory goes back; the next pass makes a new one)."""
    with _POOL_LOCK:
        files = list(_POOL)
        _POOL.clear()
    for path, _ in files:
        _drop(path)


def receive_eligible(client: Any, nbytes: int) -> bool:
    """Whether a pass's results of ``nbytes`` should come back through :func:`receive`: shared memory not
    switched off, at least ``dufs.engine.shared-memory-bytes`` and at most 256 MiB (a 30M-feature float64 vector
    fits), and every worker on this machine (one worker is enough: the results skip the network either way)."""
    if client is None or _switched_off():
        return False
    if not config.parse_bytes(config.get("engine.shared-memory-bytes")) <= nbytes <= _RESULTS_MAX:
        return False
    return workers_share_memory(client) >= 1


_RESULTS_MAX = 256 << 20  # larger results come back as messages: a file this large is not kept in the pool (its
# memory would stay taken between passes), and a new one each pass costs more than the messages
