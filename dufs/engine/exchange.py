"""Sums over machines as a reduce-scatter then a gather, the pieces sent worker to worker.

A sum of one partial a machine (n-vectors, n x p products: M3FS's scores, UFCM's Z U, MMFS's partitions' change
of w) went up a binary tree over the machines, so the machine at its root received log2 W partials (8 n log2 W
bytes for n-vectors). Here each machine's partial is cut into W pieces along its rows and piece j sent to machine
j's receiving worker (one :func:`_push` task a machine, through a handler the :class:`ExchangePlugin` adds to
every worker: peer to peer, not through the scheduler or the driver); each receiver adds its pieces (one
:func:`_reduce` task a machine) and the root's :func:`_concat` gathers the W summed pieces. The root then receives
2 (W - 1) / W partials, the others (W - 1) / W, and the tasks are 2 W + 1 whatever the blocks. Each piece is
added over the machines in the order and pairs of the tree (:func:`~dufs.engine.dispatch.tree_sum_values`), so
the sum is the tree's, bit for bit. Partials smaller than :data:`WHOLE_BYTES` go whole to the root (one hop, not
log2 W). A receiver that left, or a reduction run on another worker, raises
:class:`~dufs.engine.direct.HeldLost` ("was lost"), from which the solvers rebuild their state.

Small sums among tasks that run at once, one a worker (the pieces of rows of a greedy step's or M3FS's vectors
over the samples), go by :func:`allreduce_sum`: up a binary tree in the tree's pairs and back down it, through the
same handler; a task that fails has the driver give the others up (:func:`abort_exchange`) rather than wait."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from typing import Any

import numpy as np

from dufs.engine.direct import HeldLost

__all__ = ["ALLREDUCE_TIMEOUT", "AllSum", "ExchangePlugin", "HeldPieces", "ScatteredSum", "WHOLE_BYTES",
           "abort_exchange", "allreduce_sum", "ensure_plugin", "fetch_kept", "piece_bounds", "reduce_scatter_sum"]

#: partials smaller than this go whole to the root machine's receiver rather than in pieces to every machine
WHOLE_BYTES = 256 << 10

#: seconds a task of :func:`allreduce_sum` waits for a peer's message before it gives the sum up as lost
ALLREDUCE_TIMEOUT = 600.0

_BOX: dict[str, dict[int, Any]] = {}  # on a worker: the pieces received, by exchange token, by source machine
_LOCK = threading.Lock()
_ARRIVED = threading.Condition(_LOCK)  # notified as a message arrives or an exchange is given up
_ABORTED: set[str] = set()  # on a worker: the all-reduces given up (:func:`abort_exchange`)
_PLUGGED: set[str] = set()  # on the driver: the clients whose workers have the handler


def _put(token: str, source: int, data: Any) -> str:
    """The worker's handler ``dufs_put``: a piece of ``source``'s partial for the exchange ``token``."""
    with _ARRIVED:
        if not any(token.startswith(a) for a in _ABORTED):  # a late message of an exchange given up: dropped
            _BOX.setdefault(token, {})[int(source)] = data
            _ARRIVED.notify_all()
    return "OK"


def _kept(token: str, start: int | None = None, stop: int | None = None) -> Any:
    """The worker's handler ``dufs_kept``: the vector it keeps under ``token`` (:mod:`dufs.engine.kept`), or its
    rows [start, stop); None where it keeps none."""
    from distributed.protocol import to_serialize

    from dufs.engine.kept import _KEPT

    v = _KEPT.get(token)
    if v is not None and start is not None:
        v = v[start:stop]
    return None if v is None else to_serialize(v)


def fetch_kept(pairs: list[tuple]) -> list[Any]:
    """In a task: the vectors kept under each (worker address, token) of ``pairs``, or their rows [start, stop) for
    a (worker address, token, start, stop), this worker's read in place (a view) and the others' fetched from their
    workers side by side (worker to worker, through their ``dufs_kept`` handler);
    :class:`~dufs.engine.direct.HeldLost` where one is gone."""
    from distributed import get_worker

    from dufs.engine.kept import _KEPT

    worker = get_worker()
    here = worker.address
    out: list[Any] = [None] * len(pairs)
    for i, (a, t, *rows) in enumerate(pairs):
        if a == here:
            v = _KEPT.get(t)
            out[i] = v[rows[0]:rows[1]] if v is not None and rows else v

    away = [i for i, (a, *_) in enumerate(pairs) if a != here]
    got = ask_workers(worker, [(pairs[i][0], "dufs_kept", {"token": pairs[i][1],
                                                           "start": pairs[i][2] if len(pairs[i]) > 2 else None,
                                                           "stop": pairs[i][3] if len(pairs[i]) > 2 else None})
                               for i in away])
    for i, v in zip(away, got, strict=True):
        out[i] = v
    if any(v is None for v in out):
        raise HeldLost("a vector kept on a worker was lost: its worker left or restarted")
    return out


def ask_workers(worker: Any, calls: list[tuple[str, str, dict]]) -> list:
    """From a task on ``worker``: each (address, handler, arguments) of ``calls`` asked of its worker, side by side
    (worker to worker); the answers in order. :class:`~dufs.engine.direct.HeldLost` where a worker has left."""
    from distributed.utils import sync

    if not calls:
        return []

    async def get() -> list:
        return await asyncio.gather(*(getattr(worker.rpc(a), h)(**kw) for a, h, kw in calls))

    try:
        return sync(worker.loop, get)
    except (OSError, asyncio.TimeoutError) as e:
        raise HeldLost(f"a vector kept on a worker was lost: its worker left ({e})") from None


try:  # a WorkerPlugin where distributed is installed (it is wherever there are workers)
    from distributed.diagnostics.plugin import WorkerPlugin as _Base
except ImportError:  # pragma: no cover
    _Base = object  # type: ignore[assignment,misc]


class ExchangePlugin(_Base):  # type: ignore[misc,valid-type]
    """Adds the ``dufs_put``, ``dufs_kept``, ``dufs_touch`` and ``dufs_touch_rows`` handlers to a worker (registered
    once a client by :func:`ensure_plugin`)."""

    name = "dufs-exchange"

    def setup(self, worker: Any) -> None:
        worker.handlers["dufs_put"] = _put
        worker.handlers["dufs_kept"] = _kept
        from dufs.engine.touched import _touch, _touch_rows

        worker.handlers["dufs_touch"] = _touch
        worker.handlers["dufs_touch_rows"] = _touch_rows


def ensure_plugin(client: Any) -> None:
    """The handler on every worker of ``client``'s cluster, present and future (the scheduler keeps the plugin)."""
    if client.id in _PLUGGED:
        return
    client.register_plugin(ExchangePlugin(), name=ExchangePlugin.name)
    _PLUGGED.add(client.id)


def piece_bounds(rows: int, k: int) -> list[int]:
    """Row bounds of ``k`` near-equal pieces of ``rows`` rows."""
    return [rows * j // k for j in range(k + 1)]


def _pieces(part: Any, k: int) -> list | None:
    """``part`` cut into ``k`` pieces along its rows (an array, or an object with ``dufs_rows`` and
    ``dufs_pieces(bounds)``, whose class joins them with ``dufs_join``); None where it goes whole (not cut this
    way, or small: decided by the shape alone, which every machine's partial shares, so all go whole or none)."""
    if isinstance(part, np.ndarray):
        if part.ndim == 0 or part.nbytes < WHOLE_BYTES:
            return None
        b = piece_bounds(part.shape[0], k)
        return [np.ascontiguousarray(part[b[j]:b[j + 1]]) for j in range(k)]
    if 8 * getattr(part, "dufs_rows", 0) < WHOLE_BYTES:
        return None
    return part.dufs_pieces(piece_bounds(part.dufs_rows, k))


def _push(part: Any, source: int, token: str, receivers: list[str], touched: Any = None, layout: str | None = None,
          reader: int = 0) -> tuple[int, bool]:
    """As a task on machine ``source``: its partial cut into a piece a receiver along its rows, piece j sent to
    ``receivers[j]`` (whole to ``receivers[0]`` when small); with ``touched`` (the rows the machine's blocks touch,
    where its partial is zero elsewhere: :mod:`dufs.engine.touched`) only those rows of each piece, which its
    receiver was told (as machine ``reader`` of the ``layout``). (``source``, whether it went whole)."""
    from distributed import get_worker
    from distributed.protocol import to_serialize
    from distributed.utils import sync

    from dufs.engine.touched import compact, dense

    k = len(receivers)
    cut = _pieces(part, k)
    whole = cut is None
    pieces = {0: part} if whole else dict(enumerate(cut))
    worker = get_worker()
    remote = {j: p for j, p in pieces.items() if receivers[j] != worker.address}
    if touched is not None and not whole:  # a piece whose rows the machine nearly all touches goes whole
        b = piece_bounds(_rows_of(part), k)
        at = np.searchsorted(touched, b)
        remote = {j: p if dense(at[j + 1] - at[j], b[j + 1] - b[j]) else
                  ("touched", layout, reader, b[j + 1] - b[j], compact(p, touched[at[j]:at[j + 1]] - b[j]))
                  for j, p in remote.items()}
    for j, p in pieces.items():
        if j not in remote:
            _put(token, source, p)

    async def send() -> None:
        await asyncio.gather(*(worker.rpc(receivers[j]).dufs_put(token=token, source=source, data=to_serialize(p))
                               for j, p in remote.items()))

    if remote:
        try:
            sync(worker.loop, send)
        except (OSError, asyncio.TimeoutError) as e:  # a receiver gone: its machine's sums with it
            raise HeldLost(f"a sum over machines was lost: a receiving worker left ({e})") from None
    return source, whole


def _rows_of(part: Any) -> int:
    return part.shape[0] if isinstance(part, np.ndarray) else int(part.dufs_rows)


def _expanded(x: Any) -> Any:
    """A piece as it arrived, or, sent as its touched rows only, expanded to the whole piece (zero elsewhere)."""
    if not (isinstance(x, tuple) and len(x) == 5 and x[0] == "touched"):
        return x
    from dufs.engine.touched import expand, held_rows

    _, layout, reader, rows, part = x
    idx = held_rows(layout, reader)
    if idx is None:
        raise HeldLost("a sum over machines was lost: its receiver no longer knows the rows a machine sent (its "
                       "worker restarted)")
    return expand(part, idx, rows)


def _reduce(acks: list[tuple[int, bool]], j: int, token: str) -> Any:
    """As a task on receiver ``j``: its pieces added over the machines in the tree's order (None: the partials
    went whole to another receiver)."""
    from dufs.engine.dispatch import tree_sum_values

    k = len(acks)
    with _LOCK:
        got = _BOX.pop(token, {})
    if acks[0][1] and j > 0:
        return None
    if len(got) != k:
        raise HeldLost(f"a sum over machines was lost: receiver {j} holds {len(got)} of its {k} pieces (its worker "
                       f"restarted, or the task ran elsewhere)")
    return tree_sum_values([_expanded(got[m]) for m in range(k)])


def _concat(pieces: list) -> Any:
    if len(pieces) > 1 and pieces[1] is None:
        return pieces[0]
    join = getattr(type(pieces[0]), "dufs_join", None)
    return join(pieces) if join is not None else np.concatenate(pieces, axis=0)


class ScatteredSum:
    """A sum over machines left in the pieces of its rows, each on its receiver (:func:`reduce_scatter_sum` with
    ``pieces``): ``sums`` (delayed values, piece j the rows ``piece_bounds(rows, W)[j:j + 2]`` of the sum, or, where
    the partials went whole, the sum on ``receivers[0]`` and None on the others) and ``receivers``."""

    def __init__(self, sums: list[Any], receivers: list[str]):
        self.sums, self.receivers = sums, receivers


class HeldPieces:
    """A pass's sum left in pieces of its rows on the machines' receivers (``Matrix.map_blocks(hold="pieces")``):
    ``futures`` (one a receiver, in ``receivers``' order) and the receivers; :meth:`in_pieces` says whether a sum
    of that many bytes was cut (else the first future holds it whole), :meth:`whole` joins it on the first."""

    def __init__(self, futures: list[Any], receivers: list[str]):
        self.futures, self.receivers = futures, receivers

    @staticmethod
    def in_pieces(nbytes: int) -> bool:
        return nbytes >= WHOLE_BYTES

    def whole(self, client: Any) -> Any:
        """A future of the whole sum, joined on the first receiver."""
        return client.submit(_concat, self.futures, workers=[self.receivers[0]], allow_other_workers=True,
                             pure=False)


def reduce_scatter_sum(level: list[Any], receivers: list[str], client: Any, pieces: bool = False,
                       rows: Any = None) -> Any:
    """The sum of ``level`` (delayed partials, one a machine, in the tree's order) as a delayed value on
    ``receivers[0]``: pushed in pieces to ``receivers`` (one worker a machine, in the same order), added there,
    gathered at the root (the module docstring); with ``pieces``, left where they were added (a
    :class:`ScatteredSum`). ``rows``: (a layout's token, each machine's touched rows, its number in the layout),
    the machines' partials being zero off those rows: each sends only them (:mod:`dufs.engine.touched`)."""
    import dask

    ensure_plugin(client)
    token = uuid.uuid4().hex
    push = dask.delayed(_push, pure=False)
    reduce = dask.delayed(_reduce, pure=False)
    acks = []
    for m, part in enumerate(level):
        extra = () if rows is None else (rows[1][m], rows[0], rows[2][m])
        with dask.annotate(workers=[receivers[m]], allow_other_workers=True):
            acks.append(push(part, m, token, receivers, *extra))
    sums = []
    for j, r in enumerate(receivers):
        with dask.annotate(workers=[r], allow_other_workers=True):
            sums.append(reduce(acks, j, token))
    if pieces:
        return ScatteredSum(sums, list(receivers))
    with dask.annotate(workers=[receivers[0]], allow_other_workers=True):
        return dask.delayed(_concat, pure=False)(sums)


# ---------------------------------------------------------------------------------------------------- all-reduce
def _send(worker: Any, address: str, token: str, source: int, data: Any) -> None:
    """From a task: ``data`` to the worker at ``address`` under (``token``, ``source``), in place where it is this
    worker; :class:`~dufs.engine.direct.HeldLost` where that worker is gone."""
    from distributed.protocol import to_serialize
    from distributed.utils import sync

    if address == worker.address:
        _put(token, source, data)
        return
    try:
        sync(worker.loop, worker.rpc(address).dufs_put, token=token, source=source, data=to_serialize(data))
    except (OSError, asyncio.TimeoutError) as e:
        raise HeldLost(f"a sum among the workers was lost: a worker taking part left ({e})") from None


def _await(token: str, source: int, base: str, timeout: float) -> Any:
    """From a task: the message (``token``, ``source``) once it has arrived; HeldLost where the exchange ``base``
    was given up (:func:`abort_exchange`) or nothing came within ``timeout`` seconds."""
    end = time.monotonic() + timeout
    with _ARRIVED:
        while True:
            box = _BOX.get(token)
            if box is not None and source in box:
                data = box.pop(source)
                if not box:
                    del _BOX[token]
                return data
            if base in _ABORTED:
                raise HeldLost("a sum among the workers was lost: another worker taking part failed or left")
            left = end - time.monotonic()
            if left <= 0:
                raise HeldLost(f"a sum among the workers was lost: no message from rank {source} in {timeout:.0f} s")
            _ARRIVED.wait(left)


def allreduce_sum(value: np.ndarray, token: str, rank: int, peers: list[str],
                  timeout: float = ALLREDUCE_TIMEOUT, base: str | None = None) -> np.ndarray:
    """In one of ``len(peers)`` tasks running at once, the task of ``rank`` on the worker ``peers[rank]``: the sum
    of every rank's ``value`` (small arrays of one shape), the same bits on every rank. The values are added up a
    binary tree to rank 0 in the pairs and order of :func:`~dufs.engine.dispatch.tree_sum_values` (rank i adds
    rank i + s at stride s), and the sum sent back down the same tree: 2 log2 W messages' latency, at most log2 W
    sent by a rank, worker to worker through the ``dufs_put`` handler (no task, the scheduler or the driver
    between them). ``base``: the exchange that :func:`abort_exchange` gives up to stop it (``token`` itself, or a
    prefix of it shared by the all-reduces of one call)."""
    from distributed import get_worker

    base = token if base is None else base
    worker = get_worker()
    W = len(peers)
    x = value
    stride = 1
    while stride < W:  # up: received from the subtree's ranks, then sent to the parent
        if rank % (2 * stride):
            _send(worker, peers[rank - stride], f"{token}:up", rank, x)
            break
        if rank + stride < W:
            x = x + _await(f"{token}:up", rank + stride, base, timeout)
        stride *= 2
    low = stride  # rank 0: the tree's height as a power of two; another: its lowest set bit
    if rank:
        x = _await(f"{token}:down", rank - low, base, timeout)
    step = low // 2
    while step >= 1:  # down: to the ranks it received from
        if rank + step < W:
            _send(worker, peers[rank + step], f"{token}:down", rank, x)
        step //= 2
    return x


class AllSum:
    """In one of the tasks of a call that run at once, one a worker (pieces of rows or of features): the call's
    collective operations, the i-th under ``token``.i on every task (the tasks run the same code, so their i-th
    operations are the same ones; ``token`` is the base :func:`abort_exchange` gives up)."""

    def __init__(self, token: str, rank: int, peers: list[str]):
        self.token, self.rank, self.peers, self.i = token, rank, peers, 0

    def __call__(self, x: Any) -> np.ndarray:
        """The sum of every task's ``x`` (:func:`allreduce_sum`)."""
        self.i += 1
        return allreduce_sum(np.asarray(x, dtype=np.float64), f"{self.token}.{self.i}", self.rank, self.peers,
                             base=self.token)

    def gather(self, rows: np.ndarray) -> np.ndarray:
        """Every task's ``rows`` (r_i x w, float64), stacked in rank order, on every task: two sums (the counts,
        then the rows placed in a zero array: adding zeros is exact)."""
        rows = np.asarray(rows, dtype=np.float64)
        rows = rows.reshape(rows.shape[0], int(np.prod(rows.shape[1:])))
        n = np.zeros(len(self.peers))
        n[self.rank] = rows.shape[0]
        n = self(n).astype(np.int64)
        at = np.concatenate([[0], np.cumsum(n)])
        out = np.zeros((int(at[-1]), rows.shape[1]))
        out[at[self.rank]:at[self.rank + 1]] = rows
        return self(out) if out.size else out

    def max(self, x: float) -> float:
        """The largest of every task's ``x``."""
        v = np.zeros(len(self.peers))
        v[self.rank] = x
        return float(np.max(self(v)))


def _abort(token: str) -> None:
    """On a worker: the all-reduce ``token`` given up (its waiting tasks raise), its messages dropped."""
    with _ARRIVED:
        _ABORTED.add(token)
        for key in [k for k in _BOX if k.startswith(token)]:
            del _BOX[key]
        _ARRIVED.notify_all()


def abort_exchange(client: Any, token: str, workers: list[str]) -> None:
    """The all-reduce ``token`` given up on ``workers`` (after one of its tasks failed: the others stop waiting);
    workers gone are skipped."""
    try:
        client.run(_abort, token, workers=list(workers), on_error="ignore")
    except Exception:  # a scheduler or workers gone: nothing waits there
        pass
