"""`dufs demo` (the README's first command) runs end to end on a local multi-process cluster."""

from __future__ import annotations

import subprocess
import sys

import numpy as np

import dufs


def test_demo_runs_on_a_local_cluster(tmp_path):
    res = subprocess.run([sys.executable, "-m", "dufs.cli", "demo", "--out", str(tmp_path), "--rows", "20000",
                          "--features", "50000", "--workers", "2"], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert "20,000 rows x 50,000 features" in res.stdout
    assert "Fisher score, top 50 of 50,000 features, on 2 workers" in res.stdout
    sel = dufs.Selection.from_json(tmp_path / "fisher-50.json")
    assert (tmp_path / "fisher-scores.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    st = dufs.open(tmp_path / "synthetic.zarr")
    assert st.shape == (20000, 50000)
    gt = st.ground_truth
    assert gt is not None and len(gt["informative"]) == 20
    # the store is what the generator makes, independently of the cluster that wrote it
    from dufs.data.synthetic import SyntheticSpec, generate_rows

    spec = SyntheticSpec(n_rows=20000, n_features=50000, nnz_per_row=30, n_informative=20, seed=0)
    indptr, indices, data, y = generate_rows(spec, 0, 20000)
    X = st.to_scipy("csr")
    assert np.array_equal(X.indptr, indptr) and np.array_equal(X.indices, indices)
    assert np.array_equal(X.data, data) and np.array_equal(st.y, y)
    assert st.info()["labels"] == {"-1": int((y < 0).sum()), "1": int((y > 0).sum())}
    # the printed recovery count is the overlap of the selection with the generator's informative features
    found = len(set(sel.indices.tolist()) & set(gt["informative"]))
    assert f"{found} of the 20 informative features recovered" in res.stdout.replace("\n", " ")


def test_config_namespace_and_env(monkeypatch):
    import dask

    from dufs import config

    assert config.get("store.row-block") == dask.config.get("dufs.store.row-block")
    with dask.config.set({"dufs.store.row-block": 77}):
        assert config.get("store.row-block") == 77
    assert config.parse_bytes("32MiB") == 32 * 2**20
