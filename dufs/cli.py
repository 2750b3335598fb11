"""The ``dufs`` command line: convert, info, make-synthetic, demo, bench.

Only here: progress bars and starting clusters from flags. With no ``--scheduler``, commands that run on a
cluster start an embedded ``LocalCluster`` (processes, one worker a core) and close it afterwards;
``--workers 0`` runs on local threads in this process instead.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from typer.core import TyperGroup

from dufs.api import METHODS, check_method  # already imported by ``import dufs``: no start-up cost
from dufs.errors import DufsError, ParameterError

# no emoji codes: "file.svm:100:" must not print as "file.svm💯"
console = Console(stderr=True, emoji=False)
out = Console(emoji=False)


# click's exception classes as this typer uses them (recent typer releases vendor their own click)
_ClickException = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")
_UsageError = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")
_NoArgsIsHelp = getattr(sys.modules[_UsageError.__module__], "NoArgsIsHelpError", ())


class _Group(TyperGroup):
    """The ``dufs`` group: usage errors (a missing option, a value of the wrong type, an unknown command) are one
    line, ``error: ... (see dufs CMD --help)``, exit 2, like every other error of the command line."""

    def main(self, args: Any = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except _NoArgsIsHelp as e:
            out.print(e.ctx.get_help(), highlight=False, markup=False)
            sys.exit(2)
        except _UsageError as e:
            where = f" (see {e.ctx.command_path} --help)" if e.ctx is not None else ""
            console.print(f"[bold red]error:[/] {escape(' '.join(e.format_message().split()))}{escape(where)}",
                          highlight=False, soft_wrap=True)
            sys.exit(2)
        except _ClickException as e:
            console.print(f"[bold red]error:[/] {escape(' '.join(e.format_message().split()))}", highlight=False,
                          soft_wrap=True)
            sys.exit(e.exit_code)
        except (typer.Abort, KeyboardInterrupt):
            console.print("interrupted", highlight=False)
            sys.exit(130)
        sys.exit(rv if isinstance(rv, int) else 0)


app = typer.Typer(cls=_Group, add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="dufs: distributed, out-of-core feature selection for huge sparse data.")

SchedulerOpt = typer.Option(None, "--scheduler", help="Address of a running dask scheduler (tcp://host:8786).")
WorkersOpt = typer.Option(None, "--workers", help="Workers of the embedded LocalCluster (default: one a core; "
                                                   "0: local threads, no cluster).")


_DEBUG = {"on": bool(os.environ.get("DUFS_DEBUG"))}


@app.callback()
def _root(debug: bool = typer.Option(False, "--debug", help="Show Python tracebacks instead of one-line errors "
                                                             "(also DUFS_DEBUG=1).")) -> None:
    _DEBUG["on"] = debug or bool(os.environ.get("DUFS_DEBUG"))


def _command(*args: Any, **kwargs: Any) -> Any:
    """``app.command`` whose failures end in one line on stderr and exit 2 (bad input: a DufsError, an OSError, a
    ValueError, a truncated stream) or 1 (anything else, an internal error), never a traceback, unless ``--debug``.
    """
    def deco(fn: Any) -> Any:
        @functools.wraps(fn)
        def wrapper(*a: Any, **k: Any) -> Any:
            try:
                return fn(*a, **k)
            except (typer.Exit, typer.Abort, KeyboardInterrupt, SystemExit):
                raise
            except Exception as exc:  # noqa: BLE001 - the command line's boundary
                if _DEBUG["on"] or isinstance(exc, _ClickException):
                    raise
                _fail(exc)
        return app.command(*args, **kwargs)(wrapper)
    return deco


def _one_line(exc: BaseException) -> str:
    """What a user reads: the message of an error (an OSError as ``path: reason``), on one line."""
    if isinstance(exc, OSError) and exc.strerror and exc.filename is not None:
        text = f"{exc.filename}: {exc.strerror}"
        if exc.filename2 is not None:
            text += f" (-> {exc.filename2})"
    elif isinstance(exc, DufsError | OSError | ValueError | EOFError):
        text = str(exc) or type(exc).__name__
    else:
        text = f"internal error ({type(exc).__name__}: {exc}); run with --debug for the traceback"
    return " ".join(text.split())


def _check_output_file(path: Path | None, option: str) -> None:
    """Before any work: a file can be written at ``path`` (its folder exists and is writable; it is no folder)."""
    if path is None:
        return
    parent = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise ParameterError(f"{option} {path}: is a directory; give a file name")
    if not parent.is_dir():
        raise ParameterError(f"{option} {path}: the folder {parent} does not exist")
    _check_writable(parent, f"{option} {path}")


def _check_writable(folder: Path, what: str) -> None:
    """A file can be made in ``folder`` (tried, not guessed from permission bits: root passes those everywhere)."""
    import tempfile

    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".dufs-write-check-"):
            pass
    except OSError as exc:
        raise ParameterError(f"{what}: cannot write in the folder {folder} ({exc.strerror or exc})") from None


def _check_output_dir(path: str | Path, what: str) -> None:
    """Before any work: a store (a folder) can be made at a local ``path``: its parent folder exists and is
    writable (URLs are checked by the store layer)."""
    if "://" in str(path):
        return
    path = Path(path)
    parent = path.parent if str(path.parent) else Path(".")
    if parent.exists() and not parent.is_dir():
        raise ParameterError(f"{what} {path}: {parent} is not a folder")
    if not parent.is_dir():
        raise ParameterError(f"{what} {path}: the folder {parent} does not exist")
    _check_writable(parent, f"{what} {path}")


@contextlib.contextmanager
def cluster(scheduler: str | None, workers: int | None) -> Iterator[Any]:
    """A distributed Client on ``scheduler``, or on an embedded LocalCluster of processes; None for threads.

    A ``scheduler`` that cannot be reached (or is no address) is a :class:`DufsError` naming it, after at most
    ``dufs.cluster.connect-timeout`` (default 10 s), instead of distributed's traceback after 30 s.
    """
    from dufs.engine.cluster import get_client

    if scheduler:
        _probe_scheduler(scheduler)
    with contextlib.ExitStack() as stack:
        try:
            c = stack.enter_context(get_client(scheduler_address=scheduler, n_workers=workers,
                                               synchronous=workers == 0 and not scheduler))
        except (OSError, ValueError) as exc:
            if not scheduler or isinstance(exc, DufsError):
                raise
            raise _scheduler_error(scheduler, exc) from None
        yield c


def _scheduler_error(address: str, exc: BaseException) -> DufsError:
    why = " ".join(str(exc).split()) or type(exc).__name__  # one line
    return DufsError(f"cannot connect to the Dask scheduler at {address}: {why}")


def _probe_scheduler(address: str) -> None:
    """Open and close one connection to ``address`` within the connect timeout (the Client itself then connects
    with distributed's own timeouts, which its later calls also use)."""
    import asyncio

    import dask.utils
    from distributed.comm import connect
    from distributed.security import Security

    from dufs import config

    timeout = dask.utils.parse_timedelta(config.get("cluster.connect-timeout", "10s"), "s")

    async def probe() -> None:
        comm = await connect(address, timeout=timeout, **Security().get_connection_args("client"))
        await comm.close()

    try:
        asyncio.run(probe())
    except (OSError, ValueError, TypeError) as exc:
        raise _scheduler_error(address, exc) from None


def _fail(exc: BaseException) -> None:
    if _DEBUG["on"]:  # --debug: the traceback (a DufsError the command caught itself included)
        raise exc
    user = isinstance(exc, DufsError | OSError | ValueError | EOFError)
    console.print(f"[bold red]error:[/] {escape(_one_line(exc))}", highlight=False, soft_wrap=True)  # no wrapping
    raise typer.Exit(2 if user else 1)


def _bytes_progress() -> Progress:
    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), TaskProgressColumn(),
                    TextColumn("{task.fields[rate]}"), TimeElapsedColumn(), console=console,
                    disable=not console.is_terminal and not os.environ.get("DUFS_PROGRESS"))


@_command()
def convert(
    inputs: list[Path] = typer.Argument(..., help="libsvm/svmlight files (plain, .bz2, .gz, .xz), then OUT."),
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

    if len(inputs) < 2:
        _fail(DufsError("give at least one input and the output: dufs convert IN... OUT"))
    *ins, dest = inputs
    zb: Any = {"auto": "auto", "true": True, "false": False}.get(zero_based.lower())
    if zb is None:
        _fail(DufsError(f"--zero-based must be auto, true or false; got {zero_based!r}"))
    for p in ins:  # before any cluster starts (URLs are checked by the converter)
        if "://" not in str(p) and not p.exists():
            _fail(ParameterError(f"{p}: no such file"))
        if "://" not in str(p) and p.is_dir():
            _fail(ParameterError(f"{p}: is a directory, not a libsvm file"))
    _check_output_dir(dest, "OUT")
    if block_bytes is not None:
        import dask.utils

        try:
            dask.utils.parse_bytes(block_bytes)
        except ValueError:
            _fail(ParameterError(f"--block-bytes must be a size like 32MiB or 8000000; got {block_bytes!r}"))
    outs: Any = [dest / (p.name.split(".")[0] + ".zarr") for p in ins] if each else dest
    made_dest = each and not dest.exists()
    if each:
        dest.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    try:
        with cluster(scheduler, workers) as client, _bytes_progress() as bar:
            task = bar.add_task("parse", total=None, rate="")

            def progress(ev: dict) -> None:
                el = max(time.perf_counter() - t0, 1e-9)
                if ev["stage"] == "parse":
                    bar.update(task, completed=ev["bytes"], total=ev["total_bytes"],
                               rate=f"{ev['rows'] / el:,.0f} rows/s  {ev['bytes'] / el / 1e6:,.1f} MB/s")
                else:
                    bar.update(task, description=ev["stage"], advance=0, rate=f"{ev['total']} blocks")

            stores, rep = convert_libsvm([str(p) for p in ins], [str(o) for o in outs] if each else str(outs),
                                         zero_based=zb, n_features=n_features, on_error=on_error,
                                         value_dtype=dtype, resume=resume, overwrite=overwrite,
                                         block_bytes=block_bytes, client=client, progress=progress)
    except DufsError as exc:
        if made_dest and not any(dest.iterdir()):
            dest.rmdir()  # leave no output behind
        _fail(exc)
    dt = time.perf_counter() - t0
    # one line (never wrapped: a wrapped tail read "lines 0, comment lines 1"); the data lines are the rows written
    console.print(f"converted {rep.rows:,} rows, {rep.nnz:,} nonzeros, {rep.n_features:,} features "
                  f"({'zero' if rep.zero_based else 'one'}-based) in {dt:.1f} s "
                  f"({rep.bytes / dt / 1e6:,.1f} MB/s); data lines {rep.rows:,}, blank lines {rep.blank_lines:,}, "
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


@_command()
def info(store: str = typer.Argument(..., help="A dufs store (path or URL)."),
         as_json: bool = typer.Option(False, "--json", help="Print JSON."),
         top: int = typer.Option(10, "--top", min=0, help="How many most frequent features to list."),
         verify: bool = typer.Option(False, "--verify", help="Also read every chunk (as dufs verify) and fail, "
                                                              "naming the damage, if any is missing or corrupt.")
         ) -> None:
    """Shape, nonzeros, density, blocks, label counts, top features by frequency, provenance."""
    from dufs.data import open_store

    try:
        st = open_store(store)
        d = st.info(top=top)
        if verify:
            d["verified"] = _verify(store)
    except DufsError as exc:
        _fail(exc)
    if as_json:
        out.print_json(json.dumps(d))
        return
    _print_info(d)
    if verify:
        console.print(str(d["verified"]["summary"]), highlight=False, soft_wrap=True, markup=False)


@_command()
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
            out.print_json(json.dumps({"path": store, "intact": False, "error": _one_line(exc),
                                       "damage": [list(d) for d in exc.damage]}))
            raise typer.Exit(2) from None
        _fail(exc)
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


def _print_info(d: dict) -> None:
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
        t.add_row("ground truth", f"informative features {d['ground_truth']['informative']}")
    out.print(t)


@_command("make-synthetic")
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
    scheduler: str | None = SchedulerOpt,
    workers: int | None = WorkersOpt,
) -> None:
    """Write a kddb-like synthetic store (power-law binary features, sparse linear labels)."""
    _check_output_dir(output, "OUTPUT")
    try:
        _make_synthetic(output, rows, features, nnz_per_row, informative, seed, label_noise, row_block,
                        overwrite, resume, scheduler, workers)
    except DufsError as exc:
        _fail(exc)


def _make_synthetic(output, rows, features, nnz_per_row, informative, seed, label_noise, row_block,
                    overwrite, resume, scheduler, workers) -> Any:
    from dufs.data.synthetic import SyntheticSpec
    from dufs.data.writers import make_synthetic

    spec = SyntheticSpec(n_rows=rows, n_features=features, nnz_per_row=nnz_per_row,
                         n_informative=informative, seed=seed, label_noise=label_noise)
    t0 = time.perf_counter()
    with cluster(scheduler, workers) as client, _bytes_progress() as bar:
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


@_command()
def select(
    store: str = typer.Argument(..., help="A dufs store (path or URL)."),
    method: str = typer.Option(..., "--method", "-m", help="One of: " + ", ".join(sorted(METHODS)) + "."),
    k: int = typer.Option(..., "-k", "--n-features", help="How many features to select."),
    output: Path | None = typer.Option(None, "-o", "--output", help="Write the selection as JSON here."),
    standardize: str | None = typer.Option(None, "--standardize", help="zscore, scale or none (default: "
                                                                          "the method's)."),
    n_neighbors: int | None = typer.Option(None, "--n-neighbors", help="kNN graph size (laplacian)."),
    param: list[str] = typer.Option([], "--param", "-p", help="A method parameter, name=value (repeatable)."),
    scheduler: str | None = SchedulerOpt,
    workers: int | None = WorkersOpt,
) -> None:
    """Select features: `dufs select kddb.zarr --method fisher -k 200 -o sel.json`."""
    import dufs
    from dufs.engine.progress import on_pass

    try:
        params = _parse_params(param)
        if n_neighbors is not None:
            params["n_neighbors"] = n_neighbors
        std: Any = ...
        if standardize is not None:
            std = None if standardize.lower() == "none" else standardize.lower()
        _check_select(store, method, k, standardize, params)  # before any cluster starts
        _check_output_file(output, "-o")
        with cluster(scheduler, workers) as client, _pass_progress() as report, on_pass(report):
            if client is not None and getattr(client, "dashboard_link", None):
                console.print(f"dashboard: {client.dashboard_link}", highlight=False, soft_wrap=True)
            local = client is None and workers == 0 and not scheduler  # --workers 0: threads in this process
            sel = dufs.fit(store, method=method, n_features=k, client=False if local else client, standardize=std,
                           **params)
        if output is not None:
            sel.to_json(output)
    except DufsError as exc:
        _fail(exc)
    out.print(f"{method}: {sel.n_selected} features of {sel.n_features_in:,}", highlight=False)
    t = Table()
    t.add_column("rank", justify="right")
    t.add_column("feature", justify="right")
    t.add_column("score", justify="right")
    for r, j in enumerate(sel.indices[:20], 1):
        t.add_row(str(r), str(j), f"{sel.scores[j]:.6g}")
    out.print(t)
    d = sel.diagnostics
    console.print(f"{d['wall_time']:.2f} s on {d['n_workers']} workers, {d['n_blocks']} feature blocks "
                  f"({d.get('blocks', {}).get('mode', '?')}), {d['passes']} passes"
                  + (f"; written to {output}" if output else ""), highlight=False, soft_wrap=True)


def _check_select(store: str, method: str, k: int, standardize: str | None, params: dict) -> None:
    """What ``dufs select`` can check without a cluster: the method and its parameter names, ``-k``,
    ``--standardize``, and (local paths) that the store is a finished dufs store with enough features and, for a
    supervised method, labels. URLs are opened by ``fit``."""
    import dufs

    spec = check_method(method, params)
    if k < 1:
        raise ParameterError(f"-k (--n-features) must be >= 1; got {k}")
    if standardize is not None and standardize.lower() not in ("zscore", "scale", "none"):
        raise ParameterError(f"--standardize must be zscore, scale or none; got {standardize!r}")
    if "://" in store:
        return
    st = dufs.open(store)
    if k > st.shape[1]:
        raise ParameterError(f"-k (--n-features) must be at most the {st.shape[1]:,} features of {store}; got {k}")
    if spec.supervised and not st.has_labels:
        raise ParameterError(f"method {method!r} is supervised but {store} has no labels")


def _parse_params(items: list[str]) -> dict[str, Any]:
    """``name=value`` pairs; values are read as JSON when they parse (numbers, true/false, null), else strings."""
    params: dict[str, Any] = {}
    for it in items:
        name, sep, value = it.partition("=")
        if not sep or not name.strip():
            raise DufsError(f"--param wants name=value; got {it!r}")
        try:
            params[name.strip().replace("-", "_")] = json.loads(value)
        except json.JSONDecodeError:
            params[name.strip().replace("-", "_")] = value
    return params


@contextlib.contextmanager
def _pass_progress() -> Iterator[Any]:
    """A rich progress bar per pass over the data: yields the callback for ``dufs.engine.progress.on_pass``."""
    prog = Progress(TextColumn("[bold]pass {task.fields[n]}: {task.description}"), BarColumn(), TaskProgressColumn(),
                    TextColumn("{task.completed}/{task.total} blocks"), TimeElapsedColumn(), console=console,
                    disable=not console.is_terminal and not os.environ.get("DUFS_PROGRESS"))
    state = {"n": 0, "task": None}

    def report(name: str, done: int, total: int) -> None:
        if done == 0 or state["task"] is None:
            state["n"] += 1
            state["task"] = prog.add_task(name, total=total, n=state["n"])
        prog.update(state["task"], completed=done)
        if done >= total:
            state["task"] = None

    with prog:
        yield report


@_command()
def evaluate(
    store: str = typer.Argument(..., help="The training store."),
    selection: Path = typer.Argument(..., help="A selection JSON (dufs select -o)."),
    test: str | None = typer.Option(None, "--test", help="A test store (default: 5-fold CV on the store)."),
    ks: str = typer.Option("5,10,20,50,100", "--ks", help="Comma-separated K values (top-K features)."),
    figure: Path = typer.Option(Path("accuracy-vs-k.png"), "--figure", help="PNG of accuracy vs K."),
) -> None:
    """Accuracy of LinearSVC(C=1) on the top K selected features, vs K (a table and a PNG)."""
    import dufs
    from dufs.evaluate import plot_topk, topk_curve

    try:
        kk = _parse_ks(ks)
        _check_output_file(figure, "--figure")
        sel = _load_selection(selection)
        st = dufs.open(store)
        if st.y is None:
            raise DufsError(f"{store} has no labels to evaluate against")
        sel.check_input(st, name=store)  # the features line up (their number, and their ids when both have them)
        ts = None
        if test is not None:
            ts = dufs.open(test)
            if ts.y is None:
                raise DufsError(f"{test} has no labels to evaluate against")
            sel.check_input(ts, name=test)
        kk = [x for x in kk if x <= sel.n_selected] or [sel.n_selected]
        ids = sel.indices[:max(kk)]
        Xtr = _columns(st, ids)
        tst = None if ts is None else (_columns(ts, ids), ts.y)
        curve = topk_curve(Xtr, st.y, np.arange(len(ids)), kk, test=tst, cv=None if tst else 5)
        plot_topk({sel.method: curve}, figure, title=f"{sel.method}: LinearSVC(C=1) accuracy vs K")
    except DufsError as exc:
        _fail(exc)
    t = Table(title=f"{sel.method} on {store}" + (f", tested on {test}" if test else ", 5-fold CV"),
              title_justify="left")
    t.add_column("K", justify="right")
    t.add_column("accuracy", justify="right")
    for kv, acc in zip(curve["k"], curve["accuracy"], strict=True):
        t.add_row(str(kv), f"{acc:.4f}")
    out.print(t)
    console.print(f"figure: {figure}", highlight=False)


def _parse_ks(ks: str) -> list[int]:
    """``--ks``: comma-separated integers >= 1, sorted and without repeats."""
    try:
        kk = sorted({int(x) for x in ks.split(",") if x.strip()})
    except ValueError:
        kk = []
    if not kk or kk[0] < 1:
        raise ParameterError(f"--ks must be comma-separated integers >= 1, like 5,10,50; got {ks!r}")
    return kk


def _load_selection(path: Path) -> Any:
    """A selection file, or a one-line error naming it (missing, not JSON, not a dufs selection)."""
    import dufs

    if not path.is_file():
        raise ParameterError(f"{path}: no such selection file" + (" (a directory)" if path.is_dir() else ""))
    try:
        return dufs.Selection.from_json(path)
    except json.JSONDecodeError as exc:
        raise ParameterError(f"{path} is not a dufs selection: not JSON ({exc.msg} at line {exc.lineno}, "
                             f"column {exc.colno})") from None
    except (KeyError, TypeError, UnicodeDecodeError) as exc:
        raise ParameterError(f"{path} is not a dufs selection ({type(exc).__name__}: {exc})") from None


def _columns(st: Any, ids: np.ndarray) -> Any:
    """The columns ``ids`` of a store (in that order) as a SciPy CSC array: only their feature blocks are read."""
    import scipy.sparse as sp

    if ids.size and (ids.max() >= st.shape[1] or ids.min() < 0):
        raise DufsError(f"the selection names feature {int(ids.max())}; {st.path} has {st.shape[1]} features")
    bounds = st.bounds("csc")
    which = np.searchsorted(bounds, ids, side="right") - 1
    cols = {}
    for b in np.unique(which):
        blk = st.block(int(b), "csc").to_scipy()
        for j in ids[which == b]:
            cols[int(j)] = blk[:, [int(j) - int(bounds[b])]]
    M = sp.hstack([cols[int(j)] for j in ids], format="csc") if ids.size else sp.csc_array((st.shape[0], 0))
    if M.nnz < 2**31:  # scikit-learn's liblinear wants 32-bit indices
        M.indices = M.indices.astype(np.int32)
        M.indptr = M.indptr.astype(np.int32)
    return M


@_command()
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
        _fail(ParameterError(f"--dataset must be one of {', '.join(available())}; got {dataset!r}"))
    if out_dir.exists() and not out_dir.is_dir():
        _fail(ParameterError(f"--out {out_dir}: is a file, not a folder"))
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "synthetic.zarr"
    try:
        st = _make_synthetic(str(path), rows, features, 30, 20, 0, 0.05, None, True, False, None, workers)
        _print_info(st.info())
        train, test = _demo_real_stores(dataset, out_dir)
        ks = [10, 20, 50, 100, 200]
        with cluster(None, workers) as client, _pass_progress() as report, on_pass(report):
            syn = {m: dufs.fit(st, method=m, n_features=50, client=client) for m in ("fisher", "correlation")}
            # the headline method, in the paper's setting for large sparse data (unit variance, no centring)
            syn["mmfs"] = dufs.fit(st, method="mmfs", n_features=50, client=client, standardize="scale", gamma=1.0,
                                   checkpoint=None)
            real = {m: dufs.fit(train, method=m, n_features=max(ks), client=client)
                    for m in ("fisher", "laplacian")}
        syn["fisher"].to_json(out_dir / "fisher-50.json")
        syn["mmfs"].to_json(out_dir / "mmfs-50.json")
        fig = syn["fisher"].plot(out_dir / "fisher-scores.png")
        table, fig2 = _demo_evaluate(real, train, test, ks, out_dir / f"{dataset}-accuracy-vs-k.png")
    except DufsError as exc:
        _fail(exc)
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
    out.print(f"selections: {out_dir / 'fisher-50.json'}, {out_dir / 'mmfs-50.json'}; figures: {fig}, {fig2}",
              highlight=False, soft_wrap=True)


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


def _demo_evaluate(sels: dict, train: Any, test: Any, ks: list[int], figure: Path) -> tuple[Table, str]:
    """Test accuracy of LinearSVC(C=1) on the top K features of each selection, and with all features."""
    from dufs.evaluate import plot_topk, topk_curve

    Xtr, Xte = train.to_scipy("csr"), test.to_scipy("csr")
    curves = {m: topk_curve(Xtr, train.y, s.indices, ks, test=(Xte, test.y)) for m, s in sels.items()}
    full = topk_curve(Xtr, train.y, np.arange(Xtr.shape[1]), [Xtr.shape[1]], test=(Xte, test.y))["accuracy"][0]
    fig = plot_topk(curves, figure, title=f"LinearSVC(C=1) test accuracy vs K (all {Xtr.shape[1]:,} features: "
                                          f"{full:.3f})")
    t = Table(title=f"{train.attrs.get('provenance', {}).get('source', '')}: test accuracy of LinearSVC(C=1), "
                    f"{Xtr.shape[0]} train / {Xte.shape[0]} test; all {Xtr.shape[1]:,} features: {full:.4f}",
              title_justify="left", min_width=100)
    t.add_column("K", justify="right")
    for m in curves:
        t.add_column(m, justify="right")
    for i, kv in enumerate(ks):
        t.add_row(str(kv), *[f"{curves[m]['accuracy'][i]:.4f}" for m in curves])
    return t, fig


@_command()
def bench(
    what: str = typer.Argument(..., help="What to measure: ingest, pass, mmfs, greedy, m3fs or ufcm."),
    size_mb: float = typer.Option(64.0, "--size-mb", help="ingest: size of the base libsvm file (MB)."),
    repeats: int | None = typer.Option(None, "--repeats", help="Runs per figure, the median is printed (default: "
                                       "3 for ingest, 7 for pass)."),
    work_dir: Path | None = typer.Option(None, "--dir", help="Scratch directory (ingest: default a temp dir; pass: "
                                         "where the synthetic store is built and reused, default "
                                         "<tmp>/dufs-bench)."),
    rows: int = typer.Option(2_000_000, "--rows", help="Rows (samples) of the synthetic store "
                      "(m3fs, ufcm: default 200,000)."),
    features: int = typer.Option(5_000_000, "--features", help="Features of the synthetic store "
                          "(m3fs, ufcm: default 1,000,000)."),
    nnz_per_row: int = typer.Option(30, "--nnz-per-row", help="pass, mmfs: nonzeros a row."),
    store: Path | None = typer.Option(None, "--store", help="pass, mmfs: the store path (reused when it holds the same "
                                      "synthetic spec, else built there)."),
    ks: str = typer.Option("50,200", "--ks", help="greedy: the numbers of features selected, comma-separated (the "
                           "first is timed on every cluster size, the peak memory is compared between the first "
                           "and the last)."),
) -> None:
    """Benchmarks printed as ratios against a reference measured in the same run."""
    from dufs import bench as _bench

    if what == "ingest":
        _bench.ingest(size_mb=size_mb, repeats=repeats or 3, work_dir=work_dir, console=out)
    elif what == "pass":
        _bench.pass_(rows=rows, features=features, nnz_per_row=nnz_per_row, repeats=repeats or 7, work_dir=work_dir,
                     store=store, console=out)
    elif what == "mmfs":
        _bench.mmfs(rows=rows, features=features, nnz_per_row=nnz_per_row, work_dir=work_dir, store=store,
                    console=out)
    elif what == "greedy":
        from dufs.bench.greedy import greedy

        try:
            kk = tuple(int(k) for k in ks.split(","))
            if min(kk) < 2:
                raise ValueError
        except ValueError:
            _fail(ParameterError(f"--ks must be comma-separated integers >= 2, like 50,200; got {ks!r}"))
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
        run(**size, nnz_per_row=nnz_per_row, work_dir=work_dir, store=store, console=out, repeats=repeats or 3)
    else:
        _fail(DufsError(f"unknown benchmark {what!r}; choose from: ingest, pass, mmfs, greedy, m3fs, ufcm"))


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        console.print("interrupted")
        sys.exit(130)


if __name__ == "__main__":
    main()
