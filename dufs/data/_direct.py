"""1-D Zarr v3 arrays written straight into a local directory, without Zarr's array machinery.

Creating an array through Zarr reads and rewrites every parent group's ``zarr.json`` and checks for existing nodes,
each a trip through its I/O threads, which cost more than encoding and writing the chunks (docs/measurements.md,
"Writing arrays"). Here the array's ``zarr.json`` is the one Zarr itself writes for the same dtype and codecs
(made once, in memory, by Zarr, and given this array's shape and chunk shape), and each chunk is encoded by the
codecs that document names (bytes, blosc, zstd, crc32c: the same libraries, numcodecs and crc32c, with the same
settings as Zarr's codecs) and written as one file. A codec chain with anything else in it returns ``False`` and
the caller writes through Zarr. The files are Zarr's: tests read them back through Zarr and compare every chunk
byte for byte with what Zarr writes.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
from collections.abc import Callable
from typing import Any

import crc32c
import numpy as np

from dufs.data._fs import Location

_SHUFFLE = {"noshuffle": 0, "shuffle": 1, "bitshuffle": 2}


def _CRC32C(b: Any) -> Any:  # noqa: N802 - a marker in an encoder list: append the crc32c of the bytes so far
    return b


_templates: dict[tuple, tuple[dict, list[Callable[[Any], Any]]] | None] = {}


def _template(dtype: np.dtype, spec: dict) -> tuple[dict, list[Callable[[Any], Any]]] | None:
    """The ``zarr.json`` Zarr writes for a 1-D array of ``dtype`` laid out as ``spec`` (shape and chunks aside),
    and the encoders of its codec chain after ``bytes``; None when the chain holds a codec not handled here."""
    key = (dtype.str, json.dumps([c.to_dict() for c in spec["compressors"]], sort_keys=True, default=str))
    if key not in _templates:
        import zarr
        from zarr.storage import MemoryStore

        held: dict = {}
        zarr.create_array(store=MemoryStore(held), shape=(1,), chunks=(1,), dtype=dtype,
                          compressors=spec["compressors"], fill_value=spec["fill_value"], config=spec["config"])
        meta = json.loads(held["zarr.json"].to_bytes())
        _templates[key] = (meta, enc) if (enc := _encoders(meta, dtype)) is not None else None
    return _templates[key]


def _encoders(meta: dict, dtype: np.dtype) -> list[Callable[[Any], Any]] | None:
    codecs = meta.get("codecs", [])
    if (meta.get("chunk_key_encoding") != {"name": "default", "configuration": {"separator": "/"}}
            or not codecs or codecs[0].get("name") != "bytes" or meta.get("fill_value") not in (0, 0.0)):
        return None
    endian = codecs[0].get("configuration", {}).get("endian", "little")
    if dtype.itemsize > 1 and (endian == "little") != (dtype.byteorder in "=<" and np.little_endian):
        return None
    out: list[Callable[[Any], Any]] = []
    for c in codecs[1:]:
        name, cfg = c.get("name"), c.get("configuration", {})
        if name == "blosc":
            from numcodecs import Blosc

            out.append(Blosc.from_config({"cname": cfg["cname"], "clevel": cfg["clevel"],
                                          "shuffle": _SHUFFLE[cfg["shuffle"]], "blocksize": cfg["blocksize"],
                                          "typesize": cfg["typesize"]}).encode)
        elif name == "zstd":
            from numcodecs import Zstd

            out.append(Zstd.from_config({"level": cfg["level"], "checksum": cfg["checksum"]}).encode)
        elif name == "crc32c" and c is codecs[-1]:  # the chunk's checksum, appended: written after it (no copy)
            out.append(_CRC32C)
        else:
            return None
    return out


def write_local(root: str, name: str, values: np.ndarray, spec: dict) -> bool:
    """Write ``values`` (1-D, C-contiguous) as the Zarr array ``root/name`` laid out as ``spec`` (what
    :func:`dufs.data.store._array_spec` gives: chunks, codecs, fill value), replacing any array there. Returns False,
    having written nothing, when the codecs are not ones this module encodes."""
    tpl = _template(values.dtype, spec)
    if tpl is None:
        return False
    meta, encoders = tpl
    chunk = int(spec["chunks"][0])
    meta = {**meta, "shape": [int(values.shape[0])],
            "chunk_grid": {**meta["chunk_grid"], "configuration": {"chunk_shape": [chunk]}}}
    path = os.path.join(root, name)
    if os.path.isdir(path) and not os.path.islink(path):  # as Zarr's overwrite: no chunk of an earlier, longer
        shutil.rmtree(path)                                # array is left behind
    elif os.path.lexists(path):
        os.remove(path)
    os.makedirs(os.path.join(path, "c") if values.size else path)
    raw = memoryview(np.ascontiguousarray(values)).cast("B")
    step = chunk * values.dtype.itemsize
    for k in range(-(-values.shape[0] // chunk)):
        piece: Any = raw[k * step:(k + 1) * step]
        if len(piece) < step:  # the last chunk is stored whole, its tail the fill value (0), as Zarr stores it
            piece = bytes(piece) + bytes(step - len(piece))
        with open(os.path.join(path, "c", str(k)), "wb") as f:
            for enc in encoders:
                if enc is _CRC32C:
                    f.write(piece)
                    piece = struct.pack("<I", crc32c.crc32c(piece))
                else:
                    piece = enc(piece)
            f.write(piece)
    with open(os.path.join(path, "zarr.json"), "w") as f:
        json.dump(meta, f, indent=2)
    return True


_group_template: dict | None = None


def write_group(path: str, attributes: dict) -> None:
    """The Zarr group at the directory ``path`` (made when missing) with ``attributes``: its ``zarr.json`` is the
    document Zarr writes for a group with them, replaced whole (:meth:`~dufs.data._fs.Location.write_parts`: a
    reader sees the old one or the new)."""
    global _group_template
    if _group_template is None:
        import zarr
        from zarr.storage import MemoryStore

        held: dict = {}
        zarr.create_group(store=MemoryStore(held), zarr_format=3)
        _group_template = json.loads(held["zarr.json"].to_bytes())
    doc = json.dumps({**_group_template, "attributes": attributes}, indent=2).encode()
    Location(path).write_parts("zarr.json", [doc])
