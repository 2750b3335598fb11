"""The sample axis: the matrix's CSR row blocks, and sample-space arrays kept in row pieces beside them.

An n_samples x p dense array (an embedding, pseudo-label indicators, an anchor graph's weights) is a
:class:`Pieces`: one piece per row block (``dufs.store.row-block`` rows of a store's CSR side), held where it was
computed (a future on a worker under a distributed client, an array in this process otherwise) and never whole in
one task or on the driver once it exceeds ``dufs.engine.max-task-bytes``. :meth:`Rows.map` runs a function on each
row block with its pieces (``fn(rows, start, *pieces_b, *args)``, ``rows`` the block's CSR buffers as a SciPy
``csr_array`` with global feature indices) and keeps the results as new pieces; :meth:`Rows.reduce` sums the
results in a fixed tree (the same floating-point sums whatever the timing). Small arrays (n-vectors, the m x p
sums of a k-means step) come back to the driver; large ones stay.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp

from dufs import config
from dufs.engine.dispatch import track
from dufs.errors import DufsError, ParameterError
from dufs.scheduling import current_client

__all__ = ["Pieces", "RowBlock", "Rows", "check_gather", "max_task_bytes"]


def max_task_bytes() -> int:
    """``dufs.engine.max-task-bytes``: the most bytes of sample-space data one task, or the driver, may hold."""
    return config.parse_bytes(config.get("engine.max-task-bytes"))


def check_gather(what: str, n_rows: int, width: int, nbytes: int) -> None:
    """Refuse to bring an n_rows x width sample-space array of ``nbytes`` whole to one process above
    ``dufs.engine.max-task-bytes`` (a plain n-vector, width 1, is always allowed)."""
    if width > 1 and nbytes > max_task_bytes():
        raise ParameterError(f"{what} is {_size(nbytes)} ({n_rows:,} x {width}), over dufs.engine.max-task-bytes "
                             f"({_size(max_task_bytes())}): it stays in row pieces on the workers")


def _size(b: int) -> str:
    from dask.utils import format_bytes

    return format_bytes(int(b))


@dataclass(frozen=True)
class RowBlock:
    """Rows ``start:stop``: CSR row block ``index`` of the store at ``path`` (read where the task runs, kept in a
    small per-process cache), or in-memory rows ``csr``."""

    start: int
    stop: int
    path: str | None = None
    index: int = -1
    created: str | None = None
    csr: Any = None

    def load(self, n_features: int) -> sp.csr_array:
        if self.csr is not None:
            return self.csr
        key = (self.path, self.created, self.index)
        got = _ROWS.get(key)
        if got is None:
            from dufs.data import read_block

            b = read_block(self.path, "csr", self.index, created=self.created)
            got = sp.csr_array((b.data, b.indices, np.asarray(b.indptr, dtype=np.int64)),
                               shape=(self.stop - self.start, n_features))
            _ROWS[key] = got
            while len(_ROWS) > _ROW_CACHE:
                _ROWS.popitem(last=False)
        else:
            _ROWS.move_to_end(key)
        return got


_ROW_CACHE = 2
_ROWS: OrderedDict = OrderedDict()


def _run(fn: Any, block: RowBlock, n_features: int, parts: tuple, args: tuple, with_rows: bool = True) -> Any:
    return fn(block.load(n_features) if with_rows else None, block.start, *parts, *args)


def _run_each(fn: Any, blocks: list[RowBlock], n_features: int, parts: list[tuple], args: tuple,
              with_rows: bool) -> list:
    return [_run(fn, b, n_features, pb, args, with_rows) for b, pb in zip(blocks, parts, strict=True)]


def _add(a: Any, b: Any) -> Any:
    if isinstance(a, tuple):
        return tuple(x + y for x, y in zip(a, b, strict=True))
    return a + b


def _concat(*parts: Any) -> Any:
    if parts and sp.issparse(parts[0]):
        return sp.vstack(parts, format="csr")
    return np.concatenate(parts)


class Pieces:
    """A sample-space array in row pieces aligned with :class:`Rows` (see the module docstring)."""

    def __init__(self, rows: Rows, items: list, *, width: int = 1, itemsize: int = 8, n_rows: int | None = None):
        self.rows = rows
        self.items = items
        self.width = int(width)
        self.itemsize = int(itemsize)
        self.n_rows = rows.n if n_rows is None else int(n_rows)  # fewer for a sample of the rows

    @property
    def nbytes(self) -> int:
        """The whole array's bytes (as the model counts them: rows x width x itemsize)."""
        return self.n_rows * self.width * self.itemsize

    def gather(self, what: str = "the array") -> Any:
        """The whole array in this process: refused above ``dufs.engine.max-task-bytes`` (a plain n-vector, width 1,
        is always allowed)."""
        check_gather(what, self.n_rows, self.width, self.nbytes)
        client = self.rows.live_client()
        items = client.gather(self.items) if client is not None else self.items
        return _concat(*items) if items else np.zeros((0, self.width))

    def assembled(self) -> Any:
        """The whole array as one value where the work runs: a future on a worker (never on the driver) under a
        distributed client, else the array; refused above ``dufs.engine.max-task-bytes``."""
        client = self.rows.live_client()
        if client is None:
            return self.gather()
        if self.width > 1 and self.nbytes > max_task_bytes():
            raise ParameterError(f"the array is {_size(self.nbytes)}, over dufs.engine.max-task-bytes "
                                 f"({_size(max_task_bytes())})")
        return track(client.submit(_concat, *self.items, pure=False))

    def release(self) -> None:
        if self.rows.client is not None:
            for f in self.items:
                f.release()
        self.items = []


class Rows:
    """The CSR row blocks of a matrix (see the module docstring): from a store's CSR side, or from in-memory rows."""

    def __init__(self, blocks: list[RowBlock], shape: tuple[int, int]):
        self.blocks = blocks
        self.n, self.n_features = int(shape[0]), int(shape[1])
        self.client = current_client()

    @classmethod
    def of(cls, M: Any) -> Rows:
        """The row blocks of a :class:`~dufs.engine.Matrix` (raw values: a transform is the caller's to apply)."""
        n, d = M.shape
        if M.store_path is not None:
            from dufs.data import open_store

            st = open_store(M.store_path)
            created = st.meta.created
            b = st.bounds("csr")
            return cls([RowBlock(int(b[i]), int(b[i + 1]), st.path, i, created) for i in range(len(b) - 1)], (n, d))
        X = rows_in_memory(M)
        step = int(config.get("store.row-block"))
        return cls([RowBlock(a, min(n, a + step), csr=X[a:min(n, a + step)]) for a in range(0, max(n, 1), step)
                    if a < n], (n, d))

    def live_client(self) -> Any:
        """The client these rows (and their pieces) were made under; an error that says so when that cluster has
        been closed since (its pieces are gone with it), rather than distributed's "Client is closed"."""
        c = self.client
        if c is not None and getattr(c, "status", "running") in ("closing", "closed"):
            raise DufsError("these row pieces (an anchor graph, an embedding or labels made by dufs) lived on a "
                            "cluster that has been closed since: build them again under the current client")
        return c

    def _share(self, x: Any) -> Any:
        if self.client is not None and (isinstance(x, np.ndarray) and x.nbytes >= 1 << 16 or sp.issparse(x)):
            return track(self.client.scatter(x, hash=False, broadcast=True))
        return x

    def map(self, fn: Any, *pieces: Pieces, args: tuple = (), width: int = 1, itemsize: int = 8,
            n_rows: int | None = None, with_rows: bool = True) -> Pieces:
        """``fn(rows, start, *pieces_b, *args)`` on every row block; the results kept as pieces. Without
        ``with_rows``, ``rows`` is None (work on the pieces alone reads no data)."""
        self.live_client()
        args = tuple(self._share(a) for a in args)
        out = []
        for i, b in enumerate(self.blocks):
            parts = tuple(p.items[i] for p in pieces)
            if self.client is None:
                out.append(_run(fn, b, self.n_features, parts, args, with_rows))
            else:
                out.append(track(self.client.submit(_run, fn, b, self.n_features, parts, args, with_rows,
                                                    pure=False)))
        return Pieces(self, out, width=width, itemsize=itemsize, n_rows=n_rows)

    def map_held(self, fn: Any, *pieces: Pieces, args: tuple = (), with_rows: bool = True) -> list:
        """The values of ``fn(rows, start, *pieces_b, *args)`` for every row block, in block order, computed by one
        task a worker over the row blocks whose first piece it holds (:meth:`map` makes one task a row block, a
        scheduler round each: a kddb-size product over 147 row blocks took 147 tasks and, summed, a tree of 146
        more). Arrays in ``args`` that the tasks read through :func:`~dufs.engine.shm.local_array` may be shared
        references (:func:`~dufs.engine.dispatch.shipped`). A piece that no worker holds (lost) falls back to
        :meth:`map`, which recomputes it."""
        client = self.live_client()
        first = pieces[0].items if pieces else []
        who = client.who_has(first) if client is not None and first else {}
        if client is None or not first or not all(who.get(f.key) for f in first):
            items = self.map(fn, *pieces, args=args, with_rows=with_rows).items
            return list(client.gather(items)) if client is not None else list(items)
        groups: dict[str, list[int]] = {}
        for i, f in enumerate(first):
            groups.setdefault(who[f.key][0], []).append(i)
        args = tuple(self._share(a) for a in args)
        futs = {a: track(client.submit(_run_each, fn, [self.blocks[i] for i in idx], self.n_features,
                                       [tuple(p.items[i] for p in pieces) for i in idx], args, with_rows,
                                       workers=[a], allow_other_workers=True, pure=False))
                for a, idx in groups.items()}
        out: list = [None] * len(first)
        for a, idx in groups.items():
            for i, r in zip(idx, futs[a].result(), strict=True):
                out[i] = r
        return out

    def reduce(self, fn: Any, *pieces: Pieces, args: tuple = (), with_rows: bool = True) -> Any:
        """The sum over row blocks of ``fn(rows, start, *pieces_b, *args)`` (arrays, or tuples of them), in a fixed
        tree, brought to the driver."""
        parts = self.map(fn, *pieces, args=args, with_rows=with_rows).items
        if not parts:
            return None
        while len(parts) > 1:
            nxt = [track(self.client.submit(_add, parts[i], parts[i + 1], pure=False)) if self.client is not None
                   else _add(parts[i], parts[i + 1]) for i in range(0, len(parts) - 1, 2)]
            if len(parts) % 2:
                nxt.append(parts[-1])
            parts = nxt
        return parts[0].result() if self.client is not None else parts[0]


def rows_in_memory(M: Any) -> Any:
    """The raw rows as one SciPy ``csr_array`` in this process, from in-memory blocks (for a store, read its CSR
    row blocks instead: :class:`dufs.engine.rows.Rows`)."""
    if M.residency["mode"] != "driver":
        raise ParameterError(f"the rows of a {M.residency['mode']} matrix are not in this process; give a "
                             f"store or an in-memory matrix")
    import scipy.sparse as sp

    n = M.shape[0]
    parts = [sp.csc_array((b.data, b.indices, b.indptr), shape=(n, b.width)) for b in M.executor.src]
    if not parts:
        return sp.csr_array((n, 0))
    return sp.hstack(parts, format="csr")
