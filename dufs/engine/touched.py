"""A vector over the samples kept in row pieces, sent to each machine as the rows its blocks touch
(docs/scaling.md, "The rows a machine touches").

A pass over feature blocks reads an n-vector only at the rows of its blocks' nonzeros. Where the vector is kept
in pieces of rows, one a machine (a greedy step's V), each machine receives from each piece only the rows that its
own blocks touch: at few nonzeros a row a machine's d / W features touch a fraction 1 - (1 - 1/W)^nnz_row of the
rows (0.41 of them at W = 8 and 4 a row), where a whole copy brought 8 n bytes a column into every machine.

The layout (:func:`layout`) is made once for a placement of the blocks: each machine's touched rows T_h (a task a
partition marks its blocks' rows, one task a machine joins them and keeps them as a future), each piece's worker
told, through its ``dufs_touch`` handler, which of its rows each machine touches (kept there in
:data:`_TOUCH`). Each pass then runs one task a reading machine (:func:`_gather`) that fetches from every piece
its rows of T_h (``dufs_touch_rows``: worker to worker) into an n-vector that is zero elsewhere, read by the
machine's partitions. A piece whose worker no longer has the rows (it restarted) sends its piece whole: more
bytes, the same numbers. The numbers are the joined vector's at every row a block reads, so a pass makes the same
bits as from the whole vector."""

from __future__ import annotations

import asyncio
import threading
import uuid
from typing import Any

import numpy as np

from dufs.engine.direct import HeldLost

__all__ = ["PerPartition", "Pieced", "machine_vectors", "touched_rows_on"]

_TOUCH: dict[tuple[str, int], np.ndarray] = {}  # on a piece's worker: its rows each reader touches, by layout
_TOKENS: list[str] = []  # on a piece's worker: the layouts it keeps rows for, oldest first
_KEEP_LAYOUTS = 4
_LOCK = threading.Lock()


class Pieced:
    """An (n,) or (n, p) vector kept in row pieces (:class:`~dufs.engine.kept.Kept`, piece j over rows
    [bounds[j], bounds[j + 1])), given to :meth:`Matrix.map_blocks` as an argument every block reads: each machine
    gets the rows its blocks touch (:func:`machine_vectors`), or, where that does not apply (one machine, blocks of
    unknown placement), the vector joined by ``join`` on the worker ``at`` (:meth:`whole`)."""

    def __init__(self, pieces: list, bounds: list[int], join: Any, at: str):
        self.pieces, self.bounds, self.join, self.at = list(pieces), [int(b) for b in bounds], join, at
        self._whole: Any = None

    @property
    def n(self) -> int:
        return self.bounds[-1]

    def whole(self, client: Any) -> Any:
        """A future of the joined vector (made once), marked to be sent on to the machines of a pass's blocks."""
        from dufs.engine.dispatch import mark_spread
        from dufs.engine.kept import joined

        if self._whole is None:
            self._whole = mark_spread(joined(client, self.pieces, self.join, self.at))
        return self._whole


class PerPartition:
    """An argument of a pass given partition by partition (``value[u]`` to partition u): each machine's vector of
    a :class:`Pieced` one."""

    def __init__(self, value: list):
        self.value = value


def touched_rows_on() -> bool:
    """``dufs.engine.touched-rows``: whether a :class:`Pieced` vector goes to each machine as its touched rows."""
    from dufs import config

    return str(config.get("engine.touched-rows")).lower() not in ("off", "false", "no", "never")


class _Layout:
    """The touched rows of each machine for one placement of the blocks: ``rows[host]`` a future of T_h, kept on
    ``at[host]``; ``token`` names the pieces' rows on their workers."""

    def __init__(self, token: str, rows: dict, at: dict):
        self.token, self.rows, self.at = token, rows, at


def machine_vectors(executor: Any, client: Any, v: Pieced, groups: list[list[int]], hosts: list[str],
                    workers: list[str]) -> list:
    """A future a group of blocks: the n-vector ``v`` at the rows the blocks of its host touch, zero elsewhere
    (group g of ``groups`` on ``hosts[g]``, its task on ``workers[g]``); one gather task a host."""
    by_host: dict[str, list[int]] = {}
    first: dict[str, str] = {}
    for g, h in enumerate(hosts):
        by_host.setdefault(h, []).extend(groups[g])
        first.setdefault(h, workers[g])
    lay = layout(executor, client, by_host, first, v)
    pairs = [(k.address, k.token) for k in v.pieces]
    got = {h: client.submit(_gather, lay.rows[h], pairs, v.bounds, lay.token, sorted(by_host).index(h),
                            workers=[lay.at[h]], allow_other_workers=True, pure=False)
           for h in sorted(by_host)}
    return [got[h] for h in hosts]


def layout(executor: Any, client: Any, by_host: dict[str, list[int]], first: dict[str, str], v: Pieced) -> _Layout:
    """The touched rows of each host's blocks, made once for this placement of the blocks and of ``v``'s pieces
    (kept on ``executor``: one layout at a time)."""
    from dufs.engine.blocks import resolve  # noqa: F401 - the tasks' module, imported on the workers too
    from dufs.engine.exchange import ensure_plugin

    key = (tuple((h, tuple(sorted(b))) for h, b in sorted(by_host.items())),
           tuple(k.address for k in v.pieces), tuple(v.bounds))
    got = getattr(executor, "touched", None)
    if got is not None and got[0] == key:
        return got[1]
    ensure_plugin(client)
    token = uuid.uuid4().hex
    homes = executor.homes(client, None)
    peers = [k.address for k in v.pieces]
    rows, at = {}, {}
    for r, h in enumerate(sorted(by_host)):
        blocks = sorted(by_host[h])
        marks = []
        by_worker: dict[str, list[int]] = {}
        for i in blocks:
            by_worker.setdefault(homes[i] or first[h], []).append(i)
        for w, bs in sorted(by_worker.items()):  # each worker marks its own blocks' rows: no block moves
            marks.append(client.submit(_marked, [executor.src[i] for i in bs], v.n, workers=[w],
                                       allow_other_workers=True, pure=False))
        at[h] = first[h]
        rows[h] = client.submit(_told, marks, v.bounds, token, r, peers, workers=[first[h]],
                                allow_other_workers=True, pure=False)
    lay = _Layout(token, rows, at)
    executor.touched = (key, lay)
    return lay


# ---------------------------------------------------------------------------------------------------- on a worker
def _marked(srcs: list, n: int) -> np.ndarray:
    """The rows the blocks ``srcs`` touch, as a mask over the n rows."""
    from dufs.engine.blocks import resolve

    m = np.zeros(n, dtype=bool)
    for s in srcs:
        m[resolve(s).indices] = True
    return m


def _told(marks: list[np.ndarray], bounds: list[int], token: str, reader: int, peers: list[str]) -> np.ndarray:
    """The rows (int64, sorted) a machine's blocks touch (the union of ``marks``); each piece's worker of ``peers``
    told its part of them (its handler ``dufs_touch``), read by the machine ``reader``'s gathers."""
    from distributed import get_worker
    from distributed.utils import sync

    m = marks[0].copy()
    for x in marks[1:]:
        m |= x
    rows = np.flatnonzero(m)
    cut = np.searchsorted(rows, bounds)
    parts = [(rows[cut[j]:cut[j + 1]] - bounds[j]).astype(np.int32) for j in range(len(peers))]
    worker = get_worker()

    async def tell() -> None:
        from distributed.protocol import to_serialize

        await asyncio.gather(*(worker.rpc(a).dufs_touch(token=token, reader=reader, rows=to_serialize(p))
                               for a, p in zip(peers, parts, strict=True) if a != worker.address))

    for a, p in zip(peers, parts, strict=True):
        if a == worker.address:
            _touch(token, reader, p)
    try:
        sync(worker.loop, tell)
    except (OSError, asyncio.TimeoutError):  # a piece's worker left: its piece goes whole, or is lost
        pass
    return rows


def _touch(token: str, reader: int, rows: Any) -> str:
    """The worker's handler ``dufs_touch``: the rows of its piece that machine ``reader`` touches, for the layout
    ``token`` (the oldest layouts dropped)."""
    with _LOCK:
        if token not in _TOKENS:
            _TOKENS.append(token)
            while len(_TOKENS) > _KEEP_LAYOUTS:
                old = _TOKENS.pop(0)
                for k in [k for k in _TOUCH if k[0] == old]:
                    del _TOUCH[k]
        _TOUCH[(token, int(reader))] = np.asarray(rows)
    return "OK"


def _touch_rows(token: str, layout: str, reader: int) -> Any:
    """The worker's handler ``dufs_touch_rows``: (whether whole, the rows of the vector kept under ``token`` that
    machine ``reader`` touches, or all of them where this worker was not told which); None where it keeps no such
    vector."""
    from distributed.protocol import to_serialize

    from dufs.engine.kept import _KEPT

    v = _KEPT.get(token)
    if v is None:
        return None
    idx = _TOUCH.get((layout, int(reader)))
    return (idx is None, to_serialize(v if idx is None else v[idx]))


def _gather(rows: np.ndarray, pairs: list[tuple[str, str]], bounds: list[int], layout: str, reader: int
            ) -> np.ndarray:
    """On a reading machine: the vector kept in the pieces ``pairs`` (worker address, token) at the ``rows`` this
    machine's blocks touch, zero elsewhere; each piece's rows fetched from its worker side by side."""
    from distributed import get_worker
    from distributed.utils import sync

    from dufs.engine.kept import _KEPT

    worker = get_worker()
    here = worker.address
    cut = np.searchsorted(rows, bounds)
    got: list[Any] = [None] * len(pairs)
    for j, (a, t) in enumerate(pairs):
        if a == here:
            v = _KEPT.get(t)
            got[j] = None if v is None else (False, v[rows[cut[j]:cut[j + 1]] - bounds[j]])

    async def get() -> list:
        return await asyncio.gather(*(worker.rpc(a).dufs_touch_rows(token=t, layout=layout, reader=reader)
                                      for a, t in pairs if a != here))

    away = [j for j, (a, _) in enumerate(pairs) if a != here]
    if away:
        try:
            for j, x in zip(away, sync(worker.loop, get), strict=True):
                got[j] = x
        except (OSError, asyncio.TimeoutError) as e:
            raise HeldLost(f"a vector kept on a worker was lost: its worker left ({e})") from None
    if any(x is None for x in got):
        raise HeldLost("a vector kept on a worker was lost: its worker left or restarted")
    first = got[0][1]
    out = np.zeros((bounds[-1], *first.shape[1:]), dtype=first.dtype)
    for j, (whole, x) in enumerate(got):
        if whole:
            out[bounds[j]:bounds[j + 1]] = x
        else:
            out[rows[cut[j]:cut[j + 1]]] = x
    return out
