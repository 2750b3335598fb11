"""``dufs bench scale``: what an iteration of each method moves between machines, measured on an emulated cluster.

Each method runs on :class:`~dufs.testing.emulated.EmulatedCluster` machines (network namespaces, so dufs takes
the remote paths: no shared ``/dev/shm``, everything over TCP), and at the end of every pass the links' byte
counters, the scheduler's task transitions and the driver's CPU time are read. An iteration is the span between
two pass ends after the method's set-up (blocks persisted, statistics, graph); the figures printed are medians over
the iterations, beside the sizes they are to be compared with: 2 x 8 (n + d) / machines bytes into a machine, a few MB
through the driver, a small multiple of the machines in tasks (issue 57's targets; docs/scaling.md). Each method
runs once more on one machine of one process, for the compute the model (:mod:`dufs.bench.model`) projects from;
the measurements are saved as JSON and the model's projection to 1-64 machines is printed after them.
"""

from __future__ import annotations

import json
import resource
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dufs.bench.common import _Sampler, describe, local_cluster, median

#: the iterative methods, with parameters that keep a run to a few iterations
RUNS: dict[str, dict[str, Any]] = {
    "fisher": {},
    "mmfs": {"max_epochs": 6, "tol": 1e-9},
    "lapaofs": {"graph": "anchor", "n_anchors": 64, "embed_dim": 16},
    "lapdofs": {"graph": "anchor", "n_anchors": 64, "embed_dim": 16},
    "jcfs": {"graph": "anchor", "n_anchors": 64, "embed_dim": 16, "max_iter": 2, "n_clusters": 2},
    "m3fs": {"graph": "anchor", "n_anchors": 64, "embed_dim": 16, "max_iter": 2, "n_clusters": 2},
    "ufcm": {"max_iter": 3, "n_clusters": 2, "n_components": 2},
}


#: the passes that end an iteration of the methods whose set-up makes more passes than their iterations (UFCM's
#: PCA start: its subspace iteration's passes were most of the passes, and the medians were theirs): Y = Zc W, on
#: the driver's path and in pieces beside the blocks (dufs.methods.ufcm.features)
ITERATION_ENDS: dict[str, tuple[str, ...]] = {"ufcm": ("Z U", "zc w")}


def _driver_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _transitions(dask_scheduler: Any = None) -> int:
    return int(dask_scheduler.transition_counter)


def _scheduler_cpu(dask_scheduler: Any = None) -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class DriverPeak(_Sampler):
    """This process alone (the emulated machines are its children): its peak resident bytes."""

    def processes(self) -> list:
        import psutil

        return [psutil.Process()]


@dataclass
class PassMeter:
    """Counters read at the end of every pass (a ``dufs.engine.progress.on_pass`` callback): each machine's bytes
    in, the driver's and the scheduler's bytes, the scheduler's transitions, the driver's CPU seconds, the time."""

    cluster: Any
    client: Any
    marks: list[dict] = field(default_factory=list)

    def read(self) -> dict:
        from dufs.engine import kept

        return {"links": self.cluster.link_bytes(), "driver": self.cluster.driver_bytes(), "kept": kept.seconds(),
                "scheduler": self.cluster.scheduler_bytes(), "cpu": _driver_cpu(), "t": time.perf_counter(),
                "transitions": self.client.run_on_scheduler(_transitions),
                "sched_cpu": self.client.run_on_scheduler(_scheduler_cpu)}

    def __call__(self, name: str, done: int, total: int) -> None:
        if done == total:
            self.marks.append({**self.read(), "name": name})

    def iterations(self, skip: int, ends: tuple[str, ...] = (), last: int = 0) -> list[dict]:
        """Per iteration (between consecutive pass ends, the first ``skip`` passes left out as set-up; with
        ``ends``, between the ends of the ``last`` + 1 last passes of those names): the most bytes into one
        machine, the driver's bytes in and out, the scheduler's, the tasks' transitions, the driver's CPU seconds,
        the seconds of the work on vectors kept on a worker (:mod:`dufs.engine.kept`) and the wall time."""
        out = []
        marks = self.marks[skip:]
        if ends:
            marks = [m for m in self.marks if m.get("name") in ends][-(last + 1):] if last > 0 else []
        for a, b in zip(marks, marks[1:], strict=False):
            out.append({"machine_in": max(y.into - x.into for x, y in zip(a["links"], b["links"], strict=True)),
                        "driver": (b["driver"].into - a["driver"].into) + (b["driver"].out_of - a["driver"].out_of),
                        "scheduler": (b["scheduler"].into - a["scheduler"].into)
                        + (b["scheduler"].out_of - a["scheduler"].out_of),
                        "transitions": b["transitions"] - a["transitions"], "cpu": b["cpu"] - a["cpu"],
                        "sched_cpu": b["sched_cpu"] - a["sched_cpu"], "kept": b["kept"] - a["kept"],
                        "wall": b["t"] - a["t"]})
        return out


def _run_method(cluster: Any, client: Any, path: str, method: str, n_features: int) -> dict:
    """``method`` fitted on the emulated cluster, its passes metered; the medians over its iterations, and the
    driver's peak resident growth over the fit."""
    import gc

    import psutil

    import dufs
    from dufs.engine.progress import on_pass

    gc.collect()
    meter = PassMeter(cluster, client)
    meter.marks.append(meter.read())  # the start: a one-pass method's iteration is the fit itself
    rss0 = psutil.Process().memory_info().rss
    t0 = time.perf_counter()
    with on_pass(meter), DriverPeak() as peak:
        sel = dufs.fit(path, method=method, n_features=n_features, client=client, **RUNS[method])
    wall = time.perf_counter() - t0
    # set-up passes: the statistics, and for the graph methods the graph's; half the passes at most
    passes = len(meter.marks) - 1
    if method in ITERATION_ENDS:  # its iterations, not the set-up's many passes
        its = meter.iterations(0, ITERATION_ENDS[method], int(sel.diagnostics.get("iterations", 0)))
    else:
        its = meter.iterations(skip=min(passes // 2, 3))
    out: dict[str, Any] = {"passes": passes, "wall_s": wall, "iterations": len(its),
                           "indices": sel.indices[:n_features].tolist(), "rss_growth": max(0, peak.peak_max - rss0)}
    for key in ("machine_in", "driver", "scheduler", "transitions", "cpu", "sched_cpu", "kept", "wall"):
        out[key] = median([float(i[key]) for i in its]) if its else float("nan")
    return out


def _scale_store(rows: int, features: int, nnz_per_row: int, seed: int, blocks: int, work_dir: Path | None,
                 store: Path | None, say: Any) -> Any:
    """The synthetic store cut into about ``blocks`` feature blocks (four a worker process of the largest cluster,
    so that every machine holds blocks), built once under ``work_dir`` and reused."""
    import tempfile

    from dufs.data import open_store
    from dufs.data.synthetic import SyntheticSpec
    from dufs.data.writers import make_synthetic
    from dufs.errors import DufsError

    width = -(-features // blocks)
    if store is None:
        root = Path(work_dir) if work_dir is not None else Path(tempfile.gettempdir()) / "dufs-bench"
        store = root / f"synthetic-{rows}x{features}x{nnz_per_row}-s{seed}-w{width}.zarr"
    try:
        st = open_store(str(store))
        # the path names the spec and the block width; the writer cuts heavy blocks further (66 blocks for 64)
        if st.shape == (rows, features) and st.n_blocks("csc") >= -(-features // width):
            say(f"store: reusing {store}")
            return st
    except DufsError:
        pass
    Path(store).parent.mkdir(parents=True, exist_ok=True)
    say(f"store: building {rows:,} x {features:,}, {nnz_per_row} nonzeros a row, {width:,} features a block, into "
        f"{store}")
    spec = SyntheticSpec(n_rows=rows, n_features=features, nnz_per_row=nnz_per_row, seed=seed)
    with local_cluster(2) as client:
        return make_synthetic(str(store), spec, overwrite=True, client=client, feature_block=width)


def _on_cluster(W: int, procs: int, rate: str | None, methods: tuple[str, ...], st: Any, n_features: int,
                say: Any, threads: int = 1) -> list[dict]:
    """Each of ``methods`` on an emulated cluster of ``W`` machines of ``procs`` processes of ``threads`` threads:
    its run's record."""
    from dufs import config
    from dufs.engine import get_client
    from dufs.testing.emulated import EmulatedCluster

    n, d = st.shape
    out = []
    # the client `dufs select --scheduler` makes
    with EmulatedCluster(machines=W, procs=procs, threads=threads, rate=rate) as cluster, \
            get_client(scheduler_address=cluster.address) as client:
        of = f" of {threads} threads" if threads > 1 else ""
        say(f"{W} machines x {procs} processes{of}: the target a machine 2 x 8 (n + d) / W = "
            f"{16 * (n + d) / W / 2**20:,.1f} MiB an iteration")
        for m in methods:
            got = {"machines": W, "procs": procs, "threads": threads, "method": m,
                   "side_pieces": str(config.get("engine.side-pieces")),  # the model's kept term follows it
                   "touched_rows": str(config.get("engine.touched-rows")),  # and its bytes into a machine this
                   **_run_method(cluster, client, st.path, m, n_features)}
            out.append(got)
            kept = f"on kept vectors {got['kept']:.3f} s, " if got["kept"] else ""
            say(f"  {m:8s}: {got['iterations']} iterations of {got['passes']} passes; an iteration: "
                f"into a machine {got['machine_in'] / 2**20:,.2f} MiB "
                f"({got['machine_in'] / (16 * (n + d) / W):.2f}x the target), through the driver "
                f"{got['driver'] / 2**20:,.2f} MiB, the scheduler {got['scheduler'] / 2**20:,.2f} MiB, "
                f"{got['transitions']:,.0f} task transitions ({got['transitions'] / W:,.1f} a machine), "
                f"driver CPU {got['cpu']:.3f} s, scheduler CPU {got['sched_cpu']:.3f} s, "
                f"{kept}"
                f"wall {got['wall']:.3f} s, "
                f"driver peak growth {got['rss_growth'] / 2**20:,.1f} MiB")
    return out


def scale_bench(*, rows: int = 400_000, features: int = 800_000, nnz_per_row: int = 4,
                machines: tuple[int, ...] = (2, 4), procs: int = 2, methods: tuple[str, ...] = tuple(RUNS),
                rate: str | None = None, work_dir: Path | None = None, store: Path | None = None,
                console: Any = None, seed: int = 0, n_features: int = 8, out: Path | None = None,
                efficiency: float = 0.5, model_procs: int = 16, link: float = 1.25e9,
                pool: tuple[Path, ...] = (), threads: int = 1) -> dict:
    """Each of ``methods`` on emulated clusters of ``machines`` machines (``procs`` one-thread worker processes
    each, links shaped to ``rate``), on a kddb-shaped synthetic store with few nonzeros a row (communication
    dominates): per iteration, the most bytes into one machine, the bytes through the driver and the scheduler,
    the scheduler's task transitions and the driver's CPU, beside 2 x 8 (n + d) / machines. Then each method on one
    machine of one process (the compute), the measurements saved to ``out`` (JSON; default under the store's
    directory), and the model fitted to them and projected (``model_procs`` processes a machine of ``efficiency``,
    links of ``link`` bytes a second), pooled with the measurements saved in ``pool`` (other store sizes: they
    separate the fixed costs from those in n)."""
    from dufs.bench import model
    from dufs.testing.emulated import unavailable

    say = console.print if console is not None else print
    why = unavailable()
    if why is not None:
        say(f"scale: not measured ({why})")
        return {"skipped": why}
    st = _scale_store(rows, features, nnz_per_row, seed, 4 * max(machines) * procs * threads, work_dir, store, say)
    res = describe(st, f"emulated machines {list(machines)} of {procs} worker processes"
                       f"{f' of {threads} threads' if threads > 1 else ''}"
                       f"{'' if rate is None else f', links shaped to {rate}'}", say)
    res["runs"] = []
    for W in machines:
        res["runs"] += _on_cluster(W, procs, rate, methods, st, n_features, say, threads)
    say("the compute, on one machine of one process:")
    res["compute"] = _on_cluster(1, 1, rate, methods, st, n_features, say)
    out = Path(out) if out is not None else Path(st.path).parent / f"scale-{rows}x{features}x{nnz_per_row}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1))
    say(f"measurements: {out}")
    datas = [res, *(json.loads(Path(f).read_text()) for f in pool)]
    # the machines projected as those measured: ``model_procs`` one-thread processes, or (measured with threads) one
    # process of ``model_procs`` threads
    P, T = (1, model_procs) if threads > 1 else (model_procs, 1)
    params = model.fit_params(datas, P=P, T=T, link=link, efficiency=efficiency)
    res["targets"] = model.report(datas, params, say)
    return res
