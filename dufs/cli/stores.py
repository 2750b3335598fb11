"""``dufs convert``, ``info``, ``verify`` and ``make-synthetic``: making stores and looking at them."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape
from rich.table import Table

from dufs.cli.app import (
    SchedulerOpt,
    WorkersOpt,
    bytes_progress,
    check_output_dir,
    cluster,
    command,
    console,
    fail,
    in_flags,
    one_line,
    out,
)
from dufs.errors import DufsError, ParameterError


def _small_inputs(ins: list[str]) -> bool:
    """Whether every input is a local file and their text, a compressed one's counted at 5 times its size, is at
    most ``dufs.convert.local-bytes``: converted on threads then (the embedded cluster's start costs more than
    converting them: docs/measurements.md, "Small inputs in this process")."""
    from dufs import config
    from dufs.data.units import _compressed

    if any("://" in p for p in ins):
        return False
    text = sum(Path(p).stat().st_size * (5 if _compressed(p) else 1) for p in ins)
    return text <= config.parse_bytes(config.get("convert.local-bytes"))


@command()
def convert(
    inputs: list[str] = typer.Argument(..., help="libsvm/svmlight files (plain, .bz2, .gz, .xz), then OUT; "
                                                 "each a path or an fsspec URL (s3://bucket/train.bz2)."),
    each: bool = typer.Option(False, "--each", help="One store per input (OUT is a directory); the stores "
                                                    "share the index base and n_features."),
    zero_based: str = typer.Option("auto", "--zero-based", help="auto, true or false (as scikit-learn)."),
    n_features: int | None = typer.Option(None, "--n-features", help="Number of features (default: the "
                                                                        "largest index + 1)."),
    on_error: str = typer.Option("raise", "--on-error", help="raise: stop at the first bad line; skip: skip "
                                                             "bad lines and report them."),
    dtype: str = typer.Option("float32", "--dtype", help="Value dtype of the store."),
    resume: bool = typer.Option(False, "--resume", help="Finish an interrupted conversion."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing dufs store (never anything "
                                                                 "else); discard an interrupted build."),
    block_bytes: str | None = typer.Option(None, "--block-bytes", help="Text bytes per row block (32MiB)."),
    scheduler: str | None = SchedulerOpt,
    workers: int | None = WorkersOpt,
) -> None:
    """Convert libsvm text into a dufs store: `dufs convert train.bz2 train.zarr`."""
    from dufs.data.convert import convert_libsvm

    ins, dest, zb = _convert_args(inputs, zero_based)
    small = workers is None and not scheduler and _small_inputs(ins)
    if small:
        workers = 0  # as dufs select does with a small store: no cluster to start (said after: an error is one line)
    if block_bytes is not None:
        import dask.utils

        try:
            dask.utils.parse_bytes(block_bytes)
        except ValueError:
            fail(ParameterError(f"--block-bytes must be a size like 32MiB or 8000000; got {block_bytes!r}"))
    names = _each_names(ins) if each else []
    outs: Any = [f"{dest.rstrip('/')}/{n}" if "://" in dest else str(Path(dest) / n) for n in names] if each else dest
    local_dest = None if "://" in dest else Path(dest)  # an object store has no folders to make or remove
    made_dest = each and local_dest is not None and not local_dest.exists()
    if each and local_dest is not None:
        local_dest.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    try:
        with cluster(scheduler, workers) as client, bytes_progress() as bar:
            stores, rep = convert_libsvm(list(ins), outs,
                                         zero_based=zb, n_features=n_features, on_error=on_error,
                                         value_dtype=dtype, resume=resume, overwrite=overwrite,
                                         block_bytes=block_bytes, client=client, progress=_convert_progress(bar, t0))
    except DufsError as exc:
        if made_dest and not any(local_dest.iterdir()):
            local_dest.rmdir()  # leave no output behind
        fail(in_flags(exc, CONVERT_FLAGS))
    except KeyboardInterrupt:
        _interrupted(outs if each else [outs], resume)
    _print_converted(stores, rep, time.perf_counter() - t0, small)


#: convert_libsvm's parameters -> dufs convert's flags (for its messages)
CONVERT_FLAGS = {"zero_based": "--zero-based", "n_features": "--n-features", "on_error": "--on-error",
                 "block_bytes": "--block-bytes", "value_dtype": "--dtype", "overwrite": "--overwrite",
                 "resume": "--resume"}
#: make_synthetic's parameters -> dufs make-synthetic's flags (for its messages)
SYNTHETIC_FLAGS = {"n_rows": "--rows", "n_features": "--features", "nnz_per_row": "--nnz-per-row",
                   "n_informative": "--informative", "seed": "--seed", "label_noise": "--label-noise",
                   "row_block": "--row-block", "n_clusters": "--clusters", "cluster_features": "--cluster-features",
                   "cluster_nnz": "--cluster-nnz", "overwrite": "--overwrite", "resume": "--resume"}


def _interrupted(outs: list[str], resume: bool) -> None:
    """Ctrl-C during ``dufs convert``: one line saying where the partial stores the conversion keeps are and how
    to finish them (--resume) or drop them, then exit 130 (typer turns the interrupt into a silent exit 130)."""
    from dufs.data._fs import Location
    from dufs.data.layout import partial_location

    left = [p.url for p in (partial_location(Location.of(o)) for o in outs) if p.exists()]
    if not left:
        console.print("interrupted; nothing was written", highlight=False, soft_wrap=True)
        raise typer.Exit(130)
    again = "run the same command again" if resume else "run the same command with --resume"
    where = ", ".join(left)
    console.print(f"interrupted: the partial {'store is' if len(left) == 1 else 'stores are'} at {escape(where)}; "
                  f"{again} to finish, or with --overwrite to start over (or remove "
                  f"{'it' if len(left) == 1 else 'them'})", highlight=False, soft_wrap=True)
    raise typer.Exit(130)


def _convert_args(inputs: list[str], zero_based: str) -> tuple[list[str], str, Any]:
    """The inputs, the output and the index base of ``dufs convert``, checked before any cluster starts."""
    if len(inputs) < 2:
        fail(DufsError("give at least one input and the output: dufs convert IN... OUT"))
    # strings, not Paths: a Path makes s3://bucket/x.zarr into s3:/bucket/x.zarr
    *ins, dest = inputs
    zb: Any = {"auto": "auto", "true": True, "false": False}.get(zero_based.lower())
    if zb is None:
        fail(DufsError(f"--zero-based must be auto, true or false; got {zero_based!r}"))
    for p in ins:  # before any cluster starts (URLs are checked by the converter)
        if "://" not in p and not Path(p).exists():
            fail(ParameterError(f"{p}: no such file"))
        if "://" not in p and Path(p).is_dir():
            fail(ParameterError(f"{p}: is a directory, not a libsvm file"))
    check_output_dir(dest, "OUT")
    return ins, dest, zb


#: suffixes that say "libsvm text", dropped from an input's name with its compression's to name its store
_TEXT_SUFFIXES = (".svm", ".libsvm", ".svmlight", ".txt")


def _each_names(ins: list[str]) -> list[str]:
    """The store names of ``convert --each``: each input's whole file name less its compression suffix and then a
    libsvm-text suffix, plus ``.zarr`` (``adult.trn.bz2`` -> ``adult.trn.zarr``, ``a.svm.gz`` -> ``a.zarr``), so
    that different inputs get different stores; two inputs that would still share one are refused here, before
    anything is written, naming both."""
    from dufs.data.units import _compressed

    names: list[str] = []
    seen: dict[str, str] = {}
    for p in ins:
        name = p.rstrip("/").rsplit("/", 1)[-1]
        if _compressed(name) and "." in name.lstrip("."):
            name = name[: name.rindex(".")]
        if name.lower().endswith(_TEXT_SUFFIXES) and "." in name.lstrip("."):
            name = name[: name.rindex(".")]
        name += ".zarr"
        if name in seen:
            fail(ParameterError(f"--each: {seen[name]} and {p} would both be converted to {name}; rename one "
                                f"or convert them separately"))
        seen[name] = p
        names.append(name)
    return names


def _convert_progress(bar: Any, t0: float) -> Any:
    """The conversion's progress callback: bytes and rates while parsing, then the finalize stages' blocks."""
    task = bar.add_task("parse", total=None, rate="")

    def progress(ev: dict) -> None:
        el = max(time.perf_counter() - t0, 1e-9)
        if ev["stage"] == "parse":
            rate = _rate(ev["bytes"], el)
            bar.update(task, completed=ev["bytes"], total=ev["total_bytes"],
                       rate=f"{ev['rows'] / el:,.0f} rows/s  {rate}" if rate else "")
        else:
            bar.update(task, description=ev["stage"], advance=0, rate=f"{ev['total']} blocks")

    return progress


#: below this much text, a rate would measure the start (a cluster's, numba compiling the parser on a first run)
#: rather than the parse: ``dufs convert`` reports none
RATE_MIN_BYTES = 8 << 20


def _rate(nbytes: int, seconds: float) -> str:
    """``"12.3 MB/s"``, or "" when it would not mean much (under :data:`RATE_MIN_BYTES` of text)."""
    if nbytes < RATE_MIN_BYTES or seconds <= 0:
        return ""
    return f"{nbytes / seconds / 1e6:,.1f} MB/s"


def _print_converted(stores: Any, rep: Any, dt: float, small: bool) -> None:
    """What ``dufs convert`` did: counts and rate on one line, the first skipped lines, then the stores' paths."""
    if small:
        console.print("the input is small (at most dufs.convert.local-bytes): converted on this process's threads "
                      "(--workers N for a cluster)", highlight=False, soft_wrap=True)
    # one line (never wrapped: a wrapped tail read "lines 0, comment lines 1"); the data lines are the rows written
    rate = _rate(rep.bytes, dt)
    console.print(f"converted {rep.rows:,} rows, {rep.nnz:,} nonzeros, {rep.n_features:,} features "
                  f"({'zero' if rep.zero_based else 'one'}-based) in {dt:.1f} s"
                  f"{f' ({rate})' if rate else ''}; data lines {rep.rows:,}, blank lines {rep.blank_lines:,}, "
                  f"comment lines {rep.comment_lines:,}"
                  + (f", qid fields ignored on {rep.qid_lines:,} lines" if getattr(rep, "qid_lines", 0) else ""),
                  highlight=False, soft_wrap=True)
    if rep.skipped_lines:
        console.print(f"[yellow]skipped {rep.skipped_lines} bad lines[/]; first ones:", highlight=False)
        for f, line, off, why in rep.skipped:
            console.print(f"  {f}:{line}: {why} (byte offset {off})", highlight=False, soft_wrap=True,
                          markup=False)
    for s in (stores if isinstance(stores, list) else [stores]):
        out.print(s.path, highlight=False, soft_wrap=True, markup=False)  # a path for scripts: as it is


@command()
def info(store: str = typer.Argument(..., help="A dufs store (path or URL), or a selection file (dufs select -o)."),
         as_json: bool = typer.Option(False, "--json", help="Print JSON."),
         top: int = typer.Option(10, "--top", min=0, help="How many most frequent features to list."),
         verify: bool = typer.Option(False, "--verify", help="Also read every chunk (as dufs verify) and fail, "
                                                              "naming the damage, if any is missing or corrupt.")
         ) -> None:
    """Summarise a store or a selection file.

    A store: shape, nonzeros, density, blocks, label counts, top features by frequency, provenance. A selection
    file: its method, every parameter in force, the standardisation, the graph, the versions it was made with, the
    best features with their scores, why the method stopped, what it was fitted on and its sidecars."""
    from dufs.data import open_store

    if store.endswith(".json") and "://" not in store:
        if not Path(store).is_file():
            fail(DufsError(f"no such selection file: {store}"))
        _selection_info(Path(store), as_json, top)
        return
    try:
        st = open_store(store)
        d = st.info(top=top)
        if verify:
            d["verified"] = _verify(store)
    except DufsError as exc:
        fail(exc)
    if as_json:
        out.print_json(json.dumps(d))
        return
    print_info(d)
    if verify:
        console.print(str(d["verified"]["summary"]), highlight=False, soft_wrap=True, markup=False)


@command()
def verify(store: str = typer.Argument(..., help="A dufs store (path or URL)."),
           max_damage: int = typer.Option(100, "--max-damage", min=1, help="Stop after this many damaged chunks."),
           as_json: bool = typer.Option(False, "--json", help="Print JSON (the damage, on failure, too).")) -> None:
    """Read and check every chunk of a store (checksums, missing or truncated chunks, the completion marker): exit 0
    and a summary when it is intact, else exit 2 naming what is damaged."""
    from dufs.errors import CorruptChunkError

    try:
        rep = _verify(store, max_damage)
    except CorruptChunkError as exc:
        if as_json:
            out.print_json(json.dumps({"path": store, "intact": False, "error": one_line(exc),
                                       "damage": [list(d) for d in exc.damage]}))
            raise typer.Exit(2) from None
        fail(exc)
    if as_json:
        out.print_json(json.dumps(rep))
        return
    out.print(rep["summary"], highlight=False, soft_wrap=True, markup=False)


def _verify(store: str, max_damage: int = 100) -> dict:
    """:func:`dufs.data.verify_store` with a rich progress-free summary (it raises on damage)."""
    import dataclasses

    from dufs.data import verify_store

    t0 = time.perf_counter()
    rep = verify_store(store, max_damage=max_damage)
    return {**dataclasses.asdict(rep), "intact": True, "seconds": round(time.perf_counter() - t0, 3),
            "summary": str(rep)}


def _selection_info(path: Path, as_json: bool, top: int) -> None:
    import warnings

    from dufs._sidecars import sidecar_path
    from dufs.cli.selecting import load_selection_file

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the table says which sidecar is missing
            sel = load_selection_file(path)
    except DufsError as exc:
        fail(exc)
    raw = json.loads(path.read_text())
    sidecars = {key: {**meta, "present": Path(sidecar_path(str(path), key)).is_file()}
                for key, meta in (raw.get("sidecars") or {}).items()}
    k = min(top, sel.indices.shape[0])
    scores = sel.selected_scores
    prov = raw.get("provenance") or {}
    diag = sel.diagnostics or {}
    d = {"path": str(path), "format": raw.get("format"), "method": sel.method, "n_features_in": sel.n_features_in,
         "n_selected": int(sel.indices.shape[0]), "params": raw.get("params") or {},
         "params_in_force": prov.get("params"),
         "standardize": prov.get("standardize", (raw.get("params") or {}).get("standardize")),
         "graph": prov.get("graph"), "graph_metric": prov.get("graph_metric"),
         "graph_values": prov.get("graph_values"), "versions": prov.get("versions"), "stop": stop_summary(diag),
         "best": [[int(i), None if scores is None else float(s)] for i, s in
                  zip(sel.indices[:k], scores[:k] if scores is not None else [None] * k, strict=True)],
         "source": raw.get("source"), "sidecars": sidecars,
         "passes": (sel.diagnostics or {}).get("passes"), "wall_time": (sel.diagnostics or {}).get("wall_time")}
    if as_json:
        out.print_json(json.dumps(d))
        return
    t = Table(title=escape(d["path"]), show_header=False, title_justify="left")
    t.add_row("selection", f"{d['method']}: {d['n_selected']:,} of {d['n_features_in']:,} features "
                           f"({d['format']})")
    if d["params_in_force"] is not None:
        t.add_row("params in force", escape(", ".join(f"{a}={b!r}" for a, b in d["params_in_force"].items()))
                  or "none")
        given = {a: b for a, b in d["params"].items() if a not in ("n_features", "standardize")}
        t.add_row("given", escape(", ".join(f"{a}={b!r}" for a, b in given.items())) or "none (defaults)")
    else:  # written by an older dufs: only the parameters given
        t.add_row("params", escape(", ".join(f"{a}={b}" for a, b in d["params"].items())) or "defaults")
        t.add_row("params in force", "not recorded (written by an older dufs)")
    t.add_row("standardize", str(d["standardize"]))
    if d["graph"] is not None:
        how = ", ".join(f"{a} {b}" for a, b in (("metric", d["graph_metric"]), ("values", d["graph_values"]))
                        if b is not None)
        t.add_row("graph", escape(str(d["graph"]) + (f" ({how})" if how else "")))
    if d["versions"]:
        t.add_row("versions", escape(", ".join(f"{a} {b}" for a, b in d["versions"].items())))
    t.add_row(f"best {k}", ", ".join(f"{i} ({s:.4g})" if s is not None else str(i) for i, s in d["best"]))
    src = d["source"] or {}
    if src:
        shape = src.get("shape") or ["?", "?"]
        t.add_row("fitted on", escape(f"{src.get('kind', '?')} {src.get('path') or ''} {shape[0]:,} x {shape[1]:,}"
                                      if all(isinstance(v, int) for v in shape) else str(src.get("kind"))))
    for key, meta in sidecars.items():
        t.add_row(f"sidecar {key}", escape(f"{meta.get('file')}: {meta.get('dtype')} {tuple(meta.get('shape', ()))}"
                                           + ("" if meta["present"] else " MISSING")))
    if d["passes"] is not None:
        t.add_row("passes", str(d["passes"]))
    if d["stop"]:
        t.add_row("stopped", escape(d["stop"]))
    out.print(t)


def stop_summary(diag: dict, degenerate: bool = True) -> str | None:
    """Why the method stopped, from its diagnostics (:func:`dufs.selection.stop_reason`: what stopped it, how close
    to converging it was, its pass budget), with a degenerate result's note unless ``degenerate`` is False; None for
    a filter or a greedy method, which make their passes or steps and stop."""
    from dufs.selection import stop_reason

    parts = []
    if diag.get("stopped") is not None or diag.get("converged") is not None:
        parts.append(stop_reason(diag))
    for key in ("gap",) if parts else ("rounds", "gap", "relative_gap"):
        if isinstance(diag.get(key), int | float) and not isinstance(diag.get(key), bool):
            parts.append(f"{key} {diag[key]:.4g}" if isinstance(diag[key], float) else f"{key} {diag[key]}")
    if degenerate and diag.get("degenerate"):
        parts.append(f"degenerate: {diag['degenerate']}")
    return ", ".join(parts) or None


def print_info(d: dict) -> None:
    t = Table(title=escape(d["path"]), show_header=False, title_justify="left")
    n, m = d["shape"]
    t.add_row("shape", f"{n:,} rows x {m:,} features")
    t.add_row("nonzeros", f"{d['nnz']:,} ({d['nnz_per_row']:.1f} a row, density {d['density']:.3g})")
    t.add_row("dtype", d["dtype"])
    t.add_row("blocks", f"{d['row_blocks']} row blocks (largest {d['max_block_nnz']['csr']:,} nnz), "
                        f"{d['feature_blocks']} feature blocks (largest {d['max_block_nnz']['csc']:,} nnz)")
    t.add_row("empty features", f"{d['empty_features']:,}")
    if "labels" in d:
        t.add_row("labels", ", ".join(f"{k}: {v:,}" for k, v in d["labels"].items()))
    t.add_row("top features", ", ".join(f"{j} ({c:,})" for j, c in d["top_features"]))
    prov = d.get("provenance") or {}
    t.add_row("provenance", escape(", ".join(f"{k}={v}" for k, v in prov.items() if k != "options")))
    if d.get("ground_truth"):
        gt = d["ground_truth"]
        t.add_row("ground truth", f"informative features {gt['informative']}" if not gt.get("n_clusters") else
                  f"{gt['n_clusters']} clusters (the labels), each with {len(gt['cluster_features'][0])} features "
                  f"of its own")
    out.print(t)


@command("make-synthetic")
def make_synthetic_cmd(
    output: str = typer.Argument(..., help="The store to write."),
    rows: int = typer.Option(100_000, "--rows"),
    features: int = typer.Option(1_000_000, "--features"),
    nnz_per_row: int = typer.Option(30, "--nnz-per-row"),
    informative: int = typer.Option(20, "--informative"),
    seed: int = typer.Option(0, "--seed"),
    label_noise: float = typer.Option(0.05, "--label-noise"),
    row_block: int | None = typer.Option(None, "--row-block", help="Rows per row block."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing dufs store (never anything "
                                                                 "else); discard an interrupted build."),
    resume: bool = typer.Option(False, "--resume"),
    clusters: int = typer.Option(0, "--clusters", help="Plant K latent clusters (each with features of its own); "
                                                        "the labels are then the clusters."),
    cluster_features: int = typer.Option(20, "--cluster-features", help="Features owned by each cluster."),
    cluster_nnz: int = typer.Option(5, "--cluster-nnz", help="Nonzeros a row draws from its cluster's features."),
    scheduler: str | None = SchedulerOpt,
    workers: int | None = WorkersOpt,
) -> None:
    """Write a kddb-like synthetic store (power-law binary features, sparse linear labels; with --clusters, a
    latent cluster structure for unsupervised selection)."""
    check_output_dir(output, "OUTPUT")
    try:
        make_synthetic(output, rows, features, nnz_per_row, informative, seed, label_noise, row_block,
                        overwrite, resume, scheduler, workers, clusters, cluster_features, cluster_nnz)
    except DufsError as exc:
        fail(in_flags(exc, SYNTHETIC_FLAGS))


def make_synthetic(output, rows, features, nnz_per_row, informative, seed, label_noise, row_block,
                    overwrite, resume, scheduler, workers, clusters=0, cluster_features=20, cluster_nnz=5) -> Any:
    from dufs.data.synthetic import SyntheticSpec
    from dufs.data.writers import make_synthetic

    spec = SyntheticSpec(n_rows=rows, n_features=features, nnz_per_row=nnz_per_row,
                         n_informative=informative, seed=seed, label_noise=label_noise, n_clusters=clusters,
                         cluster_features=cluster_features, cluster_nnz=cluster_nnz)
    t0 = time.perf_counter()
    with cluster(scheduler, workers) as client, bytes_progress() as bar:
        task = bar.add_task("generate", total=None, rate="")
        nnz = [0]

        def progress(ev: dict) -> None:
            if ev["stage"] == "generate":
                nnz[0] += ev["nnz"]
                bar.update(task, advance=1, total=ev["total_blocks"],
                           rate=f"{nnz[0] / max(time.perf_counter() - t0, 1e-9) / 1e6:,.1f} Mnnz/s")
            else:
                bar.update(task, description=ev["stage"], advance=0)

        st = make_synthetic(output, spec, row_block=row_block, overwrite=overwrite, resume=resume,
                            client=client, progress=progress)
    console.print(f"wrote {st.shape[0]:,} x {st.shape[1]:,}, {st.nnz:,} nonzeros in "
                  f"{time.perf_counter() - t0:.1f} s", highlight=False)
    out.print(st.path, highlight=False, soft_wrap=True, markup=False)
    return st
