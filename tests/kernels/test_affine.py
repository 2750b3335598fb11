"""``dufs.kernels.affine.standardize_rows`` against NumPy's broadcasting formula."""

from __future__ import annotations

import numpy as np
import pytest

from dufs.kernels.affine import standardize_rows


@pytest.mark.parametrize("p", [1, 2, 5])
@pytest.mark.parametrize("centre,scale", [(True, True), (True, False), (False, True), (False, False)])
def test_standardize_rows_matches_numpy(p, centre, scale):
    rng = np.random.default_rng(p)
    out = rng.standard_normal((50, p))
    mu = rng.standard_normal(50) if centre else None
    inv = rng.random(50) + 0.5 if scale else None
    vsum = rng.standard_normal(p)
    ref = out.copy()
    if centre:
        ref = ref - mu[:, None] * vsum[None, :]
    if scale:
        ref = ref * inv[:, None]
    got = standardize_rows(out, mu, vsum, inv)
    assert got is out
    np.testing.assert_allclose(out, ref, rtol=1e-14, atol=1e-14)
