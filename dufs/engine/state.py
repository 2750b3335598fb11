"""Per-block state kept where the blocks are: what :meth:`Matrix.map_blocks` with ``state=`` returns and takes."""

from __future__ import annotations

import weakref
from typing import Any

from dufs.engine.direct import Resident, fetch_resident, release_resident

__all__ = ["BlockState"]


class BlockState:
    """Per-block state of :meth:`Matrix.map_blocks`, one item per block, kept where the blocks are (under a
    distributed client futures on the workers, or :class:`~dufs.engine.direct.Resident` items that direct calls
    keep in the workers' memory; plain values otherwise). ``gather()`` brings it to the driver."""

    def __init__(self, items: list, client: Any = None):
        self.items = list(items)
        self._client = client
        resident = [i for i in self.items if isinstance(i, Resident)]
        # released when this object goes, as futures are: dropped on the workers with the next call there
        self._drop = weakref.finalize(self, release_resident, resident) if resident else None

    def __len__(self) -> int:
        return len(self.items)

    @property
    def resident(self) -> bool:
        """Whether the items are kept by direct calls (:mod:`dufs.engine.direct`) rather than futures."""
        return self._drop is not None

    def gather(self) -> list:
        if self.resident:
            return fetch_resident(self._client, self.items)
        if self._client is not None:
            return list(self._client.gather(self.items))
        return list(self.items)

    def release(self) -> None:
        """Drop the state (frees the workers' memory; items kept by direct calls go with the next call to their
        worker)."""
        if self._drop is not None:
            self._drop()
        elif self._client is not None:
            for f in self.items:
                f.release()
        self.items = []
