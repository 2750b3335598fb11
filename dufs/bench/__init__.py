"""Benchmarks (``dufs bench ...``): figures printed as ratios against a reference measured in the same run.

Never timed assertions in tests: these machines are noisy, so every figure is the median of several runs. One
module a benchmark (``convert``: ingest, ``passes``: pass, ``mmfs_dcd``: mmfs, ``greedy``, ``m3fs``, ``ufcm``) and
what they share in ``common``.
"""

from __future__ import annotations

from dufs.bench.common import PeakRSS, WorkerPeak, ensure_synthetic_store
from dufs.bench.convert import ingest, make_libsvm_file
from dufs.bench.mmfs_dcd import mmfs
from dufs.bench.passes import pass_

__all__ = ["PeakRSS", "WorkerPeak", "ensure_synthetic_store", "ingest", "make_libsvm_file", "mmfs", "pass_"]
