"""M3FS's budget of passes over the data (docs/methods.md, "M3FS", "The pass budget").

``max_passes="auto"`` (the alternating solver's default) fixes the budget from the data and the machine: a time
budget, ``time_budget`` seconds (:data:`TIME_BUDGET` by default), divided by the seconds a pass takes as the solver
runs them (its work between the passes included), measured from the end of its first v-step iteration over at least
:data:`MEASURED_PASSES` passes and :data:`MEASURE_SECONDS` seconds; never fewer than :data:`MIN_PASSES`. A run that
ends before the measure does (a small problem) has no budget to speak of. The budget is fixed once measured,
so a run is repeated exactly by giving the number it chose as ``max_passes`` (the diagnostics record it). An int
is a budget of its own; None is none.
"""

from __future__ import annotations

import math
import time
from typing import Any

from dufs._logging import get_logger

log = get_logger(__name__)

#: ``max_passes="auto"``: the seconds of passes the budget allows by default (``time_budget``)
TIME_BUDGET = 1200.0
#: ``max_passes="auto"``: the fewest passes the budget allows, whatever the measured speed
MIN_PASSES = 50
#: ``max_passes="auto"``: the speed is measured from the end of the solver's first iteration (its first passes place
#: the state on the workers, warm the caches and compile kernels) over at least this many passes
MEASURED_PASSES = 5
#: and at least this many seconds, so that a one-off cost among the first passes of a fast problem (a kernel's
#: compilation) weighs little in the measure
MEASURE_SECONDS = 30.0

#: the clock the speed is measured with (a test replaces it)
_clock = time.perf_counter


def passes_for(seconds_per_pass: float, time_budget: float = TIME_BUDGET) -> int:
    """The passes ``max_passes="auto"`` allows at ``seconds_per_pass``: ``time_budget`` seconds of them, at least
    :data:`MIN_PASSES`."""
    if not seconds_per_pass > 0:
        return max(MIN_PASSES, 2**62)
    return max(MIN_PASSES, int(math.floor(time_budget / seconds_per_pass)))


class PassBudget:
    """A budget of passes over ``M`` from :meth:`start` on: ``max_passes`` an int (given), None (none) or
    ``"auto"`` (:func:`passes_for` at the speed measured by :meth:`spent`, which the solver calls between its
    iterations)."""

    def __init__(self, M: Any, max_passes: Any, time_budget: float = TIME_BUDGET, who: str = "m3fs"):
        self.M, self.who, self.time_budget = M, who, float(time_budget)
        self.rule = "auto" if isinstance(max_passes, str) else "none" if max_passes is None else "given"
        self.limit = int(max_passes) if self.rule == "given" else None
        self.p0, self.t0 = 0, 0.0
        self.mark: tuple[int, float] | None = None
        self.seconds_per_pass: float | None = None

    def start(self) -> None:
        """The budget counts the passes from now on."""
        self.p0, self.t0, self.mark = self.M.passes, _clock(), None

    @property
    def used(self) -> int:
        return self.M.passes - self.p0

    def spent(self) -> bool:
        """Whether the budget is spent; under ``"auto"`` the first call after a pass marks the clock, and the first
        after :data:`MEASURED_PASSES` more passes and :data:`MEASURE_SECONDS` seconds fixes the budget."""
        if self.rule == "auto" and self.limit is None:
            used, now = self.used, _clock()
            if self.mark is None:
                if used >= 1:
                    self.mark = (used, now)
            elif used - self.mark[0] >= MEASURED_PASSES and now - self.mark[1] >= MEASURE_SECONDS:
                self.seconds_per_pass = (now - self.mark[1]) / (used - self.mark[0])
                self.limit = passes_for(self.seconds_per_pass, self.time_budget)
                log.info("%s: pass budget %d passes (%.4g s a pass measured over passes %d-%d, time budget %g s; "
                         "max_passes=N or None overrides)", self.who, self.limit, self.seconds_per_pass,
                         self.mark[0] + 1, used, self.time_budget)
        return self.limit is not None and self.used >= self.limit

    def record(self) -> dict:
        """The budget as the diagnostics record it: ``rule``, ``max_passes`` (None: none, or not yet measured),
        and under ``"auto"`` the ``time_budget``, the measured ``seconds_per_pass`` and ``min_passes``."""
        rec: dict[str, Any] = {"rule": self.rule, "max_passes": self.limit}
        if self.rule == "auto":
            rec.update(time_budget=self.time_budget, seconds_per_pass=self.seconds_per_pass, min_passes=MIN_PASSES)
            if self.limit is None:
                rec["note"] = (f"the solver stopped before it had timed {MEASURED_PASSES} passes and "
                               f"{MEASURE_SECONDS:g} s")
        return rec
