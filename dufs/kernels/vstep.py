"""M3FS's two-cluster v-step (dufs.methods.m3fs_scalable): the smoothed hinge's slope in the shared bias, and the
FISTA updates over the n_features-vectors fused into one sweep each (at a million features a vector is 8 MB, and
the same arithmetic as separate NumPy operations took 17 sweeps and four fresh arrays an iteration).

``a`` is the balance constraint's vector (S^1/2 s); an empty array stands for a = 0.
"""

from __future__ import annotations

import numba
import numpy as np

from dufs.kernels.topk import in_order, offer

__all__ = ["axpy", "fista_gradient", "fista_momentum", "fista_trial", "hinge_bias_slope", "top_positive"]


@numba.njit(nogil=True, cache=True)
def hinge_bias_slope(f, y, b, mu):
    """(sum_i y_i a_i, #{i: 0 < t_i < mu}) at t_i = 1 - y_i (f_i + b), a_i = clip(t_i / mu, 0, 1) (mu > 0) or
    [t_i > 0] (mu = 0): the derivative of sum_i hinge_mu(t_i) in b is -(the first), its second derivative the
    second / mu."""
    acc = 0.0
    inside = 0
    for i in range(f.shape[0]):
        t = 1.0 - y[i] * (f[i] + b)
        if mu > 0.0:
            if t >= mu:
                acc += y[i]
            elif t > 0.0:
                acc += y[i] * (t / mu)
                inside += 1
        elif t > 0.0:
            acc += y[i]
    return acc, inside


@numba.njit(nogil=True, cache=True)
def axpy(a, x, y):
    """In place, y += a x (flat arrays): no temporary n-vector."""
    for i in range(y.shape[0]):
        y[i] += a * x[i]


@numba.njit(nogil=True, cache=True)
def fista_momentum(x, xp, beta, a, out):
    """out = x + beta (x - xp); returns (a^T out, out^T out)."""
    au = 0.0
    uu = 0.0
    has_a = a.shape[0] > 0
    for k in range(x.shape[0]):
        v = x[k] + beta * (x[k] - xp[k])
        out[k] = v
        uu += v * v
        if has_a:
            au += a[k] * v
    return au, uu


@numba.njit(nogil=True, cache=True)
def fista_gradient(g, s, y, a, ga):
    """In place, g = s * g + y - ga * a: the gradient in u (g arrives as Z^T R; ga = dJ/db / n)."""
    has_a = a.shape[0] > 0
    for k in range(g.shape[0]):
        v = s[k] * g[k] + y[k]
        if has_a:
            v -= ga * a[k]
        g[k] = v


@numba.njit(nogil=True, cache=True)
def fista_trial(g, y, s, a, step, out, sv):
    """The gradient step out = y - step * g and sv = s * out (the product Z sv gives its scores); returns
    (a^T out, out^T out, ||out - y||^2, g^T (out - y))."""
    au = 0.0
    uu = 0.0
    dd = 0.0
    gd = 0.0
    has_a = a.shape[0] > 0
    for k in range(g.shape[0]):
        dv = -step * g[k]
        v = y[k] + dv
        out[k] = v
        sv[k] = s[k] * v
        uu += v * v
        dd += dv * dv
        gd += g[k] * dv
        if has_a:
            au += a[k] * v
    return au, uu, dd, gd


@numba.njit(nogil=True, cache=True)
def top_positive(g, k):
    """(the indices of the k largest positive entries of g, by value descending then index ascending, the sum of g
    over every other entry): one sweep keeping the best k in a bounded heap of -g (:mod:`dufs.kernels.topk`,
    O(n log k) whatever the order of g), one more for the sum. The sigma step's water-filling
    (dufs.methods.m3fs.sigma_step) needs only these: at a million features an argpartition, the sort of its head
    and the mask of the rest took 10 ms a step."""
    val = np.empty(k)
    idx = np.empty(k, np.int64)
    cnt = 0
    for j in range(g.shape[0]):
        if g[j] > 0.0:
            cnt = offer(val, idx, cnt, -g[j], j)
    rest = 0.0
    if cnt == k:
        lo, lj = -val[0], idx[0]  # the last of the k kept
        for j in range(g.shape[0]):
            x = g[j]
            if x < lo or (x == lo and j > lj):
                rest += x
    return in_order(val, idx, cnt)[0], rest
