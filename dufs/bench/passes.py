"""``dufs bench pass``: one ``Matrix.rmatvec(v)`` pass with 1 and 2 workers against SciPy's ``X.T @ v`` in one
process, where the time of a pass goes, and whether the results agree."""

from __future__ import annotations

import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from dufs.bench.common import bench_store, describe, local_cluster, median


def _load_csc(store: Any) -> Any:
    """The whole store as a SciPy ``csc_array`` with its own dtype (float32), read block by block."""
    import scipy.sparse as sp

    n, d = store.shape
    indptr, indices, data = [np.zeros(1, np.int64)], [], []
    off = 0
    for i in range(store.n_blocks("csc")):
        b = store.block(i, "csc")
        ip = np.asarray(b.indptr, dtype=np.int64)
        indptr.append(ip[1:] - ip[0] + off)
        off += int(ip[-1] - ip[0])
        indices.append(b.indices)
        data.append(b.data)
    ip = np.concatenate(indptr)
    ix = np.concatenate(indices) if indices else np.zeros(0, np.int32)
    dt = np.concatenate(data) if data else np.zeros(0, store.dtype)
    # keep int32 indices when they fit, as SciPy would (its products are fastest so)
    if off < 2**31:
        ip = ip.astype(np.int32)
    return sp.csc_array((dt, ix.astype(np.int32, copy=False), ip), shape=(n, d))



def _task_timeline(records: list, prefix: str) -> tuple[float, float, float]:
    """``(compute seconds summed, first compute start, last compute stop)`` (wall-clock times) of the task-stream
    records whose key starts with ``prefix``."""
    total, first, last = 0.0, float("inf"), float("-inf")
    for r in records:
        key = r.get("key")
        name = key[0] if isinstance(key, tuple) else key
        if not str(name).startswith(prefix):
            continue
        for ss in r.get("startstops", ()):
            if ss.get("action") == "compute":
                total += ss["stop"] - ss["start"]
                first = min(first, ss["start"])
                last = max(last, ss["stop"])
    return total, first, last



def pass_(*, rows: int = 2_000_000, features: int = 5_000_000, nnz_per_row: int = 30, repeats: int = 7,
          work_dir: Path | None = None, store: Path | None = None, console: Any = None,
          workers: tuple[int, ...] = (1, 2), seed: int = 0) -> dict:
    """One ``Matrix.rmatvec(v)`` pass (v dense over the samples) with 1 and 2 workers, blocks persisted on them,
    against SciPy's ``X.T @ v`` in one process on the same data in memory (float32 data and v). Medians of
    ``repeats`` passes after a warm-up; also where the time of one pass goes (task compute vs wall) and whether
    the results agree."""
    from distributed import get_task_stream

    from dufs.engine import as_matrix
    from dufs.engine.blocks import block_rmatvec

    say = console.print if console is not None else print
    st = bench_store(rows, features, nnz_per_row, seed, work_dir, store, say)
    n, d = st.shape
    res: dict[str, Any] = describe(st, f"median of {repeats} passes after a warm-up", say)

    # the reference: SciPy in this process, float32 data and vector (no upcast, no copy of the matrix)
    X = _load_csc(st)
    v = np.random.default_rng(seed).standard_normal(n).astype(X.dtype)
    XT = X.T
    ref = XT @ v  # warm
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        ref = XT @ v
        times.append(time.perf_counter() - t0)
    res["scipy_s"] = median(times)
    ref = np.asarray(ref, dtype=np.float64)
    ref_norm = float(np.linalg.norm(ref)) or 1.0
    del X, XT

    res["v_mib"] = n * np.dtype(v.dtype).itemsize / 2**20  # V is shipped in its own dtype (float32 here)
    for w in workers:
        with local_cluster(w) as client, client.as_current(), warnings.catch_warnings():
            # "Sending large graph": V travels in the graph; the breakdown below accounts for it
            warnings.filterwarnings("ignore", message="Sending large graph", category=UserWarning)
            M = as_matrix(st.path, persist=True)
            if M.residency.get("mode") != "persisted":
                say(f"[yellow]warning: the blocks were not persisted ({M.residency.get('reason')})[/yellow]"
                    if console is not None else f"warning: blocks not persisted ({M.residency.get('reason')})")
            out = M.rmatvec(v)  # warm-up: numba compilation in the workers
            M.rmatvec(v)
            times, comp, lead, tail = [], [], [], []
            for _ in range(repeats):
                with get_task_stream(client) as ts:
                    t0, w0 = time.perf_counter(), time.time()
                    out = M.rmatvec(v)
                    times.append(time.perf_counter() - t0)
                    w1 = time.time()
                # the pass's task keys are named after its block function (dask.delayed's key prefix)
                c, first, last = _task_timeline(ts.data, block_rmatvec.__name__)
                if c <= 0.0:
                    raise RuntimeError(f"no {block_rmatvec.__name__} task in the task stream: the breakdown would "
                                       f"be empty (task keys: {sorted({str(r.get('key'))[:40] for r in ts.data})[:5]})")
                comp.append(c)
                lead.append(first - w0)
                tail.append(w1 - last)
            # the kernel alone, no Dask: each worker loops over its own persisted blocks, all workers at once
            kern = client.run(_kernel_alone, v=v, repeats=repeats)
            res[f"w{w}_kernel_s"] = max(kern.values())
            resident = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                h = M.rmatvec(v, gather=False)  # the per-block results stay on the workers
                resident.append(time.perf_counter() - t0)
                h.release()
            M.release()
        res[f"w{w}_resident_s"] = median(resident)
        res[f"w{w}_s"] = median(times)
        res[f"w{w}_compute_s"] = median(comp)
        res[f"w{w}_lead_s"] = median(lead)
        res[f"w{w}_tail_s"] = median(tail)
        res[f"w{w}_maxdiff"] = float(np.max(np.abs(np.asarray(out, dtype=np.float64) - ref))) / ref_norm

    _pass_table(res, workers, say, console)
    return res



def _kernel_alone(dask_worker: Any, v: np.ndarray, repeats: int) -> float:
    """Median seconds of ``csc_rmatvec`` over the blocks persisted on this worker (runs in the worker)."""
    from dufs.engine import FeatureBlock
    from dufs.kernels.blockops import csc_rmatvec

    blocks = [b for b in list(dask_worker.data.values()) if isinstance(b, FeatureBlock)]
    V = np.ascontiguousarray(v[:, None])
    outs = [np.empty((b.width, 1)) for b in blocks]
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for b, o in zip(blocks, outs, strict=True):
            csc_rmatvec(b.indptr, b.indices, b.data, V, o)
        times.append(time.perf_counter() - t0)
    return median(times)



def _pass_table(res: dict, workers: tuple[int, ...], say: Any, console: Any) -> None:
    nnz = res["nnz"]
    sc = res["scipy_s"]
    rows = [("SciPy X.T @ v (1 process)", sc, "1.00x", "")]
    for w in workers:
        t = res[f"w{w}_s"]
        rows.append((f"dufs rmatvec, {w} worker{'s' if w > 1 else ''}", t, f"{t / sc:.2f}x",
                     f"{res[f'w{w}_maxdiff']:.1e}"))
    for w in workers:
        t = res[f"w{w}_resident_s"]
        rows.append((f"  same, result left on the worker{'s' if w > 1 else ''}", t, f"{t / sc:.2f}x", ""))
    if 1 in workers:
        res["ratio_1w_scipy"] = res["w1_s"] / sc
    if 1 in workers and 2 in workers:
        res["speedup_2w"] = res["w1_s"] / res["w2_s"]
        res["speedup_2w_resident"] = res["w1_resident_s"] / res["w2_resident_s"]
    try:
        from rich.table import Table
    except ImportError:  # pragma: no cover - rich comes with typer
        Table = None
    if console is not None and Table is not None:
        tab = Table(title="one rmatvec pass (median)")
        for c in ("", "ms", "vs SciPy", "Mnnz/s", "max |diff| / ||ref||"):
            tab.add_column(c, justify="left" if not c else "right")
        for name, t, ratio, diff in rows:
            tab.add_row(name, f"{t * 1e3:.1f}", ratio, f"{nnz / t / 1e6:.0f}", diff)
        console.print(tab)
    else:
        for name, t, ratio, diff in rows:
            say(f"{name:30s}: {t * 1e3:9.1f} ms  {ratio:>6s} SciPy  {nnz / t / 1e6:7.0f} Mnnz/s  {diff}")
    if "ratio_1w_scipy" in res:
        say(f"1 worker / SciPy               : {res['ratio_1w_scipy']:.2f}x (target <= 1.3)")
    if "ratio_1w_scipy" in res:
        say(f"  result left on the worker    : {res['w1_resident_s'] / sc:.2f}x")
    if "speedup_2w" in res:
        say(f"speed-up 2 workers vs 1        : {res['speedup_2w']:.2f}x (target >= 1.7); result left on the "
            f"workers: {res['speedup_2w_resident']:.2f}x")
    for w in workers:
        t, c, a, z = res[f"w{w}_s"], res[f"w{w}_compute_s"], res[f"w{w}_lead_s"], res[f"w{w}_tail_s"]
        gaps = max(t - a - z - c / w, 0.0)
        say(f"where a pass goes, {w} worker{'s' if w > 1 else ' '}   : {t * 1e3:.1f} ms wall = block tasks compute "
            f"{c / w * 1e3:.1f} ms a worker ({c * 1e3:.1f} summed; {c / w / t:.0%}) + dask and transfer overhead "
            f"{(t - c / w) * 1e3:.1f} ms ({(t - c / w) / t:.0%}): before the first task {a * 1e3:.1f} ms (graph, "
            f"V shipped in it: {res['v_mib']:.1f} MiB, scheduling), between tasks {gaps * 1e3:.1f} ms, "
            f"after the last {z * 1e3:.1f} ms (results back, {res['n_features'] * 8 / 2**20:.1f} MiB, concatenated)")
    if 1 in workers and 2 in workers:
        k1, k2 = res["w1_kernel_s"], res["w2_kernel_s"]
        say(f"the kernel alone, no Dask (each worker over its own blocks, all at once): 1 worker {k1 * 1e3:.1f} ms, "
            f"2 workers {k2 * 1e3:.1f} ms: this machine's ceiling for the 2-worker speed-up is {k1 / k2:.2f}x")
    ok = all(res[f"w{w}_maxdiff"] < 1e-4 for w in workers)
    say(f"results agree with SciPy: {'yes' if ok else 'NO'} (max |dufs - SciPy| / ||SciPy|| = "
        f"{max(res[f'w{w}_maxdiff'] for w in workers):.1e}; SciPy sums in float32, dufs in float64)")
    res["agree"] = ok
