"""Shared fixtures: fresh store paths (local, ``memory://``) and one process-based Dask cluster."""

from __future__ import annotations

import itertools
import uuid

import pytest

from dufs.testing import patience


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


@pytest.fixture
def cluster_client(_session_cluster):
    """A ``distributed.Client`` on a ``LocalCluster`` of 2 worker processes (1 thread each).

    Session-scoped underneath (``_session_cluster``); each test gets it with both workers connected: one that
    died or was dropped by the scheduler is restarted by its nanny, and the test waits for it (with a warning
    naming the test, so a CI log shows where it happened) instead of failing on a one-worker or empty cluster.
    """
    n = len(_session_cluster.scheduler_info(n_workers=-1)["workers"])
    if n < 2:
        import warnings

        warnings.warn(f"the test cluster had {n} of 2 workers before this test; waiting for them", stacklevel=1)
        _session_cluster.wait_for_workers(2, timeout=patience(120))
    return _session_cluster


@pytest.fixture(scope="session")
def _session_cluster():
    """A ``distributed.Client`` on a ``LocalCluster`` of 2 worker processes (1 thread each).

    Session-scoped and *not* the default client (tests that do not ask for it keep dask's local
    schedulers): run work on it with ``with cluster_client.as_current(): ...`` or
    ``.compute(scheduler=cluster_client)``. Stores it reads must
    be on a filesystem the workers share (a local directory, not ``memory://``).
    """
    distributed = pytest.importorskip("distributed")
    _warm_numba_caches()
    import dask

    # if the workers ever vanish, tasks fail after this long instead of waiting forever (one full-suite run hung
    # so, with every worker and nanny process of this cluster gone)
    no_workers = dask.config.set({"distributed.scheduler.no-workers-timeout": "120s"})
    with (
        no_workers,
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


def _warm_numba_caches() -> None:
    """Compile dufs' numba kernels once here, writing their on-disk caches, before worker processes start: on a
    fresh clone two workers would otherwise compile the same kernels at once and race on the cache files."""
    import numpy as np
    import scipy.sparse as sp

    import dufs
    from dufs.engine import Matrix
    from dufs.kernels.libsvm import parse_block
    from dufs.kernels.sparse import csr_to_spill, merge_spills

    X = sp.random_array((20, 7), density=0.4, rng=0, format="csr")
    for dt in (np.float32, np.float64):
        M = Matrix(X.astype(dt), standardize="zscore", block_width=3)
        M.column_stats(np.arange(20) % 2)
        M.rmatvec(np.ones(20))
        M.matvec(np.ones(7))
        Xc = X.astype(dt)
        entries, goff = csr_to_spill(Xc.indptr, Xc.indices.astype(np.int32), Xc.data, 4)
        merge_spills(entries, 7, granule=4, bounds=goff[None, np.minimum(np.arange(3), goff.shape[0] - 1)])
    parse_block(b"1 1:2 3:4\n-1 2:1\n")
    parse_block(np.frombuffer(b"1 1:2\n", dtype=np.uint8))
    from dufs.data.synthetic import SyntheticSpec, generate_rows

    generate_rows(SyntheticSpec(n_rows=10, n_features=50, nnz_per_row=3, n_informative=2), 0, 10)
    del dufs


@pytest.fixture
def kept_calls(monkeypatch):
    """``watch(*modules)``: the names of the functions the given modules run through ``dufs.engine.kept_call`` from
    now on (a list, filled as they run): that work went to a worker's kept vectors."""
    from dufs.engine import kept

    calls: list = []
    real = kept.kept_call

    def spy(client, fn, *args, **kw):
        calls.append(fn.__name__)
        return real(client, fn, *args, **kw)

    def watch(*modules):
        for m in modules:
            monkeypatch.setattr(m, "kept_call", spy)
        return calls

    return watch


@pytest.fixture
def both_paths(cluster_client):
    """``run(make, fit, before_kept=None)``: ``fit(M)`` on the matrix ``make()`` (persisted on the session's cluster,
    shared memory off: the path of workers elsewhere) with the vectors over the samples on the driver, then kept on a
    worker (``dufs.engine.kept-vectors`` off, then on), ``before_kept()`` called in between; {"off": .., "on": ..}."""
    import dask

    def run(make, fit, before_kept=None):
        got = {}
        with cluster_client.as_current(), dask.config.set({"dufs.engine.shared-memory": "off"}):
            M = make().persist()
            try:
                for kv in ("off", "on"):
                    if kv == "on" and before_kept is not None:
                        before_kept()
                    with dask.config.set({"dufs.engine.kept-vectors": kv}):
                        got[kv] = fit(M)
            finally:
                M.release()
        return got

    return run


@pytest.fixture
def forget_kept(monkeypatch, cluster_client):
    """``forget(cls, name, at)``: ``cls.name`` wrapped so that its ``at``-th call first makes every worker of the
    session's cluster forget the vectors it keeps (``dufs.engine.kept``), as a worker that left or restarted has;
    returns the list of its calls (one entry a call)."""

    def forget(cls, name, at):
        from dufs.engine import kept

        real = getattr(cls, name)
        calls: list = []

        def wrapped(self, *a, **k):
            calls.append(1)
            if len(calls) == at:
                cluster_client.run(lambda: kept._KEPT.clear())
            return real(self, *a, **k)

        monkeypatch.setattr(cls, name, wrapped)
        return calls

    return forget
