"""`dufs demo` (the README's first command) runs end to end on a local multi-process cluster."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import dufs
from dufs.testing import patience


@pytest.mark.slow
def test_demo_runs_on_a_local_cluster(tmp_path):
    res = subprocess.run([sys.executable, "-m", "dufs.cli", "demo", "--out", str(tmp_path), "--rows", "20000",
                          "--features", "50000", "--workers", "2"], capture_output=True, text=True,
                         timeout=patience(300))
    assert res.returncode == 0, res.stderr
    assert "20,000 rows x 50,000 features" in res.stdout
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
    text = " ".join(res.stdout.split())
    assert "Fisher score, top 50 of 50,000 features, on 2 workers in" in text
    assert f"{found} of the 20 informative features recovered" in text
    assert "|correlation|, top 50 of 50,000 features, on 2 workers" in text
    mm = dufs.Selection.from_json(tmp_path / "mmfs-50.json")
    found_mm = len(set(mm.indices.tolist()) & set(gt["informative"]))
    assert "MMFS-DCD, top 50 of 50,000 features, on 2 workers in" in text
    assert mm.method == "mmfs" and mm.diagnostics["converged"] and mm.diagnostics["relative_gap"] <= 1e-3
    assert f"{found_mm} of the 20 informative features recovered" in text.split("MMFS-DCD, top 50")[1][:200]
    # the real set: stores of a stratified 75/25 split of PCMAC, and the table's accuracies are LinearSVC(C=1) on
    # the top K features of a dense NumPy Fisher score, computed here independently
    from sklearn.model_selection import train_test_split
    from sklearn.svm import LinearSVC

    from dufs.data.datasets import load

    X, y = load("pcmac")
    tr, te = train_test_split(np.arange(X.shape[0]), test_size=0.25, stratify=y, random_state=0)
    tr, te = np.sort(tr), np.sort(te)
    train = dufs.open(tmp_path / "pcmac-train.zarr")
    assert np.array_equal(train.to_scipy("csr").toarray(), X[tr].toarray()) and np.array_equal(train.y, y[tr])
    D = X[tr].toarray()
    mu = D.mean(0)
    sb = sum((y[tr] == c).sum() * (D[y[tr] == c].mean(0) - mu) ** 2 for c in (1, 2))
    sw = sum((y[tr] == c).sum() * D[y[tr] == c].var(0) for c in (1, 2))
    with np.errstate(divide="ignore", invalid="ignore"):
        f = np.where(sw > 0, sb / sw, np.where(sb > 0, np.inf, 0.0))
    top = np.argsort(-f, kind="stable")
    for k in (10, 50, 200):
        acc = LinearSVC(C=1.0).fit(X[tr][:, top[:k]], y[tr]).score(X[te][:, top[:k]], y[te])
        row = next(line for line in res.stdout.splitlines() if line.strip("│ ").startswith(f"{k} "))
        assert f"{acc:.4f}" in row.split("│")[2], (k, acc, row)
    assert (tmp_path / "pcmac-accuracy-vs-k.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_config_namespace_and_env():
    import os

    import dask

    from dufs import config

    assert config.get("store.row-block") == dask.config.get("dufs.store.row-block")
    with dask.config.set({"dufs.store.row-block": 77}):
        assert config.get("store.row-block") == 77
    assert config.parse_bytes("32MiB") == 32 * 2**20
    # DASK_DUFS__... variables (read when dask is imported, kept over dufs.yaml's defaults) reach dufs' config in a
    # fresh process: an int, a byte size and a nested key with hyphens
    env = {**os.environ, "DASK_DUFS__STORE__ROW_BLOCK": "4096", "DASK_DUFS__CONVERT__BLOCK_BYTES": "3MiB",
           "DASK_DUFS__ENGINE__PERSIST_FRACTION": "0.25"}
    code = ("from dufs import config; print(config.get('store.row-block'), "
            "config.parse_bytes(config.get('convert.block-bytes')), config.get('engine.persist-fraction'), "
            "config.get('store.chunk-elements'))")
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=patience(120))
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["4096", str(3 * 2**20), "0.25", str(config.get("store.chunk-elements"))], res.stdout
    assert config.get("store.row-block") != 4096 and config.get("engine.persist-fraction") != 0.25
