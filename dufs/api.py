"""The functional API: ``dufs.fit(X, y, method=..., n_features=...) -> Selection``."""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from dufs._logging import get_logger, timer
from dufs.engine.cluster import active_client, get_client
from dufs.engine.matrix import as_matrix
from dufs.errors import DufsWarning, ParameterError
from dufs.methods import filters
from dufs.selection import Selection

log = get_logger(__name__)


@dataclass(frozen=True)
class MethodSpec:
    """How to run a method: its score function, whether larger scores are better, whether it needs labels,
    its default ``standardize`` and the passes over the data it makes."""

    name: str
    score: Callable[..., np.ndarray]
    higher_is_better: bool
    supervised: bool
    standardize: str | None
    passes: int


METHODS: dict[str, MethodSpec] = {
    "variance": MethodSpec("variance", lambda M, y, **p: filters.variance_scores(M), True, False, None, 1),
    "correlation": MethodSpec("correlation", lambda M, y, **p: filters.correlation_scores(M, y), True, True,
                              "zscore", 2),
    "fisher": MethodSpec("fisher", lambda M, y, **p: filters.fisher_scores(M, y), True, True, None, 1),
    "laplacian": MethodSpec("laplacian", lambda M, y, **p: filters.laplacian_scores(M, **p), False, False, None, 2),
}
def _mmfs(M: Any, y: Any, *, n_features: int, kernel: str = "linear", rbf_gamma: Any = None,
          max_features: Any = None, **p: Any) -> tuple[np.ndarray, np.ndarray, dict]:
    if "relevance" in p:
        p["relevance_kind"] = p.pop("relevance")
    if kernel == "linear":
        from dufs.methods.mmfs import mmfs

        if rbf_gamma is not None or max_features is not None:
            raise ParameterError("the 'rbf_gamma' and 'max_features' parameters of mmfs are for kernel='poly2' or "
                                 "'rbf'")
        res = mmfs(M, y, n_features=n_features, **p)
    elif kernel in ("poly2", "rbf"):
        from dufs.methods.mmfs_kernel import mmfs_kernel

        if p.get("n_partitions", "auto") == "auto":
            p.pop("n_partitions", None)
        extra = set(p) & {"checkpoint", "checkpoint_every", "resume", "n_partitions"}
        if extra:
            raise ParameterError(f"mmfs with kernel={kernel!r} takes no {sorted(extra)} (checkpoints are for the "
                                 f"linear kernel)")
        res = mmfs_kernel(M, y, kernel=kernel, n_features=n_features, rbf_gamma=rbf_gamma, max_features=max_features,
                          **p)
    else:
        raise ParameterError(f"The 'kernel' parameter of mmfs must be 'linear', 'poly2' or 'rbf'; got {kernel!r}.")
    d = dict(res.diagnostics)
    d.setdefault("kernel", kernel)
    return res.alpha, res.ranking(), d


def _qpfs(M: Any, y: Any, *, n_features: int, **p: Any) -> tuple[np.ndarray, np.ndarray, dict]:
    from dufs.methods.qpfs import qpfs

    if "relevance" in p:
        p["relevance_kind"] = p.pop("relevance")
    res = qpfs(M, y, **p)
    return res.x, res.ranking(), dict(res.diagnostics)


def _greedy_out(res: Any, d: int) -> tuple[np.ndarray, np.ndarray, dict]:
    scores = np.full(d, np.nan)
    scores[res.indices] = res.criterion
    diag = dict(res.diagnostics)
    diag.update(criterion=res.criterion.tolist(), objective=res.objective.tolist())
    return scores, res.indices, diag


def _lapofs(criterion: str) -> Callable[..., tuple[np.ndarray, np.ndarray, dict]]:
    def run(M: Any, y: Any, *, n_features: int, **p: Any) -> tuple[np.ndarray, np.ndarray, dict]:
        from dufs.methods.greedy import lapofs

        return _greedy_out(lapofs(M, n_features=n_features, criterion=criterion, **p), M.shape[1])

    return run


N_CLUSTERS = 2  # the default number of clusters of jcfs, ufcm and m3fs, in fit as in the estimators


def _jcfs(M: Any, y: Any, *, n_features: int, n_clusters: Any = N_CLUSTERS, **p: Any) -> tuple[np.ndarray,
                                                                                                np.ndarray, dict]:
    from dufs.methods.greedy import jcfs

    return _greedy_out(jcfs(M, n_features=n_features, n_clusters=n_clusters, **p), M.shape[1])


def _ufcm(M: Any, y: Any, *, n_clusters: Any = N_CLUSTERS, n_components: Any = None, **p: Any) -> tuple[
        np.ndarray, None, dict]:
    from dufs.methods.ufcm import ufcm

    if n_components is None:  # d' = the number of clusters, at most n_features - 1
        n_components = min(int(n_clusters), max(1, M.shape[1] - 1)) if isinstance(n_clusters, int | np.integer) \
            else n_clusters
    res = ufcm(M, n_clusters=n_clusters, n_components=n_components, **p)
    diag = dict(res.diagnostics)
    diag.update(objective=np.asarray(res.objective).tolist(), labels=np.asarray(res.labels).tolist())
    return res.scores, None, diag


_M3FS_FAITHFUL_MAX = (5000, 1000)  # solver="auto": the faithful (SOCP) path up to this many samples and features


def _has_cvxpy() -> bool:
    """Whether the faithful M3FS solver's conic solvers (``dufs[m3fs]``: cvxpy, Clarabel) are installed."""
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in ("cvxpy", "clarabel"))


def _m3fs(M: Any, y: Any, *, n_features: int, solver: str = "auto", n_clusters: Any = N_CLUSTERS,
          **p: Any) -> tuple[np.ndarray, np.ndarray, dict]:
    n, d = M.shape
    if solver not in ("auto", "faithful", "alternating"):
        raise ParameterError(f"The 'solver' parameter of m3fs must be 'auto', 'faithful' or 'alternating'; "
                             f"got {solver!r}.")
    if solver == "auto":
        small = n <= _M3FS_FAITHFUL_MAX[0] and d <= _M3FS_FAITHFUL_MAX[1]
        solver = "faithful" if small and _has_cvxpy() else "alternating"
    if solver == "faithful":
        from dufs.methods.m3fs import m3fs_faithful as run
    else:
        from dufs.methods.m3fs_scalable import m3fs_alternating as run
    import inspect

    accepted = inspect.signature(run).parameters
    wrong = sorted(k for k in p if k not in accepted)
    if wrong:
        raise ParameterError(f"The parameter(s) {', '.join(map(repr, wrong))} do not apply to the {solver} M3FS "
                             f"solver (solver={solver!r}; 'auto' picks faithful up to {_M3FS_FAITHFUL_MAX[0]} "
                             f"samples x {_M3FS_FAITHFUL_MAX[1]} features).")
    res = run(M.dense_columns(np.arange(d)) if solver == "faithful" else M, n_features=n_features,
              n_clusters=n_clusters, **p)
    diag = dict(res.diagnostics)
    diag.update(solver=solver, labels=np.asarray(res.labels).tolist())
    sigma = np.asarray(res.sigma, dtype=np.float64)
    head = np.asarray(res.selected, dtype=np.int64)
    rest = np.setdiff1d(rank(sigma, True), head, assume_unique=True)
    return sigma, np.concatenate([head, rest]), diag


METHODS["mmfs"] = MethodSpec("mmfs", _mmfs, True, True, "zscore", 0)
METHODS["qpfs"] = MethodSpec("qpfs", _qpfs, True, True, "zscore", 0)
METHODS["lapaofs"] = MethodSpec("lapaofs", _lapofs("A"), True, False, None, 0)
METHODS["lapdofs"] = MethodSpec("lapdofs", _lapofs("D"), True, False, None, 0)
METHODS["jcfs"] = MethodSpec("jcfs", _jcfs, True, False, "zscore", 0)
METHODS["ufcm"] = MethodSpec("ufcm", _ufcm, True, False, None, 0)
METHODS["m3fs"] = MethodSpec("m3fs", _m3fs, True, False, "zscore", 0)
_RANKED = {"mmfs", "qpfs", "lapaofs", "lapdofs", "jcfs", "m3fs"}  # methods that rank the features themselves
_GREEDY = {"lambda1", "lambda2", "W", "graph", "n_neighbors", "weights", "t", "n_anchors", "anchor_neighbors",
           "embed_dim", "random_state", "checkpoint", "checkpoint_every", "resume"}
_PARAMS = {"mmfs": {"C", "theta", "gamma", "relevance", "tol", "max_epochs", "random_state", "checkpoint",
                    "checkpoint_every", "resume", "n_partitions", "kernel", "rbf_gamma", "max_features"},
           "qpfs": {"alpha_mix", "kernel", "relevance", "tol", "max_epochs", "rbf_gamma", "max_features"},
           "lapaofs": _GREEDY, "lapdofs": _GREEDY,
           "jcfs": {"n_clusters", "lambda_", "gamma", "W", "graph", "n_neighbors", "weights", "t", "n_anchors",
                    "anchor_neighbors", "embed_dim", "max_iter", "random_state", "dense_below", "select_gamma"},
           "m3fs": {"solver", "C", "lambda_", "l", "epsilon", "n_clusters", "graph", "n_neighbors", "sigma_width", "L",
                    "W", "max_cutting_planes", "max_cccp", "random_state", "weights", "n_anchors", "anchor_neighbors",
                    "embed_dim", "max_iter", "tol", "alternations", "init", "dense_below", "polish"},
           "ufcm": {"n_clusters", "n_components", "alpha", "beta", "p", "max_iter", "n_init", "tol", "random_state",
                    "dense_below"},
           "laplacian": {"n_neighbors", "weights", "t", "W", "graph", "n_anchors", "anchor_neighbors", "embed_dim",
                          "random_state"}}


def check_method(method: Any, params: dict | None = None) -> MethodSpec:
    """The :class:`MethodSpec` of ``method``, after checking that it exists and takes every name in ``params``;
    a :class:`ParameterError` otherwise. Cheap (no data read): the CLI calls it before starting a cluster."""
    if not isinstance(method, str) or method not in METHODS:
        raise ParameterError(f"The 'method' parameter of fit must be one of {sorted(METHODS)}; got {method!r}.")
    extra = set(params or ()) - _PARAMS.get(method, set())
    if extra:
        raise ParameterError(f"fit got parameters {sorted(extra)} that method {method!r} does not take "
                             f"(it takes {sorted(_PARAMS.get(method, set())) or 'none'})")
    return METHODS[method]


def rank(scores: np.ndarray, higher_is_better: bool = True) -> np.ndarray:
    """Feature indices best first; NaN scores last; ties broken by the lower index."""
    s = np.asarray(scores, dtype=np.float64)
    key = -s if higher_is_better else s
    key = np.where(np.isnan(key), np.inf, key)
    return np.argsort(key, kind="stable")


def check_n_features(n_features: Any, n_total: int, method: str) -> int:
    """``n_features`` as an int in [1, n_total]: ``"all"`` is every feature; more than ``n_total`` warns and keeps
    them all, as scikit-learn's ``SelectKBest`` does; anything but a positive int (a bool included) is an error."""
    if isinstance(n_features, str) and n_features == "all":
        return n_total
    if isinstance(n_features, bool) or not isinstance(n_features, int | np.integer) or n_features < 1:
        raise ParameterError(f"The 'n_features' parameter of {method} must be an int >= 1 or 'all'; "
                             f"got {n_features!r}.")
    if n_features > n_total:
        warnings.warn(f"n_features={int(n_features)} is greater than the {n_total} features of the input: all "
                      f"{n_total} are selected.", DufsWarning, stacklevel=3)
        return n_total
    return int(n_features)


# what to change when a method's result is degenerate (see _degenerate)
_FIX = {"mmfs": "raise C, or give a smaller fixed gamma (the bias weight)",
        "qpfs": "change alpha_mix or the relevance",
        "m3fs": "lower lambda_ (the manifold weight), raise C, or try solver='alternating'",
        "ufcm": "lower alpha (the within-cluster weight), or check n_clusters",
        "jcfs": "lower lambda_ or raise gamma",
        "lapaofs": "lower lambda1 (the graph weight) or check the graph (n_neighbors)",
        "lapdofs": "lower lambda1 (the graph weight) or check the graph (n_neighbors)",
        "laplacian": "check the graph (n_neighbors, weights) or the standardize setting",
        "variance": "the input looks standardised already: give the raw (unscaled) data",
        "correlation": "check the labels", "fisher": "check the labels"}


def _degenerate(method: str, scores: Any, order: Any, diag: dict, params: dict) -> str | None:
    """What makes a result meaningless, or None: every score NaN, every score equal (the ranking is then by index
    alone), no feature in MMFS's support, every sample in one cluster (unless one was asked for)."""
    fix = _FIX.get(method, "change its parameters")
    labels = diag.get("labels")
    if labels is not None and len(labels) > 1 and np.unique(np.asarray(labels)).size < 2 \
            and params.get("n_clusters", N_CLUSTERS) != 1:
        return f"{method}: every sample fell in one cluster, so the selection says nothing about clusters; {fix}"
    if method == "mmfs" and diag.get("support", 1) == 0:
        return f"mmfs: no feature entered the support (every alpha is 0); the ranking is the dual gradient's; {fix}"
    if order is None and scores is not None:
        s = np.asarray(scores, dtype=np.float64)
        fin = s[np.isfinite(s)]
        if s.size > 1 and fin.size == 0:
            return f"{method}: no feature has a finite score, so the ranking is by feature index alone; {fix}"
        if fin.size > 1 and fin.size == s.size and np.ptp(fin) <= 1e-12 * max(1.0, float(np.abs(fin).max())):
            return (f"{method}: every feature has the same score ({fin[0]:.6g}), so the ranking is by feature "
                    f"index alone; {fix}")
    return None


def _is_dask(X: Any) -> bool:
    return type(X).__module__.startswith("dask")


def fit(X: Any, y: Any = None, *, method: str, n_features: int, client: Any = None,
        standardize: str | None | type = ..., verbose: int | bool = False, **params: Any) -> Selection:
    """Select ``n_features`` features of ``X`` with ``method``.

    Parameters
    ----------
    X : NumPy array, SciPy sparse, pydata sparse, Dask array (dense or sparse chunks), a SparseStore or a store path
        A Dask array's column chunks become the feature blocks (computed and persisted on the workers).
    y : array-like, optional
        Labels (supervised methods); a store's own labels are used by default. Classes may be numbers, strings or
        booleans (the Fisher score, MMFS and QPFS need classes and refuse a continuous target; the correlation
        filter takes |Pearson| on a binary or continuous target and the correlation ratio on more classes). Ignored
        by the unsupervised methods.
    method : {"variance", "correlation", "fisher", "laplacian", "mmfs", "qpfs", "lapaofs", "lapdofs", "jcfs",
              "ufcm", "m3fs"}
    n_features : int or "all"
        How many features to select, at least 1; more than X has (or ``"all"``) selects all of them, with a
        :class:`~dufs.errors.DufsWarning` when more were asked for (as scikit-learn's ``SelectKBest``).
    client : distributed.Client or False, optional
        Default: the active client; else, for stores and Dask arrays, an embedded LocalCluster of processes;
        small in-memory inputs run synchronously without a cluster. ``False``: no cluster, run in this process
        (local threads for stores and Dask arrays).
    standardize : {"zscore", "scale", None}
        The implicit transform; the default is the method's (``dufs.api.METHODS[method].standardize``).
    **params
        Method parameters (e.g. ``n_neighbors`` for the Laplacian score). ``n_clusters`` defaults to 2 for the
        clustering methods (``jcfs``, ``ufcm``, ``m3fs``), as in their estimators.

    Returns
    -------
    Selection
        Its ``source`` identifies the input (shape, nnz, a content fingerprint; the path of a store):
        :meth:`Selection.check_input` compares another input with it. A result the method itself marks as
        degenerate (every sample in one cluster, every score equal or NaN, an empty MMFS support) comes with a
        :class:`~dufs.errors.DufsWarning` naming the parameter to change, and ``diagnostics["degenerate"]`` says
        what happened.

    Raises
    ------
    ParameterError
        On a bad method, parameter or ``n_features``; on a NaN or infinite value in X (naming its first row and
        feature) or in y (naming its row), in any input kind: dufs does not impute.
    """
    from dufs._logging import set_verbosity

    if verbose:
        set_verbosity(verbose)
    spec = check_method(method, params)
    std = spec.standardize if standardize is ... else standardize
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    in_memory = not (_is_dask(X) or isinstance(X, (str, os.PathLike)) or type(X).__name__ == "SparseStore")
    local = client is False  # run in this process, no cluster: synchronous for in-memory input, else threads
    sync = local or (client is None and active_client() is None and in_memory)
    with get_client(None if local else client, synchronous=sync) as c:
        import dask

        ctx = c.as_current() if c is not None else dask.config.set(scheduler="sync" if in_memory else "threads")
        with ctx:
            with timer("load", timings, log):
                if not spec.supervised:
                    y = None  # ignored: not read, not checked (a store's own labels are read as before)
                elif _is_dask(y):
                    y = np.asarray(y.compute())
                M = as_matrix(X, standardize=std, y=y, persist=c is not None)
                source = dict(M.identity)
            n_total = M.shape[1]
            n_features = check_n_features(n_features, n_total, method)
            if spec.supervised and M.y is None:
                raise ParameterError(f"method {method!r} is supervised: give labels y (or a store with labels)")
            with timer("score", timings, log):
                extra = {"n_features": int(n_features)} if method in _RANKED else {}
                got = spec.score(M, M.y, **params, **extra)
                scores, order, method_diag = got if isinstance(got, tuple) else (got, None, {})
            n_workers = len(c.scheduler_info(n_workers=-1).get("workers", {})) if c is not None else 0
            passes = M.passes
            if source.get("nnz") is None and all(b.nnz >= 0 for b in M.blocks):  # a Dask array's, once counted
                source["nnz"] = int(sum(b.nnz for b in M.blocks))
            feature_ids = M.feature_ids
            M.release()
    problem = _degenerate(method, scores, order, method_diag, params)
    if problem is not None:
        method_diag["degenerate"] = problem
        warnings.warn(problem, DufsWarning, stacklevel=2)
    if order is None:
        order = rank(scores, spec.higher_is_better)
    sel = order[:n_features]
    if feature_ids is not None:  # the ids of the selected features, so that another input's can be compared
        source["selected_feature_ids"] = np.asarray(feature_ids)[sel].tolist()
    diagnostics = {"passes": passes, "timings": timings, "wall_time": time.perf_counter() - t0,
                   "n_workers": n_workers, "n_blocks": M.n_blocks, "standardize": std,
                   "blocks": {k: v for k, v in M.residency.items() if v is not None}, **method_diag}
    return Selection(method=method, indices=sel, scores=scores, n_features_in=n_total,
                     params={"n_features": int(n_features), "standardize": std,
                             **{k: v for k, v in params.items() if k != "W"}},
                     diagnostics=diagnostics, higher_is_better=spec.higher_is_better, source=source)
