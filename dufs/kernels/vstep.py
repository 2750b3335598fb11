"""M3FS's two-cluster v-step (dufs.methods.m3fs.vstep): the smoothed hinge's slope in the shared bias, and the
FISTA updates over the n_features-vectors fused into one sweep each (at a million features a vector is 8 MB, and
the same arithmetic as separate NumPy operations took 17 sweeps and four fresh arrays an iteration).

``a`` is the balance constraint's vector (S^1/2 s); an empty array stands for a = 0.
"""

from __future__ import annotations

import numba
import numpy as np

from dufs.kernels._prefetch import DISTANCE, prefetch_row
from dufs.kernels.topk import in_order, offer

__all__ = ["axpy", "fista_extrapolate", "fista_gradient", "fista_momentum", "fista_sweep", "fista_trial",
           "hinge_bias_slope", "hinge_loss", "hinge_manifold", "scaled_start", "sqrt_weights", "start_dots",
           "top_positive", "weighted_norm2"]


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
def hinge_loss(f, y, mu, c, grad):
    """c sum_i hinge_mu(1 - y_i f_i) (mu > 0: the smoothed hinge sum a_i t_i - mu / 2 sum a_i^2 at t_i = 1 - y_i f_i,
    a_i = clip(t_i / mu, 0, 1); mu = 0: sum max(t_i, 0)) and its gradient in f written into ``grad``:
    -c a_i y_i (a_i = [t_i > 0] at mu = 0). An empty ``y`` stands for the labels that minimise it, y_i = 1 where
    f_i >= 0, else -1. One sweep (the NumPy form took eight, and two fresh n-vectors)."""
    best = y.shape[0] == 0
    at = 0.0
    aa = 0.0
    for i in range(f.shape[0]):
        yi = (1.0 if f[i] >= 0.0 else -1.0) if best else y[i]
        a, dt, da = _hinge_terms(1.0 - yi * f[i], mu)
        at += dt
        aa += da
        grad[i] = a * -c * yi
    return c * (at - 0.5 * mu * aa) if mu > 0.0 else c * at


@numba.njit(inline="always")
def _hinge_terms(t, mu):
    """(a, a t, a^2) of the smoothed hinge at t = 1 - y f: a = clip(t / mu, 0, 1) for mu > 0, else [t > 0] with its
    terms (a t: max(t, 0); no a^2 term)."""
    if mu > 0.0:
        a = t / mu
        if a < 0.0:
            a = 0.0
        elif a > 1.0:
            a = 1.0
        return a, a * t, a * a
    if t > 0.0:
        return 1.0, t, 0.0
    return 0.0, 0.0, 0.0


@numba.njit(nogil=True, cache=True)
def hinge_manifold(f, y, mu, c, lf, lam, grad):
    """:func:`hinge_loss` and the manifold term's f^T (L f) from ``lf`` = L f in one sweep: (the loss, f^T lf), and,
    unless ``grad`` is empty, the majoriser's gradient in f, the hinge's plus 2 ``lam`` lf, written into ``grad``
    (the loss, the gradient and its manifold part were three sweeps and a fresh n-vector; a trial point's value
    needs no gradient)."""
    best = y.shape[0] == 0
    has_g = grad.shape[0] > 0
    at = 0.0
    aa = 0.0
    fl = 0.0
    l2 = 2.0 * lam
    for i in range(f.shape[0]):
        fi = f[i]
        yi = (1.0 if fi >= 0.0 else -1.0) if best else y[i]
        a, dt, da = _hinge_terms(1.0 - yi * fi, mu)
        at += dt
        aa += da
        fl += fi * lf[i]
        if has_g:
            grad[i] = a * -c * yi + l2 * lf[i]
    return (c * (at - 0.5 * mu * aa) if mu > 0.0 else c * at), fl


@numba.njit(nogil=True, cache=True)
def sqrt_weights(sigma, colsum, s_half, a):
    """s_half = sigma^1/2 (0 where sigma is not positive, NaN where it is NaN) and, unless ``colsum`` is empty,
    the balance's vector a = s_half colsum, in one sweep (NumPy's maximum, sqrt and product: three sweeps and three
    fresh vectors over the features; docs/measurements.md, "M3FS's v-step")."""
    has_a = colsum.shape[0] > 0
    for k in range(sigma.shape[0]):
        s = sigma[k]
        v = np.sqrt(s) if s > 0.0 else (0.0 if s <= 0.0 else s)
        s_half[k] = v
        if has_a:
            a[k] = v * colsum[k]


@numba.njit(nogil=True, cache=True)
def start_dots(v0, s_half, a):
    """For u = v0 / s_half (0 where s_half is not positive, as :func:`scaled_start` makes it), without forming u:
    (whether v0 has a nonzero where s_half is not positive, a^T u, u^T u); an empty ``a`` stands for a = 0. What
    the driver needs of a v-step's start whose u the workers make."""
    off = False
    au = 0.0
    uu = 0.0
    has_a = a.shape[0] > 0
    for k in range(v0.shape[0]):
        s = s_half[k]
        if s > 0.0:
            u = v0[k] / s
            uu += u * u
            if has_a:
                au += a[k] * u
        elif v0[k] != 0.0:
            off = True
    return off, au, uu


@numba.njit(nogil=True, cache=True)
def fista_extrapolate(x, xp, beta, c, w, out):
    """out = x + beta (x - xp) - c w (an empty ``w`` stands for ones): the momentum point's scores less its bias, or
    their product with L from L x, L x_prev and L 1, in one sweep into ``out`` (NumPy's four, and a fresh vector)."""
    has_w = w.shape[0] > 0
    for i in range(x.shape[0]):
        t = (x[i] - xp[i]) * beta + x[i]
        out[i] = t - c * w[i] if has_w else t - c


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


@numba.njit(nogil=True, cache=True, boundscheck=False)
def fista_sweep(indptr, indices, data, R, x, xp, beta, si, a, ga, cm, rsum, step, y, g, u, out):
    """A v-step iteration's work over one CSC block in one sweep of its nonzeros, column by column: the gradient
    g_j = si_j (X^T R)_j + y_j - ga a_j - rsum cm_j at the momentum point y_j = x_j + beta (x_j - xp_j), the trial
    point u_j = y_j - step g_j, and its scores ``out += X_j si_j u_j`` (float64 (n_rows,), accumulated into; R is
    float64 (n_rows,)). The same numbers as :func:`fista_momentum`, the block's Z^T R, :func:`fista_gradient`,
    :func:`fista_trial` and the product with si u in turn, where those read the block's nonzeros twice. Returns
    (a^T y, y^T y, a^T u, u^T u, ||u - y||^2, g^T (u - y), cm^T u, a^T g, y^T g); empty ``a`` or ``cm`` stand for
    zero. The last two give the dots of the trial point y - t g for another step t without a sweep (with ||g||^2 =
    ||u - y||^2 / step^2)."""
    nnz = np.uint64(indices.shape[0])
    has_a = a.shape[0] > 0
    has_c = cm.shape[0] > 0
    aY = 0.0
    uuY = 0.0
    aN = 0.0
    uuN = 0.0
    dd = 0.0
    gd = 0.0
    cu = 0.0
    ag = 0.0
    yg = 0.0
    for j in range(indptr.shape[0] - 1):
        k0 = np.uint64(indptr[j])
        k1 = np.uint64(indptr[j + 1])
        acc = 0.0
        for k in range(k0, k1):
            # R's row of a nonzero ahead (asking for out's row too, for the second loop, made the sweep slower:
            # docs/measurements.md, "Prefetching")
            if k + np.uint64(DISTANCE) < nnz:
                prefetch_row(R, indices[k + np.uint64(DISTANCE)])
            acc += np.float64(data[k]) * R[np.uint64(indices[k])]
        yj = x[j] + beta * (x[j] - xp[j])
        y[j] = yj
        uuY += yj * yj
        gj = si[j] * acc + yj
        if has_a:
            aY += a[j] * yj
            gj -= ga * a[j]
        if has_c:
            gj -= rsum * cm[j]
        g[j] = gj
        yg += yj * gj
        if has_a:
            ag += a[j] * gj
        dv = -step * gj
        uj = yj + dv
        u[j] = uj
        uuN += uj * uj
        dd += dv * dv
        gd += gj * dv
        if has_a:
            aN += a[j] * uj
        if has_c:
            cu += cm[j] * uj
        sv = si[j] * uj
        for k in range(k0, k1):
            out[np.uint64(indices[k])] += np.float64(data[k]) * sv
    return aY, uuY, aN, uuN, dd, gd, cu, ag, yg


@numba.njit(nogil=True, cache=True)
def top_positive(g, k):
    """(the indices of the k largest positive entries of g, by value descending then index ascending, the sum of g
    over every other entry; 0 where fewer than k entries are positive): one sweep keeping the best k in a bounded
    heap of -g (:mod:`dufs.kernels.topk`, O(n log k) whatever the order of g), one more for the sum. The sigma
    step's water-filling (dufs.methods.m3fs.problem.sigma_step) needs only these, where an argpartition, the sort
    of its head and the mask of the rest cost more (docs/measurements.md, "M3FS's v-step")."""
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


@numba.njit(nogil=True, cache=True)
def weighted_norm2(V, sigma):
    """(sum_k ||V_k||^2 / sigma_k over the k with sigma_k > 0, whether some V_k != 0 has sigma_k <= 0 (or NaN)):
    M3FS's regulariser (times 2) in one sweep of V (d, p) and sigma, where NumPy's row norms, mask, masked division
    into a fresh array and sum cost more (docs/measurements.md, "M3FS's v-step")."""
    total = 0.0
    bad = False
    for k in range(V.shape[0]):
        w = 0.0
        for j in range(V.shape[1]):
            w += V[k, j] * V[k, j]
        if sigma[k] > 0.0:
            total += w / sigma[k]
        elif w > 0.0:
            bad = True
    return total, bad


@numba.njit(nogil=True, cache=True)
def scaled_start(V0, s_half, U):
    """U = V0 / s_half by rows, 0 where s_half is not positive; returns whether V0 has a nonzero there (U's scores
    are then not V0's). One sweep for NumPy's masked division and its check."""
    off = False
    for k in range(V0.shape[0]):
        s = s_half[k]
        if s > 0.0:
            for j in range(V0.shape[1]):
                U[k, j] = V0[k, j] / s
        else:
            for j in range(V0.shape[1]):
                U[k, j] = 0.0
                if V0[k, j] != 0.0:
                    off = True
    return off
