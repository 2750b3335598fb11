"""The result of a feature selection: ``Selection`` (docs/architecture.md, "Results and evaluation")."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dufs.errors import ParameterError

FORMAT = "dufs.selection/1"


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
    """

    method: str
    indices: np.ndarray
    scores: np.ndarray | None
    n_features_in: int
    params: dict = field(default_factory=dict)
    diagnostics: dict = field(default_factory=dict)
    higher_is_better: bool = True

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

    # ---------------------------------------------------------------- persistence
    def to_dict(self) -> dict:
        return {
            "format": FORMAT, "method": self.method, "indices": self.indices.tolist(),
            "scores": None if self.scores is None else [_num(v) for v in self.scores.tolist()],
            "n_features_in": int(self.n_features_in), "params": _jsonable(self.params),
            "diagnostics": _jsonable(self.diagnostics), "higher_is_better": bool(self.higher_is_better),
        }

    def to_json(self, path: str | os.PathLike | None = None) -> str:
        """JSON text; with ``path``, also written there (to a temporary name, renamed when complete)."""
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
        s = os.fspath(text_or_path)
        if not s.lstrip().startswith("{"):
            with open(s) as f:
                s = f.read()
        d = json.loads(s)
        if d.get("format") != FORMAT:
            raise ParameterError(f"not a dufs selection (format {d.get('format')!r}; expected {FORMAT!r})")
        scores = d.get("scores")
        return cls(method=d["method"], indices=np.asarray(d["indices"], dtype=np.int64),
                   scores=None if scores is None else np.array([np.nan if v is None else v for v in scores]),
                   n_features_in=int(d["n_features_in"]), params=d.get("params") or {},
                   diagnostics=d.get("diagnostics") or {}, higher_is_better=bool(d.get("higher_is_better", True)))

    def plot(self, path: str | os.PathLike) -> str:
        """A PNG of the score distribution with the selected features marked. Returns the path."""
        from dufs.evaluate import plot_scores

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
