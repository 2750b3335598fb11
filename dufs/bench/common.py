"""What the benchmarks share: memory samplers, the local process cluster they run on, the synthetic store they
measure on (built once and reused), the median and the plain-pass reference every figure is a ratio against."""

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



def median(xs: list[float]) -> float:
    return float(statistics.median(xs))



def plain_pass_seconds(M: Any, v: Any, repeats: int) -> list[float]:
    """Wall seconds of ``repeats`` plain ``M.rmatvec(v)`` passes after one warm-up (the method benches' reference)."""
    M.rmatvec(v)
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        M.rmatvec(v)
        out.append(time.perf_counter() - t0)
    return out



@contextlib.contextmanager
def local_cluster(n_workers: int) -> Iterator[Any]:
    """The benches' cluster: dufs's embedded LocalCluster (:func:`dufs.engine.cluster.embedded_cluster`, its Dask
    settings included) of ``n_workers`` single-threaded processes."""
    from dufs.engine.cluster import embedded_cluster

    with embedded_cluster(n_workers, 1) as client:
        yield client



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
    with local_cluster(n_workers) as client:
        st = make_synthetic(str(path), spec, overwrite=True, client=client)
    say(f"store: built in {time.perf_counter() - t0:.1f} s")
    return st



def describe(st: Any, what: str, say: Any) -> dict[str, Any]:
    """Print the store's one-line summary with ``what`` the benchmark runs and the machine's load; return the
    result dict the benchmark fills."""
    n, d = st.shape
    nnz = int(st.nnz)
    say(f"data: {n:,} x {d:,}, {nnz / 1e6:.1f}M nonzeros ({st.dtype}), {st.n_blocks('csc')} feature blocks; {what}; "
        f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    return {"n_rows": n, "n_features": d, "nnz": nnz, "n_blocks": st.n_blocks("csc")}



def bench_store(rows: int, features: int, nnz_per_row: int, seed: int, work_dir: Path | None,
                 store: Path | None, say: Any) -> Any:
    """The synthetic store the pass and MMFS benchmarks share: ``store``, else one named by its spec under
    ``work_dir`` (default a temp dir), built once and reused."""
    from dufs.data.synthetic import SyntheticSpec

    spec = SyntheticSpec(n_rows=rows, n_features=features, nnz_per_row=nnz_per_row, seed=seed)
    if store is None:
        root = Path(work_dir) if work_dir is not None else Path(tempfile.gettempdir()) / "dufs-bench"
        store = root / f"synthetic-{rows}x{features}x{nnz_per_row}-s{seed}.zarr"
    return ensure_synthetic_store(Path(store), spec, say=say)



def _kernel_alone(dask_worker: Any, v: Any, repeats: int) -> float:
    """Median seconds of ``csc_rmatvec`` (one float32 vector) over the blocks persisted on this worker, into
    preallocated outputs, their pages touched before the clock starts (runs in the worker)."""
    import numpy as np

    from dufs.engine import FeatureBlock
    from dufs.engine.shm import local_array
    from dufs.kernels.blockops import csc_rmatvec

    blocks = [b for b in list(dask_worker.data.values()) if isinstance(b, FeatureBlock)]
    v = local_array(v)  # one copy in shared memory for every worker, or the worker's own
    V = v if v.ndim == 2 else np.ascontiguousarray(np.asarray(v, dtype=np.float32)[:, None])
    outs = [np.empty((b.width, 1)) for b in blocks]
    for b, o in zip(blocks, outs, strict=True):  # untimed: fresh pages fault in on first touch, which a pass's
        csc_rmatvec(b.indptr, b.indices, b.data, V, o)  # reused buffers skip (docs/measurements.md, "Pooled buffers")
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for b, o in zip(blocks, outs, strict=True):
            csc_rmatvec(b.indptr, b.indices, b.data, V, o)
        times.append(time.perf_counter() - t0)
    return median(times)


def kernel_alone_seconds(client: Any, v: Any, repeats: int) -> float:
    """The machine's floor for one pass on this cluster: the numba kernel alone, no Dask, each worker looping over
    its own persisted blocks, all workers at once (the slowest worker's median), with the float32 vector in each
    worker's own memory and (two or more workers on this machine) in one shared copy that every worker maps
    (:mod:`dufs.engine.shm`): the faster of the two. Measured on a 1-worker and a 2-worker cluster, the ratio of
    the two is this machine's ceiling for the 2-worker speed-up of a pass (:func:`say_ceiling`)."""
    import numpy as np

    from dufs.engine.shm import publish, workers_share_memory

    own = float(max(client.run(_kernel_alone, v=v, repeats=repeats).values()))
    if workers_share_memory(client) < 2:
        return own
    with publish(np.ascontiguousarray(np.asarray(v, dtype=np.float32)[:, None])) as ref:
        shared = float(max(client.run(_kernel_alone, v=ref, repeats=repeats).values()))
    return min(own, shared)


def say_ceiling(res: dict, say: Any, key: str = "kernel_s") -> float | None:
    """Print (and store as ``res["ceiling_2w"]``) the 2-process ceiling from ``res["w1"][key]`` and
    ``res["w2"][key]`` (or ``res["w1_<key>"]``, ``res["w2_<key>"]``), the kernel-alone seconds of
    :func:`kernel_alone_seconds` on 1 and 2 workers."""
    k1 = res.get("w1", {}).get(key) if isinstance(res.get("w1"), dict) else res.get(f"w1_{key}")
    k2 = res.get("w2", {}).get(key) if isinstance(res.get("w2"), dict) else res.get(f"w2_{key}")
    if not k1 or not k2:
        return None
    res["ceiling_2w"] = k1 / k2
    say(f"machine ceiling, measured in this run: the kernel alone (no Dask, each worker over its own persisted "
        f"blocks, all at once; the vector in each worker or shared by all, the faster) 1 worker {k1 * 1e3:.1f} "
        f"ms, 2 workers {k2 * 1e3:.1f} ms: a 2-worker speed-up of at most {k1 / k2:.2f}x on this machine")
    return res["ceiling_2w"]


def plain_pass_and_ceiling(client: Any, M: Any, v: Any, repeats: int) -> dict[str, Any]:
    """The method benches' two references on one cluster: the median of ``repeats`` plain ``M.rmatvec(v)`` passes
    (``pass_s``; each in ``pass_walls_s``) and the kernel alone over the same persisted blocks (``kernel_s``,
    :func:`kernel_alone_seconds`). :func:`more_plain_passes` after the method's run adds as many again."""
    walls = plain_pass_seconds(M, v, repeats)
    return {"pass_s": median(walls), "pass_walls_s": walls, "kernel_s": kernel_alone_seconds(client, v, repeats)}


def more_plain_passes(ref: dict[str, Any], M: Any, v: Any) -> dict[str, Any]:
    """``ref`` (:func:`plain_pass_and_ceiling`) with as many plain passes again, taken now (after the method's run),
    and ``pass_s`` the median of all: half before the run and half after, as this machine's speed drifts
    (docs/measurements.md, "Benches")."""
    walls = list(ref["pass_walls_s"]) + plain_pass_seconds(M, v, len(ref["pass_walls_s"]))
    return {**ref, "pass_s": median(walls), "pass_walls_s": walls}


def say_speedup(res: dict, speedup: float, what: str, say: Any) -> None:
    """Print the machine's 2-worker ceiling (:func:`say_ceiling`, from ``res["w1"]["kernel_s"]`` and
    ``res["w2"]["kernel_s"]``) and the fraction of it that ``speedup`` (``what``'s, 2 workers vs 1) reaches."""
    ceiling = say_ceiling(res, say)
    if ceiling:
        res["fraction_of_ceiling"] = speedup / ceiling
        say(f"  {what}: 2-worker speed-up {speedup:.2f}x = {speedup / ceiling:.0%} of this machine's ceiling "
            f"({ceiling:.2f}x)")


def worker_blocks_bytes(dask_worker: Any) -> int:
    from dufs.engine import FeatureBlock

    return int(sum(b.nbytes for b in list(dask_worker.data.values()) if isinstance(b, FeatureBlock)))


def rss() -> int:
    """This process's resident memory (bytes); run in the workers with ``client.run(rss)``."""
    return psutil.Process().memory_info().rss


def rss_files() -> int:
    """The part of this process's resident memory that maps files (bytes: code, libraries, numba's cached kernels;
    ``RssFile`` in /proc/self/status), 0 where the system does not say; run in the workers with
    ``client.run(rss_files)``."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("RssFile:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0
