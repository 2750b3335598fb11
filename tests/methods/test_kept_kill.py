"""A worker that keeps M3FS's scores or UFCM's Y and labels (dufs.engine.kept, the path of workers on several
machines) SIGKILLed in the middle of a run: the run finishes with the selection of an undisturbed one."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest

from dufs.engine import Matrix
from dufs.testing import patience
from tests._planted import two_groups_sparse


def _kept_here() -> int:
    from dufs.engine import kept

    return len(kept._KEPT)


def _data(n=160, d=60, seed=3):
    return two_groups_sparse(n, d, seed, 4)


def _killing(monkeypatch, cls, name, client, at):
    """``cls.name`` wrapped so that its ``at``-th call first SIGKILLs the worker that keeps vectors; the list of
    calls that fired."""
    real = getattr(cls, name)
    fired, n = [], [0]

    def wrapped(self, *a, **k):
        n[0] += 1
        if n[0] == at and not fired:
            pids = client.run(os.getpid)
            holders = [w for w, k in client.run(_kept_here).items() if k]
            assert holders, "no worker keeps vectors"
            fired.append(holders[0])
            os.kill(pids[holders[0]], signal.SIGKILL)
        return real(self, *a, **k)

    monkeypatch.setattr(cls, name, wrapped)
    return fired


@pytest.mark.slow
@pytest.mark.parametrize("method", ["m3fs", "ufcm"])
def test_the_worker_that_keeps_the_samples_side_killed_changes_nothing(monkeypatch, tmp_path, cluster_client, method):
    """(The data in a store, as at scale: the blocks the killed worker held are read again elsewhere.) On the
    session's cluster (its nanny restarts the killed worker; the test waits for it before it ends), not one of its
    own: a cluster started and its workers' imports made cost more than the runs themselves."""
    import dask

    from dufs.data import write_store
    from dufs.methods.m3fs import alternating as ms
    from dufs.methods.m3fs import kept_scores
    from dufs.methods.ufcm import kept as ukept
    from dufs.methods.ufcm import ufcm

    cfg = {"dufs.engine.shared-memory": "off", "dufs.engine.kept-vectors": "on"}
    path = str(tmp_path / "x.zarr")
    write_store(_data(), path, y=np.zeros(160), feature_block=10)

    def run():
        M = Matrix(path, standardize="scale").persist()
        try:
            if method == "m3fs":
                return ms.m3fs_alternating(M, n_features=4, graph="knn", lambda_=0.01, max_iter=1, polish=0)
            return ufcm(M, n_clusters=2, n_components=2, max_iter=4, dense_below=10)
        finally:
            M.release()

    client = cluster_client
    with client.as_current(), dask.config.set(cfg):
        ref = run()
        client.wait_for_workers(2)
        with monkeypatch.context() as mp:
            fired = _killing(mp, kept_scores.KeptScores, "trial", client, 6) if method == "m3fs" else \
                _killing(mp, ukept.KeptY, "u_step", client, 2)
            got = run()
        assert fired
        client.wait_for_workers(2, timeout=patience(120))  # the restarted worker, for the tests after this one
    if method == "m3fs":
        np.testing.assert_array_equal(np.sort(got.selected), np.sort(ref.selected))
        assert got.objective[-1] == pytest.approx(ref.objective[-1], rel=1e-5)
    else:
        top = lambda r: set(np.argsort(-r.scores)[:4])  # noqa: E731
        assert top(got) == top(ref)
        assert np.all(np.diff(got.objective) >= -1e-9 * np.abs(got.objective[1:]))
