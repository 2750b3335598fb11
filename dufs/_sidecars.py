"""A selection's JSON values and its sidecar files: plain JSON values from numpy ones, the large arrays of the
diagnostics split off into ``.npy`` files beside the JSON (streamed, with their crc32c) and joined back when it is
read (:class:`~dufs.selection.Selection`, format ``dufs.selection/3``)."""

from __future__ import annotations

import io
import math
import os
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from dufs.errors import ParameterError

#: an array of the diagnostics with at least this many items goes to a sidecar file (per-sample labels, ...)
SIDECAR_MIN_ITEMS = 1000


def _num(v: float) -> float | None:
    return None if (isinstance(v, float) and not math.isfinite(v)) else v


def _jsonable(obj: Any) -> Any:
    """Plain JSON values: arrays to lists, numpy scalars to numbers, non-finite floats to None."""
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if hasattr(obj, "tolist"):
        return _jsonable(obj.tolist())
    if isinstance(obj, float):
        return _num(obj)
    if obj is None or isinstance(obj, (str, int, bool)):
        return obj
    return str(obj)


# ---------------------------------------------------------------------------------------------------- sidecars
def _split_diagnostics(diag: dict, inline: bool) -> tuple[Any, dict]:
    """The diagnostics as JSON values, and (unless ``inline``) the large arrays taken out of them: each replaced by
    ``{"sidecar": key}``, the arrays keyed by their path of keys joined with "-" (e.g. ``labels``)."""
    arrays: dict = {}

    def walk(obj: Any, key: str) -> Any:
        if isinstance(obj, dict):
            return {str(k): walk(v, f"{key}-{k}" if key else str(k)) for k, v in obj.items()}
        if not inline and _is_large_array(obj):
            arrays[key] = np.asarray(obj)
            return {"sidecar": key}
        return _jsonable(obj)

    return walk(diag, ""), arrays


def _is_large_array(obj: Any) -> bool:
    if isinstance(obj, np.ndarray):
        return obj.size >= SIDECAR_MIN_ITEMS and obj.dtype.kind in "biuf"
    if isinstance(obj, list | tuple) and len(obj) >= SIDECAR_MIN_ITEMS:
        return all(isinstance(v, int | float | np.integer | np.floating) and not isinstance(v, bool) for v in obj)
    return False


def _join_diagnostics(diag: Any, arrays: dict) -> Any:
    """The diagnostics with every ``{"sidecar": key}`` replaced by its array (None when its file was missing)."""
    if isinstance(diag, dict):
        if set(diag) == {"sidecar"}:
            return arrays.get(diag["sidecar"])
        return {k: _join_diagnostics(v, arrays) for k, v in diag.items()}
    return diag


def sidecar_path(path: str, key: str) -> str:
    """The sidecar file of ``key`` beside the selection file ``path``: ``sel.json`` -> ``sel.<key>.npy``."""
    base = path[:-5] if path.endswith(".json") else path
    return f"{base}.{key}.npy"


def _write_sidecar(path: str, key: str, a: np.ndarray) -> dict:
    """``a`` as ``.npy`` beside ``path``, streamed in slices (no second copy of it in memory), with its crc32c."""
    import crc32c

    a = np.ascontiguousarray(a)
    target = sidecar_path(path, key)
    crc = [0]

    def write(f: Any) -> None:
        head = io.BytesIO()
        np.lib.format.write_array_header_1_0(head, np.lib.format.header_data_from_array_1_0(a))
        for piece in (head.getvalue(), *_slices(a)):
            crc[0] = crc32c.crc32c(piece, crc[0])
            f.write(piece)

    _write_stream(target, write)
    return {"file": target.replace("\\", "/").rsplit("/", 1)[-1], "dtype": str(a.dtype), "shape": list(a.shape),
            "crc32c": f"{crc[0]:08x}"}


def _slices(a: np.ndarray, size: int = 1 << 24) -> Iterator[memoryview]:
    """The bytes of a contiguous array in slices of ``size`` bytes, without copying."""
    view = memoryview(a.reshape(-1).view(np.uint8)) if a.size else memoryview(b"")
    for i in range(0, len(view), size):
        yield view[i:i + size]


def _read_sidecars(path: str | None, sidecars: dict) -> tuple[dict, dict]:
    """(key -> array) of the sidecars found, and (key -> file) of those missing; a sidecar whose bytes do not match
    its recorded crc32c, shape or dtype is a :class:`ParameterError` naming it."""
    import crc32c

    found, missing = {}, {}
    for key, meta in sidecars.items():
        if path is None:
            missing[key] = str(meta.get("file", key))
            continue
        target = sidecar_path(path, key)
        try:
            data = _read_bytes(target)
        except FileNotFoundError:
            missing[key] = target
            continue
        if meta.get("crc32c") and f"{crc32c.crc32c(data):08x}" != meta["crc32c"]:
            raise ParameterError(f"{target} does not belong to {path} (its crc32c differs from the one recorded "
                                 f"there: written by another run, or damaged); write the selection again")
        a = _npy_from(data)
        if list(a.shape) != list(meta.get("shape", a.shape)) or str(a.dtype) != meta.get("dtype", str(a.dtype)):
            raise ParameterError(f"{target} holds a {a.dtype} array of shape {a.shape}; {path} records "
                                 f"{meta.get('dtype')} {tuple(meta.get('shape', ()))}")
        found[key] = a
    return found, missing


def _npy_from(data: bytearray) -> np.ndarray:
    """The array of ``.npy`` bytes, over the same buffer (no copy)."""
    f = io.BytesIO(data)
    version = np.lib.format.read_magic(f)
    read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    shape, fortran, dtype = read(f)
    if dtype.hasobject:
        raise ParameterError("a selection's sidecar holds Python objects; refusing to load it")
    n = int(np.prod(shape, dtype=np.int64))
    a = np.frombuffer(data, dtype=dtype, count=n, offset=f.tell())
    return a.reshape(shape, order="F" if fortran else "C")


def _write_stream(path: str, write: Callable[[Any], None]) -> None:
    """``write(file)`` to ``path``: locally through :func:`~dufs.methods.solver.atomic_write` (a temporary name
    renamed into place; a failure leaves no part); to an fsspec URL as one object."""
    if "://" in path and not path.startswith("file://"):
        import fsspec

        with fsspec.open(path, "wb") as f:
            write(f)
        return
    from dufs.methods.solver import atomic_write

    atomic_write(path[len("file://"):] if path.startswith("file://") else path, write, fsync=False)


def _write_bytes(path: str, data: bytes) -> None:
    """``data`` to ``path`` whole (:func:`_write_stream`)."""
    _write_stream(path, lambda f: f.write(data))


def _read_bytes(path: str) -> bytearray:
    """The bytes of ``path`` in a writable buffer (arrays read from it are not copied again)."""
    if "://" in path and not path.startswith("file://"):
        import fsspec

        with fsspec.open(path, "rb") as f:
            return bytearray(f.read())
    path = path[len("file://"):] if path.startswith("file://") else path
    with open(path, "rb") as f:
        buf = bytearray(os.fstat(f.fileno()).st_size)
        n = f.readinto(buf)
    return buf if n == len(buf) else buf[:n]
