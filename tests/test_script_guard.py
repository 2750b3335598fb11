"""A script that starts dufs's embedded cluster from its unguarded top-level code gets one clear error before any
worker process starts (spawned workers import the script again); guarded scripts, functions called from the
guard, ``python -c`` and ``-m`` runs are left alone."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import scipy.sparse as sp


def _run(tmp_path, name, code, *args, timeout=180):
    path = tmp_path / name
    path.write_text(textwrap.dedent(code))
    return subprocess.run([sys.executable, *args, str(path)] if not args else [sys.executable, *args],
                          cwd=tmp_path, capture_output=True, text=True, timeout=timeout)


def test_where_the_call_is_decides(tmp_path):
    code = '''
        from dufs.engine.cluster import unguarded_script

        def helper():
            return unguarded_script()

        print("top", helper() is not None)
        if __name__ == "__main__":
            print("guard", helper() is not None)
            for _ in range(1):
                print("nested", unguarded_script() is not None)
        if True:
            print("other-if", helper() is not None)
    '''
    got = _run(tmp_path, "where.py", code)
    assert got.returncode == 0, got.stderr
    assert got.stdout.split("\n")[:4] == ["top True", "guard False", "nested False", "other-if True"]
    c = subprocess.run([sys.executable, "-c", "from dufs.engine.cluster import unguarded_script as u; print(u())"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert c.returncode == 0 and c.stdout.strip() == "None", c.stderr


@pytest.mark.slow
def test_an_unguarded_script_is_told_before_any_worker_starts(tmp_path):
    import dufs

    X = sp.random_array((300, 200), density=0.05, rng=0, format="csr")
    dufs.write_store(X, str(tmp_path / "s.zarr"), y=np.arange(300) % 2)
    body = '''
        import dask
        import dufs

        dask.config.set({"dufs.engine.inline-nnz": 0})  # the store is small: make it take the cluster
        {call}
    '''
    got = _run(tmp_path, "noguard.py", body.replace("{call}", 'print(dufs.fit("s.zarr", method="fisher", '
                                                                  'n_features=3).indices.tolist())'), timeout=120)
    assert got.returncode == 1
    assert "noguard.py starts a local Dask cluster from its top-level code" in got.stderr
    assert 'if __name__ == "__main__":' in got.stderr
    assert "Nanny" not in got.stderr and len(got.stderr.splitlines()) < 30
    guarded = body.replace("{call}", 'if __name__ == "__main__":\n            print(dufs.fit("s.zarr", '
                                     'method="fisher", n_features=3).indices.tolist())')
    ok = _run(tmp_path, "guarded.py", guarded)
    assert ok.returncode == 0, ok.stderr[-3000:]
    assert len(json.loads(ok.stdout)) == 3 and "Nanny failed" not in ok.stderr
