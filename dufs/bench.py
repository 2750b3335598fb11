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


def pass_(*, rows: int = 2_000_000, features: int = 5_000_000, nnz_per_row: int = 30, repeats: int = 7,
          work_dir: Path | None = None, store: Path | None = None, console: Any = None,
          workers: tuple[int, ...] = (1, 2), seed: int = 0) -> dict:
    """One ``Matrix.rmatvec(v)`` pass (v dense over the samples) with 1 and 2 workers, blocks persisted on them,
    against SciPy's ``X.T @ v`` in one process on the same data in memory (float32 data and v). Medians of
    ``repeats`` passes after a warm-up; also where the time of one pass goes (task compute vs wall) and whether
    the results agree."""
    from distributed import get_task_stream

    from dufs.data.synthetic import SyntheticSpec
    from dufs.engine import as_matrix

    say = console.print if console is not None else print
    spec = SyntheticSpec(n_rows=rows, n_features=features, nnz_per_row=nnz_per_row, seed=seed)
    if store is None:
        root = Path(work_dir) if work_dir is not None else Path(tempfile.gettempdir()) / "dufs-bench"
        store = root / f"synthetic-{rows}x{features}x{nnz_per_row}-s{seed}.zarr"
    st = ensure_synthetic_store(Path(store), spec, say=say)
    n, d = st.shape
    nnz = int(st.nnz)
    say(f"data: {n:,} x {d:,}, {nnz / 1e6:.1f}M nonzeros ({st.dtype}), {st.n_blocks('csc')} feature blocks; "
        f"median of {repeats} passes after a warm-up; load average {os.getloadavg()[0]:.2f} on "
        f"{os.cpu_count()} cores")
    res: dict[str, Any] = {"n_rows": n, "n_features": d, "nnz": nnz, "n_blocks": st.n_blocks("csc")}

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
            M = as_matrix(str(store), persist=True)
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
                h = M.rmatvec(v, gather=False)  # the per-block results stay on the workers (DESIGN.md section 4)
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
