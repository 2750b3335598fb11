"""``dufs bench mmfs``: MMFS-DCD on the kddb-like store: our DCD epoch against LIBLINEAR ``-s 3``, the visit
orders, ``mmfs`` to a duality gap with 1 and 2 workers, and peak memory per worker."""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from dufs.bench.common import (
    WorkerPeak,
    bench_store,
    describe,
    local_cluster,
    median,
    rss,
    rss_files,
    worker_blocks_bytes,
)


class _Serial:
    """Serial DCD (bias moving) over feature blocks held in this process: the epoch loop of ``mmfs`` with one
    partition per block, run back to back on one shared w (LIBLINEAR's setting, per-block shrinking)."""

    def __init__(self, blocks: list, geo: dict, rho: np.ndarray, *, m: int, C: float, gamma: float, seed: int = 0):
        self.blocks, self.m, self.C, self.gamma = blocks, m, C, gamma
        self.st = []
        for i, b in enumerate(blocks):
            sl = slice(b.start, b.stop)
            self.st.append({k: np.ascontiguousarray(geo[k][sl], dtype=np.float64)
                            for k in ("coef", "shift", "colsum", "qii")})
            s = self.st[-1]
            s.update(rho=np.ascontiguousarray(rho[sl], dtype=np.float64), alpha=np.zeros(b.width),
                     index=np.arange(b.width, dtype=np.int64), n_active=b.width, pg=np.array([np.inf, -np.inf]),
                     pg_eps=0.1, rng=np.array([np.uint64(seed * 1000003 + i) * np.uint64(2) + np.uint64(1)],
                                              dtype=np.uint64))
        self.ws, self.wt, self.bias = np.zeros(m), np.zeros(2), np.zeros(1)

    def epoch(self, order: int = 0) -> float:
        """One epoch over every block; returns its seconds (the kernel calls and their bookkeeping only)."""
        from dufs.kernels.dcd import dcd_epoch

        t0 = time.perf_counter()
        for b, s in zip(self.blocks, self.st, strict=True):
            n_act, pgmax, pgmin, _ = dcd_epoch(b.indptr, b.indices, b.data, s["coef"], s["shift"], s["colsum"],
                                               s["qii"], s["rho"], s["alpha"], self.C, self.gamma, self.ws, self.wt,
                                               float(self.m), self.bias, True, s["index"], s["n_active"], s["pg"],
                                               s["rng"], order)
            if pgmax - pgmin <= s["pg_eps"]:  # LIBLINEAR's shrinking bookkeeping, as mmfs._round
                if n_act < b.width:
                    n_act = b.width
                else:
                    s["pg_eps"] *= 0.1
                s["pg"] = np.array([np.inf, -np.inf])
            else:
                s["pg"] = np.array([pgmax if pgmax > 0 else np.inf, pgmin if pgmin < 0 else -np.inf])
            s["n_active"] = int(n_act)
        return time.perf_counter() - t0

    def gap(self) -> tuple[float, float]:
        """``(dual objective D, relative duality gap)`` at the current alphas (one gradient pass, untimed)."""
        from dufs.kernels.dcd import dcd_gradient, gap_terms

        b = float(self.bias[0])
        gap = ra = 0.0
        for blk, s in zip(self.blocks, self.st, strict=True):
            g = np.empty(blk.width)
            dcd_gradient(blk.indptr, blk.indices, blk.data, s["coef"], s["shift"], s["colsum"], self.ws, self.wt,
                         float(self.m), b, g)
            gp, _, r = gap_terms(g, s["rho"], s["alpha"], self.C)
            gap += gp
            ra += r
        w = self.ws + self.wt[0]
        obj = 0.5 * float(w @ w) + b * b / (2.0 * self.gamma) - ra
        return obj, gap / max(abs(obj), 1e-300)



@contextlib.contextmanager
def _capture_fd1() -> Iterator[list]:
    """What C code prints on file descriptor 1 inside the block (LIBLINEAR's ``#iter = N``), as one string in the
    yielded list after the block."""
    import sys

    sys.stdout.flush()
    saved = os.dup(1)
    got: list = []
    with tempfile.TemporaryFile(mode="w+b") as f:
        os.dup2(f.fileno(), 1)
        try:
            yield got
        finally:
            os.dup2(saved, 1)
            os.close(saved)
            f.seek(0)
            got.append(f.read().decode(errors="replace"))



def _liblinear(blocks: list, geo: dict, n: int, d: int, *, C: float, gamma: float, eps: tuple[float, ...],
               say: Any) -> dict:
    """LIBLINEAR ``-s 3`` on the transposed problem (features as instances, labels +1, the same scaled columns;
    ``-B sqrt(gamma)`` is MMFS's bias term): seconds and iterations for each stopping tolerance in ``eps``."""
    import re

    import scipy.sparse as sp

    try:
        from liblinear.liblinearutil import problem, train
    except ImportError as e:
        say(f"LIBLINEAR: not measured (liblinear-official is not installed: {e}; pip install 'dufs\\[bench]')")
        return {}
    # the transposed matrix in CSR is the CSC buffers; float64 values of the scaled columns f_i
    ip = np.zeros(d + 1, np.int64)
    ix = np.empty(sum(b.nnz for b in blocks), np.int32)
    dt = np.empty(ix.shape[0], np.float64)
    off = 0
    for b in blocks:
        k = b.nnz
        ip[b.start + 1:b.stop + 1] = off + np.asarray(b.indptr[1:], np.int64)
        ix[off:off + k] = b.indices
        dt[off:off + k] = np.asarray(b.data, np.float64) * np.repeat(geo["coef"][b.start:b.stop], np.diff(b.indptr))
        off += k
    t0 = time.perf_counter()
    prob = problem(np.ones(d), sp.csr_matrix((dt, ix, ip), shape=(d, n)))
    build = time.perf_counter() - t0
    del dt, ix, ip
    out: dict[str, Any] = {"build_s": build, "runs": []}
    for e in eps:
        with _capture_fd1() as txt:
            t0 = time.perf_counter()
            train(prob, f"-s 3 -c {C!r} -B {float(np.sqrt(gamma))!r} -e {e!r}")
            sec = time.perf_counter() - t0
        it = re.search(r"#iter\s*=\s*(\d+)", txt[0])
        ob = re.search(r"Objective value\s*=\s*(\S+)", txt[0])
        out["runs"].append({"eps": e, "s": sec, "iters": int(it.group(1)) if it else 0,
                            "objective": float(ob.group(1)) if ob else float("nan")})
    del prob
    return out



def _orders_one_block(block: Any, geo: dict, rho: np.ndarray, *, m: int, C: float, gamma: float, tol: float,
                      orders: tuple[int, ...], max_epochs: int, repeats: int = 3) -> list[dict]:
    """Serial DCD on one block (its own MMFS problem, bias moving) in each visit order: seconds of the first (full)
    epoch (median of ``repeats`` fresh starts), epochs and kernel seconds to a relative gap of ``tol``."""
    res = []
    for o in orders:
        firsts = [_Serial([block], geo, rho, m=m, C=C, gamma=gamma, seed=k).epoch(o) for k in range(1, repeats)]
        s = _Serial([block], geo, rho, m=m, C=C, gamma=gamma)
        times = []
        rel = np.inf
        while len(times) < max_epochs:
            times.append(s.epoch(o))
            _, rel = s.gap()
            if rel <= tol:
                break
        res.append({"order": o, "first_s": median([times[0], *firsts]), "epochs": len(times),
                    "total_s": float(sum(times)), "rel_gap": rel})
    return res



def _serial_to_gap(blocks: list, geo: dict, rho: np.ndarray, *, m: int, C: float, gamma: float, tol: float,
                   order: int, max_epochs: int) -> dict:
    """Serial DCD over all the blocks in this process (one partition, bias moving): epochs and kernel seconds to
    a relative gap of ``tol``; what one worker would do if its blocks shared one w."""
    s = _Serial(blocks, geo, rho, m=m, C=C, gamma=gamma)
    times = []
    rel = np.inf
    while len(times) < max_epochs:
        times.append(s.epoch(order))
        _, rel = s.gap()
        if rel <= tol:
            break
    return {"order": order, "epochs": len(times), "total_s": float(sum(times)), "rel_gap": rel}



def _pooled(dask_worker=None) -> int:
    """Bytes of pass outputs this worker keeps for reuse (:mod:`dufs.engine.buffers`)."""
    from dufs.engine.buffers import pooled_bytes

    return pooled_bytes()


class _GradientPass:
    """The solver's gradient pass alone through the cluster, one round at a time (:meth:`wall`): a round with no
    epoch (``_round(..., epoch=False)``: the step, the exact gradient and the gap terms of every block, its
    partition's task, the tree sum, w shipped as the solve ships it), from a state made as ``mmfs`` makes it (not
    timed) and a fixed w. The same work on 1 and 2 workers, so its speed-up is the one the solve can aim at."""

    def __init__(self, M: Any, y: np.ndarray, *, C: float, gamma: float, seed: int = 0):
        from dufs.methods.mmfs import auto_partitions, margin_spec
        from dufs.methods.mmfs.solver import init_state

        self.M, self.C, self.gamma = M, C, gamma
        self.partitions = M.partition(auto_partitions(M))
        self.part_of = [0] * M.n_blocks
        for q, blocks in enumerate(self.partitions):
            for i in blocks:
                self.part_of[i] = q
        _, spec = margin_spec(M, y, 0.5, gamma, "correlation")
        self.state, _ = init_state(M, self.partitions, spec, seed)
        self.ws = np.random.default_rng(seed).standard_normal(M.shape[0]) * 1e-3

    def wall(self) -> float:
        """Wall seconds of one gradient pass (the state moves on to the pass's new one)."""
        from dufs.engine import PerBlock
        from dufs.engine.dispatch import shipped
        from dufs.methods.mmfs.partition import _round
        from dufs.methods.solver import release

        K, m = len(self.partitions), self.M.shape[0]
        t0 = time.perf_counter()
        with shipped(self.ws, broadcast=K > 1, shared=True) as w_arg:
            _, new = self.M.map_blocks(_round, w_arg, np.zeros(2), 0.0, np.zeros(2), float(m), self.C, self.gamma,
                                       K == 1, False, 1.0, None, 0, PerBlock(self.part_of), None, state=self.state,
                                       reduce="sum", partitions=self.partitions)
        wall = time.perf_counter() - t0
        release(self.state)
        self.state = new
        return wall

    def close(self) -> None:
        from dufs.methods.solver import release

        release(self.state)


def _order_name(o: int) -> str:
    return "random (default)" if o == 0 else "storage order" if o < 0 else f"block-random, runs of {o}"



def mmfs(*, rows: int = 2_000_000, features: int = 5_000_000, nnz_per_row: int = 30, work_dir: Path | None = None,
         store: Path | None = None, console: Any = None, workers: tuple[int, ...] = (1, 2), seed: int = 0,
         C: float = 1.0, gamma: float = 1.0, tol: float = 1e-3, ll_eps: tuple[float, ...] = (1.0, 0.1),
         orders: tuple[int, ...] = (0, -1, 64, 256, 1024, 4096), max_epochs: int = 200, repeats: int = 11) -> dict:
    """MMFS-DCD on the kddb-like store: (a) our DCD epoch in this process against LIBLINEAR ``-s 3`` per iteration
    on the same problem; visit orders on one block; (b) ``mmfs`` wall time to ``tol`` with 1 and 2 workers, the
    median of ``repeats`` solves on the same cluster after one untimed solve (one solve's time moves from run to
    run, and a solve is short: docs/measurements.md, "Benches"); (c) peak memory per worker against its blocks plus
    O(n_samples) vectors, over all the solves."""
    say = console.print if console is not None else print
    st = bench_store(rows, features, nnz_per_row, seed, work_dir, store, say)
    n, d = st.shape
    nnz = int(st.nnz)
    y = np.asarray(st.y, dtype=np.float64)
    res: dict[str, Any] = describe(st, f"MMFS standardize='scale', C={C:g}, gamma={gamma:g}, tol={tol:g}", say)

    # the MMFS geometry (per-feature scaling) and margins, computed once in this process
    geo, rho, blocks, res["geometry_s"] = _geometry_and_blocks(st, y)
    say(f"geometry and margins (column stats + relevance pass): {res['geometry_s']:.1f} s; blocks loaded")

    # (a) LIBLINEAR -s 3 vs our epoch on the same problem (margins 1, the same scaled columns, C, gamma)
    res["liblinear"], res["ours"] = _epoch_vs_liblinear(blocks, geo, n, d, C=C, gamma=gamma, eps=ll_eps, seed=seed,
                                                        say=say)

    # visit orders on one block (its own MMFS problem: margins rho)
    big = int(np.argmax([b.nnz for b in blocks]))
    res["orders_block"] = big
    res["orders"] = _orders_one_block(blocks[big], geo, rho, m=n, C=C, gamma=gamma, tol=tol, orders=orders,
                                      max_epochs=max_epochs)
    # the same MMFS problem as (b), solved serially over all blocks in this process (one partition)
    res["serial"] = [_serial_to_gap(blocks, geo, rho, m=n, C=C, gamma=gamma, tol=tol, order=o, max_epochs=max_epochs)
                     for o in (0, 1024)]
    del blocks

    # (b), (c): mmfs on a process cluster, blocks persisted. Every cluster size up at once, idle but for its turn,
    # and each solve and gradient pass taken on every one in turn: one cluster's solves minutes after the other's
    # compared this machine's drift as much as the solver (docs/measurements.md, "Benches")
    reps = max(1, int(repeats))
    solve = {"C": C, "gamma": gamma, "tol": tol, "max_epochs": max_epochs}
    with contextlib.ExitStack() as stack, warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Sending large graph", category=UserWarning)
        on = {w: _start_cluster(stack, w, st, y, solve, say) for w in workers}
        # the gradient pass alone, before the solves and after them (its time moves with the worker's state)
        _gradient_passes(on, workers, y, C=C, gamma=gamma, seed=seed, reps=reps)
        _timed_solves(on, workers, y, solve, reps)
        _gradient_passes(on, workers, y, C=C, gamma=gamma, seed=seed, reps=reps)
    for w in workers:
        res[f"w{w}"] = _worker_figures(on[w], w, d)
    _mmfs_table(res, workers, say, n, nnz, tol)
    return res


def _geometry_and_blocks(st: Any, y: np.ndarray) -> tuple[dict, np.ndarray, list, float]:
    """The MMFS geometry and margins of the store (theta = 0.5: rho = r), its feature blocks loaded in this process,
    and the seconds the geometry and margins took."""
    from dufs.engine import FeatureBlock, as_matrix
    from dufs.methods.mmfs import geometry, relevance

    t0 = time.perf_counter()
    M0 = as_matrix(st.path, standardize="scale", persist=False)
    geo = geometry(M0)
    rho = relevance(M0, y, geo)  # theta = 0.5: rho = r
    seconds = time.perf_counter() - t0
    blocks = []
    for i in range(st.n_blocks("csc")):
        b = st.block(i, "csc")
        ip = np.asarray(b.indptr, dtype=np.int64)
        blocks.append(FeatureBlock(int(b.start), int(b.stop), ip - ip[0], np.asarray(b.indices),
                                   np.asarray(b.data)))
    return geo, rho, blocks, seconds


def _epoch_vs_liblinear(blocks: list, geo: dict, n: int, d: int, *, C: float, gamma: float, eps: tuple[float, ...],
                        seed: int, say: Any) -> tuple[dict, dict]:
    """(a): LIBLINEAR ``-s 3`` and our serial epoch, random and block-random, on the same problem (margins 1), as
    many epochs as LIBLINEAR's longest run took iterations."""
    ll = _liblinear(blocks, geo, n, d, C=C, gamma=gamma, eps=eps, say=say)
    ones = np.ones(d)
    n_ep = max([r["iters"] for r in ll.get("runs", [])] + [1]) if ll else 14
    ours: dict[str, Any] = {}
    for o in (0, 256):
        _Serial(blocks[:1], geo, ones, m=n, C=C, gamma=gamma).epoch(o)  # warm: numba compiles or loads its cache
        s = _Serial(blocks, geo, ones, m=n, C=C, gamma=gamma, seed=seed)
        times = [s.epoch(o) for _ in range(n_ep)]
        obj, rel = s.gap()
        ours[o] = {"first_s": times[0], "mean_s": float(np.mean(times)), "epochs": n_ep, "objective": obj,
                   "rel_gap": rel}
    return ll, ours


def _start_cluster(stack: contextlib.ExitStack, w: int, st: Any, y: np.ndarray, solve: dict, say: Any) -> dict:
    """A cluster of ``w`` workers (closed with ``stack``), the store's blocks persisted on it, its statistics pass
    timed and one solve run untimed; what it holds then (blocks, idle process, the solver's code, pass outputs)."""
    from dufs.engine import as_matrix
    from dufs.methods.mmfs import mmfs as run_mmfs

    client = stack.enter_context(local_cluster(w))
    with client.as_current():
        M = as_matrix(st.path, standardize="scale", persist=True)
        if M.residency.get("mode") != "persisted":
            say(f"warning: the blocks were not persisted ({M.residency.get('reason')})")
        stack.callback(M.release)
        bb = max(client.run(worker_blocks_bytes).values())
        t0 = time.perf_counter()
        M.stats  # noqa: B018 - the statistics pass, timed apart from the solver
        stats_s = time.perf_counter() - t0
        # the process with its blocks resident and the engine imported, before the solver
        idle = max(client.run(rss).values()) - bb
        files0 = client.run(rss_files)
        # one solve not timed: a fresh cluster's first one ran slower than the next, the solver's kernels loaded
        # from numba's cache, its arrays' pages faulted in (docs/measurements.md, "Benches")
        run_mmfs(M, y, **solve)
        # the files that solve mapped (the solver's compiled code from numba's cache, libraries:
        # docs/measurements.md, "Benches"), not data: the memory check counted them as vectors of n_samples
        code = max(v - files0.get(a, v) for a, v in client.run(rss_files).items())
        return {"client": client, "M": M, "bb": bb, "stats_s": stats_s, "idle": idle, "code": code,
                "walls": [], "runs": [], "grad": [], "pool0": max(client.run(_pooled).values())}


def _gradient_passes(on: dict, workers: tuple[int, ...], y: np.ndarray, *, C: float, gamma: float, seed: int,
                     reps: int) -> None:
    """A few gradient passes on every cluster in turn, from a state made on each (not timed)."""
    g = {}
    for w in workers:
        with on[w]["client"].as_current():
            g[w] = _GradientPass(on[w]["M"], y, C=C, gamma=gamma, seed=seed)
            g[w].wall()  # its first round's index arrays fault in
    for _ in range(max(5, reps)):
        for w in workers:
            with on[w]["client"].as_current():
                on[w]["grad"].append(g[w].wall())
    for w in workers:
        with on[w]["client"].as_current():
            g[w].close()


def _timed_solves(on: dict, workers: tuple[int, ...], y: np.ndarray, solve: dict, reps: int) -> None:
    """``reps`` solves on every cluster in turn, timed, the workers' peak memory sampled over all of them."""
    from dufs.methods.mmfs import mmfs as run_mmfs

    with contextlib.ExitStack() as sampling:
        peaks = {w: sampling.enter_context(WorkerPeak(on[w]["client"])) for w in workers}
        for _ in range(reps):
            for w in workers:
                with on[w]["client"].as_current():
                    t0 = time.perf_counter()
                    r = run_mmfs(on[w]["M"], y, **solve)
                    on[w]["walls"].append(time.perf_counter() - t0)
                    on[w]["runs"].append(r)
    for w in workers:
        on[w]["peak"] = peaks[w].peak
        on[w]["pool"] = max(on[w]["client"].run(_pooled).values())


def _worker_figures(o: dict, w: int, d: int) -> dict:
    """The figures of ``w`` workers: the median solve's, its rounds' medians, the memory."""
    walls, runs, grad_walls = o["walls"], o["runs"], o["grad"]
    bb, stats_s, idle, pool, pool0 = o["bb"], o["stats_s"], o["idle"], o["pool"], o["pool0"]
    wall = median(walls)
    r = runs[walls.index(sorted(walls)[(len(walls) - 1) // 2])]  # the median solve (its trace, its rounds)
    dg = r.diagnostics
    # mmfs keeps 7 float64 arrays a feature in its per-block state (coef, shift, colsum, qii, rho, alpha, g); a
    # round makes a new g and alpha and a working-set index (3 arrays of 8 bytes a feature, transient)
    tr = dg["trace"]
    K = dg["n_partitions"]
    return {"state_bytes": 7 * 8 * -(-d // w), "transient_bytes": 3 * 8 * -(-d // w), "wall_s": wall,
            "walls_s": walls, "all_rounds": [x.diagnostics["rounds"] for x in runs],
            "stats_s": stats_s, "grad_walls_s": grad_walls, "grad_s": median(grad_walls),
            "rounds": dg["rounds"], "converged": dg["converged"],
            "rel_gap": dg["relative_gap"], "support": dg["support"], "peak": o["peak"], "idle": idle,
            "code": o["code"],
            "blocks_bytes": bb, "objective": dg["objective"], "n_partitions": K,
            "pool_bytes": pool, "pool_growth": pool - pool0,
            "rules": {k: sum(t["rule"] == k for t in tr) for k in sorted({t["rule"] for t in tr})},
            "start_med": float(np.median([t["start_s"] / K for t in tr])),
            "map_med": float(np.median([t["map_s"] for t in tr])),
            "round_med": float(np.median([t["wall_s"] for t in tr]))}



def _mmfs_table(res: dict, workers: tuple[int, ...], say: Any, n: int, nnz: int, tol: float) -> None:
    """Print the figures: (a) the epochs and the visit orders, (b) the solves, (c) the memory."""
    _epochs_table(res, say, nnz)
    say(f"visit orders, serial DCD on one block (block {res['orders_block']}, its own MMFS problem) to a relative "
        f"gap of {tol:g}, in this process:")
    base = res["orders"][0]
    for r in res["orders"]:
        say(f"  {_order_name(r['order']):28s}: first epoch {r['first_s'] * 1e3:7.1f} ms "
            f"({base['first_s'] / r['first_s']:.2f}x random), {r['epochs']:3d} epochs, {r['total_s']:.2f} s to the "
            f"gap ({base['total_s'] / r['total_s']:.2f}x random; reached {r['rel_gap']:.1e})")
    _solves_table(res, workers, say)
    _memory_table(res, workers, say, n)


def _epochs_table(res: dict, say: Any, nnz: int) -> None:
    """(a): LIBLINEAR's seconds an iteration against our epoch's (and their ratios into ``res``)."""
    ll, ours = res["liblinear"], res["ours"]
    say("(a) one epoch, in this process on the store's blocks (serial DCD, bias moving, shrinking), against "
        "LIBLINEAR -s 3 on the transposed problem (features as instances, labels +1, margins 1, the same scaled "
        "columns, -B sqrt(gamma)):")
    per_it = None
    if ll:
        say(f"  LIBLINEAR problem built in {ll['build_s']:.1f} s (not counted)")
        for r in ll["runs"]:
            say(f"  LIBLINEAR -e {r['eps']:g}: {r['s']:.2f} s, {r['iters']} iterations, "
                f"{r['s'] / max(r['iters'], 1):.3f} s/iteration (total / iterations), dual objective "
                f"{r['objective']:.6g}")
        rs = sorted(ll["runs"], key=lambda r: r["iters"])
        per_it = rs[-1]["s"] / max(rs[-1]["iters"], 1)
        if len(rs) >= 2 and rs[-1]["iters"] > rs[0]["iters"]:
            diff = (rs[-1]["s"] - rs[0]["s"]) / (rs[-1]["iters"] - rs[0]["iters"])
            say(f"  LIBLINEAR differential: {diff:.3f} s/iteration (iterations {rs[0]['iters'] + 1}-{rs[-1]['iters']},"
                f" past its setup)")
        res["liblinear_s_per_iter"] = per_it
    for o, v in ours.items():
        ratio = f", {v['mean_s'] / per_it:.2f}x LIBLINEAR (target <= 1.0)" if per_it else ""
        say(f"  dufs dcd_epoch, {_order_name(o)}: {v['mean_s']:.3f} s/epoch over {v['epochs']} epochs (first, full "
            f"epoch {v['first_s']:.3f} s; {nnz / v['first_s'] / 1e6:.0f} Mnnz/s){ratio}; dual objective "
            f"{v['objective']:.6g}, relative gap {v['rel_gap']:.2e}")
        if per_it:
            res[f"ratio_order{o}"] = v["mean_s"] / per_it


def _solves_table(res: dict, workers: tuple[int, ...], say: Any) -> None:
    """(b): the solves on each cluster size, the speed-up (into ``res``), and the serial solves for comparison."""
    say("(b) mmfs(as_matrix(store, standardize='scale', persist=True), y, gamma, tol) on a LocalCluster of processes "
        "(1 thread each), column stats computed before (timed apart):")
    from dufs.methods.mmfs.solver import _SCREEN
    for w in workers:
        v = res[f"w{w}"]
        each = ", ".join(f"{t:.2f} s" for t in v["walls_s"])
        say(f"  {w} worker{'s' if w > 1 else ' '}: {v['wall_s']:.2f} s (median of {len(v['walls_s'])} solves after an "
            f"untimed one: {each}; rounds {', '.join(str(x) for x in v['all_rounds'])}) to relative gap "
            f"{v['rel_gap']:.1e} "
            f"({'converged' if v['converged'] else 'NOT converged'}), {v['rounds']} rounds in "
            f"{v['n_partitions']} partition{'s' if v['n_partitions'] > 1 else ''} "
            f"({', '.join(f'{n} {k}' for k, n in v['rules'].items())}), about {v['rounds'] + 1} passes over the "
            f"data (the blocks' statistics and relevance, a gradient in each round after the first, whose start "
            f"reads no data and whose working set is the {_SCREEN} features of the largest margins; the working "
            f"sets' solves are small); support "
            f"{v['support']:,}; column stats {v['stats_s']:.1f} s")
        say(f"    medians a round: {v['round_med']:.3f} s on the driver, {v['map_med']:.3f} s of it waiting for the "
            f"partitions' tasks; a partition's step + gradient + gap terms {v['start_med']:.3f} s")
        say(f"    the gradient pass alone through the cluster (a round's start with no epoch: every block's step, "
            f"gradient and gap terms, the partitions' tasks and their sum): {v['grad_s']:.3f} s (median of "
            f"{len(v['grad_walls_s'])}, half before the solves and half after: "
            f"{', '.join(f'{t:.3f}' for t in v['grad_walls_s'])})")
    if 1 in workers and 2 in workers:
        res["speedup_2w"] = res["w1"]["wall_s"] / res["w2"]["wall_s"]
        res["start_scaling"] = res["w1"]["start_med"] / res["w2"]["start_med"]
        res["gradient_scaling"] = res["w1"]["grad_s"] / res["w2"]["grad_s"]
        res["speedup_of_gradient"] = res["speedup_2w"] / res["gradient_scaling"]
        say(f"  speed-up 2 workers vs 1: {res['speedup_2w']:.2f}x; the gradient pass alone through the cluster "
            f"(the same pass on both, wall clock) {res['gradient_scaling']:.2f}x: the solve reaches "
            f"{100 * res['speedup_of_gradient']:.0f}% of the gradient pass's speed-up (target >= 90%)")
        say(f"    (the rounds' start inside the tasks, a partition's seconds, 1 worker against 2: "
            f"{res['start_scaling']:.2f}x; not the same work on both: on 2 workers the driver runs the working sets' "
            f"epochs and the partitions only apply their step, so it is no reference)")
    for r in res["serial"]:
        say(f"  for comparison, serial DCD over all blocks in this process (one partition, bias moving, "
            f"{_order_name(r['order'])}): {r['epochs']} epochs, {r['total_s']:.1f} s of kernel to relative gap "
            f"{r['rel_gap']:.1e}")


def _memory_table(res: dict, workers: tuple[int, ...], say: Any, n: int) -> None:
    """(c): each worker's peak memory against its blocks, the solver's state and O(n_samples) vectors."""
    say("(c) peak RSS per worker during mmfs against its persisted blocks, the solver's per-feature state (7 arrays "
        "of 8 bytes a feature, and 3 made during a round) and O(n_samples) float64 vectors:")
    vec = n * 8
    for w in workers:
        v = res[f"w{w}"]
        st = v["state_bytes"] + v["transient_bytes"]
        say(f"  {w} worker{'s' if w > 1 else ' '}: per-feature state {v['state_bytes'] / 1e6:.0f} MB + "
            f"{v['transient_bytes'] / 1e6:.0f} MB during a round")
        extra = v["peak"] - v["idle"] - v["code"] - v["blocks_bytes"] - st
        k = -(-v["n_partitions"] // w) + 8  # its partitions' results, held until summed, + a task's copies
        bound = v["idle"] + v["code"] + v["blocks_bytes"] + st + k * vec
        say(f"  {w} worker{'s' if w > 1 else ' '}: peak {v['peak'] / 1e6:.0f} MB = idle process {v['idle'] / 1e6:.0f} "
            f"MB (after persist and column stats, less its blocks) + the solver's code {v['code'] / 1e6:.0f} MB "
            f"(files the first solve mapped) + blocks {v['blocks_bytes'] / 1e6:.0f} MB + "
            f"state + {extra / 1e6:.0f} MB = {extra / vec:.1f} vectors of n_samples float64 ({vec / 1e6:.0f} MB "
            f"each); bound idle + code + blocks + state + {k} vectors (partitions on it + 8) = "
            f"{bound / 1e6:.0f} MB: {'within' if v['peak'] <= bound else 'OVER'}; pass outputs kept for reuse "
            f"(dufs.engine.buffer-bytes) "
            f"{v['pool_bytes'] / 1e6:.0f} MB after the run, {v['pool_growth'] / 1e6:+.0f} MB during it")
