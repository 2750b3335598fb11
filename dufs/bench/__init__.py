"""Benchmarks (``dufs bench ...``): figures printed as ratios against a reference measured in the same run.

Never timed assertions in tests: these machines are noisy, so every figure is the median of several runs.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psutil


class _Sampler:
    """A thread sampling the resident memory of some processes every ``interval`` seconds: ``peak_max`` is the
    largest single process seen, ``peak_sum`` the largest total."""

    def __init__(self, interval: float = 0.02):
        self.interval = interval
        self.peak_max = 0
        self.peak_sum = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def processes(self) -> list[psutil.Process]:
        raise NotImplementedError

    def _run(self) -> None:
        while not self._stop.is_set():
            rss = []
            with contextlib.suppress(psutil.Error):
                for p in self.processes():
                    with contextlib.suppress(psutil.Error):
                        rss.append(p.memory_info().rss)
            self.peak_max = max(self.peak_max, max(rss, default=0))
            self.peak_sum = max(self.peak_sum, sum(rss))
            self._stop.wait(self.interval)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()


class PeakRSS(_Sampler):
    """This process and its children."""

    def processes(self) -> list[psutil.Process]:
        me = psutil.Process()
        return [me, *me.children(recursive=True)]


class WorkerPeak(_Sampler):
    """The cluster's worker processes (found by pid); ``peak`` is the largest one."""

    def __init__(self, client: Any, interval: float = 0.02):
        super().__init__(interval)
        pids = list(client.run(os.getpid).values()) if client is not None else [os.getpid()]
        self._procs = [psutil.Process(p) for p in pids]

    def processes(self) -> list[psutil.Process]:
        return self._procs

    @property
    def peak(self) -> int:
        return self.peak_max


def make_libsvm_file(path: Path, size_mb: float, *, copies: int = 1, seed: int = 0) -> int:
    """A kddb-like libsvm text file of about ``size_mb`` MB, repeated ``copies`` times. Returns its size."""
    import io

    from sklearn.datasets import dump_svmlight_file

    from dufs.data.synthetic import SyntheticSpec, generate_rows

    target = int(size_mb * 1e6)
    # about 9 bytes per nonzero ("1234567:1 ") at 30 a row
    rows = max(1000, target // (30 * 9 + 4))
    spec = SyntheticSpec(n_rows=rows, n_features=5_000_000, nnz_per_row=30, n_informative=20, seed=seed)
    import scipy.sparse as sp

    ip, ix, d, y = generate_rows(spec, 0, rows)
    X = sp.csr_matrix((d.astype(np.float64), ix, ip), shape=(rows, spec.n_features))
    buf = io.BytesIO()
    dump_svmlight_file(X, y.astype(np.int64), buf, zero_based=False)
    text = buf.getvalue()
    with open(path, "wb") as f:
        for _ in range(copies):
            f.write(text)
    return len(text) * copies


def _median(xs: list[float]) -> float:
    return float(statistics.median(xs))


def _plain_pass_seconds(M: Any, v: Any, repeats: int) -> list[float]:
    """Wall seconds of ``repeats`` plain ``M.rmatvec(v)`` passes after one warm-up (the method benches' reference)."""
    M.rmatvec(v)
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        M.rmatvec(v)
        out.append(time.perf_counter() - t0)
    return out


@contextlib.contextmanager
def _local_cluster(n_workers: int) -> Iterator[Any]:
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True, dashboard_address=":0",
                      silence_logs=40) as lc, Client(lc, direct_to_workers=True) as client:
        yield client


def ingest(*, size_mb: float = 64.0, repeats: int = 3, work_dir: Path | None = None, console: Any = None,
           block_bytes: int = 8 << 20) -> dict:
    """Our conversion MB/s with 1 and 2 workers against ``load_svmlight_file`` on the same file; peak memory
    per worker for a file 1x and 4x larger."""
    import dask
    from sklearn.datasets import load_svmlight_file

    from dufs.data.convert import convert_libsvm

    say = console.print if console is not None else print
    tmp = tempfile.TemporaryDirectory(dir=work_dir)
    root = Path(tmp.name)
    f1 = root / "base.svm"
    size1 = make_libsvm_file(f1, size_mb)
    f4 = root / "base4.svm"
    size4 = make_libsvm_file(f4, size_mb, copies=4)
    say(f"file: {size1 / 1e6:.1f} MB ({f1}); 4x file: {size4 / 1e6:.1f} MB; blocks of {block_bytes / 2**20:.0f} MiB; "
        f"median of {repeats} runs")
    res: dict[str, Any] = {"size_mb": size1 / 1e6}

    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        load_svmlight_file(str(f1))
        times.append(time.perf_counter() - t0)
    sk = size1 / _median(times) / 1e6
    res["sklearn_mbps"] = sk
    say(f"sklearn load_svmlight_file      : {sk:8.1f} MB/s   (1.00x)")

    for n in (1, 2):
        with _local_cluster(n) as client:
            # warm the workers (numba caches, imports) on a small piece
            convert_libsvm(str(f1), str(root / "warm.zarr"), client=client, overwrite=True,
                           block_bytes=1 << 20)
            times, parse_times = [], []
            for _ in range(repeats):
                t0 = time.perf_counter()
                marks: dict = {}

                def prog(ev: dict, marks: dict = marks) -> None:
                    if ev["stage"] != "parse" and "parsed" not in marks:
                        marks["parsed"] = time.perf_counter()

                convert_libsvm(str(f1), str(root / "out.zarr"), client=client, overwrite=True, progress=prog,
                               block_bytes=block_bytes)
                times.append(time.perf_counter() - t0)
                parse_times.append(marks.get("parsed", time.perf_counter()) - t0)
            mb = size1 / _median(times) / 1e6
            mbp = size1 / _median(parse_times) / 1e6
            res[f"dufs_{n}w_mbps"] = mb
            say(f"dufs convert, {n} worker{'s' if n > 1 else ' '}         : {mb:8.1f} MB/s   "
                f"({mb / sk:.2f}x sklearn; parse stage alone {mbp:.1f} MB/s, {mbp / sk:.2f}x)")
    res["speedup_2w"] = res["dufs_2w_mbps"] / res["dufs_1w_mbps"]
    say(f"2 workers / 1 worker            : {res['speedup_2w']:.2f}x")

    # memory is bounded by the block sizes: give both files blocks of the same size (feature blocks of at most
    # 1M nonzeros; row blocks of block_bytes of text) and the peak per worker must not grow with the file
    for label, f in (("1x", f1), ("4x", f4)):
        with _local_cluster(2) as client:
            convert_libsvm(str(f1), str(root / "warm.zarr"), client=client, overwrite=True,
                           block_bytes=1 << 20)
            with WorkerPeak(client) as wp, PeakRSS() as drv, dask.config.set({"dufs.store.feature-block-nnz": 1 << 20}):
                convert_libsvm(str(f), str(root / "mem.zarr"), client=client, overwrite=True,
                               block_bytes=block_bytes)
            res[f"peak_worker_mb_{label}"] = wp.peak / 1e6
            say(f"peak RSS, {label} file ({f.stat().st_size / 1e6:7.1f} MB): worker {wp.peak / 1e6:7.1f} MB, "
                f"driver {psutil.Process().memory_info().rss / 1e6:7.1f} MB (now), all processes "
                f"{drv.peak_sum / 1e6:7.1f} MB")
    say(f"peak worker memory 4x / 1x      : {res['peak_worker_mb_4x'] / res['peak_worker_mb_1x']:.2f}x "
        f"(target: about 1.0, it must not grow with the file)")
    tmp.cleanup()
    return res


# ---------------------------------------------------------------------------------------------------- one pass
def _store_spec(spec: Any) -> dict:
    """What identifies a synthetic store: compared with a store's ground truth before reusing it."""
    gt = spec.ground_truth()
    return {k: gt[k] for k in ("generator", "seed", "n_rows", "n_features", "nnz_per_row", "zipf_exponent",
                               "label_noise")}


def ensure_synthetic_store(path: Path, spec: Any, *, say: Any = print, n_workers: int = 2) -> Any:
    """The synthetic store of ``spec`` at ``path``: reused when one with the same spec is there, else (re)built
    on a local cluster of ``n_workers``. Returns the opened store."""
    from dufs.data import open_store
    from dufs.data.writers import make_synthetic
    from dufs.errors import DufsError

    want = _store_spec(spec)
    try:
        st = open_store(str(path))
        gt = st.ground_truth or {}
        if {k: gt.get(k) for k in want} == want:
            say(f"store: reusing {path}")
            return st
        say(f"store: {path} holds another data set; rebuilding it")
    except DufsError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    say(f"store: building {spec.n_rows:,} x {spec.n_features:,}, {spec.nnz_per_row} nonzeros a row into {path} "
        f"(once; later runs reuse it)")
    t0 = time.perf_counter()
    with _local_cluster(n_workers) as client:
        st = make_synthetic(str(path), spec, overwrite=True, client=client)
    say(f"store: built in {time.perf_counter() - t0:.1f} s")
    return st


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


def _describe(st: Any, what: str, say: Any) -> dict[str, Any]:
    """Print the store's one-line summary with ``what`` the benchmark runs and the machine's load; return the
    result dict the benchmark fills."""
    n, d = st.shape
    nnz = int(st.nnz)
    say(f"data: {n:,} x {d:,}, {nnz / 1e6:.1f}M nonzeros ({st.dtype}), {st.n_blocks('csc')} feature blocks; {what}; "
        f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    return {"n_rows": n, "n_features": d, "nnz": nnz, "n_blocks": st.n_blocks("csc")}


def _bench_store(rows: int, features: int, nnz_per_row: int, seed: int, work_dir: Path | None,
                 store: Path | None, say: Any) -> Any:
    """The synthetic store the pass and MMFS benchmarks share: ``store``, else one named by its spec under
    ``work_dir`` (default a temp dir), built once and reused."""
    from dufs.data.synthetic import SyntheticSpec

    spec = SyntheticSpec(n_rows=rows, n_features=features, nnz_per_row=nnz_per_row, seed=seed)
    if store is None:
        root = Path(work_dir) if work_dir is not None else Path(tempfile.gettempdir()) / "dufs-bench"
        store = root / f"synthetic-{rows}x{features}x{nnz_per_row}-s{seed}.zarr"
    return ensure_synthetic_store(Path(store), spec, say=say)


def pass_(*, rows: int = 2_000_000, features: int = 5_000_000, nnz_per_row: int = 30, repeats: int = 7,
          work_dir: Path | None = None, store: Path | None = None, console: Any = None,
          workers: tuple[int, ...] = (1, 2), seed: int = 0) -> dict:
    """One ``Matrix.rmatvec(v)`` pass (v dense over the samples) with 1 and 2 workers, blocks persisted on them,
    against SciPy's ``X.T @ v`` in one process on the same data in memory (float32 data and v). Medians of
    ``repeats`` passes after a warm-up; also where the time of one pass goes (task compute vs wall) and whether
    the results agree."""
    from distributed import get_task_stream

    from dufs.engine import as_matrix

    say = console.print if console is not None else print
    st = _bench_store(rows, features, nnz_per_row, seed, work_dir, store, say)
    n, d = st.shape
    res: dict[str, Any] = _describe(st, f"median of {repeats} passes after a warm-up", say)

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
    res["scipy_s"] = _median(times)
    ref = np.asarray(ref, dtype=np.float64)
    ref_norm = float(np.linalg.norm(ref)) or 1.0
    del X, XT

    res["v_mib"] = n * np.dtype(v.dtype).itemsize / 2**20  # V is shipped in its own dtype (float32 here)
    for w in workers:
        with _local_cluster(w) as client, client.as_current(), warnings.catch_warnings():
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
                c, first, last = _task_timeline(ts.data, "_block_rmatvec")
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
        res[f"w{w}_resident_s"] = _median(resident)
        res[f"w{w}_s"] = _median(times)
        res[f"w{w}_compute_s"] = _median(comp)
        res[f"w{w}_lead_s"] = _median(lead)
        res[f"w{w}_tail_s"] = _median(tail)
        res[f"w{w}_maxdiff"] = float(np.max(np.abs(np.asarray(out, dtype=np.float64) - ref))) / ref_norm

    _pass_table(res, workers, say, console)
    return res


def _kernel_alone(dask_worker: Any, v: np.ndarray, repeats: int) -> float:
    """Median seconds of ``csc_rmatvec`` over the blocks persisted on this worker (runs in the worker)."""
    from dufs.engine.matrix import FeatureBlock
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
    return _median(times)


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


# ---------------------------------------------------------------------------------------------------- MMFS
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
        say(f"LIBLINEAR: not measured (liblinear-official is not installed: {e}; pip install 'dufs[bench]')")
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
        res.append({"order": o, "first_s": _median([times[0], *firsts]), "epochs": len(times),
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


def _order_name(o: int) -> str:
    return "random (default)" if o == 0 else "storage order" if o < 0 else f"block-random, runs of {o}"


def _worker_blocks_bytes(dask_worker: Any) -> int:
    from dufs.engine.matrix import FeatureBlock

    return int(sum(b.nbytes for b in list(dask_worker.data.values()) if isinstance(b, FeatureBlock)))


def mmfs(*, rows: int = 2_000_000, features: int = 5_000_000, nnz_per_row: int = 30, work_dir: Path | None = None,
         store: Path | None = None, console: Any = None, workers: tuple[int, ...] = (1, 2), seed: int = 0,
         C: float = 1.0, gamma: float = 1.0, tol: float = 1e-3, ll_eps: tuple[float, ...] = (1.0, 0.1),
         orders: tuple[int, ...] = (0, -1, 64, 256, 1024, 4096), max_epochs: int = 200) -> dict:
    """MMFS-DCD on the kddb-like store: (a) our DCD epoch in this process against LIBLINEAR ``-s 3`` per iteration
    on the same problem; visit orders on one block; (b) ``mmfs`` wall time to ``tol`` with 1 and 2 workers;
    (c) peak memory per worker against its blocks plus O(n_samples) vectors."""
    from dufs.engine import as_matrix
    from dufs.engine.matrix import FeatureBlock
    from dufs.methods.mmfs import geometry, relevance
    from dufs.methods.mmfs import mmfs as run_mmfs

    say = console.print if console is not None else print
    st = _bench_store(rows, features, nnz_per_row, seed, work_dir, store, say)
    n, d = st.shape
    nnz = int(st.nnz)
    y = np.asarray(st.y, dtype=np.float64)
    res: dict[str, Any] = _describe(st, f"MMFS standardize='scale', C={C:g}, gamma={gamma:g}, tol={tol:g}", say)

    # the MMFS geometry (per-feature scaling) and margins, computed once in this process
    t0 = time.perf_counter()
    M0 = as_matrix(st.path, standardize="scale", persist=False)
    geo = geometry(M0)
    rho = relevance(M0, y, geo)  # theta = 0.5: rho = r
    res["geometry_s"] = time.perf_counter() - t0
    blocks = []
    for i in range(st.n_blocks("csc")):
        b = st.block(i, "csc")
        ip = np.asarray(b.indptr, dtype=np.int64)
        blocks.append(FeatureBlock(int(b.start), int(b.stop), ip - ip[0], np.asarray(b.indices),
                                   np.asarray(b.data)))
    say(f"geometry and margins (column stats + relevance pass): {res['geometry_s']:.1f} s; blocks loaded")

    # (a) LIBLINEAR -s 3 vs our epoch on the same problem (margins 1, the same scaled columns, C, gamma)
    ll = _liblinear(blocks, geo, n, d, C=C, gamma=gamma, eps=ll_eps, say=say)
    res["liblinear"] = ll
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
    res["ours"] = ours

    # visit orders on one block (its own MMFS problem: margins rho)
    big = int(np.argmax([b.nnz for b in blocks]))
    res["orders_block"] = big
    res["orders"] = _orders_one_block(blocks[big], geo, rho, m=n, C=C, gamma=gamma, tol=tol, orders=orders,
                                      max_epochs=max_epochs)
    # the same MMFS problem as (b), solved serially over all blocks in this process (one partition)
    res["serial"] = [_serial_to_gap(blocks, geo, rho, m=n, C=C, gamma=gamma, tol=tol, order=o, max_epochs=max_epochs)
                     for o in (0, 1024)]
    del blocks

    # (b), (c): mmfs on a process cluster, blocks persisted
    for w in workers:
        with _local_cluster(w) as client, client.as_current(), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Sending large graph", category=UserWarning)
            M = as_matrix(st.path, standardize="scale", persist=True)
            if M.residency.get("mode") != "persisted":
                say(f"warning: the blocks were not persisted ({M.residency.get('reason')})")
            bb = max(client.run(_worker_blocks_bytes).values())
            t0 = time.perf_counter()
            if M._stats is None:
                M.column_stats()
            stats_s = time.perf_counter() - t0
            # the process with its blocks resident and the engine imported, before the solver
            idle = max(client.run(lambda: psutil.Process().memory_info().rss).values()) - bb
            with WorkerPeak(client) as wp:
                t0 = time.perf_counter()
                r = run_mmfs(M, y, C=C, gamma=gamma, tol=tol, max_epochs=max_epochs)
                wall = time.perf_counter() - t0
            M.release()
        dg = r.diagnostics
        # mmfs keeps 7 float64 arrays a feature in its per-block state (coef, shift, colsum, qii, rho, alpha, g); a
        # round makes a new g and alpha and a working-set index (3 arrays of 8 bytes a feature, transient)
        tr = dg["trace"]
        K = dg["n_partitions"]
        res[f"w{w}"] = {"state_bytes": 7 * 8 * -(-d // w), "transient_bytes": 3 * 8 * -(-d // w), "wall_s": wall,
                        "stats_s": stats_s, "rounds": dg["rounds"], "converged": dg["converged"],
                        "rel_gap": dg["relative_gap"], "support": dg["support"], "peak": wp.peak, "idle": idle,
                        "blocks_bytes": bb, "objective": dg["objective"], "n_partitions": K,
                        "rules": {k: sum(t["rule"] == k for t in tr) for k in sorted({t["rule"] for t in tr})},
                        "start_med": float(np.median([t["start_s"] / K for t in tr])),
                        "map_med": float(np.median([t["map_s"] for t in tr])),
                        "round_med": float(np.median([t["wall_s"] for t in tr]))}
    _mmfs_table(res, workers, say, n, nnz, tol)
    return res


def _mmfs_table(res: dict, workers: tuple[int, ...], say: Any, n: int, nnz: int, tol: float) -> None:
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
    say(f"visit orders, serial DCD on one block (block {res['orders_block']}, its own MMFS problem) to a relative "
        f"gap of {tol:g}, in this process:")
    base = res["orders"][0]
    for r in res["orders"]:
        say(f"  {_order_name(r['order']):28s}: first epoch {r['first_s'] * 1e3:7.1f} ms "
            f"({base['first_s'] / r['first_s']:.2f}x random), {r['epochs']:3d} epochs, {r['total_s']:.2f} s to the "
            f"gap ({base['total_s'] / r['total_s']:.2f}x random; reached {r['rel_gap']:.1e})")
    say("(b) mmfs(as_matrix(store, standardize='scale', persist=True), y, gamma, tol) on a LocalCluster of processes "
        "(1 thread each), column stats computed before (timed apart):")
    for w in workers:
        v = res[f"w{w}"]
        say(f"  {w} worker{'s' if w > 1 else ' '}: {v['wall_s']:.1f} s to relative gap {v['rel_gap']:.1e} "
            f"({'converged' if v['converged'] else 'NOT converged'}), {v['rounds']} rounds in "
            f"{v['n_partitions']} partition{'s' if v['n_partitions'] > 1 else ''} "
            f"({', '.join(f'{n} {k}' for k, n in v['rules'].items())}), about {v['rounds'] + 1} passes over the "
            f"data (a gradient a round, the epochs over working sets, one relevance pass); support "
            f"{v['support']:,}; column stats {v['stats_s']:.1f} s")
        say(f"    medians a round: {v['round_med']:.3f} s on the driver, {v['map_med']:.3f} s of it waiting for the "
            f"partitions' tasks; a partition's step + gradient + gap terms {v['start_med']:.3f} s")
    if 1 in workers and 2 in workers:
        res["speedup_2w"] = res["w1"]["wall_s"] / res["w2"]["wall_s"]
        res["gradient_scaling"] = res["w1"]["start_med"] / res["w2"]["start_med"]
        say(f"  speed-up 2 workers vs 1: {res['speedup_2w']:.2f}x (target >= 1.6); the gradient pass alone "
            f"(half the blocks per worker, both at once) {res['gradient_scaling']:.2f}x")
    for r in res["serial"]:
        say(f"  for comparison, serial DCD over all blocks in this process (one partition, bias moving, "
            f"{_order_name(r['order'])}): {r['epochs']} epochs, {r['total_s']:.1f} s of kernel to relative gap "
            f"{r['rel_gap']:.1e}")
    say("(c) peak RSS per worker during mmfs against its persisted blocks, the solver's per-feature state (7 arrays "
        "of 8 bytes a feature, and 3 made during a round) and O(n_samples) float64 vectors:")
    vec = n * 8
    for w in workers:
        v = res[f"w{w}"]
        st = v["state_bytes"] + v["transient_bytes"]
        say(f"  {w} worker{'s' if w > 1 else ' '}: per-feature state {v['state_bytes'] / 1e6:.0f} MB + "
            f"{v['transient_bytes'] / 1e6:.0f} MB during a round")
        extra = v["peak"] - v["idle"] - v["blocks_bytes"] - st
        k = -(-v["n_partitions"] // w) + 8  # its partitions' results, held until summed, + a task's copies
        bound = v["idle"] + v["blocks_bytes"] + st + k * vec
        say(f"  {w} worker{'s' if w > 1 else ' '}: peak {v['peak'] / 1e6:.0f} MB = idle process {v['idle'] / 1e6:.0f} "
            f"MB (after persist and column stats, less its blocks) + blocks {v['blocks_bytes'] / 1e6:.0f} MB + "
            f"state + {extra / 1e6:.0f} MB = {extra / vec:.1f} vectors of n_samples float64 ({vec / 1e6:.0f} MB "
            f"each); bound idle + blocks + state + {k} vectors (partitions on it + 8) = {bound / 1e6:.0f} MB: "
            f"{'within' if v['peak'] <= bound else 'OVER'}")
