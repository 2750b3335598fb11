"""What memory a selection needs: the model of ``docs/memory.md``, as code.

Every figure is in bytes and counts what a job adds to its processes' start-up (``STARTUP_DRIVER`` for the driver,
``STARTUP_WORKER`` a worker process: Python with NumPy, SciPy, numba, Dask and dufs loaded). With ``nnz`` nonzeros,
``n`` samples, ``d`` features and ``P`` worker processes:

- **blocks**, persisted (the default when they take at most ``dufs.engine.persist-fraction`` of the workers'
  memory): ``nnz * (value bytes + 4) + 8 * d`` across the workers (CSC values, row indices, int64 column pointers);
  re-read each pass instead: at most ``dufs.engine.cache-bytes`` of loaded blocks a worker, plus the block being
  read (compressed chunks and arrays of at most ``dufs.store.feature-block-nnz`` nonzeros).
- **filters** (variance, correlation, Fisher): the driver holds the scores (4 bytes a feature above
  ``dufs.engine.driver-features``, else 8), the labels (six n-vectors at the peak: as read, sorted, encoded), two
  blocks' results in flight and 8 MiB of graph, messages and JSON; a
  worker holds the labels and one block's per-feature statistics.
- **MMFS** (linear): the workers hold seven float64 vectors a feature (alpha, geometry, margins, gradient, the
  visiting order) beside the blocks and four n-vectors a partition; the driver holds alpha (8 bytes a feature)
  with a copy while it is checkpointed and the selection's scores, and seven n-vectors (w, its parts, the labels
  and their encodings).

The unsupervised methods are not covered: their sample-space arrays (n x p dense) are still held in one piece.
"""

from __future__ import annotations

from dataclasses import dataclass

from dufs import config

__all__ = ["STARTUP_DRIVER", "STARTUP_WORKER", "MemoryModel", "memory_model"]

#: resident memory of a driver process with dufs and a distributed client loaded, before any work (docs/memory.md)
STARTUP_DRIVER = 300 * 2 ** 20
#: resident memory of a worker process with dufs' kernels compiled and loaded, before any work (docs/memory.md)
STARTUP_WORKER = 350 * 2 ** 20

#: the driver's graph, task keys, messages and the selection's JSON
OVERHEAD_DRIVER = 8 * 2 ** 20

_FAMILIES = {"variance": "filter", "correlation": "filter", "fisher": "filter", "mmfs": "mmfs"}


@dataclass(frozen=True)
class MemoryModel:
    """Bytes a selection needs beyond its processes' start-up: on the ``driver``, on the ``workers`` together (of
    which ``blocks`` are the data), and in all with start-up (``total``)."""

    driver: int
    workers: int
    blocks: int
    n_workers: int

    @property
    def total(self) -> int:
        return self.driver + self.workers + STARTUP_DRIVER + self.n_workers * STARTUP_WORKER


def memory_model(n_samples: int, n_features: int, nnz: int, method: str, *, n_workers: int = 2,
                 persisted: bool = True, value_bytes: int = 4, n_partitions: int | None = None) -> MemoryModel:
    """The model's figures for ``method`` (``variance``, ``correlation``, ``fisher`` or ``mmfs``) on a store of
    ``n_samples`` x ``n_features`` with ``nnz`` nonzeros, ``n_workers`` worker processes, blocks ``persisted`` in
    the workers' memory or re-read each pass (``dufs.engine.cache-bytes`` a worker), ``n_partitions`` MMFS
    partitions (None: one a worker)."""
    family = _FAMILIES.get(method)
    if family is None:
        raise ValueError(f"the memory model covers {sorted(_FAMILIES)}; got {method!r}")
    n, d, z, P = int(n_samples), int(n_features), int(nnz), int(n_workers)
    block_nnz = min(z, config.parse_bytes(config.get("store.feature-block-nnz")))
    block_width = min(d, int(config.get("store.feature-block-max-features")))
    one_block = 2 * block_nnz * (value_bytes + 4) + 8 * block_width  # arrays and the chunks they came from
    if persisted:
        blocks = z * (value_bytes + 4) + 8 * d
        data = blocks + P * one_block
    else:
        blocks = 0
        data = P * (config.parse_bytes(config.get("engine.cache-bytes")) + one_block)
    score_bytes = 4 if d > int(config.get("engine.driver-features")) else 8
    if family == "filter":
        # the labels as read and checked, np.unique's sort and inverse, the class codes or the centred copy (six
        # n-vectors at the peak at kddb size); two blocks' float64 results in flight
        driver = OVERHEAD_DRIVER + score_bytes * d + 6 * 8 * n + 2 * 8 * block_width
        # the shipped labels and their deserialised copy; a block's per-feature statistics (about 10 vectors)
        workers = data + P * (2 * 8 * n + 10 * 8 * block_width)
    else:
        parts = P if n_partitions is None else int(n_partitions)
        # alpha, its checkpointed copy and the selection's scores; w, its parts, the labels and their encodings
        driver = OVERHEAD_DRIVER + 3 * 8 * d + 7 * 8 * n
        workers = data + 7 * 8 * d + parts * 4 * 8 * n + P * 2 * 8 * n
    return MemoryModel(driver=int(driver), workers=int(workers), blocks=int(blocks), n_workers=P)
