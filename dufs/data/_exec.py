"""Run storage tasks on the active Dask cluster, or on local threads when there is none.

The storage layer does not start clusters (that is the CLI's and the engine's business): it uses the client a
computation runs on now (:func:`dufs.scheduling.current_client`) if there is one, else a thread pool (the numba
kernels release the GIL).
"""

from __future__ import annotations

import concurrent.futures as cf
import os
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from dufs._logging import get_logger
from dufs.scheduling import current_client

log = get_logger(__name__)


class Executor:
    """``submit`` / ``as_completed`` over a distributed client or a local thread pool."""

    def __init__(self, client: Any | None = None, max_workers: int | None = None):
        self.client = client if client is not None else current_client()
        self._pool = None
        self._threads = max_workers or os.cpu_count() or 1
        if self.client is None:
            self._pool = cf.ThreadPoolExecutor(max_workers=self._threads)

    @property
    def n_workers(self) -> int:
        if self.client is not None:
            return max(1, len(self.client.scheduler_info().get("workers", {})))
        return self._threads

    def submit(self, fn: Callable, *args: Any, **kwargs: Any) -> Any:
        if self.client is not None:
            return self.client.submit(fn, *args, pure=False, **kwargs)
        return self._pool.submit(fn, *args, **kwargs)  # type: ignore[union-attr]

    def as_completed(self, futures: Iterable[Any]) -> Iterator[Any]:
        futures = list(futures)
        if not futures:
            return
        if self.client is not None:
            from distributed import as_completed

            # its loop given: distributed's as_completed otherwise looks for a default client, which a client given
            # to dufs need not be
            yield from as_completed(futures, loop=self.client.loop)
        else:
            yield from cf.as_completed(futures)

    def cancel(self, futures: Iterable[Any]) -> None:
        for f in futures:
            f.cancel()

    def map_ordered(self, fn: Callable, items: list, *, on_done: Callable | None = None) -> list:
        """Run ``fn(item)`` for every item, return results in order; ``on_done(result)`` as they finish."""
        futs = [self.submit(fn, it) for it in items]
        index = {id(f): i for i, f in enumerate(futs)}
        out: list = [None] * len(futs)
        try:
            for f in self.as_completed(futs):
                r = f.result()
                out[index[id(f)]] = r
                if on_done is not None:
                    on_done(r)
        except BaseException:
            self.cancel(futs)
            raise
        return out

    def run_everywhere(self, fn: Callable[[], Any]) -> None:
        """Run ``fn()`` in every worker process (and here, where the tasks ran on local threads)."""
        if self.client is not None:
            self.client.run(fn)
        else:
            fn()

    def close(self) -> None:
        """Shut the local threads down, and let the scratch memory the tasks kept go (:mod:`dufs.data._scratch`:
        a build's tasks reuse it from block to block; after the build the workers' memory is the methods')."""
        from dufs.data import _scratch

        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
        try:
            self.run_everywhere(_scratch.release)
        except Exception as exc:  # noqa: BLE001 - a cluster closing or gone: its processes' memory goes with them
            log.debug("scratch memory not released on the workers: %s", exc)

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
