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
                      silence_logs=40) as lc, Client(lc) as client:
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
