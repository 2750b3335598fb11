"""``dufs demo`` (the main job on an embedded default) and ``dufs bench``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import typer
from rich.table import Table

from dufs.cli.app import (
    WorkersOpt,
    cluster,
    command,
    fail,
    out,
)
from dufs.cli.selecting import pass_progress
from dufs.cli.stores import make_synthetic, print_info
from dufs.errors import DufsError, ParameterError
from dufs.plot import PLOT_EXTRA, can_plot


@command()
def demo(
    out_dir: Path = typer.Option(Path("dufs-demo"), "--out", help="Where to write the demo's outputs."),
    rows: int = typer.Option(200_000, "--rows"),
    features: int = typer.Option(500_000, "--features"),
    dataset: str = typer.Option("pcmac", "--dataset", help="The bundled real set to select on and evaluate."),
    workers: int | None = WorkersOpt,
) -> None:
    """The main job on an embedded default, on a local multi-process cluster: a kddb-like synthetic store and a
    bundled real text set (PCMAC, 20 Newsgroups) as stores; MMFS-DCD and two filters select on the synthetic store
    (recovery of the generator's informative features), two filters on the real set (LinearSVC(C=1) test accuracy
    vs K); a table and figures."""
    import dufs
    from dufs.data.datasets import available
    from dufs.engine.progress import on_pass

    if dataset.lower() not in available():  # before any work
        fail(ParameterError(f"--dataset must be one of {', '.join(available())}; got {dataset!r}"))
    if out_dir.exists() and not out_dir.is_dir():
        fail(ParameterError(f"--out {out_dir}: is a file, not a folder"))
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "synthetic.zarr"
    try:
        st = make_synthetic(str(path), rows, features, 30, 20, 0, 0.05, None, True, False, None, workers)
        print_info(st.info())
        train, test = _demo_real_stores(dataset, out_dir)
        ks = [10, 20, 50, 100, 200]
        with cluster(None, workers) as client, pass_progress() as report, on_pass(report):
            syn = {m: dufs.fit(st, method=m, n_features=50, client=client) for m in ("fisher", "correlation")}
            # the headline method, in the paper's setting for large sparse data (unit variance, no centring)
            syn["mmfs"] = dufs.fit(st, method="mmfs", n_features=50, client=client, standardize="scale", gamma=1.0,
                                   checkpoint=None)
            real = {m: dufs.fit(train, method=m, n_features=max(ks), client=client)
                    for m in ("fisher", "laplacian")}
        syn["fisher"].to_json(out_dir / "fisher-50.json")
        syn["mmfs"].to_json(out_dir / "mmfs-50.json")
        drawn = can_plot()  # matplotlib is an extra: without it, the tables alone
        fig = syn["fisher"].plot(out_dir / "fisher-scores.png") if drawn else None
        table, fig2 = _demo_evaluate(real, train, test, ks, out_dir / f"{dataset}-accuracy-vs-k.png" if drawn else None)
    except DufsError as exc:
        fail(exc)
    truth = set(st.ground_truth["informative"])
    n_workers = syn["fisher"].diagnostics["n_workers"]
    for m, sel in syn.items():
        found = [int(j) for j in sel.indices if int(j) in truth]
        name = {"fisher": "Fisher score", "correlation": "|correlation|", "mmfs": "MMFS-DCD"}[m]
        out.print(f"{name}, top 50 of {st.shape[1]:,} features, on {n_workers} workers in "
                  f"{sel.diagnostics['wall_time']:.1f} s: {len(found)} of the {len(truth)} informative features "
                  f"recovered (in the top 20: {len(truth & set(sel.indices[:20].tolist()))})", highlight=False,
                  soft_wrap=True)
    d = syn["mmfs"].diagnostics
    out.print(f"MMFS-DCD: {d['rounds']} rounds over {d['n_partitions']} feature blocks, relative duality gap "
              f"{d['relative_gap']:.1e}, gamma {d['gamma']:g}, {d['support']} features in the support (the rest by "
              f"the dual gradient)", highlight=False, soft_wrap=True)
    out.print(table)
    figures = f"{fig}, {fig2}" if fig else f"none drawn (they need matplotlib: {PLOT_EXTRA})"
    out.print(f"selections: {out_dir / 'fisher-50.json'}, {out_dir / 'mmfs-50.json'}; figures: {figures}",
              highlight=False, soft_wrap=True, markup=False)


def _demo_real_stores(dataset: str, out_dir: Path) -> tuple[Any, Any]:
    """A bundled set split 75/25 (stratified, seeded) into two stores."""
    import scipy.sparse as sp
    from sklearn.model_selection import train_test_split

    import dufs
    from dufs.data.datasets import load

    X, y = load(dataset)
    X = sp.csr_array(X)
    tr, te = train_test_split(np.arange(X.shape[0]), test_size=0.25, stratify=y, random_state=0)
    tr, te = np.sort(tr), np.sort(te)
    prov = {"source": f"dufs.data.datasets.load({dataset!r})", "split": "75/25 stratified, random_state=0"}
    a = dufs.write_store(X[tr], out_dir / f"{dataset}-train.zarr", y[tr], overwrite=True, value_dtype=np.float64,
                         provenance={**prov, "part": "train"})
    b = dufs.write_store(X[te], out_dir / f"{dataset}-test.zarr", y[te], overwrite=True, value_dtype=np.float64,
                         provenance={**prov, "part": "test"})
    return a, b


def _demo_evaluate(sels: dict, train: Any, test: Any, ks: list[int], figure: Path | None
                   ) -> tuple[Table, str | None]:
    """Test accuracy of LinearSVC(C=1) on the top K features of each selection, and with all features (its figure
    drawn into ``figure``, None: not drawn)."""
    from dufs.evaluate import topk_curve
    from dufs.plot import plot_topk

    Xtr, Xte = train.to_scipy("csr"), test.to_scipy("csr")
    curves = {m: topk_curve(Xtr, train.y, s.indices, ks, test=(Xte, test.y)) for m, s in sels.items()}
    full = topk_curve(Xtr, train.y, np.arange(Xtr.shape[1]), [Xtr.shape[1]], test=(Xte, test.y))["accuracy"][0]
    fig = None if figure is None else plot_topk(
        curves, figure, title=f"LinearSVC(C=1) test accuracy vs K (all {Xtr.shape[1]:,} features: {full:.3f})")
    t = Table(title=f"{train.provenance.get('source', '')}: test accuracy of LinearSVC(C=1), "
                    f"{Xtr.shape[0]} train / {Xte.shape[0]} test; all {Xtr.shape[1]:,} features: {full:.4f}",
              title_justify="left", min_width=100)
    t.add_column("K", justify="right")
    for m in curves:
        t.add_column(m, justify="right")
    for i, kv in enumerate(ks):
        t.add_row(str(kv), *[f"{curves[m]['accuracy'][i]:.4f}" for m in curves])
    return t, fig


@command()
def bench(
    what: str = typer.Argument(..., help="What to measure: ingest, pass, mmfs, greedy, m3fs, ufcm, scale or recovery."),
    size_mb: float = typer.Option(64.0, "--size-mb", help="ingest: size of the base libsvm file (MB)."),
    repeats: int | None = typer.Option(None, "--repeats", help="Runs per figure, the median is printed (default: "
                                       "3 for ingest, 7 for pass, 11 mmfs solves, 5 greedy, 5 m3fs, 3 ufcm)."),
    work_dir: Path | None = typer.Option(None, "--dir", help="Scratch directory (ingest: default a temp dir; pass: "
                                         "where the synthetic store is built and reused, default "
                                         "<tmp>/dufs-bench)."),
    rows: int = typer.Option(2_000_000, "--rows", help="Rows (samples) of the synthetic store "
                      "(m3fs, ufcm: default 200,000)."),
    features: int = typer.Option(5_000_000, "--features", help="Features of the synthetic store "
                          "(m3fs, ufcm: default 1,000,000; ingest: of the libsvm file, default kddb's 1.55 a row)."),
    nnz_per_row: int = typer.Option(30, "--nnz-per-row", help="pass, mmfs: nonzeros a row."),
    store: Path | None = typer.Option(None, "--store", help="pass, mmfs: the store path (reused when it holds the same "
                                      "synthetic spec, else built there)."),
    ks: str = typer.Option("50,200", "--ks", help="greedy: the numbers of features selected, comma-separated (the "
                           "first is timed on every cluster size, the peak memory is compared between the first "
                           "and the last)."),
    machines: str = typer.Option("2,4", "--machines", help="scale: emulated machines, comma-separated (needs root, "
                                 "ip and tc)."),
    rate: str | None = typer.Option(None, "--rate", help="scale: each emulated link's bandwidth (tc's form, e.g. "
                                    "1gbit); default unshaped."),
    methods: str | None = typer.Option(None, "--methods", help="scale: the methods, comma-separated (default every "
                                       "iterative method and Fisher); recovery: likewise (default all it measures)."),
    out_file: Path | None = typer.Option(None, "--out", help="scale: the JSON file the measurements are saved to "
                                         "(default scale-<rows>x<features>x<nnz>.json beside the store); recovery: "
                                         "the results as JSON (default none)."),
    efficiency: float = typer.Option(0.5, "--efficiency", help="scale: the model's efficiency of a worker process "
                                     "among 16 on a machine (memory bandwidth shared), in (0, 1]."),
    pool: str | None = typer.Option(None, "--pool", help="scale: measurements saved by earlier runs at other store "
                                    "sizes (--out files, comma-separated), fitted together with this run's."),
    layout: str = typer.Option("2x1", "--layout", help="scale: each emulated machine's worker processes x threads "
                               "(2x1: two one-thread processes; 1x2: one process of two threads, projected as one "
                               "of 16)."),
    seeds: str = typer.Option("0", "--seeds", help="recovery: the data's seeds, comma-separated."),
    kinds: str | None = typer.Option(None, "--kinds", help="recovery: the data kinds, comma-separated (dufs-C, "
                                     "dufs-C-weak, signature, topics, pcmac, basehock, relathe; default "
                                     "dufs-2,dufs-5,dufs-10,dufs-5-weak,signature,topics)."),
    clusters: int = typer.Option(5, "--clusters", help="recovery: the clusters of the signature and topics data."),
    data_dir: Path | None = typer.Option(None, "--data", help="recovery: a folder of <NAME>.mat text sets (default "
                                         "the bundled copies)."),
    param: list[str] = typer.Option([], "--param", "-p", help="recovery: name=value for every method that takes it, "
                                    "method.name=value for one (repeatable; default none: the methods' defaults)."),
) -> None:
    """Benchmarks printed as ratios against a reference measured in the same run."""
    from dufs import bench as _bench

    if what == "ingest":  # --features given: the file's; else kddb's features per row
        _bench.ingest(size_mb=size_mb, repeats=repeats or 3, work_dir=work_dir, console=out,
                      n_features=features if features != 5_000_000 else None)
    elif what == "pass":
        _bench.pass_(rows=rows, features=features, nnz_per_row=nnz_per_row, repeats=repeats or 7, work_dir=work_dir,
                     store=store, console=out)
    elif what == "mmfs":
        _bench.mmfs(rows=rows, features=features, nnz_per_row=nnz_per_row, work_dir=work_dir, store=store,
                    console=out, repeats=repeats or 11)
    elif what == "greedy":
        from dufs.bench.greedy import greedy

        try:
            kk = tuple(int(k) for k in ks.split(","))
            if min(kk) < 2:
                raise ValueError
        except ValueError:
            fail(ParameterError(f"--ks must be comma-separated integers >= 2, like 50,200; got {ks!r}"))
        greedy(rows=rows, features=features, nnz_per_row=nnz_per_row, work_dir=work_dir, store=store, console=out,
               repeats=repeats or 5, ks=kk)
    elif what in ("m3fs", "ufcm"):
        # kddb-like, at least 200k x 1M by default for these two
        size = {"rows": rows if rows != 2_000_000 else 200_000,
                "features": features if features != 5_000_000 else 1_000_000}
        if what == "m3fs":
            from dufs.bench.m3fs import m3fs_bench as run
        else:
            from dufs.bench.ufcm import ufcm_bench as run
        # m3fs: 5 runs (a run is short and single runs' figures move from run to run: docs/measurements.md,
        # "Benches")
        run(**size, nnz_per_row=nnz_per_row, work_dir=work_dir, store=store, console=out,
            repeats=repeats or (5 if what == "m3fs" else 3))
    elif what == "recovery":
        _bench_recovery(rows, features, clusters, seeds, kinds, methods, param, work_dir, data_dir, out_file)
    elif what == "scale":
        _bench_scale(rows, features, nnz_per_row, machines, rate, methods, work_dir, store, out_file, efficiency,
                     pool, layout)
    else:
        fail(DufsError(f"unknown benchmark {what!r}; choose from: ingest, pass, mmfs, greedy, m3fs, ufcm, scale, "
                      "recovery"))


def _bench_scale(rows: int, features: int, nnz_per_row: int, machines: str, rate: str | None, methods: str | None,
                 work_dir: Path | None, store: Path | None, out_file: Path | None = None,
                 efficiency: float = 0.5, pool: str | None = None, layout: str = "2x1") -> None:
    """``dufs bench scale``: its options checked, the store's size defaulting to the scale bench's own."""
    from dufs.bench.scale import RUNS, scale_bench

    try:
        ws = tuple(int(w) for w in machines.split(","))
        if min(ws) < 1:
            raise ValueError
    except ValueError:
        fail(ParameterError(f"--machines must be comma-separated integers >= 1, like 2,4; got {machines!r}"))
    try:
        procs, threads = (int(v) for v in layout.lower().split("x"))
        if min(procs, threads) < 1:
            raise ValueError
    except ValueError:
        fail(ParameterError(f"--layout must be processes x threads a machine, like 2x1 or 1x2; got {layout!r}"))
    if not 0 < efficiency <= 1:
        fail(ParameterError(f"--efficiency must be in (0, 1]; got {efficiency}"))
    ms = tuple(RUNS) if methods is None else tuple(m.strip() for m in methods.split(","))
    unknown = sorted(set(ms) - set(RUNS))
    if unknown:
        fail(ParameterError(f"--methods: {', '.join(unknown)} not measured by the scale bench; choose from "
                            f"{', '.join(RUNS)}"))
    size = {"rows": rows if rows != 2_000_000 else 400_000, "features": features if features != 5_000_000 else 800_000,
            "nnz_per_row": nnz_per_row if nnz_per_row != 30 else 4}
    scale_bench(**size, machines=ws, rate=rate, methods=ms, work_dir=work_dir, store=store, console=out,
                out=out_file, efficiency=efficiency, procs=procs, threads=threads,
                pool=tuple(Path(f) for f in pool.split(",")) if pool else ())


def _bench_recovery(rows: int, features: int, clusters: int, seeds: str, kinds: str | None, methods: str | None,
                    param: list[str], work_dir: Path | None, data_dir: Path | None, out_file: Path | None) -> None:
    """``dufs bench recovery``: its options checked, the data's size defaulting to 5,000 x 20,000."""
    from dufs.bench.recovery import KINDS, METHODS, parse_kind, recovery_bench
    from dufs.cli.selecting import _parse_params

    try:
        sd = tuple(int(s) for s in seeds.split(","))
        if min(sd) < 0:
            raise ValueError
    except ValueError:
        fail(ParameterError(f"--seeds must be comma-separated integers >= 0, like 0,1; got {seeds!r}"))
    ks = KINDS if kinds is None else tuple(k.strip() for k in kinds.split(","))
    ms = METHODS if methods is None else tuple(m.strip() for m in methods.split(","))
    try:
        for k in ks:
            parse_kind(k, clusters)
        if sorted(set(ms) - set(METHODS)) or clusters < 2:
            raise ValueError(f"--methods must be among {', '.join(METHODS)} and --clusters at least 2; got "
                             f"{methods!r}, {clusters}")
        recovery_bench(rows=rows if rows != 2_000_000 else 5_000, features=features if features != 5_000_000 else
                       20_000, clusters=clusters, seeds=sd, kinds=ks, methods=ms, params=_parse_params(param),
                       work_dir=work_dir, data_dir=data_dir, out=out_file, console=out)
    except ValueError as exc:
        fail(ParameterError(str(exc)))
    except DufsError as exc:
        fail(exc)
