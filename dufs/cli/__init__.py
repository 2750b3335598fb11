"""The ``dufs`` command line: ``convert``, ``info``, ``verify``, ``make-synthetic``, ``select``, ``evaluate``,
``demo``, ``bench``.

Only here: progress bars and starting clusters from flags. With no ``--scheduler``, commands that run on a
cluster start an embedded ``LocalCluster`` (processes, one worker a core) and close it afterwards;
``--workers 0`` runs on local threads in this process instead. Every error ends in one line, ``error: ...``.
"""

from __future__ import annotations

from dufs.cli import demo, selecting, stores  # noqa: F401  (the commands register themselves with the app)
from dufs.cli.app import app, cluster, main

__all__ = ["app", "cluster", "main"]
