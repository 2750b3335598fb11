"""``deploy/local/dufs-cluster start`` refusing what cannot work, in one line and before it leaves processes
behind: an empty or unparseable memory limit (an unset ``$WORKER_MEMORY``), a scheduler port already taken."""

from __future__ import annotations

import os
import socket
import subprocess

import pytest

from dufs.testing import patience
from tests.deploy._support import DEPLOY, WORKER_MEMORY, bash, readme_line, readme_lines_before, tool_env

SCRIPT = DEPLOY / "local" / "dufs-cluster"

pytestmark = pytest.mark.skipif(os.name != "posix", reason="deploy/local/dufs-cluster is a bash script")


def _run(*args: str, state) -> subprocess.CompletedProcess:
    """``dufs-cluster ARGS -d STATE``; a cluster it started anyway (the bug) is stopped before returning."""
    try:
        return subprocess.run(["bash", str(SCRIPT), *args, "-d", str(state)], env=tool_env(), capture_output=True,
                              text=True, timeout=patience(60))
    finally:
        subprocess.run(["bash", str(SCRIPT), "stop", "-d", str(state)], env=tool_env(), capture_output=True,
                       timeout=patience(120))


@pytest.mark.parametrize("limit", ["", "lots", "-1GiB"])
def test_start_refuses_a_memory_limit_dask_cannot_parse(tmp_path, limit):
    """Empty (``--memory-limit "$WORKER_MEMORY"`` with the variable unset) or not a size: one line naming the
    option and the value, a non-zero exit, and no scheduler started (its log would be there)."""
    res = _run("start", "-n", "1", "--memory-limit", limit, "-p", "0", "--dashboard-port", "0",
               state=tmp_path / "state")
    assert res.returncode != 0
    assert res.stdout == ""
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert "--memory-limit" in lines[0] and f"got '{limit}'" in lines[0], lines[0]
    assert not (tmp_path / "state" / "logs" / "scheduler.log").exists()


def test_start_on_a_busy_port_says_the_port_is_in_use(tmp_path):
    """The scheduler's port held by another socket: the failure line names the port as in use, without the
    scheduler's traceback."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        res = _run("start", "-n", "1", "-p", str(port), "--dashboard-port", "0", state=tmp_path / "state")
    assert res.returncode != 0
    assert res.stdout == ""
    assert "Traceback" not in res.stderr
    assert f"port {port} on 127.0.0.1 is in use" in res.stderr.strip().splitlines()[-1], res.stderr


def test_readme_sets_worker_memory_before_the_start_line_uses_it(tmp_path):
    """docs/cluster.md's local-cluster block runs as written in a shell without ``$WORKER_MEMORY``: the lines before
    the start line give it a value that ``dufs-cluster`` and dask take (unset, the start line passed an empty
    limit), and keep one the caller set (the tests' ``WORKER_MEMORY``)."""
    import dask.utils

    start = readme_line("Local processes", "dufs-cluster start")
    assert '"$WORKER_MEMORY"' in start
    before = readme_lines_before("Local processes", "dufs-cluster start")
    env = {k: v for k, v in tool_env().items() if k != "WORKER_MEMORY"}
    res = bash("\n".join([*before, 'printf "%s" "$WORKER_MEMORY"']), env, tmp_path, timeout=patience(30))
    assert res.returncode == 0, res.stderr
    assert res.stdout and dask.utils.parse_bytes(res.stdout) > 0, res.stdout
    res = bash("\n".join([*before, 'printf "%s" "$WORKER_MEMORY"']), {**env, "WORKER_MEMORY": WORKER_MEMORY},
               tmp_path, timeout=patience(30))
    assert res.stdout == WORKER_MEMORY
