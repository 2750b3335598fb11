"""The methods ``dufs.fit`` runs, one :class:`MethodSpec` each: its entry (``run``), its parameter table (declared
beside the method, see :mod:`dufs.methods.params`), which way its scores go, whether it needs labels, its default
``standardize`` and the passes a filter makes. Every entry takes ``(M, y, *, n_features, **params)`` and returns
the same :class:`MethodResult`, so ``dufs.fit`` treats every method alike."""

from __future__ import annotations

import importlib.util
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dufs.errors import ParameterError
from dufs.methods import NAMES, filters
from dufs.methods.graph import resolve_clusters
from dufs.methods.greedy import LAPOFS_PARAMS
from dufs.methods.jcfs import JCFS_PARAMS
from dufs.methods.m3fs import M3FS_PARAMS
from dufs.methods.mmfs import MMFS_PARAMS
from dufs.methods.params import ParamTable
from dufs.methods.qpfs import QPFS_PARAMS
from dufs.methods.ufcm import UFCM_PARAMS

__all__ = ["METHODS", "MethodResult", "MethodSpec", "rank"]


@dataclass
class MethodResult:
    """What every method returns to ``dufs.fit``: a score per feature (NaN where the method gives none), the
    ranking of the features (at least the best ``n_features``, best first; None: by the scores), its diagnostics,
    and whether the ranking is the scores' order (``by_scores``: equal scores then leave the choice to the
    feature index)."""

    scores: np.ndarray
    ranking: np.ndarray | None = None
    diagnostics: dict = field(default_factory=dict)
    by_scores: bool = True


@dataclass(frozen=True)
class MethodSpec:
    """How ``dufs.fit`` runs a method (see the module docstring)."""

    name: str
    run: Callable[..., MethodResult]
    params: ParamTable
    higher_is_better: bool
    supervised: bool
    standardize: str | None
    passes: int = 0


def rank(scores: np.ndarray, higher_is_better: bool = True, k: int | None = None) -> np.ndarray:
    """Feature indices best first; NaN scores last; ties broken by the lower index. ``k``: only the first ``k``
    of that order, in memory bounded by slices of the scores (:func:`dufs.engine.blocks.ranked_head`)."""
    if k is not None and k < np.asarray(scores).size:
        from dufs.engine import ranked_head

        return ranked_head(scores, k, higher_is_better)
    s = np.asarray(scores, dtype=np.float64)
    key = -s if higher_is_better else s
    key = np.where(np.isnan(key), np.inf, key)
    return np.argsort(key, kind="stable")


# ---------------------------------------------------------------------------------------------------- entries
def _variance(M: Any, y: Any, *, n_features: int) -> MethodResult:
    return MethodResult(*filters.variance_ranked(M, n_features))


def _correlation(M: Any, y: Any, *, n_features: int) -> MethodResult:
    return MethodResult(*filters.correlation_ranked(M, y, n_features))


def _fisher(M: Any, y: Any, *, n_features: int) -> MethodResult:
    return MethodResult(*filters.fisher_ranked(M, y, n_features))


def _laplacian(M: Any, y: Any, *, n_features: int, **p: Any) -> MethodResult:
    return MethodResult(*filters.laplacian_ranked(M, **p, k=n_features))


def _mmfs(M: Any, y: Any, *, n_features: int, kernel: str = "linear", rbf_gamma: Any = None,
          max_features: Any = None, **p: Any) -> MethodResult:
    if "relevance" in p:
        p["relevance_kind"] = p.pop("relevance")
    if kernel == "linear":
        from dufs.methods.mmfs import mmfs

        if rbf_gamma is not None or max_features is not None:
            raise ParameterError("the 'rbf_gamma' and 'max_features' parameters of mmfs are for kernel='poly2' or "
                                 "'rbf'")
        res = mmfs(M, y, n_features=n_features, **p)
    else:
        from dufs.methods.mmfs.nonlinear import mmfs_kernel

        if p.get("n_partitions", "auto") == "auto":
            p.pop("n_partitions", None)
        extra = set(p) & {"checkpoint", "checkpoint_every", "resume", "n_partitions"}
        if extra:
            raise ParameterError(f"mmfs with kernel={kernel!r} takes no {sorted(extra)} (checkpoints are for the "
                                 f"linear kernel)")
        res = mmfs_kernel(M, y, kernel=kernel, n_features=n_features, rbf_gamma=rbf_gamma, max_features=max_features,
                          **p)
    d = dict(res.diagnostics)
    d.setdefault("kernel", kernel)
    return MethodResult(res.alpha, res.ranking(), d, by_scores=False)


def _qpfs(M: Any, y: Any, *, n_features: int, **p: Any) -> MethodResult:
    from dufs.methods.qpfs import qpfs

    if "relevance" in p:
        p["relevance_kind"] = p.pop("relevance")
    res = qpfs(M, y, **p)
    return MethodResult(res.x, res.ranking(), dict(res.diagnostics), by_scores=False)


def _greedy_result(res: Any, d: int) -> MethodResult:
    """A greedy selection: the chosen features' criterion as their scores (NaN for the rest), the order of choice."""
    scores = np.full(d, np.nan)
    scores[res.indices] = res.criterion
    diag = dict(res.diagnostics)
    diag.update(criterion=res.criterion.tolist(), objective=res.objective.tolist())
    return MethodResult(scores, res.indices, diag, by_scores=False)


def _lapofs(criterion: str) -> Callable[..., MethodResult]:
    def run(M: Any, y: Any, *, n_features: int, **p: Any) -> MethodResult:
        from dufs.methods.greedy import lapofs

        return _greedy_result(lapofs(M, n_features=n_features, criterion=criterion, **p), M.shape[1])

    return run


def _jcfs(M: Any, y: Any, *, n_features: int, n_clusters: Any = JCFS_PARAMS["n_clusters"].default,
          **p: Any) -> MethodResult:
    from dufs.methods.jcfs import jcfs

    n_clusters, est = resolve_clusters(M, n_clusters)
    res = _greedy_result(jcfs(M, n_features=n_features, n_clusters=n_clusters, **p), M.shape[1])
    return _with_estimate(res, n_clusters, est)


def _with_estimate(res: MethodResult, n_clusters: int, est: dict | None) -> MethodResult:
    """``res`` with the cluster count it ran with and, for ``n_clusters="auto"``, what the estimate rests on."""
    diag = dict(res.diagnostics)
    diag["n_clusters"] = int(n_clusters)
    if est is not None:
        diag["n_clusters_estimate"] = est
    return MethodResult(res.scores, res.ranking, diag, by_scores=res.by_scores)


def _ufcm(M: Any, y: Any, *, n_features: int, n_clusters: Any = UFCM_PARAMS["n_clusters"].default,
          n_components: Any = None, **p: Any) -> MethodResult:
    from dufs.methods.ufcm import ufcm

    n_clusters, est = resolve_clusters(M, n_clusters)
    if n_components is None:  # d' = the number of clusters, at most n_features - 1
        n_components = min(int(n_clusters), max(1, M.shape[1] - 1)) if isinstance(n_clusters, int | np.integer) \
            else n_clusters
    res = ufcm(M, n_clusters=n_clusters, n_components=n_components, keep_w=False, **p)
    diag = dict(res.diagnostics)
    diag.update(objective=np.asarray(res.objective).tolist(), labels=res.labels)
    return _with_estimate(MethodResult(res.scores, None, diag), n_clusters, est)


M3FS_FAITHFUL_MAX = (5000, 1000)  # solver="auto": the faithful (SOCP) path up to this many samples and features


def has_cvxpy() -> bool:
    """Whether the faithful M3FS solver's conic solvers (``dufs[m3fs]``: cvxpy, Clarabel) are installed."""
    return all(importlib.util.find_spec(m) is not None for m in ("cvxpy", "clarabel"))


def _m3fs(M: Any, y: Any, *, n_features: int, solver: str = "auto",
          n_clusters: Any = M3FS_PARAMS["n_clusters"].default, **p: Any) -> MethodResult:
    n, d = M.shape
    n_clusters, est = resolve_clusters(M, n_clusters)
    if solver == "auto":
        small = n <= M3FS_FAITHFUL_MAX[0] and d <= M3FS_FAITHFUL_MAX[1]
        solver = "faithful" if small and has_cvxpy() else "alternating"
    if solver == "faithful":
        from dufs.methods.m3fs.faithful import m3fs_faithful as run
    else:
        from dufs.methods.m3fs.alternating import m3fs_alternating as run
    p = {k: v for k, v in p.items() if not (v is None and M3FS_PARAMS[k].default is None)}  # None: the solver's
    accepted = inspect.signature(run).parameters
    wrong = sorted(k for k in p if k not in accepted)
    if wrong:
        raise ParameterError(f"The parameter(s) {', '.join(map(repr, wrong))} do not apply to the {solver} M3FS "
                             f"solver (solver={solver!r}; 'auto' picks faithful up to {M3FS_FAITHFUL_MAX[0]} "
                             f"samples x {M3FS_FAITHFUL_MAX[1]} features).")
    res = run(M.dense_columns(np.arange(d)) if solver == "faithful" else M, n_features=n_features,
              n_clusters=n_clusters, **p)
    diag = dict(res.diagnostics)
    diag.update(solver=solver, labels=np.asarray(res.labels, dtype=np.int64))
    # the solver's own defaults of the parameters left at None, for the selection's record (dufs.fit takes it out)
    diag["solver_defaults"] = {k: v.default for k, v in accepted.items()
                               if k in M3FS_PARAMS and k not in p and v.default is not inspect.Parameter.empty}
    sigma = np.asarray(res.sigma, dtype=np.float64)
    head = np.asarray(res.selected, dtype=np.int64)
    if head.size < n_features:  # the ranking holds at least the best n_features (by sigma after the selected)
        rest = np.setdiff1d(rank(sigma, True, k=n_features + head.size), head, assume_unique=True)
        head = np.concatenate([head, rest])[:n_features]
    return _with_estimate(MethodResult(sigma, head, diag, by_scores=False), n_clusters, est)


METHODS: dict[str, MethodSpec] = {s.name: s for s in (
    MethodSpec("variance", _variance, filters.VARIANCE_PARAMS, True, False, None, 1),
    MethodSpec("correlation", _correlation, filters.CORRELATION_PARAMS, True, True, "zscore", 1),
    MethodSpec("fisher", _fisher, filters.FISHER_PARAMS, True, True, None, 1),
    MethodSpec("laplacian", _laplacian, filters.LAPLACIAN_PARAMS, False, False, None, 2),
    MethodSpec("mmfs", _mmfs, MMFS_PARAMS, True, True, "zscore"),
    MethodSpec("qpfs", _qpfs, QPFS_PARAMS, True, True, "zscore"),
    MethodSpec("lapaofs", _lapofs("A"), {k: p for k, p in LAPOFS_PARAMS.items() if k != "criterion"}, True, False,
               None),
    MethodSpec("lapdofs", _lapofs("D"), {k: p for k, p in LAPOFS_PARAMS.items() if k != "criterion"}, True, False,
               None),
    MethodSpec("jcfs", _jcfs, JCFS_PARAMS, True, False, "zscore"),
    MethodSpec("ufcm", _ufcm, UFCM_PARAMS, True, False, "auto"),
    MethodSpec("m3fs", _m3fs, M3FS_PARAMS, True, False, "zscore"),
)}
if tuple(METHODS) != NAMES:  # the light list the CLI names them by
    raise ImportError(f"dufs.methods.NAMES {NAMES} is not the registry's {tuple(METHODS)}")
