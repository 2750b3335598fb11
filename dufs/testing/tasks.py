"""How many bytes of inputs the tasks of a computation take: a scheduler plugin for tests of the sample axis.

>>> with task_inputs(client) as seen:           # doctest: +SKIP
...     dufs.fit(store, method="laplacian", n_features=5, graph="anchor")
>>> seen.max_bytes, seen.max_key              # doctest: +SKIP

Every task that starts running records the sum of its dependencies' sizes (as the scheduler knows them, from
``dask.sizeof``), so a test can check that no task of a method receives more than ``dufs.engine.max-task-bytes``
of sample-space data.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["TaskInputs", "task_inputs"]


@dataclass
class TaskInputs:
    """The largest inputs a task took: bytes, its key, and how many tasks were seen."""

    max_bytes: int = 0
    max_key: str = ""
    tasks: int = 0


def _plugin_class() -> Any:
    from distributed.diagnostics.plugin import SchedulerPlugin

    class _Inputs(SchedulerPlugin):
        def __init__(self, name: str):
            self.name = name
            self.seen = TaskInputs()

        def start(self, scheduler: Any) -> None:
            self.scheduler = scheduler

        def transition(self, key: Any, start: str, finish: str, *args: Any, **kwargs: Any) -> None:
            if finish != "processing":
                return
            ts = self.scheduler.tasks.get(key)
            if ts is None:
                return
            total = sum(max(int(d.nbytes), 0) for d in ts.dependencies)
            self.seen.tasks += 1
            if total > self.seen.max_bytes:
                self.seen.max_bytes, self.seen.max_key = total, str(key)

    return _Inputs


@contextlib.contextmanager
def task_inputs(client: Any) -> Iterator[TaskInputs]:
    """Record, while the block runs, the largest total size of the inputs of any task that ``client``'s scheduler
    starts (see the module docstring); the :class:`TaskInputs` is filled in when the block ends."""
    name = f"dufs-task-inputs-{uuid.uuid4().hex[:8]}"
    plugin = _plugin_class()(name)
    client.register_plugin(plugin, name=name)
    out = TaskInputs()
    try:
        yield out
    finally:
        got = client.run_on_scheduler(lambda dask_scheduler: vars(dask_scheduler.plugins[name].seen))
        out.max_bytes, out.max_key, out.tasks = got["max_bytes"], got["max_key"], got["tasks"]
        client.unregister_scheduler_plugin(name)
