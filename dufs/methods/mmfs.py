"""MMFS: max-margin feature selection by dual coordinate descent (paper 002; docs/methods.md, "MMFS").

Features are the points. With f_i the MMFS-scaled feature columns (the engine's standardization divided by
sqrt(m) for ``"zscore"`` and ``"scale"``, raw for None), relevance r_i and margins rho = theta / (1 - theta) r:

    primal  min_{w,b} 1/2 ||w||^2 + b^2 / (2 gamma) + C sum_i max(0, rho_i - f_i^T w - b)
    dual    min_{0 <= alpha <= C} D(alpha) = 1/2 alpha^T (K + gamma 1 1^T) alpha - rho^T alpha,

w = sum_j alpha_j f_j, b = gamma sum_j alpha_j. The certificate is the duality gap
gap = sum_i [C max(0, rho_i - g_i) + alpha_i (g_i - rho_i)] with g_i = f_i^T w + b, a sum of per-feature terms;
the solver stops when gap / |D| <= tol. Selected: alpha_i > 0, ranked by alpha_i.

The solve runs in rounds over the Matrix's feature blocks (the partitions), each where its block lives
(``Matrix.map_blocks`` with per-block state): a block first applies the previous round's step to its alphas and
computes its gap terms at the current (w, b), then runs one DCD epoch (random order, shrinking) against a local
copy of w with the bias held at its round-start value, and returns its delta of w. The driver sums the deltas
(a fixed tree on the workers), takes the exact step on the plane of the summed direction and the last step's change
(the dual is quadratic there; the box bounds the step), and checks the gap.
With one partition the epoch also moves the bias: plain serial DCD (Hsieh et al. 2008).
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass, field
from numbers import Real
from typing import Any

import numpy as np

from dufs import config
from dufs._logging import get_logger
from dufs.engine import Matrix, check_labels, transform_of
from dufs.engine.shm import local_array
from dufs.errors import ParameterError
from dufs.kernels.blockops import csc_rmatvec
from dufs.kernels.dcd import mmfs_geometry
from dufs.methods.labels import class_labels, unique_codes
from dufs.methods.mmfs_solver import Checkpoint, init_state, margin_summary, primal, solve
from dufs.methods.params import (
    CHECKPOINT_PARAMS,
    SEED,
    Interval,
    Param,
    StrOptions,
    check_params,
    integer,
    positive,
    table,
)
from dufs.methods.solver import checkpoint_dir, release
from dufs.scheduling import current_client, one_blas_thread

#: MMFS's parameters, as ``dufs.fit(method="mmfs")`` and ``dufs.MMFS`` take them (``relevance`` is the function's
#: ``relevance_kind``; ``kernel``, ``rbf_gamma`` and ``max_features`` choose :mod:`dufs.methods.mmfs_kernel`)
MMFS_PARAMS = table(
    Param("C", 1.0, (positive(),), "the box 0 <= alpha <= C"),
    Param("theta", 0.5, (Interval(Real, 0, 1, closed="neither"),), "relevance against redundancy"),
    Param("gamma", "auto", (StrOptions({"auto"}), positive()), "bias regulariser, or the path 1, 1/2, ..."),
    Param("relevance", "correlation", (StrOptions({"correlation", "fisher"}), callable), "the margins' relevance"),
    Param("kernel", "linear", (StrOptions({"linear", "poly2", "rbf"}),), "similarity between features"),
    Param("tol", 1e-3, (positive(),), "relative duality gap at which a solve stops"),
    Param("max_epochs", 500, (integer(1),), "rounds per gamma"),
    SEED,
    Param("n_partitions", "auto", (StrOptions({"auto"}), integer(1)), "feature partitions solved side by side"),
    CHECKPOINT_PARAMS.values(),
    Param("checkpoint_every", 5, (integer(1),), "rounds between checkpoints", estimator=False),
    Param("rbf_gamma", None, (None, positive()), "width of the Gaussian kernel", estimator=False),
    Param("max_features", None, (None, integer(1)), "size limit of the nonlinear kernels", estimator=False),
)

log = get_logger(__name__)

_SMALL_NNZ = 2_000_000  # auto_partitions: fewer nonzeros run as one partition
_DENSE = 0.05  # auto_partitions: denser data runs as one partition


@dataclass
class MMFSResult:
    """What :func:`mmfs` found: ``alpha`` (per feature), ``w`` (over samples), ``b``, the ``gamma`` used, the
    relevance ``r`` and margins ``rho``, the gradient ``g`` (f_i^T w + b) at the solution, and ``diagnostics``."""

    alpha: np.ndarray
    w: np.ndarray
    b: float
    gamma: float
    r: np.ndarray | None
    rho: np.ndarray | None
    g: np.ndarray | None
    diagnostics: dict = field(default_factory=dict)
    top: np.ndarray | None = None

    @property
    def support(self) -> np.ndarray:
        """Features with alpha > 0, ranked by alpha (ties by the lower index)."""
        s = np.flatnonzero(self.alpha > 0)
        return s[np.lexsort((s, -self.alpha[s]))]

    def ranking(self) -> np.ndarray:
        """Every feature: the support by alpha, then the rest by their dual gradient g_i - rho_i, smallest first
        (closest to entering the support). For many features (``r``, ``rho`` and ``g`` then stay on the workers)
        the best ``n_features`` only, ranked the same way where the blocks live (``top``)."""
        if self.g is None:
            return self.top
        sup = self.support
        rest = np.flatnonzero(self.alpha <= 0)
        G = self.g[rest] - self.rho[rest]
        return np.concatenate([sup, rest[np.lexsort((rest, G))]])


# ---------------------------------------------------------------------------------------------------- geometry
def geometry(M: Matrix) -> dict[str, np.ndarray]:
    """Per-feature ``coef``, ``shift``, ``colsum`` and ``qii`` = ||f_i||^2 of the MMFS columns
    f_i = coef_i (x_i - shift_i 1): the engine's standardization divided by sqrt(m) (None: raw columns)."""
    return _geometry_of(M.stats, M.shape[0], M.standardize, M.shape[1])


def _geometry_of(st: Any, m: int, standardize: str | None, d: int) -> dict[str, np.ndarray]:
    """:func:`geometry` from column statistics (of the whole matrix, or of one block: every number is per feature),
    in one sweep (:func:`~dufs.kernels.dcd.mmfs_geometry`) where the statistics carry the centred sums of squares,
    else by :func:`_geometry_numpy`."""
    if st.m2 is None or st.min is None or st.max is None:
        return _geometry_numpy(st, m, standardize, d)
    f64 = [np.ascontiguousarray(a, dtype=np.float64) for a in (st.sum, st.sumsq, st.m2, st.min, st.max)]
    coef, shift, qii = np.empty(d), np.empty(d), np.empty(d)
    mmfs_geometry(*f64, int(st.n_rows), int(m), _GEOMETRY_MODE[standardize], coef, shift, qii)
    return {"coef": coef, "shift": shift, "colsum": f64[0], "qii": qii}


_GEOMETRY_MODE = {None: 0, "scale": 1, "zscore": 2}


def _geometry_numpy(st: Any, m: int, standardize: str | None, d: int) -> dict[str, np.ndarray]:
    """:func:`geometry` from column statistics by NumPy expressions (the engine's :func:`transform_of`)."""
    mu, inv = transform_of(st, standardize)
    shift = np.zeros(d) if mu is None else np.asarray(mu, dtype=np.float64)
    coef = np.ones(d) if inv is None else np.asarray(inv, dtype=np.float64) / np.sqrt(m)
    colsum = np.asarray(st.sum, dtype=np.float64)
    if mu is not None:
        base = np.where(st.min == st.max, 0.0, np.maximum(st.m2, 0.0))
    else:
        base = np.asarray(st.sumsq, dtype=np.float64)
    return {"coef": coef, "shift": shift, "colsum": colsum, "qii": coef * coef * base}


def encode_labels(y: Any) -> tuple[np.ndarray, np.ndarray]:
    """``(classes, codes)``: the sorted distinct labels and each sample's class index (``np.unique``'s inverse),
    whatever the labels' type (numbers, strings, booleans)."""
    return unique_codes(np.asarray(y).ravel())


def class_relevance(M: Matrix, codes: np.ndarray, n_classes: int, geo: dict, rule: str = "ratio") -> np.ndarray:
    """Multi-class relevance from one pass of per-class column sums (``column_stats`` with the class codes),
    invariant to how the classes are numbered. With B_i = sum_c n_c (mu_ci - mu_i)^2 the between-class and
    T_i = sum_s (x_si - mu_i)^2 the total sum of squares of the raw feature i:

    - ``"ratio"``: r_i = coef_i sqrt(B_i), the length of f_i's projection on the span of the centred class
      indicators; under "zscore" and "scale" coef_i = 1 / sqrt(T_i), so r_i is the correlation ratio
      eta_i = sqrt(B_i / T_i). For two classes B_i = (x_i^T y~)^2, so r_i is the binary relevance |f_i^T y~|.
    - ``"ovr-max"`` / ``"ovr-mean"``: the largest / mean over the classes c of |f_i^T e~_c|, e~_c the indicator
      of class c centred and scaled to unit norm (|Pearson correlation| with "class c or not" under "zscore").

    A constant feature scores 0."""
    st = M.with_standardize(None).column_stats(codes.astype(np.float64))
    if st.class_count.shape[0] != n_classes:
        raise ParameterError("MMFS: the class codes do not match the number of classes")
    cnt = st.class_count.astype(np.float64)[:, None]
    n = float(M.shape[0])
    mu = st.mean()
    dev = st.class_sum / cnt - mu[None, :]  # mu_c - mu, (n_classes, d)
    const = st.min == st.max
    # the per-class terms are summed in sorted order: renumbering the classes permutes them, and the sum stays
    # bit-for-bit the same
    if rule == "ratio":
        return _ratio(st, st.class_count.astype(np.float64), geo["coef"])
    if rule in ("ovr-max", "ovr-mean"):
        # x_i^T (e_c - n_c / n 1) = n_c (mu_c - mu), and the centred indicator has norm^2 n_c (n - n_c) / n
        per = np.abs(np.sqrt(cnt * n / (n - cnt)) * dev) * geo["coef"][None, :]
        per[:, const] = 0.0
        return per.max(axis=0) if rule == "ovr-max" else np.sort(per, axis=0).sum(axis=0) / n_classes
    raise ParameterError(f"The multi-class relevance rule must be 'ratio', 'ovr-max' or 'ovr-mean'; got {rule!r}.")


def _ratio(st: Any, counts: np.ndarray, coef: np.ndarray) -> np.ndarray:
    """``"ratio"``'s r = coef sqrt(B) from column statistics with per-class sums (whole matrix or one block)."""
    cnt = counts[:, None]
    dev = st.class_sum / cnt - st.mean()[None, :]  # mu_c - mu, (n_classes, d)
    const = st.min == st.max
    # the per-class terms are summed in sorted order: renumbering the classes permutes them, and the sum stays
    # bit-for-bit the same
    between = np.where(const, 0.0, np.sort(cnt * dev * dev, axis=0).sum(axis=0))
    return coef * np.sqrt(np.maximum(between, 0.0))


def relevance(M: Matrix, y: Any, geo: dict, kind: Any = "correlation") -> np.ndarray:
    """The relevance r of every feature for MMFS:

    - ``"correlation"``: with two classes, r_i = |f_i^T y~| with y~ the labels centred and scaled to unit norm
      (|Pearson correlation| under "zscore"); with more, the correlation ratio eta_i (:func:`class_relevance`,
      ``"ratio"``), which does not depend on how the classes are numbered and equals the binary rule for two;
    - ``"fisher"``: Fisher scores divided by their largest finite value;
    - a callable ``kind(M, y) -> r``.

    Labels of any type are encoded as classes (``np.unique``); numeric binary labels are used as they are."""
    if callable(kind):
        r = np.asarray(kind(M, y), dtype=np.float64).ravel()
        if r.shape != (M.shape[1],):
            raise ParameterError(f"the relevance callable returned shape {r.shape}; expected ({M.shape[1]},)")
        return r
    if kind == "correlation":
        y = np.asarray(y).ravel()
        classes, codes = encode_labels(y)
        if classes.shape[0] < 2:
            raise ParameterError("MMFS: the labels are constant, so every feature's relevance is 0")
        if classes.shape[0] > 2:
            return class_relevance(M, codes, classes.shape[0], geo, "ratio")
        y = np.asarray(y, dtype=np.float64) if y.dtype.kind in "biuf" else codes.astype(np.float64)
        yc = y - y.mean()
        nrm = np.linalg.norm(yc)
        if nrm == 0:
            raise ParameterError("MMFS: the labels are constant, so every feature's relevance is 0")
        raw = M.with_standardize(None).rmatvec(yc / nrm)
        return np.abs(geo["coef"] * raw)  # 1^T y~ = 0, so the shift drops out
    if kind == "fisher":
        from dufs.methods.filters import fisher_scores

        y = np.asarray(y).ravel()
        f = fisher_scores(M, y if y.dtype.kind in "biuf" else encode_labels(y)[1])
        fin = f[np.isfinite(f)]
        top = fin.max() if fin.size and fin.max() > 0 else 1.0
        return np.where(np.isfinite(f), f / top, 1.0)
    raise ParameterError(f"The 'relevance' parameter of mmfs must be 'correlation', 'fisher' or a callable; "
                         f"got {kind!r}.")


def class_targets(M: Matrix, y: Any, method: str) -> np.ndarray:
    """The labels ``y`` (one per row of ``M``), checked to be classes before any pass over the data: numbers as
    float64, other labels (strings) as given; a continuous target, a single class or a non-finite label is a
    :class:`ParameterError` (:func:`dufs.methods.labels.class_labels`)."""
    return _class_targets_and_codes(M, y, method)[0]


def _class_targets_and_codes(M: Matrix, y: Any, method: str) -> tuple[np.ndarray, np.ndarray, int]:
    """:func:`class_targets`' labels with each sample's class index and the number of classes, from the same
    check (one sort of the labels: the index among the sorted distinct labels is :func:`encode_labels`' code)."""
    if y is None:
        raise ParameterError(f"method {method!r} is supervised: give labels y (or a store with labels)")
    values, classes = check_labels(y, M.shape[0])
    distinct, codes = class_labels(values, method)
    return (values if classes is None else np.asarray(y).ravel()), codes, int(distinct.shape[0])


def margins(M: Matrix, y: Any, theta: Any, gamma: Any, relevance_kind: Any) -> tuple[bool, dict, np.ndarray,
                                                                                     np.ndarray]:
    """Check ``theta``, ``gamma`` (against :data:`MMFS_PARAMS`) and the labels; return (gamma is "auto", the
    geometry, the relevance r, the margins rho = theta / (1 - theta) r)."""
    check_params(MMFS_PARAMS, {"theta": theta, "gamma": gamma}, "mmfs")
    auto = isinstance(gamma, str)
    y = class_targets(M, y, "mmfs")
    geo = geometry(M)
    r = relevance(M, y, geo, relevance_kind)
    return auto, geo, r, theta / (1.0 - theta) * r


@dataclass(frozen=True)
class MarginSpec:
    """How every feature block computes its MMFS geometry (:func:`geometry`'s coef, shift, colsum, qii) and margins
    (rho = theta / (1 - theta) r, :func:`relevance`) where it lives, from the block itself and a few numbers
    broadcast to all: the driver never holds a vector over the features (what :func:`margins` does for small
    data, with the same values bit for bit).

    ``kind``: "correlation" (two classes: ``yn``, the labels centred and scaled to unit norm), "ratio" (more
    classes: ``codes``, ``counts``), "fisher" (``codes``, ``counts`` and ``scale``: Fisher scores divided by their
    largest finite value), or "given" (``r``, a relevance computed on the driver by a callable)."""

    m: int
    standardize: str | None
    theta: float
    kind: str
    yn: np.ndarray | None = None
    codes: np.ndarray | None = None
    counts: np.ndarray | None = None
    scale: float = 1.0
    r: np.ndarray | None = None

    @property
    def dufs_share(self) -> bool:
        """Whether a pass ships it once (scattered) rather than inside each block's task: while it holds n-vectors
        (not once they are in /dev/shm, :func:`dufs.methods.mmfs_solver.spec_shared`)."""
        return any(isinstance(a, np.ndarray) and a.nbytes >= 1 << 16 for a in (self.yn, self.codes, self.r))


def margin_spec(M: Matrix, y: Any, theta: Any, gamma: Any, relevance_kind: Any) -> tuple[bool, MarginSpec]:
    """Check ``theta``, ``gamma`` and the labels (as :func:`margins`); return (gamma is "auto", the recipe by which
    each block computes its geometry and margins). A Fisher relevance takes one pass here (its largest finite
    score); a callable's relevance is computed now, on the driver."""
    check_params(MMFS_PARAMS, {"theta": theta, "gamma": gamma}, "mmfs")
    auto = isinstance(gamma, str)
    y, codes, n_classes = _class_targets_and_codes(M, y, "mmfs")
    common = {"m": int(M.shape[0]), "standardize": M.standardize, "theta": float(theta)}
    if callable(relevance_kind):
        return auto, MarginSpec(kind="given", r=relevance(M, y, geometry(M), relevance_kind), **common)
    y = np.asarray(y).ravel()
    if n_classes < 2:
        raise ParameterError("MMFS: the labels are constant, so every feature's relevance is 0")
    if relevance_kind == "fisher":
        from dufs.methods.filters import fisher_scores

        f = fisher_scores(M, y if y.dtype.kind in "biuf" else codes)
        finite = np.isfinite(f)
        top = float(f.max(where=finite, initial=-np.inf))
        return auto, MarginSpec(kind="fisher", codes=codes, counts=_counts(codes, n_classes),
                                scale=top if top > 0 else 1.0, **common)
    if relevance_kind != "correlation":
        raise ParameterError(f"The 'relevance' parameter of mmfs must be 'correlation', 'fisher' or a callable; "
                             f"got {relevance_kind!r}.")
    if n_classes > 2:
        return auto, MarginSpec(kind="ratio", codes=codes, counts=_counts(codes, n_classes), **common)
    yv = np.asarray(y, dtype=np.float64) if y.dtype.kind in "biuf" else codes.astype(np.float64)
    yc = yv - yv.mean()
    nrm = np.linalg.norm(yc)
    if nrm == 0:
        raise ParameterError("MMFS: the labels are constant, so every feature's relevance is 0")
    yc /= nrm
    return auto, MarginSpec(kind="correlation", yn=yc, **common)


def _counts(codes: np.ndarray, n_classes: int) -> np.ndarray:
    return np.bincount(codes, minlength=n_classes).astype(np.float64)


def block_margins(b: Any, spec: MarginSpec, r_block: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """One feature block's ``coef``, ``shift``, ``colsum``, ``qii``, ``r`` and ``rho`` by ``spec`` (computed where
    the block lives; the same values as :func:`geometry` and :func:`relevance` on the whole matrix). With
    ``r_block``: the block's slice of a relevance computed on the driver ("given")."""
    from dufs.engine.stats import block_stats

    m = spec.m
    classed = spec.kind in ("ratio", "fisher")
    st = block_stats(b, m, local_array(spec.codes) if classed else None, 0 if not classed else spec.counts.shape[0])
    geo = _geometry_of(st, m, spec.standardize, b.width)
    if spec.kind == "given":
        r = np.asarray(r_block, dtype=np.float64)
    elif spec.kind == "correlation":
        raw = np.empty((b.width, 1))
        csc_rmatvec(b.indptr, b.indices, b.data, local_array(spec.yn)[:, None], raw)
        r = np.abs(geo["coef"] * raw[:, 0])  # 1^T y~ = 0, so the shift drops out
    elif spec.kind == "ratio":
        st.class_count = spec.counts
        r = _ratio(st, spec.counts, geo["coef"])
    else:
        from dufs.methods.filters import fisher_from_stats

        st.class_count = spec.counts
        f = fisher_from_stats(st, spec.counts, b.width)
        r = np.where(np.isfinite(f), f / spec.scale, 1.0)
    return {**geo, "r": r, "rho": spec.theta / (1.0 - spec.theta) * r}


def _problem(M: Matrix, rho_summary: np.ndarray, C: float, theta: float, gamma: Any, relevance_kind: Any) -> dict:
    rel = relevance_kind if isinstance(relevance_kind, str) else \
        f"callable:{getattr(relevance_kind, '__qualname__', type(relevance_kind).__name__)}"
    return {"shape": [int(M.shape[0]), int(M.shape[1])], "nnz": int(M.nnz), "standardize": M.standardize,
            "C": float(C), "theta": float(theta), "gamma": gamma if isinstance(gamma, str) else float(gamma),
            "relevance": rel, "rho": [float(v) for v in rho_summary]}


def default_checkpoint(M: Matrix, problem: dict) -> str | None:
    """``<store path>.dufs-side/mmfs-<hash of the problem>`` for a Matrix read from a local store, else None
    (:func:`dufs.methods.solver.checkpoint_dir`).

    The hash covers the shape, nnz, standardization, C, theta, gamma and relevance (not ``tol`` or
    ``max_epochs``: they only decide when to stop, so a resume may change them; not rho, which they imply)."""
    return checkpoint_dir(M, "auto", "mmfs", problem, unhashed=("rho",))


# ---------------------------------------------------------------------------------------------------- the solver
def auto_partitions(M: Matrix) -> int:
    """The number of partitions for ``n_partitions="auto"``: one per worker holding blocks (one per worker of the
    client when the blocks are not persisted), and one (serial DCD) in this process or for small or dense data.

    Small: under ``_SMALL_NNZ`` nonzeros a serial epoch takes a few tens of milliseconds, less than a round's
    fixed cost on a cluster. Dense: above ``_DENSE`` density the features are strongly coupled and the held-bias
    rule needs 3-4x the rounds of serial DCD (86-138 rounds against 34 epochs on ALLAML, docs/methods.md "MMFS")."""
    client = current_client()
    if client is None or M.n_blocks == 1:
        return 1
    n, d = M.shape
    if M.nnz < _SMALL_NNZ or M.nnz > _DENSE * n * d:
        return 1
    owners = {a for a in M.placement() if a is not None}
    if owners:
        return len(owners)
    with contextlib.suppress(Exception):
        return max(1, len(client.scheduler_info(n_workers=-1)["workers"]))
    return 1


def mmfs(M: Matrix, y: Any, *, n_features: int | None = None, C: float = 1.0, theta: float = 0.5,
         gamma: Any = "auto", relevance_kind: Any = "correlation", tol: float = 1e-3, max_epochs: int = 500,
         random_state: int = 0, n_partitions: Any = "auto", checkpoint: Any = "auto", checkpoint_every: int = 5,
         resume: bool = False) -> MMFSResult:
    """Solve MMFS on ``M`` (its ``standardize`` gives the geometry) with labels ``y``; see the module docstring.

    Defaults, chosen on data (``examples/mmfs_defaults.py``: C, theta, gamma, standardize, the relevance and its
    multi-class rule, on ALLAML, BASEHOCK, PCMAC, RELATHE, COIL20, ORL and Isolet, LinearSVC(C=1) on the top K with
    the selection made inside each of 5 folds): ``C=1``, ``theta=0.5``, ``gamma="auto"``, ``standardize="zscore"``
    (``fit``'s default) and ``relevance_kind="correlation"`` (|corr| on two classes, the correlation ratio on more).
    They beat the |correlation| ranking in 11 of the 14 (set, K in {5, 10}) cells, with a mean accuracy of 68.3%
    against 55.0%; taking the class ids as numbers (the rule before) reached 62.2% and depended on how the classes
    were numbered. No single change of C (0.01 .. 10), theta (0.3 .. 0.9) or a fixed gamma (1 .. 0.001) won more
    cells, and none had a mean more than 0.02 points higher (C=0.3). Recommended settings by kind of data:

    - dense measurements (microarrays, images, audio features): the defaults; ``standardize="zscore"`` matters
      (``"scale"`` lost 10-50 points on COIL20 and ORL, where the pixels' means differ);
    - sparse counts or tf-idf (text, kddb-like): the defaults (centring stays implicit, nothing is densified);
      ``"scale"`` gave the same accuracies on the three text sets and is the paper's kddb setting; at K >= 20 the
      |correlation| filter was as good or better on two of the three text sets, MMFS's gain is at small K;
    - many classes: the default correlation ratio; ``relevance_kind="fisher"`` ranks the same features first
      (eta^2 = F / (1 + F)) but its scale weighs relevance against redundancy differently and lost on ORL.

    ``gamma="auto"`` follows a decreasing path gamma = 1, 1/2, 1/4, ... with warm starts until the support holds
    ``n_features`` features (or gamma reaches 2^-30); a fixed gamma solves once.

    ``n_partitions`` (an int, or ``"auto"``: :func:`auto_partitions`) partitions the feature blocks into partitions
    (:meth:`Matrix.partition`: by the worker holding them); each round runs one task a partition.

    The solver state never lives only on the workers: every ``checkpoint_every`` rounds alpha is gathered to the
    driver (under a distributed client) and written to ``checkpoint`` (a directory; ``"auto"``: beside a local
    store, ``<store>.dufs-side/mmfs-<hash of the problem>``, none for in-memory input; None: no file). A round that
    fails because workers were lost rebuilds the block state from that copy and goes on (``diagnostics
    ["recoveries"]``). ``resume=True`` continues from the checkpoint (``diagnostics["resumed_from_round"]``); a
    checkpoint of another problem raises a ParameterError naming the file.
    """
    t0 = time.perf_counter()
    check_params(MMFS_PARAMS, {"C": C, "relevance": relevance_kind, "tol": tol, "max_epochs": max_epochs,
                               "random_state": random_state, "n_partitions": n_partitions,
                               "checkpoint_every": checkpoint_every, "resume": resume}, "mmfs")  # theta, gamma: margins
    if not (checkpoint is None or checkpoint == "auto" or isinstance(checkpoint, str | os.PathLike)):
        raise ParameterError(f"The 'checkpoint' parameter of mmfs must be a directory path, 'auto' or None; "
                             f"got {checkpoint!r}.")
    # above dufs.engine.driver-features the per-feature vectors (geometry, margins, the gradient) stay where the
    # blocks live and the driver holds alpha only (MMFSResult.r, rho and g are then None)
    on_blocks = M.shape[1] > int(config.get("engine.driver-features"))
    partitions = M.partition(auto_partitions(M) if n_partitions == "auto" else int(n_partitions))
    state = None
    if on_blocks:  # the geometry and the margins where the blocks live: no vector over the features here
        auto, spec = margin_spec(M, y, theta, gamma, relevance_kind)
        geo, r, rho = None, None, spec
        if resume:  # the summary first (the checkpoint's problem), the state from the checkpoint's alpha after
            rho_summary = margin_summary(M, spec)
        else:  # the blocks' state at alpha = 0 and the margins' summary in the same pass
            state, rho_summary = init_state(M, partitions, spec, int(random_state))
    else:
        auto, geo, r, rho = margins(M, y, theta, gamma, relevance_kind)
        rho_summary = np.array([float(rho.sum()), float(np.sqrt(rho @ rho)), float(rho.max(initial=0.0))])
    problem = _problem(M, rho_summary, C, theta, gamma, relevance_kind)
    directory = default_checkpoint(M, problem) if checkpoint == "auto" else checkpoint
    ck = None if directory is None else Checkpoint(directory, problem)
    if resume and ck is None:
        raise ParameterError("mmfs(resume=True) needs a checkpoint directory: give checkpoint=<directory> (the "
                             "default is beside a local store only)")
    trace: list = []
    gammas = [float(gamma)] if not auto else [2.0 ** -k for k in range(31)]
    want = n_features if n_features is not None else 1
    fresh = state is not None  # a state at alpha = 0 made above: the first solve is a cold start
    w = None
    alpha0 = None
    first = 0
    resumed_from = None
    if resume:
        got = ck.load()
        if got is None:
            log.info("mmfs(resume=True): no checkpoint at %s; starting from alpha = 0", ck.path)
        else:
            alpha0, meta = got
            first = int(meta.get("gamma_index", 0))
            trace = list(meta.get("trace", []))
            resumed_from = int(meta["round"])
            w = primal(M, alpha0, gammas[first])
            log.info("mmfs: resuming from %s at round %d (gamma %.3g)", ck.path, resumed_from, gammas[first])
    recovery: dict = {}
    support = 0
    for k in range(first, len(gammas)):
        gk = gammas[k]
        if w is not None and alpha0 is not None:  # warm start: w depends on alpha only; b = gamma sum(alpha)
            w = (w[0], w[1], gk * float(alpha0.sum()))
        with one_blas_thread():
            out = solve(M, rho, geo, C=float(C), gamma=gk, tol=float(tol), max_epochs=int(max_epochs),
                        random_state=int(random_state), partitions=partitions, state=state, w=w, trace=trace,
                        alpha0=alpha0, checkpoint=ck, checkpoint_every=int(checkpoint_every),
                        checkpoint_meta={"gamma_index": k}, recovery=recovery, gather_g=not on_blocks, cold=fresh,
                        top=want if on_blocks else 0)
        fresh = False
        state = out["state"]
        alpha0 = out["alpha"]
        w = (out["ws"], out["wt"], out["b"])
        support = out["support"]  # alpha's nonzeros (alpha >= 0)
        log.info("gamma %.3g: %d features in the support, gap %.3g after %d rounds", gk, support, out["gap"],
                 len(trace))
        if support >= want:
            break
    alpha, g = out["alpha"], out["g"]
    top = out["top"]  # on_blocks: the ranking's head where the blocks live, (alpha, g - rho) stay there
    release(state)
    ws, wt, b = out["ws"], out["wt"], out["b"]
    diagnostics = {
        "objective": out["objective"], "duality_gap": out["gap"],
        "relative_gap": out["gap"] / max(abs(out["objective"]), 1e-300), "converged": out["converged"],
        "rounds": len(trace), "gamma": gk, "gamma_path": auto, "support": support, "n_partitions": len(partitions),
        "n_blocks": M.n_blocks, "cocoa_rounds": sum(t.get("rule") == "cocoa+" for t in trace),
        "trace": trace, "solve_time": time.perf_counter() - t0,
        "recoveries": int(recovery.get("recoveries", 0)), "rounds_replayed": int(recovery.get("rounds_replayed", 0)),
        "checkpoint": None if ck is None else ck.path, "checkpoint_writes": 0 if ck is None else ck.writes,
        "resumed_from_round": resumed_from, "workers_lost": int(recovery.get("workers_lost", 0)),
    }
    if recovery.get("errors"):
        diagnostics["recovery_errors"] = recovery["errors"]
    if n_features is not None and support < n_features:
        diagnostics["filled_by_gradient"] = int(n_features - support)
        log.info("the support holds %d features; the other %d are the closest to entering it (dual gradient)",
                 support, n_features - support)
    # w = ws + t 1: ws itself where t is 0 (every step folds it in; a copy of 8 bytes a sample saved)
    return MMFSResult(alpha=alpha, w=ws if wt[0] == 0.0 else ws + wt[0], b=float(b), gamma=gk, r=r,
                      rho=None if on_blocks else rho, g=g, diagnostics=diagnostics, top=top)
