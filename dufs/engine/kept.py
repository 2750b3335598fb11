"""Vectors over the samples kept in one worker's memory between passes, so that the driver never holds them.

On workers of several machines a solver's n-vectors (MMFS's w and its changes) made on the driver cross its link
twice a pass (the partitions' summed change in, the new w out) and take O(n) of its memory and CPU whatever the
number of machines. Here the work on them runs as small tasks on the worker that made the pass's sum
(:meth:`Matrix.map_blocks` with ``hold=True``): :func:`kept_call` runs ``fn`` there, keeps the arrays it returns in
that worker's memory under fresh tokens (:class:`Kept`) and brings back only its small result; :func:`as_future`
makes a kept vector a future for the next pass (sent on to the machines that read it, :func:`dufs.engine.dispatch.
spread`), :func:`fetch` brings one back where the driver needs it (once, at the end). A kept vector is dropped
when its :class:`Kept` goes (with the next call to its worker, or :func:`flush`). Nothing here has a lineage that
Dask could recompute: a worker that left takes its vectors with it, and the next call that needs one raises
:class:`~dufs.engine.direct.HeldLost` ("was lost"), so that the solver rebuilds them from what it saved."""

from __future__ import annotations

import threading
import time
import uuid
import weakref
from typing import Any

import numpy as np

from dufs.engine.direct import HeldLost

__all__ = ["Kept", "as_future", "distinct_workers", "fetch", "flush", "joined", "kept_call", "kept_calls",
           "kept_vectors", "piece_workers"]

_KEPT: dict[str, np.ndarray] = {}  # on a worker: its kept vectors by token
_LOCK = threading.Lock()
_DROPS: dict[str, list[str]] = {}  # on the driver: tokens let go, by worker, dropped with the next call there
_SECONDS = [0.0]  # on the driver: the seconds the calls took on their workers, all calls (:func:`seconds`)


class Kept:
    """A vector kept in the memory of the worker at ``address`` under ``token`` (:func:`kept_call`)."""

    __slots__ = ("__weakref__", "address", "token")

    def __init__(self, token: str, address: str):
        self.token, self.address = token, address
        weakref.finalize(self, _let_go, address, token)

    def __repr__(self) -> str:
        return f"Kept({self.token[:8]} on {self.address})"


def _let_go(address: str, token: str) -> None:
    with _LOCK:
        _DROPS.setdefault(address, []).append(token)


def _take_drops(address: str) -> list[str]:
    with _LOCK:
        return _DROPS.pop(address, [])


# ---------------------------------------------------------------------------------------------------- on a worker
class _Ref:
    """A kept vector's token in a call's arguments, replaced by the vector on the worker."""

    __slots__ = ("token",)

    def __init__(self, token: str):
        self.token = token


def _local(x: Any) -> Any:
    if isinstance(x, _Ref):
        try:
            return _KEPT[x.token]
        except KeyError:
            raise HeldLost(f"a vector kept on a worker ({x.token[:8]}) was lost: its worker left or restarted"
                           ) from None
    return x


def _run(fn: Any, args: tuple, tokens: list[str], drops: list[str]) -> tuple[Any, str, float]:
    """As a task: the ``drops`` let go, ``fn(*args)`` (kept vectors in place of their tokens), its arrays kept under
    ``tokens``; (its small result, this worker's address, the CPU seconds it took: its process's, so that calls
    side by side on processes that share cores, as an emulated cluster's do, count their work, not their wait)."""
    from distributed import get_worker

    t0 = time.process_time()
    for t in drops:
        _KEPT.pop(t, None)
    small, arrays = fn(*(_local(a) for a in args))
    if len(arrays) != len(tokens):
        raise ValueError(f"{getattr(fn, '__name__', fn)} returned {len(arrays)} arrays to keep, not {len(tokens)}")
    for t, a in zip(tokens, arrays, strict=True):
        _KEPT[t] = a
    return small, get_worker().address, time.process_time() - t0


def _get(token: str, drops: list[str]) -> np.ndarray:
    for t in drops:
        _KEPT.pop(t, None)
    return _local(_Ref(token))


def _drop(tokens: list[str]) -> None:
    for t in tokens:
        _KEPT.pop(t, None)


# ---------------------------------------------------------------------------------------------------- the driver
def _where(args: tuple) -> str | None:
    """The worker of the first kept vector among ``args`` (None: none is)."""
    return next((a.address for a in args if isinstance(a, Kept)), None)


def kept_call(client: Any, fn: Any, *args: Any, keep: int = 0) -> tuple[Any, list[Kept]]:
    """``fn(*args)`` as one task on the worker that keeps the :class:`Kept` vectors among ``args`` (or where its
    future arguments are, none being kept); ``fn`` returns ``(small, arrays)`` with ``keep`` arrays, which stay
    there. Returns (``small``, the arrays' :class:`Kept` handles). Other arguments travel as they are (futures
    resolved by Dask, small values in the task)."""
    return kept_calls(client, fn, [args], keep=keep)[0]


def kept_calls(client: Any, fn: Any, calls: list[tuple], keep: int = 0, where: list[str] | None = None
               ) -> list[tuple[Any, list[Kept]]]:
    """:func:`kept_call` of ``fn`` with each argument tuple of ``calls``, side by side (one task each, on the
    worker of its kept vectors, or ``where[i]`` for a call that has none); the seconds counted are the slowest
    call's (they run at once, on different workers)."""
    specs, tokens, ats = [], [], []
    drops: dict[str, list[str]] = {}
    for i, args in enumerate(calls):
        at = _where(args) or (where[i] if where is not None else None)
        ats.append(at)
        tok = [uuid.uuid4().hex for _ in range(keep)]
        # a vector kept on another worker (the sum of a pass made elsewhere) comes as a future: Dask moves it here
        call = tuple((_Ref(a.token) if a.address == at else as_future(client, a)) if isinstance(a, Kept) else a
                     for a in args)
        opts = {"workers": [at], "allow_other_workers": True} if at else {}
        if at and at not in drops:
            drops[at] = _take_drops(at)
        specs.append((call, tok, drops.pop(at, []) if at else [], opts))
        tokens.append(tok)
    if len(specs) == 1:
        call, tok, dr, opts = specs[0]
        futs = [client.submit(_run, fn, call, tok, dr, pure=False, **opts)]
    else:  # one graph for all (one message to the scheduler, not one a call: the driver's time a step)
        import dask

        run = dask.delayed(_run, pure=False)
        tasks = []
        for call, tok, dr, opts in specs:
            with dask.annotate(**opts):
                tasks.append(run(fn, call, tok, dr))
        futs = client.compute(tasks)
    try:
        got = client.gather(futs)
    except BaseException:  # what the calls that ran keep is let go (dropped with the next call to their workers)
        for at, tok in zip(ats, tokens, strict=True):
            for t in tok if at else ():
                _let_go(at, t)
        for f in futs:  # and their futures, which the traceback would hold on to
            f.release()
        futs.clear()
        raise
    del futs
    _SECONDS[0] += max((took for _, _, took in got), default=0.0)
    return [(small, [Kept(t, address) for t in tok]) for (small, address, _), tok in zip(got, tokens, strict=True)]


def seconds() -> float:
    """The CPU seconds :func:`kept_call` s have taken on their workers so far, the slowest of calls made side by
    side (a bench reads it between passes)."""
    return _SECONDS[0]


def as_future(client: Any, v: Kept) -> Any:
    """A future of the kept vector ``v`` on its worker (the same memory: no copy), for a pass's argument."""
    return client.submit(_get, v.token, _take_drops(v.address), workers=[v.address], allow_other_workers=True,
                         pure=False)


def joined(client: Any, vs: list[Kept], join: Any, at: str) -> Any:
    """A future of ``join(*vectors)`` of the kept vectors ``vs``, made by one task on the worker ``at``, which
    fetches them from their workers itself (:func:`dufs.engine.exchange.fetch_kept`: worker to worker, no task a
    vector)."""
    from dufs.engine.exchange import ensure_plugin

    ensure_plugin(client)
    return client.submit(_joined, join, [(v.address, v.token) for v in vs], workers=[at], allow_other_workers=True,
                         pure=False)


def _joined(join: Any, pairs: list[tuple[str, str]]) -> Any:
    from dufs.engine.exchange import fetch_kept

    return join(*fetch_kept(pairs))


def fetch(client: Any, v: Any) -> Any:
    """``v``'s value here where it is a :class:`Kept` vector; anything else as it is."""
    if not isinstance(v, Kept):
        return v
    fut = as_future(client, v)
    out = fut.result()
    del fut
    return out


def flush(client: Any) -> None:
    """The kept vectors let go dropped on their workers now (the end of a solve)."""
    with _LOCK:
        drops = dict(_DROPS)
        _DROPS.clear()
    if not drops:
        return
    try:
        live = set(client.nthreads())  # asked now (the client's own list lags a worker that just left)
    except Exception:  # a scheduler gone: nothing kept anywhere
        return
    for address, tokens in drops.items():
        if address not in live:  # a worker that left took its vectors with it (a call to it waits to time out)
            continue
        try:
            client.run(_drop, tokens, workers=[address])
        except Exception:  # a worker gone keeps nothing
            pass


def kept_vectors(client: Any) -> bool:
    """Whether a solver keeps its vectors over the samples on the workers (``dufs.engine.kept-vectors``): ``auto``
    where the workers are on several machines, ``on`` wherever results cannot come back through /dev/shm."""
    from dufs import config
    from dufs.engine.dispatch import machines
    from dufs.engine.shm import results_local

    if client is None or not hasattr(client, "submit"):
        return False
    setting = str(config.get("engine.kept-vectors")).lower()
    if setting in ("off", "false", "no", "never") or results_local(client):
        return False
    if setting in ("on", "true", "yes", "always"):
        return True
    try:
        return len(machines(client)) > 1
    except Exception:  # a client that cannot say: the driver's way
        return False


def distinct_workers(pieces: list[Kept]) -> list[str]:
    """The workers of ``pieces`` made one a worker (:func:`kept_calls` with ``where``), for the calls among them
    that run at once and wait on each other (an all-reduce, rank by rank); :class:`HeldLost` where two landed on
    one worker. That happens where the worker named for one was lost while they were made (its task then ran on
    another's, the restriction being loose): their ranks would then share that worker's thread, one waiting for a
    message from the other queued behind it, until the exchange's timeout (10 minutes) gave up. Lost, the solver
    makes its pieces again, on the workers there are then."""
    peers = [k.address for k in pieces]
    if len(set(peers)) < len(peers):
        raise HeldLost(f"a piece kept on a worker was lost: {len(peers)} pieces landed on {len(set(peers))} workers "
                       f"(a worker left while they were made)")
    return peers


def piece_workers(client: Any, n: int) -> list[str]:
    """The workers of a solver's vectors over the samples kept in pieces of rows, one a worker
    (``dufs.engine.side-pieces``: auto, the first worker of each machine where they are on several; on, every
    worker; off): none where they stay whole (a greedy selection's side, M3FS's scores)."""
    from distributed.comm import get_address_host

    from dufs import config

    setting = str(config.get("engine.side-pieces")).lower()
    if setting in ("off", "false", "no", "never"):
        return []
    try:  # asked now: after a lost worker the cached lists still name it
        hosts: dict[str, list[str]] = {}
        for a in sorted(client.nthreads()):
            hosts.setdefault(get_address_host(a), []).append(a)
    except Exception:  # a client that cannot say: one side
        return []
    if setting in ("on", "true", "yes", "always"):
        workers = [w for ws in hosts.values() for w in ws]
    else:
        workers = [ws[0] for ws in hosts.values()]
    return workers if 1 < len(workers) <= n else []
