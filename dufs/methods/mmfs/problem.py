"""MMFS's problem (paper 002; docs/methods.md, "MMFS"): the parameters, the scaled feature columns' geometry, the
relevance of each feature and the margins rho = theta / (1 - theta) r.

Features are the points. With f_i the MMFS-scaled feature columns (the engine's standardization divided by
sqrt(m) for ``"zscore"`` and ``"scale"``, raw for None), relevance r_i and margins rho:

    primal  min_{w,b} 1/2 ||w||^2 + b^2 / (2 gamma) + C sum_i max(0, rho_i - f_i^T w - b)
    dual    min_{0 <= alpha <= C} D(alpha) = 1/2 alpha^T (K + gamma 1 1^T) alpha - rho^T alpha,

w = sum_j alpha_j f_j, b = gamma sum_j alpha_j.
"""

from __future__ import annotations

from dataclasses import dataclass
from numbers import Real
from typing import Any

import numpy as np

from dufs.engine import Matrix, check_labels, transform_of
from dufs.errors import ParameterError
from dufs.kernels.blockops import csc_rmatvec
from dufs.kernels.dcd import mmfs_geometry
from dufs.methods.labels import class_labels, unique_codes
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

#: MMFS's parameters, as ``dufs.fit(method="mmfs")`` and ``dufs.MMFS`` take them (``relevance`` is the function's
#: ``relevance_kind``; ``kernel``, ``rbf_gamma`` and ``max_features`` choose :mod:`dufs.methods.mmfs.nonlinear`)
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
    mmfs_geometry(*f64, int(st.n_rows), int(m), GEOMETRY_MODE[standardize], coef, shift, qii)
    return {"coef": coef, "shift": shift, "colsum": f64[0], "qii": qii}


GEOMETRY_MODE = {None: 0, "scale": 1, "zscore": 2}


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
    def dufs_ship(self) -> bool:
        """Whether a pass ships it once (scattered) rather than inside each block's task: while it holds n-vectors
        (not once they are in /dev/shm, :func:`dufs.methods.mmfs.solver.spec_shared`)."""
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
    from dufs.engine import block_stats

    m = spec.m
    classed = spec.kind in ("ratio", "fisher")
    st = block_stats(b, m, spec.codes if classed else None, 0 if not classed else spec.counts.shape[0])
    geo = _geometry_of(st, m, spec.standardize, b.width)
    if spec.kind == "given":
        r = np.asarray(r_block, dtype=np.float64)
    elif spec.kind == "correlation":
        raw = np.empty((b.width, 1))
        csc_rmatvec(b.indptr, b.indices, b.data, spec.yn[:, None], raw)
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
