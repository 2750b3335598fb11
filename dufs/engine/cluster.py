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


def _workers_first(cluster: Any, client: Any, timeout: float = 10.0) -> None:
    """Close the workers while the scheduler still runs, then let the cluster close it: closed the other way round,
    a worker's heartbeat in flight when the scheduler goes logs a "Failed to communicate with scheduler" error."""
    import time

    with contextlib.suppress(Exception):
        cluster.scale(0)
        end = time.monotonic() + timeout
        while time.monotonic() < end and client.scheduler_info(n_workers=-1).get("workers"):
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
