"""Calls on kept vectors side by side (dufs.engine.kept.kept_calls): each on its own worker, its arrays kept there,
the seconds counted the slowest call's; a call that fails lets go what the others kept."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from dufs.engine import kept


def _keep_scaled(v, s):
    return float(v.sum() * s), [v * s]


def _boom(v):
    raise ValueError("boom")


def _tokens():
    return sorted(kept._KEPT)


def _held(client):
    return {t for ts in client.run(_tokens).values() for t in ts}


def test_calls_side_by_side_each_on_its_worker(cluster_client):
    client = cluster_client
    workers = sorted(client.scheduler_info(n_workers=-1)["workers"])[:2]
    v = np.arange(6.0)
    before = kept.seconds()
    got = kept.kept_calls(client, _keep_scaled, [(v, 2.0), (v, 3.0)], keep=1, where=workers)
    assert kept.seconds() >= before
    assert [small for small, _ in got] == [30.0, 45.0]
    handles = [h[0] for _, h in got]
    assert [h.address for h in handles] == workers
    np.testing.assert_array_equal(kept.fetch(client, handles[1]), v * 3.0)
    # a call on kept vectors goes where they are, whatever ``where`` says
    again = kept.kept_calls(client, _keep_scaled, [(handles[0], 0.5)], keep=1, where=[workers[1]])
    assert again[0][1][0].address == workers[0] and again[0][0] == 15.0
    tokens = {h.token for h in handles} | {again[0][1][0].token}
    del got, handles, again
    gc.collect()
    kept.flush(client)
    assert not tokens & _held(client)


def test_a_failed_call_lets_go_what_the_others_kept(cluster_client):
    client = cluster_client
    workers = sorted(client.scheduler_info(n_workers=-1)["workers"])[:2]
    held = _held(client)
    with pytest.raises(ValueError, match="boom"):
        kept.kept_calls(client, lambda v, s: _boom(v) if s < 0 else _keep_scaled(v, s),
                        [(np.ones(3), 1.0), (np.ones(3), -1.0)], keep=1, where=workers)
    gc.collect()  # the failed call's futures, held by its traceback, released
    kept.flush(client)
    assert _held(client) <= held
