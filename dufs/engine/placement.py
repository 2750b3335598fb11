"""Where blocks go and how they are grouped: the placement of persisted blocks on the workers, and the
partitions (groups of blocks, one task each) that solvers such as MMFS's DCD run over."""

from __future__ import annotations

import uuid
from typing import Any

import numpy as np

from dufs import config
from dufs.engine.blocks import materialize
from dufs.errors import ParameterError

__all__ = ["partition", "persist_blocks", "plan_placement", "runs"]


def persist_blocks(client: Any, src: list, blocks: list, residency: dict, fraction: float) -> tuple[list | None,
                                                                                                       dict]:
    """Load blocks (``src``: their sources, ``blocks``: their :class:`~dufs.engine.blocks.BlockInfo`) into the
    workers' memory, placed by :func:`plan_placement`, when they fit in ``fraction`` of the cluster's memory.
    Returns the futures (None when they do not fit, or are not known to: left to be re-read each pass) and the new
    residency record. A cluster without workers yet is waited for (``dufs.engine.wait-for-workers``)."""
    workers = sorted(client.scheduler_info(n_workers=-1)["workers"].items())
    if not workers:
        # a cluster that is starting, scaling up or restarting a worker: wait for one rather than fail
        wait = config.get("engine.wait-for-workers")
        try:
            client.wait_for_workers(1, timeout=wait)
        except TimeoutError:
            raise ParameterError(f"the Dask cluster at {client.scheduler.address} has no workers (waited "
                                 f"{wait}, dufs.engine.wait-for-workers)") from None
        workers = sorted(client.scheduler_info(n_workers=-1)["workers"].items())
    memory = sum(int(w.get("memory_limit") or 0) for _, w in workers)
    need = residency.get("bytes")
    mode = residency["mode"]
    if mode != "source" and memory and need is not None and need > fraction * memory:
        return None, {"mode": "store" if mode == "store" else mode, "bytes": need, "cluster_memory": memory,
                      "reason": f"not persisted: {need / 2**20:,.0f} MiB exceeds {fraction:.0%} of the cluster's "
                                f"{memory / 2**20:,.0f} MiB; blocks are re-read each pass"}
    place = plan_placement([b.nnz if b.nnz >= 0 else b.width for b in blocks], [a for a, _ in workers])
    from dask.delayed import Delayed
    from distributed import wait

    token = uuid.uuid4().hex[:12]
    futures = []
    for i, s in enumerate(src):
        key = f"dufs-block-{token}-{i}"
        if isinstance(s, Delayed):
            futures.append(client.compute(s, workers=[place[i]], allow_other_workers=True))
        else:
            futures.append(client.submit(materialize, s, key=key, workers=[place[i]], allow_other_workers=True,
                                         pure=False))
    wait(futures)
    # the placement was for loading them: a block that dask recomputes after its worker was lost may go to any
    # worker. Kept, the restriction to an address that no longer exists stalls the block for good once it has gone
    # to "no-worker" (no worker running at that moment: both of a 2-worker cluster lost at once); distributed then
    # starts such a task on a worker that joins only when that worker is one it was restricted to, loose or not
    client.sync(client.scheduler.set_restrictions, worker={f.key: None for f in futures})
    return futures, {"mode": "persisted", "bytes": need, "cluster_memory": memory, "n_workers": len(workers),
                     "reason": "persisted in the workers' memory, balanced by nonzeros"}


def plan_placement(est: list[int], workers: list[str]) -> dict[int, str]:
    """Block index -> worker address: greedy by nonzeros (largest first) onto the least loaded worker, a fixed,
    balanced placement (``est``: each block's nonzeros, or its width when unknown)."""
    load = {addr: 0 for addr in workers}
    place = {}
    for i in sorted(range(len(est)), key=lambda i: (-est[i], i)):
        addr = min(load, key=lambda a: (load[a], a))
        place[i] = addr
        load[addr] += max(est[i], 1)
    return place


def partition(nnz_per_block: Any, where: list[str | None], n: int) -> list[list[int]]:
    """The blocks cut into ``n`` partitions (ascending block indices within each), balanced by nonzeros.

    Blocks persisted on workers (``where``: the worker holding each block, None when not persisted) are grouped by
    that worker, so a partition's task reads only local blocks: each worker's blocks make ``n`` / n_workers
    partitions (at least one, in proportion to its nonzeros when ``n`` is not a multiple); with fewer partitions
    than workers, or blocks that are not persisted, the partitions are contiguous runs of blocks."""
    if not isinstance(n, int | np.integer) or n < 1:
        raise ParameterError(f"The number of partitions must be an int >= 1; got {n!r}.")
    n_blocks = len(where)
    n = min(int(n), n_blocks)
    nnz = np.array([max(int(c), 1) for c in nnz_per_block], dtype=np.float64)
    owners = sorted({a for a in where if a is not None})
    if len(owners) > 1 and n >= len(owners) and None not in where:
        per = {a: [i for i in range(n_blocks) if where[i] == a] for a in owners}
        load = np.array([nnz[per[a]].sum() for a in owners])
        k = np.ones(len(owners), dtype=np.int64)
        for _ in range(n - len(owners)):  # largest nonzeros per partition gets the next partition
            cand = [j for j in range(len(owners)) if k[j] < len(per[owners[j]])]
            if not cand:
                break
            j = max(cand, key=lambda j: (load[j] / k[j], -j))
            k[j] += 1
        out = []
        for j, a in enumerate(owners):
            out += runs(per[a], nnz, int(k[j]))
        return sorted(out)
    return runs(list(range(n_blocks)), nnz, n)


def runs(ids: list[int], nnz: np.ndarray, k: int) -> list[list[int]]:
    """``ids`` (in order) cut into ``k`` contiguous non-empty runs, the largest run's nonzeros as small as can be
    (linear partition by dynamic programming; ties to the earlier cut)."""
    n = len(ids)
    k = max(1, min(k, n))
    cum = np.concatenate([[0.0], np.cumsum(nnz[ids])])
    # best[j][i]: the smallest largest run when the first i ids make j runs; cut[j][i]: where the last run starts
    best = np.full((k + 1, n + 1), np.inf)
    cut = np.zeros((k + 1, n + 1), dtype=np.int64)
    best[0][0] = 0.0
    for j in range(1, k + 1):
        for i in range(j, n - (k - j) + 1):
            cand = np.maximum(best[j - 1][j - 1:i], cum[i] - cum[j - 1:i])
            q = int(np.argmin(cand))
            best[j][i], cut[j][i] = cand[q], q + j - 1
    bounds = [n]
    for j in range(k, 0, -1):
        bounds.append(int(cut[j][bounds[-1]]))
    bounds = bounds[::-1]
    return [ids[bounds[q]:bounds[q + 1]] for q in range(k)]
