"""The console scripts of the environment the tests run in (``lint-imports``, ``dask``, ``dufs``,
``check-jsonschema``), found whatever PATH holds.

A virtual environment's scripts sit beside its interpreter (``VENV/bin``). ``VENV/bin/python -m pytest`` run
without activating the venv does not have them on PATH, so ``shutil.which(name)`` misses them, or finds another
environment's (issue 60). Tests that run a console script take it from here: the script in this interpreter's
scripts folder, else its entry point run by this interpreter, and ``None`` only where the distribution that
provides it is not installed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from importlib.metadata import entry_points
from pathlib import Path

from dufs.testing import patience

#: where this interpreter's environment puts its console scripts: the install scheme's scripts folder and the
#: interpreter's own folder (the same one in a venv; not always elsewhere, e.g. a distribution's python3 with
#: scripts in /usr/local/bin)
SCRIPT_DIRS: tuple[str, ...] = tuple(dict.fromkeys(
    d for d in (sysconfig.get_path("scripts"), str(Path(sys.executable).parent)) if d))

#: the import-linter contract of pyproject.toml; its name in the linter's report is the proof the check ran
LAYERS_CONTRACT = "dufs layers (docs/architecture.md, Layers)"


def console_script(name: str) -> list[str] | None:
    """The argv that runs console script ``name`` of this environment, whatever PATH holds; ``None`` if no
    installed distribution provides it."""
    exe = shutil.which(name, path=os.pathsep.join(SCRIPT_DIRS))
    if exe is not None:
        return [exe]
    if not entry_points(group="console_scripts", name=name):
        return None
    # the script is elsewhere (a --user install, say): its entry point, as the script would call it
    code = ("import sys; from importlib.metadata import entry_points; "
            f"sys.argv[0] = {name!r}; "
            f"sys.exit(next(iter(entry_points(group='console_scripts', name={name!r}))).load()())")
    return [sys.executable, "-c", code]


def lint_imports(config: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run import-linter's ``lint-imports`` on the contracts of ``config`` (a pyproject.toml), in its folder."""
    cmd = console_script("lint-imports")
    assert cmd is not None, "import-linter is not installed (pip install -e '.[test]')"
    return subprocess.run([*cmd, "--config", str(config), *args], cwd=Path(config).parent, capture_output=True,
                          text=True, env=env, timeout=patience(120))
