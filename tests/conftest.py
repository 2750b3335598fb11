"""Shared fixtures: fresh store paths (local, ``memory://``) and one process-based Dask cluster."""

from __future__ import annotations

import itertools
import uuid

import pytest


@pytest.fixture
def store_path(tmp_path):
    """A factory of fresh store paths: ``store_path()`` (a local directory under ``tmp_path``),
    ``store_path("memory")`` (a unique ``memory://`` URL, removed with its siblings at teardown).

    Every call gives a new path, so a Hypothesis test may call it once per example.
    """
    import fsspec

    counter = itertools.count()
    roots: list[str] = []

    def make(kind: str = "local", name: str = "store") -> str:
        if kind == "local":
            return str(tmp_path / f"{name}-{next(counter)}.zarr")
        if kind == "memory":
            root = f"dufs-test-{uuid.uuid4().hex}"
            roots.append(root)
            return f"memory://{root}/{name}.zarr"
        raise ValueError(f"kind must be 'local' or 'memory'; got {kind!r}")

    yield make
    fs = fsspec.filesystem("memory")
    for root in roots:
        if fs.exists(f"/{root}"):
            fs.rm(f"/{root}", recursive=True)


@pytest.fixture(scope="session")
def cluster_client():
    """A ``distributed.Client`` on a ``LocalCluster`` of 2 worker processes (1 thread each).

    Session-scoped and *not* the default client (tests that do not ask for it keep dask's local
    schedulers): run work on it with ``with cluster_client.as_current(): ...`` or
    ``.compute(scheduler=cluster_client)``. Stores it reads must
    be on a filesystem the workers share (a local directory, not ``memory://``).
    """
    distributed = pytest.importorskip("distributed")
    with (
        distributed.LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            dashboard_address=":0",
            silence_logs=40,
        ) as cluster,
        distributed.Client(cluster, set_as_default=False) as client,
    ):
        client.wait_for_workers(2)
        yield client
