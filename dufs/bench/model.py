"""The model of an iteration's time on W machines, its parameters fitted to ``dufs bench scale``'s measurements.

T_m(W) = compute + network + driver + scheduler, per method m and iteration (docs/scaling.md, "The model"):

- compute = c_m nnz / (W P T e) + f_m: c_m the seconds a nonzero costs one worker thread in an iteration and f_m
  a fixed cost an iteration (both fitted to one-process runs), P worker processes of T threads a machine, e their
  efficiency when P T share a machine's memory bandwidth;
- network = (bytes into a machine + bytes through the driver) / L, L the link's bytes a second (0 on one machine);
- driver = the driver's CPU seconds, and the seconds of the work on vectors kept on one worker (MMFS's sweeps over
  w: :mod:`dufs.engine.kept`), serial as the driver's is; scheduler = task transitions x the scheduler's CPU
  seconds a transition.

Bytes, driver CPU and tasks are :class:`Formula` s: sums of named terms in n, d, nnz, W, P with coefficients
fitted to the measured W (and store sizes, where measurements of several are pooled). Pure Python, so that the
projection can be recomputed from saved measurements.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

#: the terms a formula sums: counts in n (rows), d (features), nnz, W (machines), P (processes a machine)
TERMS: dict[str, Callable[[float, float, float, float, float], float]] = {
    "1": lambda n, d, z, W, P: 1.0,
    "n": lambda n, d, z, W, P: n,
    "nP": lambda n, d, z, W, P: n * P,  # an n-vector to every process of a machine
    "nWP": lambda n, d, z, W, P: n * W * P,  # an n-vector from every process
    "nlog2W": lambda n, d, z, W, P: n * math.log2(W),
    "n/W": lambda n, d, z, W, P: n / W,  # a piece of the rows a machine
    # a sum over machines in pieces (dufs.engine.exchange): 2 (W - 1) / W partials into the root's machine
    "n2(W-1)/W": lambda n, d, z, W, P: 2.0 * n * (W - 1) / W,
    # the rows a machine's blocks touch, from the other machines' pieces (dufs.engine.touched): at z / n nonzeros
    # a row spread evenly over the features, 1 - (1 - 1/W)^(z/n) of the rows, (W - 1) / W of them elsewhere
    "n touched": lambda n, d, z, W, P: n * (1.0 - (1.0 - 1.0 / W) ** (z / n)) * (W - 1) / W,
    "d": lambda n, d, z, W, P: d,
    "d/W": lambda n, d, z, W, P: d / W,
    "nnz/W": lambda n, d, z, W, P: z / W,
    "nnz": lambda n, d, z, W, P: z,
    "WP": lambda n, d, z, W, P: W * P,
}


@dataclass(frozen=True)
class Size:
    """A data set's shape: rows, features, nonzeros."""

    name: str
    n: float
    d: float
    nnz: float


KDDB = Size("kddb", 19_264_097, 29_890_095, 566_345_888)
KDDB10 = Size("10x kddb", 192_640_970, 298_900_950, 5_663_458_880)

#: each method's formula shapes, terms in the order they are fitted (fewer measured W than terms: the first ones)
SHAPES: dict[str, dict[str, tuple[str, ...]]] = {
    "fisher": {"machine_in": ("nnz/W", "n", "WP"), "driver_bytes": ("d", "WP", "1"), "driver_cpu": ("d", "1", "WP")},
    # a vector every worker reads goes to each machine once (one copy a machine), whatever P
    "mmfs": {"machine_in": ("n", "WP", "1"), "driver_bytes": ("n", "WP", "1"), "driver_cpu": ("n", "1", "WP")},
    "lapaofs": {"machine_in": ("n", "WP", "1"), "driver_bytes": ("n", "WP", "1"), "driver_cpu": ("n", "1", "WP")},
    "lapdofs": {"machine_in": ("n", "WP", "1"), "driver_bytes": ("n", "WP", "1"), "driver_cpu": ("n", "1", "WP")},
    "jcfs": {"machine_in": ("n", "WP", "1"), "driver_bytes": ("n", "WP", "1"), "driver_cpu": ("n", "1", "WP")},
    # R to each machine once, the partial scores summed within a machine and then over the machines in pieces,
    # peer to peer (2 (W - 1) / W of a partial into the root's machine; a tree took log2 W)
    "m3fs": {"machine_in": ("n", "n2(W-1)/W", "1"), "driver_bytes": ("n", "WP", "1"), "driver_cpu": ("n", "1", "WP")},
    # Y, the labels and the PCA start's n x block array kept on a worker: the driver's bytes and CPU are W's, Q's
    # and the PCA block's, over the features
    "ufcm": {"machine_in": ("n", "nnz/W", "1"), "driver_bytes": ("d", "WP", "1"), "driver_cpu": ("d", "1", "WP")},
}
TASKS = ("1", "WP")
KEPT = ("n",)  # the sweeps over vectors kept on one worker: a cost a sample
#: the methods whose work over the samples is in a piece of the rows a machine (dufs.methods.greedy.pieces,
#: dufs.methods.m3fs.piece_scores, dufs.methods.ufcm.pieces): the slowest piece's seconds, a cost a sample of its
#: n / W and a fixed one
KEPT_PIECES = {"lapaofs": ("n/W", "1"), "lapdofs": ("n/W", "1"), "jcfs": ("n/W", "1"), "m3fs": ("n/W", "1"),
               "ufcm": ("n/W", "1")}
#: the methods whose vector a pass reads is sent from those pieces as the rows each machine touches
#: (``dufs.engine.touched-rows``): its bytes into a machine then
TOUCHED = {"lapaofs": ("n touched", "WP", "1"), "lapdofs": ("n touched", "WP", "1"),
           "jcfs": ("n touched", "WP", "1"),
           # R, and the partial scores' pieces of the reduce-scatter, both at the machine's touched rows
           "m3fs": ("n touched", "1")}
#: their driver's CPU an iteration then: a fixed cost and one a worker (the blocks' proposals, a task a piece),
#: nothing over the samples (its iterations hand it scalars; M3FS's alternation works over the samples between
#: v-steps, not in the median iteration), where a term in n fitted to the noise between two store sizes was
#: projected to 10x kddb as real
PIECES_DRIVER_CPU = ("1", "WP")
#: the methods whose vectors over the features are in a piece a worker beside the blocks (UFCM's W and Q,
#: dufs.methods.ufcm.features): the driver's bytes and CPU an iteration then have no term in d
FEATURE_PIECES: dict[str, dict[str, tuple[str, ...]]] = {"ufcm": {"driver_bytes": ("WP", "1"),
                                                                   "driver_cpu": PIECES_DRIVER_CPU}}
COMPUTE = ("nnz", "1")  # one process's compute seconds an iteration: a cost a nonzero and a fixed one

#: the driver's resident bytes: (bytes a row, a feature, a row per partition, what they are), read from the code
#: with 2 clusters, 2 components (UFCM), a 16-dimensional anchor embedding (M3FS), as the scale bench runs them
DRIVER_MEMORY: dict[str, tuple[float, float, float, str]] = {
    # the partitions' partial scores are summed as they arrive, not held together (the measured growth does not
    # rise with the partitions), so no term in n K
    # on workers of several machines a v-step's iterates' scores are kept on a worker (m3fs.kept_scores): the
    # alternation still holds its labels and scores between v-steps
    "m3fs": (8 * (7 + 16), 8 * (10 + 6), 0.0, "seven n-vectors (the alternation's labels, y, F and L F, a v-step's "
             "start's scores and L F, L 1) and the n x 16 anchor embedding; ten d-vectors (sigma, V, the v-step's "
             "start and weights); the column statistics (six d-vectors, dufs.engine.ColumnStats)"),
    # on workers of several machines W and Q in pieces beside the blocks (ufcm.features), the PCA start's block
    # too, Y and the labels in pieces of rows (ufcm.pieces), each piece making its features' means: on
    # unstandardized data (sparse data's default) the driver holds the result alone, the labels as int32 and the
    # scores (standardized, it holds the column statistics too, six d-vectors, and the transform)
    "ufcm": (4, 8, 0.0, "the labels (int32) and the scores (the result); no column statistics on unstandardized "
             "data (the pieces make their means; Matrix.nonnegative)"),
}
MEMORY_LIMIT = 4e9  # bytes: the driver's resident memory M3FS and UFCM must stay under at 10x kddb


@dataclass
class Formula:
    """sum_i coefs[i] * TERMS[terms[i]](n, d, nnz, W, P)."""

    terms: tuple[str, ...]
    coefs: tuple[float, ...]

    def __call__(self, n: float, d: float, nnz: float, W: float, P: float) -> float:
        return sum(c * TERMS[t](n, d, nnz, W, P) for t, c in zip(self.terms, self.coefs, strict=True))

    def __str__(self) -> str:
        return " + ".join(f"{c:.4g} {t}" for t, c in zip(self.terms, self.coefs, strict=True)) or "0"


def _solve(a: list[list[float]], b: list[float]) -> list[float]:
    """x with a x = b (Gaussian elimination with partial pivoting; a small and square); ZeroDivisionError where
    a pivot falls below 1e-9 of its column's scale (the terms cannot be told apart on the points)."""
    m = len(b)
    scale = [max(abs(r[i]) for r in a) or 1.0 for i in range(m)]
    rows = [[x / s for x, s in zip(r, scale, strict=True)] + [v] for r, v in zip(a, b, strict=True)]
    for i in range(m):
        p = max(range(i, m), key=lambda r: abs(rows[r][i]))
        rows[i], rows[p] = rows[p], rows[i]
        if abs(rows[i][i]) < 1e-9 * max(1.0, *(abs(r[i]) for r in rows)):
            raise ZeroDivisionError("singular system")
        for r in range(m):
            if r != i:
                f = rows[r][i] / rows[i][i]
                rows[r] = [x - f * y for x, y in zip(rows[r], rows[i], strict=True)]
    return [rows[i][m] / rows[i][i] / scale[i] for i in range(m)]


def _lsq(use: list[str], points: list[tuple[tuple, float]]) -> list[float]:
    cols = [[TERMS[t](*x) for t in use] for x, _ in points]
    ata = [[sum(r[i] * r[j] for r in cols) for j in range(len(use))] for i in range(len(use))]
    atb = [sum(r[i] * v for r, (_, v) in zip(cols, points, strict=True)) for i in range(len(use))]
    return _solve(ata, atb)


def fit(terms: tuple[str, ...], points: list[tuple[tuple, float]]) -> Formula:
    """The least-squares non-negative coefficients of ``terms`` for ``points`` ((n, d, nnz, W, P), value): the
    terms taken in order, as many as there are points at most, leaving out any the points cannot tell from those
    taken (all at one n: "n" and "1"); a term whose coefficient comes out negative is dropped and the rest refitted."""
    use: list[str] = []
    for t in terms:
        if len(use) == len(points):
            break
        try:
            _lsq([*use, t], points)
            use.append(t)
        except ZeroDivisionError:
            continue
    while use:
        c = _lsq(use, points)
        top = max(abs(v) for _, v in points) or 1.0
        # a coefficient whose term adds under 1e-6 of the values at every point: rounding, 0
        c = [0.0 if max(abs(x * TERMS[t](*q)) for q, _ in points) < 1e-6 * top else x for t, x in zip(use, c,
                                                                                                  strict=True)]
        if min(c) >= 0:
            return Formula(tuple(use), tuple(c))
        use.pop(min(range(len(c)), key=c.__getitem__))
    return Formula((), ())


@dataclass
class MethodModel:
    """One method's fitted parameters: ``c_nz`` (s a nonzero an iteration, one process), ``c_fixed`` (s an
    iteration whatever the size) and the formulas."""

    c_nz: float
    c_fixed: float
    machine_in: Formula
    driver_bytes: Formula
    driver_cpu: Formula
    tasks: Formula
    kept: Formula = field(default_factory=lambda: Formula((), ()))


@dataclass
class Params:
    """The model's parameters: P processes a machine of T threads each, the link's bytes a second, the threads'
    efficiency, the scheduler's CPU seconds a task transition, and each method's fitted :class:`MethodModel`."""

    P: int = 16
    T: int = 1
    link: float = 1.25e9
    efficiency: float = 0.5
    t_task: float = 0.0
    methods: dict[str, MethodModel] = field(default_factory=dict)


@dataclass
class Projection:
    """An iteration's projected seconds, by term."""

    compute: float
    network: float
    driver: float
    scheduler: float

    @property
    def total(self) -> float:
        return self.compute + self.network + self.driver + self.scheduler


def project(params: Params, method: str, n: float, d: float, nnz: float, W: int) -> Projection:
    """The seconds of an iteration of ``method`` on ``W`` machines for an n x d matrix of nnz nonzeros."""
    m, P = params.methods[method], params.P
    x = (n, d, nnz, W, P)
    network = 0.0 if W == 1 else (m.machine_in(*x) + m.driver_bytes(*x)) / params.link
    return Projection(compute=m.c_nz * nnz / (W * P * params.T * params.efficiency) + m.c_fixed, network=network,
                      driver=m.driver_cpu(*x) + m.kept(*x), scheduler=m.tasks(*x) * params.t_task)


def driver_memory(method: str, n: float, d: float, partitions: float) -> float | None:
    """The driver's resident bytes for ``method`` (:data:`DRIVER_MEMORY`), None where not modelled."""
    if method not in DRIVER_MEMORY:
        return None
    a, b, c, _ = DRIVER_MEMORY[method]
    return a * n + b * d + c * n * partitions


def mmfs_rounds(K: float) -> float:
    """MMFS's rounds at K partitions: a least-squares fit r = a + b log2 K to the rounds measured at 1M rows
    (12, 54, 73 at K = 1, 2, 8); a trend, not a law."""
    xs, ys = [0.0, 1.0, 3.0], [12.0, 54.0, 73.0]
    mx, my = sum(xs) / 3, sum(ys) / 3
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    return my - b * mx + b * math.log2(max(K, 1.0))


def targets(params: Params, method: str) -> dict[str, Any]:
    """Issue 57's targets for ``method``: weak scaling (10x kddb on 10 machines within 1.5x kddb on one), strong
    scaling (kddb 4x faster on 64 machines than on one, or within 80% of the links' bound: compute / 64 plus
    2 x 8 (n + d) / 64 bytes a machine over the link), and the driver's memory at 10x kddb under 4 GB (M3FS,
    UFCM)."""
    k = KDDB
    t1 = project(params, method, k.n, k.d, k.nnz, 1).total
    t64 = project(params, method, k.n, k.d, k.nnz, 64).total
    weak = project(params, method, KDDB10.n, KDDB10.d, KDDB10.nnz, 10).total / t1
    bound = project(params, method, k.n, k.d, k.nnz, 64).compute + 2 * 8 * (k.n + k.d) / 64 / params.link
    speedup, bound_speedup = t1 / t64, t1 / bound
    strong_ok = speedup >= 4 or (bound_speedup < 4 and speedup >= 0.8 * bound_speedup)
    mem = driver_memory(method, KDDB10.n, KDDB10.d, 10 * params.P)
    out = {"weak": weak, "weak_pass": weak <= 1.5, "speedup": speedup, "bound_speedup": bound_speedup,
           "strong_pass": strong_ok, "memory": mem}
    if method in ("m3fs", "ufcm"):
        out["memory_pass"] = mem is not None and mem < MEMORY_LIMIT
    return out


def _points(datas: list[dict], method: str, key: str, runs: str = "runs") -> list[tuple[tuple, float]]:
    """(n, d, nnz, W, P) and the measured ``key`` of ``method``'s runs in every data set."""
    return [((float(x["n_rows"]), float(x["n_features"]), float(x["nnz"]), r["machines"], r["procs"]),
             float(r.get(key, 0.0))) for x in datas for r in x.get(runs, [])
            if r["method"] == method and math.isfinite(float(r.get(key, 0.0)))]


def _compute_points(datas: list[dict], method: str) -> list[tuple[tuple, float]]:
    """One process's compute seconds an iteration: its wall less the driver's and the scheduler's CPU."""
    return [(x, max(0.0, v - c - s)) for (x, v), (_, c), (_, s) in zip(
        _points(datas, method, "wall", "compute"), _points(datas, method, "cpu", "compute"),
        _points(datas, method, "sched_cpu", "compute"), strict=True)]


def _in_pieces(datas: list[dict], method: str, kinds: Any = None) -> bool:
    """Whether ``method``'s work over the samples (or, with ``kinds`` = :data:`FEATURE_PIECES`, over the features)
    ran in pieces in the runs measured (not where ``dufs.engine.side-pieces`` was off)."""
    return method in (KEPT_PIECES if kinds is None else kinds) and all(
        str(r.get("side_pieces", "auto")).lower() not in ("off", "false", "no")
        for x in datas for r in x["runs"] if r["method"] == method)


def _touched(datas: list[dict], method: str) -> bool:
    """Whether ``method``'s vector went to the machines as the rows they touch in the runs measured."""
    return method in TOUCHED and all(str(r.get("touched_rows", "off")).lower() not in ("off", "false", "no")
                                     for x in datas for r in x["runs"] if r["method"] == method)


def fit_params(datas: list[dict], *, P: int = 16, T: int = 1, link: float = 1.25e9, efficiency: float = 0.5
               ) -> Params:
    """The parameters from scale benches' measurements (each data set: the store's n, d, nnz, the ``runs`` on W
    machines and the one-process ``compute`` runs, medians of an iteration each), pooled over the data sets."""
    # the scheduler's CPU a transition: over the iterative methods' iterations (Fisher's one pass holds its graph's
    # submission too), on W machines and on one process
    runs = [r for x in datas for r in x["runs"] + x.get("compute", [])
            if r["method"] != "fisher" and math.isfinite(float(r["sched_cpu"]))]
    trans, sched = sum(float(r["transitions"]) for r in runs), sum(float(r["sched_cpu"]) for r in runs)
    params = Params(P=P, T=T, link=link, efficiency=efficiency, t_task=sched / trans if trans > 0 else 0.0)
    for m in sorted({r["method"] for x in datas for r in x["runs"]}, key=list(SHAPES).index):
        shape = {**SHAPES[m], **(FEATURE_PIECES[m] if _in_pieces(datas, m, FEATURE_PIECES) else {})}
        if _in_pieces(datas, m) and _touched(datas, m):
            shape["machine_in"] = TOUCHED[m]
        comp = fit(COMPUTE, _compute_points(datas, m))
        coef = dict(zip(comp.terms, comp.coefs, strict=True))
        params.methods[m] = MethodModel(
            c_nz=coef.get("nnz", 0.0), c_fixed=coef.get("1", 0.0),
            machine_in=fit(shape["machine_in"], _points(datas, m, "machine_in")),
            driver_bytes=fit(shape["driver_bytes"], _points(datas, m, "driver")),
            driver_cpu=fit(PIECES_DRIVER_CPU if _in_pieces(datas, m) or _in_pieces(datas, m, FEATURE_PIECES)
                           else shape["driver_cpu"],
                           _points(datas, m, "cpu")),
            tasks=fit(TASKS, _points(datas, m, "transitions")),
            kept=fit(KEPT_PIECES[m] if _in_pieces(datas, m) else KEPT, _points(datas, m, "kept")))
    return params


def _say_fit(datas: list[dict], params: Params, say: Callable[[str], None]) -> None:
    """Each method's formulas beside the measurements they were fitted to: measured, formula, their ratio."""
    say(f"model parameters (P = {params.P} processes a machine of T = {params.T} threads, links "
        f"{params.link * 8 / 1e9:g} Gbit/s, efficiency "
        f"{params.efficiency:g}): the scheduler {params.t_task * 1e6:,.1f} us of CPU a task transition (its CPU over "
        f"its transitions, the iterative methods' measured iterations); measured vs formula (ratio) at each store "
        f"n x d and W")

    def cells(pts: list, f: Any, unit: str, scale: float) -> str:
        return "; ".join(f"{x[0]:,.0f}x{x[1]:,.0f} W={x[3]}: {v / scale:,.3f} vs {f(*x) / scale:,.3f}{unit} "
                         f"({v / f(*x) if f(*x) else float('nan'):.2f})" for x, v in pts)

    for m, mm in params.methods.items():
        comp = Formula(("nnz", "1"), (mm.c_nz, mm.c_fixed))
        say(f"  {m}: compute on one process = {mm.c_nz * 1e9:,.2f} ns nnz + {mm.c_fixed:.4f} s (its wall less the "
            f"driver's and the scheduler's CPU): {cells(_compute_points(datas, m), comp, ' s', 1.0)}")
        for key, f, unit, scale in (("machine_in", mm.machine_in, " MiB", 2**20), ("driver", mm.driver_bytes, " MiB",
                                    2**20), ("cpu", mm.driver_cpu, " s", 1.0), ("transitions", mm.tasks, "", 1.0),
                                    ("kept", mm.kept, " s", 1.0)):
            pts = _points(datas, m, key)
            if key == "kept" and not any(v for _, v in pts):  # no vector kept on a worker
                continue
            exact = " (as many terms as points: exact)" if len(f.terms) == len(pts) > 1 else ""
            say(f"    {key:11s} = {f}{exact}: {cells(pts, f, unit, scale)}")


def report(datas: list[dict], params: Params, say: Callable[[str], None] = print) -> dict:
    """Print the fitted parameters with what they rest on, and per method the projected iteration at W = 1, 8, 16,
    64 (kddb) and 1, 10 (10x kddb) by term, the targets with PASS/MISS, the driver's memory; return the targets."""
    _say_fit(datas, params, say)
    out = {}
    for m in params.methods:
        what = {"mmfs": "a round (rounds not modelled)", "fisher": "its pass"}.get(m, "an iteration")
        say(f"{m}: {what}, projected seconds (compute + network + driver + scheduler = total)")
        for size, ws in ((KDDB, (1, 8, 16, 64)), (KDDB10, (1, 10))):
            for W in ws:
                p = project(params, m, size.n, size.d, size.nnz, W)
                say(f"  {size.name:8s} W={W:<3d} {p.compute:9.3f} + {p.network:8.3f} + {p.driver:7.3f} + "
                    f"{p.scheduler:6.3f} = {p.total:9.3f} s")
        if m == "fisher":
            say("  one pass (the fit, persisting the blocks): not an iteration, the targets are the iterative methods'")
            continue
        t = out[m] = targets(params, m)
        mark = {True: "PASS", False: "MISS"}
        line = (f"  weak: 10x kddb on 10 / kddb on 1 = {t['weak']:.2f} (<= 1.5: {mark[t['weak_pass']]}); strong: "
                f"kddb 64 vs 1 machine {t['speedup']:.2f}x, the links' bound {t['bound_speedup']:.2f}x "
                f"({mark[t['strong_pass']]})")
        if t["memory"] is not None:
            line += f"; driver memory at 10x kddb {t['memory'] / 1e9:,.1f} GB"
            if "memory_pass" in t:
                line += f" (< 4 GB: {mark[t['memory_pass']]})"
        say(line)
        if m == "mmfs":
            say(f"  rounds (log fit to 12, 54, 73 at K = 1, 2, 8; not in T): {mmfs_rounds(params.P):.0f} at W=1, "
                f"{mmfs_rounds(64 * params.P):.0f} at W=64")
    _say_memory(datas, say)
    return out


def _say_memory(datas: list[dict], say: Callable[[str], None]) -> None:
    """The driver-memory formulas beside the driver's peak resident growth measured at the benches' sizes."""
    for m, (a, b, c, what) in DRIVER_MEMORY.items():
        cells = "; ".join(
            f"{float(x['n_rows']):,.0f}x{float(x['n_features']):,.0f} W={r['machines']}: measured "
            f"{float(r['rss_growth']) / 2**20:,.1f} MiB vs formula "
            f"{driver_memory(m, float(x['n_rows']), float(x['n_features']), r['machines'] * r['procs']) / 2**20:,.1f}"
            f" MiB" for x in datas for r in x["runs"] if r["method"] == m and "rss_growth" in r)
        if cells:
            say(f"driver memory {m} = {a:g} n + {b:g} d + {c:g} n K bytes ({what}): {cells}")
