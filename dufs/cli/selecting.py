"""``dufs select`` and ``dufs evaluate``: selecting features on a store and scoring a selection."""

from __future__ import annotations

import contextlib
import json
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import typer
from rich.markup import escape
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from dufs.cli.app import (
    SchedulerOpt,
    WorkersOpt,
    check_output_file,
    cluster,
    command,
    console,
    fail,
    out,
)
from dufs.errors import DufsError, DufsWarning, ParameterError
from dufs.methods import NAMES


@command()
def select(
    store: str = typer.Argument(..., help="A dufs store (path or URL)."),
    method: str = typer.Option(..., "--method", "-m", help="One of: " + ", ".join(sorted(NAMES)) + "."),
    k: int = typer.Option(..., "-k", "--n-features", help="How many features to select."),
    output: Path | None = typer.Option(None, "-o", "--output", help="Write the selection as JSON here."),
    standardize: str | None = typer.Option(None, "--standardize", help="zscore, scale, none or auto (none "
                                                                          "for sparse data, zscore for dense; "
                                                                          "default: the method's)."),
    n_neighbors: int | None = typer.Option(None, "--n-neighbors", help="kNN graph size (laplacian)."),
    param: list[str] = typer.Option([], "--param", "-p", help="A method parameter, name=value (repeatable); the "
                                    "value is parsed as JSON (numbers, true/false, \"quoted\" strings), none or "
                                    "null (any case) is null (None), anything else is a string."),
    scheduler: str | None = SchedulerOpt,
    workers: int | None = WorkersOpt,
) -> None:
    """Select features: `dufs select kddb.zarr --method fisher -k 200 -o sel.json`."""
    import dufs
    from dufs.api import small_store
    from dufs.engine.progress import on_pass

    try:
        params = _parse_params(param)
        if n_neighbors is not None:
            params["n_neighbors"] = n_neighbors
        std: Any = ...
        if standardize is not None:
            std = None if standardize.lower() == "none" else standardize.lower()
        _check_select(store, method, k, standardize, params)  # before any cluster starts
        check_output_file(output, "-o")
        if workers is None and not scheduler and small_store(store):
            workers = 0  # as dufs.fit does: a pass over it costs less than a task's overhead on a cluster
            console.print(f"{store} is small (at most dufs.engine.inline-nnz nonzeros): run in this process "
                          f"(--workers N for a cluster)", highlight=False, soft_wrap=True)
        with cluster(scheduler, workers) as client, pass_progress() as report, on_pass(report):
            if client is not None and getattr(client, "dashboard_link", None):
                console.print(f"dashboard: {client.dashboard_link}", highlight=False, soft_wrap=True)
            local = client is None and workers == 0 and not scheduler  # --workers 0: threads in this process
            with warnings.catch_warnings(record=True) as caught:  # a degenerate result: said as a warning line
                warnings.simplefilter("always", DufsWarning)
                sel = dufs.fit(store, method=method, n_features=k, client=False if local else client,
                               standardize=std, **params)
            for w in caught:
                if issubclass(w.category, DufsWarning):
                    console.print(f"[yellow]warning:[/] {escape(str(w.message))}", highlight=False, soft_wrap=True)
                else:
                    warnings.showwarning(w.message, w.category, w.filename, w.lineno)
        if output is not None:
            sel.to_json(output)
    except DufsError as exc:
        fail(exc)
    out.print(f"{method}: {sel.n_selected} features of {sel.n_features_in:,}", highlight=False)
    t = Table()
    t.add_column("rank", justify="right")
    t.add_column("feature", justify="right")
    t.add_column("score", justify="right")
    for r, j in enumerate(sel.indices[:20], 1):
        t.add_row(str(r), str(j), f"{sel.selected_scores[r - 1]:.6g}")
    out.print(t)
    d = sel.diagnostics
    where = f"on {d['n_workers']} workers" if d["n_workers"] else "in this process"
    console.print(f"{d['wall_time']:.2f} s {where}, {d['n_blocks']} feature blocks "
                  f"({d.get('blocks', {}).get('mode', '?')}), {d['passes']} passes"
                  + (f"; written to {output}" if output else ""), highlight=False, soft_wrap=True)
    from dufs.cli.stores import stop_summary

    stop = stop_summary(d, degenerate=False)  # a degenerate result was said above, as a warning
    if stop:
        console.print(f"stopped: {stop}", highlight=False, markup=False, soft_wrap=True)


def _check_select(store: str, method: str, k: int, standardize: str | None, params: dict) -> None:
    """What ``dufs select`` can check without a cluster: the method and its parameter names, ``-k``,
    ``--standardize``, and (local paths) that the store is a finished dufs store with enough features and, for a
    supervised method, labels. URLs are opened by ``fit``."""
    import dufs
    from dufs.api import check_method

    spec = check_method(method, params)
    if k < 1:
        raise ParameterError(f"-k (--n-features) must be >= 1; got {k}")
    if standardize is not None and standardize.lower() not in ("zscore", "scale", "none", "auto"):
        raise ParameterError(f"--standardize must be zscore, scale, none or auto; got {standardize!r}")
    if "://" in store:
        return
    st = dufs.open(store)
    if k > st.shape[1]:
        raise ParameterError(f"-k (--n-features) must be at most the {st.shape[1]:,} features of {store}; got {k}")
    if spec.supervised and not st.has_labels:
        raise ParameterError(f"method {method!r} is supervised but {store} has no labels")


def _parse_params(items: list[str]) -> dict[str, Any]:
    """``name=value`` pairs; values are read as JSON when they parse (numbers, true/false, null), else strings.
    ``none``/``null`` in any case is None too: ``-p checkpoint=None`` means no checkpoint, not a folder "None"
    (``-p 'x="None"'`` is the string)."""
    params: dict[str, Any] = {}
    for it in items:
        name, sep, value = it.partition("=")
        if not sep or not name.strip():
            raise DufsError(f"--param wants name=value; got {it!r}")
        if value.strip().lower() in ("none", "null"):
            params[name.strip().replace("-", "_")] = None
            continue
        try:
            params[name.strip().replace("-", "_")] = json.loads(value)
        except json.JSONDecodeError:
            params[name.strip().replace("-", "_")] = value
    return params


@contextlib.contextmanager
def pass_progress() -> Iterator[Any]:
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


@command()
def evaluate(
    store: str = typer.Argument(..., help="The training store."),
    selection: Path = typer.Argument(..., help="A selection JSON (dufs select -o)."),
    test: str | None = typer.Option(None, "--test", help="A test store (default: 5-fold CV on the store)."),
    ks: str = typer.Option("5,10,20,50,100", "--ks", help="Comma-separated K values (top-K features)."),
    figure: Path = typer.Option(Path("accuracy-vs-k.png"), "--figure",
                                help="PNG of accuracy vs K (drawn where matplotlib is installed: dufs[plot])."),
) -> None:
    """Accuracy of LinearSVC(C=1) on the top K selected features, vs K (a table and a PNG)."""
    import dufs
    from dufs.evaluate import topk_curve
    from dufs.plot import PLOT_EXTRA, can_plot, plot_topk

    drawn = can_plot()  # matplotlib is an extra: without it, the table alone

    try:
        kk = _parse_ks(ks)
        check_output_file(figure, "--figure")
        sel = load_selection_file(selection)
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
        if drawn:
            plot_topk({sel.method: curve}, figure, title=f"{sel.method}: LinearSVC(C=1) accuracy vs K")
    except DufsError as exc:
        fail(exc)
    t = Table(title=f"{sel.method} on {store}" + (f", tested on {test}" if test else ", 5-fold CV"),
              title_justify="left")
    t.add_column("K", justify="right")
    t.add_column("accuracy", justify="right")
    for kv, acc in zip(curve["k"], curve["accuracy"], strict=True):
        t.add_row(str(kv), f"{acc:.4f}")
    out.print(t)
    console.print(f"figure: {figure}" if drawn else f"figure: not drawn (it needs matplotlib: {PLOT_EXTRA})",
                  highlight=False, markup=False)


def _parse_ks(ks: str) -> list[int]:
    """``--ks``: comma-separated integers >= 1, sorted and without repeats."""
    try:
        kk = sorted({int(x) for x in ks.split(",") if x.strip()})
    except ValueError:
        kk = []
    if not kk or kk[0] < 1:
        raise ParameterError(f"--ks must be comma-separated integers >= 1, like 5,10,50; got {ks!r}")
    return kk


def load_selection_file(path: Path) -> Any:
    """A selection file, or a one-line error naming it (missing, not JSON, not a dufs selection)."""
    import dufs

    if not path.is_file():
        raise ParameterError(f"{path}: no such selection file" + (" (a directory)" if path.is_dir() else ""))
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", DufsWarning)
            sel = dufs.Selection.from_json(path)
        for w in caught:  # a missing sidecar: a note, the indices still serve
            console.print(f"[yellow]note:[/] {escape(str(w.message))}", highlight=False, soft_wrap=True)
        return sel
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
