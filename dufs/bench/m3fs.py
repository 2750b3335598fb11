"""``dufs bench m3fs``: the alternating M3FS (anchor graph) on the kddb-like store against plain passes."""

from __future__ import annotations

import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from dufs.bench.common import (
    WorkerPeak,
    bench_store,
    describe,
    local_cluster,
    median,
    plain_pass_and_ceiling,
    plain_pass_seconds,
    say_speedup,
    worker_blocks_bytes,
)


def m3fs_bench(*, rows: int = 200_000, features: int = 1_000_000, nnz_per_row: int = 30, work_dir: Path | None = None,
               store: Path | None = None, console: Any = None, workers: tuple[int, ...] = (1, 2), repeats: int = 5,
               seed: int = 0, n_features: int = 50, max_iter: int = 3, n_anchors: int = 256,
               embed_dim: int = 32) -> dict:
    """:func:`dufs.methods.m3fs.alternating.m3fs_alternating` (two clusters, standardize "scale", anchor graph of
    ``n_anchors``) on the store, blocks persisted, with 1 and 2 workers: the median time of an outer iteration
    (labels, the v-step's FISTA iterations, the sigma step) and of one v-solver iteration, after a warm-up run of
    two short iterations, against plain ``Matrix.rmatvec(v)`` passes in the same cluster; peak RSS per worker during
    the runs. ``repeats`` runs of ``max_iter`` outer iterations, each between plain passes (3 before, 3 after)
    that are its reference: this machine's speed halves for a minute at times (docs/measurements.md, "Benches"),
    and a run and its passes then share the conditions; the figure is the median of the runs' ratios."""
    from dufs.engine import as_matrix
    from dufs.engine.graphs import anchor_graph
    from dufs.methods.m3fs import m3fs_alternating

    say = console.print if console is not None else print
    st = bench_store(rows, features, nnz_per_row, seed, work_dir, store, say)
    n, d = st.shape
    res: dict[str, Any] = describe(st, f"M3FS alternating, m = {n_features}, {max_iter} outer iterations, anchor "
                                        f"graph of {n_anchors} anchors", say)
    v = np.random.default_rng(seed).standard_normal(n)
    for w in workers:
        with local_cluster(w) as client, client.as_current(), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Sending large graph", category=UserWarning)
            M = as_matrix(st.path, standardize="scale", persist=True)
            M.column_stats()
            # built on each cluster: the graph's row pieces live on the workers of the cluster that built it
            t0 = time.perf_counter()
            Wg = anchor_graph(M, n_anchors, 3, embed_dim=embed_dim, random_state=seed, keep_embedding=False)
            res.setdefault("graph_s", time.perf_counter() - t0)
            ref = plain_pass_and_ceiling(client, M, v, 3)
            bb = max(client.run(worker_blocks_bytes).values())
            kw = dict(n_features=n_features, C=10.0, lambda_=0.01, W=Wg, alternations=1, init="random",
                      random_state=seed)
            # a warm-up (as the plain pass has): the kernels loaded from numba's cache in every process, a cost
            # each process pays once (docs/measurements.md, "Benches"), not an iteration's; two outer
            # iterations, as the second v-step starts from the state the first left (kernels of its own)
            m3fs_alternating(M, max_iter=2, inner_max_iter=2, polish=0, **kw)
            with WorkerPeak(client) as wp:
                runs = _timed_runs(M, v, ref, kw, max_iter, repeats)
            res[f"w{w}"] = _run_figures(ref, runs, wp.peak, bb)
            M.release()
    _m3fs_table(res, workers, say)
    return res


def _timed_runs(M: Any, v: np.ndarray, ref: dict, kw: dict, max_iter: int, repeats: int) -> list[dict[str, Any]]:
    """``repeats`` runs of ``max_iter`` outer iterations, each with the plain passes around it (3 before, 3 after;
    the first run's before are ``ref``'s): their medians, passes, wall time and result."""
    from dufs.methods.m3fs import m3fs_alternating

    runs: list[dict[str, Any]] = []
    for i in range(max(1, int(repeats))):
        before = ref["pass_walls_s"] if i == 0 else plain_pass_seconds(M, v, 3)
        t0 = time.perf_counter()
        # no polish (its label flips re-run the solve warm, on at most 5,000 samples by default): not an outer
        # iteration, and no figure here reads it
        r = m3fs_alternating(M, max_iter=max_iter, inner_max_iter=50, polish=0, **kw)
        wall = time.perf_counter() - t0
        passes = before + plain_pass_seconds(M, v, 3)
        dg = r.diagnostics
        per_inner = [t / max(k, 1) for t, k in zip(dg["iteration_seconds"], dg["inner_iterations"],
                                                   strict=True)]
        runs.append({"iteration_s": median(dg["iteration_seconds"]), "inner_s": median(per_inner),
                     "pass_s": median(passes), "passes": passes, "wall_s": wall, "result": r})
    return runs


def _run_figures(ref: dict, runs: list[dict[str, Any]], peak: float, bb: int) -> dict:
    """The figures of one cluster size: the median of the runs' ratios to their passes, and the median run's."""
    ratio = [x["iteration_s"] / x["pass_s"] for x in runs]
    mid = runs[int(np.argsort(ratio, kind="stable")[(len(runs) - 1) // 2])]  # the run of median ratio
    dg = mid["result"].diagnostics
    return {**ref, "pass_s": mid["pass_s"], "pass_walls_s": [t for x in runs for t in x["passes"]],
            "ratio": median(ratio), "ratios": ratio, "iteration_s": mid["iteration_s"],
            "iterations_s": [x["iteration_s"] for x in runs],
            "passes_s": [x["pass_s"] for x in runs], "inner_iteration_s": mid["inner_s"],
            "inner_ratio": median([x["inner_s"] / x["pass_s"] for x in runs]),
            "inner_iterations": dg["inner_iterations"],
            "passes_per_iteration": dg["passes_per_iteration"], "wall_s": mid["wall_s"],
            "peak": peak, "blocks_bytes": bb, "objective": mid["result"].objective.tolist(),
            "selected": mid["result"].selected[:5].tolist()}


def _m3fs_table(res: dict, workers: tuple[int, ...], say: Any) -> None:
    """Print the figures: each cluster size's runs against their passes, and the speed-up."""
    say(f"anchor graph built on each cluster (the same graph: a fixed seed), on the first in {res['graph_s']:.1f} s")
    for w in workers:
        o = res[f"w{w}"]
        each = ", ".join(f"{t:.2f} s / {p * 1e3:.1f} ms = {q:.1f}"
                         for t, p, q in zip(o["iterations_s"], o["passes_s"], o["ratios"], strict=True))
        say(f"  {w} worker{'s' if w > 1 else ' '}: outer iteration = {o['ratio']:.1f} plain passes' time (target "
            f"<= 25; the median of {len(o['ratios'])} runs, each its outer iterations' median against the 6 passes "
            f"just before and after it: {each}); the median run: outer iteration {o['iteration_s']:.2f} s, plain "
            f"pass Z^T v {o['pass_s'] * 1e3:.1f} ms ({o['inner_iterations']} v-solver iterations, "
            f"{o['passes_per_iteration']} passes over the data); one v-solver iteration {o['inner_iteration_s']:.3f} "
            f"s = {o['inner_ratio']:.2f}x a pass (median of the runs; its two products in one sweep); peak RSS per "
            f"worker {o['peak'] / 1e6:.0f} MB (blocks {o['blocks_bytes'] / 1e6:.0f} MB)")
    if 1 in workers and 2 in workers:
        res["speedup_2w"] = res["w1"]["iteration_s"] / res["w2"]["iteration_s"]
        say(f"  speed-up of an outer iteration, 2 workers vs 1: {res['speedup_2w']:.2f}x")
        say_speedup(res, res["speedup_2w"], "M3FS outer iteration", say)
