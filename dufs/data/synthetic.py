"""A synthetic kddb-like data generator: huge, sparse, binary, power-law frequencies, known answer.

kddb (KDD Cup 2010, LIBSVM's version) has ~19M rows, ~30M binary features and ~30 nonzeros a row,
and its feature frequencies follow a power law. :class:`SyntheticSpec` describes a data set of that
kind and :func:`generate_rows` produces any range of its rows as CSR buffers, so a writer can
produce the rows of a billion-nonzero store block by block, in parallel, in any order.

The model
---------
- Row ``i`` has ``1 + Poisson(nnz_per_row - 1)`` nonzeros (capped at ``n_features``), all 1.0.
- Its feature ranks are drawn from a continuous power law of density ``~ x**-s`` on
  ``[1, n + 1)`` (``s = zipf_exponent``, ``n = n_features``) by the closed-form inverse CDF
  ``x = (1 + u * ((n + 1)**(1 - s) - 1))**(1 / (1 - s))``, ``rank = floor(x) - 1``: rank 0 is the
  most frequent feature and the probability of rank ``r`` decays as ``(r + 1)**-s``. No table of
  ``n_features`` entries is built, so 30M features cost nothing.
- Ranks map to feature ids by the affine bijection ``id = (a * rank + c) mod n``,
  ``gcd(a, n) = 1``, ``a`` and ``c`` drawn from the seed, so frequent features are spread over the
  id range.
- A feature already in the row is drawn again (duplicates are resampled, not dropped); ids are
  sorted within a row.
- Labels come from a sparse linear model: ``n_informative`` features picked at random among those
  of moderate-to-high frequency (expected in 3% to 50% of the rows, the 10 most frequent excluded,
  when there are enough of them), weights of magnitude uniform in ``[1, 2]`` and random sign, and
  ``y = sign(x.w + bias + e)``, ``e ~ N(0, 0.1**2)``. Balance is set on a fixed pilot sample of
  16384 rows (independent of ``n_rows``): a random order of the features decides which are
  positive, the number of positive ones is the one closest to half whose scores ``x.w`` can be
  split within 5% of half and half, and the bias puts the threshold in the widest gap between pilot
  scores among such splits at least 0.5 away from 0 (so that rows without any informative feature,
  ``x.w = 0``, are not near it). Finally a ``label_noise`` fraction of the labels is flipped (each
  row independently).
- With ``n_clusters = K`` (``dufs make-synthetic --clusters K``), a latent cluster structure for unsupervised
  selection: row i belongs to cluster c_i (uniform), each cluster owns ``cluster_features`` features (random ids,
  none informative, disjoint), and row i draws ``cluster_nnz`` distinct features of its cluster's own on top of
  its power-law ones. The labels are then the clusters, and the ground truth lists each cluster's features.

Determinism
-----------
Rows are made in fixed generation chunks of :data:`CHUNK_ROWS` rows, chunk ``k`` from its own
random stream ``SeedSequence(seed, spawn_key=(0, k))``; :func:`generate_rows` makes the chunks
overlapping ``[start, stop)`` and slices them. Row ``i`` is therefore the same whatever blocking the
caller uses, and does not depend on ``n_rows``.
"""

from __future__ import annotations

import functools
import math
import numbers
from dataclasses import dataclass
from typing import Any

import numpy as np

from dufs.errors import ParameterError
from dufs.kernels.synthetic import fill_power_law_rows, row_dot_sparse_weights

__all__ = ["CHUNK_ROWS", "GENERATOR", "SyntheticSpec", "generate_rows"]

#: Name and version of the generator, recorded in the ground truth; bump it when the rows change.
GENERATOR = "dufs.synthetic v1"
#: Rows per generation chunk (the unit of seeding); part of the output's definition.
CHUNK_ROWS = 4096
#: Standard deviation of the Gaussian noise added to ``x.w + bias`` before taking the sign.
NOISE_STD = 0.1

_MAX_FEATURES = int(np.iinfo(np.int32).max)  # indices are int32
_PILOT_CHUNKS = 4
_TAG_ROWS, _TAG_PILOT, _TAG_MODEL, _TAG_MAP, _TAG_CLUSTERS = 0, 1, 2, 3, 4
_MAX_DRAWS_FACTOR, _MAX_DRAWS_EXTRA = 4, 64
# informative features: expected in [_FREQ_LO, _FREQ_HI] of the rows, ranks below _SKIP_TOP excluded
_FREQ_LO, _FREQ_HI, _FREQ_FALLBACK, _SKIP_TOP = 0.03, 0.5, 0.01, 10
_RANK_SCAN = 100_000  # ranks scanned for frequencies; a rank beyond has per-draw probability < 1e-5
_BALANCE_TOL = 0.05
_SIGN_COUNTS_TRIED = 41
_ATOM_CLEARANCE = 0.5  # keep the threshold off score 0 (rows with no informative feature)

_OWNER = "make_synthetic"


def _fail(name: str, what: str, value: Any, owner: str = _OWNER) -> ParameterError:
    return ParameterError(f"The {name!r} parameter of {owner} must be {what}; got {value!r}.")


def _is_int(v: Any) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_))


def _is_real(v: Any) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, (bool, np.bool_))


def _check_int(name: str, value: Any, lo: int, hi: int | None, what: str,
               owner: str = _OWNER) -> int:
    if not _is_int(value) or value < lo or (hi is not None and value > hi):
        raise _fail(name, what, value, owner)
    return int(value)


# parameter -> (kind, accepts(value, already-validated parameters), description); checked in order
_CONSTRAINTS = {
    "n_rows": (int, lambda v, p: v >= 1, "an int in [1, inf)"),
    "n_features": (int, lambda v, p: 1 <= v <= _MAX_FEATURES, f"an int in [1, {_MAX_FEATURES}]"),
    "nnz_per_row": (int, lambda v, p: 1 <= v <= p["n_features"], "an int in [1, n_features]"),
    "n_informative": (int, lambda v, p: 1 <= v <= p["n_features"], "an int in [1, n_features]"),
    "seed": (int, lambda v, p: v >= 0, "an int in [0, inf)"),
    "zipf_exponent": (float, lambda v, p: math.isfinite(v) and v >= 0.0, "a float in [0, inf)"),
    "label_noise": (float, lambda v, p: 0.0 <= v < 0.5, "a float in [0, 0.5)"),
    "n_clusters": (int, lambda v, p: v == 0 or 2 <= v <= 10_000, "0 (no clusters) or an int in [2, 10000]"),
    "cluster_features": (int, lambda v, p: 1 <= v and (p["n_clusters"] * v + p["n_informative"]
                                                        <= p["n_features"]),
                         "an int >= 1 with n_clusters * cluster_features + n_informative <= n_features"),
    "cluster_nnz": (int, lambda v, p: 1 <= v <= p["cluster_features"], "an int in [1, cluster_features]"),
}


@dataclass(frozen=True)
class SyntheticSpec:
    """A synthetic kddb-like data set (see the module docstring for the model).

    Parameters
    ----------
    n_rows : int
        Rows (samples), >= 1.
    n_features : int
        Features, in ``[1, 2**31 - 1]``.
    nnz_per_row : int, default 30
        Mean nonzeros a row, in ``[1, n_features]`` (kddb: ~30).
    n_informative : int, default 20
        Features the labels depend on, in ``[1, n_features]``.
    seed : int, default 0
        Seed (>= 0) of every random choice.
    zipf_exponent : float, default 1.1
        Exponent ``s`` of the power law of feature frequencies, >= 0 (0: uniform). Around 1 gives
        a few features in most rows and most features in almost none, as in kddb.
    label_noise : float, default 0.05
        Fraction of labels flipped, in ``[0, 0.5)``.
    n_clusters : int, default 0
        With ``K >= 2``, a latent cluster structure: each row belongs to one of K clusters (uniformly), each
        cluster owns ``cluster_features`` features of its own, and a row draws ``cluster_nnz`` more nonzeros
        from its cluster's features. The labels are then the clusters (0 .. K-1), and the ground truth lists
        each cluster's features.
    cluster_features : int, default 20
        Features owned by each cluster.
    cluster_nnz : int, default 5
        Nonzeros a row draws from its cluster's features, in ``[1, cluster_features]``.
    """

    n_rows: int
    n_features: int
    nnz_per_row: int = 30
    n_informative: int = 20
    seed: int = 0
    zipf_exponent: float = 1.1
    label_noise: float = 0.05
    n_clusters: int = 0
    cluster_features: int = 20
    cluster_nnz: int = 5

    def __post_init__(self):
        valid: dict[str, Any] = {}
        for name, (kind, accepts, what) in _CONSTRAINTS.items():
            value = getattr(self, name)
            typed = _is_int(value) if kind is int else _is_real(value)
            if not typed or not accepts(value, valid):
                raise _fail(name, what, value)
            valid[name] = kind(value)
            object.__setattr__(self, name, valid[name])  # plain Python numbers: hashable, JSON

    def ground_truth(self) -> dict:
        """The answer a feature selector should find, JSON-serialisable.

        Returns
        -------
        dict
            ``informative`` (feature ids, ascending), ``weights`` (aligned with them), ``bias``,
            ``noise_std``, ``label_noise``, ``zipf_exponent``, ``nnz_per_row``, ``n_rows``,
            ``n_features``, ``seed``, ``informative_ranks`` (frequency ranks of the informative
            features, aligned), ``rank_to_feature`` (``{"multiplier": a, "offset": c}``: the feature
            id of rank r is ``(a * r + c) % n_features``), ``chunk_rows`` and ``generator``.
        """
        m = _model(self)
        return {
            "generator": GENERATOR,
            "seed": self.seed,
            "n_rows": self.n_rows,
            "n_features": self.n_features,
            "nnz_per_row": self.nnz_per_row,
            "zipf_exponent": self.zipf_exponent,
            "label_noise": self.label_noise,
            "noise_std": NOISE_STD,
            "informative": [int(v) for v in m.ids],
            "weights": [float(v) for v in m.weights],
            "bias": float(m.bias),
            "informative_ranks": [int(v) for v in m.ranks],
            "rank_to_feature": {"multiplier": int(m.mult), "offset": int(m.offset)},
            "chunk_rows": CHUNK_ROWS,
            **({} if not self.n_clusters else {
                "labels": "clusters", "n_clusters": self.n_clusters, "cluster_nnz": self.cluster_nnz,
                "cluster_features": [[int(v) for v in row] for row in _cluster_features(self)]}),
        }


@dataclass(frozen=True)
class _Model:
    one_minus_s: float
    span: float
    log_n1: float
    mult: int
    offset: int
    ranks: np.ndarray  # informative ranks, aligned with ids
    ids: np.ndarray  # informative feature ids, ascending (int64)
    weights: np.ndarray
    bias: float


def _power_law(n: int, s: float) -> tuple[float, float, float]:
    one_minus_s = 1.0 - s
    if abs(one_minus_s) < 1e-12:
        one_minus_s = 0.0
    log_n1 = math.log(n + 1.0)
    span = math.expm1(one_minus_s * log_n1)  # (n + 1)**(1 - s) - 1
    return one_minus_s, span, log_n1


def _rank_cdf(x: np.ndarray, one_minus_s: float, span: float, log_n1: float) -> np.ndarray:
    """P(X < x) of the continuous power law on [1, n + 1)."""
    if one_minus_s == 0.0:
        return np.log(x) / log_n1
    return np.expm1(one_minus_s * np.log(x)) / span


def _rank_to_feature_map(spec: SyntheticSpec) -> tuple[int, int]:
    n = spec.n_features
    if n == 1:
        return 1, 0
    rng = np.random.default_rng(np.random.SeedSequence(spec.seed, spawn_key=(_TAG_MAP,)))
    mult = int(rng.integers(1, n))
    while math.gcd(mult, n) != 1:
        mult = mult % (n - 1) + 1
    return mult, int(rng.integers(0, n))


def _choose_informative_ranks(spec: SyntheticSpec, power: tuple[float, float, float],
                              rng: np.random.Generator) -> np.ndarray:
    n, k = spec.n_features, spec.n_informative
    r = np.arange(min(n, _RANK_SCAN), dtype=np.float64)
    p = _rank_cdf(r + 2.0, *power) - _rank_cdf(r + 1.0, *power)  # per-draw probability of rank r
    p = np.clip(p, 0.0, 1.0 - 1e-16)
    freq = -np.expm1(spec.nnz_per_row * np.log1p(-p))  # P(rank r in a row), roughly
    skip = min(_SKIP_TOP, n - k)
    ranks = np.arange(r.size)
    band = (freq >= _FREQ_LO) & (freq <= _FREQ_HI)
    for ok in (band & (ranks >= skip), band, (freq >= _FREQ_FALLBACK) & (ranks >= skip)):
        cand = ranks[ok]
        if cand.size >= k:
            break
    else:
        cand = np.arange(skip, skip + k)  # the most frequent ranks after the top ones
    return np.sort(rng.choice(cand, size=k, replace=False)).astype(np.int64)


def _split(scores: np.ndarray) -> tuple[float, float, bool]:
    """``(bias, imbalance, clear)`` of the best threshold for ``scores``.

    The imbalance is ``|P(score + bias > 0) - 1/2|``. The threshold is in the widest gap between
    scores among the splits of imbalance at most ``_BALANCE_TOL`` and at least ``_ATOM_CLEARANCE``
    away from 0 (``clear``), else among the splits of imbalance at most ``_BALANCE_TOL``, else the
    most balanced split.
    """
    s = np.sort(scores)
    u = np.unique(s)
    if u.size == 1:
        return float(-u[0]), 0.5, False
    mids = 0.5 * (u[:-1] + u[1:])
    dev = np.abs(0.5 - np.searchsorted(s, mids, side="right") / s.size)
    balanced = dev <= _BALANCE_TOL
    clear = np.abs(mids) >= _ATOM_CLEARANCE
    ok = np.flatnonzero(balanced & clear)
    if not ok.size:
        ok = np.flatnonzero(balanced)
    best = ok[np.argmax(np.diff(u)[ok])] if ok.size else int(np.argmin(dev))
    return float(-mids[best]), float(dev[best]), bool(clear[best])


def _choose_signs_and_bias(pilot, ids: np.ndarray, magnitudes: np.ndarray, perm: np.ndarray):
    """Weights (the features ``perm[:n_pos]`` positive) and bias balancing the pilot's classes.

    ``n_pos`` is the count closest to half of the features (of the ``_SIGN_COUNTS_TRIED`` closest)
    whose split (:func:`_split`) is balanced and clear of 0, else balanced, else the most balanced.
    """
    k = magnitudes.size
    best, best_key = None, None
    counts = sorted(range(k + 1), key=lambda v: (abs(2 * v - k), v))[:_SIGN_COUNTS_TRIED]
    for n_pos in counts:
        signs = -np.ones(k)
        signs[perm[:n_pos]] = 1.0
        weights = signs * magnitudes
        scores = np.concatenate([row_dot_sparse_weights(ip, ix, ids, weights) for ip, ix in pilot])
        bias, dev, clear = _split(scores)
        key = (dev > _BALANCE_TOL, not clear, dev if dev > _BALANCE_TOL else 0.0)
        if best_key is None or key < best_key:
            best, best_key = (weights, bias), key
        if best_key[:2] == (False, False):
            break
    return best


@functools.lru_cache(maxsize=64)
def _model(spec: SyntheticSpec) -> _Model:
    power = _power_law(spec.n_features, spec.zipf_exponent)
    mult, offset = _rank_to_feature_map(spec)
    rng = np.random.default_rng(np.random.SeedSequence(spec.seed, spawn_key=(_TAG_MODEL,)))
    ranks = _choose_informative_ranks(spec, power, rng)
    ids = (mult * ranks + offset) % spec.n_features
    magnitudes = rng.uniform(1.0, 2.0, size=ranks.size)
    perm = rng.permutation(ranks.size)
    order = np.argsort(ids)
    ranks, ids, magnitudes = ranks[order], ids[order], magnitudes[order]
    perm = np.argsort(order)[perm]  # the same random order, in the new positions
    pilot = [_chunk_rows(spec, power, mult, offset, _TAG_PILOT, c)[:2]
             for c in range(_PILOT_CHUNKS)]
    weights, bias = _choose_signs_and_bias(pilot, ids, magnitudes, perm)
    return _Model(*power, mult, offset, ranks, ids, weights, bias)


def _chunk_rows(spec: SyntheticSpec, power, mult: int, offset: int, tag: int, chunk: int):
    """CSR rows of one generation chunk, and its per-row label noise and flip uniforms."""
    rng = np.random.default_rng(np.random.SeedSequence(spec.seed, spawn_key=(tag, chunk)))
    counts = 1 + rng.poisson(spec.nnz_per_row - 1, size=CHUNK_ROWS)
    np.minimum(counts, spec.n_features, out=counts)
    counts = counts.astype(np.int64)
    noise = rng.standard_normal(CHUNK_ROWS)
    flip_u = rng.random(CHUNK_ROWS)
    indptr = np.zeros(CHUNK_ROWS + 1, dtype=np.int64)
    indices = np.empty(int(counts.sum()), dtype=np.int32)
    row = 0
    while row < CHUNK_ROWS:
        need = int(counts[row:].sum())
        size = max(need + need // 4 + 256, _MAX_DRAWS_FACTOR * int(counts[row]) + _MAX_DRAWS_EXTRA)
        pool = rng.random(size)
        row = fill_power_law_rows(counts, pool, row, indptr, indices, spec.n_features, *power,
                                  mult, offset, _MAX_DRAWS_FACTOR, _MAX_DRAWS_EXTRA)
    return indptr, indices[: indptr[-1]], noise, flip_u


def _chunk(spec: SyntheticSpec, chunk: int):
    m = _model(spec)
    power = (m.one_minus_s, m.span, m.log_n1)
    indptr, indices, noise, flip_u = _chunk_rows(spec, power, m.mult, m.offset, _TAG_ROWS, chunk)
    score = row_dot_sparse_weights(indptr, indices, m.ids, m.weights)
    y = np.where(score + m.bias + NOISE_STD * noise > 0.0, 1.0, -1.0)
    y[flip_u < spec.label_noise] *= -1.0
    if spec.n_clusters:
        c, indptr, indices = _add_clusters(spec, chunk, indptr, indices)
        y = c.astype(np.float64)
    return indptr, indices, y


@functools.lru_cache(maxsize=64)
def _cluster_features(spec: SyntheticSpec) -> np.ndarray:
    """Each cluster's own features (n_clusters x cluster_features, ascending in each row), none of them
    informative."""
    rng = np.random.default_rng(np.random.SeedSequence(spec.seed, spawn_key=(_TAG_CLUSTERS,)))
    taken = set(int(v) for v in _model(spec).ids)
    need = spec.n_clusters * spec.cluster_features
    out: list[int] = []
    while len(out) < need:
        for v in rng.choice(spec.n_features, size=min(spec.n_features, 2 * (need - len(out)) + 16), replace=False):
            if int(v) not in taken:
                taken.add(int(v))
                out.append(int(v))
                if len(out) == need:
                    break
    return np.sort(np.array(out, dtype=np.int64).reshape(spec.n_clusters, spec.cluster_features), axis=1)


def _add_clusters(spec: SyntheticSpec, chunk: int, indptr: np.ndarray, indices: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each row's cluster, and its rows with ``cluster_nnz`` features of its cluster merged in (ids sorted)."""
    rng = np.random.default_rng(np.random.SeedSequence(spec.seed, spawn_key=(_TAG_CLUSTERS, chunk)))
    rows = indptr.shape[0] - 1
    c = rng.integers(0, spec.n_clusters, size=rows)
    pos = np.argsort(rng.random((rows, spec.cluster_features)), axis=1)[:, :spec.cluster_nnz]
    extra = _cluster_features(spec)[c[:, None], pos].ravel()
    r = np.concatenate([np.repeat(np.arange(rows), np.diff(indptr)), np.repeat(np.arange(rows), spec.cluster_nnz)])
    f = np.concatenate([indices.astype(np.int64), extra])
    key = np.unique(r * np.int64(spec.n_features) + f)
    r, f = np.divmod(key, np.int64(spec.n_features))
    new_ptr = np.zeros(rows + 1, dtype=np.int64)
    np.cumsum(np.bincount(r, minlength=rows), out=new_ptr[1:])
    return c, new_ptr, f.astype(np.int32)


def generate_rows(spec: SyntheticSpec, start: int, stop: int
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Rows ``[start, stop)`` of the data set ``spec`` as CSR buffers and labels.

    The same rows whatever blocking the caller uses: concatenating the outputs for ``[0, a)`` and
    ``[a, b)`` gives the output for ``[0, b)``.

    Parameters
    ----------
    spec : SyntheticSpec
    start, stop : int
        ``0 <= start <= stop <= spec.n_rows``.

    Returns
    -------
    indptr : int64 array (stop - start + 1,)
        Starts at 0.
    indices : int32 array (nnz,)
        Feature ids, strictly ascending within each row.
    data : float32 array (nnz,)
        All 1.0.
    y : float64 array (stop - start,)
        Labels in {-1.0, +1.0}.
    """
    if not isinstance(spec, SyntheticSpec):
        raise _fail("spec", "a SyntheticSpec", spec, "generate_rows")
    start = _check_int("start", start, 0, spec.n_rows, "an int in [0, n_rows]", "generate_rows")
    stop = _check_int("stop", stop, start, spec.n_rows, "an int in [start, n_rows]",
                      "generate_rows")
    indptrs, parts, ys = [], [], []
    nnz = 0
    for c in range(start // CHUNK_ROWS, -(-stop // CHUNK_ROWS)):
        ip, ix, y = _chunk(spec, c)
        lo = max(start - c * CHUNK_ROWS, 0)
        hi = min(stop - c * CHUNK_ROWS, CHUNK_ROWS)
        indptrs.append(ip[lo + 1: hi + 1] - ip[lo] + nnz)
        parts.append(ix[ip[lo]: ip[hi]])
        ys.append(y[lo:hi])
        nnz += int(ip[hi] - ip[lo])
    indptr = np.concatenate([np.zeros(1, dtype=np.int64), *indptrs])
    indices = np.concatenate(parts) if parts else np.empty(0, dtype=np.int32)
    y = np.concatenate(ys) if ys else np.empty(0, dtype=np.float64)
    return indptr, indices, np.ones(indices.size, dtype=np.float32), y


# ---------------------------------------------------------------------------------------------------------------
# Clustered sparse counts of other designs, held in memory (the recovery benchmark's data, ``dufs bench recovery``)
# ---------------------------------------------------------------------------------------------------------------

__all__ += ["make_signature_counts", "make_topic_documents"]


def _cluster_sizes(n_rows: int, n_clusters: int, size_ratio: float) -> np.ndarray:
    """Cluster sizes in geometric progression from largest to smallest (largest / smallest ~ ``size_ratio``),
    summing to ``n_rows``, each at least 1."""
    w = size_ratio ** (-np.arange(n_clusters) / max(n_clusters - 1, 1))
    sizes = np.maximum(np.floor(n_rows * w / w.sum()).astype(np.int64), 1)
    sizes[0] += n_rows - int(sizes.sum())
    return sizes


def _check_clustered(owner: str, n_rows: Any, n_features: Any, n_clusters: Any, per_cluster: Any,
                     size_ratio: Any, seed: Any) -> None:
    _check_int("n_clusters", n_clusters, 2, 10_000, "an int in [2, 10000]", owner)
    _check_int("n_rows", n_rows, n_clusters, None, "an int >= n_clusters", owner)
    _check_int(per_cluster[0], per_cluster[1], 1, None, "an int >= 1", owner)
    _check_int("n_features", n_features, 2 * n_clusters * per_cluster[1], _MAX_FEATURES,
               f"an int >= 2 * n_clusters * {per_cluster[0]}", owner)
    _check_int("seed", seed, 0, None, "an int in [0, inf)", owner)
    if not _is_real(size_ratio) or not size_ratio >= 1.0 or not math.isfinite(size_ratio):
        raise _fail("size_ratio", "a float in [1, inf)", size_ratio, owner)


def _zipf_sampler(n_features: int, s: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """The background's cumulative word probabilities by rank (p ~ (rank + 1)**-s) and the rank -> feature id map
    (a random permutation)."""
    p = (np.arange(n_features) + 1.0) ** -s
    return np.cumsum(p / p.sum()), rng.permutation(n_features)


def _draw(cdf: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
    return np.minimum(np.searchsorted(cdf, rng.random(size) * cdf[-1], side="right"), cdf.size - 1)


def _planted_ids(n_clusters: int, per: int, perm: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Each cluster's planted features (n_clusters x per, ascending in each row): distinct, taken among the words
    outside the background's top 1% (so that no planted word is also a frequent background word)."""
    d = perm.size
    top = min(max(d // 100, 1), d - n_clusters * per)
    ids = perm[top + rng.choice(d - top, size=n_clusters * per, replace=False)]
    return np.sort(ids.reshape(n_clusters, per), axis=1).astype(np.int64)


def _to_csr(rows: np.ndarray, cols: np.ndarray, vals: np.ndarray, shape: tuple[int, int]):
    import scipy.sparse as sp

    X = sp.coo_matrix((vals.astype(np.float64), (rows, cols)), shape=shape).tocsr()
    X.sum_duplicates()
    X.sort_indices()
    return X


def make_signature_counts(n_rows: int, n_features: int, n_clusters: int = 5, *, signature_features: int = 20,
                          signature_rate: float = 0.3, leak: float = 0.1, background_nnz: int = 30,
                          zipf_exponent: float = 1.1, value_sigma: float = 0.75, size_ratio: float = 5.0,
                          seed: int = 0):
    """Sparse counts with clusters of unequal size, each marked by its own signature features (issue 58's data).

    Row i belongs to cluster c_i; the sizes fall geometrically from the largest to the smallest (``size_ratio``
    between them), rows shuffled. Every row draws ``1 + Poisson(background_nnz - 1)`` background words from a Zipf
    law over all features (rank r with probability ~ (r + 1)**-zipf_exponent, ranks mapped to ids by a random
    permutation; a word drawn twice counts twice). Each cluster owns ``signature_features`` features outside the
    background's top 1%: a row holds each of its own cluster's with probability ``signature_rate``, each of another
    cluster's with probability ``leak * signature_rate``. A word's value is its count times a log-normal factor
    (``exp(N(0, value_sigma**2))``), rounded up: positive integers with a heavy tail.

    Returns ``(X, labels, signatures)``: X a float64 ``scipy.sparse.csr_matrix`` (n_rows x n_features), labels the
    clusters (int64, 0 is the largest), signatures the feature ids of each cluster (n_clusters x
    signature_features, ascending in each row). The same seed gives the same data.
    """
    owner = "make_signature_counts"
    _check_clustered(owner, n_rows, n_features, n_clusters, ("signature_features", signature_features),
                     size_ratio, seed)
    _check_int("background_nnz", background_nnz, 1, None, "an int >= 1", owner)
    for name, v in (("signature_rate", signature_rate), ("leak", leak)):
        if not _is_real(v) or not 0.0 <= v <= 1.0:
            raise _fail(name, "a float in [0, 1]", v, owner)
    for name, v in (("zipf_exponent", zipf_exponent), ("value_sigma", value_sigma)):
        if not _is_real(v) or not (math.isfinite(v) and v >= 0.0):
            raise _fail(name, "a float in [0, inf)", v, owner)
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(58, 1)))
    labels = rng.permutation(np.repeat(np.arange(n_clusters), _cluster_sizes(n_rows, n_clusters, size_ratio)))
    cdf, perm = _zipf_sampler(n_features, zipf_exponent, rng)
    sig = _planted_ids(n_clusters, signature_features, perm, rng)
    counts = 1 + rng.poisson(background_nnz - 1, size=n_rows)
    r_bg = np.repeat(np.arange(n_rows), counts)
    c_bg = perm[_draw(cdf, int(counts.sum()), rng)]
    # signatures: P(row i holds feature j of cluster c) = rate if c == c_i else leak * rate
    own = labels[:, None] == np.repeat(np.arange(n_clusters), signature_features)[None, :]
    hit = rng.random(own.shape) < np.where(own, signature_rate, leak * signature_rate)
    r_sig, j_sig = np.nonzero(hit)
    rows = np.concatenate([r_bg, r_sig])
    cols = np.concatenate([c_bg, sig.ravel()[j_sig]])
    X = _to_csr(rows, cols, np.ones(rows.size), (n_rows, n_features))
    X.data = np.ceil(X.data * np.exp(value_sigma * rng.standard_normal(X.data.size)))
    return X, labels.astype(np.int64), sig


def make_topic_documents(n_rows: int, n_features: int, n_clusters: int = 5, *, topic_words: int = 20,
                         topic_share: float = 0.15, topic_exponent: float = 1.0, mean_length: float = 80.0,
                         length_sigma: float = 0.8, zipf_exponent: float = 1.1, size_ratio: float = 5.0,
                         seed: int = 0):
    """Documents of a topic model: each cluster a distribution over words mixed into a Zipf background.

    Document i belongs to cluster c_i (sizes falling geometrically, ``size_ratio`` from largest to smallest, rows
    shuffled) and has ``1 + floor(LogNormal)`` tokens (mean about ``mean_length``, log-sd ``length_sigma``: short
    and long documents). Each token is, with probability ``topic_share``, a word of the document's topic, else a
    background word (Zipf law over all features, exponent ``zipf_exponent``, ranks mapped to ids by a random
    permutation). A topic is ``topic_words`` features outside the background's top 1%, weighted by a Zipf law of
    exponent ``topic_exponent`` among themselves (a topic's rarest word is ``topic_words**topic_exponent`` times
    less likely than its first). X holds the word counts.

    Returns ``(X, labels, topics)`` as :func:`make_signature_counts` does, ``topics`` the words of each topic.
    """
    owner = "make_topic_documents"
    _check_clustered(owner, n_rows, n_features, n_clusters, ("topic_words", topic_words), size_ratio, seed)
    if not _is_real(topic_share) or not 0.0 <= topic_share <= 1.0:
        raise _fail("topic_share", "a float in [0, 1]", topic_share, owner)
    for name, v in (("topic_exponent", topic_exponent), ("zipf_exponent", zipf_exponent),
                    ("length_sigma", length_sigma)):
        if not _is_real(v) or not (math.isfinite(v) and v >= 0.0):
            raise _fail(name, "a float in [0, inf)", v, owner)
    if not _is_real(mean_length) or not (math.isfinite(mean_length) and mean_length >= 1.0):
        raise _fail("mean_length", "a float in [1, inf)", mean_length, owner)
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(58, 2)))
    labels = rng.permutation(np.repeat(np.arange(n_clusters), _cluster_sizes(n_rows, n_clusters, size_ratio)))
    cdf, perm = _zipf_sampler(n_features, zipf_exponent, rng)
    topics = _planted_ids(n_clusters, topic_words, perm, rng)
    # each topic's words in a random order of weight (the ids are sorted; the weights must not follow them)
    order = np.argsort(rng.random((n_clusters, topic_words)), axis=1)
    tw = (np.arange(topic_words) + 1.0) ** -topic_exponent
    tcdf = np.cumsum(tw / tw.sum())
    mu = math.log(max(mean_length - 1.0, 1e-9)) - length_sigma ** 2 / 2
    lengths = 1 + np.floor(np.exp(mu + length_sigma * rng.standard_normal(n_rows))).astype(np.int64)
    rows = np.repeat(np.arange(n_rows), lengths)
    in_topic = rng.random(rows.size) < topic_share
    cols = perm[_draw(cdf, rows.size, rng)]
    t_rows = rows[in_topic]
    slot = order[labels[t_rows], _draw(tcdf, t_rows.size, rng)]
    cols[in_topic] = topics[labels[t_rows], slot]
    X = _to_csr(rows, cols, np.ones(rows.size), (n_rows, n_features))
    return X, labels.astype(np.int64), topics
