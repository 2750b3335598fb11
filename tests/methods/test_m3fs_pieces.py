"""M3FS's two-cluster v-step with its scores in row pieces, one a worker (dufs.methods.m3fs.piece_scores, the path of
workers on several machines; ``dufs.engine.side-pieces: on`` makes a piece a worker process on this machine): the
alternation is the driver's up to the order of additions, on an anchor graph and with no manifold term; a kNN graph's
scores stay on one worker; a piece that loses its scores makes the others give up, and the v-step runs again."""

from __future__ import annotations

import numpy as np
import pytest

from dufs.engine import Matrix
from dufs.methods.m3fs import alternating as ms
from dufs.methods.m3fs import piece_scores
from tests._planted import two_groups_sparse

_PIECES = {"dufs.engine.side-pieces": "on"}


def _data(n=160, d=30, seed=1):
    return two_groups_sparse(n, d, seed, 3)


def _spy(monkeypatch):
    """The calls PieceScores makes on its pieces, by name, and the KeptScores made (a list each)."""
    seen: dict = {"calls": [], "whole": []}
    real_calls, real_kept = piece_scores.kept_calls, piece_scores.KeptScores

    def calls(client, fn, specs, **kw):
        seen["calls"].append(specs[0][1] if fn is piece_scores._run else fn.__name__)
        return real_calls(client, fn, specs, **kw)

    def kept(*a, **k):
        seen["whole"].append(1)
        return real_kept(*a, **k)

    monkeypatch.setattr(piece_scores, "kept_calls", calls)
    monkeypatch.setattr(piece_scores, "KeptScores", kept)
    return seen


@pytest.mark.slow
@pytest.mark.parametrize("graph,lam", [("anchor", 0.01), ("anchor", 0.0), ("knn", 0.01)])
def test_scores_in_pieces_solve_as_the_driver_does(both_paths, monkeypatch, graph, lam):
    import dask

    seen = _spy(monkeypatch)
    with dask.config.set(_PIECES):
        got = both_paths(lambda: Matrix(_data(), standardize="scale", block_width=10),
                         lambda M: ms.m3fs_alternating(M, n_features=5, graph=graph, n_anchors=16, n_neighbors=5,
                                                       lambda_=lam, max_iter=1, polish=0))
    a, b = got["off"], got["on"]
    if graph == "knn":  # its Laplacian mixes the rows: the scores stay whole, on one worker
        assert seen["whole"] and not seen["calls"]
    else:
        assert not seen["whole"] and {"_make", "momentum", "trial", "final"} <= set(seen["calls"])
    assert a.diagnostics["samples_side"] == "driver"
    assert b.diagnostics["samples_side"] == ("one worker" if graph == "knn" else "2 pieces")
    assert sum(a.diagnostics["inner_iterations"]) > 10
    np.testing.assert_array_equal(b.selected, a.selected)
    np.testing.assert_array_equal(b.labels, a.labels)
    np.testing.assert_allclose(b.objective, a.objective, rtol=1e-9)
    np.testing.assert_allclose(b.sigma, a.sigma, rtol=1e-7, atol=1e-12)
    np.testing.assert_allclose(b.f, a.f, rtol=1e-7, atol=1e-9)


@pytest.mark.slow
def test_a_piece_that_lost_its_scores_stops_the_others_and_the_v_step_runs_again(both_paths, monkeypatch,
                                                                                    cluster_client, caplog):
    """One worker forgets what it keeps before the third trial: its piece says so at once, the other piece, which
    would wait for its sums, is told to give up, and the v-step runs again with its vectors on the driver."""
    import dask

    from dufs.engine import kept

    real = piece_scores.PieceScores.trial
    count: list = []
    worker = sorted(cluster_client.nthreads())[0]

    def trial(self, *a, **k):
        count.append(1)
        if len(count) == 3:
            cluster_client.run(lambda: kept._KEPT.clear(), workers=[worker])
        return real(self, *a, **k)

    monkeypatch.setattr(piece_scores.PieceScores, "trial", trial)
    caplog.set_level("WARNING", logger="dufs.methods.m3fs.vstep")
    with dask.config.set(_PIECES):
        got = both_paths(lambda: Matrix(_data(), standardize="scale", block_width=10),
                         lambda M: ms.m3fs_alternating(M, n_features=5, graph="anchor", n_anchors=16, lambda_=0.01,
                                                       max_iter=1, polish=0))
    assert len(count) >= 3
    assert "was lost" in caplog.text and "again from its start, its vectors on the driver" in caplog.text
    np.testing.assert_array_equal(got["on"].selected, got["off"].selected)
    assert got["on"].objective[-1] == pytest.approx(got["off"].objective[-1], rel=1e-6)
