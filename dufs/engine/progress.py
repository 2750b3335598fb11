"""Progress of the passes over the data: a callback the caller installs for a block of code.

``with on_pass(cb): ...`` makes every pass of every :class:`~dufs.engine.Matrix` in that block report
``cb(name, done, total)`` as its per-block tasks finish (``done`` from 0 to ``total``); the CLI draws a rich
progress bar from it, ``dufs.fit(verbose=...)`` in a Jupyter notebook an HTML one (:class:`NotebookBar`), and
elsewhere the API logs. Passes run with ``dask.compute`` when no callback is installed.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from typing import Any

from dufs.engine.dispatch import track
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


def in_notebook() -> bool:
    """Whether this process is a Jupyter kernel (IPython's ZMQ shell: a notebook or a Jupyter console), where
    terminal progress bars would print their escape codes."""
    import sys

    ipython = sys.modules.get("IPython")
    shell = getattr(ipython, "get_ipython", lambda: None)() if ipython is not None else None
    return type(shell).__name__ == "ZMQInteractiveShell"


class NotebookBar:
    """A pass-progress callback that draws one HTML ``<progress>`` bar in a notebook's output and redraws it in
    place (IPython's display handles) as passes run: the pass's name, its blocks done, the passes so far.
    ``display`` is IPython's ``display`` function and ``html`` its ``HTML`` class; redraws come at most every
    ``interval`` seconds, and at every pass's end."""

    def __init__(self, display: Callable[..., Any], html: Callable[[str], Any], interval: float = 0.25):
        self._display, self._html, self._interval = display, html, float(interval)
        self._handle: Any = None
        self._last = -1.0
        self.passes = 0

    @staticmethod
    def render(name: str, done: int, total: int, passes: int) -> str:
        from html import escape

        return (f'<div style="font-family: monospace">dufs: pass {passes} ({escape(name)}) '
                f'<progress value="{done}" max="{max(total, 1)}" style="width: 20em"></progress> '
                f"{done}/{total} blocks</div>")

    def __call__(self, name: str, done: int, total: int) -> None:
        import time

        if done == 0:
            self.passes += 1
        now = time.monotonic()
        if done not in (0, total) and now - self._last < self._interval:
            return
        self._last = now
        shown = self._html(self.render(name, done, total, self.passes))
        if self._handle is None:
            self._handle = self._display(shown, display_id=True)
        else:
            self._handle.update(shown)


def notebook_bar() -> NotebookBar | None:
    """A :class:`NotebookBar` on IPython's display where this process is a Jupyter kernel, else None."""
    if not in_notebook():
        return None
    from IPython.display import HTML, display

    return NotebookBar(display, HTML)


def report(name: str, done: int, total: int) -> None:
    """Report a pass's progress to the installed callback, if any (for passes that run no tasks)."""
    cb = _CALLBACK.get()
    if cb is not None:
        cb(name, done, total)


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

    futures = track(client.compute(tasks))
    done = 0
    for _ in as_completed(futures):
        done += 1
        cb(name, done, total)
    return list(client.gather(futures))


def run_pass_streaming(name: str, tasks: list, consume: Callable[[int, Any], None], *, inline: bool = False) -> None:
    """Compute ``tasks`` and hand each result to ``consume(i, result)`` as it arrives, keeping none of them: the
    driver holds one block's result at a time (under a distributed client, each future is released once consumed;
    on local schedulers, tasks run in batches of the thread count). Progress is reported as in :func:`run_pass`."""
    import os

    import dask

    total = len(tasks)
    if not total:
        return
    cb = _CALLBACK.get()
    if cb is not None:
        cb(name, 0, total)
    if inline:
        for i, r in enumerate(tasks):
            consume(i, r)
        if cb is not None:
            cb(name, total, total)
        return
    client = current_client()
    if client is None:
        step = max(1, os.cpu_count() or 1)
        for a in range(0, total, step):
            for j, r in enumerate(dask.compute(*tasks[a:a + step])):
                consume(a + j, r)
            if cb is not None:
                cb(name, min(total, a + step), total)
        return
    from distributed import as_completed

    futures = track(client.compute(tasks))
    index = {f.key: i for i, f in enumerate(futures)}
    done = 0
    for fut in as_completed(futures):  # one result at a time (with_results would gather whole batches)
        consume(index[fut.key], fut.result())
        fut.release()
        done += 1
        if cb is not None:
            cb(name, done, total)
