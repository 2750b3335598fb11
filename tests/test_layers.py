"""The import-linter ``layers`` contract of pyproject.toml (DESIGN.md section 2) holds."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_layers_contract_is_kept():
    exe = shutil.which("lint-imports")
    cmd = [exe] if exe else [sys.executable, "-m", "importlinter.cli"]
    res = subprocess.run([*cmd, "--config", str(ROOT / "pyproject.toml")], cwd=ROOT, capture_output=True,
                         text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "1 kept, 0 broken" in res.stdout, res.stdout


def test_layers_contract_catches_a_violation(tmp_path):
    """The contract is live: a kernels module importing the storage layer breaks it."""
    import os

    shutil.copytree(ROOT / "dufs", tmp_path / "dufs", ignore=shutil.ignore_patterns("*.npz", "__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    with open(tmp_path / "dufs" / "kernels" / "sparse.py", "a") as f:
        f.write("\nfrom dufs.data import store  # noqa\n")
    exe = shutil.which("lint-imports")
    cmd = [exe] if exe else [sys.executable, "-m", "importlinter.cli"]
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    res = subprocess.run([*cmd, "--config", str(tmp_path / "pyproject.toml"), "--no-cache"], cwd=tmp_path,
                         capture_output=True, text=True, env=env)
    assert res.returncode != 0
    assert "dufs.kernels.sparse" in res.stdout and "BROKEN" in res.stdout, res.stdout
