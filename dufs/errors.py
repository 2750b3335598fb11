"""The dufs error tree.

Every error dufs raises on bad input is a :class:`DufsError`, itself a :class:`ValueError`, so callers can catch
either. Messages name what is wrong and where (a file and line, a chunk, a parameter) and say how to fix it.
"""

from __future__ import annotations


class DufsError(ValueError):
    """Base class of every error dufs raises on bad input or bad state."""


class ParameterError(DufsError):
    """A parameter is out of its allowed range or of the wrong type."""


class InputFormatError(DufsError):
    """A libsvm/svmlight text input is malformed; the message names ``file:line`` and the byte offset."""

    def __init__(self, message: str, *, path: str | None = None, line: int | None = None,
                 offset: int | None = None, reason: str | None = None):
        super().__init__(message)
        self.path = path
        self.line = line
        self.offset = offset
        self.reason = reason


class MissingExtraError(DufsError, ImportError):
    """A feature needs a package that a plain ``pip install dufs`` leaves out; the message names the extra that
    brings it (``pip install 'dufs[plot]'``)."""


class StoreError(DufsError):
    """A sparse store cannot be opened or written."""


class IncompleteStoreError(StoreError):
    """The store was never finished (no completion marker); the message says how to resume."""


class StoreLockedError(StoreError):
    """Another writer holds the store's lock."""


class CorruptChunkError(StoreError):
    """A chunk of the store is missing, truncated or fails its checksum; the message names the chunk.

    ``damage``: every damaged place found, as ``(key, what)`` pairs (``dufs.data.verify_store`` collects them all;
    a read that fails on one chunk names that one)."""

    def __init__(self, message: str, *, damage: list[tuple[str, str]] | None = None):
        super().__init__(message)
        self.damage = list(damage or [])


class DufsWarning(UserWarning):
    """Warnings dufs emits (treated as errors in dufs' own test run)."""
