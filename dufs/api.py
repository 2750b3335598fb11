"""The functional API: ``dufs.fit(X, y, method=..., n_features=...) -> Selection``."""

from __future__ import annotations

import contextlib
import os
import time
import warnings
from typing import Any

import numpy as np

from dufs._logging import get_logger, timer
from dufs.engine import as_matrix, graph_built
from dufs.engine.cluster import get_client
from dufs.engine.dispatch import scope
from dufs.engine.progress import notebook_bar, on_pass
from dufs.errors import DufsError, DufsWarning, ParameterError
from dufs.methods.params import check_params
from dufs.methods.registry import METHODS, MethodResult, MethodSpec, rank
from dufs.scheduling import distributed_client
from dufs.selection import Selection

log = get_logger(__name__)


N_CLUSTERS = "auto"  # the default number of clusters of jcfs, ufcm and m3fs, in fit as in the estimators


def check_method(method: Any, params: dict | None = None) -> MethodSpec:
    """The :class:`MethodSpec` of ``method``, after checking that it exists, that it takes every name in
    ``params`` and that every value is within the method's declared constraints (its parameter table); a
    :class:`ParameterError` otherwise. Cheap (no data read): ``fit`` and the CLI call it before any work."""
    if not isinstance(method, str) or method not in METHODS:
        raise ParameterError(f"The 'method' parameter of fit must be one of {sorted(METHODS)}; got {method!r}.")
    spec = METHODS[method]
    extra = set(params or ()) - set(spec.params)
    if extra:
        raise ParameterError(f"fit got parameters {sorted(extra)} that method {method!r} does not take "
                             f"(it takes {sorted(spec.params) or 'none'})")
    check_params(spec.params, dict(params or {}), method)
    return spec


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
        "ufcm": "on term counts or other text keep values='auto' (their presence, with standardize=None) or give "
                "standardize=None with the rows scaled to unit norm (zscore makes the documents with rare words "
                "outliers, their large counts too), else lower alpha (the within-cluster weight) or check n_clusters",
        "jcfs": "lower lambda_ or raise gamma; on term counts keep values='auto' and rows='auto' (their presence, "
                "rows at unit norm)",
        "lapaofs": "lower lambda1 (the graph weight) or check the graph (n_neighbors)",
        "lapdofs": "lower lambda1 (the graph weight) or check the graph (n_neighbors)",
        "laplacian": "check the graph (n_neighbors, weights) or the standardize setting",
        "variance": "the input looks standardised already: give the raw (unscaled) data",
        "correlation": "check the labels", "fisher": "check the labels"}


def _degenerate(method: str, scores: Any, by_scores: bool, diag: dict, params: dict) -> str | None:
    """What makes a result meaningless, or None: every score NaN, every score equal (the ranking is then by index
    alone), no feature in MMFS's support, every sample in one cluster (unless one was asked for) or all but under
    1% of them."""
    fix = _FIX.get(method, "change its parameters")
    if method == "m3fs" and diag.get("solver") == "alternating":
        fix = "lower lambda_ (the manifold weight) or raise C"  # not "try the solver it ran"
    labels = diag.get("labels")
    if labels is not None and len(labels) > 1 and diag.get("n_clusters", params.get("n_clusters", N_CLUSTERS)) != 1:
        lab = np.asarray(labels)
        if lab.dtype.kind in "iu" and lab.min() >= 0:  # cluster indices: counted without a sort (19M at kddb size)
            counts = np.bincount(lab)
            counts = counts[counts > 0]
        else:
            counts = np.unique(lab, return_counts=True)[1]
        if counts.size < 2:
            return f"{method}: every sample fell in one cluster, so the selection says nothing about clusters; {fix}"
        rest = len(labels) - int(counts.max())
        if 100 * rest < len(labels):  # one cluster holds all but under 1% of the samples: outliers singled out
            return (f"{method}: almost every sample fell in one cluster ({int(counts.max()):,} of {len(labels):,}; "
                    f"the others hold {rest:,}): the clustering singled out outliers, so the selection says little "
                    f"about clusters; {fix}")
    if method == "mmfs" and diag.get("support", 1) == 0:
        return f"mmfs: no feature entered the support (every alpha is 0); the ranking is the dual gradient's; {fix}"
    if by_scores and scores is not None:
        s = np.asarray(scores)
        finite = np.isfinite(s)  # one byte a feature; no copy of the scores
        n_fin = int(finite.sum())
        if s.size > 1 and n_fin == 0:
            return f"{method}: no feature has a finite score, so the ranking is by feature index alone; {fix}"
        if n_fin > 1 and n_fin == s.size:
            lo, hi = float(s.min()), float(s.max())
            if hi - lo <= 1e-12 * max(1.0, abs(lo), abs(hi)):
                return (f"{method}: every feature has the same score ({lo:.6g}), so the ranking is by feature "
                        f"index alone; {fix}")
    return None


def _is_dask(X: Any) -> bool:
    return type(X).__module__.startswith("dask")


#: a Dask array of sparse chunks with more elements than ``dufs.engine.inline-nnz`` but at most this many has its
#: nonzeros counted in this process (one threaded pass) to tell whether it is small
SPARSE_COUNT_ELEMENTS = 100_000_000


def _small_dask(X: Any) -> bool:
    """Whether a Dask array has at most ``dufs.engine.inline-nnz`` nonzeros, so that :func:`fit` computes it and runs
    in this process, as for in-memory input of that size, instead of starting a cluster and running every pass
    through it (a pass on a LocalCluster costs many times one in this process: docs/measurements.md, "Small inputs
    in this process"). Counted by its elements (an upper bound), or, for sparse chunks of at most
    :data:`SPARSE_COUNT_ELEMENTS` elements, by one threaded pass here that counts them: a word-count matrix has far
    fewer nonzeros than elements."""
    from dufs import config

    shape = getattr(X, "shape", ())
    if len(shape) != 2 or not all(isinstance(s, int | np.integer) for s in shape):
        return False
    limit = int(config.get("engine.inline-nnz"))
    elements = int(shape[0]) * int(shape[1])
    if elements <= limit:
        return True
    if elements > SPARSE_COUNT_ELEMENTS or not _sparse_chunks(X):
        return False
    counts = X.map_blocks(_chunk_nnz, dtype=np.int64, chunks=tuple((1,) * len(c) for c in X.chunks))
    return int(counts.sum().compute(scheduler="threads")) <= limit


def _sparse_chunks(X: Any) -> bool:
    import scipy.sparse as sp

    meta = getattr(X, "_meta", None)
    return sp.issparse(meta) or type(meta).__module__.split(".")[0] == "sparse"


def _chunk_nnz(b: Any) -> np.ndarray:
    return np.full((1, 1), int(b.nnz if hasattr(b, "nnz") else np.count_nonzero(b)), dtype=np.int64)


def small_store(X: Any) -> bool:
    """Whether ``X`` is a dufs store (a path, URL or :class:`~dufs.data.SparseStore`) of at most
    ``dufs.engine.inline-nnz`` nonzeros: :func:`fit` (and ``dufs select``) then run it in this process with no
    cluster to start, as for in-memory input of that size (every pass over it takes less than a task's overhead:
    docs/measurements.md, "Small inputs in this process"). Reads the store's metadata only; a path that is no
    store is not small (``fit`` then says why)."""
    from dufs import config
    from dufs.data import SparseStore, open_store

    if isinstance(X, str | os.PathLike):
        try:
            X = open_store(X)
        except DufsError:  # not a finished store: as_matrix raises the error that names it
            return False
    return isinstance(X, SparseStore) and int(X.nnz) <= int(config.get("engine.inline-nnz"))


def fit(X: Any, y: Any = None, *, method: str, n_features: int, client: Any = None,
        standardize: str | None | type = ..., verbose: int | bool = False, **params: Any) -> Selection:
    """Select ``n_features`` features of ``X`` with ``method``.

    Parameters
    ----------
    X : NumPy array, SciPy sparse, pydata sparse, Dask array (dense or sparse chunks), a SparseStore or a store path
        A Dask array's column chunks become the feature blocks (computed and persisted on the workers). A pandas
        DataFrame of numeric columns is taken as a NumPy array (SciPy CSR when every column is sparse); the names
        of the selected columns go to ``source["selected_feature_ids"]``.
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
        in-memory inputs, stores of at most ``dufs.engine.inline-nnz`` nonzeros and Dask arrays of at most that
        many elements (computed first) run in this process without a cluster. ``False``: no cluster, run in this process
        (local threads for stores and Dask arrays).
    standardize : {"zscore", "scale", None, "auto"}
        The implicit transform; the default is the method's (``dufs.api.METHODS[method].standardize``). ``"auto"``
        (UFCM's default): None for sparse data (at most 10% nonzeros: counts, where a z-score
        makes a feature seen once as large as a frequent one), ``"zscore"`` otherwise; the choice is recorded
        (``diagnostics["standardize"]``, the selection file).
    **params
        Method parameters (e.g. ``n_neighbors`` for the Laplacian score). ``n_clusters`` defaults to ``"auto"`` for the
        clustering methods (``jcfs``, ``ufcm``, ``m3fs``), as in their estimators: estimated from the eigengap of the
        rows' kNN graph (a sample of 5,000 rows at most; ``diagnostics["n_clusters_estimate"]``).

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
        feature) or in y (naming its row), in any input kind: dufs does not impute; on a value of X beyond 1e150 in
        magnitude (``dufs.data.layout.MAX_ABS``: its square overflows float64, and with it the feature's variance
        and every distance), named the same way.
    """
    from dufs._logging import set_verbosity

    if verbose:
        set_verbosity(verbose)
    spec = check_method(method, params)
    X, column_names = from_frame(X, "fit")
    std = spec.standardize if standardize is ... else standardize
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    X, dask_source = _compute_small_dask(X, client)
    in_memory = not (_is_dask(X) or isinstance(X, (str, os.PathLike)) or type(X).__name__ == "SparseStore")
    # run in this process, no cluster: synchronous for in-memory input, else threads (a small store's passes inline)
    local = client is False or (client is None and distributed_client() is None and small_store(X))
    sync = local or (client is None and distributed_client() is None and in_memory)
    with get_client(None if local else client, synchronous=sync) as c:
        import dask

        ctx = c.as_current() if c is not None else dask.config.set(scheduler="sync" if in_memory else "threads")
        # whatever happens in the method, nothing of the fit stays on the cluster: the matrix releases its blocks
        # and the workers' state, the scope the futures a pass still held (a user's own client lives on)
        # verbose in a notebook: a progress bar in the cell's output, redrawn in place as the passes run
        bar = notebook_bar() if verbose else None
        with ctx, scope(c), on_pass(bar) if bar is not None else contextlib.nullcontext():
            M = _load(X, y, spec, std, c, timings)
            std = M.standardize  # "auto" as the matrix resolved it
            with M:
                source = dict(M.identity) if dask_source is None else {**dask_source, "nnz": int(M.nnz)}
                n_total = M.shape[1]
                n_features = check_n_features(n_features, n_total, method)
                run_params = _fit_defaults(spec, params, M.shape[0])
                built = graph_built()
                token = built.set(None)  # what the method's graph was made of, for the provenance
                try:
                    res = _score(M, spec, method, int(n_features), run_params, timings)
                finally:
                    graph = built.get()
                    built.reset(token)
                n_workers = len(c.scheduler_info(n_workers=-1).get("workers", {})) if c is not None else 0
                passes = M.passes
                if source.get("nnz") is None and all(b.nnz >= 0 for b in M.blocks):  # a Dask array's, once counted
                    source["nnz"] = int(sum(b.nnz for b in M.blocks))
                feature_ids = M.feature_ids if M.feature_ids is not None else column_names
    return _selection(method, spec, res, M, n_features=n_features, n_total=n_total, std=std, params=params,
                      run_params=run_params, source=source, feature_ids=feature_ids, passes=passes,
                      n_workers=n_workers, timings=timings, t0=t0, graph=graph)


def check_frame(X: Any, who: str) -> bool:
    """Whether ``X`` is a pandas DataFrame; one with a non-numeric column is a :class:`ParameterError` naming it
    (``who``: the caller, in the message), the same from ``fit`` and the estimators."""
    if type(X).__name__ != "DataFrame" or not type(X).__module__.startswith("pandas"):
        return False
    import pandas as pd

    bad = [str(c) for c, dt in X.dtypes.items() if not pd.api.types.is_numeric_dtype(dt)]
    if bad:
        more = f" and {len(bad) - 5} more" if len(bad) > 5 else ""
        raise ParameterError(f"The 'X' parameter of {who} is a pandas DataFrame with non-numeric columns "
                             f"{bad[:5]}{more}: dufs selects among numeric features; encode them (e.g. "
                             f"pandas.get_dummies) or drop them")
    return True


def from_frame(X: Any, who: str) -> tuple[Any, list[str] | None]:
    """A pandas DataFrame as a float64 NumPy array (SciPy CSR when every column is sparse) and its column names;
    anything else as it is, with None. A non-numeric column is a :class:`ParameterError` naming it (``who``: the
    caller, in the message)."""
    if not check_frame(X, who):
        return X, None
    import pandas as pd

    names = [str(c) for c in X.columns]
    if X.shape[1] and all(isinstance(dt, pd.SparseDtype) for dt in X.dtypes):
        import scipy.sparse as sp

        return sp.csr_array(X.sparse.to_coo(), dtype=np.float64), names
    return X.to_numpy(dtype=np.float64, na_value=np.nan), names


def _fit_defaults(spec: MethodSpec, params: dict, n_samples: int) -> dict:
    """``params`` as the method runs them: a kNN graph's default size, when the user set none, at most
    n_samples - 1 (a default must fit the data: 3 samples have 2 neighbours each)."""
    p = spec.params.get("n_neighbors")
    if p is None or "n_neighbors" in params or params.get("W") is not None or not isinstance(p.default, int):
        return dict(params)
    if 2 <= n_samples <= p.default:
        log.info("%s: n_neighbors = %d (the default %d is more than the %d samples' neighbours)", spec.name,
                 n_samples - 1, p.default, n_samples)
        return {**params, "n_neighbors": n_samples - 1}
    return dict(params)


def _recorded(v: Any) -> Any:
    """A parameter's value as a selection file records it: plain values as they are, an array or a graph by its
    type (``"<csr_array>"``)."""
    if v is None or isinstance(v, bool | int | float | str):
        return v
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, list | tuple) and len(v) <= 100 and all(isinstance(x, bool | int | float | str) for x in v):
        return list(v)
    return f"<{type(v).__name__}>"


def provenance(spec: MethodSpec, run_params: dict, std: Any, n_samples: int, solver_defaults: dict,
               built: dict | None = None, values: str | None = None, rows: str | None = None) -> dict:
    """What :attr:`Selection.provenance` records: every parameter in force (the table's defaults, those a solver
    fills in for None, then those given), the standardisation, what the method read of the stored values
    (``values``, where it says: UFCM's and JCFS's ``values="auto"`` resolved; ``rows``, JCFS's ``rows="auto"``
    resolved), the sample graph built (``built``: its metric
    and the values it read, :func:`dufs.engine.knn.graph_built`) and the versions."""
    from dufs._version import versions
    from dufs.engine import resolve_graph

    in_force = {k: p.default for k, p in spec.params.items()}
    in_force.update({k: v for k, v in solver_defaults.items() if in_force.get(k) is None})
    in_force.update(run_params)
    graph = None
    if "graph" in spec.params:
        if in_force.get("W") is not None or in_force.get("L") is not None:
            graph = "given"
        elif in_force.get("graph") in ("auto", "knn", "anchor"):
            graph = resolve_graph(in_force["graph"], n_samples)
        else:
            graph = in_force.get("graph")
    out = {"params": {k: _recorded(v) for k, v in in_force.items()}, "standardize": std, "graph": graph}
    if values is not None:
        out["values"] = values
    if rows is not None:
        out["rows"] = rows
    if graph in ("knn", "anchor") and built is not None:
        out["graph_metric"], out["graph_values"] = built.get("metric"), built.get("values")
    out["versions"] = versions()
    return out


def _selection(method: str, spec: MethodSpec, res: MethodResult, M: Any, *, n_features: int, n_total: int,
               std: Any, params: dict, run_params: dict, source: dict, feature_ids: Any, passes: Any,
               n_workers: int, timings: dict[str, float], t0: float, graph: dict | None = None) -> Selection:
    """The method's result as a :class:`Selection`: ranked when the method gave scores only, a degenerate result
    warned about (on fit's caller), the selected features' ids recorded in ``source``, how it was made in
    ``provenance``."""
    scores, order, method_diag = res.scores, res.ranking, dict(res.diagnostics)
    solver_defaults = method_diag.pop("solver_defaults", None) or {}
    problem = _degenerate(method, scores, res.by_scores, method_diag, params)
    if problem is not None:
        method_diag["degenerate"] = problem
        warnings.warn(problem, DufsWarning, stacklevel=3)
    if order is None:
        order = rank(scores, spec.higher_is_better, k=int(n_features))
    sel = order[:n_features]
    if feature_ids is not None:  # the ids of the selected features, so that another input's can be compared
        source["selected_feature_ids"] = np.asarray(feature_ids)[sel].tolist()
    diagnostics = {"passes": passes, "timings": timings, "wall_time": time.perf_counter() - t0,
                   "n_workers": n_workers, "n_blocks": M.n_blocks, "standardize": std,
                   "blocks": {k: v for k, v in M.residency.items() if v is not None}, **method_diag}
    return Selection(method=method, indices=sel, scores=scores, n_features_in=n_total,
                     params={"n_features": int(n_features), "standardize": std,
                             **{k: v for k, v in params.items() if k != "W"}},
                     diagnostics=diagnostics, higher_is_better=spec.higher_is_better, source=source,
                     provenance=provenance(spec, run_params, std, int(M.shape[0]), solver_defaults, graph,
                                           method_diag.get("values"), method_diag.get("rows")))


def _compute_small_dask(X: Any, client: Any) -> tuple[Any, dict | None]:
    """A Dask array small enough to run in this process (what a pass over it costs is less than a task's overhead),
    with no client given or active, computed here to run as in-memory input, with no cluster to start; and the
    identity of the Dask array it came from (None for any other input, returned as it is)."""
    if _is_dask(X) and client is None and distributed_client() is None and _small_dask(X):
        from dufs.engine.inputs import dask_identity

        dask_source = dask_identity(X)
        return X.compute(scheduler="threads"), dask_source
    return X, None


def _load(X: Any, y: Any, spec: MethodSpec, std: Any, c: Any, timings: dict[str, float]) -> Any:
    """The input as a :class:`~dufs.engine.Matrix` (persisted on the cluster ``c`` if any), with the labels a
    supervised method reads (an unsupervised one's are ignored: not read, not checked)."""
    with timer("load", timings, log):
        if not spec.supervised:
            y = None  # ignored: not read, not checked (a store's own labels are read as before)
        elif _is_dask(y):
            y = np.asarray(y.compute())
        return as_matrix(X, standardize=std, y=y, persist=c is not None)


def _score(M: Any, spec: MethodSpec, method: str, n_features: int, params: dict,
           timings: dict[str, float]) -> MethodResult:
    """Run the method on ``M`` (a supervised one needs labels)."""
    if spec.supervised and M.y is None:
        raise ParameterError(f"method {method!r} is supervised: give labels y (or a store with labels)")
    with timer("score", timings, log):
        return spec.run(M, M.y, n_features=n_features, **params)
