"""``dufs bench greedy``: LapAOFS steps on the kddb-like store against plain passes over the same blocks."""

from __future__ import annotations

import contextlib
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from dufs.bench.common import (
    WorkerPeak,
    bench_store,
    describe,
    kernel_alone_seconds,
    local_cluster,
    median,
    plain_pass_seconds,
    rss,
    say_speedup,
    worker_blocks_bytes,
)


def greedy(*, rows: int = 2_000_000, features: int = 5_000_000, nnz_per_row: int = 30, work_dir: Path | None = None,
           store: Path | None = None, console: Any = None, workers: tuple[int, ...] = (1, 2), seed: int = 0,
           ks: tuple[int, ...] = (50, 200), repeats: int = 5, n_anchors: int = 256, embed_dim: int = 32) -> dict:
    """LapAOFS (anchor graph, standardize None) on the store, blocks persisted, with 1 and 2 workers: the median
    time of a greedy step (its pass Z^T [B r, B Z_S d] with the candidates' update and proposals, and the driver's
    part) against the median of plain ``Matrix.rmatvec(v)`` passes (one vector) in the same cluster; the 2-worker
    speed-up of a step; peak RSS per worker after k = 50 and k = 200 steps (it must not grow with k beyond the k
    selected columns, which live on the driver)."""
    from dufs.engine import as_matrix
    from dufs.engine.graphs import anchor_graph
    from dufs.methods.greedy import lapofs

    say = console.print if console is not None else print
    st = bench_store(rows, features, nnz_per_row, seed, work_dir, store, say)
    n, d = st.shape
    res: dict[str, Any] = describe(st, f"LapAOFS (lambda1 = lambda2 = 0.01, anchor graph of {n_anchors} anchors)", say)
    v = np.random.default_rng(seed).standard_normal(n)
    for w in workers:
        with local_cluster(w) as client, client.as_current(), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Sending large graph", category=UserWarning)
            M = as_matrix(st.path, persist=True)
            M.column_stats()
            # built on each cluster: the graph's row pieces live on the workers of the cluster that built it
            t0 = time.perf_counter()
            Wg = anchor_graph(M, n_anchors, 3, embed_dim=embed_dim, random_state=seed, keep_embedding=False)
            res.setdefault("graph_s", time.perf_counter() - t0)
            before = plain_pass_seconds(M, v, repeats)
            ref: dict[str, Any] = {"kernel_s": kernel_alone_seconds(client, v, repeats)}
            floor = _step_floor(client, n, seed, repeats)
            ref.update({key: max(f[key] for f in floor.values()) for key in ("one_s", "two_s", "pass_kernel_s")})
            bb = max(client.run(worker_blocks_bytes).values())
            idle = max(client.run(rss).values()) - bb
            out: dict[str, Any] = {**ref, "blocks_bytes": bb, "idle": idle}
            for k in ks if w == max(workers) else ks[:1]:
                with WorkerPeak(client) as wp:
                    t0 = time.perf_counter()
                    r = lapofs(M, n_features=k, criterion="A", W=Wg, checkpoint=None)
                    wall = time.perf_counter() - t0
                steps = r.diagnostics["step_seconds"][1:]  # the first includes the start pass
                calls = [c for c in r.diagnostics["pass_call_seconds"][1:] if c is not None]
                out[f"k{k}"] = {"step_s": median(steps), "wall_s": wall, "peak": wp.peak,
                                "driver_s": median(r.diagnostics["driver_seconds"][1:]),
                                "update_s": median(r.diagnostics["pass_seconds"][1:]),
                                "rest_s": median([t - u - dr for t, u, dr in zip(
                                    steps, r.diagnostics["pass_seconds"][1:], r.diagnostics["driver_seconds"][1:],
                                    strict=True)]),
                                "calls_s": median(calls) if calls else None,
                                "first": r.indices[:5].tolist()}
            k0 = ks[0]
            # LapDOFS updates the Schur complements only: its pass gathers one vector, not two
            rd = lapofs(M, n_features=k0, criterion="D", W=Wg, checkpoint=None)
            out["d_step_s"] = median(rd.diagnostics["step_seconds"][1:])
            # the cost of checkpointing every block's candidates every step (to the store's side directory)
            side = f"{st.path}.dufs-side/bench-greedy-{w}"
            t0 = time.perf_counter()
            rc = lapofs(M, n_features=k0, criterion="A", W=Wg, checkpoint=side, checkpoint_every=1)
            out["checkpoint_step_s"] = median(rc.diagnostics["step_seconds"][1:])
            import shutil

            shutil.rmtree(side, ignore_errors=True)
            # the reference from passes before the steps and after them (a pass's time drifts with the host)
            passes = before + plain_pass_seconds(M, v, repeats)
            out.update(pass_s=median(passes), passes_s=passes)
            M.release()
        res[f"w{w}"] = out
    _table(res, workers, ks, say, n, d)
    return res


def _step_floor(client: Any, n: int, seed: int, repeats: int) -> dict:
    """:func:`_step_kernels_alone` on every worker at once, its vectors where a step's go (one copy in shared memory
    for the workers where :func:`~dufs.engine.shm.shared_eligible`, else each worker its own)."""
    from dufs.engine.shm import publish, shared_eligible
    from dufs.kernels.greedy import A_OPTIMAL, D_OPTIMAL
    from dufs.methods.greedy.partition import _step_dtype

    V2 = np.random.default_rng(seed).standard_normal((n, 2))
    V1 = np.ascontiguousarray(V2[:, :1])  # the plain pass's
    # as the steps ship them
    Vd, Va = V1.astype(_step_dtype(D_OPTIMAL, V1.shape)), V2.astype(_step_dtype(A_OPTIMAL, V2.shape))
    with contextlib.ExitStack() as stack:
        refs = [stack.enter_context(publish(V)) if shared_eligible(client, V) else V for V in (V1, Vd, Va)]
        return client.run(_step_kernels_alone, V1=refs[0], Vd=refs[1], Va=refs[2], repeats=repeats)


def _step_kernels_alone(dask_worker: Any, V1: Any, Vd: Any, Va: Any, repeats: int) -> dict[str, float]:
    """The floor of a greedy step on this worker, no Dask: the median seconds of the step's kernel
    (:func:`~dufs.kernels.greedy.greedy_update`, identity transform, into spare arrays) over this worker's persisted
    blocks with one vector ``Vd`` (LapDOFS, ``one_s``) and with two, ``Va`` (LapAOFS, ``two_s``), in the dtype the
    steps ship them in, and of the plain pass's kernel (``csc_rmatvec``, one float64 vector ``V1``,
    ``pass_kernel_s``); every output's pages touched before the clock starts."""
    from dufs.engine import FeatureBlock
    from dufs.engine.shm import local_array
    from dufs.kernels.blockops import csc_rmatvec
    from dufs.kernels.greedy import A_OPTIMAL, D_OPTIMAL, greedy_update

    blocks = [b for b in list(dask_worker.data.values()) if isinstance(b, FeatureBlock)]
    if not blocks:
        return {"one_s": 0.0, "two_s": 0.0, "pass_kernel_s": 0.0}
    V1, Vd, Va = local_array(V1), local_array(Vd), local_array(Va)
    vs = np.asarray(Va.sum(axis=0), dtype=np.float64)
    st = [{k: np.full(b.width, 1.0 + i) for i, k in enumerate(("s", "v", "s_out", "v_out", "tiny"))} for b in blocks]
    for x in st:
        x["tiny"][:] = 1e-10
        x["sel"] = np.zeros(x["s"].shape[0], dtype=np.bool_)
    outs = [np.empty((b.width, 1)) for b in blocks]

    def run(V: np.ndarray, mode: int) -> None:
        for b, x in zip(blocks, st, strict=True):
            greedy_update(b.indptr, b.indices, b.data, None, None, V, vs[:V.shape[1]], 1e6, 1.0, x["s"], x["v"],
                          x["sel"], mode, x["tiny"], x["s_out"], x["v_out"])

    def rmatvec() -> None:
        for b, o in zip(blocks, outs, strict=True):
            csc_rmatvec(b.indptr, b.indices, b.data, V1, o)

    out: dict[str, list[float]] = {"one_s": [], "two_s": [], "pass_kernel_s": []}
    calls = {"one_s": lambda: run(Vd, D_OPTIMAL), "two_s": lambda: run(Va, A_OPTIMAL), "pass_kernel_s": rmatvec}
    for f in calls.values():
        f()  # untimed: compiles, faults the pages in
    for _ in range(repeats):  # interleaved: the three see the same moments of a noisy machine
        for key, f in calls.items():
            t0 = time.perf_counter()
            f()
            out[key].append(time.perf_counter() - t0)
    return {key: median(ts) for key, ts in out.items()}


def _table(res: dict, workers: tuple[int, ...], ks: tuple[int, ...], say: Any, n: int, d: int) -> None:
    say(f"anchor graph built on each cluster (the same graph: a fixed seed), on the first in {res['graph_s']:.1f} s")
    k0 = ks[0]
    for w in workers:
        v = res[f"w{w}"]
        step = v[f"k{k0}"]["step_s"]
        drv = v[f"k{k0}"]["driver_s"]
        say(f"  {w} worker{'s' if w > 1 else ' '}: plain pass Z^T v {v['pass_s']:.3f} s (median of "
            f"{len(v['passes_s'])}, half before the steps and half after); LapAOFS step (k = {k0}) "
            f"{step:.3f} s = {step / v['pass_s']:.2f}x a pass (target <= 1.5), of which the driver {drv:.3f} s; "
            f"LapDOFS step {v['d_step_s']:.3f} s = {v['d_step_s'] / v['pass_s']:.2f}x; LapAOFS with every block's "
            f"candidates checkpointed each step {v['checkpoint_step_s']:.3f} s")
        up, calls = v[f"k{k0}"]["update_s"], v[f"k{k0}"]["calls_s"]
        say(f"    where a step goes (medians): the update pass {up:.3f} s"
            + (f" (the slower worker's calls {calls:.3f} s, the rest {up - calls:.3f} s: V shipped, the calls "
               f"started, the proposals back)" if calls is not None else " (run as tasks)")
            + f", the driver {drv:.3f} s (the next V: Z_S^T B z_p over z_p's rows, then B Z_S (c, d) in one sweep "
              f"over the selected columns' bit mask and the anchor graph's rows), the rest "
              f"{v[f'k{k0}']['rest_s']:.3f} s (the winner chosen, its column placed)")
        if v.get("pass_kernel_s"):
            pk = v["pass_kernel_s"]
            fa, fd = v["two_s"] / pk, v["one_s"] / pk
            v["floor_a"], v["floor_d"] = fa, fd
            say(f"    the step's floor, its kernel alone (no Dask, no driver) against the pass's kernel alone, this "
                f"run: LapAOFS (two vectors, as its steps ship them) {v['two_s'] * 1e3:.0f} ms = {fa:.2f}x, "
                f"LapDOFS (one, as shipped) {v['one_s'] * 1e3:.0f} ms = "
                f"{fd:.2f}x (pass kernel {pk * 1e3:.0f} ms): the steps reach {fa / (step / v['pass_s']):.0%} and "
                f"{fd / (v['d_step_s'] / v['pass_s']):.0%} of it")
    if 1 in workers and 2 in workers:
        sp = res["w1"][f"k{k0}"]["step_s"] / res["w2"][f"k{k0}"]["step_s"]
        res["speedup_2w"] = sp
        say(f"  speed-up of a step, 2 workers vs 1: {sp:.2f}x (target >= 1.6); LapDOFS step "
            f"{res['w1']['d_step_s'] / res['w2']['d_step_s']:.2f}x; plain pass "
            f"{res['w1']['pass_s'] / res['w2']['pass_s']:.2f}x")
        say_speedup(res, sp, f"LapAOFS step (k = {k0})", say)
    w = max(workers)
    v = res[f"w{w}"]
    vec = n * 8
    for k in ks:
        if f"k{k}" not in v:
            continue
        pk = v[f"k{k}"]["peak"]
        extra = pk - v["idle"] - v["blocks_bytes"]
        say(f"  {w} workers, k = {k}: peak RSS per worker {pk / 1e6:.0f} MB = idle {v['idle'] / 1e6:.0f} MB + blocks "
            f"{v['blocks_bytes'] / 1e6:.0f} MB + {extra / 1e6:.0f} MB ({extra / vec:.1f} vectors of n_samples "
            f"float64; the candidates' state is {25 * d / w / 1e6:.0f} MB)")
    if all(f"k{k}" in v for k in ks) and len(ks) >= 2:
        a, b = v[f"k{ks[0]}"]["peak"], v[f"k{ks[-1]}"]["peak"]
        res["peak_growth"] = b / a
        say(f"  peak at k = {ks[-1]} / peak at k = {ks[0]}: {b / a:.2f}x (target: no growth with k on the workers)")
