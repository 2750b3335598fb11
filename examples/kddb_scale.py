"""Every method at kddb size, end to end, with the memory it took and the ground truth it found.

Builds (or reuses) a synthetic kddb-like store with ``dufs make-synthetic`` (full kddb size by default:
19,264,097 rows x 29,890,095 features, 30 nonzeros a row, about 578M nonzeros and a 3 GB store; ``--rows`` and
``--features`` shrink it) with ``--clusters K`` latent clusters planted (each cluster owns 20 features; a row draws
5 of its cluster's), so the labels are the clusters and every method, supervised or not, has a ground truth: the
clusters' features. Then runs ``dufs select STORE --method M -k K`` for each method as a separate process on the
embedded cluster (or ``--scheduler``), samples the resident memory of that process and its workers every 0.1 s,
and prints one table: method, k, wall time, passes over the data, peak RSS of driver plus workers, and how many
of the selected features are cluster features (of the k selected; the clusters own K x 20), beside the number a
uniformly random choice of k features would find on average (k x K x 20 / n_features).

A method that fails (memory, a task over the limits) is reported with its error and the run goes on.

    python examples/kddb_scale.py                                # full size: about 10 minutes to build
    python examples/kddb_scale.py --rows 200000 --features 300000 --methods fisher,laplacian
    python examples/kddb_scale.py --store /tmp/kddb.zarr --reuse
    python examples/kddb_scale.py --cluster-nnz 15 --methods lapaofs,lapdofs   # clusters that carry variance

LapAOFS and LapDOFS choose the features that make the Laplacian-regularised design best conditioned: on raw counts,
the most frequent ones. With the default planting (a row draws 5 of its cluster's 20 features: each is in 2.5% of
the rows) about a hundred power-law features are more frequent than any cluster feature, and these two methods find
none of them at k = 50; ``--cluster-nnz 15`` (7.5% of the rows) puts the cluster features among the most frequent.

Parameters of the unsupervised methods are passed with ``-p method:name=value`` (for example
``-p laplacian:graph=anchor``); ``laplacian`` runs on the anchor graph by default here.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

METHODS = ["correlation", "fisher", "mmfs", "laplacian", "lapaofs", "lapdofs", "jcfs", "m3fs", "ufcm"]
#: parameters each method gets here unless -p says otherwise (the anchor graph: kNN is for moderate n_samples)
DEFAULTS = {"laplacian": {"graph": "anchor"}, "lapaofs": {"graph": "anchor"}, "lapdofs": {"graph": "anchor"},
            "jcfs": {"graph": "anchor"},
            "m3fs": {"solver": "alternating", "graph": "anchor", "max_passes": 120}}
#: k where it is not 200: LapAOFS and LapDOFS take one pass over the data per feature chosen, JCFS about 21 s a
#: feature at kddb size (its Y-steps too: k = 30 took 760 s)
K_DEFAULTS = {"lapaofs": 50, "lapdofs": 50, "jcfs": 30}


def _peak_run(cmd: list[str], timeout: float | None) -> tuple[int, float, tuple, str]:
    """Run ``cmd``; (exit code, wall seconds, (peak RSS in bytes of it and its children, the driver's RSS then, the
    seconds after the start it came), last stderr line)."""
    import psutil

    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as err:
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
        root = psutil.Process(p.pid)
        peak = (0, 0, 0.0)
        while p.poll() is None:
            total = driver = 0
            try:
                for q in [root, *root.children(recursive=True)]:
                    try:
                        rss = q.memory_info().rss
                    except psutil.Error:
                        continue
                    total += rss
                    driver = rss if q.pid == root.pid else driver
            except psutil.Error:
                pass
            if total > peak[0]:
                peak = (total, driver, time.perf_counter() - t0)
            if timeout is not None and time.perf_counter() - t0 > timeout:
                p.kill()
            time.sleep(0.1)
        err.seek(0)
        lines = [ln for ln in err.read().decode(errors="replace").splitlines() if ln.strip()]
    return p.returncode, time.perf_counter() - t0, peak, lines[-1] if lines else ""


def _gb(peak: tuple) -> str:
    return f"{peak[0] / 1e9:.1f} ({peak[1] / 1e9:.1f}; {peak[2]:,.0f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=19_264_097)
    ap.add_argument("--features", type=int, default=29_890_095)
    ap.add_argument("--nnz-per-row", type=int, default=30)
    ap.add_argument("--clusters", type=int, default=10)
    ap.add_argument("--cluster-features", type=int, default=20, help="features each cluster owns")
    ap.add_argument("--cluster-nnz", type=int, default=5,
                    help="nonzeros a row draws from its cluster's features (15 of 20: the clusters carry variance, "
                         "their features are among the most frequent)")
    ap.add_argument("-k", type=int, default=None,
                    help="features to select (default 200; 50 for the one-pass-a-feature greedy LapAOFS and LapDOFS, "
                         "30 for JCFS)")
    ap.add_argument("--store", type=Path, default=None, help="where the store is (default: a temporary folder)")
    ap.add_argument("--reuse", action="store_true", help="use --store as it is if it exists")
    ap.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated, of {','.join(METHODS)}")
    ap.add_argument("-p", "--param", action="append", default=[], metavar="METHOD:NAME=VALUE")
    ap.add_argument("--scheduler", default=None, help="a Dask scheduler address (default: an embedded cluster)")
    ap.add_argument("--timeout", type=float, default=None, help="seconds before a method is stopped")
    args = ap.parse_args()

    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = sorted(set(methods) - set(METHODS))
    if unknown:
        ap.error(f"unknown methods {unknown}; choose among {METHODS}")
    params = {m: dict(DEFAULTS.get(m, {})) for m in methods}
    if "jcfs" in params:  # JCFS's Y has one column a cluster (its default "auto" estimates it): as many as planted
        params["jcfs"]["n_clusters"] = str(args.clusters)
    for p in args.param:
        try:
            m, kv = p.split(":", 1)
            name, value = kv.split("=", 1)
        except ValueError:
            ap.error(f"-p takes METHOD:NAME=VALUE; got {p!r}")
        params.setdefault(m, {})[name] = value

    work = Path(tempfile.mkdtemp(prefix="dufs-kddb-"))
    store = args.store or work / "kddb.zarr"
    dufs = [sys.executable, "-m", "dufs.cli"]
    sched = ["--scheduler", args.scheduler] if args.scheduler else []
    if not (args.reuse and store.exists()):
        t0 = time.perf_counter()
        subprocess.run([*dufs, "make-synthetic", str(store), "--rows", str(args.rows), "--features",
                        str(args.features), "--nnz-per-row", str(args.nnz_per_row), "--clusters", str(args.clusters),
                        "--cluster-features", str(args.cluster_features), "--cluster-nnz", str(args.cluster_nnz),
                        "--overwrite", *sched], check=True, stdout=subprocess.DEVNULL)
        print(f"built {store} in {time.perf_counter() - t0:.0f} s", flush=True)
    import dufs as _dufs

    st = _dufs.open(store)
    gt = st.ground_truth or {}
    truth = set(np.asarray(gt.get("cluster_features", []), dtype=np.int64).ravel().tolist()) or \
        set(gt.get("informative", []))
    what = "cluster features" if gt.get("cluster_features") else "informative features"
    print(f"{st.shape[0]:,} x {st.shape[1]:,}, {st.nnz:,} nonzeros; ground truth: {len(truth)} {what}", flush=True)

    rows = []
    for m in methods:
        out = work / f"{m}.json"
        k = args.k if args.k is not None else K_DEFAULTS.get(m, 200)
        cmd = [*dufs, "select", str(store), "--method", m, "-k", str(k), "-o", str(out), *sched]
        for name, value in params.get(m, {}).items():
            cmd += ["--standardize", value] if name == "standardize" else ["-p", f"{name}={value}"]
        rc, wall, peak, last = _peak_run(cmd, args.timeout)
        if rc == 0:
            sel = json.loads(out.read_text())
            idx = sel["indices"][:k]
            found = len(set(idx) & truth)
            rows.append((m, len(idx), f"{wall:,.0f}", str(sel["diagnostics"].get("passes", "")), _gb(peak),
                         f"{found} of {len(idx)}", f"{len(idx) * len(truth) / st.shape[1]:.2g}"))
        else:
            rows.append((m, k, f"{wall:,.0f}", "", _gb(peak), f"failed: {last[:120]}", ""))
        print(" | ".join(str(c) for c in rows[-1]), flush=True)

    head = ("method", "k", "wall s", "passes", "peak RSS GB (driver; at s)", f"{what} in the top k", "by chance")
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
    print()
    for r in [head, tuple("-" * w for w in widths), *rows]:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)))


if __name__ == "__main__":
    main()
