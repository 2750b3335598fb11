"""How a pass over a matrix's feature blocks runs: the engine's one executor (docs/architecture.md, "The
engine").

A :class:`~dufs.engine.matrix.Matrix` says what a pass computes: the function, its blocks and arguments, how the
results combine. Its :class:`Executor` decides, in this one place, how the pass runs:

- **inline**: in this process, block after block, no Dask graph (a small matrix and no distributed client);
- **tasks**: one Dask task a block, or one a partition (a worker's persisted blocks together) where the results
  are gathered;
- **direct calls**: each partition's function called on the worker that holds its blocks
  (:mod:`dufs.engine.direct`), with the state a solver keeps beside them;
- **results through /dev/shm**: where every worker is on this machine, the partitions write their part of the
  result into one file that this process maps (:mod:`dufs.engine.shm`).

A later kind falls back to an earlier one where it cannot run (workers on other machines, shared memory or direct
passes switched off, blocks moved). Arguments travel as :mod:`dufs.engine.dispatch` ships them, and the engine
resolves shared ones before it calls a method's function, which sees plain NumPy arrays. The product passes are in
:mod:`dufs.engine.products`, the passes with state in :mod:`dufs.engine.stateful`.
"""

from __future__ import annotations

import contextlib
import functools
import time
from typing import Any

import numpy as np

from dufs import config
from dufs._logging import get_logger
from dufs.engine.blocks import BlockInfo, PerBlock, nnz_of
from dufs.engine.buffers import clear as clear_buffers
from dufs.engine.direct import direct_eligible, flush_drops, release_resident, run_on_holders
from dufs.engine.dispatch import compute, current_client, delayed, forget, inline_pass, is_inline, scatter_to, track
from dufs.engine.placement import partition, persist_blocks, valued_sources
from dufs.engine.products import ProductPasses
from dufs.engine.progress import report, run_pass, run_pass_streaming
from dufs.engine.state import BlockState
from dufs.engine.stateful import StatePasses
from dufs.errors import ParameterError

__all__ = ["Executor", "inline_when_small"]

log = get_logger(__name__)

#: seconds a gathered pass reuses the blocks' placement before it asks the scheduler again
_PLACEMENT_TTL = 30.0


class Executor(ProductPasses, StatePasses):
    """The passes over one set of feature blocks, wherever they live: ``src`` the blocks' sources (in-memory blocks,
    store blocks, delayed blocks of a Dask array, or futures once persisted), ``blocks`` their
    :class:`~dufs.engine.blocks.BlockInfo` and ``residency`` the record of where they are between passes. Shared by
    a matrix and its ``with_standardize`` views, which so count their passes together and release once."""

    def __init__(self, src: list, blocks: list[BlockInfo], residency: dict) -> None:
        self.src = src
        self.blocks = blocks
        self.residency = residency
        self.passes = 0
        self.placed_at: dict = {}  # client id -> (when, the partitions one a worker, the worker of each block)
        self.kept: list = []  # state items direct calls kept on the workers (release())
        self.transforms: dict = {}  # (standardize, statistics, client id) -> the blocks' transforms, scattered

    @property
    def n_blocks(self) -> int:
        return len(self.blocks)

    @property
    def bounds(self) -> np.ndarray:
        """Block boundaries: block i covers features ``bounds[i]:bounds[i+1]``."""
        return np.array([0] + [b.stop for b in self.blocks], dtype=np.int64)

    # ------------------------------------------------------------------ running a pass
    def run(self, tasks: list, name: str = "pass") -> list:
        """One pass: the results of ``tasks`` (one a block or partition), in order."""
        self.passes += 1
        return run_pass(name, tasks, inline=is_inline())

    def run_held(self, tasks: list, name: str = "pass") -> list:
        """A pass whose results stay where they were made: their futures once complete (the error of one that
        failed raised here), on the current distributed client; its progress reported as a pass's."""
        from dufs.engine.stateful import _held

        client = current_client()
        self.passes += 1
        report(name, 0, len(tasks))
        out = _held(client, track(client.compute(tasks)))
        report(name, len(tasks), len(tasks))
        return out

    def run_streaming(self, tasks: list, name: str, consume: Any) -> None:
        """A pass whose results go to ``consume(i, result)`` as they arrive (:func:`run_pass_streaming`)."""
        self.passes += 1
        run_pass_streaming(name, tasks, consume, inline=is_inline())

    def run_resident(self, tasks: list) -> BlockState:
        """A pass whose per-block results stay on the workers (a BlockState of futures), or in this process."""
        client = current_client()
        self.passes += 1
        if client is None:
            return BlockState(compute(tasks))
        from distributed import wait

        futures = track(client.compute(tasks))
        wait(futures)
        return BlockState(futures, client)

    def direct_pass(self, name: str, fn: Any, jobs: dict[str, list[int]], args: list[tuple], fetch: bool = False
                    ) -> dict[str, list]:
        """A pass whose partitions' ``fn(*args[u])`` run as direct calls on the workers in ``jobs``
        (:func:`~dufs.engine.direct.run_on_holders`), counted and reported as a pass; raises
        :class:`~dufs.engine.direct.DirectFailed`."""
        total = len(args)
        report(name, 0, total)
        got = run_on_holders(current_client(), fn, {a: [args[u] for u in us] for a, us in jobs.items()}, fetch)
        self.passes += 1
        report(name, total, total)
        return got

    def inline(self) -> bool:
        """Whether a pass runs inline: no distributed client, the blocks in this process or in a local store, and
        at most ``dufs.engine.inline-nnz`` nonzeros (a pass over them takes about what Dask spends building and
        running its graph)."""
        if self.residency.get("mode") not in ("driver", "store") or any(b.nnz < 0 for b in self.blocks):
            return False
        return sum(b.nnz for b in self.blocks) <= int(config.get("engine.inline-nnz")) and current_client() is None

    def count_nnz(self) -> None:
        """The blocks' nonzeros (and bytes, where not known), by a pass: a Dask array's are known only so."""
        f = delayed(nnz_of)
        got = compute([f(s) for s in self.src])
        self.blocks = [BlockInfo(b.start, b.stop, int(c)) for b, (c, _) in zip(self.blocks, got, strict=True)]
        if self.residency.get("bytes") is None:
            self.residency["bytes"] = int(sum(nb for _, nb in got))

    def valued(self, values: str, row_scale: np.ndarray | None = None) -> Executor:
        """An executor of its own over these blocks with their values read as ``values`` says, and each value
        multiplied by ``row_scale`` at its row where given (:func:`~dufs.engine.placement.valued_sources`):
        persisted blocks give persisted blocks beside them, on their workers (which it releases), where both fit;
        the others (and persisted blocks where the copies would not fit), sources that transform each block where
        it is loaded, each pass."""
        client = current_client()  # persisted blocks' copies are made there; store blocks' row scale goes there
        persisted = client is not None and self.residency.get("mode") == "persisted"
        where = self.placement() if persisted else [None] * self.n_blocks
        src, residency = valued_sources(self.src, values, self.residency, where, client, row_scale)
        return Executor(src, list(self.blocks), residency)

    # ------------------------------------------------------------------ residency
    def persist(self, client: Any, fraction: float) -> bool:
        """Load the blocks into ``client``'s workers' memory when they fit in ``fraction`` of it
        (:func:`~dufs.engine.placement.persist_blocks`); whether they were."""
        values, rows = self.residency.get("values"), self.residency.get("rows")
        src, blocks, self.residency = persist_blocks(client, self.src, self.blocks, self.residency, fraction)
        if values is not None:  # blocks read with their values transformed (Matrix(values=...)) stay so
            self.residency["values"] = values
        if rows is not None:
            self.residency["rows"] = rows
        if src is None:
            log.info("%s", self.residency["reason"])
            return False
        self.src, self.blocks = src, blocks
        self.placed_at = {}
        if self.residency["bytes"] is None or any(b.nnz < 0 for b in self.blocks):
            self.count_nnz()
        log.info("persisted %d feature blocks (%s MiB) on %d workers", self.n_blocks,
                 f"{self.residency['bytes'] / 2**20:,.1f}", self.residency["n_workers"])
        return True

    def release(self) -> None:
        """Drop everything the passes left: this process's pooled /dev/shm files and pass outputs (here and on the
        workers), the block states direct calls kept on the workers, persisted blocks and the scattered
        transforms."""
        from dufs.engine.shm import release_files

        release_files()
        clear_buffers()
        # a solver's last state may not have been released: dropped now, not left on a cluster that outlives us
        release_resident(self.kept)
        self.kept.clear()
        client = current_client()
        flush_drops(client)
        for s in self.src:
            if hasattr(s, "release"):
                s.release()
        forget(client, [f for futs in self.transforms.values() for f in futs])
        self.transforms.clear()
        if client is not None:
            with contextlib.suppress(Exception):  # a cluster closing or gone keeps no pools
                client.run(clear_buffers)

    # ------------------------------------------------------------------ placement
    def placement(self) -> list[str | None]:
        """The worker address holding each block (persisted blocks); None for every block otherwise."""
        client = current_client()
        if client is None or self.residency.get("mode") != "persisted":
            return [None] * self.n_blocks
        who = client.who_has(self.src)
        return [min(who.get(s.key) or [None], key=lambda a: a or "") for s in self.src]

    def partition(self, n: int, where: list[str | None] | None = None) -> list[list[int]]:
        """The blocks cut into ``n`` partitions, balanced by nonzeros, a worker's persisted blocks together
        (:func:`dufs.engine.placement.partition`; ``where``: :meth:`placement`, asked when not given)."""
        return partition([b.nnz for b in self.blocks], self.placement() if where is None else where, n)

    def placed(self, client: Any) -> tuple[float, list[list[int]] | None, list[str | None]]:
        """(when asked, the partitions one a worker or None, the worker of each block) for persisted blocks,
        asked of the scheduler again only after _PLACEMENT_TTL seconds (a block moved since, by a lost worker or a
        rebalance, runs where its partition runs: correct, only slower)."""
        now = time.monotonic()
        got = self.placed_at.get(client.id)
        if got is None or now - got[0] > _PLACEMENT_TTL:
            where = self.placement()
            owners = {a for a in where if a is not None}
            got = (now, None if not owners or None in where else self.partition(len(owners), where), where)
            self.placed_at = {client.id: got}
        return got

    def pass_partitions(self) -> list[list[int]] | None:
        """The blocks grouped one partition a worker (a worker's persisted blocks together) for a pass whose
        per-block results are gathered: one task and one result a worker instead of one a block. None when the
        blocks are not persisted on a distributed cluster (one task a block)."""
        if self.residency.get("mode") != "persisted" or self.n_blocks < 2:
            return None
        client = current_client()
        return None if client is None else self.placed(client)[1]

    def readers(self, client: Any) -> list[str | None]:
        """The workers a pass over every block runs on: those holding the persisted blocks ([None]: not known)."""
        return self.placed(client)[2] if self.residency.get("mode") == "persisted" else [None]

    def homes(self, client: Any, partitions: list[list[int]] | None) -> list[str | None]:
        """The worker of each block (``partitions`` None) or partition: the one holding most of its blocks' nonzeros
        (persisted blocks; None for each otherwise)."""
        where = self.placed(client)[2]
        if partitions is None:
            return where
        out: list[str | None] = []
        for q in partitions:
            nnz: dict[str, int] = {}
            for i in q:
                if where[i] is not None:
                    nnz[where[i]] = nnz.get(where[i], 0) + int(self.blocks[i].nnz)
            out.append(max(sorted(nnz), key=nnz.__getitem__) if nnz else None)
        return out

    def direct_ok(self, client: Any) -> bool:
        """Whether direct calls may run over these blocks at all (direct passes on, blocks persisted)."""
        return direct_eligible(client) and self.residency.get("mode") == "persisted"

    def direct_jobs(self, partitions: list[list[int]]) -> dict[str, list[int]] | None:
        """``{worker address: [partition number, ...]}`` for a pass run as direct calls on the workers that hold
        each partition's blocks, or None where it cannot be (no client, direct passes off, a partition's blocks on
        more than one worker or on none)."""
        client = current_client()
        if not self.direct_ok(client):
            return None
        where = self.placed(client)[2]
        jobs: dict[str, list[int]] = {}
        for u, blocks in enumerate(partitions):
            owners = {where[i] for i in blocks}
            if len(owners) != 1 or None in owners:
                return None
            jobs.setdefault(owners.pop(), []).append(u)
        return jobs

    # ------------------------------------------------------------------ arguments
    def check_partitions(self, partitions: Any) -> list[list[int]]:
        """``Matrix.map_blocks``'s ``partitions`` checked: lists of block indices, each block in exactly one."""
        try:
            parts = [[int(i) for i in g] for g in partitions]
        except TypeError:
            raise ParameterError("The 'partitions' parameter of map_blocks must be a list of lists of block "
                                 "indices.") from None
        flat = [i for g in parts for i in g]
        if any(not g for g in parts) or sorted(flat) != list(range(self.n_blocks)):
            raise ParameterError(f"The 'partitions' parameter of map_blocks must split the {self.n_blocks} blocks "
                                 f"into non-empty partitions, each block in exactly one; got {partitions!r}.")
        return parts

    def block_item(self, a: Any, i: int) -> Any:
        """Block ``i``'s item of a :class:`PerBlock` argument (its list item, or its slice over the block's
        features); any other argument as it is."""
        if not isinstance(a, PerBlock):
            return a
        v, b = a.value, self.blocks[i]
        if isinstance(v, list | tuple):
            if len(v) != self.n_blocks:
                raise ParameterError(f"a PerBlock list must have one item per block ({self.n_blocks}); got {len(v)}")
            return v[i]
        return v[b.start:b.stop]

    def scatter_per_block(self, a: Any, where: list | None = None) -> Any:
        """A large :class:`PerBlock` array under a distributed client, as one scattered key per block (its slice):
        literal slices would make a large graph, which the scheduler keeps after the pass. ``where``: the worker of
        each block, where its slice goes (else anywhere)."""
        if not isinstance(a, PerBlock) or not isinstance(a.value, np.ndarray) or a.value.nbytes < 1 << 20:
            return a
        client = current_client()
        if client is None:
            return a
        v = a.value
        slices = [np.ascontiguousarray(v[b.start:b.stop]) for b in self.blocks]
        return PerBlock(scatter_to(client, slices, where) if where and None not in where else
                        track(client.scatter(slices, hash=False)))

    def block_transforms(self, args: list[tuple], key: tuple) -> list:
        """The blocks' parts ``args`` of a transform, kept under ``key``: under a distributed client scattered
        once (keys, not literals, in every pass's graph), each to the worker that holds its block where they are
        persisted (a pass run as direct calls reads it there); else ``args`` as they are."""
        client = current_client()
        if client is None:
            return args
        key = (*key, client.id)
        got = self.transforms.get(key)
        # a piece whose worker was lost is gone for good (scattered: nothing to recompute it from), and every pass
        # that named it would fail "lost dependencies": scattered again
        if got is not None and any(getattr(f, "status", "finished") != "finished" for f in got):
            del self.transforms[key]
        if key not in self.transforms:
            where = self.placed(client)[2] if self.residency.get("mode") == "persisted" else None
            self.transforms[key] = scatter_to(client, args, where) if where and None not in where else \
                track(client.scatter(args, hash=False))
        return self.transforms[key]


def inline_when_small(method):
    """Run a matrix method's passes inline (in this process, block after block, no graph) where its executor says
    they should (:meth:`Executor.inline`)."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        with inline_pass(self.executor.inline()):
            return method(self, *args, **kwargs)

    return wrapper
