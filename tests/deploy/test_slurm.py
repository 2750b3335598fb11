"""``deploy/slurm/dufs_slurm.py``: the job script dask-jobqueue's ``SLURMCluster`` renders for docs/cluster.md's
command (memory, cores, walltime, partition, the worker command), and, without SLURM, that script run with bash
as a job would run it: its workers join the launcher's scheduler and the launcher's selection runs on them."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import shlex
import signal
import subprocess
import sys

import dask.utils
import pytest

import dufs
from dufs.testing import patience
from tests.deploy._support import DEPLOY, ROOT, bash, readme_line, tool_env, wait_until

LAUNCHER = DEPLOY / "slurm" / "dufs_slurm.py"
HEADING = "SLURM"


def _launcher():
    pytest.importorskip("dask_jobqueue", reason="the launcher needs dask-jobqueue (pip install -e '.[test]')")
    spec = importlib.util.spec_from_file_location("dufs_slurm", LAUNCHER)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _args(line: str) -> list[str]:
    words = shlex.split(line)
    assert words[:2] == ["python", "deploy/slurm/dufs_slurm.py"], words
    return words[2:]


def test_dry_run_renders_the_job_script():
    """docs/cluster.md's `--dry-run` line, as written: one job of 8 CPUs and 64 GiB for 4 hours on `compute`, running 8
    worker processes of one thread and 8 GiB each, spilling to the node's own disk."""
    _launcher()
    line = readme_line(HEADING, "--dry-run")
    res = bash(line.replace("python ", f"{shlex.quote(sys.executable)} ", 1), tool_env(), ROOT, timeout=patience(120))
    assert res.returncode == 0, res.stderr
    script = res.stdout
    directives = dict(re.findall(r"^#SBATCH (\S+?)(?:[ =](\S+))?$", script, flags=re.M))
    assert directives["--cpus-per-task"] == "8" and directives["--mem"] == "64G"
    assert directives["-t"] == "04:00:00" and directives["-p"] == "compute" and directives["-n"] == "1"
    worker = [ln for ln in script.splitlines() if "distributed.cli.dask_worker" in ln]
    assert len(worker) == 1
    w = shlex.split(worker[0], posix=False)
    assert w[w.index("--nthreads") + 1] == "1" and w[w.index("--nworkers") + 1] == "8"
    assert dask.utils.parse_bytes(w[w.index("--memory-limit") + 1]) == dask.utils.parse_bytes("8GiB")
    assert w[w.index("--local-directory") + 1] == "${TMPDIR:-/tmp}"  # expanded by the job's shell, on the node
    assert "--nanny" in w and "--death-timeout" in w


@pytest.mark.slow
def test_the_job_script_runs_workers_for_the_launchers_selection(tmp_path, train_store):
    """docs/cluster.md's launch line, sized for this machine (1 job of 2 cores and 2 GiB) and pointed at the local
    store: its cluster's job script run with bash (TMPDIR a folder of this test) starts 2 workers of one thread and
    1 GiB on the launcher's scheduler, spilling under TMPDIR, and the launcher's `dufs select` runs on them."""
    mod = _launcher()
    line = readme_line(HEADING, "dufs_slurm.py", without="--dry-run")
    args = mod.parse_args(_args(line))
    assert (args.method, args.k, args.jobs, args.cores, args.memory) == ("mmfs", 200, 4, 8, "64GiB")
    out = tmp_path / "sel.json"
    args = mod.parse_args([str(train_store), "--method", "fisher", "-k", "50", "-o", str(out), "--jobs", "1",
                           "--cores", "2", "--memory", "2GiB", "--walltime", args.walltime, "--partition",
                           args.partition, "--scheduler-host", "127.0.0.1"])
    node_tmp = tmp_path / "node-tmp"
    node_tmp.mkdir()
    with mod.make_cluster(args) as cluster:
        assert cluster.scheduler_address.startswith("tcp://127.0.0.1:")
        script = tmp_path / "job.sh"
        script.write_text(cluster.job_script())
        job = subprocess.Popen(["bash", str(script)], env=tool_env(TMPDIR=str(node_tmp)), start_new_session=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            from distributed import Client

            with Client(cluster) as client:
                wait_until(lambda: len(client.scheduler_info(n_workers=-1)["workers"]) == 2 or job.poll() is not None,
                           120, "the job's 2 workers")
                info = client.scheduler_info(n_workers=-1)["workers"]
                assert len(info) == 2, f"the job script exited ({job.returncode})"
                assert {w["nthreads"] for w in info.values()} == {1}
                assert {w["memory_limit"] for w in info.values()} == {dask.utils.parse_bytes("1GiB")}
                dirs = client.run(lambda dask_worker: dask_worker.local_directory)
                assert all(d.startswith(str(node_tmp)) for d in dirs.values()), dirs
                assert mod.select(cluster.scheduler_address, args) == 0
        finally:
            with contextlib.suppress(ProcessLookupError):  # the job's end, as scancel's SIGKILL: every process
                os.killpg(job.pid, signal.SIGKILL)
            job.wait(timeout=patience(60))
    sel = dufs.Selection.from_json(out)
    assert sel.diagnostics["n_workers"] == 2
    want = dufs.fit(str(train_store), method="fisher", n_features=50, client=False)
    assert sel.indices.tolist() == want.indices.tolist()


def test_without_dask_jobqueue_one_line_names_the_extra(tmp_path):
    """The launcher run where dask-jobqueue cannot be imported (None in ``sys.modules``, as for a module that is
    not installed): one line naming the ``deploy`` extra that provides it, no traceback, a non-zero exit."""
    code = ("import runpy, sys; sys.modules['dask_jobqueue'] = None; "
            "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')")
    res = subprocess.run([sys.executable, "-c", code, str(LAUNCHER), "x.zarr", "--method", "fisher", "-k", "3",
                          "-o", "sel.json", "--dry-run"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=patience(60))
    assert res.returncode != 0 and res.stdout == ""
    assert "Traceback" not in res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert "dask-jobqueue" in lines[0] and "[deploy]" in lines[0], lines[0]
