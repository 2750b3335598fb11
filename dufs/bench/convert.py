"""``dufs bench ingest``: ``dufs convert`` MB/s with 1 and 2 workers against scikit-learn's ``load_svmlight_file``
on the same libsvm file, and peak memory per worker for a file 1x and 4x larger."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from dufs.bench.common import PeakRSS, WorkerPeak, local_cluster, median


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
    sk = size1 / median(times) / 1e6
    res["sklearn_mbps"] = sk
    say(f"sklearn load_svmlight_file      : {sk:8.1f} MB/s   (1.00x)")

    for n in (1, 2):
        with local_cluster(n) as client:
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
            mb = size1 / median(times) / 1e6
            mbp = size1 / median(parse_times) / 1e6
            res[f"dufs_{n}w_mbps"] = mb
            say(f"dufs convert, {n} worker{'s' if n > 1 else ' '}         : {mb:8.1f} MB/s   "
                f"({mb / sk:.2f}x sklearn; parse stage alone {mbp:.1f} MB/s, {mbp / sk:.2f}x)")
    res["speedup_2w"] = res["dufs_2w_mbps"] / res["dufs_1w_mbps"]
    say(f"2 workers / 1 worker            : {res['speedup_2w']:.2f}x")

    # memory is bounded by the block sizes: give both files blocks of the same size (feature blocks of at most
    # 1M nonzeros; row blocks of block_bytes of text) and the peak per worker must not grow with the file
    for label, f in (("1x", f1), ("4x", f4)):
        with local_cluster(2) as client:
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
