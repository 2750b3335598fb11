"""The v-step's fused kernels against the NumPy expressions they replace."""

import numpy as np
import pytest

from dufs.kernels.blockops import csc_matvec, csc_rmatvec
from dufs.kernels.vstep import (
    fista_extrapolate,
    fista_gradient,
    fista_momentum,
    fista_sweep,
    fista_trial,
    hinge_bias_slope,
    hinge_loss,
    hinge_manifold,
    sqrt_weights,
    start_dots,
)


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


def _smoothed_hinge(t, mu):
    """Nesterov's smoothed hinge at t = 1 - y f from its definition (the Huber-like quadratic within mu of the
    margin) and its slope a in t."""
    if mu > 0:
        return np.where(t <= 0, 0.0, np.where(t >= mu, t - mu / 2, t * t / (2 * mu))), np.clip(t / mu, 0.0, 1.0)
    return np.maximum(t, 0.0), (t > 0).astype(float)


@pytest.mark.parametrize("best", [False, True], ids=["labels", "best-labels"])
@pytest.mark.parametrize("mu", [0.0, 0.3])
def test_hinge_loss_is_numpy(mu, best):
    """The smoothed hinge (Nesterov's: the Huber-like quadratic within mu of the margin) and its gradient, from its
    definition; an empty y is the labels sign(f) (0 counted positive)."""
    rng = np.random.default_rng(11)
    f = rng.standard_normal(700)
    f[:5] = [0.0, -0.0, 1.0, 1.0 - 0.3 / 2, 2.0]  # on the margin, within mu of it, beyond
    y = np.where(rng.random(700) < 0.5, 1.0, -1.0)
    Y = np.where(f >= 0, 1.0, -1.0) if best else y
    h, a = _smoothed_hinge(1.0 - Y * f, mu)
    grad = np.empty(700)
    val = hinge_loss(f, np.zeros(0) if best else y, mu, 0.7, grad)
    assert val == pytest.approx(0.7 * h.sum(), rel=1e-12)
    np.testing.assert_allclose(grad, -0.7 * a * Y, rtol=1e-15, atol=0)


@pytest.mark.parametrize("centred", [False, True])
def test_fista_sweep_is_the_kernels_it_fuses(centred):
    """One sweep over a CSC block against fista_momentum, X^T R, fista_gradient, fista_trial and X (si u) made by
    NumPy and SciPy; empty rows and columns included."""
    import scipy.sparse as sp

    rng = np.random.default_rng(int(centred))
    n, d = 300, 170
    X = sp.random(n, d, density=0.05, format="csc", random_state=rng, dtype=np.float32)
    R, x, xp, si, a = (rng.standard_normal(k) for k in (n, d, d, d, d))
    si = np.abs(si)
    cm = rng.standard_normal(d) if centred else np.zeros(0)
    y, g, u = np.empty(d), np.empty(d), np.empty(d)
    out = np.full(n, 0.5)
    got = fista_sweep(X.indptr.astype(np.int64), X.indices, X.data, R, x, xp, 0.4, si, a, 0.2, cm, 1.5, 0.3, y, g,
                      u, out)
    ry = x + 0.4 * (x - xp)
    rg = si * (X.T @ R) + ry - 0.2 * a - (1.5 * cm if centred else 0.0)
    ru = ry - 0.3 * rg
    np.testing.assert_allclose(y, ry, rtol=1e-14, atol=1e-14)
    np.testing.assert_allclose(g, rg, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(u, ru, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(out, 0.5 + X @ (si * ru), rtol=1e-12, atol=1e-12)
    want = (a @ ry, ry @ ry, a @ ru, ru @ ru, (ru - ry) @ (ru - ry), rg @ (ru - ry), cm @ ru if centred else 0.0,
            a @ rg, ry @ rg)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    # and the separate kernels it fuses give the same numbers
    y2, g2, u2, sv = np.empty(d), np.empty((d, 1)), np.empty(d), np.empty(d)
    fista_momentum(x, xp, 0.4, a, y2)
    csc_rmatvec(X.indptr.astype(np.int64), X.indices, X.data, R[:, None], g2)
    fista_gradient(g2[:, 0], si, y2, a, 0.2)
    if centred:
        g2[:, 0] -= 1.5 * cm
    fista_trial(g2[:, 0], y2, si, a, 0.3, u2, sv)
    out2 = np.full((n, 1), 0.5)
    csc_matvec(X.indptr.astype(np.int64), X.indices, X.data, sv[:, None], out2)
    np.testing.assert_array_equal(g, g2[:, 0])
    np.testing.assert_array_equal(u, u2)
    np.testing.assert_array_equal(out, out2[:, 0])


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


def test_weighted_norm2_and_scaled_start_are_numpy():
    """M3FS's regulariser sum_k ||V_k||^2 / sigma_k (0/0 = 0, weight where sigma is 0 said) and the v-step's start
    U = V0 / sigma^1/2 (0 where sigma is, V0's weight there said) against NumPy, with one and three columns."""
    from dufs.kernels.vstep import scaled_start, weighted_norm2

    rng = np.random.default_rng(11)
    for p in (1, 3):
        V = rng.standard_normal((400, p))
        sigma = rng.uniform(0.1, 1.0, 400)
        sigma[::7] = 0.0
        V[::7] = 0.0
        total, bad = weighted_norm2(V, sigma)
        on = sigma > 0
        np.testing.assert_allclose(total, ((V[on] ** 2).sum(axis=1) / sigma[on]).sum(), rtol=1e-13)
        assert not bad
        s_half = np.sqrt(sigma)
        U = np.full((400, p), np.nan)
        assert not scaled_start(V, s_half, U)
        want = np.zeros((400, p))
        want[on] = V[on] / s_half[on, None]
        np.testing.assert_array_equal(U, want)
        V[14, -1] = 0.5  # weight where sigma is 0
        assert weighted_norm2(V, sigma)[1]
        assert scaled_start(V, s_half, U)
        assert U[14, -1] == 0.0


@pytest.mark.parametrize("with_grad", [True, False])
@pytest.mark.parametrize("best", [False, True], ids=["labels", "best-labels"])
@pytest.mark.parametrize("mu", [0.0, 0.3])
def test_hinge_manifold_is_numpy(mu, best, with_grad):
    """The smoothed hinge from its definition, f^T (L f) and the gradient plus 2 lam L f, from NumPy; an empty grad
    writes nothing."""
    rng = np.random.default_rng(12)
    f = rng.standard_normal(600)
    f[:3] = [0.0, 1.0 - 0.3 / 2, 2.0]
    lf = rng.standard_normal(600)
    y = np.where(rng.random(600) < 0.5, 1.0, -1.0)
    Y = np.where(f >= 0, 1.0, -1.0) if best else y
    h, a = _smoothed_hinge(1.0 - Y * f, mu)
    grad = np.full(600, np.nan) if with_grad else np.zeros(0)
    val, fl = hinge_manifold(f, np.zeros(0) if best else y, mu, 0.7, lf, 0.05, grad)
    assert val == pytest.approx(0.7 * h.sum(), rel=1e-12)
    assert fl == pytest.approx(f @ lf, rel=1e-12)
    if with_grad:
        np.testing.assert_allclose(grad, -0.7 * a * Y + 0.1 * lf, rtol=1e-14, atol=1e-15)
    else:
        assert grad.shape == (0,)


def test_sqrt_weights_start_dots_and_extrapolate_are_numpy():
    """sigma^1/2 (0 where sigma is not positive, NaN kept) and a = sigma^1/2 colsum; the start's dots of
    u = v0 / s (0 where s is not positive) without u, and whether v0 has weight there; x + beta (x - xp) - c w."""
    rng = np.random.default_rng(13)
    d = 901
    sigma = rng.random(d)
    sigma[:40] = 0.0
    sigma[40:45] = -1e-17
    sigma[45] = np.nan
    colsum = rng.standard_normal(d)
    s, a = np.empty(d), np.empty(d)
    sqrt_weights(sigma, colsum, s, a)
    with np.errstate(invalid="ignore"):
        ref = np.sqrt(np.maximum(sigma, 0.0))
    np.testing.assert_array_equal(s, ref)
    np.testing.assert_array_equal(a, ref * colsum)
    s2 = np.empty(d)
    sqrt_weights(sigma, np.zeros(0), s2, np.zeros(0))
    np.testing.assert_array_equal(s2, ref)
    s[45], a[45] = 0.5, 0.3  # the NaN weight replaced for the dots
    v0 = rng.standard_normal(d)
    v0[:45] = 0.0  # none where s is 0
    u = np.where(s > 0, v0 / np.where(s > 0, s, 1.0), 0.0)
    for w, av in ((a, a), (np.zeros(0), np.zeros(d))):
        off, au, uu = start_dots(v0, s, w)
        assert not off
        assert au == pytest.approx(av @ u, rel=1e-12, abs=1e-12) and uu == pytest.approx(u @ u, rel=1e-12)
    v0[41] = 1.0  # weight where s is 0
    assert start_dots(v0, s, a)[0]
    x, xp, w = (rng.standard_normal(d) for _ in range(3))
    out = np.empty(d)
    fista_extrapolate(x, xp, 0.37, 0.2, w, out)
    np.testing.assert_allclose(out, x + 0.37 * (x - xp) - 0.2 * w, rtol=1e-14, atol=1e-15)
    fista_extrapolate(x, xp, 0.37, 0.2, np.zeros(0), out)
    np.testing.assert_allclose(out, x + 0.37 * (x - xp) - 0.2, rtol=1e-14, atol=1e-15)
