"""Filesystem plumbing for stores: local paths and fsspec URLs, atomic renames, an exclusive lock file."""

from __future__ import annotations

import ctypes
import errno
import json
import os
import socket
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import fsspec
import zarr
from zarr.storage import FsspecStore, LocalStore

from dufs.data.layout import LOCK_NAME
from dufs.errors import StoreError, StoreLockedError


def is_url(path: str) -> bool:
    return "://" in str(path) and not str(path).startswith("file://")


@dataclass(frozen=True)
class Location:
    """A store location: a local directory or an fsspec URL."""

    url: str

    @classmethod
    def of(cls, path: str | os.PathLike) -> Location:
        s = os.fspath(path)
        if s.startswith("file://"):
            s = s[len("file://"):]
        if not is_url(s):
            s = os.path.abspath(s)
        return cls(s.rstrip("/") if s not in ("/",) else s)

    @property
    def local(self) -> bool:
        return not is_url(self.url)

    @property
    def fs(self) -> fsspec.AbstractFileSystem:
        return fsspec.core.url_to_fs(self.url)[0]

    @property
    def fspath(self) -> str:
        return fsspec.core.url_to_fs(self.url)[1]

    def sibling(self, suffix: str) -> Location:
        return Location(self.url + suffix)

    def child(self, name: str) -> str:
        return self.url + "/" + name

    def exists(self) -> bool:
        if self.local:
            return os.path.lexists(self.url)  # a dangling symbolic link is something there too
        return self.fs.exists(self.fspath)

    def names(self) -> list[str]:
        """The names of the entries of this directory (not recursive)."""
        if self.local:
            return sorted(os.listdir(self.url))
        base = self.fspath.rstrip("/")
        return sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in self.fs.ls(base, detail=False)
                      if p.rstrip("/") != base)

    def read_bytes(self, name: str) -> bytes:
        fs, fp = fsspec.core.url_to_fs(self.child(name))
        return fs.cat_file(fp)

    def zarr_store(self, read_only: bool) -> Any:
        if self.local:
            return LocalStore(self.url, read_only=read_only)
        return FsspecStore.from_url(self.url, read_only=read_only)

    def open_group(self, mode: str = "r") -> zarr.Group:
        return zarr.open_group(store=self.zarr_store(read_only=(mode == "r")), mode=mode)

    def remove(self) -> None:
        if not self.exists():
            return
        if self.local:
            import shutil

            shutil.rmtree(self.url)
        else:
            self.fs.rm(self.fspath, recursive=True)

    def rename_to(self, dest: Location) -> None:
        """Move this directory to ``dest`` (which must not exist)."""
        if dest.exists():
            raise StoreError(f"cannot rename {self.url} to {dest.url}: the destination exists")
        if self.local:
            os.replace(self.url, dest.url)
        else:
            _move_objects(self.fs, self.fspath, dest.fspath)

    def exchange(self, other: Location) -> bool:
        """Swap this directory and ``other`` in one atomic step (local paths on Linux: ``renameat2`` with
        ``RENAME_EXCHANGE``): no moment where either name is missing. Returns False, having changed nothing,
        where the system, the filesystem or the URL cannot do it (the caller then renames in two steps)."""
        if not (self.local and other.local and sys.platform.startswith("linux")):
            return False
        return _renameat2_exchange(self.url, other.url)

    # raw scratch files (the transpose's spill) --------------------------------------------------------
    def write_parts(self, name: str, parts: Sequence[Any]) -> None:
        """Write the buffers ``parts`` (bytes, C-contiguous arrays) one after another as the file ``name``, whole or
        not at all: a local file under a temporary name (the pattern of zarr's own, which a resume removes), then
        renamed; on an object store, one object in one request."""
        p = self.child(name)
        if self.local:
            os.makedirs(os.path.dirname(p), exist_ok=True)
            tmp = f"{p}.{uuid.uuid4().hex}.partial"
            try:
                with open(tmp, "wb") as f:
                    for part in parts:
                        f.write(memoryview(part).cast("B"))
                os.replace(tmp, p)
            except BaseException:
                if os.path.exists(tmp):
                    os.remove(tmp)
                raise
        else:
            fs, fp = fsspec.core.url_to_fs(p)
            fs.pipe_file(fp, b"".join(memoryview(part).cast("B") for part in parts))

    def reader(self, name: str) -> RangeReader:
        """Reads byte ranges of the file ``name`` (a context manager)."""
        return RangeReader(self.child(name), self.local)

    # small JSON side files (lock, checkpoints) --------------------------------------------------
    def read_json(self, name: str) -> Any | None:
        p = self.child(name)
        fs, fp = fsspec.core.url_to_fs(p)
        if not fs.exists(fp):
            return None
        with fs.open(fp, "r") as f:
            text = f.read()
        try:
            return json.loads(text)
        except ValueError:
            if name == LOCK_NAME:  # a writer killed between creating its lock and filling it in
                raise StoreLockedError(
                    f"the lock file {p} is unreadable ({text[:40]!r}); if no other process is writing this "
                    f"store, delete the lock file and run again (with --resume)") from None
            raise

    def write_json_atomic(self, name: str, obj: Any) -> None:
        p = self.child(name)
        if self.local:
            tmp = f"{p}.tmp-{os.getpid()}"
            with open(tmp, "w") as f:
                json.dump(obj, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, p)
        else:
            fs, fp = fsspec.core.url_to_fs(p)
            with fs.open(fp, "w") as f:
                json.dump(obj, f)


class RangeReader:
    """Byte ranges of one file into caller-given buffers: ``pread`` on a local file, range requests on a URL."""

    def __init__(self, url: str, local: bool):
        self.url = url
        self._fd = os.open(url, os.O_RDONLY) if local else None
        self._fs, self._path = (None, None) if local else fsspec.core.url_to_fs(url)

    @property
    def size(self) -> int:
        return os.fstat(self._fd).st_size if self._fd is not None else int(self._fs.size(self._path))

    def read(self, offset: int, nbytes: int) -> bytes:
        out = bytearray(nbytes)
        self.read_into(offset, out)
        return bytes(out)

    def read_into(self, offset: int, out: Any) -> None:
        """Fill ``out`` (a writable C-contiguous buffer) with the bytes at ``offset``; a short file is an
        ``EOFError``."""
        view = memoryview(out).cast("B")
        n = view.nbytes
        if n == 0:
            return
        if self._fd is None:
            got = self._fs.cat_file(self._path, start=offset, end=offset + n)
            if len(got) != n:
                raise EOFError(f"{self.url}: {n} bytes at {offset} asked for, {len(got)} there")
            view[:] = got
            return
        done = 0
        while done < n:
            k = os.preadv(self._fd, [view[done:]], offset + done)
            if k <= 0:
                raise EOFError(f"{self.url}: {n} bytes at {offset} asked for, {done} there")
            done += k

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> RangeReader:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


#: the object a Zarr v3 group's metadata (and a finished store's completion marker) lives in
_GROUP_METADATA = "zarr.json"


def _move_objects(fs: fsspec.AbstractFileSystem, src: str, dst: str) -> None:
    """Move the directory ``src`` to ``dst`` on a filesystem of URLs, object by object.

    Object stores (S3, GCS, Azure) have no rename, and their "directories" are only key prefixes, which
    ``fs.mv(recursive=True)`` tries to copy as objects (S3 answers NoSuchKey). So: copy every object (a server-side
    copy on object stores), the top group's ``zarr.json`` (where a finished store keeps its completion marker) last,
    so that ``dst`` never looks like a finished store before all of it is there; then delete ``src``.
    """
    src, dst = src.rstrip("/"), dst.rstrip("/")
    files = [f.rstrip("/") for f in fs.find(src)]  # objects only, never the prefixes between them
    marker = f"{src}/{_GROUP_METADATA}"
    rest = [f for f in files if f != marker]
    if rest:
        fs.copy(rest, [dst + f[len(src):] for f in rest])
    if marker in files:
        fs.copy(marker, f"{dst}/{_GROUP_METADATA}")
    fs.rm(src, recursive=True)


_AT_FDCWD, _RENAME_EXCHANGE = -100, 2


def _renameat2_exchange(a: str, b: str) -> bool:
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):  # a C library without renameat2 (glibc < 2.28, musl)
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EXDEV, errno.EPERM):
        return False  # no such system call, or a filesystem that cannot exchange: nothing was changed
    raise OSError(err, f"cannot exchange {a} and {b}: {os.strerror(err)}")


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` runs on this machine (one we may not signal counts as running)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def lock_is_live(held: dict) -> bool:
    """A lock is live unless its process is known to be gone (same host, no such pid)."""
    if held.get("host") != socket.gethostname():
        return True
    return pid_alive(int(held.get("pid", -1))) and int(held.get("pid", -1)) != os.getpid()


def acquire_lock(loc: Location, *, what: str) -> dict:
    """Create ``loc/dufs.lock`` exclusively. A lock whose process is gone (same host) is taken over."""
    me = {"host": socket.gethostname(), "pid": os.getpid(), "time": time.time(), "what": what}
    path = loc.child(LOCK_NAME)
    if loc.local:
        os.makedirs(loc.url, exist_ok=True)
        for _ in range(2):
            try:
                fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                held = loc.read_json(LOCK_NAME) or {}
                if not lock_is_live(held):
                    os.remove(path)  # stale: its process is gone
                    continue
                raise StoreLockedError(
                    f"{loc.url} is being written by another process (pid {held.get('pid')} on "
                    f"{held.get('host')}, since {time.ctime(held.get('time', 0))}); wait for it to "
                    f"finish, or stop it and resume"
                ) from None
            with os.fdopen(fd, "w") as f:
                json.dump(me, f)
            return me
        raise StoreLockedError(f"could not lock {loc.url}")
    held = loc.read_json(LOCK_NAME)
    if held is not None and lock_is_live(held):
        raise StoreLockedError(f"{loc.url} is being written by another process (pid {held.get('pid')} "
                               f"on {held.get('host')})")
    loc.write_json_atomic(LOCK_NAME, me)
    return me


def release_lock(loc: Location) -> None:
    p = loc.child(LOCK_NAME)
    fs, fp = fsspec.core.url_to_fs(p)
    if fs.exists(fp):
        fs.rm(fp)
