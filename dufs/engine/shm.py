"""Dense vectors shared through the host's shared memory with the worker processes on the driver's machine.

A pass reads its vector V at random rows, so V's place in the cache decides the pass's speed. Scattered, every
worker process holds its own copy, and the copies compete for the shared L3 cache; one copy in shared memory that
every worker maps does not (docs/measurements.md, "Shared vectors").

:func:`publish` copies an array into a file under ``/dev/shm`` (no pickling, no transfer; the files are pooled, so a
pass writes into pages that exist and that the workers have mapped before) and yields a :class:`SharedArray`, a
small picklable reference that travels in the graph; :func:`local_array` in the task maps it read-only (a worker
keeps its mappings: the blocks of one pass, and later passes, map it once) and checks that the file still holds
that publication. It is used where it pays (:func:`shared_eligible`): workers, one or more,
all of which see the driver's ``/dev/shm`` (:func:`workers_share_memory`, asked once per set of workers:
LocalCluster workers, or ``dask worker`` processes started on the driver's machine), and a vector of at least
``dufs.engine.shared-memory-bytes`` (and at most ``dufs.engine.shared-memory-max-bytes``: no limit by default). Other
vectors, and workers on other machines, get the array scattered as before, and so does a vector whose file cannot
be written (a full /dev/shm: a container's is often 64 MB); ``dufs.engine.shared-memory: off`` scatters
everything.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import itertools
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
from dufs._lease import Lease, lease
from dufs.data._fs import pid_alive

__all__ = ["Receiving", "SharedArray", "SharedArrayLost", "SharedResult", "lend", "local_array", "publish",
           "put_result", "receive", "receive_eligible", "receive_or_none", "receiving", "release_files", "resolved",
           "results_local", "shared_eligible", "take_result", "workers_share_memory", "writable_array"]

_DIR = "/dev/shm"
_PREFIX = "dufs-"


@dataclass(frozen=True)
class SharedArray:
    """A C-ordered array in the file ``path`` (under ``/dev/shm``): what a task receives in place of the array;
    :func:`local_array` maps it."""

    path: str
    shape: tuple
    dtype: str
    #: a vector's publication (:func:`publish`): the number in its file's header while the file holds this array,
    #: the array after the header; None for a results' file (:func:`receive`: no header)
    gen: int | None = None

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize

    @property
    def offset(self) -> int:
        return 0 if self.gen is None else _HEADER


_HEADER = 64  # a vector's file: its publication number (int64), then the array from this byte (aligned)


class SharedArrayLost(RuntimeError):
    """A task was given a vector (:func:`publish`) whose pass has ended and whose file holds a later pass's vector
    now: the task is a rerun of a finished pass's (the scheduler recomputing lost results from their lineage). Its
    message says "was lost", so that a solver rebuilds its state as after lost workers
    (:func:`dufs.engine.cluster.is_lost`)."""


# ------------------------------------------------------------------------------------------------ in the tasks
_MAPS: OrderedDict[str, np.ndarray] = OrderedDict()
_MAPS_LOCK = threading.Lock()
# mappings kept per process at most, of each kind (those whose file was removed are dropped at every lookup): a
# caller holding a few results cycles the driver's pool through more files than the pool keeps free, and a worker
# that lost its mapping maps the file afresh before its first block (docs/measurements.md, "Results through
# /dev/shm")
_KEEP = 8


def _mapped(x: SharedArray, maps: OrderedDict, writable: bool, what: str) -> np.ndarray:
    """The bytes of ``x``'s file mapped in this process (read-only or for writing), kept in ``maps`` (once per
    process and file; a file removed since is dropped first, its memory goes back): the whole file, at least
    ``x.offset + x.nbytes`` bytes."""
    need = x.offset + x.nbytes
    with _MAPS_LOCK:
        # a mapping whose file is gone holds its memory: dropped now (a stat a mapping, microseconds)
        for p in [p for p in maps if p != x.path and not os.path.exists(p)]:
            del maps[p]
        got = maps.get(x.path)
        if got is not None and got.nbytes >= need:
            maps.move_to_end(x.path)
            return got
        try:
            fd = os.open(x.path, os.O_RDWR if writable else os.O_RDONLY)
        except FileNotFoundError:
            raise FileNotFoundError(
                f"the shared {what} {x.path} is not visible in this worker process (is it on another machine than "
                f"the client? set dufs.engine.shared-memory to 'off')") from None
        try:
            # the whole file: a pooled file reused for a smaller array is larger than this one's bytes
            size = max(need, os.fstat(fd).st_size)
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
        return raw


def resolved(x: Any) -> Any:
    """``x`` with every :class:`SharedArray` in it mapped: a vector (:func:`publish`) read-only
    (:func:`local_array`), a results' file (:func:`receive`) for writing (:func:`writable_array`); within lists,
    tuples, dicts and dataclass instances (a copy with the fields replaced; ``x`` itself where nothing was shared).
    What the engine does to a pass's arguments before it calls a method's function, which so sees plain arrays."""
    if isinstance(x, SharedArray):
        return local_array(x) if x.gen is not None else writable_array(x)
    if type(x) in (list, tuple):
        got = [resolved(v) for v in x]
        return x if all(a is b for a, b in zip(got, x, strict=True)) else type(x)(got)
    if type(x) is dict:
        got = {k: resolved(v) for k, v in x.items()}
        return x if all(got[k] is v for k, v in x.items()) else got
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        new = {f.name: resolved(getattr(x, f.name)) for f in dataclasses.fields(x) if f.init}
        changed = {k: v for k, v in new.items() if v is not getattr(x, k)}
        return dataclasses.replace(x, **changed) if changed else x
    return x


def local_array(x: Any) -> Any:
    """``x`` itself, or for a :class:`SharedArray` the array it refers to, mapped read-only (once per process and
    file). Raises :class:`SharedArrayLost` when the file holds another publication than ``x``'s (a rerun of a
    finished pass's task)."""
    if not isinstance(x, SharedArray):
        return x
    raw = _mapped(x, _MAPS, False, "vector")
    if x.gen is not None and int(raw[:8].view(np.int64)[0]) != x.gen:
        raise SharedArrayLost(f"the shared vector {x.path} of a finished pass was lost: its file holds a later "
                              f"pass's vector (this task reran after that pass ended)")
    return raw[x.offset:x.offset + x.nbytes].view(x.dtype).reshape(x.shape)


_WMAPS: OrderedDict[str, np.ndarray] = OrderedDict()  # results' files, mapped for writing


def writable_array(x: SharedArray) -> np.ndarray:
    """The array of a results' file (:func:`receive`), mapped for writing (once per process and file: the files
    are reused pass after pass, so a worker's writes land on pages it has mapped before)."""
    return _mapped(x, _WMAPS, True, "results file")[:x.nbytes].view(x.dtype).reshape(x.shape)


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


@contextlib.contextmanager
def publish(x: np.ndarray) -> Iterator[SharedArray]:
    """``x`` written to a file in /dev/shm for the duration of the ``with`` block, as a :class:`SharedArray`.

    The file comes from a small pool and goes back to it after (a new file costs the allocation of its pages, several
    times the copy into a pooled one; the workers keep their mappings of it too: docs/measurements.md, "Shared
    vectors"). Its header numbers each publication, and a task given an
    earlier one than the file holds refuses it (:class:`SharedArrayLost`): a pass's vector is never read after its
    pass, not even by a task that the scheduler reruns from its lineage. A block that raises removes its file (a
    task of it may still run); :func:`release_files` removes the pool's, and a process killed leaves them to the
    next dufs driver on the machine, which removes the files of dead processes."""
    _sweep_stale()
    x = np.ascontiguousarray(x)
    with _VECTORS.file(_HEADER + x.nbytes) as (path, raw):
        gen = next(_GENERATION)
        raw[_HEADER:_HEADER + x.nbytes] = x.reshape(-1).view(np.uint8)
        raw[:8].view(np.int64)[0] = gen  # after the array: a task that finds this number finds the array
        yield SharedArray(path, tuple(int(s) for s in x.shape), x.dtype.str, gen)


_GENERATION = itertools.count(1)


def _sees(path: str) -> bool:
    return os.path.exists(path)


_ELIGIBLE: dict[tuple, int] = {}
_WORKERS: dict[str, tuple[float, tuple]] = {}  # client id -> (when asked, its workers' addresses)
_WORKERS_TTL = 1.0  # seconds: a pass's eligibility checks ask the scheduler at most this often (M3FS makes dozens
# of passes a second: docs/measurements.md, "Shared vectors"). A worker that joins within that time holds none of
# the blocks, so the pass's tasks, which run where their blocks are, do not go to it


def workers_share_memory(client: Any) -> int:
    """How many workers ``client`` has when every one of them sees this process's /dev/shm, else 0 (asked once per
    set of workers: a probe file written here, looked for there)."""
    if not os.path.isdir(_DIR):
        return 0
    now = time.monotonic()
    seen = _WORKERS.get(client.id)
    if seen is not None and now - seen[0] < _WORKERS_TTL:
        workers = seen[1]
    else:
        try:  # a round trip to the scheduler: asked again after _WORKERS_TTL seconds
            workers = tuple(sorted(client.scheduler_info(n_workers=-1).get("workers", {})))
        except Exception:
            return 0
        if len(_WORKERS) > 16:
            _WORKERS.clear()
        _WORKERS[client.id] = (now, workers)
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
    switched off, and every worker on this machine.

    One worker too, for a vector of at most ``_ONE_WORKER_MAX`` bytes: scattered, it costs a transfer a pass. A
    larger one goes scattered, into the worker's huge pages, which read faster at random than the shared file's
    4 KiB pages. Two or more workers share a vector larger than the cache too: a copy each costs a transfer each,
    more than the cache loses (docs/measurements.md, "Shared vectors"), so there is no upper limit by default."""
    if client is None or not isinstance(x, np.ndarray) or x.dtype.kind not in "biuf" or _switched_off():
        return False
    if not config.parse_bytes(config.get("engine.shared-memory-bytes")) <= x.nbytes <= _largest():
        return False
    held = workers_share_memory(client)
    return held >= 2 or (held == 1 and x.nbytes <= _ONE_WORKER_MAX)


_ONE_WORKER_MAX = 8 << 20  # the largest vector shared with a single worker (see shared_eligible)


# ------------------------------------------------------------------------------------------------ a call's result
@dataclass(frozen=True)
class SharedResult:
    """A result that a worker wrote into a file in /dev/shm (:func:`put_result`) instead of returning it: the
    pickle's bytes at offset 0 (``head`` bytes), then its out-of-band buffers at ``offsets`` (``lengths``)."""

    path: str
    head: int
    offsets: tuple
    lengths: tuple


_ALIGN = 64


def put_result(obj: Any, min_bytes: int) -> Any:
    """In a worker: ``obj`` itself, or, when its pickle takes at least ``min_bytes``, a :class:`SharedResult` naming
    a new file in /dev/shm that holds it (a direct call's result otherwise goes to the driver through the
    scheduler, several times slower than through the file: docs/measurements.md, "Results through /dev/shm"). The
    driver removes the file when it reads it (:func:`take_result`)."""
    import pickle

    bufs: list = []
    head = pickle.dumps(obj, protocol=5, buffer_callback=bufs.append)
    raws = [b.raw() for b in bufs]
    if len(head) + sum(r.nbytes for r in raws) < min_bytes:
        return obj
    offsets, pos = [], -(-len(head) // _ALIGN) * _ALIGN
    for r in raws:  # each buffer aligned, so that the arrays made on it are
        offsets.append(pos)
        pos += -(-r.nbytes // _ALIGN) * _ALIGN
    path = _new_path()
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, max(pos, 1))
        for at, view in [(0, memoryview(head)), *zip(offsets, raws, strict=True)]:
            done = 0
            while done < view.nbytes:
                done += os.pwrite(fd, view[done:], at + done)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise
    finally:
        os.close(fd)
    return SharedResult(path, len(head), tuple(offsets), tuple(r.nbytes for r in raws))


def take_result(r: Any) -> Any:
    """On the driver: ``r`` itself, or the object a :class:`SharedResult` holds, its file removed (its arrays stay
    on the file's pages, mapped copy-on-write: no copy, writable)."""
    if not isinstance(r, SharedResult):
        return r
    import pickle

    fd = os.open(r.path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        mm = mmap.mmap(fd, size, access=mmap.ACCESS_COPY) if size else None
    finally:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(r.path)
    view = memoryview(mm) if mm is not None else memoryview(b"")
    return pickle.loads(view[:r.head], buffers=[view[o:o + n] for o, n in zip(r.offsets, r.lengths, strict=True)])


# ------------------------------------------------------------------------------------------------ pooled files
def _new_file(nbytes: int) -> tuple[str, np.ndarray]:
    path = _new_path()
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    with _LIVE_LOCK:
        _LIVE.add(path)
    try:
        # the pages reserved now: a full /dev/shm fails here (OSError), not later with a SIGBUS in a worker
        os.posix_fallocate(fd, 0, max(nbytes, 1))
        mm = mmap.mmap(fd, max(nbytes, 1), flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0),
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


class _FilePool:
    """Files in /dev/shm kept between passes, each with this process's mapping of the whole file: a pass takes the
    smallest free one that holds its bytes (arrays of several sizes share the pool) or a new one, and gives it back
    after; the pool keeps the ``keep`` largest. A file whose array the pass hands out as its result
    (:meth:`lend`) comes back once nothing refers to that array any more (its lease, :mod:`dufs._lease`)."""

    def __init__(self, keep: int):
        self.keep = keep
        self.free: list[tuple[str, np.ndarray]] = []  # (path, the mapping), smallest first
        self.lent: list[tuple[str, np.ndarray, Lease]] = []  # files whose array a caller holds, with its lease
        self.lending: dict[str, Lease] = {}  # files in use that go to ``lent``, not ``free``, when their block ends
        self.lock = threading.Lock()

    def _reclaim(self) -> None:
        """(Under the lock.) The lent files whose array nothing refers to any more (its lease inactive:
        :mod:`dufs._lease`) back to ``free``."""
        held, idle = [], []
        for f in self.lent:
            (held if f[2].active else idle).append(f)
        if idle:
            self.lent = held
            self.free.extend(f[:2] for f in idle)
            self.free.sort(key=lambda f: f[1].nbytes)

    def lend(self, path: str, nbytes: int, held: Lease) -> bool:
        """Whether the file ``path`` (in use in a :meth:`file` block) may stay with the array its caller returns
        (whose lease is ``held``) instead of going back to the pool: only where /dev/shm keeps room for two more
        files of ``nbytes`` (the next passes', while the caller holds this result; a container's /dev/shm is often
        64 MB)."""
        try:
            st = os.statvfs(_DIR)
        except OSError:
            return False
        if st.f_bavail * st.f_frsize < 2 * nbytes:
            return False
        with self.lock:
            self.lending[path] = held
        return True

    @contextlib.contextmanager
    def file(self, nbytes: int) -> Iterator[tuple[str, np.ndarray]]:
        """(path, the mapping of the whole file) of a free file of at least ``nbytes`` for the ``with`` block; a
        block that raises removes the file (a task of the failed pass may still use it). Raises OSError where
        /dev/shm cannot hold a new one."""
        with self.lock:
            self._reclaim()
            fits = [f for f in self.free if f[1].nbytes >= nbytes]
            got = min(fits, key=lambda f: f[1].nbytes) if fits else None
            if got is not None:
                self.free.remove(got)
        if got is None:
            got = _new_file(nbytes)
        ok = False
        try:
            yield got
            ok = True
        finally:
            drop = [] if ok else [got]
            with self.lock:
                held = self.lending.pop(got[0], None)
                if ok and held is not None:
                    self.lent.append((*got, held))
                elif ok:
                    self.free.append(got)
                    self.free.sort(key=lambda f: f[1].nbytes)
                    while len(self.free) > self.keep:
                        drop.append(self.free.pop(0))
            for f in drop:
                _drop(f[0])

    def release(self) -> None:
        """Remove the pool's files (a lent file too: the arrays made on it stay valid, its memory goes back with
        them)."""
        with self.lock:
            files, self.free, lent, self.lent = self.free, [], self.lent, []
        for path, *_ in files + lent:
            _drop(path)


_RESULTS = _FilePool(keep=2)  # results' files (receive)
_VECTORS = _FilePool(keep=2)  # vectors' files (publish)


def release_files() -> None:
    """Remove the pooled files, results' and vectors' (their memory goes back; the next pass makes new ones)."""
    _RESULTS.release()
    _VECTORS.release()


# ------------------------------------------------------------------------------------------------ results back
@contextlib.contextmanager
def receive(shape: tuple, dtype: Any) -> Iterator[tuple[SharedArray, np.ndarray]]:
    """A file in /dev/shm for a pass's results, written by the tasks in place (:func:`writable_array`) instead of
    sent back: yields (its reference for the tasks, this process's view of it, read once they have all finished).
    The view is valid inside the ``with`` block only: the file goes back to a small pool after, and a later pass
    whose results fit in it writes into it (a new file costs the allocation of its pages, more than sending the
    results: docs/measurements.md, "Results through /dev/shm"; the pool keeps the largest files, so passes of
    several sizes stop allocating). Raises OSError where /dev/shm cannot hold it."""
    _sweep_stale()
    dt = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    with _RESULTS.file(nbytes) as (path, raw):
        view, held = lease(raw, shape, dt)
        _RECEIVED[path] = held
        try:
            yield SharedArray(path, tuple(int(x) for x in shape), dt.str), view
        finally:
            _RECEIVED.pop(path, None)


_RECEIVED: dict[str, Lease] = {}  # a results' file in a receive block -> the lease of the array it yielded


def lend(x: SharedArray) -> bool:
    """Inside :func:`receive`'s block: whether its file may stay with the array the block yielded, which the caller
    then returns as it is (no copy: docs/measurements.md, "Results through /dev/shm"); the file
    goes back to the pool once nothing refers to that array. False where /dev/shm lacks room for two more such files
    (the caller copies the results out, and the file goes back to the pool at once)."""
    return _RESULTS.lend(x.path, x.nbytes, _RECEIVED[x.path])


def receive_or_none(stack: contextlib.ExitStack, shape: tuple, dtype: Any) -> tuple[SharedArray, np.ndarray] | None:
    """:func:`receive` entered on ``stack``, or None where /dev/shm cannot hold the file (the caller has the
    results sent back as messages instead)."""
    try:
        return stack.enter_context(receive(shape, dtype))
    except OSError:
        return None


@dataclass(frozen=True)
class Receiving:
    """A pass's results written by the workers into one file that this process maps (:func:`receive`):
    ``target`` goes to the workers' calls (the engine maps it, writable, before it calls a method's function),
    ``array`` is this process's view, valid inside the ``with`` block that made it (:func:`receiving`)."""

    target: SharedArray
    array: np.ndarray

    def result(self) -> np.ndarray:
        """The results as an array that outlives the block: the file's own where it may stay with it
        (:func:`lend`), else copied into a pooled array of this process (:func:`dufs.engine.buffers.buffer`)."""
        if lend(self.target):
            return self.array
        from dufs.engine.buffers import buffer

        out = buffer(self.array.shape, self.array.dtype)
        np.copyto(out, self.array)
        return out


def receiving(stack: contextlib.ExitStack, shape: tuple, dtype: Any = np.float64) -> Receiving | None:
    """A :class:`Receiving` for results of ``shape`` and ``dtype``, its file held for the length of ``stack``, where
    they should come back through /dev/shm (:func:`receive_eligible`) and it has room; else None (the results are
    sent back as messages)."""
    from dufs.scheduling import current_client

    if not receive_eligible(current_client(), int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize):
        return None
    got = receive_or_none(stack, shape, dtype)
    return None if got is None else Receiving(*got)


def results_local(client: Any) -> bool:
    """Whether results may come back through /dev/shm files at all: shared memory not switched off, and every
    worker of ``client`` on this machine."""
    return client is not None and not _switched_off() and workers_share_memory(client) >= 1


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
