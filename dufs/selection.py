"""The result of a feature selection: ``Selection`` (docs/architecture.md, "Results and evaluation")."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dufs.errors import ParameterError

FORMAT = "dufs.selection/2"
#: the formats :meth:`Selection.from_json` reads: 1 wrote a non-finite score as null (read back as NaN); 2 writes
#: the strings "inf", "-inf" and "nan" and records the input's identity (``source``)
FORMATS = ("dufs.selection/1", FORMAT)
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
    scores : ndarray of float64 or None
        The method's own criterion for every feature (NaN where undefined); larger is better unless
        ``higher_is_better`` is False (e.g. the Laplacian score).
    n_features_in : int
        Number of features of the data it was fitted on.
    params : dict
        The parameters it was run with.
    diagnostics : dict
        Iterations, duality gap or objective trace, passes over the data, wall time per phase, cluster size.
    higher_is_better : bool
    source : dict or None
        What identifies the input it was fitted on (:func:`dufs.engine.matrix.input_identity`): ``kind``
        ("store", "memory" or "dask"), ``shape``, ``nnz``, ``dtype``, ``fingerprint`` (of a store: its metadata;
        of in-memory input: SHA-256 of the matrix; none for a Dask array: shape and chunks only) and
        ``fingerprint_of``, the ``path`` of a store, and, for a store with feature ids, their digest
        (``feature_ids``) and the ids of the selected features (``selected_feature_ids``). None when unknown (a
        selection made by hand or read from an older file). :meth:`check_input` compares an input with it.
    """

    method: str
    indices: np.ndarray
    scores: np.ndarray | None
    n_features_in: int
    params: dict = field(default_factory=dict)
    diagnostics: dict = field(default_factory=dict)
    higher_is_better: bool = True
    source: dict | None = None

    def __post_init__(self) -> None:
        self.indices = np.asarray(self.indices, dtype=np.int64).ravel()
        if self.indices.size and (self.indices.min() < 0 or self.indices.max() >= self.n_features_in):
            raise ParameterError(f"selected indices must lie in [0, {self.n_features_in}); got "
                                 f"[{self.indices.min()}, {self.indices.max()}]")
        if np.unique(self.indices).size != self.indices.size:
            raise ParameterError("selected indices must be distinct")
        if self.scores is not None:
            self.scores = np.asarray(self.scores, dtype=np.float64).ravel()
            if self.scores.shape[0] != self.n_features_in:
                raise ParameterError(f"scores has {self.scores.shape[0]} entries for {self.n_features_in} features")

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
        """The selected columns of ``X`` (NumPy, SciPy sparse, pydata sparse or Dask), in ranking order."""
        n = X.shape[1]
        if n != self.n_features_in:
            raise ParameterError(f"X has {n} features; this selection was fitted on {self.n_features_in}")
        if hasattr(X, "tocsc") and hasattr(X, "indptr"):  # SciPy compressed: slice in its best orientation
            return X.tocsc()[:, self.indices]
        return X[:, self.indices]

    # ---------------------------------------------------------------- the input
    def check_input(self, X: Any, *, same_data: bool = False, name: str | None = None) -> dict:
        """Check that ``X`` can be used with this selection; return ``X``'s identity
        (:func:`dufs.engine.matrix.input_identity`).

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
        Dask array or read from a format-1 file; or one is of a store and the other of in-memory data), only the
        shape and nonzeros are compared, with a :class:`~dufs.errors.DufsWarning` saying so.

        ``name`` is what the messages call ``X`` (default: the store's path, else "X").
        """
        from dufs.engine import input_identity

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
    def to_dict(self) -> dict:
        return {
            "format": FORMAT, "method": self.method, "indices": self.indices.tolist(),
            "scores": None if self.scores is None else [_score_out(v) for v in self.scores.tolist()],
            "n_features_in": int(self.n_features_in), "params": _jsonable(self.params),
            "diagnostics": _jsonable(self.diagnostics), "higher_is_better": bool(self.higher_is_better),
            "source": _jsonable(self.source),
        }

    def to_json(self, path: str | os.PathLike | None = None) -> str:
        """Strict JSON text (``allow_nan=False``); with ``path``, also written there (to a temporary name, renamed
        when complete). Non-finite scores are written as the strings "inf", "-inf" and "nan", so
        :meth:`from_json` gives back bit-identical scores; other non-finite numbers (in ``params`` and
        ``diagnostics``) become null."""
        text = json.dumps(self.to_dict(), allow_nan=False)
        if path is not None:
            path = os.fspath(path)
            tmp = f"{path}.tmp-{os.getpid()}"
            with open(tmp, "w") as f:
                f.write(text)
            os.replace(tmp, path)
        return text

    @classmethod
    def from_json(cls, text_or_path: str | os.PathLike) -> Selection:
        """A selection from :meth:`to_json`'s text or file (formats ``dufs.selection/1`` and ``/2``)."""
        s = os.fspath(text_or_path)
        if not s.lstrip().startswith("{"):
            with open(s) as f:
                s = f.read()
        d = json.loads(s)
        if not isinstance(d, dict) or d.get("format") not in FORMATS:
            got = d.get("format") if isinstance(d, dict) else type(d).__name__
            raise ParameterError(f"not a dufs selection (format {got!r}; expected one of {list(FORMATS)})")
        scores = d.get("scores")
        return cls(method=d["method"], indices=np.asarray(d["indices"], dtype=np.int64),
                   scores=None if scores is None else np.array([_score_in(v) for v in scores], dtype=np.float64),
                   n_features_in=int(d["n_features_in"]), params=d.get("params") or {},
                   diagnostics=d.get("diagnostics") or {}, higher_is_better=bool(d.get("higher_is_better", True)),
                   source=d.get("source"))

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

    def __repr__(self) -> str:
        head = ", ".join(str(i) for i in self.indices[:8]) + (", ..." if self.n_selected > 8 else "")
        return f"Selection(method={self.method!r}, n_selected={self.n_selected}, indices=[{head}])"


def _num(v: float) -> float | None:
    return None if (isinstance(v, float) and not math.isfinite(v)) else v


def _score_out(v: float) -> float | str:
    """A score as JSON: the number, or "inf", "-inf", "nan"."""
    if math.isfinite(v):
        return v
    return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")


def _score_in(v: Any) -> float:
    """A score from JSON: a number, one of "inf", "-inf", "nan", or null (format 1's NaN or infinity: NaN)."""
    if v is None:
        return math.nan
    if isinstance(v, str):
        if v not in _NONFINITE:
            raise ParameterError(f"not a dufs selection: a score is the string {v!r} (expected a number, 'inf', "
                                 f"'-inf' or 'nan')")
        return float(_NONFINITE[v])
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


def _jsonable(obj: Any) -> Any:
    """Plain JSON values: arrays to lists, numpy scalars to numbers, non-finite floats to None."""
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if hasattr(obj, "tolist"):
        return _jsonable(obj.tolist())
    if isinstance(obj, float):
        return _num(obj)
    if obj is None or isinstance(obj, (str, int, bool)):
        return obj
    return str(obj)
