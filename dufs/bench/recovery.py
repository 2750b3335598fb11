"""``dufs bench recovery``: what the unsupervised methods find in clustered sparse data, with their defaults.

Every method runs through ``dufs.fit`` on a store written by ``dufs.write_store``, with its default parameters
(``n_clusters`` given where a method takes one, the planted count), and is scored against the planting: planted
features in its top k (k = the planted count) and clusters represented there (at least one of a cluster's own
features in the top k); on the real text sets, k-means ACC and NMI on its top 100 (rows scaled to unit norm)
against the classes. Measurements
and what they say: docs/recovery.md.
"""

from __future__ import annotations

import json
import re
import statistics
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

#: the methods measured, in the table's order; the variance filter is the baseline
METHODS = ("variance", "laplacian", "lapaofs", "lapdofs", "jcfs", "m3fs", "ufcm")
#: the data kinds run by default (``dufs-C[-weak]``: the project's generator; ``signature``, ``topics``: the new ones)
KINDS = ("dufs-2", "dufs-5", "dufs-10", "dufs-5-weak", "signature", "topics")
#: the labelled text sets (``--kinds pcmac,...``): bundled, or ``<NAME>.mat`` in ``--data``
REAL = ("pcmac", "basehock", "relathe")
#: features selected on a real set
REAL_K = 100
_TAKES_CLUSTERS = ("jcfs", "m3fs", "ufcm")


def parse_kind(kind: str, clusters: int) -> dict[str, Any]:
    """A data kind's name as its generator and settings: ``dufs-C`` (the project's generator, C clusters, 5 cluster
    nonzeros a row), ``dufs-C-weak`` (2 a row), ``signature``, ``topics`` (``clusters`` clusters), a real set."""
    m = re.fullmatch(r"dufs-(\d+)(-weak)?", kind)
    if m:
        return {"gen": "dufs", "clusters": int(m.group(1)), "cluster_nnz": 2 if m.group(2) else 5}
    if kind in ("signature", "topics"):
        return {"gen": kind, "clusters": clusters}
    if kind in REAL:
        return {"gen": "real", "name": kind}
    raise ValueError(f"unknown data kind {kind!r}: dufs-C, dufs-C-weak (C >= 2), signature, topics, "
                     f"{', '.join(REAL)}")


def make_data(kind: str, rows: int, features: int, clusters: int, seed: int, data_dir: Path | None = None
              ) -> tuple[Any, np.ndarray, np.ndarray | None]:
    """``(X csr, labels, planted)`` of a kind: planted the features of each cluster (clusters x per cluster), None
    for a real set."""
    import scipy.sparse as sp

    from dufs.data import synthetic as syn

    k = parse_kind(kind, clusters)
    if k["gen"] == "dufs":
        spec = syn.SyntheticSpec(n_rows=rows, n_features=features, seed=seed, n_clusters=k["clusters"],
                                 cluster_nnz=k["cluster_nnz"])
        indptr, indices, data, y = syn.generate_rows(spec, 0, rows)
        X = sp.csr_matrix((data.astype(np.float64), indices, indptr), shape=(rows, features))
        return X, y.astype(np.int64), np.asarray(spec.ground_truth()["cluster_features"], dtype=np.int64)
    if k["gen"] == "signature":
        return syn.make_signature_counts(rows, features, k["clusters"], seed=seed)
    if k["gen"] == "topics":
        return syn.make_topic_documents(rows, features, k["clusters"], seed=seed)
    mat = None if data_dir is None else Path(data_dir) / f"{k['name'].upper()}.mat"
    if mat is not None and mat.exists():
        from scipy.io import loadmat

        d = loadmat(mat)
        return sp.csr_matrix(d["X"], dtype=np.float64), np.asarray(d["Y"]).ravel().astype(np.int64), None
    from dufs.data.datasets import load

    X, y = load(k["name"], sparse=True)
    return sp.csr_matrix(X), y, None


def score(indices: np.ndarray, planted: np.ndarray) -> tuple[int, int]:
    """Planted features among ``indices`` and clusters with at least one of theirs there."""
    top = np.asarray(indices)
    return int(np.isin(planted.ravel(), top).sum()), int(sum(np.isin(row, top).any() for row in planted))


def method_params(method: str, n_clusters: int, extra: dict[str, Any]) -> dict[str, Any]:
    """The method's parameters: ``n_clusters`` where it takes one, and those of ``extra`` (``name`` for every
    method that takes it, ``method.name`` for one) that it takes."""
    from dufs.api import METHODS as SPECS

    takes = set(SPECS[method].params) | {"standardize"}
    p: dict[str, Any] = {"n_clusters": n_clusters} if method in _TAKES_CLUSTERS else {}
    for name, v in extra.items():
        who, _, what = name.rpartition(".")
        if (who in ("", method)) and what in takes:
            p[what] = v
    return p


def run_one(store: Any, method: str, k: int, params: dict[str, Any]) -> dict[str, Any]:
    """One ``dufs.fit`` in this process: the selection's indices, wall time, passes and any warning's text."""
    import dufs

    t0 = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            sel = dufs.fit(store, method=method, n_features=k, client=False, **params)
        except Exception as exc:  # a method that fails is a row of the table, not the end of the bench
            return {"error": f"{type(exc).__name__}: {exc}"[:200], "time": time.perf_counter() - t0}
    d = sel.diagnostics
    labels = d.get("labels")
    sizes = sorted(np.bincount(np.asarray(labels)).tolist(), reverse=True) if labels is not None else None
    return {"indices": np.asarray(sel.indices).tolist(), "time": d["wall_time"], "passes": d.get("passes"),
            "degenerate": d.get("degenerate"), "cluster_sizes": sizes,
            "warnings": sorted({str(w.message)[:160] for w in caught})}


def recovery_bench(*, rows: int = 5_000, features: int = 20_000, clusters: int = 5, seeds: tuple[int, ...] = (0,),
                   kinds: tuple[str, ...] = KINDS, methods: tuple[str, ...] = METHODS,
                   params: dict[str, Any] | None = None, work_dir: Path | None = None, data_dir: Path | None = None,
                   out: Path | None = None, console: Any = None) -> dict[str, Any]:
    """Run every method on every kind and seed; print the table (one row a kind and method, the seeds' figures
    side by side) and return the results (``out``: also saved there as JSON)."""
    import dufs

    def say(*a: Any) -> None:
        (print if console is None else lambda *x: console.print(*x, highlight=False, soft_wrap=True))(*a)

    for kd in kinds:
        parse_kind(kd, clusters)
    unknown = sorted(set(methods) - set(METHODS))
    if unknown:
        raise ValueError(f"methods {unknown} are not measured by the recovery bench; choose from {', '.join(METHODS)}")
    params = dict(params or {})
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="dufs-recovery-") as tmp:
        root = Path(work_dir) if work_dir is not None else Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        for kd in kinds:
            real = parse_kind(kd, clusters)["gen"] == "real"
            for seed in ((0,) if real else seeds):
                X, y, planted = make_data(kd, rows, features, clusters, seed, data_dir)
                n_cl = int(np.unique(y).size)
                k = REAL_K if real else int(planted.size)
                path = root / (f"{kd}.zarr" if real else f"{kd}-{rows}x{features}-c{n_cl}-s{seed}.zarr")
                st = dufs.write_store(X, path, y, overwrite=True,
                                      provenance={"source": "dufs bench recovery", "kind": kd, "seed": seed})
                say(f"{kd}, seed {seed}: {X.shape[0]:,} x {X.shape[1]:,}, {X.nnz / X.shape[0]:.1f} nonzeros a row, "
                    f"{n_cl} clusters of {np.bincount(y)[np.bincount(y) > 0].tolist()}, k = {k}")
                for m in methods:
                    r = run_one(st, m, k, method_params(m, n_cl, params))
                    r.update(kind=kd, seed=seed, method=m, k=k, n_clusters=n_cl)
                    if "indices" in r:
                        if real:
                            from sklearn.preprocessing import normalize

                            from dufs.evaluate import kmeans_scores

                            # on unit-norm rows (cosine): on the raw counts k-means finds nothing of the classes
                            # with any selection (docs/recovery.md)
                            r.update(kmeans_scores(normalize(X[:, r["indices"]]), y))
                        else:
                            r["found"], r["represented"] = score(np.asarray(r["indices"]), planted)
                    results.append(r)
                    say(f"  {m}: {_cell(r)}")
    res = {"rows": rows, "features": features, "clusters": clusters, "seeds": list(seeds), "params": params,
           "results": results}
    say(table(res))
    if out is not None:
        Path(out).write_text(json.dumps(res, indent=1, default=str))
        say(f"results: {out}")
    return res


def _cell(r: dict[str, Any]) -> str:
    if "error" in r:
        return f"error {r['error']}"
    what = (f"ACC {r['acc']:.3f} NMI {r['nmi']:.3f}" if "acc" in r
            else f"{r['found']} of {r['k']} found, {r['represented']} of {r['n_clusters']} clusters")
    return f"{what}, {r['time']:.1f} s, {r['passes']} passes" + (" (degenerate)" if r.get("degenerate") else "")


def table(res: dict[str, Any]) -> str:
    """The results as a Markdown table: a row per (kind, method), each seed's figure joined by ' / '."""
    head = ("kind", "method", "found", "clusters", "ACC", "NMI", "time s", "passes", "note")
    lines = [f"recovery: top k = the planted features (real sets: k = {REAL_K}, k-means ACC and NMI on its unit-norm "
             f"rows); synthetic data {res['rows']:,} x {res['features']:,}, seeds {', '.join(map(str, res['seeds']))}"
             + (f", params {res['params']}" if res["params"] else ""), "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for kd, m in dict.fromkeys((r["kind"], r["method"]) for r in res["results"]):
        rs = [r for r in res["results"] if (r["kind"], r["method"]) == (kd, m)]
        ok = [r for r in rs if "error" not in r]

        def col(key: str, fmt: str = "{}", ok: list = ok) -> str:
            return " / ".join(fmt.format(r[key]) for r in ok if key in r) or "-"

        found = col("found") + (f" of {ok[0]['k']}" if ok and "found" in ok[0] else "")
        rep = col("represented") + (f" of {ok[0]['n_clusters']}" if ok and "represented" in ok[0] else "")
        note = "; ".join(dict.fromkeys(r["error"] if "error" in r else
                                       "degenerate: " + "/".join(map(str, r.get("cluster_sizes") or [])) for r in rs
                                       if "error" in r or r.get("degenerate")))
        lines.append(f"| {kd} | {m} | {found} | {rep} | {col('acc', '{:.3f}')} | {col('nmi', '{:.3f}')} | "
                     f"{statistics.median([r['time'] for r in rs]):.1f} | {col('passes')} | {note} |")
    return "\n".join(lines)
