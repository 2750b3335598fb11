"""The ``dufs`` namespace in :mod:`dask.config`.

Defaults live in ``dufs/dufs.yaml``; override them in a dask config file, with environment variables
(``DASK_DUFS__STORE__ROW_BLOCK=65536``) or in code with ``dask.config.set({"dufs.store.row-block": 65536})``.
"""

from __future__ import annotations

import os
from typing import Any

import dask
import dask.config
import yaml

_FN = os.path.join(os.path.dirname(__file__), "dufs.yaml")

with open(_FN) as _f:
    _defaults = yaml.safe_load(_f)

dask.config.update_defaults(_defaults)


def get(key: str, default: Any = None) -> Any:
    """Read ``dufs.<key>`` from the dask config (``key`` like ``"store.row-block"``)."""
    if default is None:
        return dask.config.get(f"dufs.{key}")
    return dask.config.get(f"dufs.{key}", default)


def parse_bytes(value: int | str) -> int:
    """``"32MiB"`` -> 33554432; ints pass through."""
    return int(dask.utils.parse_bytes(value)) if isinstance(value, str) else int(value)
