"""Choose MMFS's defaults on data: a sweep of C, theta, gamma, standardize, the multi-class relevance rule and the
ranking's tie-break on the seven bundled real sets, under the paper's top-K protocol (Prasad et al., section 4).

Protocol: stratified 5-fold cross-validation (shuffled, seed 0); in each fold the selection is made on the training
part only, then an L2-regularised L2-loss linear SVM (``LinearSVC(C=1)``) is trained on the top K features of the
training part, z-scored with the training part's statistics (the paper normalises the data), and scored on the test
part; K in {5, 10, 20, 50}; the table gives the mean accuracy over the folds. MMFS with ``gamma="auto"`` is fitted
once per K with ``n_features=K`` (what a user does: the gamma path stops when the support holds K features); with a
fixed gamma the solve does not depend on n_features, so one fit a fold gives every K (the prefixes of its ranking).
MMFS runs as ``dufs.fit(method="mmfs")`` runs it (:func:`dufs.methods.mmfs.mmfs` on an engine ``Matrix``, the
ranking :meth:`MMFSResult.ranking`), serially.

Baselines in the same folds: ``|corr|`` is the |correlation| ranking, ``dufs.fit(method="correlation")``, on the
binary sets and the correlation ratio eta (the same multi-class relevance MMFS uses) on the multi-class ones, so
that the comparison is fair; ``|corr| num`` is ``dufs.fit(method="correlation")`` with the class ids taken as
numbers (multi-class sets; depends on how the classes are numbered); ``fisher`` is ``dufs.fit(method="fisher")``
(its ranking is eta's: eta^2 = F / (1 + F)).

Configurations (a row each): ``C``, ``th`` (theta), ``g`` (gamma: "auto" path or a fixed value), ``std``
(standardize), ``rel`` (relevance: ``ratio`` MMFS's "correlation", i.e. |corr| on two classes and the correlation
ratio eta on more, ``ovr-max`` / ``ovr-mean`` the largest / mean one-vs-rest |correlation|, ``num`` the labels as
numbers (the old multi-class rule), ``sq`` eta^2, ``fisher`` MMFS's "fisher"), ``tb`` (ties in alpha, e.g. features
at the bound C, broken by the lower index as ``MMFSResult.ranking`` does, or by the dual gradient ``grad``). The grid
``coord`` changes one setting at a time from the defaults (``NEW``; ``OLD``, the defaults before the sweep, took
multi-class labels as numbers); ``joint`` is a small joint grid around the best of
those; ``all`` is both. Columns: data set x K; ``W/T/L`` counts the (set, K <= 10) cells where the row beats, ties
or loses to ``|corr|``; ``rank5,10`` and ``rank`` are its mean rank among all rows over the K <= 10 cells and over
every cell (1 = best; ties share the mean rank).

Run: ``python examples/mmfs_defaults.py [--grid coord|joint|all] [--cache FILE] [--quick] [--data DIR]``;
``--quick`` runs two sets (ALLAML, ORL) and three configurations in under a minute. ``--cache FILE`` keeps each
(set, row)'s fold accuracies in a JSON file and reuses them (a later run with a larger grid only computes the new
rows). Reads the .mat files from DIR (default: the shared/data folder beside the repository), else the bundled
copies. Run single-threaded (``OMP_NUM_THREADS=1`` etc.): the whole grid (70 configurations) took 7.5 minutes on
one core here.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import warnings
from pathlib import Path

import dask
import numpy as np
import scipy.sparse as sp
from _data import DEFAULT_DATA, MAT
from sklearn.exceptions import ConvergenceWarning
from sklearn.model_selection import StratifiedKFold
from sklearn.svm import LinearSVC

import dufs
from dufs.engine import Matrix
from dufs.methods.mmfs import class_relevance, encode_labels, geometry, mmfs, relevance

KS = [5, 10, 20, 50]
SMALL = [5, 10]  # the K of the "wins" count
SETS = ["allaml", "basehock", "pcmac", "relathe", "coil20", "orl", "isolet"]
TEXT = {"basehock", "pcmac", "relathe"}
FOLDS, SEED = 5, 0
# the defaults before this sweep (mmfs() signature, METHODS["mmfs"].standardize)
OLD = {"C": 1.0, "theta": 0.5, "gamma": "auto", "std": "zscore", "rel": "num", "tb": "index"}
# what the sweep chose (the mmfs() signature and the recommended standardize)
NEW = {"C": 1.0, "theta": 0.5, "gamma": "auto", "std": "zscore", "rel": "ratio", "tb": "index"}


def cfg(**kw) -> dict:  # the rows of the grids: one setting changed from the new multi-class rule
    return {**OLD, "rel": "ratio", **kw}


def grid_coord() -> list[dict]:
    out = [cfg(rel="ratio"), cfg(rel="num"), cfg(rel="ovr-max"), cfg(rel="ovr-mean")]
    out += [cfg(C=c) for c in (0.01, 0.03, 0.1, 0.3, 10.0)]
    out += [cfg(theta=t) for t in (0.3, 0.7, 0.9)]
    out += [cfg(gamma=g) for g in (1.0, 0.1, 0.01, 0.001)]
    out += [cfg(std="scale"), cfg(rel="sq"), cfg(rel="fisher"), cfg(tb="grad"), cfg(C=0.1, tb="grad")]
    return out


def grid_joint() -> list[dict]:
    out = []
    for rel in ("ratio", "sq", "fisher"):
        for std in ("zscore", "scale"):
            for C in (0.1, 0.3, 1.0):
                for g in ("auto", 1.0, 0.1):
                    out.append(cfg(C=C, gamma=g, std=std, rel=rel))
    out += [cfg(C=C, tb="grad") for C in (0.003, 0.01, 0.03)]
    return out


def name(c: dict) -> str:
    g = c["gamma"] if isinstance(c["gamma"], str) else f"{c['gamma']:g}"
    return f"C={c['C']:g} th={c['theta']:g} g={g} {c['std']} {c['rel']} {c['tb']}"


def key_for(c: dict, binary: bool) -> str:
    """The cache key of configuration ``c`` on a set: the multi-class rules all give |corr| on a binary one."""
    return name({**c, "rel": "ratio"} if binary and c["rel"] in ("num", "ovr-max", "ovr-mean") else c)


# ---------------------------------------------------------------------------------------------------- data
def load(nm: str, data: Path) -> tuple:
    path = Path(data) / MAT[nm]
    if path.is_file():
        import scipy.io

        d = scipy.io.loadmat(path)
        X, y = d["X"], np.asarray(d["Y"]).ravel()
        X = sp.csr_array(X, dtype=np.float64) if nm in TEXT else np.asarray(X, dtype=np.float64)
        return X, y.astype(np.int64), str(path)
    from dufs.data.datasets import load as bundled

    X, y = bundled(nm)
    return X, np.asarray(y), f"dufs.data.datasets.load({nm!r})"


def folds(y: np.ndarray) -> list:
    return list(StratifiedKFold(FOLDS, shuffle=True, random_state=SEED).split(np.zeros((y.shape[0], 1)), y))


def accuracy(Xtr, ytr, Xte, yte, tops: dict) -> list[float]:
    """Test accuracy of LinearSVC(C=1) on each K's features (z-scored with the training part's statistics)."""
    out = []
    for k in KS:
        idx = np.asarray(tops[k][:k])
        A, B = Xtr[:, idx], Xte[:, idx]
        A = A.toarray() if sp.issparse(A) else np.asarray(A)
        B = B.toarray() if sp.issparse(B) else np.asarray(B)
        mu, sd = A.mean(0), A.std(0)
        sd = np.where(sd > 0, sd, 1.0)
        svm = LinearSVC(C=1.0, loss="squared_hinge", penalty="l2", dual="auto", random_state=SEED)
        svm.fit((A - mu) / sd, ytr)
        out.append(float(svm.score((B - mu) / sd, yte)))
    return out


# ---------------------------------------------------------------------------------------------------- rankings
def _relevance(mc: str):
    """The relevance for rule ``mc`` ("ratio": MMFS's own "correlation", "fisher": its "fisher"; else a callable)."""
    if mc == "ratio":
        return "correlation"
    if mc == "fisher":
        return "fisher"
    if mc == "sq":
        def squared(M, y):  # eta^2 (r^2 under "zscore"): sharper relevance
            return relevance(M, y, geometry(M), "correlation") ** 2
        return squared
    if mc == "num":
        def numeric(M, y):  # the old rule: the class ids as numbers
            yc = np.asarray(y, dtype=np.float64) - np.mean(y)
            return np.abs(geometry(M)["coef"] * M.with_standardize(None).rmatvec(yc / np.linalg.norm(yc)))
        return numeric

    def ovr(M, y):
        classes, codes = encode_labels(y)
        return class_relevance(M, codes, classes.shape[0], geometry(M), mc)
    return ovr


def ranking(res, tb: str) -> np.ndarray:
    if tb == "index":
        return res.ranking()
    # the support by alpha, ties by the dual gradient g - rho (most negative first), then the rest by it
    sup = np.flatnonzero(res.alpha > 0)
    G = res.g - res.rho
    sup = sup[np.lexsort((sup, G[sup], -res.alpha[sup]))]
    rest = np.flatnonzero(res.alpha <= 0)
    return np.concatenate([sup, rest[np.lexsort((rest, G[rest]))]])


def mmfs_tops(Xtr, ytr, c: dict, memo: dict, tag) -> tuple[dict, dict]:
    """{K: top features} of configuration ``c`` on one fold's training part, and some diagnostics."""
    fit_key = (tag, c["C"], c["theta"], c["gamma"], c["std"], c["rel"])
    auto = c["gamma"] == "auto"
    tops, info = {}, {"support": [], "at_C": [], "gamma": []}
    for k in (KS if auto else [max(KS)]):
        fk = fit_key + ((k,) if auto else ())
        if fk not in memo:
            with dask.config.set(scheduler="sync"):
                res = mmfs(Matrix(Xtr, standardize=c["std"]), ytr, n_features=k, C=c["C"], theta=c["theta"],
                           gamma=c["gamma"], relevance_kind=_relevance(c["rel"]), checkpoint=None)
            if memo.get("tag") != tag:  # one fold at a time: keep only this fold's fits
                memo.clear()
                memo["tag"] = tag
            memo[fk] = res
        res = memo[fk]
        r = ranking(res, c["tb"])
        for kk in ([k] if auto else KS):
            tops[kk] = r[:kk]
        info["support"].append(int((res.alpha > 0).sum()))
        info["at_C"].append(int((res.alpha >= c["C"] * (1 - 1e-9)).sum()))
        info["gamma"].append(float(res.gamma))
    return tops, info


def baseline_tops(Xtr, ytr, which: str) -> dict:
    K = max(KS)
    if which == "eta":
        M = Matrix(Xtr, standardize="zscore")
        classes, codes = encode_labels(ytr)
        r = class_relevance(M, codes, classes.shape[0], geometry(M), "ratio")
        order = np.argsort(-r, kind="stable")
    else:
        order = dufs.fit(Xtr, ytr.astype(np.float64), method=which, n_features=K, client=False).indices
    return {k: order[:k] for k in KS}


# ---------------------------------------------------------------------------------------------------- sweep
def run_set(nm: str, X, y, rows: list[tuple[str, dict | str]], cache: dict, save) -> None:
    binary = np.unique(y).shape[0] == 2
    todo = [(lbl, c) for lbl, c in rows if _rkey(nm, lbl, c, binary) not in cache]
    if not todo:
        return
    t0 = time.perf_counter()
    spent = {lbl: 0.0 for lbl, _ in todo}
    acc = {lbl: [] for lbl, _ in todo}
    info = {lbl: {} for lbl, _ in todo}
    memo: dict = {}
    for f, (tr, te) in enumerate(folds(y)):
        Xtr, Xte, ytr, yte = X[tr], X[te], y[tr], y[te]
        for lbl, c in todo:
            t = time.perf_counter()
            if isinstance(c, str):
                tops, inf = baseline_tops(Xtr, ytr, c), {}
            else:
                tops, inf = mmfs_tops(Xtr, ytr, c, memo, (nm, f))
            spent[lbl] += time.perf_counter() - t
            acc[lbl].append(accuracy(Xtr, ytr, Xte, yte, tops))
            for kk, v in inf.items():
                info[lbl].setdefault(kk, []).extend(v)
    for lbl, c in todo:
        cache[_rkey(nm, lbl, c, binary)] = {"acc": acc[lbl], "select_s": spent[lbl], "info": info[lbl]}
    save()
    print(f"  {nm}: {len(todo)} rows in {time.perf_counter() - t0:.1f} s", flush=True)


def _rkey(nm: str, lbl: str, c, binary: bool) -> str:
    return f"{nm}|{lbl if isinstance(c, str) else key_for(c, binary)}"


def mean_ranks(table: np.ndarray) -> np.ndarray:
    """Per column, the rank of each row (1 = highest; ties share the mean rank); averaged over the columns."""
    from scipy.stats import rankdata

    return np.mean([rankdata(-table[:, j], method="average") for j in range(table.shape[1])], axis=0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA, metavar="DIR",
                    help=f"folder holding the .mat files (default {DEFAULT_DATA}; else the bundled copies)")
    ap.add_argument("--grid", choices=["coord", "joint", "all"], default="all")
    ap.add_argument("--cache", type=Path, default=None, metavar="FILE", help="JSON file of computed rows (reused)")
    ap.add_argument("--quick", action="store_true", help="two sets, three configurations (under a minute)")
    ap.add_argument("--sets", default=None, help="comma-separated subset of " + ",".join(SETS))
    args = ap.parse_args()
    warnings.simplefilter("ignore", ConvergenceWarning)
    warnings.filterwarnings("ignore", category=dufs.errors.DufsWarning)
    t_all = time.perf_counter()

    if args.quick:
        sets, configs = ["allaml", "orl"], [OLD, NEW, cfg(C=0.1, gamma=0.1, tb="grad")]
    else:
        sets = SETS
        configs = {"coord": grid_coord, "joint": grid_joint, "all": lambda: grid_coord() + grid_joint()}[args.grid]()
        if NEW not in configs:
            configs.append(NEW)
    if args.sets:
        sets = [s for s in args.sets.split(",") if s]
    seen, uniq = set(), []
    for c in configs:
        if name(c) not in seen:
            seen.add(name(c))
            uniq.append(c)
    configs = uniq
    baselines = [("|corr|", "eta"), ("|corr| num", "correlation"), ("fisher", "fisher")]
    rows = [(name(c), c) for c in configs] + baselines

    cache: dict = {}
    if args.cache is not None and args.cache.is_file():
        cache = json.loads(args.cache.read_text())

    def save() -> None:
        if args.cache is not None:
            tmp = args.cache.with_suffix(".tmp")
            tmp.write_text(json.dumps(cache))
            os.replace(tmp, args.cache)

    print(f"MMFS defaults sweep: {len(configs)} configurations + {len(baselines)} baselines on {', '.join(sets)}; "
          f"stratified {FOLDS}-fold CV (seed {SEED}), LinearSVC(C=1) on the top K = {KS}", flush=True)
    data = {}
    for nm in sets:
        X, y, src = load(nm, args.data)
        data[nm] = (X, y)
        print(f"  {nm}: {X.shape[0]} x {X.shape[1]}, {np.unique(y).shape[0]} classes, from {src}", flush=True)
        # |corr| on a binary set is the correlation filter itself; on a multi-class one the correlation ratio
        run_set(nm, X, y, rows, cache, save)

    # ------------------------------------------------------------------ the table
    labels = [lbl for lbl, _ in rows]
    cols = [(nm, k) for nm in sets for k in KS]
    T = np.full((len(rows), len(cols)), np.nan)
    S = np.full_like(T, np.nan)
    sel_s = np.zeros(len(rows))
    for i, (lbl, c) in enumerate(rows):
        for j, (nm, k) in enumerate(cols):
            binary = np.unique(data[nm][1]).shape[0] == 2
            rec = cache[_rkey(nm, lbl, c, binary)]
            a = np.asarray(rec["acc"])[:, KS.index(k)]
            T[i, j], S[i, j] = 100 * a.mean(), 100 * a.std()
        sel_s[i] = sum(cache[_rkey(nm, lbl, c, np.unique(data[nm][1]).shape[0] == 2)]["select_s"] for nm in sets)
    small = [j for j, (_, k) in enumerate(cols) if k in SMALL]
    base = labels.index("|corr|")
    rank_small, rank_all = mean_ranks(T[:, small]), mean_ranks(T)
    w = len(max(labels, key=len))
    head = f"{'configuration':{w}s} " + " ".join(f"{nm[:6] + ' ' + str(k):>9s}" for nm, k in cols)
    head += f" {'W/T/L':>8s} {'rank5,10':>8s} {'rank':>6s} {'mean5,10':>8s} {'sel s':>7s}"
    print("\nMean test accuracy (%) over the folds; W/T/L against |corr| over the K <= 10 cells")
    print(head)
    print("-" * len(head))
    for i, lbl in enumerate(labels):
        d = T[i, small] - T[base, small]
        wtl = f"{(d > 1e-9).sum()}/{(np.abs(d) <= 1e-9).sum()}/{(d < -1e-9).sum()}"
        print(f"{lbl:{w}s} " + " ".join(f"{v:9.2f}" for v in T[i]) +
              f" {wtl:>8s} {rank_small[i]:8.2f} {rank_all[i]:6.2f} {T[i, small].mean():8.2f} {sel_s[i]:7.1f}")

    # ------------------------------------------------------------------ the choice
    mm = [i for i, (_, c) in enumerate(rows) if not isinstance(c, str)]
    wins = {i: int((T[i, small] - T[base, small] > 1e-9).sum()) for i in mm}
    best = max(mm, key=lambda i: (wins[i], T[i, small].mean()))
    print(f"\nmost wins against |corr| at K <= 10 (then mean accuracy at K <= 10): {labels[best]} "
          f"({wins[best]} of {len(small)})")
    tags: dict = {}
    tags.setdefault(labels.index(name(OLD)), []).append("old defaults")
    if name(NEW) in labels:
        tags.setdefault(labels.index(name(NEW)), []).append("new defaults")
    tags.setdefault(best, []).append("most wins")
    show = list(tags) + [labels.index(b) for b, _ in baselines]
    print("\nPaper-style comparison (mean +- std test accuracy % over the folds):")
    for nm in sets:
        binary = np.unique(data[nm][1]).shape[0] == 2
        print(f"\n{nm}")
        print(f"  {'method':{w}s}" + "".join(f"{'K=' + str(k):>15s}" for k in KS))
        for i in show:
            if binary and labels[i] == "|corr| num":
                continue
            tag = f" ({', '.join(tags[i])})" if i in tags else ""
            js = [cols.index((nm, k)) for k in KS]
            print(f"  {labels[i]:{w}s}" + "".join(f"{T[i, j]:8.2f} +-{S[i, j]:5.2f}" for j in js) + tag)
    print(f"\nwall time {time.perf_counter() - t_all:.1f} s")


if __name__ == "__main__":
    main()
