"""docs/cluster.md's worker sizing ("Sizing workers"): its snippet runs and prints what its comments say, and its kddb
table is the memory model's."""

from __future__ import annotations

import re

import pytest

from dufs.memory import STARTUP_DRIVER, STARTUP_WORKER, memory_model
from tests.deploy._support import README, readme_blocks

KDDB = (19_264_097, 29_890_095, 577_900_000)


def test_sizing_snippet_says_what_it_computes():
    (code,) = readme_blocks("Sizing workers", lang="python")
    scope: dict = {}
    exec("\n".join(code), scope)  # docs/cluster.md's own snippet
    for line in code:
        m = re.match(r"(\w+) = .*#\s*([\d.]+) GiB", line)
        if m:
            assert round(scope[m.group(1)], 1) == pytest.approx(float(m.group(2))), line
    assert scope["limit"] == pytest.approx(scope["per_worker"] / 0.6)


def test_sizing_table_is_the_memory_models():
    section = README.read_text().split("\n## Sizing workers", 1)[1].split("\n## ", 1)[0]
    rows = {r.split("|")[1].strip(): [c.strip() for c in r.split("|")[2:-1]] for r in section.splitlines()
            if r.startswith("| ") and ("GiB a worker" in r)}
    assert set(rows) == {"Fisher, correlation, variance: GiB a worker (limit)", "MMFS: GiB a worker (limit)"}
    for label, method in (("Fisher", "fisher"), ("MMFS", "mmfs")):
        cells = next(v for k, v in rows.items() if k.startswith(label))
        for cell, p in zip(cells[:3], (2, 4, 8), strict=True):
            m = memory_model(*KDDB, method, n_workers=p)
            per = (m.workers / p + STARTUP_WORKER) / 2**30
            assert cell == f"{per:.1f} ({per / 0.6:.1f})", (label, p, cell)
        m = memory_model(*KDDB, method, n_workers=2)
        assert cells[3] == f"{(m.driver + STARTUP_DRIVER) / 2**30:.1f}", (label, cells[3])
