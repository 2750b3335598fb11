"""Method parameters, declared once: each method module keeps a table of :class:`Param` beside its function (its
name, default, constraints and one line of meaning), and ``dufs.fit``'s validation, the scikit-learn estimators'
``_parameter_constraints`` and ``_method_params``, and the CLI's ``--param`` checking are derived from it.

Constraints are scikit-learn's (``Interval``, ``StrOptions``, ``None``, ``"no_validation"``, ...: the vocabulary of
``sklearn.utils._param_validation``), so every message has the same shape: "The 'lambda1' parameter of lapaofs
must be a float in the range [0, inf). Got -1 instead." Checks that need the data (a number of neighbours below
n_samples, k below n_features) stay in the functions.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from numbers import Integral, Real
from typing import Any

from sklearn.utils._param_validation import (
    Interval,
    InvalidParameterError,
    StrOptions,
    validate_parameter_constraints,
)

from dufs.errors import ParameterError

__all__ = ["GRAPH_PARAMS", "Interval", "Param", "ParamTable", "ParameterConstraintError", "StrOptions",
           "check_params", "integer", "nonnegative", "positive", "table"]


class ParameterConstraintError(ParameterError, InvalidParameterError):
    """A parameter outside its declared constraints: a dufs :class:`~dufs.errors.ParameterError` and, for
    scikit-learn's tools, its ``InvalidParameterError``."""


@dataclass(frozen=True)
class Param:
    """One parameter of a method.

    ``estimator``: whether the method's scikit-learn estimator takes it (False for what only ``dufs.fit`` and the
    functions take: checkpoint paths, precomputed graphs, callbacks)."""

    name: str
    default: Any
    constraints: tuple
    doc: str = ""
    estimator: bool = True


ParamTable = Mapping[str, Param]


def table(*params: Param | Iterable[Param]) -> dict[str, Param]:
    """A parameter table from :class:`Param` s and other tables' values (later entries replace earlier ones)."""
    out: dict[str, Param] = {}
    for p in params:
        for q in ([p] if isinstance(p, Param) else list(p)):
            out[q.name] = q
    return out


def constraints_of(params: ParamTable, *, estimator: bool = False) -> dict[str, list]:
    """``{name: [constraints]}`` for scikit-learn's validation (only the estimator's with ``estimator``)."""
    return {k: "no_validation" if p.constraints == ("no_validation",) else list(p.constraints)
            for k, p in params.items() if p.estimator or not estimator}


def check_params(params: ParamTable, values: Mapping[str, Any], caller: str) -> None:
    """Check ``values`` (name -> value) against the table: an unknown name, or a value outside its constraints, is
    a one-line :class:`ParameterConstraintError`. A bool is no number here (``True`` is no count)."""
    unknown = sorted(set(values) - set(params))
    if unknown:
        raise ParameterConstraintError(f"{caller} got parameters {unknown} that it does not take (it takes "
                                       f"{sorted(params) or 'none'})")
    for k, v in values.items():
        if isinstance(v, bool) and not any(c is bool or c == "boolean" for c in params[k].constraints):
            raise ParameterConstraintError(f"The {k!r} parameter of {caller} must not be a bool; got {v!r}.")
    try:
        validate_parameter_constraints(constraints_of(params), dict(values), caller_name=caller)
    except InvalidParameterError as exc:
        raise ParameterConstraintError(" ".join(str(exc).split())) from None


# constraints that recur
def positive() -> Interval:
    """A finite real > 0."""
    return Interval(Real, 0, float("inf"), closed="neither")


def nonnegative() -> Interval:
    """A finite real >= 0."""
    return Interval(Real, 0, float("inf"), closed="left")


def integer(low: int = 1, high: int | None = None) -> Interval:
    return Interval(Integral, low, high, closed="both" if high is not None else "left")


SEED = Param("random_state", 0, (integer(0),), "seed (k-means, anchors, orders)")

#: the sample graph of the graph-based methods (kNN, or an anchor graph for large n_samples), given as ``W`` or
#: built from the rest; ``n_neighbors`` differs by method (its own table sets it)
GRAPH_PARAMS = table(
    Param("W", None, ("no_validation",), "a precomputed n_samples x n_samples affinity or an AnchorGraph"),
    Param("graph", "auto", (StrOptions({"auto", "knn", "anchor"}),),
          "exact kNN, an anchor graph for large n_samples, or auto (kNN up to 50,000 samples)"),
    Param("weights", "binary", (StrOptions({"binary", "heat"}),), "kNN edge weights"),
    Param("t", None, (None, positive()), "heat kernel width (None: the mean squared kNN distance)"),
    Param("n_anchors", 256, (integer(1),), "anchors of the anchor graph"),
    Param("anchor_neighbors", 3, (integer(1),), "anchors each sample links to"),
    Param("embed_dim", 64, (integer(1),), "random-projection dimension of the anchor graph's k-means"),
    SEED,
)

#: per-step or per-round checkpoints (``dufs.fit`` and the functions only)
CHECKPOINT_PARAMS = table(
    Param("checkpoint", "auto", ("no_validation",),
          "a directory, 'auto' (beside a local store, else dufs.checkpoint.dir; removed after success) or None",
          estimator=False),
    Param("resume", False, ("boolean",), "continue from the checkpoint", estimator=False),
)
