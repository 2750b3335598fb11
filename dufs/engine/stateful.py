"""How ``Matrix.map_blocks`` runs (part of the executor, :mod:`dufs.engine.executor`): one task a block or a
partition, or, with state kept beside the blocks, direct calls on the workers that hold them
(:mod:`dufs.engine.direct`) where every worker is on this machine, else tasks pinned to the blocks' workers."""

from __future__ import annotations

import uuid
from typing import Any

import dask

from dufs.engine.blocks import PerBlock, map_group, map_one, map_state
from dufs.engine.direct import (
    DirectFailed,
    HeldLost,
    Resident,
    flush_drops,
    map_resident,
    map_resident_task,
    release_resident,
    take_drops,
)
from dufs.engine.dispatch import (
    compute,
    current_client,
    delayed,
    ship,
    shippable,
    spread,
    track,
    tree_sum,
    tree_sum_machines,
    tree_sum_values,
)
from dufs.engine.exchange import HeldPieces, ScatteredSum
from dufs.engine.progress import report
from dufs.engine.state import BlockState
from dufs.engine.touched import PerPartition, Pieced, machine_vectors, sum_rows, touched_rows_on

__all__ = ["StatePasses"]

#: a direct call's result this large comes back through /dev/shm (a greedy step's attached columns): otherwise it
#: comes back through the scheduler
_SPILL_BYTES = 256 << 10


class StatePasses:
    """The executor's ``map_blocks`` passes (a mixin of :class:`~dufs.engine.executor.Executor`)."""

    def map(self, fn: Any, args: tuple, kwargs: dict, state: Any, reduce: str | None, partitions: list | None,
            name: str, hold: bool = False, rows: int = 0) -> Any:
        """``Matrix.map_blocks`` (checked there): ``fn`` over every block, or every partition of ``partitions``;
        ``state`` a list of the blocks' or partitions' items (or None); ``hold``: the sum's future where it is
        made by tasks; ``rows`` > 0: the results are that many rows, zero off their blocks' rows (a sum over
        machines sends only those)."""

        args = self._touched_args(args, state, partitions)

        def pick(a: Any, u: int) -> Any:
            if isinstance(a, PerPartition):
                return a.value[u]
            if partitions is None:
                return self.block_item(a, u)
            return [self.block_item(a, i) for i in partitions[u]] if isinstance(a, PerBlock) else a

        srcs = list(self.src) if partitions is None else [[self.src[i] for i in q] for q in partitions]
        if state is not None and self._resident_tasks(state, partitions):
            shared = [self.scatter_per_block(ship(a, every=True)) for a in args]
            kw = {k: self.scatter_per_block(ship(v, every=True)) for k, v in kwargs.items()}
            return self._map_resident_tasks(
                fn, srcs, state, lambda u: (tuple(pick(a, u) for a in shared), {k: pick(v, u) for k, v in kw.items()}),
                partitions, reduce, name, hold, rows)
        if state is not None:
            got = self._map_direct(fn, srcs, state, args, kwargs, partitions, reduce, pick, name)
            if not isinstance(got, str):
                return got
            resident = [i for i in state if isinstance(i, Resident)]
            if resident:  # dropped now (its memory back before the solver rebuilds it), then said lost
                release_resident(resident)
                flush_drops(current_client())
                raise HeldLost(f"the block state kept on the workers by direct calls was lost: {got}")
        # an argument that is not per block is read by every task: one copy a machine
        shared = [self.scatter_per_block(ship(a, every=True)) for a in args]
        kw = {k: self.scatter_per_block(ship(v, every=True)) for k, v in kwargs.items()}

        def task_args(u: int) -> tuple:
            return tuple(pick(a, u) for a in shared), {k: pick(v, u) for k, v in kw.items()}

        if state is None:
            client = current_client()
            if client is not None:  # the arguments every task reads on to the machines of the blocks
                spread(client, _futures((shared, kw)), self.readers(client))
            f = delayed(map_one if partitions is None else map_group)
            tasks = [f(fn, s, *task_args(u)) for u, s in enumerate(srcs)]
            if reduce == "sum":
                return self.run([tree_sum(tasks)], name)[0] if tasks else None
            return self.run(tasks, name)
        return self._map_tasks(fn, srcs, state, task_args, partitions, reduce, name, hold, rows)

    def _touched_args(self, args: tuple, state: Any, partitions: list | None) -> tuple:
        """``args`` with each :class:`~dufs.engine.touched.Pieced` vector given as the rows each machine's blocks
        touch (a :class:`PerPartition` of one future a machine) where the blocks are on several machines, else as
        the vector joined on one worker (sent on to the machines of the blocks)."""
        if not any(isinstance(a, Pieced) for a in args):
            return args
        from distributed.comm import get_address_host

        client = current_client()
        if self.residency.get("mode") != "persisted":
            return tuple(a.whole(client) if isinstance(a, Pieced) else a for a in args)
        homes = self.homes(client, partitions)
        if state is not None:  # where a partition's task runs: beside its state, where that is kept
            homes = [it.address if isinstance(it, Resident) else h for it, h in zip(state, homes, strict=True)]
        hosts = None if None in homes else [get_address_host(h) for h in homes]
        if hosts is None or len(set(hosts)) < 2 or not touched_rows_on():
            return tuple(a.whole(client) if isinstance(a, Pieced) else a for a in args)
        groups = [[u] for u in range(self.n_blocks)] if partitions is None else partitions
        out = []
        for a in args:
            if isinstance(a, Pieced):
                got = machine_vectors(self, client, a, groups, hosts, homes)
                a = a.whole(client) if got is None else PerPartition(got)
            out.append(a)
        return tuple(out)

    def _sum_rows(self, client: Any, partitions: list | None, home: list, rows: int) -> Any:
        """:func:`~dufs.engine.touched.sum_rows` for a pass's results of ``rows`` rows (0: not zero off their
        blocks' rows) made on ``home``, or None."""
        if not rows or client is None or None in home or self.residency.get("mode") != "persisted":
            return None
        groups = [[u] for u in range(self.n_blocks)] if partitions is None else partitions
        return sum_rows(self, client, groups, home, rows)

    def _map_tasks(self, fn: Any, srcs: list, items: list, task_args: Any, partitions: list | None,
                   reduce: str | None, name: str, hold: bool = False, rows: int = 0) -> tuple:
        """``map`` with state as tasks, each pinned (loosely) to the worker of its blocks, the new state left there;
        reported as one pass (its start and end: the results are gathered together)."""
        from operator import getitem

        n = len(srcs)
        f = delayed(map_state)
        g = delayed(getitem, pure=True)
        client = current_client()
        home = self.homes(client, partitions) if client is not None else [None] * n
        if client is not None:  # the arguments every task reads on to the machines of the partitions
            spread(client, _futures([task_args(u) for u in range(n)]), home)
        new, res = [], []
        for u, s in enumerate(srcs):
            # a partition's (or block's) task and the two picks of its output on the worker of its blocks: left
            # free, a pick could run on the other worker and pull the whole (state, result) pair across
            with dask.annotate(**({"workers": [home[u]], "allow_other_workers": True} if home[u] else {})):
                p = f(fn, s, items[u], *task_args(u))
                new.append(g(p, 0))
                res.append(g(p, 1))
        self.passes += 1
        report(name, 0, n)
        if client is None:
            got = compute(new + res)
            report(name, n, n)
            return (tree_sum_values(got[n:]) if reduce == "sum" else got[n:], BlockState(got[:n]))
        total = _total(res, home, client, reduce, hold, self._sum_rows(client, partitions, home, rows))
        futs = track(client.compute(new + _wanted(total, res)))
        out = _results(client, futs[n:], total, hold)
        report(name, n, n)
        return (out[0] if reduce == "sum" else out), BlockState(futs[:n], client)

    def _resident_tasks(self, items: list, partitions: list | None) -> bool:
        """Whether ``map`` with state runs as :meth:`_map_resident_tasks`: a distributed client whose results do not
        come back through /dev/shm (workers elsewhere, or shared memory off), ``dufs.engine.resident-state`` on,
        the blocks persisted with known workers, and the state items all kept on the workers or all plain values
        (none a future of the tasks' path)."""
        from distributed import Future

        from dufs import config
        from dufs.engine.shm import results_local

        client = current_client()
        if client is None or results_local(client) or self.residency.get("mode") != "persisted":
            return False
        if str(config.get("engine.resident-state")).lower() in ("off", "false", "no", "never"):
            return False
        if any(isinstance(i, Future) for i in items):
            return False
        kept = [isinstance(i, Resident) for i in items]
        return (all(kept) or not any(kept)) and None not in self.homes(client, partitions)

    def _map_resident_tasks(self, fn: Any, srcs: list, items: list, task_args: Any, partitions: list | None,
                            reduce: str | None, name: str, hold: bool = False, rows: int = 0) -> tuple:
        """``map`` with state as one task a partition (or block), each on the worker of its blocks (or of its
        state, where kept on the workers), which keeps the new state in its memory
        (:func:`~dufs.engine.direct.map_resident_task`) and returns only the result: one task a partition where
        the state as futures took three (the call, and its state and result picked apart). The results summed by
        the workers (``reduce``: within each machine, then over the machines) or gathered."""
        client = current_client()
        n = len(srcs)
        home = [it.address if isinstance(it, Resident) else h
                for it, h in zip(items, self.homes(client, partitions), strict=True)]
        spread(client, _futures([task_args(u) for u in range(n)]), home)
        drops = take_drops(set(home))
        taken = [Resident(t, a) for a, ts in drops.items() for t in ts]
        tokens = [uuid.uuid4().hex for _ in srcs]
        f = delayed(map_resident_task)
        res = []
        for u, s in enumerate(srcs):
            a, kw = task_args(u)
            # a worker's released items go with its first task; a task runs elsewhere only if its worker is gone
            with dask.annotate(workers=[home[u]], allow_other_workers=True):
                res.append(f(fn, s, items[u], a, kw, tokens[u], drops.pop(home[u], [])))
        self.passes += 1
        report(name, 0, n)
        total = _total(res, home, client, reduce, hold, self._sum_rows(client, partitions, home, rows))
        futs = track(client.compute(_wanted(total, res)))
        try:
            out = _results(client, futs, total, hold)
        except Exception:  # the new items (some may be kept) and the released ones (perhaps not dropped) again
            release_resident([Resident(t, a) for t, a in zip(tokens, home, strict=True)] + taken)
            # asked again next pass: after a lost worker the cached placement names it, and a rebuilt state would
            # be recorded there while its tasks ran elsewhere (every later pass then lost it again)
            self.placed_at = {}
            raise
        report(name, n, n)
        kept = [Resident(tokens[u], home[u]) for u in range(n)]
        self.kept.extend(kept)
        return (out[0] if reduce == "sum" else out), BlockState(kept, client)

    def _direct_homes(self, client: Any, items: list, partitions: list | None) -> tuple | str:
        """(jobs, the worker of each partition, the worker of each block, whether calls fetch moved blocks) for
        :meth:`_map_direct`, or why it cannot run."""
        blocks_of = partitions if partitions is not None else [[i] for i in range(self.n_blocks)]
        resident = any(isinstance(i, Resident) for i in items)
        if resident and all(isinstance(it, Resident) for it in items) and self.direct_ok(client):
            # each partition where its state is kept: a block that moved meanwhile is fetched back by the call
            # (dufs.engine.direct); the state goes only with its worker
            jobs: dict[str, list[int]] = {}
            home = {}
            for u, it in enumerate(items):
                jobs.setdefault(it.address, []).append(u)
                home[u] = it.address
            partition_of = {i: u for u, bs in enumerate(blocks_of) for i in bs}
            return jobs, home, [home[partition_of[i]] for i in range(self.n_blocks)], True
        jobs = self.direct_jobs(blocks_of)
        if jobs is None:
            return "its blocks are not on one worker a partition, or direct passes are switched off"
        home = {u: a for a, us in jobs.items() for u in us}
        if resident and not all(not isinstance(it, Resident) or it.address == home[u] for u, it in enumerate(items)):
            return "part of its state is kept on the workers and part is not"
        return jobs, home, self.placed(client)[2], False

    def _map_direct(self, fn: Any, srcs: list, items: list, args: tuple, kwargs: dict, partitions: list | None,
                    reduce: str | None, pick: Any, name: str) -> tuple | str:
        """``map`` with state as direct calls: each partition's ``fn(blocks, state, ...)`` called on the worker that
        holds its blocks, the new state kept in that worker's memory (a :class:`~dufs.engine.direct.Resident` item
        a partition), the results brought back and (``reduce``) summed here by the workers' fixed tree. Why it cannot
        run, where it cannot (the caller runs tasks, or, over state kept by direct calls, says it was lost); a call
        that fails over state kept that way raises the worker's error."""
        from dufs.engine.shm import results_local, take_result

        client = current_client()
        resident = any(isinstance(i, Resident) for i in items)
        # on workers of this machine only: a call's result goes through the scheduler unless it comes back through
        # /dev/shm, where tasks send theirs straight back. State kept by direct calls says they ran here before
        if not resident and not results_local(client):
            return "the workers are not all on this machine"
        homes = self._direct_homes(client, items, partitions)
        if isinstance(homes, str):
            return homes
        jobs, home, where, follow = homes
        got = self._direct_args(client, jobs, where, args, kwargs, resident)
        if isinstance(got, str):
            return got
        dargs, dkw = got
        tokens = [uuid.uuid4().hex for _ in srcs]
        calls = [(fn, s, items[u], tuple(pick(a, u) for a in dargs), {k: pick(v, u) for k, v in dkw.items()},
                  tokens[u], _SPILL_BYTES) for u, s in enumerate(srcs)]
        try:
            got = self.direct_pass(name, map_resident, jobs, calls, fetch=follow)
        except DirectFailed as exc:
            self.placed_at = {}
            if resident:  # the state is on the workers only: the worker's own error (lost, or a real one)
                raise exc.__cause__ from None
            return f"a call failed ({exc})"
        res: list = [None] * len(srcs)
        for a, us in jobs.items():
            for u, r in zip(us, got[a], strict=True):
                res[u] = take_result(r)
        out = tree_sum_values(res) if reduce == "sum" else res
        kept = [Resident(tokens[u], home[u]) for u in range(len(srcs))]
        self.kept.extend(kept)
        return out, BlockState(kept, client)

    def _direct_args(self, client: Any, jobs: dict, where: list, args: tuple, kwargs: dict, resident: bool
                     ) -> tuple | str:
        """The direct calls' arguments: each block's slice of a :class:`PerBlock` on its block's worker, other large
        arguments on every worker called, futures the caller gave checked to be there (their values sent with the
        calls where the state is kept on the workers); or why the calls cannot run."""

        def place(a: Any) -> Any:
            if isinstance(a, PerBlock):
                return self.scatter_per_block(a, where)
            return track(client.scatter(a, hash=False, broadcast=True)) if shippable(a) else a

        dargs = [place(a) for a in args]
        dkw = {k: place(v) for k, v in kwargs.items()}
        given = _futures((args, kwargs))
        if given:
            who = client.who_has(given)
            missing = [f for f in given if not set(jobs) <= set(who.get(f.key, ()))]
            if missing and not resident:
                return "an argument is not on every worker called"
            if missing:
                values = dict(zip([f.key for f in missing], client.gather(missing), strict=True))
                dargs = [_by_value(a, values) for a in dargs]
                dkw = {k: _by_value(v, values) for k, v in dkw.items()}
        return dargs, dkw


def _total(res: list, home: list, client: Any, reduce: str | None, hold: Any, rows: Any = None) -> Any:
    """The sum of the tasks' results over the machines (``reduce="sum"``; ``hold="pieces"``: a reduce-scatter's
    left in its pieces; ``rows``: each machine's touched rows only), or None."""
    if reduce != "sum":
        return None
    return tree_sum_machines(res, home, client, pieces=hold == "pieces", rows=rows)


def _wanted(total: Any, res: list) -> list:
    """What a pass computes: the sum's pieces, the sum, or every task's result (``total`` None)."""
    if isinstance(total, ScatteredSum):
        return total.sums
    return res if total is None else [total]


def _results(client: Any, futs: list, total: Any, hold: Any) -> list:
    """The pass's results from its futures: a :class:`HeldPieces` of a sum left in pieces, the futures left where
    they are (``hold``), or their values."""
    if isinstance(total, ScatteredSum):
        return [HeldPieces(_held(client, futs), total.receivers)]
    return _held(client, futs) if hold else client.gather(futs)


def _held(client: Any, futs: list) -> list:
    """``futs`` once they have completed, left where they are (``map_blocks(hold=True)``); the error of the
    first that failed raised, as a gather raises it."""
    from distributed import wait

    wait(futs)
    for f in futs:
        if f.status != "finished":
            f.result()  # raises its error (or says it was cancelled)
    return list(futs)


def _futures(x: Any) -> list:
    """The ``distributed.Future`` objects within ``x`` (lists, tuples, dicts, :class:`PerBlock`)."""
    from distributed import Future

    if isinstance(x, Future):
        return [x]
    if isinstance(x, PerBlock | PerPartition):
        return _futures(x.value) if isinstance(x.value, list | tuple) else []
    if isinstance(x, dict):
        x = list(x.values())
    if isinstance(x, list | tuple):
        return [f for v in x for f in _futures(v)]
    return []


def _by_value(x: Any, values: dict) -> Any:
    """``x`` with the futures whose keys are in ``values`` replaced by those values (within lists, tuples and
    :class:`PerBlock`)."""
    from distributed import Future

    if isinstance(x, Future):
        return values.get(x.key, x)
    if isinstance(x, PerBlock):
        return PerBlock(_by_value(x.value, values)) if isinstance(x.value, list | tuple) else x
    if isinstance(x, list | tuple):
        return type(x)(_by_value(v, values) for v in x)
    return x

