"""``dufs bench pass``: one ``Matrix.rmatvec(v)`` pass with 1 and 2 workers against SciPy's ``X.T @ v`` in one
process, where the time of a pass goes, and whether the results agree."""

from __future__ import annotations

import contextlib
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from dufs.bench.common import bench_store, describe, kernel_alone_seconds, local_cluster, median, say_ceiling


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



def _task_timeline(records: list, prefix: str | tuple[str, ...]) -> tuple[float, float, float]:
    """``(compute seconds summed, first compute start, last compute stop)`` (wall-clock times) of the task-stream
    records whose key starts with ``prefix`` (or one of them)."""
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
    against SciPy's ``X.T @ v`` in one process on the same data in memory (float32 data and v), and the machine's
    ceiling: the numba kernel alone over each worker's persisted blocks. The four are measured in turn, ``repeats``
    rounds after a warm-up, each round on every cluster size in turn (the clusters are all up, idle but for their
    turn: this machine's speed drifts by tens of percent within a minute, and interleaving puts every figure and
    its reference under the same conditions); medians. Also where the time of one pass goes (task
    compute vs wall) and whether the results agree."""
    say = console.print if console is not None else print
    st = bench_store(rows, features, nnz_per_row, seed, work_dir, store, say)
    n, d = st.shape
    res: dict[str, Any] = describe(st, f"median of {repeats} rounds after a warm-up, each round SciPy, dufs, dufs "
                                      f"with the result left on the workers and the kernel alone, in turn", say)

    # the reference: SciPy in this process, float32 data and vector (no upcast, no copy of the matrix)
    X = _load_csc(st)
    v = np.random.default_rng(seed).standard_normal(n).astype(X.dtype)
    XT = X.T
    ref = np.asarray(XT @ v, dtype=np.float64)  # warm
    ref_norm = float(np.linalg.norm(ref)) or 1.0

    res["v_mib"] = n * np.dtype(v.dtype).itemsize / 2**20  # V is shipped in its own dtype (float32 here)
    with contextlib.ExitStack() as stack, warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Sending large graph", category=UserWarning)
        # every cluster up at once, idle but for its turn: each round measures every cluster size in turn, so the
        # 2-worker speed-up and its ceiling compare figures taken under the same conditions (one cluster after the
        # other put minutes of this machine's drift between them: docs/measurements.md, "Benches")
        on: dict[int, tuple[Any, Any]] = {}
        for w in workers:
            on[w] = _warm_cluster(stack, w, st.path, v, say, console)
        keys = ("sc", "times", "comp", "lead", "tail", "resident", "kern", "t32")
        got: dict[int, dict[str, list]] = {w: {k: [] for k in keys} for w in workers}
        out: dict[int, Any] = {}
        out32: dict[int, Any] = {}
        for _ in range(repeats):
            for w in workers:
                client, M = on[w]
                with client.as_current():
                    out[w], out32[w] = _pass_round(client, M, XT, v, got[w])
    for w in workers:
        res.update(_pass_figures(w, got[w], out[w], out32[w], ref, ref_norm))
    del out, out32
    del X, XT
    res["scipy_s"] = median([res[f"w{w}_scipy_s"] for w in workers])
    _pass_table(res, workers, say, console)
    return res


def _warm_cluster(stack: contextlib.ExitStack, w: int, path: Any, v: np.ndarray, say: Any,
                  console: Any) -> tuple[Any, Any]:
    """A cluster of ``w`` workers (closed with ``stack``), the store's blocks persisted on it (released with
    ``stack``), every pass measured run once (numba compiles in the workers): its client and matrix."""
    from dufs.engine import as_matrix

    client = stack.enter_context(local_cluster(w))
    with client.as_current():
        M = as_matrix(path, persist=True)
        if M.residency.get("mode") != "persisted":
            say(f"[yellow]warning: the blocks were not persisted ({M.residency.get('reason')})[/yellow]"
                if console is not None else f"warning: blocks not persisted ({M.residency.get('reason')})")
        M.rmatvec(v)  # warm-up: numba compilation in the workers
        M.rmatvec(v, gather=False).release()
        kernel_alone_seconds(client, v, 1)
        M.rmatvec(v, dtype=np.float32)  # warm: the float32-result kernel compiles
    stack.callback(M.release)
    return client, M


def _pass_round(client: Any, M: Any, XT: Any, v: np.ndarray, g: dict[str, list]) -> tuple[Any, Any]:
    """One round on one cluster: SciPy, the pass (and where its time went), the pass with its result left on the
    workers, the float32-result pass and the kernel alone, their seconds appended to ``g``. Returns the two passes'
    results."""
    from distributed import get_task_stream

    from dufs.engine.blocks import block_rmatvec, partition_rmatvec
    from dufs.engine.direct import last_timeline

    names = (block_rmatvec.__name__, partition_rmatvec.__name__)
    t0 = time.perf_counter()
    XT @ v
    g["sc"].append(time.perf_counter() - t0)
    with get_task_stream(client) as ts:
        t0, w0 = time.perf_counter(), time.time()
        out = M.rmatvec(v)
        g["times"].append(time.perf_counter() - t0)
        w1 = time.time()
    # the pass's task keys are named after its block function (dask.delayed's key prefix); a direct
    # pass (no tasks) reports its calls' times itself
    c, first, last = _task_timeline(ts.data, names)
    if c <= 0.0 and last_timeline():
        c, first, last = (sum(t1 - t0 for _, t0, t1 in last_timeline()),
                          min(t0 for _, t0, _ in last_timeline()),
                          max(t1 for _, _, t1 in last_timeline()))
    if c <= 0.0:
        raise RuntimeError(f"no {' or '.join(names)} task in the task stream: the breakdown would "
                           f"be empty (task keys: "
                           f"{sorted({str(r.get('key'))[:40] for r in ts.data})[:5]})")
    g["comp"].append(c)
    g["lead"].append(first - w0)
    g["tail"].append(w1 - last)
    t0 = time.perf_counter()
    h = M.rmatvec(v, gather=False)  # the per-block results stay on the workers
    g["resident"].append(time.perf_counter() - t0)
    h.release()
    t0 = time.perf_counter()
    out32 = M.rmatvec(v, dtype=np.float32)  # the result in SciPy's dtype: half the bytes back
    g["t32"].append(time.perf_counter() - t0)
    # the kernel alone, no Dask: each worker loops over its own persisted blocks, all workers at
    # once
    g["kern"].append(kernel_alone_seconds(client, v, 1))
    return out, out32


def _pass_figures(w: int, g: dict[str, list], out: Any, out32: Any, ref: np.ndarray, ref_norm: float) -> dict:
    """The figures of ``w`` workers: medians, the split of the median round, the results' distance to SciPy's."""
    res: dict[str, Any] = {}
    times = g["times"]
    res[f"w{w}_scipy_s"] = median(g["sc"])
    res[f"w{w}_kernel_s"] = median(g["kern"])
    res[f"w{w}_resident_s"] = median(g["resident"])
    res[f"w{w}_f32_s"] = median(g["t32"])
    res[f"w{w}_f32_maxdiff"] = float(np.max(np.abs(np.asarray(out32, dtype=np.float64) - ref))) / ref_norm
    res[f"w{w}_s"] = median(times)
    # where the time went: one round's split (the round of median wall time), not each part's median apart.
    # Task times come from the worker's clock, corrected by distributed's estimate of its offset, so a
    # round's lead and tail may trade time with each other; within one round they still add up to its wall
    mid = int(np.argsort(times, kind="stable")[len(times) // 2])
    res[f"w{w}_split_s"] = times[mid]
    res[f"w{w}_compute_s"] = g["comp"][mid]
    res[f"w{w}_lead_s"] = g["lead"][mid]
    res[f"w{w}_tail_s"] = g["tail"][mid]
    res[f"w{w}_maxdiff"] = float(np.max(np.abs(np.asarray(out, dtype=np.float64) - ref))) / ref_norm
    return res



def _pass_table(res: dict, workers: tuple[int, ...], say: Any, console: Any) -> None:
    nnz = res["nnz"]
    rows = []
    for w in workers:
        sc = res[f"w{w}_scipy_s"]
        ws = "s" if w > 1 else ""
        rows.append((f"SciPy X.T @ v (1 process), beside {w} worker{ws}", sc, "1.00x", ""))
        t = res[f"w{w}_s"]
        rows.append((f"dufs rmatvec, {w} worker{ws}", t, f"{t / sc:.2f}x", f"{res[f'w{w}_maxdiff']:.1e}"))
        t = res[f"w{w}_f32_s"]
        rows.append(("  same, float32 result (SciPy's dtype)", t, f"{t / sc:.2f}x", f"{res[f'w{w}_f32_maxdiff']:.1e}"))
        t = res[f"w{w}_resident_s"]
        rows.append((f"  same, result left on the worker{ws}", t, f"{t / sc:.2f}x", ""))
        t = res[f"w{w}_kernel_s"]
        rows.append((f"  the kernel alone, {w} worker{ws}", t, f"{t / sc:.2f}x", ""))
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
            say(f"{name:44s}: {t * 1e3:9.1f} ms  {ratio:>6s} SciPy  {nnz / t / 1e6:7.0f} Mnnz/s  {diff}")
    for w in workers:
        t, c, a, z = res[f"w{w}_split_s"], res[f"w{w}_compute_s"], res[f"w{w}_lead_s"], res[f"w{w}_tail_s"]
        gaps = max(t - a - z - c / w, 0.0)
        say(f"where a pass goes, {w} worker{'s' if w > 1 else ' '}   : the median round, {t * 1e3:.1f} ms wall = tasks "
            f"compute {c / w * 1e3:.1f} ms a worker ({c * 1e3:.1f} summed; {c / w / t:.0%}; the kernel alone "
            f"{res[f'w{w}_kernel_s'] * 1e3:.1f} ms) + dask and transfer overhead {(t - c / w) * 1e3:.1f} ms "
            f"({(t - c / w) / t:.0%}): before the first task {a * 1e3:.1f} ms (V shipped: {res['v_mib']:.1f} MiB, "
            f"scheduling), between tasks {gaps * 1e3:.1f} ms, after the last {z * 1e3:.1f} ms (results back, "
            f"{res['n_features'] * 8 / 2**20:.1f} MiB, placed)")
    ceiling = say_ceiling(res, say)
    if 1 in workers:
        res["ratio_1w_scipy"] = res["w1_s"] / res["w1_scipy_s"]
        res["ratio_1w_scipy_f32"] = res["w1_f32_s"] / res["w1_scipy_s"]
        say(f"1 worker / SciPy               : {res['ratio_1w_scipy_f32']:.2f}x with the result in SciPy's dtype, "
            f"float32 (target <= 1.5); {res['ratio_1w_scipy']:.2f}x with a float64 result (twice the bytes "
            f"back); the result left on the worker {res['w1_resident_s'] / res['w1_scipy_s']:.2f}x; the kernel "
            f"alone {res['w1_kernel_s'] / res['w1_scipy_s']:.2f}x")
    if 1 in workers and 2 in workers:
        res["speedup_2w"] = res["w1_s"] / res["w2_s"]
        res["speedup_2w_resident"] = res["w1_resident_s"] / res["w2_resident_s"]
        frac = f" = {res['speedup_2w'] / ceiling:.0%} of the ceiling (target >= 90%)" if ceiling else ""
        res["fraction_of_ceiling"] = res["speedup_2w"] / ceiling if ceiling else None
        say(f"speed-up 2 workers vs 1        : {res['speedup_2w']:.2f}x{frac}; the result left on the workers: "
            f"{res['speedup_2w_resident']:.2f}x")
    ok = all(res[f"w{w}_maxdiff"] < 1e-4 and res[f"w{w}_f32_maxdiff"] < 1e-4 for w in workers)
    say(f"results agree with SciPy: {'yes' if ok else 'NO'} (max |dufs - SciPy| / ||SciPy|| = "
        f"{max(res[f'w{w}_maxdiff'] for w in workers):.1e}; SciPy sums in float32, dufs in float64)")
    res["agree"] = ok
