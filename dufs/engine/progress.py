"""Progress of the passes over the data: a callback the caller installs for a block of code.

``with on_pass(cb): ...`` makes every pass of every :class:`~dufs.engine.Matrix` in that block report
``cb(name, done, total)`` as its per-block tasks finish (``done`` from 0 to ``total``); the CLI draws a rich
progress bar from it, the API logs. Passes run with ``dask.compute`` when no callback is installed.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator

from dufs.scheduling import current_client

_CALLBACK: contextvars.ContextVar[Callable[[str, int, int], None] | None] = contextvars.ContextVar(
    "dufs_pass_callback", default=None)


@contextlib.contextmanager
def on_pass(callback: Callable[[str, int, int], None] | None) -> Iterator[None]:
    """Report the progress of every pass inside the block to ``callback(name, done, total)``."""
    token = _CALLBACK.set(callback)
    try:
        yield
    finally:
        _CALLBACK.reset(token)


def run_pass(name: str, tasks: list, *, inline: bool = False) -> list:
    """Compute ``tasks`` (Dask delayed objects), reporting progress task by task when a callback is installed and
    a distributed client is current. ``inline``: the tasks are already their results (a pass run in this process
    without a graph); only the progress is reported."""
    import dask

    if not tasks:
        return []
    cb = _CALLBACK.get()
    if inline:
        if cb is not None:
            cb(name, 0, len(tasks))
            cb(name, len(tasks), len(tasks))
        return list(tasks)
    if cb is None:
        return list(dask.compute(*tasks))
    client = current_client()
    total = len(tasks)
    cb(name, 0, total)
    if client is None:
        out = list(dask.compute(*tasks))
        cb(name, total, total)
        return out
    from distributed import as_completed

    futures = client.compute(tasks)
    done = 0
    for _ in as_completed(futures):
        done += 1
        cb(name, done, total)
    return list(client.gather(futures))
