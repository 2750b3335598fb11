"""Logging helpers: one logger per module and a phase timer.

dufs logs and never prints; the CLI adds progress bars on top.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator

logger = logging.getLogger("dufs")
logger.addHandler(logging.NullHandler())


def get_logger(name: str) -> logging.Logger:
    return logging.getLogger(name)


@contextlib.contextmanager
def timer(phase: str, timings: dict[str, float] | None = None,
          log: logging.Logger | None = None) -> Iterator[None]:
    """Time a phase; add its wall time to ``timings[phase]`` and log it at INFO."""
    t0 = time.perf_counter()
    try:
        yield
    finally:
        dt = time.perf_counter() - t0
        if timings is not None:
            timings[phase] = timings.get(phase, 0.0) + dt
        (log or logger).info("%s: %.3f s", phase, dt)


def set_verbosity(verbose: int | bool) -> None:
    """``verbose=0`` warnings only, ``1`` info, ``2`` debug, on a stderr handler of the ``dufs`` logger."""
    level = logging.WARNING if not verbose else (logging.INFO if int(verbose) == 1 else logging.DEBUG)
    logger.setLevel(level)
    if not any(isinstance(h, logging.StreamHandler) and not isinstance(h, logging.NullHandler)
               for h in logger.handlers):
        h = logging.StreamHandler()
        h.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s: %(message)s"))
        logger.addHandler(h)
