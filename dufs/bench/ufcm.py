"""``dufs bench ufcm``: UFCM outer iterations on the kddb-like store against plain passes over the same blocks."""

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
    rss,
    say_speedup,
    worker_blocks_bytes,
)


def ufcm_bench(*, rows: int = 200_000, features: int = 1_000_000, nnz_per_row: int = 30, work_dir: Path | None = None,
               store: Path | None = None, console: Any = None, workers: tuple[int, ...] = (1, 2), repeats: int = 3,
               seed: int = 0, n_clusters: int = 10, n_components: int = 10) -> dict:
    """UFCM (matrix-free W step: Lanczos on S_t - alpha S_w - beta D, two passes per product; standardize None,
    centred implicitly) on the store, blocks persisted, with 1 and 2 workers: the median time of an outer
    iteration (``repeats`` iterations after the start; U step, W step, G step) against the median of plain
    ``Matrix.rmatvec(v)`` passes (one vector) in the same cluster, the passes an iteration makes, and peak RSS per
    worker during the run."""
    from dufs.engine import as_matrix
    from dufs.methods.ufcm import ufcm

    say = console.print if console is not None else print
    st = bench_store(rows, features, nnz_per_row, seed, work_dir, store, say)
    n, d = st.shape
    res: dict[str, Any] = describe(st, f"UFCM c = {n_clusters}, d' = {n_components}, alpha = beta = p = 1, "
                                        f"n_init = 10", say)
    v = np.random.default_rng(seed).standard_normal(n)
    for w in workers:
        with local_cluster(w) as client, client.as_current(), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Sending large graph", category=UserWarning)
            M = as_matrix(st.path, persist=True)
            M.column_stats()
            ref = plain_pass_and_ceiling(client, M, v, max(3, repeats))
            bb = max(client.run(worker_blocks_bytes).values())
            idle = max(client.run(rss).values()) - bb
            with WorkerPeak(client) as wp:
                t0 = time.perf_counter()
                r = ufcm(M, n_clusters=n_clusters, n_components=n_components, max_iter=repeats, tol=0.0,
                         random_state=seed, dense_below=2000)
                wall = time.perf_counter() - t0
            hist = r.diagnostics["history"]
            iters = len(hist)
            out = {**ref, "iter_s": median([h["seconds"] for h in hist]),
                   "setup_s": r.diagnostics["timings"]["setup"], "wall_s": wall, "iterations": iters,
                   "passes_per_iter": (r.diagnostics["passes"] - 0) / max(iters, 1),
                   "products": r.diagnostics["operator_products"], "timings": r.diagnostics["timings"],
                   "peak": wp.peak, "blocks_bytes": bb, "idle": idle,
                   "objective": [float(f) for f in r.objective]}
            M.release()
        res[f"w{w}"] = out
    _table(res, workers, say, n)
    return res


def _table(res: dict, workers: tuple[int, ...], say: Any, n: int) -> None:
    for w in workers:
        v = res[f"w{w}"]
        ratio = v["iter_s"] / v["pass_s"]
        res[f"w{w}"]["iter_over_pass"] = ratio
        t = v["timings"]
        say(f"  {w} worker{'s' if w > 1 else ' '}: plain pass Z^T v {v['pass_s']:.3f} s; UFCM outer iteration "
            f"{v['iter_s']:.2f} s = {ratio:.0f}x a pass (target <= 60; about {v['passes_per_iter']:.0f} passes an "
            f"iteration, "
            f"{v['iter_s'] / max(v['passes_per_iter'], 1) / v['pass_s']:.2f}x a plain pass each; W step "
            f"{t['w_step']:.1f} s, U step {t['u_step']:.1f} s over {v['iterations']} iterations); start (column "
            f"statistics, PCA, k-means) {v['setup_s']:.1f} s")
        extra = v["peak"] - v["idle"] - v["blocks_bytes"]
        say(f"    peak RSS per worker {v['peak'] / 1e6:.0f} MB = idle {v['idle'] / 1e6:.0f} MB + blocks "
            f"{v['blocks_bytes'] / 1e6:.0f} MB + {extra / 1e6:.0f} MB ({extra / (n * 8):.1f} vectors of n_samples "
            f"float64)")
    if len(workers) >= 2:
        a, b = res[f"w{workers[0]}"], res[f"w{workers[-1]}"]
        sp = a["iter_s"] / b["iter_s"]
        res["speedup"] = sp
        say(f"  speed-up of an iteration, {workers[-1]} workers vs {workers[0]}: {sp:.2f}x; plain pass "
            f"{a['pass_s'] / b['pass_s']:.2f}x")
        if tuple(workers) == (1, 2):
            say_speedup(res, sp, "UFCM outer iteration", say)
