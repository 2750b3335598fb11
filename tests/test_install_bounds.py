"""pyproject.toml's lower bounds keep a fresh install from backtracking (issue 59).

With low floors, pip 23.2.1 (Python 3.11's stock pip) with an empty cache was still resolving
``pip install -e '.[test]'`` after 35 minutes: it downloaded 60 releases of aiobotocore, 58 of moto, 25 of
distributed, 14 of dask, then went through dask-ml. ``.ci/fresh-install`` times the real installs in fresh venvs
(network needed); these checks are the static, offline part: every dependency that the resolver backtracked
through, or that pins its neighbours' releases, keeps a floor no older than the one stated here, and the test
extra names aiobotocore so that pip picks it before boto3.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from Python 3.11")

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"

# name -> the oldest lower bound pyproject.toml may state for it, wherever it is listed (dependencies or any extra).
# Each release line pins its neighbours: distributed pins its own dask release, s3fs its fsspec release and an
# aiobotocore range, aiobotocore a few botocore releases, boto3 botocore from its own release on. A floor below
# these lets pip walk back through every older release when the newest ones disagree.
FLOORS = {
    "dask": "2026.8",
    "distributed": "2026.8",
    "s3fs": "2026.9",
    "aiobotocore": "3.10",
    "boto3": "1.43.115",
    "moto": "5.2",
    "dask-jobqueue": "0.9",
    "dask-kubernetes": "2026.3",
    "cvxpy": "1.9",
}


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirements() -> list[tuple[str, Requirement]]:
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    out = [("dependencies", Requirement(r)) for r in project["dependencies"]]
    for extra, reqs in project.get("optional-dependencies", {}).items():
        out += [(f"[{extra}]", Requirement(r)) for r in reqs]
    return out


def _lower_bound(req: Requirement) -> Version | None:
    bounds = [Version(s.version) for s in req.specifier if s.operator in (">=", "==", "~=", ">")]
    return max(bounds) if bounds else None


def test_every_listed_floor_is_recent_enough():
    problems = []
    seen = set()
    for where, req in _requirements():
        name = _canonical(req.name)
        if name not in FLOORS:
            continue
        seen.add(name)
        floor = Version(FLOORS[name])
        bound = _lower_bound(req)
        if bound is None or bound < floor:
            problems.append(f"{where}: {req} (needs >={floor})")
    assert not problems, (
        "lower bounds older than issue 59's floors; pip backtracks through every release above them "
        "(.ci/fresh-install times it): " + "; ".join(problems)
    )
    # the floors are about what the project lists: each name must still be listed somewhere
    assert seen == set(FLOORS), f"FLOORS names packages pyproject.toml no longer lists: {sorted(set(FLOORS) - seen)}"


def test_the_test_extra_names_aiobotocore_beside_boto3_and_s3fs():
    # pip resolves the names of one depth in alphabetical order: aiobotocore listed beside boto3 is picked first,
    # its narrow botocore range is then known, and pip steps boto3 down to a release that fits instead of
    # backtracking through aiobotocore, s3fs and moto
    test = {_canonical(req.name) for where, req in _requirements() if where == "[test]"}
    if {"boto3", "s3fs"} <= test:
        assert "aiobotocore" in test


def test_no_upper_bounds_on_the_backtracked_packages():
    # an upper bound goes stale with the next s3fs/aiobotocore release and brings the backtracking back
    capped = [
        f"{where}: {req}"
        for where, req in _requirements()
        if _canonical(req.name) in FLOORS and any(s.operator in ("<", "<=", "==", "~=") for s in req.specifier)
    ]
    assert not capped, f"upper bounds on packages pip backtracks through: {capped}"
