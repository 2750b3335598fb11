"""Where blocks go and how they are grouped: the placement of persisted blocks on the workers, and the
partitions (groups of blocks, one task each) that solvers such as MMFS's DCD run over."""

from __future__ import annotations

import uuid
from typing import Any

import numpy as np

from dufs import config
from dufs.engine.blocks import (
    BlockInfo,
    BlockSlice,
    FeatureBlock,
    StoreBlock,
    ValuedStoreBlock,
    column_slice,
    materialize,
    valued_block,
)
from dufs.engine.dispatch import track
from dufs.errors import ParameterError

__all__ = ["partition", "persist_blocks", "plan_placement", "runs", "split_blocks", "valued_sources"]


def valued_sources(src: list, values: str, residency: dict, where: list[str | None], client: Any,
                   row_scale: np.ndarray | None = None) -> tuple[list, dict]:
    """The blocks' sources ``src`` read with their values transformed (:func:`~dufs.engine.blocks.valued_block`),
    each made where its block is, one block at a time, and their residency record: an in-memory block's values
    transformed here (its indices shared), a store block read and transformed where it is loaded
    (:class:`~dufs.engine.blocks.ValuedStoreBlock`), a Dask array's block transformed after it is computed.

    Persisted blocks (``residency`` "persisted", ``where`` their workers): each transformed on its worker into a
    persisted block of its own there (new values, the same index arrays in that worker's memory), lost with the
    worker and made again from the block like any task, when the raw blocks and the copies together (as Dask counts
    them, whole) fit in ``dufs.engine.persist-fraction`` of the cluster's memory; otherwise each pass transforms
    each persisted block where it is, for that pass only (residency "source": passes as tasks).

    ``row_scale`` (the inverse row norms of ``Matrix(rows="unit")``, an n-vector): each stored value is also
    multiplied by its row's entry. It travels to the workers once (scattered) for persisted blocks and for store
    blocks on a cluster, inside each store block's reference in this process, or in the source graph of a Dask
    array's blocks; residency ``"rows"`` says so."""
    if values == "raw" and row_scale is None:
        return list(src), residency
    out_res = {**residency, "values": values}
    rows_key = None
    if row_scale is not None:
        row_scale = np.ascontiguousarray(row_scale, dtype=np.float64)
        from dask.base import tokenize

        rows_key = tokenize(row_scale)
        out_res["rows"] = "unit"
    if residency.get("mode") == "persisted":
        import dask

        need = 2 * int(residency.get("bytes") or 0)
        memory = int(residency.get("cluster_memory") or 0)
        frac = float(config.get("engine.persist-fraction"))
        if memory and need > frac * memory:
            out_res.update(mode="source", reason=f"values read as {values!r} from the persisted blocks each pass: "
                           f"copies beside them ({need / 2**20:,.0f} MiB with them) exceed {frac:.0%} of the "
                           f"cluster's {memory / 2**20:,.0f} MiB")
            sc = None if row_scale is None else dask.delayed(row_scale, name=f"dufs-rows-{rows_key}")
            return [dask.delayed(valued_block, pure=True)(s, values, sc) for s in src], out_res
        from distributed import wait

        token = uuid.uuid4().hex[:12]
        scale_arg = None if row_scale is None else track(client.scatter(row_scale, broadcast=True))
        futures = [track(client.submit(valued_block, s, values, scale_arg, key=f"dufs-valued-{token}-{i}",
                                       workers=None if w is None else [w], allow_other_workers=True, pure=False))
                   for i, (s, w) in enumerate(zip(src, where, strict=True))]
        wait(futures)
        client.sync(client.scheduler.set_restrictions, worker={f.key: None for f in futures})  # as persist_blocks
        out_res["reason"] = f"values read as {values!r}: persisted beside the raw blocks, on their workers"
        return futures, out_res
    out = []
    sc = None
    for s in src:
        if isinstance(s, FeatureBlock):
            out.append(valued_block(s, values, row_scale))
        elif isinstance(s, StoreBlock) and row_scale is not None and client is not None:
            import dask

            # on a cluster the n-vector goes to the workers once (a future each task depends on), not inside each
            # block's reference (n floats a task: 150 MB at kddb's 19M rows); the raw block's read stays cached
            if sc is None:
                sc = track(client.scatter(row_scale, hash=False))
            out.append(dask.delayed(valued_block, pure=True)(s, values, sc))
        elif isinstance(s, StoreBlock):
            out.append(ValuedStoreBlock(s.start, s.stop, s.nnz, s.path, s.index, s.created, values, row_scale,
                                        rows_key))
        else:  # a Dask array's block: a Delayed
            import dask

            if sc is None and row_scale is not None:
                sc = dask.delayed(row_scale, name=f"dufs-rows-{rows_key}")
            out.append(dask.delayed(valued_block, pure=True)(s, values, sc))
    return out, out_res


def persist_blocks(client: Any, src: list, blocks: list, residency: dict, fraction: float
                   ) -> tuple[list | None, list, dict]:
    """Load blocks (``src``: their sources, ``blocks``: their :class:`~dufs.engine.blocks.BlockInfo`) into the
    workers' memory, placed by :func:`plan_placement`, when they fit in ``fraction`` of the cluster's memory; fewer
    blocks than the workers' threads are cut first (:func:`split_blocks`). Returns the futures (None when they do
    not fit, or are not known to: left to be re-read each pass), the blocks' information (new where they were cut)
    and the new residency record. A cluster without workers yet is waited for (``dufs.engine.wait-for-workers``)."""
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
        return None, blocks, {"mode": "store" if mode == "store" else mode, "bytes": need, "cluster_memory": memory,
                              "reason": f"not persisted: {need / 2**20:,.0f} MiB exceeds {fraction:.0%} of the "
                                        f"cluster's {memory / 2**20:,.0f} MiB; blocks are re-read each pass"}
    slots = sum(int(w.get("nthreads") or 1) for _, w in workers)
    n_before = len(blocks)
    src, blocks = split_blocks(src, blocks, slots, int(config.parse_bytes(config.get("engine.split-block-nnz"))),
                               len(workers))
    place = plan_placement([b.nnz if b.nnz >= 0 else b.width for b in blocks], [a for a, _ in workers])
    from dask.delayed import Delayed
    from distributed import wait

    token = uuid.uuid4().hex[:12]
    futures = []
    for i, s in enumerate(src):
        key = f"dufs-block-{token}-{i}"
        if isinstance(s, Delayed):
            futures.append(track(client.compute(s, workers=[place[i]], allow_other_workers=True)))
        else:
            futures.append(track(client.submit(materialize, s, key=key, workers=[place[i]],
                                               allow_other_workers=True, pure=False)))
    wait(futures)
    # the placement was for loading them: a block that dask recomputes after its worker was lost may go to any
    # worker. Kept, the restriction to an address that no longer exists stalls the block for good once it has gone
    # to "no-worker" (no worker running at that moment: both of a 2-worker cluster lost at once); distributed then
    # starts such a task on a worker that joins only when that worker is one it was restricted to, loose or not
    client.sync(client.scheduler.set_restrictions, worker={f.key: None for f in futures})
    cut = (f"; its {n_before} feature blocks cut into {len(blocks)} for the workers' {slots} threads"
           if len(blocks) > n_before else "")
    return futures, blocks, {"mode": "persisted", "bytes": need, "cluster_memory": memory, "n_workers": len(workers),
                             "reason": f"persisted in the workers' memory, balanced by nonzeros{cut}"}


def split_blocks(src: list, blocks: list, slots: int, min_nnz: int, workers: int = 1) -> tuple[list, list]:
    """The blocks cut, where there are fewer than ``slots`` (the cluster's worker threads), into about
    min(``slots``, nnz / ``min_nnz``) pieces of about ``min_nnz`` nonzeros or more (a multiple of ``workers`` where
    that is at least ``workers``, so that the workers' loads can be equal), balanced by nonzeros within each block:
    a pass runs a block a thread, so a store of one block ran every pass on one worker of a cluster. In-memory
    blocks are cut here; a store's are cut where they are loaded (a :class:`~dufs.engine.blocks.BlockSlice`), by
    its features' nonzeros; blocks whose features' nonzeros are not known (a Dask array's) are left whole.
    ``min_nnz`` 0: never cut."""
    if min_nnz <= 0 or len(blocks) >= slots or any(b.nnz < 0 for b in blocks):
        return src, blocks
    total = sum(b.nnz for b in blocks)
    want = min(slots, round(total / min_nnz))
    if want >= workers > 1:
        want -= want % workers
    if want <= len(blocks):
        return src, blocks
    target = total / want
    stores: dict[str, Any] = {}
    out_src, out_blocks = [], []
    for s, b in zip(src, blocks, strict=True):
        pieces = min(max(1, round(b.nnz / target)), b.width)
        counts = None if pieces < 2 else _feature_nnz(s, stores)
        if counts is None:
            out_src.append(s)
            out_blocks.append(b)
            continue
        cum = np.cumsum(counts)
        cuts = np.searchsorted(cum, b.nnz * np.arange(1, pieces) / pieces, side="left") + 1
        edges = np.unique(np.concatenate([[0], np.clip(cuts, 1, b.width - 1), [b.width]]))
        for a, z in zip(edges[:-1], edges[1:], strict=True):
            lo, hi = b.start + int(a), b.start + int(z)
            out_src.append(column_slice(s, lo, hi) if isinstance(s, FeatureBlock) else BlockSlice(s, lo, hi))
            out_blocks.append(BlockInfo(lo, hi, int(cum[z - 1] - (cum[a - 1] if a else 0))))
    return out_src, out_blocks


def _feature_nnz(s: Any, stores: dict) -> np.ndarray | None:
    """The nonzeros of each feature of the block source ``s``: an in-memory block's from its pointers, a store
    block's read from its store (that range only); None for other sources."""
    if isinstance(s, FeatureBlock):
        return np.diff(s.indptr)
    if isinstance(s, StoreBlock):
        from dufs.data import open_store

        st = stores.get(s.path)
        if st is None:
            st = stores[s.path] = open_store(s.path)
        return np.asarray(st.feature_nnz_of(s.start, s.stop), dtype=np.int64)
    return None


def plan_placement(est: list[int], workers: list[str]) -> dict[int, str]:
    """Block index -> worker address, a fixed placement balanced by nonzeros (``est``: each block's nonzeros, or
    its width when unknown): greedy, largest first onto the least loaded worker, then (:func:`_refine`) single
    blocks moved, or two swapped, between the most loaded worker and another while that lowers the larger load:
    the greedy split alone left the worker with more nonzeros slower in every greedy step (docs/measurements.md,
    "Placement")."""
    load = {addr: 0 for addr in workers}
    place = {}
    for i in sorted(range(len(est)), key=lambda i: (-est[i], i)):
        addr = min(load, key=lambda a: (load[a], a))
        place[i] = addr
        load[addr] += max(est[i], 1)
    return _refine(place, [max(int(e), 1) for e in est], list(load))


def _refine(place: dict[int, str], est: list[int], workers: list[str]) -> dict[int, str]:
    """``place`` improved by local moves: while the most loaded worker has a block whose move to another worker,
    or whose swap with one of that worker's blocks, leaves both below its load, the best such (the smallest larger
    load of the two; ties to the lower indices) is made. Ends where no single move or swap lowers the largest
    load between the most loaded worker and any other (at most 4 moves a block)."""
    if len(workers) < 2:
        return place
    e = np.asarray(est, dtype=np.int64)
    owner = {a: j for j, a in enumerate(workers)}
    where = np.array([owner[place[i]] for i in range(len(est))], dtype=np.int64)
    load = np.bincount(where, weights=e, minlength=len(workers)).astype(np.int64)
    for _ in range(4 * len(est)):
        hi = int(np.argmax(load))  # the lowest index among equals
        on_hi = np.flatnonzero(where == hi)
        best: tuple | None = None  # (new larger load, i, j or -1, lo): the smallest, ties to the lower indices
        for lo in range(len(workers)):
            if lo == hi:
                continue
            # a move of i from hi to lo (the first smallest: the lowest i), or a swap of i with j on lo
            moved = np.maximum(load[hi] - e[on_hi], load[lo] + e[on_hi])
            q = int(np.argmin(moved))
            found = [(int(moved[q]), int(on_hi[q]), -1, lo)]
            on_lo = np.flatnonzero(where == lo)
            if on_lo.size:
                d = e[on_hi][:, None] - e[on_lo][None, :]
                swapped = np.maximum(load[hi] - d, load[lo] + d)
                q, r = np.unravel_index(int(np.argmin(swapped)), swapped.shape)
                found.append((int(swapped[q, r]), int(on_hi[q]), int(on_lo[r]), lo))
            for c in found:
                if c[0] < load[hi] and (best is None or c < best):
                    best = c
        if best is None:
            break
        _, i, j, lo = best
        where[i] = lo
        load[hi] -= e[i]
        load[lo] += e[i]
        if j >= 0:
            where[j] = hi
            load[lo] -= e[j]
            load[hi] += e[j]
    return {i: workers[int(where[i])] for i in range(len(est))}


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
