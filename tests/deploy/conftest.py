"""Fixtures of the ``deploy/`` tests, each started once for the folder (package scope) and stopped after its last
test: a work folder with ``deploy/`` linked in, a libsvm file, an S3-compatible server (moto's server mode on
127.0.0.1), a cluster of 2 worker processes started by ``deploy/local/dufs-cluster`` with the server's
credentials in its environment, and the libsvm file converted on it."""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from dufs.testing import patience
from tests.deploy._support import (
    SMALL_BLOCKS,
    WORKER_MEMORY,
    LocalCluster,
    bash,
    link_deploy,
    pid_alive,
    readme_line,
    start_cluster,
    tool_env,
    write_libsvm,
)

BUCKET = "my-bucket"  # docs/cluster.md's


@pytest.fixture(scope="package")
def work(tmp_path_factory) -> Path:
    """The folder docs/cluster.md's lines run in: ``deploy/`` linked to the repository's, ``train.svm``,
    ``train.zarr``."""
    d = tmp_path_factory.mktemp("deploy")
    link_deploy(d)
    return d


@pytest.fixture(scope="package")
def train_svm(work) -> Path:
    path = work / "train.svm"
    write_libsvm(path)
    return path


@dataclass
class S3:
    """An S3-compatible server on 127.0.0.1: the environment that points clients at it, and a boto3 client."""

    env: dict[str, str]
    client: object
    bucket: str


@pytest.fixture(scope="package")
def s3() -> S3:
    pytest.importorskip("s3fs", reason="s3:// URLs need s3fs (pip install -e '.[test]')")
    boto3 = pytest.importorskip("boto3")
    server = pytest.importorskip("moto.server",
                                 reason="the S3 server needs moto[s3] and flask (pip install -e '.[test]')")
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one log line a request
    srv = server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    srv.start()
    try:
        host, port = srv.get_host_and_port()
        env = {"AWS_ACCESS_KEY_ID": "dufs-test", "AWS_SECRET_ACCESS_KEY": "dufs-test",
               "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": f"http://{host}:{port}",
               "AWS_EC2_METADATA_DISABLED": "true"}
        client = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], region_name="us-east-1",
                              aws_access_key_id="dufs-test", aws_secret_access_key="dufs-test")
        client.create_bucket(Bucket=BUCKET)
        yield S3(env=env, client=client, bucket=BUCKET)
    finally:
        srv.stop()


@pytest.fixture(scope="package")
def _cluster(work, s3) -> LocalCluster:
    """docs/cluster.md's local cluster (2 workers of ``WORKER_MEMORY``) with the S3 server's credentials in its
    environment; stopped by docs/cluster.md's stop line, which must leave no process behind."""
    if os.name != "posix":
        pytest.skip("deploy/local/dufs-cluster is a bash script")
    _warm_kernels(work / "warm.zarr")
    env = tool_env(DUFS_CLUSTER_DIR=str(work / "dufs-cluster"), DUFS_CLUSTER_PORT="0",
                   DUFS_CLUSTER_DASHBOARD_PORT="0", DUFS_CLUSTER_IDLE_TIMEOUT="900s", WORKER_MEMORY=WORKER_MEMORY,
                   **SMALL_BLOCKS, **s3.env)
    cluster = start_cluster(work, env)
    pids = [cluster.scheduler_pid(), *cluster.worker_pids()]
    try:
        yield cluster
    finally:
        with contextlib.suppress(Exception), cluster.client() as c:
            pids += list(c.run(os.getpid).values())  # the worker processes themselves (the nannies' children)
        res = bash(readme_line("Local processes", "dufs-cluster stop"), env, work, timeout=patience(120))
        assert res.returncode == 0, res.stderr
        left = [p for p in pids if pid_alive(p)]
        assert not left, f"processes still running after `dufs-cluster stop`: {left}"


def _warm_kernels(path: Path) -> None:
    """Compile (or load) dufs' numba kernels here, writing their on-disk caches, before any worker starts: two
    workers compiling the same kernel at once race on its cache files (see ``tests/conftest.py``). The
    conversion's and the filters' kernels, then MMFS's on a float32 store, like the workers will run."""
    import numpy as np
    import scipy.sparse as sp

    import dufs
    from tests.conftest import _warm_numba_caches

    _warm_numba_caches()
    X = sp.random_array((60, 12), density=0.3, rng=0, format="csr")
    dufs.write_store(X, str(path), np.arange(60) % 2)
    dufs.fit(str(path), method="mmfs", n_features=3, client=False, checkpoint=None)


@pytest.fixture
def cluster(_cluster) -> LocalCluster:
    """The local cluster with both workers connected (a worker killed by an earlier test is back by now)."""
    _cluster.wait_for_workers(2)
    return _cluster


@pytest.fixture(scope="package")
def train_store(_cluster, train_svm) -> Path:
    """``train.svm`` converted on the cluster by docs/cluster.md's line: ``train.zarr`` in the work folder."""
    _cluster.wait_for_workers(2)
    res = bash(readme_line("Local processes", "dufs convert"), _cluster.env, _cluster.cwd)
    assert res.returncode == 0, res.stderr
    path = _cluster.cwd / "train.zarr"
    assert path.is_dir()
    return path
