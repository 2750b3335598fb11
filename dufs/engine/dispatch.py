"""How a pass over the blocks runs: the one place that decides between a Dask graph and running inline, and how
large arguments travel.

- A pass is a list of per-block tasks made with :func:`delayed`, summed with :func:`tree_sum` when a reduction is
  wanted, and computed with :func:`compute` (``dufs.engine.progress.run_pass`` reports its progress).
- **Inline**: inside :func:`inline_pass` ``(True)``, the "tasks" are the block results themselves, computed as the
  pass is built, in this process, with no Dask graph (a small matrix and no distributed client: a pass then takes
  about what Dask would spend building and running its graph). ``delayed`` returns the function itself,
  ``ship``/``tree_sum``/``compute`` act on values.
- **Large arguments**: :func:`ship` makes an array one key of the pass (scattered to the current client, or a
  graph key), so it is shipped once, not once a task; :func:`shipped` scatters for the duration of a ``with``
  block and releases afterwards. A literal array in a graph is kept by the scheduler after the pass (seen with
  distributed 2026.8), hence keys.
- **Which client**: :func:`dufs.scheduling.current_client`, which honours ``dask.config``'s ``scheduler``.
- **Clean-up**: every future a pass makes is :func:`track`-ed; inside :func:`scope` (``dufs.fit`` runs a method in
  one), those still alive when the block ends (kept by a method that raised, or by its traceback) are released and
  forgotten by the workers, so that a user's own client is left as it was.
"""

from __future__ import annotations

import contextlib
import contextvars
import time
import uuid
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from dufs.scheduling import current_client

__all__ = ["compute", "current_client", "delayed", "forget", "in_shared_memory", "inline_pass", "is_inline",
           "machines", "scatter_to", "scope", "ship", "shippable", "shipped", "spread", "to_spread", "track",
           "tree_sum", "tree_sum_into", "tree_sum_machines", "tree_sum_values"]

_INLINE: contextvars.ContextVar[bool] = contextvars.ContextVar("dufs_inline_pass", default=False)


@contextlib.contextmanager
def inline_pass(on: bool) -> Iterator[None]:
    """Passes built inside the block run inline (``on``) or as Dask graphs."""
    token = _INLINE.set(bool(on))
    try:
        yield
    finally:
        _INLINE.reset(token)


def is_inline() -> bool:
    """Whether the pass being built runs inline (see the module docstring)."""
    return _INLINE.get()


_SCOPE: contextvars.ContextVar[weakref.WeakSet | None] = contextvars.ContextVar("dufs_future_scope", default=None)


@contextlib.contextmanager
def scope(client: Any = None) -> Iterator[None]:
    """Release, when the block ends (normally or by an exception), every future :func:`track`-ed inside it that is
    still alive, and wait until the workers forget them (:func:`forget`). Futures a pass let go of are gone already
    (only weak references are kept). Scopes nest: an inner one releases its own."""
    live: weakref.WeakSet = weakref.WeakSet()
    token = _SCOPE.set(live)
    try:
        yield
    finally:
        _SCOPE.reset(token)
        left = list(live)
        if left:
            forget(client if client is not None else left[0].client, left)


def track(x: Any) -> Any:
    """``x`` (a ``distributed.Future``, or a list or tuple of them) itself, registered with the current
    :func:`scope` (none: nothing to do)."""
    live = _SCOPE.get()
    if live is not None:
        from distributed import Future

        for f in x if isinstance(x, list | tuple) else [x]:
            if isinstance(f, Future):
                live.add(f)
    return x


def delayed(fn: Callable, pure: bool = False) -> Callable:
    """``dask.delayed(fn)``, or ``fn`` itself inline."""
    if _INLINE.get():
        return fn
    import dask

    return dask.delayed(fn, pure=pure)


def ship(x: Any, every: bool = False) -> Any:
    """A large argument (an array of 64 KiB or more, a SciPy sparse matrix, or an object whose ``dufs_ship`` is
    true: one that holds such arrays) as one key, so a pass ships it once:
    under a distributed client a scattered future (released with the pass's last reference to it), else a graph
    key; small arguments and inline passes take ``x`` as it is. ``every``: every task of the pass reads it, so on
    workers of several machines it goes to each machine that reads it once (:func:`to_spread`)."""
    if _INLINE.get():
        return x
    if shippable(x):
        client = current_client()
        if client is not None:
            if every and len(machines(client)) > 1:
                return to_spread(client, x)
            return track(client.scatter(x, hash=False))
        import dask

        return dask.delayed(x, name=f"dufs-arg-{uuid.uuid4().hex}", pure=False)
    return x


@contextlib.contextmanager
def shipped(x: Any, *, broadcast: bool = False, where: list | None = None, shared: bool = False) -> Iterator[Any]:
    """``x`` (an array, or a list sent item by item) scattered to the current client for the block and released
    after; without a client, or a ``distributed.Future`` already, ``x`` itself. ``broadcast``: for a pass whose
    every worker reads it, sent to every worker at once where they share one machine (scattered to one, the
    others' tasks fetched it from there, a second transfer after the first), one copy a machine where they are on
    several (:func:`to_spread`: the pass that reads it sends it on to the machines of its blocks). ``where`` (with
    a list): the worker address each item goes to (None: anywhere), for items read by one task each whose worker is
    known.

    ``shared``: an array the tasks read through :func:`dufs.engine.shm.local_array` goes, where every worker is on
    this machine, through one file in /dev/shm that they all map (:func:`dufs.engine.shm.publish`): one copy for
    all of them, not one a process (:mod:`dufs.engine.shm`)."""
    client = current_client()
    from distributed import Future

    if client is None or x is None or isinstance(x, Future):  # a future is already where the work runs
        yield x
        return
    if shared and where is None:
        with in_shared_memory(x) as ref:
            if ref is not x:
                yield ref
                return
    if where is not None and isinstance(x, list) and len(where) == len(x) and None not in where:
        futs: Any = scatter_to(client, x, where)
    elif broadcast and len(machines(client)) > 1:
        futs = to_spread(client, x)
    else:
        futs = track(client.scatter(x, hash=False, broadcast=broadcast))
    try:
        yield futs
    finally:
        for f in futs if isinstance(futs, list) else [futs]:
            f.release()


@contextlib.contextmanager
def in_shared_memory(x: Any) -> Iterator[Any]:
    """``x`` (an array every worker reads) in one file in /dev/shm for the block, which every worker maps
    (:func:`dufs.engine.shm.publish`), where they all share this machine's; else ``x`` itself (sent by the pass
    that takes it): shared memory off, workers elsewhere, too small, or /dev/shm full (a container's is often
    64 MB) or not writable."""
    from dufs.engine.shm import publish, shared_eligible

    if not shared_eligible(current_client(), x):
        yield x
        return
    with contextlib.ExitStack() as stack:
        try:
            ref = stack.enter_context(publish(x))
        except OSError:
            ref = x
        yield ref


_MACHINES: dict[str, tuple[float, dict[str, list[str]]]] = {}
_MACHINES_TTL = 1.0  # seconds a reading is reused: a pass asks once, not once a call


def machines(client: Any) -> dict[str, list[str]]:
    """The client's workers by machine (``{host: [worker address, ...]}``, both sorted)."""
    from distributed.comm import get_address_host

    now = time.monotonic()
    got = _MACHINES.get(client.id)
    if got is None or now - got[0] > _MACHINES_TTL:
        out: dict[str, list[str]] = {}
        for a in sorted(client.scheduler_info(n_workers=-1)["workers"]):
            out.setdefault(get_address_host(a), []).append(a)
        _MACHINES.clear()  # one client's at a time: nothing kept for closed ones
        got = _MACHINES[client.id] = (now, out)
    return got[1]


_TO_SPREAD: weakref.WeakSet = weakref.WeakSet()


def to_spread(client: Any, x: Any) -> Any:
    """``x`` (an array, or a list of them) scattered to one worker (the first of the first machine), marked as read
    by every task of the pass it is given to: that pass sends it on to its readers' machines (:func:`spread`)
    before its tasks start."""
    first = next(iter(machines(client).values()))[:1]
    futs = track(client.scatter(x, hash=False, workers=first))
    for f in futs if isinstance(futs, list) else [futs]:
        _TO_SPREAD.add(f)
    return futs


def mark_spread(f: Any) -> Any:
    """The future ``f`` (a vector on a worker) marked as read by every task of the pass it is given to, as
    :func:`to_spread` marks what it scatters; ``f`` itself."""
    _TO_SPREAD.add(f)
    return f


def spread(client: Any, futures: list, readers: list[str | None]) -> None:
    """The futures marked by :func:`to_spread` among ``futures`` copied to one worker on each machine of
    ``readers`` (the workers whose tasks read them; a None among them: every machine), along a tree between the
    machines (``Client.replicate``: each copy made seeds up to two more). A task on a machine's other worker
    processes fetches them from the local copy (Dask prefers a peer on its own host), so the bytes into a machine
    do not grow with its processes, the driver sends each once whatever the number of machines, and a machine
    that holds no block of the pass receives nothing."""
    from distributed import Future
    from distributed.comm import get_address_host

    marked = [f for f in futures if isinstance(f, Future) and f in _TO_SPREAD]
    if not marked:
        return

    hosts = machines(client)
    if None in readers:
        first = [ws[0] for ws in hosts.values()]
    else:
        on: dict[str, str] = {}
        for a in sorted(readers):
            on.setdefault(get_address_host(a), a)
        first = list(on.values())
    try:
        client.replicate(marked, workers=first)
    except Exception:  # noqa: BLE001 - the copies only save transfers: tasks fetch what they read anyway
        # a reader left since it was named (KeyError), or a worker just lost left the scheduler's replica
        # bookkeeping in between (distributed 2026.8 then fails its own `ts.who_has is not None` assertion)
        pass
    for f in marked:
        _TO_SPREAD.discard(f)


def scatter_to(client: Any, items: list, where: list[str]) -> list:
    """``items`` scattered, item ``i`` to the worker at address ``where[i]`` (one scatter a worker)."""
    futs: list = [None] * len(items)
    for addr in sorted(set(where)):
        idx = [i for i, a in enumerate(where) if a == addr]
        try:
            got = client.scatter([items[i] for i in idx], hash=False, workers=[addr])
        except KeyError:  # that worker left since it was named (a placement read before a loss): anywhere
            got = client.scatter([items[i] for i in idx], hash=False)
        for i, f in zip(idx, got, strict=True):
            futs[i] = f
    return track(futs)


def forget(client: Any, futures: list, timeout: float = 2.0) -> None:
    """Release scattered ``futures`` and wait (at most ``timeout`` seconds) until no worker holds them any more.

    A release reaches the scheduler in the background: a cluster closed right after it (``dufs.fit``'s embedded
    one) still finds the data on its workers, and distributed logs an error for each worker ("caused the cluster
    to lose scattered data, which can't be recovered")."""
    keys = [f.key for f in futures]
    for f in futures:
        f.release()
    if client is None or not keys:
        return
    deadline = time.monotonic() + timeout
    try:
        while any(client.sync(client.scheduler.who_has, keys=keys).values()) and time.monotonic() < deadline:
            time.sleep(0.005)
    except Exception:  # a scheduler gone holds nothing
        return


def _add(a: Any, b: Any) -> Any:
    return a + b


def tree_sum(parts: list) -> Any:
    """The sum of delayed values pairwise in a fixed tree (the order depends only on the number of parts), so that
    floating-point sums repeat exactly; inline, of the values."""
    if _INLINE.get():
        return tree_sum_values(parts)
    import dask

    add = dask.delayed(_add, pure=True)
    while len(parts) > 1:
        nxt = [add(parts[i], parts[i + 1]) for i in range(0, len(parts) - 1, 2)]
        if len(parts) % 2:
            nxt.append(parts[-1])
        parts = nxt
    return parts[0]


def tree_sum_machines(parts: list, homes: list[str | None], client: Any, pieces: bool = False, rows: Any = None
                      ) -> Any:
    """:func:`tree_sum` of delayed values made on workers of several machines (``homes``: the worker of each),
    summed first within each machine (its parts in order, the adds kept on its workers: the partials do not leave
    it) and then one partial a machine in a fixed tree over the machines (in the order of their first parts), each
    add on the machine of its left operand: what crosses a link is one partial a machine and level, not one a part.
    Over three machines or more (``dufs.engine.machine-sums: auto``) the machines' partials are added by a
    reduce-scatter and a gather instead, in the same pairs (:mod:`dufs.engine.exchange`): the root's machine
    receives two partials' worth, not log2 W. Where the parts are on one machine (or a home is unknown),
    :func:`tree_sum` itself: the same numbers. ``pieces``: a reduce-scatter's sum is left in its pieces (a
    :class:`~dufs.engine.exchange.ScatteredSum`). ``rows`` (:func:`dufs.engine.touched.sum_rows`): the partials
    are zero off their blocks' rows, and a reduce-scatter sends each machine's touched rows only."""
    from distributed.comm import get_address_host

    hosts = machines(client) if client is not None and None not in homes else {}
    if len(hosts) < 2:
        return tree_sum(parts)
    import dask

    add = dask.delayed(_add, pure=True)
    order: dict[str, list] = {}
    for p, home in zip(parts, homes, strict=True):
        order.setdefault(get_address_host(home), []).append(p)
    level = []
    for host, ps in order.items():
        with dask.annotate(workers=hosts[host], allow_other_workers=True):
            level.append((host, tree_sum(ps)))
    if len(level) >= 3 and _machine_sums() == "auto":  # the machines' partials in pieces, peer to peer
        from dufs.engine.exchange import reduce_scatter_sum

        receivers = [hosts[h][0] for h, _ in level]
        return reduce_scatter_sum([p for _, p in level], receivers, client, pieces=pieces,
                                  rows=None if rows is None else rows([h for h, _ in level], receivers))
    while len(level) > 1:
        nxt = []
        for (host, a), (_, b) in zip(level[0::2], level[1::2], strict=False):
            with dask.annotate(workers=hosts[host], allow_other_workers=True):
                nxt.append((host, add(a, b)))
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
    return level[0][1]


def _machine_sums() -> str:
    from dufs import config

    return str(config.get("engine.machine-sums")).lower()


def tree_sum_values(vals: list) -> Any:
    """:func:`tree_sum` of computed values, in the same order."""
    vals = list(vals)
    while len(vals) > 1:
        nxt = [vals[i] + vals[i + 1] for i in range(0, len(vals) - 1, 2)]
        if len(vals) % 2:
            nxt.append(vals[-1])
        vals = nxt
    return vals[0] if vals else None


def tree_sum_into(vals: list[np.ndarray], out: np.ndarray) -> np.ndarray:
    """:func:`tree_sum_values` of float arrays of one shape into ``out``: the same pairs added in the same order, so
    the same numbers, with every level but the last written into ``vals``' own arrays (the caller's scratch: they
    are overwritten) and the last into ``out``, where each level's sums were fresh arrays, whose pages fault in
    (docs/measurements.md, "Pooled buffers")."""
    vals = list(vals)
    if not vals:
        raise ValueError("tree_sum_into needs at least one array")
    while len(vals) > 2:
        nxt = []
        for i in range(0, len(vals) - 1, 2):
            np.add(vals[i], vals[i + 1], out=vals[i])
            nxt.append(vals[i])
        if len(vals) % 2:
            nxt.append(vals[-1])
        vals = nxt
    if len(vals) == 2:
        np.add(vals[0], vals[1], out=out)
    else:
        np.copyto(out, vals[0])
    return out


def compute(tasks: list) -> list:
    """The values of ``tasks`` (``dask.compute``; inline, the tasks are their values)."""
    if _INLINE.get():
        return list(tasks)
    import dask

    return list(dask.compute(*tasks)) if tasks else []


def shippable(x: Any) -> bool:
    """Whether :func:`ship` sends ``x`` as one key: an array of 64 KiB or more, a SciPy sparse matrix, or an object
    whose ``dufs_ship`` is true."""
    return isinstance(x, np.ndarray) and x.nbytes >= 1 << 16 or _is_scipy(x) or getattr(x, "dufs_ship", False)


def _is_scipy(x: Any) -> bool:
    return type(x).__module__.startswith("scipy.sparse")
