"""A run with Dask input on the embedded LocalCluster ends cleanly: no "leaked semaphore objects" or other
resource-tracker warnings and no "Exception ignored" noise at interpreter exit, through ``dufs.fit`` (dense and
sparse chunks) and an estimator, and no error logged as the cluster closes (a standardising method's transform,
scattered to the workers, used to be still there: "Removing worker ... caused the cluster to lose scattered data").
Run as a real process, since these warnings are printed at exit."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from dufs.testing import patience

SCRIPT = textwrap.dedent("""
    import sys, warnings
    import numpy as np, scipy.sparse, dask, dask.array as da, sparse, dufs

    if __name__ == "__main__":
        warnings.simplefilter("default")
        X = da.random.default_rng(0).random((3000, 40), chunks=(1000, 10))
        y = np.arange(3000) % 2
        print("fisher", dufs.fit(X, y, method="fisher", n_features=5).indices.tolist())
        Xs = X.map_blocks(lambda b: sparse.COO.from_numpy(np.where(b > 0.7, b, 0)))
        print("mmfs", dufs.fit(Xs, y, method="mmfs", n_features=5).indices.tolist())
        store = dufs.write_store(scipy.sparse.random(3000, 40, density=0.3, format="csr", random_state=0), sys.argv[1])
        with dask.config.set({"dufs.engine.inline-nnz": 0}):  # a store this small runs on the cluster too
            print("ufcm", dufs.fit(store, method="ufcm", n_features=5, n_components=3).indices.tolist())
        print("estimator", dufs.FisherScore(n_features=3).fit(X, y).get_support(indices=True).tolist())
""")


@pytest.mark.slow
def test_dask_input_exits_cleanly(tmp_path):
    res = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "s.zarr")], capture_output=True, text=True,
                         timeout=patience(300))
    assert res.returncode == 0, res.stderr
    assert [ln.split()[0] for ln in res.stdout.splitlines()] == ["fisher", "mmfs", "ufcm", "estimator"]
    for noise in ("leaked semaphore", "resource_tracker", "Exception ignored", "Traceback", "lose scattered data",
                  " - ERROR - "):
        assert noise not in res.stderr, res.stderr
