"""The import-linter contracts of pyproject.toml hold: the ``layers`` one (DESIGN.md section 2) and the one that keeps
the methods on the engine's public API.

The linter runs as its console script ``lint-imports``, found beside this interpreter whatever PATH holds
(``tests._scripts``); every check requires the contract's name and the kept/broken counts in its report, so a
linter that did not run fails the test (issue 60: ``python -m importlinter.cli`` imports the module and exits 0 with
nothing on stdout)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from dufs.testing import patience
from tests import _scripts
from tests._scripts import lint_imports

ROOT = Path(__file__).resolve().parents[1]
# the contracts' names, read from pyproject.toml's [[tool.importlinter.contracts]] tables (no tomllib: Python 3.10)
CONTRACTS = [re.search(r'^name\s*=\s*"([^"]+)"', table.split("\n[", 1)[0], re.M).group(1)
             for table in (ROOT / "pyproject.toml").read_text().split("[[tool.importlinter.contracts]]")[1:]]


def _report(res: subprocess.CompletedProcess) -> str:
    return res.stdout + res.stderr or f"{res.args[:2]} printed nothing: the linter did not run"


def _assert_kept(res: subprocess.CompletedProcess) -> None:
    out = _report(res)
    assert res.returncode == 0, out
    assert CONTRACTS, "pyproject.toml has no import-linter contract"
    for name in CONTRACTS:
        assert f"{name} KEPT" in res.stdout, out
    assert f"Contracts: {len(CONTRACTS)} kept, 0 broken." in res.stdout, out


def test_layers_contract_is_kept():
    _assert_kept(lint_imports(ROOT / "pyproject.toml"))


def _broken_by(tmp_path, module: str, line: str, contract: str, edge: str) -> None:
    """A copy of the package with ``line`` appended to ``module`` (a path under dufs/) breaks ``contract`` alone,
    naming the import ``edge``."""
    shutil.copytree(ROOT / "dufs", tmp_path / "dufs", ignore=shutil.ignore_patterns("*.npz", "__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    with open(tmp_path / "dufs" / module, "a") as f:
        f.write(f"\n{line}  # noqa\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    res = lint_imports(tmp_path / "pyproject.toml", "--no-cache", env=env)
    out = _report(res)
    assert res.returncode != 0, out
    assert f"{contract} BROKEN" in res.stdout, out
    assert f"Contracts: {len(CONTRACTS) - 1} kept, 1 broken." in res.stdout, out
    assert edge in res.stdout, out


def test_layers_contract_catches_a_violation(tmp_path):
    """The contract is live: a kernels module importing the storage layer breaks it."""
    _broken_by(tmp_path, "kernels/sparse.py", "from dufs.data import store", next(c for c in CONTRACTS
               if "layers" in c), "dufs.kernels.sparse -> dufs.data.store")


def test_methods_contract_catches_an_engine_module(tmp_path):
    """The second contract is live: a method importing one of the engine's modules (here the shared-memory
    transport), not its public API, breaks it."""
    _broken_by(tmp_path, "methods/filters.py", "from dufs.engine.shm import local_array", next(
        c for c in CONTRACTS if c.startswith("methods see the engine")), "dufs.methods.filters -> dufs.engine.shm")


# the venv's scripts are not on PATH: VENV/bin/python -m pytest without activating the venv (issue 60)
BARE_PATH = "/usr/bin:/bin"
RUN_BARE = """
import json, sys
from pathlib import Path
from tests._scripts import lint_imports
res = lint_imports(Path(sys.argv[1]))
print(json.dumps({"returncode": res.returncode, "stdout": res.stdout, "stderr": res.stderr}))
"""


def test_layers_check_runs_without_the_environment_on_path():
    """The check, started by this interpreter in a process whose PATH is only the system's folders (no venv, no
    VIRTUAL_ENV), still finds and runs the linter."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONHOME")}
    env.update(PATH=BARE_PATH, PYTHONPATH=str(ROOT))
    res = subprocess.run([sys.executable, "-c", RUN_BARE, str(ROOT / "pyproject.toml")], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=patience(120))
    assert res.returncode == 0, res.stdout + res.stderr
    inner = json.loads(res.stdout.splitlines()[-1])
    _assert_kept(subprocess.CompletedProcess([], inner["returncode"], inner["stdout"], inner["stderr"]))


def test_layers_check_runs_the_entry_point_when_no_script_is_found(tmp_path, monkeypatch):
    """Where this interpreter's scripts folder has no ``lint-imports`` (a --user install, say), its entry point,
    run by this interpreter, is the linter, not a module that imports and exits."""
    monkeypatch.setattr(_scripts, "SCRIPT_DIRS", (str(tmp_path),))
    cmd = _scripts.console_script("lint-imports")
    assert cmd is not None and cmd[:2] == [sys.executable, "-c"]
    _assert_kept(lint_imports(ROOT / "pyproject.toml"))
