#!/usr/bin/env python3
"""Run a dufs selection on SLURM: dask-jobqueue's ``SLURMCluster`` submits the workers as batch jobs, then
``dufs select`` runs against them from this process (on a login node, or inside a batch job of its own).

    python deploy/slurm/dufs_slurm.py /shared/kddb.zarr --method mmfs -k 200 -o kddb-mmfs.json \\
        --jobs 4 --cores 8 --memory 64GiB --walltime 04:00:00 --partition compute

Each job is one allocation of ``--cores`` CPUs and ``--memory`` on one node, running ``--cores`` worker processes of
one thread each (dufs' numba kernels run one per thread), each with ``--memory / --cores`` as its memory limit; the
workers spill to ``--local-directory`` on the node's own disk (``${TMPDIR:-/tmp}``, expanded where the job runs). The
store must be where every node can read it: a shared filesystem path or an object-store URL (``s3://...``, with the
credentials in this environment, which the jobs inherit), and so must this Python environment (the jobs run the
workers with this interpreter). ``--dry-run`` prints the job script and submits nothing (its scheduler address is a
placeholder on 127.0.0.1).
Needs ``pip install 'dufs[deploy]'`` (dask-jobqueue).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from typing import Any


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="dufs_slurm.py", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("store", help="the dufs store: a path on the shared filesystem, or an object-store URL")
    p.add_argument("--method", "-m", required=True, help="a dufs method (dufs select --help)")
    p.add_argument("-k", "--n-features", dest="k", type=int, required=True, help="how many features to select")
    p.add_argument("-o", "--output", required=True, help="the selection's JSON file")
    p.add_argument("-p", "--param", action="append", default=[], help="a method parameter, name=value (repeatable)")
    p.add_argument("--jobs", type=int, default=2, help="SLURM jobs of workers (default 2)")
    p.add_argument("--cores", type=int, default=1, help="CPUs of a job = its worker processes, 1 thread each")
    p.add_argument("--memory", default="4GiB", help="memory of a job, shared by its workers (default 4GiB)")
    p.add_argument("--walltime", default="01:00:00", help="time limit of a job (default 01:00:00)")
    p.add_argument("--partition", default=None, help="SLURM partition (sbatch -p)")
    p.add_argument("--account", default=None, help="SLURM account (sbatch -A)")
    p.add_argument("--local-directory", default="${TMPDIR:-/tmp}",
                   help="the workers' spill directory on the node's own disk (default ${TMPDIR:-/tmp})")
    p.add_argument("--interface", default=None, help="network interface of the scheduler and workers (e.g. ib0)")
    p.add_argument("--scheduler-host", default=None, help="address the scheduler binds to (default: jobqueue's)")
    p.add_argument("--job-extra", action="append", default=[], help="an extra #SBATCH directive (repeatable)")
    p.add_argument("--wait", type=float, default=600.0, help="seconds to wait for every worker (default 600); "
                                                             "the selection starts with those there by then")
    p.add_argument("--dry-run", action="store_true", help="print the job script, submit nothing")
    return p.parse_args(argv)


def make_cluster(args: argparse.Namespace) -> Any:
    """The ``SLURMCluster`` of ``args`` (its scheduler runs in this process; no job is submitted yet). Without
    dask-jobqueue, one line saying what to install instead of a traceback."""
    try:
        from dask_jobqueue import SLURMCluster
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] != "dask_jobqueue":
            raise  # dask-jobqueue is there, one of its own dependencies is not
        sys.exit("dufs_slurm.py: needs dask-jobqueue, which is not installed: pip install 'dufs[deploy]' "
                 "(from a clone: pip install -e '.[deploy]'), or pip install dask-jobqueue")

    scheduler_options: dict[str, Any] = {"dashboard_address": ":8787"}
    host = "127.0.0.1" if args.dry_run else args.scheduler_host  # a dry run's scheduler serves nobody
    if host:
        scheduler_options = {"host": host, "dashboard_address": f"{host}:0"}
    return SLURMCluster(
        job_name="dufs-worker",
        cores=args.cores,
        processes=args.cores,  # one worker process a core, one thread each
        memory=args.memory,
        walltime=args.walltime,
        queue=args.partition,
        account=args.account,
        local_directory=args.local_directory,
        interface=args.interface,
        job_extra_directives=list(args.job_extra),
        scheduler_options=scheduler_options,
    )


def select(address: str, args: argparse.Namespace) -> int:
    """Run ``dufs select`` against the scheduler at ``address``; its exit status."""
    cmd = [sys.executable, "-m", "dufs.cli", "select", args.store, "--method", args.method, "-k", str(args.k),
           "--scheduler", address, "-o", args.output]
    for item in args.param:
        cmd += ["-p", item]
    return subprocess.run(cmd, check=False).returncode


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with make_cluster(args) as cluster:
        if args.dry_run:
            print(cluster.job_script())
            return 0
        from distributed import Client

        n = args.jobs * args.cores
        cluster.scale(jobs=args.jobs)
        print(f"dufs_slurm: submitted {args.jobs} jobs ({n} workers); scheduler {cluster.scheduler_address}, "
              f"dashboard {cluster.dashboard_link}", file=sys.stderr)
        with Client(cluster) as client:
            t0 = time.monotonic()
            while len(client.scheduler_info()["workers"]) < n and time.monotonic() - t0 < args.wait:
                time.sleep(2)
            have = len(client.scheduler_info()["workers"])
            if have == 0:
                client.wait_for_workers(1)  # the queue is slow: wait for one, without a limit
                have = len(client.scheduler_info()["workers"])
            print(f"dufs_slurm: {have} of {n} workers", file=sys.stderr)
            return select(cluster.scheduler_address, args)


if __name__ == "__main__":
    sys.exit(main())
