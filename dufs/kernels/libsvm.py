"""A fast parser of libsvm/svmlight text on raw bytes.

:func:`parse_block` turns a block of whole lines of libsvm text (a 1-D ``uint8`` array) into CSR
buffers. The hot loop is one numba function that walks the bytes once; it accepts what
:func:`sklearn.datasets.load_svmlight_file` accepts and gives bit-identical results on it, and is
stricter in a few places (nan/inf, BOM, NUL, multi-label and duplicate indices are errors;
unsorted indices are sorted instead of rejected). A ``qid:N`` field right after the label is an
error by default; with ``allow_qid=True`` it is read and ignored, as scikit-learn does unless
``query_id=True`` (``N`` must then be an integer), and the rows that had one are flagged.

Numbers are parsed to exactly the float64 that Python's ``float`` gives by
:mod:`dufs.kernels._decimal` (Clinger's fast path, else the Eisel-Lemire algorithm). The rare token
still ambiguous (near a halfway point), overflowing, or holding underscores is recorded and
finished by Python's ``float`` after the numba call.

One module over the size the project keeps its modules to, on purpose: the parser is one numba function
(``_parse_kernel``) and the small ``@njit`` helpers it inlines, which numba compiles together; every error it can
report, its message and the checks that decide between them belong with it, and split across modules the
helpers would be imported back into the one function that uses them. The number parsing that stands apart lives
in :mod:`dufs.kernels._decimal`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import IntEnum

import numba
import numpy as np

from dufs.errors import ParameterError
from dufs.kernels._decimal import _parse_number

__all__ = ["ErrorCode", "ParsedBlock", "ERROR_MESSAGES", "error_message", "parse_block"]


class ErrorCode(IntEnum):
    """Why a line of libsvm text was rejected (``0`` means no error)."""

    OK = 0
    NON_NUMERIC_LABEL = 1
    NON_NUMERIC_VALUE = 2
    NONFINITE_LABEL = 3
    NONFINITE_VALUE = 4
    NEGATIVE_INDEX = 5
    INDEX_NOT_INTEGER = 6
    INDEX_TOO_LARGE = 7
    DUPLICATE_INDEX = 8
    TRUNCATED_PAIR = 9
    MISSING_LABEL = 10
    BYTE_ORDER_MARK = 11
    NUL_BYTE = 12
    MULTILABEL = 13
    QID = 14
    BAD_QID = 15


ERROR_MESSAGES: dict[int, str] = {
    ErrorCode.OK: "no error",
    ErrorCode.NON_NUMERIC_LABEL: "the label is not a number",
    ErrorCode.NON_NUMERIC_VALUE: "a feature value is not a number",
    ErrorCode.NONFINITE_LABEL: "the label is nan or infinite",
    ErrorCode.NONFINITE_VALUE: "a feature value is nan or infinite",
    ErrorCode.NEGATIVE_INDEX: "a feature index is negative",
    ErrorCode.INDEX_NOT_INTEGER: "a feature index is not an integer",
    ErrorCode.INDEX_TOO_LARGE: "a feature index exceeds the index limit (2**31 - 1 by default)",
    ErrorCode.DUPLICATE_INDEX: "a feature index appears twice in the line",
    ErrorCode.TRUNCATED_PAIR: "an index:value pair is cut off (expected 'index:value')",
    ErrorCode.MISSING_LABEL: "the line has no label (it starts with an index:value pair)",
    ErrorCode.BYTE_ORDER_MARK: "a byte-order mark (EF BB BF); save the file without BOM",
    ErrorCode.NUL_BYTE: "a NUL byte in the line",
    ErrorCode.MULTILABEL: "a multi-label label (comma-separated) is not supported",
    ErrorCode.QID: "qid is not supported",
    ErrorCode.BAD_QID: "the qid field is not 'qid:<integer>'",
}


def error_message(code: int) -> str:
    """The human reason for an :class:`ErrorCode`."""
    try:
        return ERROR_MESSAGES[int(code)]
    except KeyError:
        raise ParameterError(f"Unknown libsvm error code {code!r}.") from None


# Plain ints for the kernels (numba freezes module globals at compile time).
_NON_NUMERIC_LABEL = int(ErrorCode.NON_NUMERIC_LABEL)
_NON_NUMERIC_VALUE = int(ErrorCode.NON_NUMERIC_VALUE)
_NONFINITE_LABEL = int(ErrorCode.NONFINITE_LABEL)
_NONFINITE_VALUE = int(ErrorCode.NONFINITE_VALUE)
_NEGATIVE_INDEX = int(ErrorCode.NEGATIVE_INDEX)
_INDEX_NOT_INTEGER = int(ErrorCode.INDEX_NOT_INTEGER)
_INDEX_TOO_LARGE = int(ErrorCode.INDEX_TOO_LARGE)
_DUPLICATE_INDEX = int(ErrorCode.DUPLICATE_INDEX)
_TRUNCATED_PAIR = int(ErrorCode.TRUNCATED_PAIR)
_MISSING_LABEL = int(ErrorCode.MISSING_LABEL)
_BYTE_ORDER_MARK = int(ErrorCode.BYTE_ORDER_MARK)
_NUL_BYTE = int(ErrorCode.NUL_BYTE)
_MULTILABEL = int(ErrorCode.MULTILABEL)
_QID = int(ErrorCode.QID)
_BAD_QID = int(ErrorCode.BAD_QID)


@dataclass(frozen=True, eq=False)
class ParsedBlock:
    """CSR buffers and bookkeeping of one parsed block of libsvm text.

    Line numbers are 1-based and local to the block; offsets are byte offsets into the block.
    ``indices`` are the raw indices as written (no base shift), sorted within each row. An error
    offset points at the offending field: the label, the pair token (index errors, cut-off pairs,
    ``qid``, the second occurrence of a duplicate index), the value after the colon, or the NUL /
    BOM byte itself. With ``skip_errors=False`` the counts (``n_blank``, ``n_comment``) cover the
    lines before the error; ``n_lines`` always covers the whole block.
    """

    labels: np.ndarray  # float64 [n_rows]
    indptr: np.ndarray  # int64 [n_rows + 1]
    indices: np.ndarray  # int64 [nnz]
    data: np.ndarray  # float64 [nnz]
    row_lines: np.ndarray  # int64 [n_rows], the line each row came from
    n_lines: int
    n_blank: int
    n_comment: int
    min_index: int  # -1 when there are no entries
    max_index: int  # -1 when there are no entries
    max_index_line: int  # line of the first occurrence of max_index, -1 when none
    error_code: int  # first error (skip_errors=False), else 0
    error_line: int  # 0 when no error
    error_offset: int  # -1 when no error
    n_skipped: int
    skipped_lines: np.ndarray  # int64 [min(n_skipped, max_recorded)]
    skipped_offsets: np.ndarray
    skipped_codes: np.ndarray
    row_qid: np.ndarray | None = None  # bool [n_rows]: the row's line had a qid field (allow_qid=True)

    @property
    def n_rows(self) -> int:
        return int(self.labels.shape[0])

    @property
    def n_qid(self) -> int:
        """Rows whose line had a ``qid:N`` field (read and ignored; only with ``allow_qid=True``)."""
        return 0 if self.row_qid is None else int(np.count_nonzero(self.row_qid))

    @property
    def nnz(self) -> int:
        return int(self.indices.shape[0])

    @property
    def error_reason(self) -> str:
        return error_message(self.error_code)


# Byte classes: 0 = part of a token, 1 = blank inside a line, 2 = newline, 3 = '#'.
# Blanks are Python's bytes.split() whitespace (what scikit-learn splits on) minus the newline.
_CLASS = np.zeros(256, dtype=np.uint8)
_CLASS[[ord(" "), ord("\t"), ord("\r"), 0x0B, 0x0C]] = 1
_CLASS[ord("\n")] = 2
_CLASS[ord("#")] = 3

_NAN = np.frombuffer(b"nan", dtype=np.uint8).copy()
_INF = np.frombuffer(b"inf", dtype=np.uint8).copy()
_INFINITY = np.frombuffer(b"infinity", dtype=np.uint8).copy()
_NL, _HASH, _COLON, _COMMA, _PLUS, _MINUS, _UNDERSCORE = 10, 35, 58, 44, 43, 45, 95

_jit = numba.njit(nogil=True, cache=True)


@_jit
def _is_bom(buf, k, n):
    return buf[k] == 0xEF and k + 2 < n and buf[k + 1] == 0xBB and buf[k + 2] == 0xBF


@_jit
def _token_end(buf, s, n):
    while s < n and _CLASS[buf[s]] == 0:
        s += 1
    return s


@_jit
def _bad_bytes(buf, s, e, n):
    """First NUL or BOM in buf[s:e] as (code, offset), or (0, -1)."""
    for k in range(s, e):
        if buf[k] == 0:
            return _NUL_BYTE, k
        if _is_bom(buf, k, n):
            return _BYTE_ORDER_MARK, k
    return 0, -1


@_jit
def _matches(buf, s, word):
    for j in range(word.shape[0]):
        if (buf[s + j] | 32) != word[j]:
            return False
    return True


@_jit
def _is_nonfinite_word(buf, s, e):
    """Whether buf[s:e] spells [+-](nan|inf|infinity), any case."""
    if s < e and (buf[s] == _PLUS or buf[s] == _MINUS):
        s += 1
    k = e - s
    if k == 3:
        return _matches(buf, s, _NAN) or _matches(buf, s, _INF)
    return k == 8 and _matches(buf, s, _INFINITY)


@_jit
def _number_error(buf, s, n, is_label):
    """Classify a number token at s that failed to parse: (code, offset)."""
    e = _token_end(buf, s, n)
    code, off = _bad_bytes(buf, s, e, n)
    if code:
        return code, off
    if is_label:
        for k in range(s, e):
            if buf[k] == _COLON:
                return _MISSING_LABEL, s
        for k in range(s, e):
            if buf[k] == _COMMA:
                return _MULTILABEL, s
    if _is_nonfinite_word(buf, s, e):
        return (_NONFINITE_LABEL if is_label else _NONFINITE_VALUE), s
    return (_NON_NUMERIC_LABEL if is_label else _NON_NUMERIC_VALUE), s


@_jit
def _parse_index_general(buf, s, n, index_limit):
    """Parse the index of a pair token at s: (index, end, code, offset).

    Handles signs, underscores and every error; the end is the colon when the code is 0.
    """
    pos = s
    neg = False
    if buf[pos] == _MINUS or buf[pos] == _PLUS:
        neg = buf[pos] == _MINUS
        pos += 1
    idx = 0
    nd = 0
    too_big = False
    bad_us = False
    last_digit = False
    while pos < n:
        d = np.int64(buf[pos]) - 48
        if 0 <= d <= 9:
            nd += 1
            if not too_big:
                idx = idx * 10 + d
                too_big = idx > index_limit
            last_digit = True
            pos += 1
        elif buf[pos] == _UNDERSCORE:
            bad_us = bad_us or not last_digit
            last_digit = False
            pos += 1
        else:
            break
    code = 0
    off = s
    if pos < n and buf[pos] == _COLON:
        if nd == 0 and pos == s:
            code = _TRUNCATED_PAIR
        elif nd == 0 or bad_us or not last_digit:
            code = _INDEX_NOT_INTEGER
        elif neg and (idx != 0 or too_big):
            code = _NEGATIVE_INDEX
        elif too_big:
            code = _INDEX_TOO_LARGE
    elif pos >= n or _CLASS[buf[pos]] != 0:
        code = _TRUNCATED_PAIR if nd > 0 and not bad_us and last_digit else _INDEX_NOT_INTEGER
    else:
        code, off = _bad_bytes(buf, s, _token_end(buf, s, n), n)
        if code == 0:
            code, off = _INDEX_NOT_INTEGER, s
    return idx, pos, code, off


@_jit
def _is_qid(buf, s, n):
    """Whether the token at s starts with 'qid' (scikit-learn's test for a qid field)."""
    return buf[s] == 113 and s + 2 < n and buf[s + 1] == 105 and buf[s + 2] == 100


@_jit
def _qid_end(buf, s, n):
    """The end of a well-formed ``qid:[+-]digits`` token at s, or -1."""
    pos = s + 3
    if pos >= n or buf[pos] != _COLON:
        return -1
    pos += 1
    if pos < n and (buf[pos] == _PLUS or buf[pos] == _MINUS):
        pos += 1
    nd = 0
    while pos < n and 48 <= buf[pos] <= 57:
        pos += 1
        nd += 1
    if nd == 0 or (pos < n and _CLASS[buf[pos]] == 0):
        return -1
    return pos


@_jit
def _skip_comment(buf, pos, n):
    """Skip from a '#' to past the newline: (code, offset, pos); a NUL or BOM inside is an error."""
    while pos < n:
        c = buf[pos]
        if c == _NL:
            return 0, -1, pos + 1
        if c == 0:
            return _NUL_BYTE, pos, pos
        if c == 0xEF and _is_bom(buf, pos, n):
            return _BYTE_ORDER_MARK, pos, pos
        pos += 1
    return 0, -1, pos


@_jit
def _duplicate_offset(buf, lstart, n, row_sorted):
    """Offset of the first pair token (in text order) whose index appeared earlier on the line."""
    k = row_sorted.shape[0]
    ndup = 0
    dups = np.empty(k, dtype=np.int64)
    for j in range(1, k):
        if row_sorted[j] == row_sorted[j - 1] and (ndup == 0 or dups[ndup - 1] != row_sorted[j]):
            dups[ndup] = row_sorted[j]
            ndup += 1
    dups = dups[:ndup]
    seen = np.zeros(ndup, dtype=np.int64)
    pos = lstart
    while pos < n and _CLASS[buf[pos]] == 1:
        pos += 1
    pos = _token_end(buf, pos, n)  # the label
    first = True
    while True:
        while pos < n and _CLASS[buf[pos]] == 1:
            pos += 1
        if pos >= n or _CLASS[buf[pos]] != 0:
            return -1
        s = pos
        if first and _is_qid(buf, s, n):  # a qid field (allow_qid=True): not a pair
            first = False
            pos = _token_end(buf, pos, n)
            continue
        first = False
        v = 0
        while pos < n and buf[pos] != _COLON:
            d = np.int64(buf[pos]) - 48
            if 0 <= d <= 9:
                v = v * 10 + d
            pos += 1
        lo = 0
        hi = ndup
        while lo < hi:  # binary search of v in dups
            mid = (lo + hi) // 2
            if dups[mid] < v:
                lo = mid + 1
            else:
                hi = mid
        j = lo
        if j < ndup and dups[j] == v:
            seen[j] += 1
            if seen[j] == 2:
                return s
        pos = _token_end(buf, pos, n)


@_jit
def _record_slow(slow, nslow, start, end, slot, line, row, lstart):
    """Put a token for Python's float in row ``nslow`` of the table ``slow``, when it has room (the caller
    counts every token and parses again with a table large enough: growing the table here, an array assigned
    inside the hot loop, made the whole kernel much slower: docs/measurements.md, "Parsing")."""
    if nslow < slow.shape[0]:
        slow[nslow, 0] = start
        slow[nslow, 1] = end
        slow[nslow, 2] = slot
        slow[nslow, 3] = line
        slow[nslow, 4] = row
        slow[nslow, 5] = lstart


@_jit
def _argsort(keys):
    """A stable argsort (insertion-sorted runs of 16, then bottom-up merges); quick to compile."""
    k = keys.shape[0]
    perm = np.arange(k)
    for lo in range(0, k, 16):
        for i in range(lo + 1, min(lo + 16, k)):
            p = perm[i]
            j = i - 1
            while j >= lo and keys[perm[j]] > keys[p]:
                perm[j + 1] = perm[j]
                j -= 1
            perm[j + 1] = p
    src = perm
    dst = np.empty(k, dtype=np.int64)
    width = 16
    while width < k:
        for lo in range(0, k, 2 * width):
            mid = min(lo + width, k)
            hi = min(lo + 2 * width, k)
            i = lo
            j = mid
            for o in range(lo, hi):
                if j >= hi or (i < mid and keys[src[i]] <= keys[src[j]]):
                    dst[o] = src[i]
                    i += 1
                else:
                    dst[o] = src[j]
                    j += 1
        src, dst = dst, src
        width *= 2
    return src


@_jit
def _sort_row(indices, data, s, e, slow, slow_lo, slow_hi):
    """Sort indices[s:e], permute data along and remap slow tokens' value slots."""
    perm = _argsort(indices[s:e])
    row_indices = np.empty(e - s, dtype=np.int64)
    row_data = np.empty(e - s, dtype=np.float64)
    for j in range(e - s):
        row_indices[j] = indices[s + perm[j]]
        row_data[j] = data[s + perm[j]]
    for j in range(e - s):
        indices[s + j] = row_indices[j]
        data[s + j] = row_data[j]
    if slow_hi > slow_lo:
        inv = np.empty(e - s, dtype=np.int64)
        for j in range(e - s):
            inv[perm[j]] = j
        for j in range(slow_lo, min(slow_hi, slow.shape[0])):  # a table too small: parsed again
            if slow[j, 2] >= 0:
                slow[j, 2] = s + inv[slow[j, 2] - s]


@_jit
def _count_byte(buf, byte):
    n = 0
    for k in range(buf.shape[0]):
        n += buf[k] == byte
    return n


def count_entries(buf: np.ndarray) -> int:
    """The most entries (``index:value`` fields) :func:`parse_block` can find in ``buf``: its colons."""
    return int(_count_byte(_as_buffer(buf), np.uint8(_COLON)))


@_jit
def _count_two(buf):
    n_nl = 0
    n_colon = 0
    for k in range(buf.shape[0]):
        c = buf[k]
        n_nl += c == _NL
        n_colon += c == _COLON
    return n_nl, n_colon


def count_lines_and_entries(buf: np.ndarray) -> tuple[int, int]:
    """(newlines, colons) of ``buf``: what :func:`parse_block` sizes its arrays by, its ``counts`` (one sweep: a
    caller that sizes the entries' memory by :func:`count_entries` first swept the text twice)."""
    n_nl, n_colon = _count_two(_as_buffer(buf))
    return int(n_nl), int(n_colon)


@_jit
def _parse_kernel(buf, skip_errors, max_recorded, index_limit, allow_qid, slow_capacity, indices_buf, data_buf,
                  n_nl, n_colon):
    n = buf.shape[0]
    if n_nl < 0:
        n_nl, n_colon = _count_two(buf)
    n_lines = n_nl + (1 if n > 0 and buf[n - 1] != _NL else 0)

    labels = np.empty(n_lines, dtype=np.float64)
    row_lines = np.empty(n_lines, dtype=np.int64)
    row_qid = np.zeros(n_lines, dtype=np.bool_)
    indptr = np.empty(n_lines + 1, dtype=np.int64)
    indptr[0] = 0
    if indices_buf.shape[0] >= n_colon and data_buf.shape[0] >= n_colon:  # the caller's memory
        indices = indices_buf[:n_colon]
        data = data_buf[:n_colon]
    else:
        indices = np.empty(n_colon, dtype=np.int64)
        data = np.empty(n_colon, dtype=np.float64)
    # tokens for Python's float: start, end, slot (data index, or -(row + 1) for a label), line,
    # row, line start; the first slow_capacity of them (nslow counts them all)
    slow = np.empty((slow_capacity, 6), dtype=np.int64)
    rec = np.empty((max_recorded, 3), dtype=np.int64)  # line, offset, code

    # np.int64, not literal 0: literal-typed first passes would compile the helpers twice
    nrows = np.int64(0)
    nnz = np.int64(0)
    nslow = np.int64(0)
    n_blank = 0
    n_comment = 0
    n_skipped = 0
    min_index = np.iinfo(np.int64).max
    max_index = -1
    max_line = -1
    err_code = 0
    err_line = 0
    err_off = -1

    pos = np.int64(0)
    line = np.int64(0)
    while pos < n:
        line += 1
        lstart = pos
        c = _NL
        while pos < n:
            c = buf[pos]
            if _CLASS[c] != 1:
                break
            pos += 1
        if pos >= n or c == _NL:
            n_blank += 1
            pos += 1
            continue
        code = 0
        off = -1
        if c == _HASH:
            code, off, pos = _skip_comment(buf, pos, n)
            if code == 0:
                n_comment += 1
                continue
        row_start = nnz
        slow_start = nslow
        if code == 0:
            # the label: the common one (a sign and plain digits, at most 15, ending the token) here, as the index
            # and value below. The three digit loops are written out on purpose: one shared helper returning
            # (value, end), plain or numba-inlined, parsed far slower (docs/measurements.md, "Parsing")
            q = pos
            neg = buf[q] == _MINUS
            if neg or buf[q] == _PLUS:
                q += 1
            e = q
            mm = np.int64(0)
            while e < n:
                d = np.int64(buf[e]) - 48
                if d < 0 or d > 9:
                    break
                mm = mm * 10 + d
                e += 1
            if e > q and e - q <= 15 and (e >= n or _CLASS[buf[e]] != 0):
                v = -float(mm) if neg else float(mm)
                st = 0
            else:
                v, e, st = _parse_number(buf, pos, n)
            if st == 2 or (e < n and _CLASS[buf[e]] == 0):
                code, off = _number_error(buf, pos, n, True)
            else:
                if st == 1:
                    _record_slow(slow, nslow, pos, e, -(nrows + 1), line, nrows, lstart)
                    nslow += 1
                labels[nrows] = v
                pos = e
        prev = -1
        unsorted = False
        dup_off = -1
        first = True
        has_qid = False
        while code == 0:
            while pos < n and _CLASS[buf[pos]] == 1:
                pos += 1
            if pos >= n or _CLASS[buf[pos]] != 0:
                break
            s = pos
            if first and _is_qid(buf, s, n):
                code, off = _bad_bytes(buf, s, _token_end(buf, s, n), n)
                if code == 0 and allow_qid:
                    e = _qid_end(buf, s, n)
                    if e >= 0:  # read and ignored
                        has_qid = True
                        first = False
                        pos = e
                        continue
                    code, off = _BAD_QID, s
                elif code == 0:
                    code, off = _QID, s
                break
            first = False
            # the index: plain digits and a colon here (written out, as the value's below), anything else by the
            # general parser
            idx = np.int64(0)
            while pos < n:
                d = np.int64(buf[pos]) - 48
                if d < 0 or d > 9:
                    break
                idx = idx * 10 + d
                pos += 1
            if not (pos < n and buf[pos] == _COLON and 0 < pos - s <= 18 and idx <= index_limit):
                idx, pos, code, off = _parse_index_general(buf, s, n, index_limit)
                if code != 0:
                    break
            # the value
            pos += 1
            if pos >= n or _CLASS[buf[pos]] != 0:
                code, off = _TRUNCATED_PAIR, s
                break
            # the common value first, written out here (through the inlined _parse_number a block parsed at 190
            # MB/s, with these two fast paths here 500): plain digits, at most 15 (exact in float64), ending the
            # token; anything else (a sign, a point, an exponent, more digits, a bad byte) from the start again by
            # _parse_number, whose result for plain digits is the same float(mantissa)
            e = pos
            mm = np.int64(0)
            while e < n:
                d = np.int64(buf[e]) - 48
                if d < 0 or d > 9:
                    break
                mm = mm * 10 + d
                e += 1
            if e > pos and e - pos <= 15 and (e >= n or _CLASS[buf[e]] != 0):
                v = float(mm)
                st = 0
            else:
                v, e, st = _parse_number(buf, pos, n)
                if st == 2 or (e < n and _CLASS[buf[e]] == 0):
                    code, off = _number_error(buf, pos, n, False)
                    break
            if st == 1:
                _record_slow(slow, nslow, pos, e, nnz, line, nrows, lstart)
                nslow += 1
            pos = e
            if idx <= prev:
                if idx == prev:
                    if dup_off < 0:
                        dup_off = s
                else:
                    unsorted = True
            prev = idx
            indices[nnz] = idx
            data[nnz] = v
            nnz += 1
        if code == 0:
            if unsorted:
                _sort_row(indices, data, row_start, nnz, slow, slow_start, nslow)
                for j in range(row_start + 1, nnz):
                    if indices[j] == indices[j - 1]:
                        dup_off = max(
                            _duplicate_offset(buf, lstart, n, indices[row_start:nnz]), lstart
                        )
                        break
            if dup_off >= 0:
                code, off = _DUPLICATE_INDEX, dup_off
        if code == 0:
            if pos < n and buf[pos] == _HASH:
                code, off, pos = _skip_comment(buf, pos, n)
            else:
                pos += 1  # past the newline (or the end)
        if code == 0:
            row_lines[nrows] = line
            row_qid[nrows] = has_qid
            indptr[nrows + 1] = nnz
            if nnz > row_start:
                if indices[row_start] < min_index:
                    min_index = indices[row_start]
                if indices[nnz - 1] > max_index:
                    max_index = indices[nnz - 1]
                    max_line = line
            nrows += 1
            continue
        # a bad line
        if not skip_errors:
            err_code = code
            err_line = line
            err_off = off
            break
        nnz = row_start
        nslow = slow_start
        if n_skipped < max_recorded:
            rec[n_skipped, 0] = line
            rec[n_skipped, 1] = off
            rec[n_skipped, 2] = code
        n_skipped += 1
        while pos < n and buf[pos] != _NL:
            pos += 1
        pos += 1

    if max_index < 0:
        min_index = -1
    return (
        labels[:nrows],
        indptr[: nrows + 1],
        indices[:nnz],
        data[:nnz],
        row_lines[:nrows],
        n_lines,
        n_blank,
        n_comment,
        min_index,
        max_index,
        max_line,
        err_code,
        err_line,
        err_off,
        n_skipped,
        rec[: min(n_skipped, max_recorded)],
        slow[: min(nslow, slow_capacity)],
        n_colon,
        row_qid[:nrows],
        nslow,
    )


# rows of the table of tokens left to Python's float (rare: ambiguous roundings, overflow, underscores) that the
# kernel fills; a block with more is parsed again with a table of the size it reported
_SLOW_CAPACITY = 1024


def _as_buffer(buf) -> np.ndarray:
    if isinstance(buf, (bytes, bytearray, memoryview)):
        buf = np.frombuffer(buf, dtype=np.uint8)
    if not isinstance(buf, np.ndarray) or buf.dtype != np.uint8 or buf.ndim != 1:
        got = (
            f"an array of dtype {buf.dtype} and shape {buf.shape}"
            if isinstance(buf, np.ndarray)
            else f"a {type(buf).__name__}"
        )
        raise ParameterError(
            "The 'buf' parameter of parse_block must be a 1-D numpy uint8 array or bytes; "
            f"got {got}."
        )
    buf = np.ascontiguousarray(buf).view()
    buf.flags.writeable = False  # one kernel signature for writable and read-only input
    return buf


def _trim(a: np.ndarray, capacity: int) -> np.ndarray:
    """A slice of a buffer of ``capacity`` items, copied when it would pin much unused memory."""
    if (capacity - a.shape[0]) * a.itemsize > 0.25 * a.nbytes + 4096:
        return a.copy()
    return a


def parse_block(
    buf: np.ndarray,
    *,
    skip_errors: bool = False,
    max_recorded: int = 10,
    index_limit: int = 2**31 - 1,
    allow_qid: bool = False,
    buffers: tuple[np.ndarray, np.ndarray] | None = None,
    counts: tuple[int, int] | None = None,
) -> ParsedBlock:
    """Parse whole lines of libsvm/svmlight text into CSR buffers.

    Parameters
    ----------
    buf : 1-D numpy uint8 array (bytes are accepted too)
        Whole lines of text; the last line may lack its newline. ``\\r\\n`` line ends, blank
        lines, ``#`` comment lines and trailing ``# comments`` are accepted.
    skip_errors : bool, default=False
        False: stop at the first bad line and report it in ``error_code``, ``error_line``,
        ``error_offset`` (the rows before it are returned). True: drop every bad line, count them
        in ``n_skipped`` and record the first ``max_recorded`` in ``skipped_lines``,
        ``skipped_offsets``, ``skipped_codes``.
    max_recorded : int, default=10
        How many skipped lines to record.
    index_limit : int, default=2**31 - 1
        The largest feature index accepted.
    allow_qid : bool, default=False
        False: a ``qid`` field is an error (``ErrorCode.QID``). True: a ``qid:N`` field right after
        the label (``N`` an integer, else ``ErrorCode.BAD_QID``) is read and ignored, as by
        scikit-learn's ``load_svmlight_file``; ``row_qid`` flags the rows that had one.
    buffers : (int64 array, float64 array), optional
        Memory for the entries' indices and values, each of at least :func:`count_entries` items: the returned
        ``indices`` and ``data`` are then views of them (smaller ones are not used).
    counts : (int, int), optional
        ``buf``'s newlines and colons, as :func:`count_lines_and_entries` gives them (else counted here).

    Returns
    -------
    ParsedBlock
        Labels, CSR buffers with the raw indices sorted within each row, the line of each row,
        line counts, index range and error information. Line numbers are 1-based and local to
        ``buf``.
    """
    buf = _as_buffer(buf)
    if (
        isinstance(max_recorded, bool)
        or not isinstance(max_recorded, (int, np.integer))
        or max_recorded < 0
    ):
        raise ParameterError(
            "The 'max_recorded' parameter of parse_block must be an int in [0, inf); "
            f"got {max_recorded!r}."
        )
    if (
        isinstance(index_limit, bool)
        or not isinstance(index_limit, (int, np.integer))
        or not 0 <= index_limit < 2**63 // 10
    ):
        raise ParameterError(
            "The 'index_limit' parameter of parse_block must be an int in [0, 2**63 // 10); "
            f"got {index_limit!r}."
        )
    if buffers is None:
        bufs = (np.empty(0, np.int64), np.empty(0, np.float64))
    else:
        bufs = tuple(np.asarray(b) for b in buffers)
        if (len(bufs) != 2 or bufs[0].dtype != np.int64 or bufs[1].dtype != np.float64
                or not all(b.ndim == 1 and b.flags.c_contiguous and b.flags.writeable for b in bufs)):
            raise ParameterError("The 'buffers' parameter of parse_block must be a writable C-contiguous 1-D int64 "
                                 "array and a float64 one.")
    n_nl, n_colon = (-1, -1) if counts is None else (int(counts[0]), int(counts[1]))
    args = (buf, bool(skip_errors), int(max_recorded), int(index_limit), bool(allow_qid))
    out = _parse_kernel(*args, _SLOW_CAPACITY, *bufs, n_nl, n_colon)
    if out[-1] > _SLOW_CAPACITY:  # more tokens for Python's float than the table held: again, with room for all
        out = _parse_kernel(*args, int(out[-1]), *bufs, n_nl, n_colon)
    (
        labels,
        indptr,
        indices,
        data,
        row_lines,
        n_lines,
        n_blank,
        n_comment,
        min_index,
        max_index,
        max_line,
        err_code,
        err_line,
        err_off,
        n_skipped,
        rec,
        slow,
        n_colon,
        row_qid,
        _n_slow,
    ) = out
    if slow.shape[0]:
        bad = _resolve_slow(buf, slow, labels, data, labels.shape[0])
        if bad:
            if not skip_errors:
                line, off, code, _row, lstart = min(bad)
                if (
                    err_code == 0
                    or (line, off) < (err_line, err_off)
                    or (line == err_line and err_code == _DUPLICATE_INDEX)
                ):
                    head = parse_block(
                        buf[:lstart],
                        skip_errors=False,
                        max_recorded=max_recorded,
                        index_limit=index_limit,
                        allow_qid=allow_qid,
                    )
                    return _replace(
                        head,
                        n_lines=int(n_lines),
                        error_code=int(code),
                        error_line=int(line),
                        error_offset=int(off),
                    )
            else:
                return _drop_rows(out, bad, int(max_recorded))
    return ParsedBlock(
        labels=_trim(labels, n_lines),
        indptr=_trim(indptr, n_lines + 1),
        indices=_trim(indices, n_colon),
        data=_trim(data, n_colon),
        row_lines=_trim(row_lines, n_lines),
        n_lines=int(n_lines),
        n_blank=int(n_blank),
        n_comment=int(n_comment),
        min_index=int(min_index),
        max_index=int(max_index),
        max_index_line=int(max_line),
        error_code=int(err_code),
        error_line=int(err_line),
        error_offset=int(err_off),
        n_skipped=int(n_skipped),
        skipped_lines=rec[:, 0].copy(),
        skipped_offsets=rec[:, 1].copy(),
        skipped_codes=rec[:, 2].copy(),
        row_qid=_trim(row_qid, n_lines),
    )


def _resolve_slow(buf, slow, labels, data, n_rows):
    """Parse the recorded tokens with Python's float, write them, and return the bad ones.

    Returns a list of ``(line, offset, code, row, line_start)``, one per bad token.
    """
    raw = memoryview(buf)
    bad = []
    for start, end, slot, line, row, lstart in slow.tolist():
        is_label = slot < 0
        try:
            v = float(bytes(raw[start:end]))
        except ValueError:
            code = _NON_NUMERIC_LABEL if is_label else _NON_NUMERIC_VALUE
        else:
            if math.isfinite(v):
                if row < n_rows:
                    if is_label:
                        labels[-slot - 1] = v
                    else:
                        data[slot] = v
                continue
            code = _NONFINITE_LABEL if is_label else _NONFINITE_VALUE
        bad.append((line, start, code, row, lstart))
    return bad


def _replace(block: ParsedBlock, **changes) -> ParsedBlock:
    fields = {name: getattr(block, name) for name in block.__dataclass_fields__}
    fields.update(changes)
    return ParsedBlock(**fields)


def _drop_rows(out, bad, max_recorded) -> ParsedBlock:
    """Drop the rows holding bad tokens (skip_errors=True); merge them into the skip records."""
    (
        labels,
        indptr,
        indices,
        data,
        row_lines,
        n_lines,
        n_blank,
        n_comment,
        _min,
        _max,
        _line,
        _code,
        _eline,
        _eoff,
        n_skipped,
        rec,
        _slow,
        _n_colon,
        row_qid,
        _n_slow,
    ) = out
    first_bad = {}
    for line, off, code, row, _lstart in sorted(bad):
        first_bad.setdefault(row, (line, off, code))
    keep = np.ones(labels.shape[0], dtype=bool)
    keep[list(first_bad)] = False
    counts = np.diff(indptr)
    entry_keep = np.repeat(keep, counts)
    new_indptr = np.zeros(int(keep.sum()) + 1, dtype=np.int64)
    np.cumsum(counts[keep], out=new_indptr[1:])
    indices = indices[entry_keep]
    new_lines = row_lines[keep]
    records = sorted([tuple(r) for r in rec.tolist()] + list(first_bad.values()))[:max_recorded]
    rec = np.array(records, dtype=np.int64).reshape(-1, 3)
    if indices.shape[0]:
        min_index = int(indices.min())
        max_index = int(indices.max())
        row_of_max = (
            np.searchsorted(new_indptr, int(np.argmax(indices == max_index)), side="right") - 1
        )
        max_line = int(new_lines[row_of_max])
    else:
        min_index = max_index = max_line = -1
    return ParsedBlock(
        labels=labels[keep],
        indptr=new_indptr,
        indices=indices,
        data=data[entry_keep],
        row_lines=new_lines,
        n_lines=int(n_lines),
        n_blank=int(n_blank),
        n_comment=int(n_comment),
        min_index=min_index,
        max_index=max_index,
        max_index_line=max_line,
        error_code=0,
        error_line=0,
        error_offset=-1,
        n_skipped=int(n_skipped) + len(first_bad),
        skipped_lines=rec[:, 0].copy(),
        skipped_offsets=rec[:, 1].copy(),
        skipped_codes=rec[:, 2].copy(),
        row_qid=row_qid[keep],
    )
