"""The v-step's fused kernels against the NumPy expressions they replace."""

import numpy as np
import pytest

from dufs.kernels.vstep import fista_gradient, fista_momentum, fista_trial, hinge_bias_slope


@pytest.mark.parametrize("with_a", [True, False])
def test_fista_kernels_are_numpy(with_a):
    rng = np.random.default_rng(int(with_a))
    d = 1001
    x, xp, s, g0, y = (rng.standard_normal(d) for _ in range(5))
    s = np.abs(s)
    a = rng.standard_normal(d) if with_a else np.zeros(0)
    av = a if with_a else np.zeros(d)
    out = np.empty(d)
    au, uu = fista_momentum(x, xp, 0.37, a, out)
    ref = x + 0.37 * (x - xp)
    np.testing.assert_allclose(out, ref, rtol=1e-15, atol=1e-15)
    assert au == pytest.approx(av @ ref, rel=1e-12, abs=1e-12) and uu == pytest.approx(ref @ ref, rel=1e-12)
    g = g0.copy()
    fista_gradient(g, s, y, a, 0.25)
    np.testing.assert_allclose(g, s * g0 + y - 0.25 * av, rtol=1e-15, atol=1e-15)
    n_, sv = np.empty(d), np.empty(d)
    au, uu, dd, gd = fista_trial(g, y, s, a, 0.5, n_, sv)
    ref = y - 0.5 * g
    np.testing.assert_allclose(n_, ref, rtol=1e-15, atol=1e-15)
    np.testing.assert_allclose(sv, s * ref, rtol=1e-15, atol=1e-15)
    assert au == pytest.approx(av @ ref, rel=1e-12, abs=1e-12) and uu == pytest.approx(ref @ ref, rel=1e-12)
    assert dd == pytest.approx((ref - y) @ (ref - y), rel=1e-12) and gd == pytest.approx(g @ (ref - y), rel=1e-12)


@pytest.mark.parametrize("mu", [0.0, 0.3])
def test_hinge_bias_slope_is_numpy(mu):
    rng = np.random.default_rng(7)
    f = rng.standard_normal(500)
    y = np.where(rng.random(500) < 0.5, 1.0, -1.0)
    t = 1.0 - y * (f + 0.2)
    a = np.clip(t / mu, 0.0, 1.0) if mu > 0 else (t > 0).astype(float)
    ya, inside = hinge_bias_slope(f, y, 0.2, mu)
    assert ya == pytest.approx(float(y @ a), rel=1e-12)
    assert inside == (int(np.sum((t > 0) & (t < mu))) if mu > 0 else 0)


def test_top_positive_is_the_stable_sort_head_and_the_rest_sum():
    """The k largest positive entries by value descending, ties to the lower index: the head of NumPy's stable
    sort of -g over the positive entries; and the sum of g over every other entry (numpy's, within rounding); on
    small integer values that tie everywhere, with zeros, in any order (sorted either way too)."""
    from dufs.kernels.vstep import top_positive

    rng = np.random.default_rng(0)
    for _ in range(300):
        d = int(rng.integers(1, 80))
        g = rng.integers(0, 5, size=d).astype(float)
        if rng.random() < 0.3:  # in increasing or decreasing order: every entry enters, or none after k
            g = np.sort(g) if rng.random() < 0.5 else np.sort(g)[::-1].copy()
        pos = np.flatnonzero(g > 0)
        if not pos.size:
            continue
        k = int(rng.integers(1, pos.size + 1))
        top, rest = top_positive(g, k)
        want = pos[np.argsort(-g[pos], kind="stable")][:k]
        np.testing.assert_array_equal(top, want)
        keep = np.ones(d, dtype=bool)
        keep[want] = False
        assert rest == pytest.approx(g[keep].sum(), abs=1e-12)
