"""``dufs bench ingest``: ``dufs convert`` MB/s with 1 and 2 workers against scikit-learn's ``load_svmlight_file``
on the same libsvm file, beside the machine's ceiling (the parser alone on 1 and 2 worker processes); the same
file as .bz2 against its single-threaded decompression (and the ceiling of decompressing on 1 and 2 processes);
peak memory per worker for a file 1x and 4x larger."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from dufs.bench.common import PeakRSS, WorkerPeak, local_cluster, median

# kddb's features per row (29,890,095 / 19,264,097): what sets the transpose's per-feature work (a CSC indptr entry
# and a feature_nnz entry a feature) against its per-nonzero work, about 19 nonzeros a feature
KDDB_FEATURES_PER_ROW = 29_890_095 / 19_264_097


def make_libsvm_file(path: Path, size_mb: float, *, copies: int = 1, seed: int = 0,
                     n_features: int | None = None) -> int:
    """A kddb-like libsvm text file of about ``size_mb`` MB (30 nonzeros a row; ``n_features``, default kddb's
    features per row), repeated ``copies`` times. Returns its size."""
    import io

    from sklearn.datasets import dump_svmlight_file

    from dufs.data.synthetic import SyntheticSpec, generate_rows

    target = int(size_mb * 1e6)
    # about 9 bytes per nonzero ("1234567:1 ") at 30 a row
    rows = max(1000, target // (30 * 9 + 4))
    n_feat = n_features if n_features is not None else max(1000, round(rows * KDDB_FEATURES_PER_ROW))
    spec = SyntheticSpec(n_rows=rows, n_features=n_feat, nnz_per_row=30, n_informative=20, seed=seed)
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



def _time_split(splits: list[tuple[float, dict]], n_workers: int) -> str:
    """Where the median run's time went (``ConvertReport.timings``): the tasks' phases (summed over tasks, divided
    by the workers), the driver's phases, and the rest: scheduling, transfers and waiting."""
    wall, tm = sorted(splits, key=lambda s: s[0])[len(splits) // 2]
    task = {k: v / n_workers for k, v in tm.items() if not k.startswith(("driver", "finalize"))}
    driver = {k: v for k, v in tm.items() if k.startswith(("driver", "finalize"))}
    rest = wall - sum(task.values()) - sum(driver.values())
    parts = [f"{k} {v:.2f}" for k, v in (*task.items(), *driver.items())] + [f"rest {rest:.2f}"]
    per = "" if n_workers == 1 else f" (task phases: their sum / {n_workers})"
    return f"  where the median run's {wall:.2f} s went{per}, seconds: " + ", ".join(parts)


def _parse_alone(path: str, block_bytes: int, repeats: int) -> float:
    """Median seconds of the numba parser over the whole file, in memory, in blocks of ``block_bytes`` (runs in a
    worker; every worker at once)."""
    from dufs.kernels.libsvm import parse_block

    data = np.fromfile(path, dtype=np.uint8)
    cuts = [0]
    while cuts[-1] < data.size:
        k = min(data.size, cuts[-1] + block_bytes)
        nl = np.flatnonzero(data[k:k + (1 << 20)] == 10)
        cuts.append(data.size if k >= data.size or not nl.size else k + int(nl[0]) + 1)
    parse_block(data[:cuts[1]])  # compiled (or loaded) before the clock
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for a, b in zip(cuts[:-1], cuts[1:], strict=False):
            parse_block(data[a:b])
        times.append(time.perf_counter() - t0)
    return median(times)


def _decompress_alone(path: str, share: int, of: int, block_bytes: int, repeats: int, how: str) -> float:
    """Median seconds to decompress this worker's share (every ``of``-th range from ``share``) of a .bz2 file's
    ranges of blocks with the decompressor ``how`` (:func:`dufs.data.bz2blocks.decompress`; runs in a worker,
    every worker at once)."""
    from dufs.data import bz2blocks

    size = Path(path).stat().st_size
    mine = list(bz2blocks.ranges(path, size, block_bytes))[share::of]
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for r in mine:
            bz2blocks.decompress(bz2blocks.stream_of(path, r.blocks), how)
        times.append(time.perf_counter() - t0)
    return median(times)


def _bz2_section(f1: Path, size1: int, root: Path, repeats: int, block_bytes: int, say: Any, res: dict) -> None:
    """The .bz2 figures: the single-threaded rate (Python's bz2 on the whole file), dufs convert in ranges on 1 and
    2 workers (and the driver's sequential way on 2), and the ceiling of decompressing on 1 and 2 processes."""
    import bz2

    import dask

    from dufs.data import bz2blocks
    from dufs.data.convert import convert_libsvm

    fz = root / "base.svm.bz2"
    fz.write_bytes(bz2.compress(f1.read_bytes(), 9))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        with bz2.open(fz, "rb") as f:
            while f.read(1 << 24):
                pass
        times.append(time.perf_counter() - t0)
    single = size1 / median(times) / 1e6
    res["bz2_single_mbps"] = single
    say(f".bz2 ({fz.stat().st_size / 1e6:.1f} MB), single-threaded decompression alone: {single:8.1f} MB/s of text "
        f"(1.00x; Python's bz2 on the whole file)")
    how = bz2blocks.decoder()
    res["bz2_decoder"] = how
    if how != "stdlib":  # the ranges' decompressor on the whole file, one thread
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            bz2blocks.decompress(fz.read_bytes(), how)
            times.append(time.perf_counter() - t0)
        res["bz2_decoder_mbps"] = size1 / median(times) / 1e6
        say(f"  the ranges' decompressor, {how}, on the whole file, one thread: {res['bz2_decoder_mbps']:8.1f} MB/s "
            f"({res['bz2_decoder_mbps'] / single:.2f}x)")
    alone = {}
    for n in (1, 2):
        with local_cluster(n) as client:
            convert_libsvm(str(fz), str(root / "warmz.zarr"), client=client, overwrite=True, block_bytes=block_bytes)
            for mode, cfg in (("ranges", {}), ("sequential", {"dufs.convert.parallel-bz2": False})):
                if mode == "sequential" and n == 1:
                    continue
                times = []
                for _ in range(repeats):
                    t0 = time.perf_counter()
                    with dask.config.set(cfg):
                        convert_libsvm(str(fz), str(root / "outz.zarr"), client=client, overwrite=True,
                                       block_bytes=block_bytes)
                    times.append(time.perf_counter() - t0)
                mb = size1 / median(times) / 1e6
                res[f"bz2_{mode}_{n}w_mbps"] = mb
                say(f"dufs convert .bz2, {n} worker{'s' if n > 1 else ' '}, {mode:10s}: {mb:8.1f} MB/s of text "
                    f"({mb / single:.2f}x single-threaded)")
            workers = sorted(client.scheduler_info()["workers"])
            got = [client.submit(_decompress_alone, str(fz), k, n, block_bytes, repeats, how, workers=[w],
                                 pure=False) for k, w in enumerate(workers)]
            alone[n] = max(client.gather(got))
    # the most a 2-worker conversion can do here: its ranges decompressed, nothing else (no parse, no write, no
    # Dask graph), both workers at once, against the single-threaded rate
    ceiling = size1 / alone[2] / 1e6 / single
    res["bz2_ceiling_2w"] = ceiling
    got = res["bz2_ranges_2w_mbps"] / single
    say(f"machine ceiling, measured in this run: decompressing the ranges alone ({how}; no parse, no write, no Dask "
        f"graph) takes {alone[1]:.2f} s on 1 worker and {alone[2]:.2f} s on 2 ({alone[1] / alone[2]:.2f}x): "
        f"{size1 / alone[2] / 1e6:.1f} MB/s, {ceiling:.2f}x the single-threaded rate, the most 2 workers can convert")
    say(f"  .bz2 on 2 workers: {got:.2f}x its single-threaded rate (target 3x) = {got / ceiling:.0%} of this "
        f"machine's ceiling ({ceiling:.2f}x)")


def ingest(*, size_mb: float = 64.0, repeats: int = 3, work_dir: Path | None = None, console: Any = None,
           block_bytes: int = 8 << 20, n_features: int | None = None) -> dict:
    """Our conversion MB/s with 1 and 2 workers against ``load_svmlight_file`` on the same file, and the machine's
    ceiling; the .bz2 figures (:func:`_bz2_section`); peak memory per worker for a file 1x and 4x larger.
    ``n_features``: of the file (default kddb's features per row, :data:`KDDB_FEATURES_PER_ROW`)."""
    say = console.print if console is not None else print
    if work_dir is not None:
        Path(work_dir).mkdir(parents=True, exist_ok=True)  # as the other benches' --dir: made when missing
    tmp = tempfile.TemporaryDirectory(dir=work_dir)
    root = Path(tmp.name)
    f1 = root / "base.svm"
    size1 = make_libsvm_file(f1, size_mb, n_features=n_features)
    f4 = root / "base4.svm"
    size4 = make_libsvm_file(f4, size_mb, copies=4, n_features=n_features)
    say(f"file: {size1 / 1e6:.1f} MB ({f1}); 4x file: {size4 / 1e6:.1f} MB; blocks of {block_bytes / 2**20:.0f} MiB; "
        f"median of {repeats} runs")
    res: dict[str, Any] = {"size_mb": size1 / 1e6}
    sk = _sklearn_section(f1, size1, repeats, say, res)
    _text_section(f1, size1, root, repeats, block_bytes, sk, say, res)
    _bz2_section(f1, size1, root, repeats, block_bytes, say, res)
    _memory_section(f1, f4, root, block_bytes, say, res)
    tmp.cleanup()
    return res


def _sklearn_section(f1: Path, size1: int, repeats: int, say: Any, res: dict) -> float:
    """scikit-learn's ``load_svmlight_file`` MB/s on the file: the reference."""
    from sklearn.datasets import load_svmlight_file

    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        X, _ = load_svmlight_file(str(f1))
        times.append(time.perf_counter() - t0)
    sk = size1 / median(times) / 1e6
    res["sklearn_mbps"] = sk
    say(f"sklearn load_svmlight_file      : {sk:8.1f} MB/s   (1.00x; the file: {X.shape[0]:,} rows x "
        f"{X.shape[1]:,} features, {X.nnz:,} nonzeros)")
    del X
    return sk


def _text_section(f1: Path, size1: int, root: Path, repeats: int, block_bytes: int, sk: float, say: Any,
                  res: dict) -> None:
    """dufs convert on 1 and 2 workers (where its time went), the parser alone on each, and the machine's ceiling:
    the parser alone on 1 and on 2 processes at once."""
    from dufs.data.convert import convert_libsvm

    parse_alone = {}
    for n in (1, 2):
        with local_cluster(n) as client:
            # warm the workers (numba caches, imports) on a small piece
            convert_libsvm(str(f1), str(root / "warm.zarr"), client=client, overwrite=True,
                           block_bytes=1 << 20)
            times, parse_times, splits = _timed_converts(client, f1, root, repeats, block_bytes)
            mb = size1 / median(times) / 1e6
            mbp = size1 / median(parse_times) / 1e6
            res[f"dufs_{n}w_mbps"] = mb
            say(f"dufs convert, {n} worker{'s' if n > 1 else ' '}         : {mb:8.1f} MB/s   "
                f"({mb / sk:.2f}x sklearn, target 4x on 1 worker; parse stage alone {mbp:.1f} MB/s, "
                f"{mbp / sk:.2f}x)")
            say(_time_split(splits, n))
            parse_alone[n] = max(client.run(_parse_alone, str(f1), block_bytes, repeats).values())
            on = "1 worker" if n == 1 else f"each of the {n} workers at once"
            say(f"  the numba parser alone, in memory, on {on}: "
                f"{size1 / parse_alone[n] / 1e6:8.1f} MB/s each ({size1 / parse_alone[n] / 1e6 / sk:.2f}x sklearn)")
    res["speedup_2w"] = res["dufs_2w_mbps"] / res["dufs_1w_mbps"]
    ceiling = parse_alone[1] / parse_alone[2] * 2
    res["ceiling_2w"] = ceiling
    say(f"2 workers / 1 worker            : {res['speedup_2w']:.2f}x; machine ceiling, measured in this run (the "
        f"parser alone on 1 and on 2 processes at once): {ceiling:.2f}x, so {res['speedup_2w'] / ceiling:.0%} of it")


def _timed_converts(client: Any, f1: Path, root: Path, repeats: int,
                    block_bytes: int) -> tuple[list[float], list[float], list[tuple[float, dict]]]:
    """``repeats`` conversions of the file: their seconds, the seconds to the end of their parse stage, and each
    one's seconds with its time split (``ConvertReport.timings``)."""
    from dufs.data.convert import convert_libsvm

    times, parse_times, splits = [], [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        marks: dict = {}

        def prog(ev: dict, marks: dict = marks) -> None:
            if ev["stage"] != "parse" and "parsed" not in marks:
                marks["parsed"] = time.perf_counter()

        _, rep = convert_libsvm(str(f1), str(root / "out.zarr"), client=client, overwrite=True,
                                progress=prog, block_bytes=block_bytes)
        times.append(time.perf_counter() - t0)
        splits.append((times[-1], rep.timings))
        parse_times.append(marks.get("parsed", time.perf_counter()) - t0)
    return times, parse_times, splits


def _memory_section(f1: Path, f4: Path, root: Path, block_bytes: int, say: Any, res: dict) -> None:
    """Peak memory per worker converting the file 1x and 4x larger, which must not grow with the file."""
    import dask

    from dufs.data.convert import convert_libsvm

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
