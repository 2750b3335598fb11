"""``dufs bench pass`` at a tiny size: it runs end to end and prints its figures (no timing assertions)."""

from __future__ import annotations

from typer.testing import CliRunner

from dufs.cli import app


def test_bench_pass_prints_the_table_and_reuses_the_store(tmp_path):
    args = ["bench", "pass", "--rows", "3000", "--features", "4000", "--nnz-per-row", "5", "--repeats", "2",
            "--dir", str(tmp_path)]
    res = CliRunner().invoke(app, args, env={"COLUMNS": "160"})
    assert res.exit_code == 0, res.output
    out = res.output
    assert "store: building" in out
    for label in ("SciPy X.T @ v", "dufs rmatvec, 1 worker", "dufs rmatvec, 2 workers", "Mnnz/s",
                  "1 worker / SciPy", "speed-up 2 workers vs 1", "where a pass goes, 1 worker", "overhead",
                  "results agree with SciPy: yes"):
        assert label in out, (label, out)

    # the same spec again: the store is reused, not rebuilt
    from dufs.bench import ensure_synthetic_store
    from dufs.data.synthetic import SyntheticSpec

    said: list[str] = []
    (store,) = tmp_path.glob("synthetic-3000x4000x5-*.zarr")
    st = ensure_synthetic_store(store, SyntheticSpec(n_rows=3000, n_features=4000, nnz_per_row=5), say=said.append)
    assert st.shape == (3000, 4000)
    assert said and said[0].startswith("store: reusing")


def test_bench_rejects_an_unknown_benchmark():
    res = CliRunner().invoke(app, ["bench", "nothing"])
    assert res.exit_code != 0
    assert "ingest, pass" in res.output
