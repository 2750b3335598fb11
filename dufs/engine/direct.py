"""A pass's work run on the workers that hold its data without Dask tasks (``Client.run``).

A Dask task costs a pass the scheduler's round: the graph sent, its tasks' transitions, a task started on each
worker, its completion reported back. On this project's 2-core test machine a round of two tasks that do nothing
takes 12-16 ms, against 1.5-2 ms for ``Client.run`` of a function on the same two workers (measured alternating,
200 rounds: medians), and a pass over persisted blocks on 2 workers computes for about 45 ms. Where a pass's inputs
are already on its workers (persisted blocks, a vector shared through /dev/shm or scattered to them) and its
results go to a results file in /dev/shm (:mod:`dufs.engine.shm`), no task's result has to be tracked either, so
the pass can be a function called once on each of those workers, over the data that worker holds:
:func:`run_on_holders`.

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
import time
from dataclasses import dataclass
from typing import Any

from dufs import config
from dufs._logging import get_logger

__all__ = ["DirectFailed", "Held", "direct_eligible", "held", "last_timeline", "run_on_holders"]

log = get_logger(__name__)


@dataclass(frozen=True)
class Held:
    """A key of data that the worker the call runs on holds (a persisted block, a scattered vector): replaced there
    by the value."""

    key: Any


def held(x: Any) -> Any:
    """``x`` with every ``distributed.Future`` in it (within lists and tuples) replaced by a :class:`Held` key."""
    from distributed import Future

    if isinstance(x, Future):
        return Held(x.key)
    if isinstance(x, list | tuple):
        return type(x)(held(v) for v in x)
    return x


def _local(x: Any, data: Any) -> Any:
    if isinstance(x, Held):
        return data[x.key]  # KeyError where this worker does not hold it: the caller runs tasks instead
    if isinstance(x, list | tuple):
        return type(x)(_local(v, data) for v in x)
    return x


def _each(fn: Any, calls: list) -> tuple[list, float, float]:
    t0 = time.time()
    out = [fn(*args) for args in calls]
    return out, t0, time.time()


async def _call(fn: Any, jobs: dict, dask_worker: Any = None) -> Any:
    """On a worker: ``fn(*args)`` for each of this worker's ``args`` in ``jobs``, in turn, in its task thread
    pool."""
    calls = jobs.get(dask_worker.address)
    if calls is None:
        return None
    calls = _local(calls, dask_worker.data)
    executor = dask_worker.executors.get("default")
    return await asyncio.get_running_loop().run_in_executor(executor, functools.partial(_each, fn, calls))


def direct_eligible(client: Any) -> bool:
    """Whether passes may run as direct calls on ``client``'s workers (``dufs.engine.direct-passes``)."""
    return client is not None and str(config.get("engine.direct-passes")).lower() not in (
        "off", "false", "no", "never")


class DirectFailed(Exception):
    """A direct call did not complete (see :func:`run_on_holders`): the caller runs the pass as tasks."""


def run_on_holders(client: Any, fn: Any, jobs: dict[str, list[tuple]]) -> dict[str, list]:
    """``fn(*args)`` for each ``args`` of each worker ``address`` in ``jobs`` (``{address: [args, ...]}``), the
    workers all at once, each over its own list in turn, where every future in ``args`` is replaced by the value
    that worker holds under its key; returns ``{address: [result, ...]}``.

    Raises :class:`DirectFailed` when any call did not complete (its cause chained): a key not held there any more
    (blocks moved), a worker lost, an exception in ``fn``. The caller should then give up whatever the calls may
    still be writing into (a results file) and run the pass as tasks."""
    _LAST.clear()
    try:
        got = client.run(_call, fn, {a: held(args) for a, args in jobs.items()}, workers=list(jobs))
    except Exception as exc:  # any failure: the tasks' path knows how to recover or report it
        log.debug("a direct pass failed (%s: %s); running it as tasks", type(exc).__name__, exc)
        raise DirectFailed(str(exc)) from exc
    _LAST[:] = [(a, t0, t1) for a, (_, t0, t1) in got.items()]
    return {a: out for a, (out, _, _) in got.items()}


_LAST: list[tuple[str, float, float]] = []


def last_timeline() -> list[tuple[str, float, float]]:
    """(worker address, start, stop) of each worker's calls in this process's latest direct pass (wall-clock
    seconds, ``time.time()`` on the worker): where a benchmark's task stream has no tasks to show."""
    return list(_LAST)
