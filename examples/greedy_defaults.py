"""Sweep the parameters of LapAOFS, LapDOFS (He et al., TPAMI 2011) and JCFS (Du & Shen) on real data, to choose
their defaults (issue 12).

Data sets (features selected on the whole set; the greedy order's prefixes give the top-K):

- ``digits1v7``: scikit-learn's digits, classes 1 and 7 (361 x 64), K = 10, 20;
- ``digits``: all ten digit classes, every 2nd sample of each class (899 x 64), K = 10, 20;
- ``iris+noise``: iris (150 x 4, 3 classes) z-scored, with 10 N(0, 1) noise columns (``default_rng(0)``; the
  set of ``tests/test_defaults.py``: every column has variance 1, so only the graph tells real from noise), K = 4;
  the column ``real`` counts the real features among the 4 picked;
- ``breast``: scikit-learn's breast cancer set (569 x 30, 2 classes; features on scales from 1e-3 to 1e3), K = 5;
- ``coil20`` (every 2nd pose of each object: 720 x 1024, 20 classes), ``orl`` (400 x 1024, 40 classes),
  ``isolet`` (every 2nd sample of each letter: 780 x 617, 26 classes), K = 10, 20, 50. ``--full`` keeps every
  sample. From :func:`dufs.data.datasets.load`; where that fails, ``scipy.io.loadmat`` of COIL20.mat, ORL.mat,
  Isolet.mat in ``--data DIR`` (default ``<repository>/../shared/data``).

Metric: k-means with as many clusters as classes on the K selected features, as stored (no rescaling, whatever
the method's ``standardize``), ``dufs.evaluate.kmeans_scores`` (10 runs, the run of lowest inertia scored by
Hungarian-matched accuracy and NMI), averaged over 3 seeds. A cell is ``ACC/NMI`` in percent, each averaged over
the data set's K values; a configuration's score on a data set is the mean of the two, and its rank among all the
rows of its table (baselines included); ``rank`` is the mean rank over the data sets, ``>LS`` the number of data
sets where it beats the Laplacian score with its defaults, ``1v7@10`` the digits 1 vs 7 accuracy with 10 features,
``mean`` the mean score over the data sets (JCFS's defaults, ``standardize="zscore"`` with lambda_ / gamma = 0.01,
are the rows of highest mean: the mean rank rewards small leads on the four image sets, where ``None`` is 1-3
points better, while ``None`` loses 10-19 points on breast cancer, whose features have different scales).

Grid, in two stages per method (rows sorted by mean rank; ``*`` marks the defaults the run found in the code):

- LapAOFS / LapDOFS: standardize (None, "zscore", "scale") x lambda1 (0, 0.001, 0.01, 0.1, 1) x lambda2 (1e-4,
  1e-2, 1) on the binary 4-NN graph; then, for the 3 best (standardize, lambda1) pairs with lambda1 > 0, the
  graph: n_neighbors (4, 5, 10) x weights (binary, heat);
- JCFS: standardize x lambda_ (1e-6, 1e-4, 1e-2) x gamma (1e-4, 1e-2, 1) on the binary 5-NN graph (the
  paper's), n_clusters = the number of classes; then, for the 2 best, select_gamma (the greedy step's ridge, 1e-2,
  1, 2 = Algorithm 1 as printed) and the graph (n_neighbors 10; heat weights);
- baselines in every table: the Laplacian score (``dufs.fit(method="laplacian")``, its defaults, and z-scored),
  max variance, and all features.

The kNN graphs are built once per data set, standardize and graph setting (``dufs.engine.graphs.knn_graph`` on
the transformed rows, the graph ``fit`` would build) and passed as ``W``.

Run: ``python examples/greedy_defaults.py`` (about 4 minutes single-threaded here);
``--quick``: digits 1 vs 7, iris+noise and ORL, a few configurations (about a minute); ``--methods lapaofs,jcfs``,
``--datasets orl,coil20``; ``--json PATH`` writes every score. BLAS and numba run single-threaded unless the
environment says otherwise (``OMP_NUM_THREADS`` and the like).
"""

from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import argparse  # noqa: E402
import inspect  # noqa: E402
import itertools  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import scipy.sparse as sp  # noqa: E402
from _data import DEFAULT_DATA, MAT  # noqa: E402

import dufs  # noqa: E402
from dufs.api import METHODS  # noqa: E402
from dufs.engine.graphs import knn_graph  # noqa: E402
from dufs.evaluate import kmeans_scores  # noqa: E402
from dufs.methods.greedy import lapofs  # noqa: E402
from dufs.methods.jcfs import jcfs  # noqa: E402

SEEDS = (0, 1, 2)
KMEANS_RUNS = 10
STANDARDIZE = (None, "zscore", "scale")
LAMBDA1 = (0.0, 0.001, 0.01, 0.1, 1.0)
LAMBDA2 = (1e-4, 1e-2, 1.0)
JCFS_LAMBDA = (1e-6, 1e-4, 1e-2)
JCFS_GAMMA = (1e-4, 1e-2, 1.0)


# ------------------------------------------------------------------------------------------------ data
def _every_second(y: np.ndarray) -> np.ndarray:
    """Every 2nd sample of each class, in the stored order."""
    keep = np.zeros(len(y), dtype=bool)
    for c in np.unique(y):
        keep[np.flatnonzero(y == c)[::2]] = True
    return keep


def _stored(name: str, data: Path) -> tuple[np.ndarray, np.ndarray]:
    try:
        from dufs.data.datasets import load

        X, y = load(name, sparse=False)
    except Exception as e:  # noqa: BLE001 - any failure: try the .mat file
        import scipy.io

        path = Path(data) / MAT[name]
        print(f"(dufs.data.datasets.load({name!r}) failed: {e}; reading {path})")
        d = scipy.io.loadmat(path)
        X, y = d["X"], d["Y"]
    return np.asarray(X, dtype=np.float64), np.asarray(y).ravel()


def load_sets(names: list[str], data: Path, full: bool) -> dict:
    """name -> (X, y, Ks)."""
    from sklearn.datasets import load_digits, load_iris

    out = {}
    for name in names:
        if name in ("digits1v7", "digits"):
            d = load_digits()
            X, y = d.data.astype(np.float64), d.target
            if name == "digits1v7":
                keep = np.isin(y, [1, 7])
            else:
                keep = np.ones(len(y), dtype=bool) if full else _every_second(y)
            out[name] = (X[keep], y[keep], (10, 20))
        elif name == "breast":
            from sklearn.datasets import load_breast_cancer

            d = load_breast_cancer()
            out[name] = (d.data.astype(np.float64), d.target, (5,))
        elif name == "iris+noise":
            d = load_iris()
            z = (d.data - d.data.mean(axis=0)) / d.data.std(axis=0)
            noise = np.random.default_rng(0).standard_normal((len(d.target), 10))
            out[name] = (np.hstack([z, noise]), d.target, (4,))
        else:
            X, y = _stored(name, data)
            if not full and name in ("coil20", "isolet"):
                keep = _every_second(y)
                X, y = X[keep], y[keep]
            out[name] = (X, y, (10, 20, 50))
    return out


# ------------------------------------------------------------------------------------------------ graphs, runs
def _transformed(X: np.ndarray, standardize: str | None) -> np.ndarray:
    """The rows the methods see (dufs' transform: z-score or scale by the population std; 1 where it is 0)."""
    if standardize is None:
        return X
    sd = X.std(axis=0)
    sd = np.where(sd > 0, sd, 1.0)
    return (X - X.mean(axis=0)) / sd if standardize == "zscore" else X / sd


class Bench:
    """Selections and their scores, cached: a graph per (data set, standardize, n_neighbors, weights), a score per
    (data set, selected set)."""

    def __init__(self, sets: dict):
        self.sets = sets
        self.graphs: dict = {}
        self.scores: dict = {}
        self.fit_seconds = 0.0
        self.eval_seconds = 0.0

    def graph(self, name: str, standardize: str | None, n_neighbors: int, weights: str) -> sp.csr_array:
        key = (name, standardize, n_neighbors, weights)
        if key not in self.graphs:
            self.graphs[key] = knn_graph(_transformed(self.sets[name][0], standardize), n_neighbors, weights=weights)
        return self.graphs[key]

    def select(self, name: str, method: str, cfg: dict, k: int) -> np.ndarray:
        """The first ``k`` features of ``method`` with ``cfg`` on data set ``name``."""
        X, y, _ = self.sets[name]
        p = dict(cfg)
        std = p.pop("standardize", METHODS[method].standardize)
        if method in ("lapaofs", "lapdofs", "jcfs", "laplacian"):
            nn = p.pop("n_neighbors", _default(method, "n_neighbors"))
            wt = p.pop("weights", _default(method, "weights"))
            p["W"] = self.graph(name, std, nn, wt)
        if method == "jcfs":
            p["n_clusters"] = int(np.unique(y).size)
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            sel = dufs.fit(X, method=method, n_features=k, standardize=std, client=False, **p)
        self.fit_seconds += time.perf_counter() - t0
        return np.asarray(sel.indices)[:k]

    def _kmeans(self, name: str, cols: tuple | None) -> tuple[float, float]:
        """Mean ACC and NMI over the seeds on the columns ``cols`` (None: all), cached."""
        X, y, _ = self.sets[name]
        key = (name, cols)
        if key not in self.scores:
            t0 = time.perf_counter()
            Xs = X if cols is None else X[:, list(cols)]
            r = [kmeans_scores(Xs, y, n_runs=KMEANS_RUNS, random_state=s) for s in SEEDS]
            self.scores[key] = (float(np.mean([a["acc"] for a in r])), float(np.mean([a["nmi"] for a in r])))
            self.eval_seconds += time.perf_counter() - t0
        return self.scores[key]

    def row(self, method: str, cfg: dict) -> dict:
        """Scores of ``method`` with ``cfg`` on every data set. JCFS is run once per K (its alternation makes the
        K features of a run depend on K); the others rank once and their prefixes are taken."""
        cells = {}
        for name, (X, _, ks) in self.sets.items():
            if method == "all":
                per_k, idx = {k: self._kmeans(name, None) for k in ks}, None
            else:
                per_k = {}
                idx = None if method == "jcfs" else self.select(name, method, cfg, min(max(ks), X.shape[1]))
                for k in ks:
                    top = self.select(name, method, cfg, k) if method == "jcfs" else idx[:k]
                    per_k[k] = self._kmeans(name, tuple(sorted(int(i) for i in top)))
                    if name == "iris+noise":
                        idx = top
            acc = float(np.mean([v[0] for v in per_k.values()]))
            nmi = float(np.mean([v[1] for v in per_k.values()]))
            cell = {"acc": acc, "nmi": nmi, "score": (acc + nmi) / 2, "per_k": {str(k): v for k, v in per_k.items()}}
            if name == "iris+noise" and idx is not None:
                cell["real"] = int(np.sum(np.asarray(idx[:4]) < 4))
            cells[name] = cell
        return {"method": method, "cfg": cfg, "cells": cells}


def _default(method: str, param: str):
    f = {"lapaofs": lapofs, "lapdofs": lapofs, "jcfs": jcfs}.get(method)
    if f is None:
        from dufs.methods.filters import laplacian_scores as f
    return inspect.signature(f).parameters[param].default


def code_defaults(method: str) -> dict:
    """The defaults found in the code (signature and dufs.api.METHODS)."""
    names = {"lapaofs": ("lambda1", "lambda2", "n_neighbors", "weights"),
             "lapdofs": ("lambda1", "lambda2", "n_neighbors", "weights"),
             "jcfs": ("lambda_", "gamma", "select_gamma", "n_neighbors", "weights")}[method]
    return {"standardize": METHODS[method].standardize, **{n: _default(method, n) for n in names}}


# ------------------------------------------------------------------------------------------------ grids
def stage_a(method: str, quick: bool) -> list[dict]:
    if method in ("lapaofs", "lapdofs"):
        if quick:
            grid = itertools.product((None, "zscore"), (0.0, 0.01), (1e-2,))
        else:
            grid = itertools.product(STANDARDIZE, LAMBDA1, LAMBDA2)
        return [{"standardize": s, "lambda1": a, "lambda2": b, "n_neighbors": 4, "weights": "binary"}
                for s, a, b in grid]
    grid = itertools.product((None, "zscore"), (1e-6, 1e-4), (1e-4,)) if quick else \
        itertools.product(STANDARDIZE, JCFS_LAMBDA, JCFS_GAMMA)
    return [{"standardize": s, "lambda_": a, "gamma": b, "n_neighbors": 5, "weights": "binary"} for s, a, b in grid]


def stage_b(method: str, best: list[dict]) -> list[dict]:
    out = []
    for cfg in best:
        if method in ("lapaofs", "lapdofs"):
            for nn, wt in itertools.product((4, 5, 10), ("binary", "heat")):
                out.append({**cfg, "n_neighbors": nn, "weights": wt})
        else:
            for sg in (1e-2, 1.0, 2.0):
                out.append({**cfg, "select_gamma": sg})
            out.append({**cfg, "n_neighbors": 10})
            out.append({**cfg, "weights": "heat"})
    return out


def _stage_b_candidates(method: str, rows: list[dict]) -> list[dict]:
    """The rows whose graph (and, for JCFS, select_gamma) is varied in stage B: LapAOFS/LapDOFS, the best row of
    each of the 3 best (standardize, lambda1) pairs with lambda1 > 0 (lambda2 hardly moves the picks); JCFS, the
    2 best rows."""
    rows = sorted(rows, key=lambda r: r["rank"])
    if method == "jcfs":
        return rows[:2]
    out, seen = [], set()
    for r in rows:
        key = (r["cfg"]["standardize"], r["cfg"]["lambda1"])
        if r["cfg"]["lambda1"] > 0 and key not in seen:
            seen.add(key)
            out.append(r)
    return out[:3]


def baselines() -> list[tuple[str, dict]]:
    return [("laplacian", {}), ("laplacian", {"standardize": "zscore"}), ("variance", {}), ("all", {})]


# ------------------------------------------------------------------------------------------------ tables
def _fmt(v) -> str:
    return "None" if v is None else (v if isinstance(v, str) else f"{v:g}")


def label(method: str, cfg: dict) -> str:
    if method == "all":
        return "all features"
    if method in ("laplacian", "variance"):
        return f"{'Laplacian score' if method == 'laplacian' else 'max variance'} std={_fmt(cfg.get('standardize'))}"
    short = {"standardize": "std", "lambda1": "l1", "lambda2": "l2", "lambda_": "lam", "gamma": "g",
             "select_gamma": "sg", "n_neighbors": "k", "weights": "w"}
    return " ".join(f"{short[k]}={_fmt(v)}" for k, v in cfg.items())


def rank_rows(rows: list[dict], sets: list[str]) -> None:
    """Mean rank over the data sets (1 = best score; ties share the mean rank) and wins over the Laplacian score."""
    from scipy.stats import rankdata

    ranks = np.column_stack([rankdata([-r["cells"][s]["score"] for r in rows]) for s in sets])
    ls = next(r for r in rows if r["method"] == "laplacian" and not r["cfg"])
    for r, rk in zip(rows, ranks, strict=True):
        r["rank"] = float(rk.mean())
        r["beats_ls"] = int(sum(r["cells"][s]["score"] > ls["cells"][s]["score"] + 1e-12 for s in sets))


def print_table(title: str, rows: list[dict], sets: list[str], defaults: dict, top: int | None = None) -> None:
    rows = sorted(rows, key=lambda r: r["rank"])
    if top is not None:
        keep = rows[:top] + [r for r in rows[top:] if r["method"] not in ("lapaofs", "lapdofs", "jcfs")
                             or r["cfg"] == defaults]
        rows = keep
    w = max(len(label(r["method"], r["cfg"])) for r in rows) + 2
    print(f"\n{title}")
    head = f"{'configuration':<{w}s}" + "".join(f"{s:>13s}" for s in sets)
    extra = ("1v7@10" if "digits1v7" in sets else "") + ("  real" if "iris+noise" in sets else "")
    print(head + f"{extra:>13s}{'rank':>7s}{'>LS':>5s}{'mean':>7s}")
    for r in rows:
        mark = "*" if r["cfg"] == defaults else " "
        line = f"{mark}{label(r['method'], r['cfg']):<{w - 1}s}"
        for s in sets:
            c = r["cells"][s]
            line += f"{100 * c['acc']:>8.1f}/{100 * c['nmi']:<4.1f}"
        tail = ""
        if "digits1v7" in sets:
            tail += f"{100 * r['cells']['digits1v7']['per_k']['10'][0]:7.1f}"
        if "iris+noise" in sets:
            tail += f"{r['cells']['iris+noise'].get('real', '-')!s:>6s}"
        mean = 100 * np.mean([r["cells"][s]["score"] for s in sets])
        print(line + f"{tail:>13s}{r['rank']:7.2f}{r['beats_ls']:5d}{mean:7.2f}")


# ------------------------------------------------------------------------------------------------ main
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="3 small data sets, a few configurations (about a minute)")
    ap.add_argument("--full", action="store_true", help="every sample of digits, COIL20 and Isolet")
    ap.add_argument("--methods", default="lapaofs,lapdofs,jcfs")
    ap.add_argument("--datasets", default=None, help="comma-separated (default: all seven; --quick: three)")
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA, metavar="DIR",
                    help=f"folder of COIL20.mat, ORL.mat, Isolet.mat, read only where the bundled copies fail "
                         f"(default {DEFAULT_DATA})")
    ap.add_argument("--json", type=Path, default=None, metavar="PATH", help="write every row's scores here")
    args = ap.parse_args()
    t_start = time.perf_counter()
    names = args.datasets.split(",") if args.datasets else \
        (["digits1v7", "iris+noise", "orl"] if args.quick else
         ["digits1v7", "digits", "iris+noise", "breast", "coil20", "orl", "isolet"])
    sets = load_sets(names, args.data, args.full)
    print("data sets: " + ", ".join(f"{n} {X.shape[0]}x{X.shape[1]} ({np.unique(y).size} classes, K={ks})"
                                    for n, (X, y, ks) in sets.items()))
    bench = Bench(sets)
    base_rows = []
    for m, cfg in baselines():
        base_rows.append(bench.row(m, cfg))
    out = {}
    for method in args.methods.split(","):
        t0 = time.perf_counter()
        defaults = code_defaults(method)
        rows = [bench.row(method, c) for c in stage_a(method, args.quick)]
        if not args.quick:
            rank_rows(rows + base_rows, names)
            cand = _stage_b_candidates(method, rows)
            seen = [r["cfg"] for r in rows]
            rows += [bench.row(method, c) for c in stage_b(method, [r["cfg"] for r in cand]) if c not in seen]
        if defaults not in [r["cfg"] for r in rows]:
            rows.append(bench.row(method, defaults))
        allrows = rows + base_rows
        rank_rows(allrows, names)
        print_table(f"{method}: ACC/NMI (%) mean over K, rows by mean rank "
                    f"({len(rows)} configurations, {time.perf_counter() - t0:.0f} s)", allrows, names, defaults,
                    top=None if args.quick else 25)
        out[method] = allrows
    print(f"\nwall {time.perf_counter() - t_start:.0f} s (fits {bench.fit_seconds:.0f} s, k-means "
          f"{bench.eval_seconds:.0f} s)")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1, default=str))


if __name__ == "__main__":
    main()
