"""Which Dask client runs a computation: the one place this is decided (every layer asks here).

Two questions, two answers:

- :func:`distributed_client`: is a ``distributed.Client`` active (``Client.current()``)? Whatever ``dask.config``
  says: whether there is a cluster to use before starting one (``dufs.engine.get_client``).
- :func:`current_client`: on which client does a computation started now run? The active client, unless
  ``dask.config``'s ``scheduler`` names a local one (``"sync"``, ``"threads"``, ``"processes"``, ... or a
  callable): inside ``dask.config.set(scheduler="sync")`` nothing may be scattered to, or computed on, a
  client that happens to be active (``dufs.fit(..., client=False)`` inside a ``with Client(...)`` block).
"""

from __future__ import annotations

import contextlib
import functools
import threading
from typing import Any

__all__ = ["current_client", "distributed_client", "driver_threads", "in_threads", "local_cores",
           "one_blas_thread", "results_in_threads", "thread_limits"]

_DISTRIBUTED = (None, "dask.distributed", "distributed")


def distributed_client() -> Any | None:
    """The active ``distributed.Client``, or None (distributed not installed, or no client)."""
    try:
        from distributed import default_client

        return default_client()
    except (ImportError, ValueError):
        return None


def current_client() -> Any | None:
    """The client a computation started now runs on: :func:`distributed_client`, or None when ``dask.config``'s
    ``scheduler`` is set to a local scheduler."""
    import dask

    if dask.config.get("scheduler", None) not in _DISTRIBUTED:
        return None
    return distributed_client()


def local_cores() -> int:
    """The cores this process may run on (its CPU affinity where the system says, else the machine's count): the
    threads the driver's own parallel work uses."""
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def driver_threads() -> int:
    """The threads the driver's own numba kernels run on (:func:`in_threads`): its cores, four at most."""
    return min(4, local_cores())


_POOL: Any = None  # in_threads's pool, made on first use


def in_threads(fn: Any, count: int, threads: int, bounds: Any = None) -> None:
    """``fn(a, b)`` over [0, count) in up to ``threads`` near-equal ranges at once, one on this thread (the driver's
    numba kernels, which release the GIL: while the workers wait for the driver its cores are free); ``bounds(parts)``,
    if given, cuts the ranges instead. One range, or a call from one of the pool's threads: ``fn(0, count)`` here."""
    global _POOL
    parts = max(1, min(threads, count))
    if parts == 1 or threading.current_thread().name.startswith("dufs-driver"):  # none nested in the pool
        fn(0, count)
        return
    cut = bounds(parts) if bounds is not None else [count * i // parts for i in range(parts + 1)]
    if _POOL is None:
        from concurrent.futures import ThreadPoolExecutor

        _POOL = ThreadPoolExecutor(max(4, local_cores()), thread_name_prefix="dufs-driver")
    futures = [_POOL.submit(fn, cut[i], cut[i + 1]) for i in range(1, parts)]
    try:
        fn(cut[0], cut[1])
    finally:
        for f in futures:
            f.result()


def task_threads() -> int:
    """The threads of the Dask worker this runs on (1 elsewhere): what a task running a partition's blocks side by
    side may use (:func:`each_in_threads`), the worker running that one task."""
    told = getattr(_CALL, "threads", None)
    if told is not None:  # a direct call on the worker (:func:`worker_threads`)
        return told
    try:
        from distributed import get_worker

        return max(1, int(get_worker().state.nthreads))
    except Exception:  # not in a worker's task
        return 1


_CALL = threading.local()


@contextlib.contextmanager
def worker_threads(threads: int) -> Any:
    """For the ``with`` block, :func:`task_threads` is ``threads`` on this thread: a direct call's (Client.run on
    the worker, not a task, so the worker is not known from the thread)."""
    _CALL.threads = max(1, int(threads))
    try:
        yield
    finally:
        _CALL.threads = None


_TASK_POOLS: dict[int, Any] = {}


def each_in_threads(fn: Any, count: int, threads: int) -> list:
    """``[fn(0), ..., fn(count - 1)]`` computed on up to ``threads`` threads at once (``fn`` releasing the GIL in its
    kernels), in order; here, one after another, for one thread, one item or a call from one of those threads."""
    if threads <= 1 or count <= 1 or threading.current_thread().name.startswith("dufs-task"):
        return [fn(i) for i in range(count)]
    pool = _TASK_POOLS.get(threads)
    if pool is None:
        from concurrent.futures import ThreadPoolExecutor

        pool = _TASK_POOLS[threads] = ThreadPoolExecutor(threads, thread_name_prefix="dufs-task")
    return list(pool.map(fn, range(count)))


@functools.cache
def _controller() -> Any:
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


def thread_limits(limits: int, user_api: str) -> Any:
    """A context that holds ``user_api``'s ("blas", "openmp") thread pools to ``limits`` threads, from one
    ``ThreadpoolController`` made once a process: ``threadpoolctl.threadpool_limits`` makes a new one each call,
    scanning the libraries the process has loaded, a large part of a small k-means run (docs/measurements.md,
    "UFCM's k-means")."""
    return _controller().limit(limits=limits, user_api=user_api)


def one_blas_thread() -> Any:
    """The context an iterative solver's driver runs in while the workers make its passes: BLAS held to one thread.
    OpenBLAS's threads spin-wait after a threaded call, on the cores the workers need next, which slows the next
    pass (docs/measurements.md, "BLAS threads on the driver"). The driver's vector work between passes is
    memory-bound, so one thread loses nothing there."""
    return thread_limits(1, "blas")


def results_in_threads(calls: list[Any]) -> Any:
    """The results of ``calls`` (functions of no argument, which release the GIL), in order, computed in up to one
    thread per core of this process with BLAS on one thread each, with at most that many results made ahead of the
    one the consumer is at (so that large results are held a few at a time)."""
    from collections import deque
    from concurrent.futures import ThreadPoolExecutor

    width = max(1, min(len(calls), local_cores()))
    with thread_limits(1, "blas"):  # BLAS's thread count is global: set once, here
        if width == 1:
            for call in calls:
                yield call()
            return
        with ThreadPoolExecutor(width, thread_name_prefix="dufs-calls") as ex:
            pending: deque = deque()
            for call in calls:
                pending.append(ex.submit(call))
                if len(pending) > width:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
