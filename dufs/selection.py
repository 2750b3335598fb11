"""The result of a feature selection: ``Selection`` (docs/architecture.md, "Results and evaluation")."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dufs._sidecars import (
    _join_diagnostics,
    _jsonable,
    _read_bytes,
    _read_sidecars,
    _split_diagnostics,
    _write_bytes,
    _write_sidecar,
)
from dufs.errors import ParameterError

#: the format :meth:`Selection.to_json` writes and :meth:`Selection.from_json` reads: non-finite scores as the
#: strings "inf", "-inf" and "nan", the input's identity (``source``), the full per-feature scores and every large
#: array of the diagnostics in binary sidecar files beside the JSON (or inline, in the text form of
#: :meth:`Selection.to_json` without a path)
FORMAT = "dufs.selection/3"
_NONFINITE = {"inf": np.inf, "-inf": -np.inf, "nan": np.nan}


@dataclass
class Selection:
    """Selected features, best first, with the method's per-feature scores and diagnostics.

    Attributes
    ----------
    method : str
        The method that made it (``"variance"``, ``"mmfs"``, ...).
    indices : ndarray of int64
        Selected feature indices, best first.
    scores : ndarray of float64 (or float32) or None
        The method's own criterion for every feature (NaN where undefined); larger is better unless
        ``higher_is_better`` is False (e.g. the Laplacian score). None when a selection file's sidecar of scores
        is missing.
    n_features_in : int
        Number of features of the data it was fitted on.
    params : dict
        The parameters it was run with.
    diagnostics : dict
        Iterations, duality gap or objective trace, passes over the data, wall time per phase, cluster size.
    higher_is_better : bool
    source : dict or None
        What identifies the input it was fitted on (:func:`dufs.engine.inputs.input_identity`): ``kind``
        ("store", "memory" or "dask"), ``shape``, ``nnz``, ``dtype``, ``fingerprint`` (of a store: its metadata;
        of in-memory input: SHA-256 of the matrix; none for a Dask array: shape and chunks only) and
        ``fingerprint_of``, the ``path`` of a store, and, for a store with feature ids, their digest
        (``feature_ids``) and the ids of the selected features (``selected_feature_ids``). None when unknown (a
        selection made by hand or read from an older file). :meth:`check_input` compares an input with it.
    selected_scores : ndarray of float64
        The scores of the selected features, in ``indices`` order (kept in the JSON itself, so they survive a
        missing sidecar).
    provenance : dict or None
        How it was made, to run it again: ``params`` (every parameter in force, the method's defaults included),
        ``standardize``, ``graph`` (the sample graph built: "knn", "anchor", "given"; None for a method without
        one) and ``versions`` (dufs's, its libraries' and Python's: :func:`dufs._version.versions`). None when
        unknown (a file written by an older dufs).
    """

    method: str
    indices: np.ndarray
    scores: np.ndarray | None
    n_features_in: int
    params: dict = field(default_factory=dict)
    diagnostics: dict = field(default_factory=dict)
    higher_is_better: bool = True
    source: dict | None = None
    selected_scores: np.ndarray | None = None
    provenance: dict | None = None

    def __post_init__(self) -> None:
        self.indices = np.asarray(self.indices, dtype=np.int64).ravel()
        if self.indices.size and (self.indices.min() < 0 or self.indices.max() >= self.n_features_in):
            raise ParameterError(f"selected indices must lie in [0, {self.n_features_in}); got "
                                 f"[{self.indices.min()}, {self.indices.max()}]")
        if np.unique(self.indices).size != self.indices.size:
            raise ParameterError("selected indices must be distinct")
        if self.scores is not None:
            s = np.asarray(self.scores)
            self.scores = (s if s.dtype in (np.float32, np.float64) else s.astype(np.float64)).ravel()
            if self.scores.shape[0] != self.n_features_in:
                raise ParameterError(f"scores has {self.scores.shape[0]} entries for {self.n_features_in} features")
            self.selected_scores = self.scores[self.indices]
        elif self.selected_scores is not None:
            self.selected_scores = np.asarray(self.selected_scores, dtype=np.float64).ravel()
            if self.selected_scores.shape != self.indices.shape:
                raise ParameterError(f"selected_scores has {self.selected_scores.shape[0]} entries for "
                                     f"{self.indices.shape[0]} selected features")

    @property
    def n_selected(self) -> int:
        return int(self.indices.size)

    @property
    def support_mask(self) -> np.ndarray:
        """Boolean mask over the input features, True where selected."""
        m = np.zeros(self.n_features_in, dtype=bool)
        m[self.indices] = True
        return m

    def top(self, k: int) -> np.ndarray:
        """The ``k`` best selected features."""
        if not 1 <= k <= self.n_selected:
            raise ParameterError(f"The 'k' parameter of Selection.top must be an int in [1, {self.n_selected}]; "
                                 f"got {k}.")
        return self.indices[:k].copy()

    def transform(self, X: Any) -> Any:
        """The selected columns of ``X``, in ranking order (``indices``).

        ``X`` may be a store (:class:`~dufs.data.SparseStore`, a path or URL): only the feature blocks holding
        selected columns are read, one at a time, and the result is SciPy CSR (int32 indices where they fit), what
        scikit-learn's estimators take; for a lazy result give ``store.to_dask("csc")``. SciPy sparse stays in
        its format, a Dask array stays lazy; NumPy, pydata ``sparse`` and a pandas DataFrame (by position) as
        themselves.
        """
        return take_columns(X, self.indices, self.n_features_in)

    # ---------------------------------------------------------------- the input
    def check_input(self, X: Any, *, same_data: bool = False, name: str | None = None) -> dict:
        """Check that ``X`` can be used with this selection; return ``X``'s identity
        (:func:`dufs.engine.inputs.input_identity`).

        ``X`` is any input :func:`dufs.fit` takes: a store path or URL, a :class:`~dufs.data.SparseStore`, NumPy,
        SciPy sparse, pydata sparse or a Dask array. Cheap: a store's metadata (and feature ids, when it has them)
        are read, not its data; in-memory input is hashed only with ``same_data=True``.

        Raises a one-line :class:`~dufs.errors.ParameterError` when

        - ``X`` has another number of features than the selection was fitted on;
        - both have feature ids (stores written with ``feature_ids``) and they differ (naming the first selected
          feature whose id differs, if any);
        - ``same_data=True`` (``X`` should be the very data the selection was fitted on, e.g. the training set)
          and its shape, nonzeros or content fingerprint differ from those recorded in :attr:`source`.

        With ``same_data=True`` and fingerprints that cannot be compared (the selection records none: fitted on a
        Dask array; or one is of a store and the other of in-memory data), only the
        shape and nonzeros are compared, with a :class:`~dufs.errors.DufsWarning` saying so.

        ``name`` is what the messages call ``X`` (default: the store's path, else "X").
        """
        from dufs.engine import Matrix, input_identity

        if isinstance(X, Matrix):
            got = dict(X.identity)
        else:
            got = input_identity(X) if same_data or not _is_memory(X) else _shape_identity(X)
        src = self.source or {}
        what = name or got.get("path") or "X"
        fitted = f"the {self.method} selection" + (f" (made on {src['path']})" if src.get("path") else "")
        d = int(got["shape"][1])
        if d != self.n_features_in:
            hint = f" (libsvm text: convert it with --n-features {self.n_features_in})" if got["kind"] == "store" \
                else ""
            raise ParameterError(f"{what} has {d:,} features; {fitted} was fitted on {self.n_features_in:,}: give "
                                 f"data with the same features in the same order{hint}")
        if got.get("feature_ids") and src.get("feature_ids") and got["feature_ids"] != src["feature_ids"]:
            where = _first_id_difference(X, self.indices, src.get("selected_feature_ids"))
            raise ParameterError(f"{what} has other feature ids than the data {fitted} was fitted on{where}; give "
                                 f"data with the same features in the same order")
        if same_data:
            _check_same_data(got, src, what, fitted)
        return got

    # ---------------------------------------------------------------- persistence
    def to_dict(self, *, inline: bool = True) -> dict:
        """The JSON document: with ``inline``, every score and array in it (the text form); without, the scores
        and the large arrays of the diagnostics are left for sidecar files (see :meth:`to_json`)."""
        diag, arrays = _split_diagnostics(self.diagnostics, inline)
        d = {"format": FORMAT, "method": self.method, "n_features_in": int(self.n_features_in),
             "higher_is_better": bool(self.higher_is_better), "indices": self.indices.tolist(),
             "selected_scores": None if self.selected_scores is None else
             [_score_out(float(v)) for v in self.selected_scores],
             "params": _jsonable(self.params), "diagnostics": diag, "source": _jsonable(self.source)}
        if self.provenance is not None:
            d["provenance"] = _jsonable(self.provenance)
        if inline and self.scores is not None:
            d["scores"] = [_score_out(v) for v in self.scores.tolist()]
            d["scores_dtype"] = str(self.scores.dtype)
        d["_arrays"] = arrays  # taken out by to_json
        return d

    def to_json(self, path: str | os.PathLike | None = None) -> str:
        """The selection as strict JSON (``allow_nan=False``; non-finite scores as the strings "inf", "-inf" and
        "nan", so :meth:`from_json` gives back bit-identical scores).

        Without ``path``: the text, every score inline (for small selections). With ``path`` (a local path or an
        fsspec URL): a small JSON there (the selected features best first with their scores, the parameters, the
        diagnostics without per-sample or per-feature arrays, the input's identity) and, beside it, one ``.npy``
        sidecar for the full per-feature scores (``<name>.scores.npy``, their own dtype) and one for each large
        array of the diagnostics (``<name>.<key>.npy``, e.g. the cluster labels), each with its crc32c in the
        JSON; every file is written to a temporary name and renamed when complete (on local paths), the JSON
        last. Returns the JSON's text."""
        if path is None:
            d = self.to_dict(inline=True)
            d.pop("_arrays")
            return json.dumps(d, allow_nan=False)
        path = os.fspath(path)
        d = self.to_dict(inline=False)
        arrays = d.pop("_arrays")
        if self.scores is not None:
            arrays = {"scores": self.scores, **arrays}
        d["sidecars"] = {key: _write_sidecar(path, key, np.asarray(a)) for key, a in arrays.items()}
        text = json.dumps(d, allow_nan=False)
        _write_bytes(path, text.encode())
        return text

    @classmethod
    def from_json(cls, text_or_path: str | os.PathLike) -> Selection:
        """A selection from :meth:`to_json`'s text or file (format ``dufs.selection/3``).

        A file's sidecars are read beside it (their crc32c checked). When the sidecar of scores is missing, the
        selection still has its indices, the selected features' scores and ``transform``; ``scores`` is None, and a
        :class:`~dufs.errors.DufsWarning` says so."""
        s = os.fspath(text_or_path)
        path = None
        if not s.lstrip().startswith("{"):
            path = s
            s = _read_bytes(s).decode()
        d = json.loads(s)
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            got = d.get("format") if isinstance(d, dict) else type(d).__name__
            raise ParameterError(f"not a dufs selection (format {got!r}; expected {FORMAT!r})")
        scores = d.get("scores")
        if scores is not None:
            dtype = np.float32 if d.get("scores_dtype") == "float32" else np.float64
            scores = np.array([_score_in(v) for v in scores], dtype=dtype)
        loaded, missing = _read_sidecars(path, d.get("sidecars") or {})
        scores = loaded.pop("scores", scores)
        diagnostics = _join_diagnostics(d.get("diagnostics") or {}, loaded)
        if missing:
            import warnings

            from dufs.errors import DufsWarning

            what = "the full scores" if "scores" in missing else "arrays of the diagnostics"
            warnings.warn(f"{path or 'the selection'}: {what} are missing ({', '.join(missing.values())} not "
                          f"found); the indices, the selected features' scores and transform still work",
                          DufsWarning, stacklevel=2)
        sel_scores = d.get("selected_scores")
        return cls(method=d["method"], indices=np.asarray(d["indices"], dtype=np.int64), scores=scores,
                   n_features_in=int(d["n_features_in"]), params=d.get("params") or {},
                   diagnostics=diagnostics, higher_is_better=bool(d.get("higher_is_better", True)),
                   source=d.get("source"), provenance=d.get("provenance"),
                   selected_scores=None if sel_scores is None else np.array([_score_in(v) for v in sel_scores]))

    def plot(self, path: str | os.PathLike) -> str:
        """A PNG of the score distribution with the selected features marked. Returns the path."""
        from dufs.plot import plot_scores

        if self.scores is None:
            raise ParameterError(f"the {self.method} selection has no scores to plot")
        scores = self.scores if self.higher_is_better else -self.scores
        finite = np.where(np.isfinite(scores), scores, np.nan)
        return plot_scores(finite[~np.isnan(finite)], path, title=f"{self.method}: {self.n_selected} selected",
                           top=max(1, min(4 * self.n_selected, int((~np.isnan(finite)).sum()))),
                           ylabel="score" if self.higher_is_better else "-score")

    def _repr_html_(self) -> str:
        """A notebook summary: the method, the parameters in force, the top features with their scores, how the
        run stopped. Every value is escaped."""
        return _html(self)

    def __repr__(self) -> str:
        head = ", ".join(str(i) for i in self.indices[:8]) + (", ..." if self.n_selected > 8 else "")
        return f"Selection(method={self.method!r}, n_selected={self.n_selected}, indices=[{head}])"


#: the features listed by :meth:`Selection._repr_html_`
HTML_TOP = 10


def stop_reason(diag: dict) -> str:
    """How a run ended, from its diagnostics: the solver's own reason, convergence, greedy steps, or a one-off
    score; then, where the method records them, how close it was to converging (``diagnostics["convergence"]``:
    its measure against its tolerance) and its budget of passes (``diagnostics["budget"]``)."""
    conv = diag.get("convergence") if isinstance(diag.get("convergence"), dict) else None
    details = [f"{k.replace('_', ' ')} {diag[k]:.3g}" if isinstance(diag[k], float) else f"{k} {diag[k]}"
               for k in ("iterations", "rounds", "relative_gap") if isinstance(diag.get(k), int | float)
               and not isinstance(diag.get(k), bool) and not (conv and k == "relative_gap")]
    if diag.get("stopped"):
        why = str(diag["stopped"])
    elif "converged" in diag:
        why = "converged" if diag["converged"] else "not converged (iteration limit)"
    elif isinstance(diag.get("steps"), int):
        why = f"{diag['steps']} greedy steps, one a feature"
    else:
        why = "scored in closed form (no iterations)"
    out = why + (f" ({', '.join(details)})" if details else "")
    if conv:
        out += "; " + closeness(conv)
    if isinstance(diag.get("budget"), dict):
        out += "; " + budget_text(diag["budget"])
    return out


def _g(v: Any) -> str:
    return f"{v:.3g}" if isinstance(v, int | float) and not isinstance(v, bool) else "n/a"


def closeness(conv: dict) -> str:
    """A method's ``diagnostics["convergence"]`` in words: its measure at the end against its tolerance."""
    text = f"{conv.get('measure', 'convergence measure')} {_g(conv.get('value'))} against tol {_g(conv.get('tol'))}"
    if isinstance(conv.get("labels_changed"), int):
        text += f", {conv['labels_changed']:,} labels changed in the last iteration"
    return text


def budget_text(budget: dict) -> str:
    """A method's ``diagnostics["budget"]`` (its budget of passes over the data) in words."""
    rule, limit = budget.get("rule"), budget.get("max_passes")
    if rule == "none":
        return "no pass budget (max_passes=None)"
    if rule == "given":
        return f"pass budget {limit:,} (given)"
    if limit is None:
        return f"pass budget auto, unset: {budget.get('note') or 'the run ended before its speed was measured'}"
    return (f"pass budget {limit:,} (auto: {budget.get('time_budget'):g} s at {_g(budget.get('seconds_per_pass'))} "
            f"s a pass, at least {budget.get('min_passes')})")


def _html(sel: Selection) -> str:
    """The HTML of :meth:`Selection._repr_html_`."""
    import html

    def esc(v: Any) -> str:
        return html.escape(v if isinstance(v, str) else repr(v) if v is None or isinstance(v, bool | list | tuple)
                           else str(v))

    def show(v: Any) -> str:
        return esc(repr(v) if isinstance(v, str) else v)

    def table(head: list[str], rows: list[list[str]]) -> str:
        th = "".join(f"<th style='text-align:left'>{h}</th>" for h in head)
        body = "".join("<tr>" + "".join(f"<td style='text-align:left'>{c}</td>" for c in r) + "</tr>" for r in rows)
        return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"

    diag = sel.diagnostics or {}
    prov = sel.provenance
    out = [f"<div class='dufs-selection'><p><b>dufs Selection</b>: <code>{esc(sel.method)}</code>, "
           f"{sel.n_selected:,} of {sel.n_features_in:,} features selected</p>"]
    src = sel.source or {}
    if src.get("shape"):
        n, d = src["shape"]
        where = f" at <code>{esc(src['path'])}</code>" if src.get("path") else ""
        nnz = f", {src['nnz']:,} nonzeros" if isinstance(src.get("nnz"), int) else ""
        out.append(f"<p>Input: {esc(src.get('kind', ''))} {int(n):,} x {int(d):,}{nnz}{where}</p>")
    if prov is not None:
        rows = [["n_features", show(sel.params.get("n_features", sel.n_selected))],
                ["standardize", show(prov.get("standardize"))]]
        if prov.get("graph") is not None:
            rows.append(["graph built", show(prov["graph"])])
        rows += [[esc(k), show(v)] for k, v in (prov.get("params") or {}).items()]
        out.append("<p>Parameters in force</p>" + table(["parameter", "value"], rows))
        if prov.get("versions"):
            out.append("<p>Versions: " + ", ".join(f"{esc(k)} {esc(v)}" for k, v in prov["versions"].items())
                       + "</p>")
    else:
        out.append("<p>Parameters given (the defaults in force were not recorded)</p>"
                   + table(["parameter", "value"], [[esc(k), show(v)] for k, v in sel.params.items()]))
    k = min(HTML_TOP, sel.n_selected)
    ids = src.get("selected_feature_ids")
    head = ["rank", "feature"] + (["id"] if ids else []) + ["score"]
    rows = []
    for r in range(k):
        score = "" if sel.selected_scores is None else f"{float(sel.selected_scores[r]):.6g}"
        rows.append([str(r + 1), str(int(sel.indices[r]))] + ([esc(ids[r])] if ids else []) + [score])
    order = "higher is better" if sel.higher_is_better else "lower is better"
    more = f", {sel.n_selected - k:,} more not shown" if sel.n_selected > k else ""
    out.append(f"<p>Top {k} features (scores: {order}{more})</p>" + table(head, rows))
    facts = [f"stopped: {esc(stop_reason(diag))}"]
    if diag.get("passes") is not None:
        facts.append(f"passes over the data: {esc(diag['passes'])}")
    if isinstance(diag.get("wall_time"), int | float):
        facts.append(f"wall time: {diag['wall_time']:.3g} s")
    out.append("<p>" + "; ".join(facts) + "</p>")
    if diag.get("degenerate"):
        out.append(f"<p><b>Warning</b>: {esc(diag['degenerate'])}</p>")
    return "".join(out) + "</div>"


def _is_store(X: Any) -> bool:
    return isinstance(X, str | os.PathLike) or type(X).__name__ == "SparseStore"


def take_columns(X: Any, indices: Any, n_features_in: int) -> Any:
    """The columns ``indices`` of ``X`` (see :meth:`Selection.transform`), in that order, after checking that
    ``X`` has ``n_features_in`` features."""
    import scipy.sparse as sp

    from dufs.engine.inputs import is_dask_array

    idx = np.asarray(indices, dtype=np.int64).ravel()
    if _is_store(X):
        from dufs.data import open_store

        X = open_store(X) if isinstance(X, str | os.PathLike) else X
    shape = getattr(X, "shape", None)
    if shape is None or len(shape) != 2:
        raise ParameterError(f"X must be a 2-D matrix or a store; got {type(X).__name__}"
                             + (f" of shape {tuple(shape)}" if shape is not None else ""))
    if shape[1] != n_features_in:
        raise ParameterError(f"X has {shape[1]} features; this selection was fitted on {n_features_in}")
    if type(X).__name__ == "SparseStore":
        return _store_columns(X, idx)
    if is_dask_array(X):
        return X[:, idx]  # lazy
    if sp.issparse(X):  # the same format back
        if X.format in ("csr", "csc"):
            return X[:, idx]
        return X.tocsc()[:, idx].asformat(X.format)
    if type(X).__name__ == "DataFrame" and hasattr(X, "iloc"):
        return X.iloc[:, idx]
    return X[:, idx]


def _store_columns(store: Any, idx: np.ndarray) -> Any:
    """The columns ``idx`` of a store as SciPy CSR, from the feature blocks holding them (one block in memory at
    a time beside the columns taken)."""
    import scipy.sparse as sp

    n = int(store.shape[0])
    order = np.argsort(idx, kind="stable")
    srt = idx[order]
    bounds = store.bounds("csc")
    pieces = []
    for i in np.unique(np.searchsorted(bounds, srt, side="right") - 1).tolist():
        lo, hi = int(bounds[i]), int(bounds[i + 1])
        cols = srt[(srt >= lo) & (srt < hi)] - lo
        pieces.append(store.block(i, "csc").to_scipy()[:, cols])
    if not pieces:
        return sp.csr_array((n, 0), dtype=store.dtype)
    C = sp.hstack(pieces, format="csc") if len(pieces) > 1 else pieces[0]
    C = sp.csr_array(C[:, np.argsort(order)])  # back to the order asked for
    if max(C.nnz, *C.shape) <= np.iinfo(np.int32).max:  # scikit-learn's liblinear refuses int64 indices
        C = sp.csr_array((C.data, C.indices.astype(np.int32), C.indptr.astype(np.int32)), shape=C.shape)
    return C


def _score_out(v: float) -> float | str:
    """A score as JSON: the number, or "inf", "-inf", "nan"."""
    if math.isfinite(v):
        return v
    return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")


def _score_in(v: Any) -> float:
    """A score from JSON: a number, or one of "inf", "-inf", "nan"."""
    if isinstance(v, str):
        if v not in _NONFINITE:
            raise ParameterError(f"not a dufs selection: a score is the string {v!r} (expected a number, 'inf', "
                                 f"'-inf' or 'nan')")
        return float(_NONFINITE[v])
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ParameterError(f"not a dufs selection: a score is {v!r} (expected a number, 'inf', '-inf' or 'nan')")
    return float(v)


def _is_memory(X: Any) -> bool:
    from dufs.engine import Matrix
    from dufs.engine.inputs import is_dask_array

    return not (isinstance(X, str | os.PathLike | Matrix) or is_dask_array(X) or type(X).__name__ == "SparseStore")


def _shape_identity(X: Any) -> dict:
    """The shape of an in-memory input, for the cheap checks (no hashing)."""
    shape = getattr(X, "shape", None)
    if shape is None or len(shape) != 2:
        raise ParameterError(f"X must be a 2-D matrix or a store; got {type(X).__name__}"
                             + (f" of shape {tuple(shape)}" if shape is not None else ""))
    return {"kind": "memory", "type": type(X).__name__, "shape": [int(s) for s in shape]}


def _first_id_difference(X: Any, indices: np.ndarray, recorded: Any) -> str:
    """Where the selected features' ids differ between ``X`` (a store) and the record, as a clause."""
    if recorded is None:
        return ""
    from dufs.engine import Matrix

    if isinstance(X, Matrix):
        ids = X.feature_ids
    else:
        from dufs.data import SparseStore, open_store

        ids = (X if isinstance(X, SparseStore) else open_store(X)).feature_ids
    if ids is None:
        return ""
    ids = np.asarray(ids)
    for j, want in zip(indices.tolist(), recorded, strict=False):
        have = ids[j:j + 1].tolist()[0]
        if have != want:
            return f": selected feature {j} is {have!r} there, {want!r} in that data"
    return " (the selected features' ids agree; others differ)"


_FINGERPRINTS = {"store-meta": "its metadata (block bounds and nonzeros per block)",
                 "sha256-csc": "its values (SHA-256)"}


def _check_same_data(got: dict, src: dict, what: str, fitted: str) -> None:
    """``same_data=True``: the shape, nonzeros and fingerprint of ``got`` against the record ``src``."""
    import warnings

    from dufs.errors import DufsWarning

    if not src:
        warnings.warn(f"{fitted} records no input identity (written by an older dufs): cannot check that {what} "
                      f"is the data it was fitted on; only its number of features was checked", DufsWarning,
                      stacklevel=3)
        return

    def desc(i: dict) -> str:
        n, d = i["shape"]
        return f"{n:,} x {d:,}" + (f", {i['nnz']:,} nonzeros" if i.get("nnz") is not None else "")

    differ = list(got["shape"]) != list(src.get("shape", got["shape"]))
    differ |= got.get("nnz") is not None and src.get("nnz") is not None and got["nnz"] != src["nnz"]
    if differ:
        raise ParameterError(f"{what} is not the data {fitted} was fitted on: it is {desc(got)}, that was "
                             f"{desc(src)}; give the same data, or leave out same_data")
    a, b = got.get("fingerprint"), src.get("fingerprint")
    scheme = a.split(":", 1)[0] if a else None
    if a and b and scheme == b.split(":", 1)[0]:
        if a != b:
            raise ParameterError(f"{what} is not the data {fitted} was fitted on: same shape and nonzeros "
                                 f"({desc(got)}) but {_FINGERPRINTS.get(scheme, 'its fingerprint')} differ; give "
                                 f"the same data, or leave out same_data")
        return
    why = (f"the selection was fitted on a {src.get('kind')} input, which has no content fingerprint" if not b
           else f"{what} is a {got.get('kind')} input and the selection was fitted on a {src.get('kind')} input"
           if a else f"{what} is a {got.get('kind')} input, which has no content fingerprint")
    warnings.warn(f"cannot compare the content of {what} with the data {fitted} was fitted on ({why}); only "
                  f"its shape and nonzeros were compared, and they agree", DufsWarning, stacklevel=3)


def load_selection(path: str | os.PathLike) -> Selection:
    """A selection file written by :meth:`Selection.to_json` (``dufs select -o``), with its sidecars.

    Parameters
    ----------
    path : str or path-like
        The JSON file; its ``.npy`` sidecars (every feature's score, long diagnostics) are read beside it and their
        crc32c checked.

    Returns
    -------
    Selection
        With ``indices``, the selected features' scores and ``transform``; ``scores`` is None (and a
        :class:`~dufs.errors.DufsWarning` says so) when the sidecar of scores is missing.
    """
    return Selection.from_json(os.fspath(path))
