"""What the tests of ``deploy/`` share: docs/cluster.md's commands (the tests run them as written), the environment the
command lines run in, a small libsvm file, and the local cluster ``deploy/local/dufs-cluster`` starts."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dufs.testing import patience
from tests._scripts import SCRIPT_DIRS

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
#: the page whose commands these tests run as written (docs/cluster.md points to it)
README = ROOT / "docs" / "cluster.md"

#: a worker's memory limit in these tests (docs/cluster.md: "$WORKER_MEMORY", from the sizing rule)
WORKER_MEMORY = "1GiB"

#: small feature blocks, so that a few thousand rows make several blocks spread over both workers
SMALL_BLOCKS = {"DASK_DUFS__STORE__FEATURE_BLOCK_NNZ": "10000", "DASK_DUFS__STORE__FEATURE_GRANULE": "32"}


# ------------------------------------------------------------------------------------------------ docs/cluster.md
def readme_blocks(heading: str, lang: str = "bash") -> list[list[str]]:
    """The fenced ``lang`` code blocks under ``## heading`` of docs/cluster.md, as lists of lines."""
    text = README.read_text()
    parts = re.split(r"^## (.+)$", text, flags=re.M)
    found = dict(zip(parts[1::2], parts[2::2], strict=True))
    assert heading in found, f"docs/cluster.md has no '## {heading}'; it has {sorted(found)}"
    blocks = re.findall(rf"^```{lang}\n(.*?)^```", found[heading], flags=re.M | re.S)
    return [[ln for ln in b.splitlines() if ln.strip()] for b in blocks]


def readme_line(heading: str, contains: str, *, without: str | None = None) -> str:
    """The one command line of docs/cluster.md's ``heading`` section that contains ``contains`` (and not
    ``without``)."""
    lines = [ln for b in readme_blocks(heading) for ln in b
             if contains in ln and (without is None or without not in ln)]
    assert len(lines) == 1, f"docs/cluster.md '## {heading}': {len(lines)} lines contain {contains!r}: {lines}"
    return lines[0]


def readme_lines_before(heading: str, contains: str) -> list[str]:
    """The lines of docs/cluster.md's ``heading`` code block that come before its one line containing ``contains``
    (what that line needs set first, e.g. ``$WORKER_MEMORY``)."""
    (block,) = [b for b in readme_blocks(heading) if any(contains in ln for ln in b)]
    return block[:next(i for i, ln in enumerate(block) if contains in ln)]


# ------------------------------------------------------------------------------------------------ processes
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tool_env(**extra: str) -> dict[str, str]:
    """The environment command lines run in: this interpreter's scripts (``dufs``, ``dask``, ``check-jsonschema``)
    first on PATH, whatever PATH held (a venv's python run without activating it), ``PYTHON`` this interpreter,
    and ``extra``."""
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([*SCRIPT_DIRS, env.get("PATH", "")])
    env["PYTHON"] = sys.executable
    env.update(extra)
    return env


def bash(line: str, env: dict[str, str], cwd: Path, timeout: float = patience(300)) -> subprocess.CompletedProcess:
    """Run a line of docs/cluster.md with bash, as written."""
    return subprocess.run(["bash", "-c", line], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def stop_process(p: subprocess.Popen, timeout: float = patience(20)) -> None:
    """SIGTERM ``p`` (and its process group when it leads one), SIGKILL after ``timeout`` seconds."""
    if p.poll() is not None:
        return
    group = os.getpgid(p.pid) == p.pid
    with contextlib.suppress(ProcessLookupError):
        os.killpg(p.pid, signal.SIGTERM) if group else p.terminate()
    try:
        p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL) if group else p.kill()
        p.wait(timeout=timeout)


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, ended but not yet reaped, does not)."""
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


# ------------------------------------------------------------------------------------------------ data
def write_libsvm(path: Path, n_rows: int = 4000, n_features: int = 400, seed: int = 7) -> None:
    """A small binary problem in libsvm text: sparse counts, labels from 15 informative features and noise."""
    import scipy.sparse as sp
    from sklearn.datasets import dump_svmlight_file

    rng = np.random.default_rng(seed)
    X = sp.random(n_rows, n_features, density=0.05, format="csr", random_state=rng)
    X.data = np.ceil(X.data * 4)
    w = np.zeros(n_features)
    w[rng.choice(n_features, 15, replace=False)] = rng.normal(0, 1, 15)
    y = np.where(X @ w + 0.3 * rng.standard_normal(n_rows) > 0, 1, -1)
    dump_svmlight_file(X, y, str(path), zero_based=False)


def selection(path: Path) -> dict:
    return json.loads(Path(path).read_text())


# ------------------------------------------------------------------------------------------------ the local cluster
@dataclass
class LocalCluster:
    """A cluster started by ``deploy/local/dufs-cluster``, with the environment and folder its commands run in."""

    address: str
    env: dict[str, str]
    cwd: Path
    state: Path

    def client(self):
        """A ``distributed.Client`` on the cluster (close it: ``with cluster.client() as c``)."""
        from distributed import Client

        return Client(self.address, timeout=patience(30))

    def worker_pids(self) -> list[int]:
        return [int((self.state / "run" / f).read_text()) for f in sorted(os.listdir(self.state / "run"))
                if f.startswith("worker-")]

    def scheduler_pid(self) -> int:
        return int((self.state / "run" / "scheduler.pid").read_text())

    def wait_for_workers(self, n: int = 2, timeout: float = patience(120)) -> None:
        with self.client() as c:
            c.wait_for_workers(n, timeout=timeout)


def start_cluster(cwd: Path, env: dict[str, str]) -> LocalCluster:
    """Run docs/cluster.md's start line, after the lines before it (``$WORKER_MEMORY``), in ``cwd`` (which links
    ``deploy/`` to the repository's) and return the cluster."""
    start = [*readme_lines_before("Local processes", "dufs-cluster start"),
             readme_line("Local processes", "dufs-cluster start")]
    res = bash("\n".join([*start, 'printf "%s" "$ADDR"']), env, cwd, timeout=patience(180))
    assert res.returncode == 0 and res.stdout.startswith("tcp://127.0.0.1:"), (res.stdout, res.stderr)
    return LocalCluster(address=res.stdout, env={**env, "ADDR": res.stdout}, cwd=cwd,
                        state=Path(env["DUFS_CLUSTER_DIR"]))


def link_deploy(cwd: Path) -> None:
    """``cwd/deploy`` -> the repository's ``deploy/``: docs/cluster.md's lines call ``deploy/...`` from the
    repository root."""
    link = cwd / "deploy"
    if not link.exists():
        link.symlink_to(DEPLOY, target_is_directory=True)


def which(name: str) -> str | None:
    return shutil.which(name, path=tool_env()["PATH"])


def wait_until(predicate, timeout: float, what: str, every: float = 0.05):
    """Poll ``predicate()`` until it is truthy (return it) or ``timeout`` seconds have passed (fail naming
    ``what``)."""
    end = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(every)
