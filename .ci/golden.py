"""Golden selections: every method on every input path, saved, so a refactor can show it changes no result.

    python .ci/golden.py run before.npz             # every method x every path (a few minutes on 2 cores)
    python .ci/golden.py run after.npz
    python .ci/golden.py compare before.npz after.npz   # bit for bit: indices and scores

The paths: an in-memory SciPy matrix (run in this process), a small store (inline), a sparse Dask array and the
store on a 2-process LocalCluster, and the store on that cluster with the remote path forced
(``dufs.engine.shared-memory: off``, ``direct-passes: off``). The data: a synthetic store with two planted
clusters (labels = clusters), split into several feature blocks so that every pass crosses blocks.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import warnings

import numpy as np

METHODS = ["variance", "correlation", "fisher", "laplacian", "mmfs", "qpfs", "lapaofs", "lapdofs", "jcfs",
           "ufcm", "m3fs"]
K = 10


def _data(tmp: str):
    import dufs
    from dufs.data.synthetic import SyntheticSpec
    from dufs.data.writers import make_synthetic

    spec = SyntheticSpec(n_rows=600, n_features=4000, nnz_per_row=20, seed=7, n_clusters=2, cluster_features=15,
                         cluster_nnz=4)
    path = f"{tmp}/golden.zarr"
    make_synthetic(path, spec, row_block=256, feature_block=1024)
    return path, dufs.open(path)


def _fit(X, y, method, **kw):
    import dufs

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t = time.perf_counter()
        sel = dufs.fit(X, y, method=method, n_features=K, **kw)
    return np.asarray(sel.indices), np.asarray(sel.scores, dtype=np.float64), time.perf_counter() - t


def run(out: str, only: list[str] | None) -> None:
    import dask
    from distributed import Client, LocalCluster

    results: dict[str, np.ndarray] = {}
    with tempfile.TemporaryDirectory() as tmp:
        path, store = _data(tmp)
        X, y = store.to_scipy(), store.y

        def record(case, method, X, y, **kw):
            if only and method not in only:
                return
            idx, sc, dt = _fit(X, y, method, **kw)
            results[f"{case}/{method}/indices"] = idx
            results[f"{case}/{method}/scores"] = sc
            print(f"{case:10s} {method:12s} {dt:7.2f} s  {idx.tolist()}", flush=True)

        for m in METHODS:
            record("memory", m, X, y)
        for m in METHODS:
            record("store", m, path, None)
        with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as lc, \
                Client(lc) as client:
            for m in METHODS:
                record("dask", m, store.to_dask("csc"), y, client=client)
            for m in METHODS:
                record("cluster", m, path, None, client=client)
            with dask.config.set({"dufs.engine.shared-memory": "off", "dufs.engine.direct-passes": "off"}):
                for m in METHODS:
                    record("remote", m, path, None, client=client)
    np.savez(out, **results)
    print(f"{len(results) // 2} selections -> {out}")


def compare(a: str, b: str) -> int:
    A, B = np.load(a), np.load(b)
    bad = 0
    for key in sorted(set(A.files) | set(B.files)):
        if key not in A.files or key not in B.files:
            print(f"MISSING {key}")
            bad += 1
        elif not np.array_equal(A[key], B[key], equal_nan=A[key].dtype.kind == "f"):
            diff = np.nanmax(np.abs(A[key] - B[key])) if A[key].shape == B[key].shape and A[key].dtype.kind == "f" \
                else "shape/values"
            print(f"DIFFERS {key}: {diff}")
            bad += 1
    print(f"{len(A.files)} arrays, {bad} differ")
    return 1 if bad else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("out")
    r.add_argument("--methods", nargs="*")
    c = sub.add_parser("compare")
    c.add_argument("a")
    c.add_argument("b")
    args = p.parse_args()
    if args.cmd == "run":
        run(args.out, args.methods)
        return 0
    return compare(args.a, args.b)


if __name__ == "__main__":
    sys.exit(main())
