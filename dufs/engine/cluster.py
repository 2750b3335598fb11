"""Which Dask cluster a computation runs on (``get_client``).

Order (docs/architecture.md, "Who it is for"):
the ``client`` given; else the active ``distributed.Client``; else a client on
``scheduler_address``; else an embedded ``LocalCluster`` of processes (one worker a core) started for the call and
closed afterwards. ``synchronous=True`` runs without any cluster (small in-memory inputs).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

from dufs import config
from dufs._logging import get_logger
from dufs.errors import ParameterError
from dufs.scheduling import distributed_client

log = get_logger(__name__)


@contextlib.contextmanager
def get_client(client: Any = None, *, scheduler_address: str | None = None, n_workers: int | None = None,
               synchronous: bool = False) -> Iterator[Any]:
    """Yield the client to run on (None when ``synchronous``); close only what this call started.

    Parameters
    ----------
    client : distributed.Client, optional
        Used as is (never closed here).
    scheduler_address : str, optional
        ``tcp://host:8786`` of a running scheduler, used when no client is given or active.
    n_workers : int, optional
        Workers of the embedded LocalCluster (default: one a core).
    synchronous : bool
        Run in this process without a cluster.
    """
    if synchronous:
        yield None
        return
    if client is not None:
        if not hasattr(client, "submit") or not hasattr(client, "scheduler_info"):
            raise ParameterError(f"The 'client' parameter must be a distributed.Client; got {type(client).__name__}.")
        yield client
        return
    current = distributed_client()
    if current is not None:
        yield current
        return
    from distributed import Client

    if scheduler_address:
        # data to and from the workers straight, not relayed by the scheduler's event loop (which then carried
        # twice the driver's bytes every iteration: docs/scaling.md); off where the workers cannot be reached
        direct = str(config.get("cluster.direct-to-workers")).lower() not in ("false", "off", "no", "0")
        log.info("connecting to the scheduler at %s", scheduler_address)
        with Client(scheduler_address, direct_to_workers=direct) as c:
            yield c
        return
    n = int(n_workers or os.cpu_count() or 1)
    if n < 1:
        raise ParameterError(f"The 'n_workers' parameter must be an int >= 1; got {n_workers}.")
    check_script_guard()
    log.info("starting an embedded LocalCluster of %d worker processes", n)
    with embedded_cluster(n, int(config.get("cluster.threads-per-worker"))) as c:
        yield c


@contextlib.contextmanager
def embedded_cluster(n_workers: int, threads_per_worker: int = 1) -> Iterator[Any]:
    """A ``LocalCluster`` of ``n_workers`` processes on this machine and a client on it, closed (workers first)
    after the block. Its scheduler and workers are made under ``dufs.cluster.dask-config`` (by default the workers'
    statistical profiler off and Dask's event-loop tick every 0.5 s instead of 20 ms: housekeeping whose CPU the
    passes' kernels would share on a small machine); the config of this process is left as it was."""
    import dask
    from distributed import Client, LocalCluster

    settings = config.get("cluster.dask-config") or {}
    if not isinstance(settings, dict):
        raise ParameterError(f"dufs.cluster.dask-config must be a mapping of Dask config keys to values; got "
                             f"{settings!r}.")
    # the scheduler reads its settings when it is made, and each nanny hands the config of that moment to its
    # worker process (and to a worker it restarts)
    with dask.config.set(dict(settings)):
        lc = LocalCluster(n_workers=n_workers, threads_per_worker=threads_per_worker, processes=True,
                          dashboard_address=":0", silence_logs=40)
    with lc, Client(lc, direct_to_workers=True) as c:
        try:
            yield c
        finally:
            _workers_first(lc, c)


def unguarded_script() -> str | None:
    """The path of the script this process runs when the call in progress is in its top-level code outside an
    ``if __name__ == "__main__":`` block, else None (an interactive session, a notebook, ``python -c``, a module
    run with ``-m``, or guarded code). Worker processes started by spawn or forkserver import the script again
    (as ``__mp_main__``): such a call would then start a cluster of its own in every worker as it starts, which
    fails with hundreds of lines of "Nanny failed to start" tracebacks and no word about the cause."""
    import ast
    import inspect
    import sys

    frame = inspect.currentframe()
    top = None
    while frame is not None:  # the outermost frame of the __main__ module's own code
        if frame.f_globals.get("__name__") == "__main__" and frame.f_code.co_name == "<module>":
            top = frame
        frame = frame.f_back
    main = sys.modules.get("__main__")
    if top is None or main is None or getattr(main, "__dict__", None) is not top.f_globals:
        return None
    path = top.f_globals.get("__file__")
    if not path or not str(path).endswith(".py") or top.f_globals.get("__spec__") is not None:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), filename=str(path))
    except (OSError, SyntaxError, ValueError):
        return None
    line = top.f_lineno
    for stmt in tree.body:
        if stmt.lineno <= line <= (stmt.end_lineno or stmt.lineno):
            return None if _is_main_guard(stmt) else str(path)
    return None


def _is_main_guard(stmt: Any) -> bool:
    import ast

    if not isinstance(stmt, ast.If) or not isinstance(stmt.test, ast.Compare) or len(stmt.test.comparators) != 1:
        return False
    names = [stmt.test.left, stmt.test.comparators[0]]
    return (any(isinstance(x, ast.Name) and x.id == "__name__" for x in names)
            and any(isinstance(x, ast.Constant) and x.value == "__main__" for x in names))


def check_script_guard() -> None:
    """Refuse, before any process starts, to start an embedded cluster from a script's unguarded top-level code
    (:func:`unguarded_script`) when worker processes would import the script again (Dask's
    ``distributed.worker.multiprocessing-method`` spawn or forkserver; fork does not)."""
    import dask

    method = str(dask.config.get("distributed.worker.multiprocessing-method", "spawn")).lower()
    if method == "fork":
        return
    path = unguarded_script()
    if path is not None:
        raise ParameterError(
            f"{os.path.basename(path)} starts a local Dask cluster from its top-level code: its worker processes "
            f"run the script again as they start. Put the script's code under 'if __name__ == \"__main__\":', "
            f"or pass client=False to run in this process (small data) or a client of your own.")


def _workers_first(cluster: Any, client: Any, timeout: float = 10.0) -> None:
    """Close the workers while the scheduler still runs, then let the cluster close it: closed the other way round,
    a worker's heartbeat in flight when the scheduler goes logs a "Failed to communicate with scheduler" error. A
    worker leaves the scheduler's list before its process has stopped, so the wait is also for the cluster's own
    worker objects, dropped once their nannies have closed (a loaded machine showed the error with the list alone)."""
    import time

    with contextlib.suppress(Exception):
        cluster.scale(0)
        end = time.monotonic() + timeout
        while time.monotonic() < end and (client.scheduler_info(n_workers=-1).get("workers") or cluster.workers):
            time.sleep(0.05)


_LOST_NAMES = {"FutureCancelledError", "CancelledError", "KilledWorker", "CommClosedError", "FutureLostError",
               "StreamClosedError"}


def is_lost(e: BaseException | None) -> bool:
    """Whether ``e`` (or what caused it) says that futures or the workers holding them were lost: the failures a
    solver recovers from by rebuilding its per-block state."""
    seen = 0
    while e is not None and seen < 8:
        if any(c.__name__ in _LOST_NAMES for c in type(e).__mro__):
            return True
        msg = str(e)
        if "lost dependencies" in msg or "Worker holding" in msg or "was lost" in msg:
            return True
        e = e.__cause__ or e.__context__
        seen += 1
    return False
