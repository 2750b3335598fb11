"""The rows each machine's blocks touch: what a machine is sent of a vector over the samples, and what it sends of
its partial of a sum (docs/scaling.md, "The rows a machine touches").

A pass over feature blocks reads an n-vector only at the rows of its blocks' nonzeros, and its products (Z U, M3FS's
scores) are zero off them. At few nonzeros a row a machine's d / W features touch a fraction 1 - (1 - 1/W)^nnz_row
of the rows (0.41 of them at W = 8 and 4 a row), where a whole copy brought 8 n bytes a column into every machine
and a reduce-scatter sent every row of each piece.

The layout (:func:`layout`) is made once for a placement of the blocks and a cut of the rows into pieces, one a
machine: each machine's touched rows T_h (a task a worker marks its blocks' rows, one task a machine joins them and
keeps them as a future), each piece's worker told, through its ``dufs_touch`` handler, which of its rows each
machine touches (kept there in :data:`_TOUCH`).

- A vector kept in such pieces (:class:`Pieced`: a greedy step's V, M3FS's R) goes to a pass as one gather task a
  reading machine (:func:`_gather`), which fetches from every piece its rows of T_h (``dufs_touch_rows``: worker to
  worker) into an n-vector that is zero elsewhere. A piece whose worker was not told the rows (it restarted) sends
  its piece whole: more bytes, the same numbers.
- A sum over machines of partials zero off their blocks' rows (:func:`sum_rows`, for
  :func:`~dufs.engine.exchange.reduce_scatter_sum`) sends each piece at the machine's touched rows only
  (:func:`compact`), expanded where it arrives (:func:`expand`).

A piece that a machine nearly all touches (:func:`dense`) goes whole both ways; where every piece is so for every
machine (kddb's 30 nonzeros a row up to about 32 machines), the passes go as without the layout.

Either way the numbers are the whole vector's at every row a block reads, and the pieces' sums are the same bits."""

from __future__ import annotations

import asyncio
import threading
import uuid
from typing import Any

import numpy as np

from dufs.engine.direct import HeldLost

__all__ = ["PerPartition", "Pieced", "compact", "expand", "machine_vectors", "sum_rows", "touched_rows_on"]

_TOUCH: dict[tuple[str, int], np.ndarray] = {}  # on a piece's worker: its rows each reader touches, by layout
_TOKENS: list[str] = []  # on a piece's worker: the layouts it keeps rows for, oldest first
_KEEP_LAYOUTS = 8  # the layouts a worker keeps rows for, the least recently used dropped
#: a machine that touches at least this share of a piece's rows is sent (and sends) the piece whole: its rows'
#: numbers would cost half as much again as they save, and the piece's worker keeps none for it
DENSE = 0.9


def dense(touched: int, rows: int) -> bool:
    """Whether ``touched`` rows of a piece of ``rows`` go as the whole piece (:data:`DENSE`)."""
    return touched >= DENSE * rows
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
    ``at[host]``; ``token`` names the pieces' rows on their workers, where machine ``host`` is ``reader[host]``;
    ``gain``: whether some machine touches clearly fewer than all the rows of some piece (:func:`dense`)."""

    def __init__(self, token: str, rows: dict, at: dict, reader: dict, gain: bool = True):
        self.token, self.rows, self.at, self.reader, self.gain = token, rows, at, reader, gain


def machine_vectors(executor: Any, client: Any, v: Pieced, groups: list[list[int]], hosts: list[str],
                    workers: list[str]) -> list | None:
    """A future a group of blocks: the n-vector ``v`` at the rows the blocks of its host touch, zero elsewhere
    (group g of ``groups`` on ``hosts[g]``, its task on ``workers[g]``); one gather task a host. None where no
    machine would gain (every one touches nearly all the rows: the vector goes whole)."""
    by_host, first = _by_host(groups, hosts, workers)
    lay = layout(executor, client, by_host, first, [k.address for k in v.pieces], v.bounds)
    if not lay.gain:
        return None
    pairs = [(k.address, k.token) for k in v.pieces]
    got = {h: client.submit(_gather, lay.rows[h], pairs, v.bounds, lay.token, lay.reader[h],
                            workers=[lay.at[h]], allow_other_workers=True, pure=False)
           for h in sorted(by_host)}
    return [got[h] for h in hosts]


def sum_rows(executor: Any, client: Any, groups: list[list[int]], workers: list[str], n: int) -> Any:
    """For a sum over machines of partials that are zero off their blocks' rows (group g of ``groups`` made on
    ``workers[g]``): a function of the machines (in the sum's order) and their receivers that gives the
    reduce-scatter what each machine sends as its touched rows only (:func:`~dufs.engine.exchange.
    reduce_scatter_sum`'s ``rows``: the layout's token, each machine's touched rows and its number in the layout)
    , or None where the rows touched are off (``dufs.engine.touched-rows``)."""
    if not touched_rows_on():
        return None
    from distributed.comm import get_address_host

    from dufs.engine.exchange import piece_bounds

    by_host, first = _by_host(groups, [get_address_host(w) for w in workers], workers)

    def rows(hosts: list[str], receivers: list[str]) -> tuple | None:
        lay = layout(executor, client, by_host, first, receivers, piece_bounds(n, len(receivers)))
        return (lay.token, [lay.rows[h] for h in hosts], [lay.reader[h] for h in hosts]) if lay.gain else None

    return rows


def _by_host(groups: list[list[int]], hosts: list[str], workers: list[str]) -> tuple[dict, dict]:
    """The blocks of ``groups`` by host, and the worker of each host's first group."""
    by_host: dict[str, list[int]] = {}
    first: dict[str, str] = {}
    for g, h in enumerate(hosts):
        by_host.setdefault(h, []).extend(groups[g])
        first.setdefault(h, workers[g])
    return by_host, first


def layout(executor: Any, client: Any, by_host: dict[str, list[int]], first: dict[str, str], holders: list[str],
           bounds: list[int]) -> _Layout:
    """The touched rows of each host's blocks, each of ``holders`` (one a piece of rows ``bounds``) told its part
    of them; made once for this placement of the blocks and of the pieces (the last few kept on ``executor``)."""
    from dufs.engine.exchange import ensure_plugin

    key = (tuple((h, tuple(sorted(b))) for h, b in sorted(by_host.items())), tuple(holders), tuple(bounds))
    kept = getattr(executor, "touched", None)
    if kept is None:
        kept = executor.touched = {}
    if key in kept:
        return kept[key]
    ensure_plugin(client)
    token = uuid.uuid4().hex
    homes = executor.homes(client, None)
    rows, at, reader = {}, {}, {}
    for r, h in enumerate(sorted(by_host)):
        marks = []
        by_worker: dict[str, list[int]] = {}
        for i in sorted(by_host[h]):
            by_worker.setdefault(homes[i] or first[h], []).append(i)
        for w, bs in sorted(by_worker.items()):  # each worker marks its own blocks' rows: no block moves
            marks.append(client.submit(_marked, [executor.src[i] for i in bs], bounds[-1], workers=[w],
                                       allow_other_workers=True, pure=False))
        at[h], reader[h] = first[h], r
        rows[h] = client.submit(_told, marks, bounds, token, r, list(holders), workers=[first[h]],
                                allow_other_workers=True, pure=False)
    # whether any machine gains: where every machine touches nearly every row of every piece (kddb's 30 nonzeros a
    # row), the rows touched would only add a gather task a machine a pass: the vector goes whole as before
    counts = client.gather([client.submit(_counts, rows[h], bounds, workers=[first[h]], allow_other_workers=True,
                                          pure=False) for h in sorted(by_host)])
    sizes = np.diff(np.asarray(bounds))
    gain = any(not dense(int(c), int(z)) for cs in counts for c, z in zip(cs, sizes, strict=True))
    while len(kept) >= _KEEP_LAYOUTS:  # the oldest let go (their pieces' workers drop them in time)
        del kept[next(iter(kept))]
    kept[key] = _Layout(token, rows, at, reader, gain)
    return kept[key]


# ---------------------------------------------------------------------------------------------------- on a worker
def _counts(rows: np.ndarray, bounds: list[int]) -> list[int]:
    """How many of ``rows`` fall in each piece of ``bounds``."""
    return np.diff(np.searchsorted(rows, bounds)).tolist()


def _marked(srcs: list, n: int) -> np.ndarray:
    """The rows the blocks ``srcs`` touch, as a mask over the n rows."""
    from dufs.engine.blocks import resolve

    m = np.zeros(n, dtype=bool)
    for s in srcs:
        m[resolve(s).indices] = True
    return m


def _told(marks: list[np.ndarray], bounds: list[int], token: str, reader: int, peers: list[str]) -> np.ndarray:
    """The rows (sorted; int32 below 2^31 rows) a machine's blocks touch (the union of ``marks``); each piece's
    worker of ``peers`` told its part of them (its handler ``dufs_touch``; None where they are nearly all of the
    piece's), read by the machine ``reader``'s gathers."""
    from distributed import get_worker
    from distributed.utils import sync

    m = marks[0].copy()
    for x in marks[1:]:
        m |= x
    rows = np.flatnonzero(m).astype(np.int32 if m.shape[0] < 2**31 else np.int64)
    cut = np.searchsorted(rows, bounds)
    parts = [None if dense(cut[j + 1] - cut[j], bounds[j + 1] - bounds[j]) else
             (rows[cut[j]:cut[j + 1]] - bounds[j]).astype(np.int32) for j in range(len(peers))]
    worker = get_worker()

    async def tell() -> None:
        from distributed.protocol import to_serialize

        await asyncio.gather(*(worker.rpc(a).dufs_touch(token=token, reader=reader,
                                                        rows=None if p is None else to_serialize(p))
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
    ``token`` (None: nearly all, the piece goes whole); the least recently used layouts dropped."""
    with _LOCK:
        _used(token)
        while len(_TOKENS) > _KEEP_LAYOUTS:
            old = _TOKENS.pop(0)
            for k in [k for k in _TOUCH if k[0] == old]:
                del _TOUCH[k]
        _TOUCH[(token, int(reader))] = _ALL if rows is None else np.asarray(rows)
    return "OK"


_ALL = "all"  # told that a machine touches (nearly) all of the piece's rows


def _used(token: str) -> None:
    """``token`` the most recently used layout (with :data:`_LOCK` held)."""
    if token in _TOKENS:
        _TOKENS.remove(token)
    _TOKENS.append(token)


def held_rows(token: str, reader: int) -> np.ndarray | None:
    """On a piece's worker: its rows that machine ``reader`` touches in the layout ``token`` (None: not told, or
    nearly all of them)."""
    with _LOCK:
        idx = _TOUCH.get((token, int(reader)))
        if idx is not None:
            _used(token)
    return None if idx is None or isinstance(idx, str) else idx


def _touch_rows(token: str, layout: str, reader: int) -> Any:
    """The worker's handler ``dufs_touch_rows``: (whether whole, the rows of the vector kept under ``token`` that
    machine ``reader`` touches, or all of them where this worker was not told which or they are nearly all); None
    where it keeps no such vector."""
    from distributed.protocol import to_serialize

    from dufs.engine.kept import _KEPT

    v = _KEPT.get(token)
    if v is None:
        return None
    idx = held_rows(layout, reader)
    return (idx is None, to_serialize(v if idx is None else v[idx]))


def _gather(rows: np.ndarray, pairs: list[tuple[str, str]], bounds: list[int], layout: str, reader: int
            ) -> np.ndarray:
    """On a reading machine: the vector kept in the pieces ``pairs`` (worker address, token) at the ``rows`` this
    machine's blocks touch, zero elsewhere; each piece's rows fetched from its worker side by side."""
    from distributed import get_worker

    from dufs.engine.exchange import ask_workers
    from dufs.engine.kept import _KEPT

    worker = get_worker()
    here = worker.address
    cut = np.searchsorted(rows, bounds)
    got: list[Any] = [None] * len(pairs)
    for j, (a, t) in enumerate(pairs):
        if a == here:
            v = _KEPT.get(t)
            got[j] = None if v is None else (False, v[rows[cut[j]:cut[j + 1]] - bounds[j]])

    away = [j for j, (a, _) in enumerate(pairs) if a != here]
    for j, x in zip(away, ask_workers(worker, [(pairs[j][0], "dufs_touch_rows",
                                                {"token": pairs[j][1], "layout": layout, "reader": reader})
                                               for j in away]), strict=True):
        got[j] = x
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


def compact(piece: Any, idx: np.ndarray) -> Any:
    """A piece of a partial at its rows ``idx`` only (an array's rows, or an object's ``dufs_take``)."""
    return piece[idx] if isinstance(piece, np.ndarray) else piece.dufs_take(idx)


def expand(part: Any, idx: np.ndarray, rows: int) -> Any:
    """:func:`compact` 's ``part`` back to its ``rows`` rows, zero off ``idx`` (the same bits as the piece)."""
    if isinstance(part, np.ndarray):
        out = np.zeros((rows, *part.shape[1:]), dtype=part.dtype)
        out[idx] = part
        return out
    return type(part).dufs_expand(part, idx, rows)

