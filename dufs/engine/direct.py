"""A pass's work run on the workers that hold its data without Dask tasks (``Client.run``).

A Dask task costs a pass the scheduler's round: the graph sent, its tasks' transitions, a task started on each
worker, its completion reported back. That round costs several times a ``Client.run`` of a function on the same
workers, a large part of a pass's compute time over persisted blocks (docs/measurements.md, "Direct calls").
Where a pass's inputs are already on its workers (persisted blocks, a vector shared through /dev/shm or scattered
to them) and its results go to a results file in /dev/shm (:mod:`dufs.engine.shm`), no task's result has to be
tracked either, so the pass can be a function called once on each of those workers, over the data that worker
holds: :func:`run_on_holders`.

The function runs in the worker's own task thread pool (the worker's event loop stays free: heartbeats, transfers),
after whatever task it is running. Anything that stops it (a key that the worker no longer holds, a lost worker, a
closed connection, an exception in the function) is reported as None, and the caller runs the pass as tasks, which
know how to recover (recompute, or say what was lost). The scheduler does not see the work, so a worker running
other tasks of the same client at the same time shares its threads with it: dufs's own passes do not overlap.
``dufs.engine.direct-passes: off`` runs every pass as tasks.
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from dataclasses import dataclass
from typing import Any

from dufs import config
from dufs._logging import get_logger

__all__ = ["DirectFailed", "Held", "HeldLost", "Resident", "direct_eligible", "fetch_resident", "flush_drops", "held",
           "last_timeline", "map_resident", "map_resident_task", "release_resident", "run_on_holders",
           "take_drops"]

log = get_logger(__name__)


@dataclass(frozen=True)
class Held:
    """A key of data that the worker the call runs on holds (a persisted block, a scattered vector): replaced there
    by the value."""

    key: Any


def held(x: Any) -> Any:
    """``x`` with every ``distributed.Future`` in it (within lists, tuples and dicts) replaced by a :class:`Held`
    key."""
    from distributed import Future

    if isinstance(x, Future):
        return Held(x.key)
    if isinstance(x, list | tuple):
        return type(x)(held(v) for v in x)
    if isinstance(x, dict):
        return {k: held(v) for k, v in x.items()}
    return x


@dataclass(frozen=True)
class Resident:
    """A state item that a direct call of :meth:`~dufs.engine.Matrix.map_blocks` left in the memory of the worker
    at ``address`` (:func:`map_resident`), under ``token``: what a :class:`~dufs.engine.state.BlockState` holds in
    place of a future."""

    token: str
    address: str


class HeldLost(RuntimeError):
    """A call was given a key or a state item that its worker does not hold (blocks moved, a worker restarted). The
    message says "was lost", so that a solver rebuilds its state as after lost workers
    (:func:`dufs.engine.cluster.is_lost`)."""


_RESIDENT: dict[str, Any] = {}  # on a worker: the state items kept by direct calls, by token


def _local(x: Any, data: Any, missing: set | None = None) -> Any:
    """``x`` with each :class:`Held` key replaced by this worker's value and each :class:`Resident` by its state;
    a key not held here raises :class:`HeldLost`, or with ``missing`` (a set) is added to it instead."""
    if isinstance(x, Held):
        if x.key in data:
            return data[x.key]
        if missing is not None:
            missing.add(x.key)
            return x
        # the caller runs tasks instead, or (state kept here) rebuilds it
        raise HeldLost(f"the data {x.key!r} was lost from this worker (moved or dropped)")
    if isinstance(x, Resident):
        try:
            return _RESIDENT[x.token]
        except KeyError:
            raise HeldLost("a block state kept on this worker was lost (the worker restarted?)") from None
    if isinstance(x, list | tuple):
        return type(x)(_local(v, data, missing) for v in x)
    if isinstance(x, dict):
        return {k: _local(v, data, missing) for k, v in x.items()}
    return x


def map_resident(fn: Any, src: Any, state: Any, args: tuple, kwargs: dict, token: str, spill: int = 0) -> Any:
    """On a worker: :func:`~dufs.engine.blocks.map_state`, its new state kept in this process under ``token``;
    returns the result, or with ``spill`` (bytes) a result that large as a file in /dev/shm
    (:func:`~dufs.engine.shm.put_result`: the driver is on this machine)."""
    from dufs.engine.blocks import map_state
    from dufs.engine.shm import put_result

    new, res = map_state(fn, src, state, args, kwargs)
    _RESIDENT[token] = new
    return put_result(res, spill) if spill else res


def map_resident_task(fn: Any, src: Any, state: Any, args: tuple, kwargs: dict, token: str, drops: list[str]) -> Any:
    """As a Dask task on the worker that keeps a partition's state: the released state items ``drops`` dropped,
    then :func:`map_resident` from ``state`` (a :class:`Resident` item kept here, or the state itself); returns
    the result. A state item not kept here (the worker restarted, or the task ran elsewhere because its worker
    left) raises :class:`HeldLost`, so that the solver rebuilds its state."""
    _drop(drops)
    return map_resident(fn, src, _local(state, {}), args, kwargs, token)


def _fetch(tokens: list[str]) -> list:
    return [_RESIDENT[t] for t in tokens]


def _drop(tokens: list[str]) -> None:
    for t in tokens:
        _RESIDENT.pop(t, None)


def _each(fn: Any, calls: list, threads: int = 1) -> tuple[list, float, float]:
    from dufs.scheduling import worker_threads

    t0 = time.time()
    with worker_threads(threads):  # a call may run its blocks on the worker's threads, as a task does
        out = [fn(*args) for args in calls]
    return out, t0, time.time()


async def _fetch_missing(calls: Any, dask_worker: Any) -> None:
    """On a worker: the keys of ``calls`` it does not hold, fetched from the workers that do (the scheduler asked
    where they are). A persisted block moves when a task that needs it runs on another worker and Dask's active
    memory manager then drops the first copy: the state a direct call keeps here cannot follow it, so the block
    comes back (a key held nowhere stays missing: :func:`_local` says it was lost)."""
    missing: set = set()
    _local(calls, dask_worker.data, missing)
    if not missing:
        return
    who = await dask_worker.scheduler.who_has(keys=list(missing))
    who = {k: v for k, v in (who or {}).items() if v}
    if who:
        await dask_worker.gather(who)


async def _call(fn: Any, jobs: dict, drops: dict | None = None, fetch: bool = False, dask_worker: Any = None
                ) -> Any:
    """On a worker: the state items in ``drops`` for it dropped, then ``fn(*args)`` for each of this worker's
    ``args`` in ``jobs``, in turn, in its task thread pool (with ``fetch``, keys it does not hold fetched first:
    :func:`_fetch_missing`)."""
    _drop((drops or {}).get(dask_worker.address, ()))
    calls = jobs.get(dask_worker.address)
    if calls is None:
        return None
    if fetch:
        await _fetch_missing(calls, dask_worker)
    calls = _local(calls, dask_worker.data)
    executor = dask_worker.executors.get("default")
    return await asyncio.get_running_loop().run_in_executor(
        executor, functools.partial(_each, fn, calls, int(dask_worker.state.nthreads)))


def direct_eligible(client: Any) -> bool:
    """Whether passes may run as direct calls on ``client``'s workers (``dufs.engine.direct-passes``)."""
    return client is not None and str(config.get("engine.direct-passes")).lower() not in (
        "off", "false", "no", "never")


class DirectFailed(Exception):
    """A direct call did not complete (see :func:`run_on_holders`): the caller runs the pass as tasks."""


def run_on_holders(client: Any, fn: Any, jobs: dict[str, list[tuple]], fetch: bool = False) -> dict[str, list]:
    """``fn(*args)`` for each ``args`` of each worker ``address`` in ``jobs`` (``{address: [args, ...]}``), the
    workers all at once, each over its own list in turn, where every future in ``args`` is replaced by the value
    that worker holds under its key; returns ``{address: [result, ...]}``.

    Raises :class:`DirectFailed` when any call did not complete (its cause chained): a key not held there any more
    (blocks moved), a worker lost, an exception in ``fn``. The caller should then give up whatever the calls may
    still be writing into (a results file) and run the pass as tasks."""
    _LAST.clear()
    drops = _take_drops(jobs)
    try:
        got = client.run(_call, fn, {a: held(args) for a, args in jobs.items()}, drops, fetch, workers=list(jobs))
        gone = sorted(set(jobs) - set(got))
        if gone:
            raise HeldLost(f"the worker {gone[0]} was lost")
    except Exception as exc:  # any failure: the tasks' path knows how to recover or report it
        log.debug("a direct pass failed (%s: %s)", type(exc).__name__, exc)
        _queue_drops(drops)  # perhaps not dropped: again with the next call
        raise DirectFailed(str(exc)) from exc
    _LAST[:] = [(a, t0, t1) for a, (_, t0, t1) in got.items()]
    return {a: out for a, (out, _, _) in got.items()}


# ---------------------------------------------------------------------------------------- state kept on workers
_DROPS: dict[str, list[str]] = {}  # worker address -> tokens of released state items not yet dropped there
_DROPS_LOCK = threading.Lock()


def _queue_drops(drops: dict[str, list[str]]) -> None:
    with _DROPS_LOCK:
        for a, ts in drops.items():
            _DROPS.setdefault(a, []).extend(ts)


def take_drops(addresses: Any) -> dict[str, list[str]]:
    """The released state items not yet dropped on the workers at ``addresses`` (``{address: [token, ...]}``),
    taken: the caller delivers them."""
    return _take_drops(addresses)


def _take_drops(addresses: Any) -> dict[str, list[str]]:
    with _DROPS_LOCK:
        return {a: _DROPS.pop(a) for a in list(addresses) if a in _DROPS}


def release_resident(items: list[Resident]) -> None:
    """Mark state items kept on the workers as released: each is dropped there at the next direct call to its
    worker (the next round of a solver, usually) or by :func:`flush_drops`."""
    _queue_drops(_by_address(items))


def _by_address(items: list[Resident]) -> dict[str, list[str]]:
    by: dict[str, list[str]] = {}
    for it in items:
        by.setdefault(it.address, []).append(it.token)
    return by


def flush_drops(client: Any) -> None:
    """Drop every released state item now (one call to each worker concerned; a worker gone is skipped)."""
    drops = _take_drops(list(_DROPS))
    if drops and client is not None:
        try:
            live = set(client.nthreads())  # asked now: a call to a worker that left waits 30 s to time out
            drops = {a: ts for a, ts in drops.items() if a in live}
            if drops:
                client.run(_drop_each, drops, workers=list(drops))
        except Exception as exc:  # a worker gone took its state with it
            log.debug("dropping released state on the workers: %s", exc)


def _drop_each(drops: dict, dask_worker: Any = None) -> None:
    _drop(drops.get(dask_worker.address, ()))


def fetch_resident(client: Any, items: list[Resident]) -> list:
    """The values of state items kept on the workers, in order (one call to each worker concerned)."""
    by = _by_address(items)
    try:
        got = client.run(_fetch_each, by, workers=list(by))
    except Exception as exc:
        raise HeldLost(f"a block state kept on the workers was lost ({type(exc).__name__}: {exc})") from exc
    pos = {a: iter(v) for a, v in got.items()}
    return [next(pos[it.address]) for it in items]


def _fetch_each(by: dict, dask_worker: Any = None) -> list:
    return _fetch(by.get(dask_worker.address, []))


_LAST: list[tuple[str, float, float]] = []


def last_timeline() -> list[tuple[str, float, float]]:
    """(worker address, start, stop) of each worker's calls in this process's latest direct pass (wall-clock
    seconds, ``time.time()`` on the worker): where a benchmark's task stream has no tasks to show."""
    return list(_LAST)
