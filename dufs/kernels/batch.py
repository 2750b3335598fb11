"""Small dense solvers over a batch of coordinates, for the kernel-trick MMFS and QPFS working sets (a batch of at
most a few hundred coordinates and its dense batch x batch matrix)."""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["box_sweeps", "simplex_steps"]


@njit(cache=False)
def box_sweeps(Kbb, gB, aB, C, gamma, max_sweeps, eps):  # pragma: no cover - compiled
    """DCD sweeps over a batch: alpha_B in [0, C], gradient gB kept exact within the batch. In place; returns
    (change of alpha_B, sweeps, updates)."""
    b = aB.shape[0]
    d = np.zeros(b)
    sweeps = 0
    upd = 0
    for _ in range(max_sweeps):
        sweeps += 1
        maxpg = 0.0
        for k in range(b):
            g = gB[k]
            a = aB[k]
            if a <= 0.0:
                pg = min(g, 0.0)
            elif a >= C:
                pg = max(g, 0.0)
            else:
                pg = g
            if abs(pg) > maxpg:
                maxpg = abs(pg)
            if pg != 0.0:
                h = Kbb[k, k] + gamma
                new = min(max(a - g / h, 0.0), C)
                delta = new - a
                if delta != 0.0:
                    aB[k] = new
                    d[k] += delta
                    upd += 1
                    for j in range(b):
                        gB[j] += delta * (Kbb[j, k] + gamma)
        if maxpg <= eps:
            break
    return d, sweeps, upd


@njit(cache=False)
def simplex_steps(Hbb, gB, xB, max_iter, eps):  # pragma: no cover - compiled
    """Pairwise steps inside a batch (mass conserved): move weight from the support coordinate with the largest
    gradient to the coordinate with the smallest, exact line search. In place; returns (change of x_B, steps)."""
    b = xB.shape[0]
    dx = np.zeros(b)
    steps = 0
    for _ in range(max_iter):
        i = 0
        for k in range(1, b):
            if gB[k] < gB[i]:
                i = k
        j = -1
        for k in range(b):
            if xB[k] > 0.0 and (j < 0 or gB[k] > gB[j]):
                j = k
        if j < 0 or gB[j] - gB[i] <= eps:
            break
        diff = gB[j] - gB[i]
        h = Hbb[i, i] + Hbb[j, j] - 2.0 * Hbb[i, j]
        t = xB[j]
        full = True
        if h > 0.0 and diff / h < t:
            t = diff / h
            full = False
        xB[i] += t
        dx[i] += t
        if full:
            dx[j] -= xB[j]
            xB[j] = 0.0
        else:
            xB[j] -= t
            dx[j] -= t
        for k in range(b):
            gB[k] += t * (Hbb[k, i] - Hbb[k, j])
        steps += 1
    return dx, steps
