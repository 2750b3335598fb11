"""MMFS's line search on a plane: the dual is quadratic on the span of a round's summed step and the last step's
change, minimised over a box (:meth:`~dufs.methods.mmfs.solver._Solve.line_step`)."""

from __future__ import annotations

import numpy as np


def _plane_step(a: float, c: float, h11: float, h22: float, h12: float, tlo: float, thi: float,
                s1: float) -> tuple[float, float]:
    """(s, t) minimising a s + c t + (h11 s^2 + 2 h12 s t + h22 t^2) / 2 over s in [0, 1], t in [tlo, thi]
    (tlo <= 0 <= thi); ``s1`` is the minimiser on t = 0, never bettered by less."""

    def q(s: float, t: float) -> float:
        return a * s + c * t + 0.5 * (h11 * s * s + 2.0 * h12 * s * t + h22 * t * t)

    cands = [(s1, 0.0)]
    det = h11 * h22 - h12 * h12
    if h11 > 0 and h22 > 0 and det > 1e-12 * h11 * h22:
        s_ = (-a * h22 + c * h12) / det
        t_ = (-c * h11 + a * h12) / det
        if 0.0 <= s_ <= 1.0 and tlo <= t_ <= thi:
            cands.append((s_, t_))
    if h22 > 0:
        for s_ in (0.0, 1.0):
            cands.append((s_, float(np.clip(-(c + h12 * s_) / h22, tlo, thi))))
    if h11 > 0:
        for t_ in (tlo, thi):
            if np.isfinite(t_):
                cands.append((float(np.clip(-(a + h12 * t_) / h11, 0.0, 1.0)), t_))
    cands = [(s_, t_) for s_, t_ in cands if np.isfinite(s_) and np.isfinite(t_)]
    best = min(cands, key=lambda st: q(*st))
    return best if q(*best) < q(s1, 0.0) else (s1, 0.0)
