"""How the matrix's products run (part of the executor, :mod:`dufs.engine.executor`): Z^T V as per-block tasks,
per-partition tasks or direct calls, its rows written into one results file where the workers share this machine;
Z U's per-block partials summed by a fixed tree on the workers, or written into one file and summed here."""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np

from dufs import config
from dufs.engine.blocks import block_matvec, block_rmatvec, partition_matvec, partition_matvec_into, partition_rmatvec
from dufs.engine.buffers import buffer
from dufs.engine.direct import DirectFailed
from dufs.engine.dispatch import (
    current_client,
    delayed,
    machines,
    shipped,
    spread,
    tree_sum,
    tree_sum_into,
    tree_sum_machines,
)
from dufs.engine.shm import publish, receiving

__all__ = ["ProductPasses"]


class ProductPasses:
    """The executor's product passes (a mixin of :class:`~dufs.engine.executor.Executor`, whose blocks, placement
    and runs they use)."""

    def rmatvec(self, V2: np.ndarray, classes: int, vsum: Any, tf: list, dt: Any, shape: tuple, dtype: Any,
                gather: bool) -> Any:
        """The (d, p) result of Z^T V, its rows made by the blocks (:func:`~dufs.engine.blocks.block_rmatvec`:
        ``V2``, or the labels with ``classes`` > 0; ``vsum``, ``tf`` the blocks' transforms, ``dt`` the rounding),
        gathered here as ``dtype``; with ``gather`` False a :class:`BlockState` of the blocks' results, left where
        they were made."""
        partitions = self.pass_partitions() if gather else None
        client = current_client()
        with shipped(V2, broadcast=partitions is not None and len(partitions) > 1, shared=True) as Vs:
            if client is not None:  # on to the machines of the blocks, where they are on several
                spread(client, [Vs], self.readers(client))
            if partitions is None:
                f = delayed(block_rmatvec)
                tasks = [f(s, Vs, vsum, tf[i], dt, classes) for i, s in enumerate(self.src)]
                if not gather:
                    return self.run_resident(tasks)
                partitions = [[i] for i in range(self.n_blocks)]
            else:
                got = self._rmatvec_shared(partitions, Vs, vsum, tf, dt, shape, np.dtype(dtype), classes)
                if got is not None:
                    return got
                f = delayed(partition_rmatvec)
                tasks = self._at_homes(client, partitions, lambda u: f(
                    [self.src[i] for i in u], Vs, vsum, [tf[i] for i in u], dt, None, None, classes))
            return self._rows_gathered(tasks, partitions, shape, dtype)

    def _at_homes(self, client: Any, partitions: list[list[int]], make: Any) -> list:
        """``make(partition)`` for each partition, its task pinned (loosely) to the worker that holds its blocks: left
        free, the scheduler may run it elsewhere and move its blocks and its n-row result between machines."""
        import dask

        homes = self.homes(client, partitions) if client is not None and \
            self.residency.get("mode") == "persisted" else [None] * len(partitions)
        out = []
        for g, h in zip(partitions, homes, strict=True):
            with dask.annotate(**({"workers": [h], "allow_other_workers": True} if h else {})):
                out.append(make(g))
        return out

    def _rows_gathered(self, tasks: list, partitions: list[list[int]], shape: tuple, dtype: Any) -> np.ndarray:
        """The pass of ``tasks`` (one a partition, or a block), each result written into its blocks' rows as it
        arrives."""
        bounds = self.bounds
        # one partition holding every block in order (one worker) is the result as it is: taken, not copied
        whole = len(partitions) == 1 and partitions[0] == list(range(self.n_blocks))
        res: list[np.ndarray] = []

        def place(u: int, got: np.ndarray) -> None:
            if whole and got.shape == shape and got.dtype == np.dtype(dtype) and got.flags.c_contiguous \
                    and got.flags.writeable:
                res.append(got)
                return
            if not res:
                res.append(np.empty(shape, dtype))
            o = 0
            for i in partitions[u]:
                a, b = bounds[i], bounds[i + 1]
                res[0][a:b] = got[o:o + b - a]
                o += b - a

        self.run_streaming(tasks, "Z^T V", place)
        return res[0] if res else np.empty(shape, dtype)

    def _rmatvec_shared(self, partitions: list[list[int]], Vs: Any, vsum: Any, tf: list, dt: Any, shape: tuple,
                        dtype: np.dtype, classes: int = 0) -> np.ndarray | None:
        """The partitions' results written by direct calls, else tasks, into one file in /dev/shm, whose array is
        the result, where every worker is on this machine: none of it sent back through the network. None where
        that is not possible (workers elsewhere, shared memory off, /dev/shm full): the caller gathers them."""
        bounds = self.bounds

        def args(into: Any) -> list[tuple]:
            return [([self.src[i] for i in u], Vs, vsum, [tf[i] for i in u], dt, into, [int(bounds[i]) for i in u],
                     classes) for u in partitions]

        for direct in (True, False):
            jobs = self.direct_jobs(partitions) if direct else None
            if direct and jobs is None:
                continue
            try:
                with contextlib.ExitStack() as stack:
                    into = receiving(stack, shape, dtype)
                    if into is None:
                        return None
                    if jobs is not None:
                        self.direct_pass("Z^T V", partition_rmatvec, jobs, args(into.target))
                    else:
                        f = delayed(partition_rmatvec)
                        self.run_streaming([f(*a) for a in args(into.target)], "Z^T V", lambda u, r: None)
                    return into.result()
            except DirectFailed:  # the file dropped (a call may still write into it); the pass again as tasks
                self.placed_at = {}
        return None

    def matvec(self, U2: np.ndarray, inv: np.ndarray | None, tf: list | None, n: int, hold: bool = False
               ) -> Any:
        """X diag(inv) U2 (n, p) (the centring's part is the caller's), summed over the blocks in a fixed tree.
        ``tf``: the blocks' transforms, for direct calls that scale their own rows of U2 by ``inv``. ``hold``:
        where the pass runs as tasks on a distributed client, the sum is left on the worker that made it and its
        future returned (:meth:`~dufs.engine.matrix.Matrix.matvec`)."""
        p = U2.shape[1]
        partitions = self.matvec_partitions(n * p * 8)
        client = current_client()
        out = self._matvec_shared(U2, None, n, p, tf) if partitions is None and not (hold and client) else None
        if out is not None:
            return out
        # each block's rows of U diag(inv) sent to the worker that holds the block (scattered wherever, half of
        # them moved again between two workers before their tasks could start)
        where = self.placed(client)[2] if client is not None and self.residency.get("mode") == "persisted" \
            and self.n_blocks > 1 else None
        Us = U2 * inv[:, None] if inv is not None else U2  # one scaled copy; the blocks' rows are views
        Wb = [Us[b.start:b.stop] for b in self.blocks]
        with shipped(Wb, where=where) as Ws:
            if partitions is None:
                out = None if hold and client else self._matvec_shared(None, Ws, n, p)
                if out is not None:
                    return out
                f = delayed(block_matvec)
                parts = [f(s, Ws[i], n) for i, s in enumerate(self.src)]
            else:
                f = delayed(partition_matvec)
                parts = self._at_homes(client, partitions, lambda g: f([self.src[i] for i in g], [Ws[i] for i in g], n))
            # summed within each machine first, then one partial a machine in a tree (on one machine: the fixed
            # tree of the blocks): the block-order tree sent n x p partials between machines at most of its adds
            # (each machine's partial is zero off its blocks' rows: over three machines only those are sent)
            homes = where if partitions is None else self.homes(client, partitions)
            total = tree_sum(parts) if where is None else \
                tree_sum_machines(parts, homes, client, rows=self._sum_rows(client, partitions, homes, n))
            if hold and client is not None:
                return self.run_held([total], "Z U")[0]
            return self.run([total], "Z U")[0]

    def _matvec_shared(self, Us: np.ndarray | None, Ws: list | None, n: int, p: int, tf: list | None = None
                       ) -> np.ndarray | None:
        """Z U's per-block partial products written by each worker into their slots of one results file in
        /dev/shm and summed here by the same fixed tree as on the workers (the same numbers), where the blocks are
        persisted on workers of this machine and all the partials together take at most
        ``dufs.engine.wide-product-bytes``. None otherwise (the workers sum them).

        With ``Us`` (U whole, and ``tf`` the blocks' transforms when their rows are to be scaled by inv there): one
        direct call a worker over its blocks' rows of ``Us``, shared through /dev/shm; None where that cannot run.
        With ``Ws`` (each block's rows of U diag(inv), shipped): one task a worker."""
        partitions = self.pass_partitions()
        nb = self.n_blocks
        if partitions is None or nb * n * p * 8 > config.parse_bytes(config.get("engine.wide-product-bytes")):
            return None
        jobs = self.direct_jobs(partitions) if Us is not None else None
        if Us is not None and jobs is None:
            return None
        bounds = self.bounds
        try:
            with contextlib.ExitStack() as stack:
                into = receiving(stack, (nb, n, p), np.float64)
                if into is None:
                    return None
                if jobs is not None:
                    try:
                        ref = stack.enter_context(publish(Us))
                    except OSError:  # /dev/shm cannot hold U: the blocks' rows shipped to tasks instead
                        return None
                    args = [([self.src[i] for i in u], [(int(bounds[i]), int(bounds[i + 1])) for i in u],
                             into.target, u, ref, None if tf is None else [tf[i] for i in u]) for u in partitions]
                    self.direct_pass("Z U", partition_matvec_into, jobs, args)
                else:
                    f = delayed(partition_matvec_into)
                    tasks = [f([self.src[i] for i in u], [Ws[i] for i in u], into.target, u) for u in partitions]
                    self.run_streaming(tasks, "Z U", lambda u, r: None)
                # summed in the file's slots, the last level into an array of this process's pool
                return tree_sum_into([into.array[i] for i in range(nb)], buffer((n, p), np.float64))
        except DirectFailed:  # the files dropped (a call may still write into them); the product as tasks
            self.placed_at = {}
            return None

    def matvec_partitions(self, out_bytes: int) -> list[list[int]] | None:
        """For a product Z U whose n_samples x p result is large (``out_bytes`` at least
        ``dufs.engine.wide-product-bytes``) under a distributed client: the blocks in one partition per worker (its
        persisted blocks together), each partition one task that accumulates its blocks into a single n x p buffer, so a
        worker holds one such buffer at a time instead of a partial per block waiting for the tree. The sum then
        depends on the number of workers (rounding only); below the bound, one partial per block in a fixed tree.
        On workers of several machines always (the sum depends on the blocks' machines there already,
        :func:`~dufs.engine.dispatch.tree_sum_machines`): a pass costs a few tasks a worker, not a few a block."""
        client = current_client()
        if client is None:
            return None
        if out_bytes < config.parse_bytes(config.get("engine.wide-product-bytes")):
            if self.residency.get("mode") != "persisted" or self.n_blocks < 2 or len(machines(client)) < 2:
                return None
            return self.placed(client)[1]
        n_workers = max(1, len(client.scheduler_info(n_workers=-1)["workers"]))
        return self.partition(n_workers)
