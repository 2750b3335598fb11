"""The README's tour runs as written: its Python block in a fresh interpreter and its shell lines with bash, in an
empty folder, and each prints what its comments say it does."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests._scripts import SCRIPT_DIRS

ROOT = Path(__file__).resolve().parents[1]


def _tour(lang: str) -> str:
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## A tour\n", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(rf"^```{lang}\n(.*?)^```", section, flags=re.M | re.S)
    return block


def _env() -> dict[str, str]:
    return {**os.environ, "PATH": os.pathsep.join([*SCRIPT_DIRS, os.environ.get("PATH", "")]),
            "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg"}


def test_the_readme_is_short_and_has_the_two_commands():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 120
    assert "pip install -e . && dufs demo" in text and "pip install -e '.[test]' && pytest -q" in text
    for page in ("docs/features.md", "docs/cluster.md", "docs/choosing.md", "examples/quickstart.ipynb"):
        assert f"]({page})" in text and (ROOT / page).is_file()


@pytest.mark.slow
def test_the_python_tour_runs(tmp_path):
    got = subprocess.run([sys.executable, "-c", _tour("python")], cwd=tmp_path, env=_env(), capture_output=True,
                         text=True, timeout=600)
    assert got.returncode == 0, got.stderr[-4000:]
    m = re.match(r"\[([\d\s]+)\]\s+(\d+)\s+(\d+)\s*$", got.stdout)
    assert m, got.stdout
    assert len(m.group(1).split()) == 20 and int(m.group(2)) >= 1  # 20 features as asked; the passes they took
    assert 2 <= int(m.group(3)) <= 20  # the clusters JCFS estimated
    assert json.loads((tmp_path / "pcmac-mmfs.json").read_text())["method"] == "mmfs"
    assert (tmp_path / "pcmac.zarr").is_dir()


@pytest.mark.slow
def test_the_command_line_tour_runs(tmp_path):
    lines = [ln for ln in _tour("bash").splitlines() if ln.strip()]
    assert [ln.split()[:2] for ln in lines] == [["dufs", "make-synthetic"], ["dufs", "select"], ["dufs", "info"]]
    for ln in lines:
        got = subprocess.run(["bash", "-c", ln], cwd=tmp_path, env=_env(), capture_output=True, text=True,
                             timeout=600)
        assert got.returncode == 0, (ln, got.stderr[-3000:])
    assert "laplacian" in got.stdout  # dufs info on the selection
    sel = json.loads((tmp_path / "syn-laplacian.json").read_text())
    assert sel["method"] == "laplacian" and len(sel["indices"]) == 50
