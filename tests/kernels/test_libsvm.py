"""Tests of the numba libsvm parser against scikit-learn's load_svmlight_file."""

from __future__ import annotations

import io
import struct
from decimal import Decimal, localcontext

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sklearn.datasets import load_svmlight_file

from dufs.errors import ParameterError
from dufs.kernels.libsvm import (
    ERROR_MESSAGES,
    ErrorCode,
    ParsedBlock,
    count_entries,
    count_lines_and_entries,
    error_message,
    parse_block,
)


def bits(a) -> np.ndarray:
    """float64 values as their bit patterns, so that -0.0 != 0.0 and comparisons are exact."""
    return np.ascontiguousarray(a, dtype=np.float64).view(np.int64)


def reference(text: bytes):
    X, y = load_svmlight_file(io.BytesIO(text), zero_based=True)
    return y, X.indptr, X.indices, X.data


def assert_matches(block: ParsedBlock, text: bytes) -> None:
    y, indptr, indices, data = reference(text)
    assert block.error_code == 0
    assert np.array_equal(bits(block.labels), bits(y))
    assert np.array_equal(block.indptr, indptr)
    assert np.array_equal(block.indices, indices)
    assert np.array_equal(bits(block.data), bits(data))
    assert block.labels.dtype == np.float64 and block.data.dtype == np.float64
    assert block.indptr.dtype == np.int64 and block.indices.dtype == np.int64
    if block.nnz:
        assert block.min_index == block.indices.min() and block.max_index == block.indices.max()
    else:
        assert block.min_index == block.max_index == block.max_index_line == -1


# ---------------------------------------------------------------- random files


def _fmt(value: float, style: int, digits: int) -> str:
    if style == 0:
        return repr(value)
    if style == 1:
        return f"{value:.{digits}e}"
    if style == 2:
        return f"{value:.{digits}E}"
    if style == 3:
        return f"{value:.{digits + 1}g}"
    return f"{value:.{digits % 8}f}"


finite = st.floats(allow_nan=False, allow_infinity=False, width=64)
formatted = st.builds(_fmt, finite, st.integers(0, 4), st.integers(0, 20))
decimal_text = st.builds(
    lambda sign, whole, frac, exp: sign + whole + frac + exp,
    st.sampled_from(["", "+", "-"]),
    st.text("0123456789", min_size=0, max_size=25),
    st.one_of(st.just(""), st.text("0123456789", max_size=25).map(lambda s: "." + s)),
    st.one_of(
        st.just(""),
        st.builds(
            lambda e, s, k: e + s + str(k),
            st.sampled_from("eE"),
            st.sampled_from(["", "+", "-"]),
            st.integers(0, 330),
        ),
    ),
)


def _is_finite_number(s: str) -> bool:
    try:
        return np.isfinite(float(s))
    except ValueError:
        return False


number = st.one_of(
    formatted,
    decimal_text,
    st.integers(-1000, 1000).map(str),
    st.sampled_from(
        [
            "1",
            "-1",
            "+1",
            "0",
            "-0",
            ".5",
            "5.",
            "1e-3",
            "1E+10",
            "0.0",
            "1e-400",
            "4.9e-324",
            "2.2250738585072011e-308",
            "1.7976931348623157e308",
            "9007199254740993",
            "0.30000000000000000000000000000000001",
        ]
    ),
).filter(_is_finite_number)

blank = st.sampled_from(["", " ", "\t", "  \t ", "\r"])
comment_line = st.sampled_from(["#", "# a comment", "  #x 1:2", "\t# 3:4 #"])
sep = st.sampled_from([" ", "\t", "  ", " \t "])


@st.composite
def rows(draw):
    label = draw(number)
    index_set = draw(
        st.lists(st.integers(0, 2**31 - 1) | st.integers(0, 30), unique=True, max_size=12)
    )
    values = [draw(number) for _ in index_set]
    order = draw(st.permutations(range(len(index_set))))
    pairs = [f"{index_set[k]}:{values[k]}" for k in order]
    sorted_pairs = [f"{i}:{v}" for i, v in sorted(zip(index_set, values, strict=True))]
    seps = [draw(sep) for _ in range(len(pairs) + 1)]
    lead = draw(st.sampled_from(["", " ", "\t"]))
    tail = draw(st.sampled_from(["", " ", " # trailing 1:2", "#c", "\t#", "\r"]))

    def join(ps):
        out = lead + label
        for s, p in zip(seps, ps, strict=False):
            out += s + p
        return out + tail

    return join(pairs), join(sorted_pairs)


@st.composite
def files(draw):
    lines_ours, lines_ref = [], []
    for kind in draw(
        st.lists(st.sampled_from(["row", "row", "row", "blank", "comment"]), max_size=15)
    ):
        if kind == "row":
            ours, ref = draw(rows())
        else:
            ours = ref = draw(blank if kind == "blank" else comment_line)
        lines_ours.append(ours)
        lines_ref.append(ref)
    eol = draw(st.sampled_from(["\n", "\r\n"]))
    # a last line that is empty exists only when followed by a line end
    final = draw(st.booleans()) or (lines_ours and lines_ours[-1] == "")
    ours = eol.join(lines_ours) + (eol if final and lines_ours else "")
    ref = eol.join(lines_ref) + (eol if final and lines_ref else "")
    return ours.encode(), ref.encode(), lines_ours


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(files())
def test_random_files_match_sklearn(case):
    ours, ref, lines = case
    block = parse_block(np.frombuffer(ours, dtype=np.uint8))
    assert_matches(block, ref)
    # into the caller's memory (as dufs convert parses): the same, in views of it
    n = count_entries(ours)
    bufs = (np.full(n + 3, -7, np.int64), np.full(n + 3, np.nan))
    into = parse_block(np.frombuffer(ours, dtype=np.uint8), buffers=bufs)
    assert_matches(into, ref)
    assert np.shares_memory(into.indices, bufs[0]) == np.shares_memory(into.data, bufs[1]) == (into.nnz > 0)
    # ... with the text's counts given (as dufs convert gives them: one sweep for the memory's size and the parser's)
    counts = count_lines_and_entries(ours)
    assert counts == (ours.count(b"\n"), ours.count(b":")) and counts[1] == n
    assert_matches(parse_block(np.frombuffer(ours, dtype=np.uint8), buffers=bufs, counts=counts), ref)
    assert block.n_lines == len(lines)
    n_blank = sum(1 for line in lines if not line.strip())
    n_comment = sum(1 for line in lines if line.strip().startswith("#"))
    assert (block.n_blank, block.n_comment) == (n_blank, n_comment)
    assert block.n_rows + n_blank + n_comment == len(lines)
    expected_lines = [
        k + 1 for k, line in enumerate(lines) if line.strip() and not line.strip().startswith("#")
    ]
    assert block.row_lines.tolist() == expected_lines
    assert block.n_skipped == 0 and block.skipped_lines.size == 0
    if block.nnz:
        where = int(np.argmax(block.indices == block.max_index))
        row = int(np.searchsorted(block.indptr, where, side="right")) - 1
        assert block.max_index_line == block.row_lines[row]


@settings(max_examples=300, deadline=None)
@given(number)
def test_numbers_parse_like_python_float(token):
    block = parse_block(f"{token} 7:{token}\n".encode())
    assert block.error_code == 0
    assert bits(block.labels).tolist() == bits([float(token)]).tolist()
    assert bits(block.data).tolist() == bits([float(token)]).tolist()


def test_hard_floats_match_python_float():
    # halfway points between neighbouring doubles, printed with many digits, and 17-digit reprs
    rng = np.random.default_rng(1)
    tokens = []
    for b in rng.integers(1, 2**63 - 2**52 - 2, size=300):
        lo, hi = (struct.unpack("<d", struct.pack("<q", int(k)))[0] for k in (b, b + 1))
        with localcontext() as ctx:
            ctx.prec = 800  # enough digits for the exact midpoint of any two doubles
            middle = (Decimal(lo) + Decimal(hi)) / 2
        tokens += [
            repr(lo),
            f"{lo:.18e}",
            f"{hi:.19e}",
            f"{middle:.25e}",
            f"{middle:.40e}",
            str(middle),
        ]
    tokens += [
        "9007199254740993",
        "9007199254740995",
        "4503599627370496.5",
        "4503599627370497.5",
        "9007199254740992.5",
        "1" + "0" * 30,
        "0." + "0" * 330 + "1",
        "2.4703282292062328e-324",
        "2.4703282292062327e-324",
        "1" * 40 + "e-20",
    ]
    text = "".join(f"{t} 1:{t}\n" for t in tokens).encode()
    block = parse_block(text)
    expected = [float(t) for t in tokens]
    assert np.array_equal(bits(block.labels), bits(expected))
    assert np.array_equal(bits(block.data), bits(expected))


def test_larger_random_file_matches_sklearn():
    rng = np.random.default_rng(0)
    lines = []
    for r in range(4000):
        k = int(rng.integers(0, 40))
        idx = np.sort(rng.choice(200_000, size=k, replace=False))
        vals = rng.standard_normal(k) * 10.0 ** rng.integers(-5, 5, size=k)
        style = r % 4
        if style == 0:
            fmt = [repr(float(v)) for v in vals]
        elif style == 1:
            fmt = [f"{v:.4g}" for v in vals]
        elif style == 2:
            fmt = ["1"] * k
        else:
            fmt = [f"{v:.6e}" for v in vals]
        lines.append(
            " ".join(
                [str(int(rng.choice([-1, 1])))]
                + [f"{i}:{v}" for i, v in zip(idx, fmt, strict=True)]
            )
        )
        if r % 500 == 7:
            lines.append("# a comment line")
        if r % 700 == 3:
            lines.append("")
    text = "\n".join(lines).encode()
    block = parse_block(np.frombuffer(text, dtype=np.uint8))
    assert_matches(block, text)
    assert block.n_lines == len(lines)


def test_underscores_are_accepted_like_python():
    text = b"1_0 2_0:1_5 3_1:1.2_5e1_0\n"
    block = parse_block(text)
    assert_matches(block, text)
    assert block.indices.tolist() == [20, 31]


MUTATION_BYTES = b"0123456789 :.\n-+eE#\r\tnaif,q\x00\xef\xbb\xbf"
# what we reject on purpose although scikit-learn accepts it
STRICTER = {
    ErrorCode.NONFINITE_LABEL,
    ErrorCode.NONFINITE_VALUE,
    ErrorCode.QID,
    ErrorCode.NUL_BYTE,
    ErrorCode.BYTE_ORDER_MARK,
    ErrorCode.INDEX_TOO_LARGE,
}


@st.composite
def mutated_files(draw):
    text = bytearray(draw(files())[1])
    for _ in range(draw(st.integers(0, 3))):
        where = draw(st.integers(0, len(text)))
        byte = draw(st.sampled_from(MUTATION_BYTES))
        op = draw(st.integers(0, 2))
        if op == 0 and where < len(text):
            text[where] = byte
        elif op == 1:
            text[where:where] = bytes([byte])
        elif where < len(text):
            del text[where]
    return bytes(text)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_files())
def test_mutated_text_agrees_with_sklearn(text):
    ours = parse_block(text)
    skipped = parse_block(text, skip_errors=True)
    assert skipped.n_rows + skipped.n_blank + skipped.n_comment + skipped.n_skipped == ours.n_lines
    try:
        reference(text)
    except (ValueError, OverflowError):
        return  # sklearn rejects it; we may accept it (unsorted indices) or reject it
    if ours.error_code == 0:
        assert_matches(ours, text)
    else:
        assert ours.error_code in STRICTER, error_message(ours.error_code)


# ---------------------------------------------------------------- bookkeeping and sorting


def test_unsorted_row_is_sorted_with_values_along():
    block = parse_block(b"1 5:0.5 2:0.25 9:1.5 0:3\n")
    assert block.indices.tolist() == [0, 2, 5, 9]
    assert block.data.tolist() == [3.0, 0.25, 0.5, 1.5]
    # tokens finished by Python's float (underscores) follow the permutation too
    block = parse_block(b"1 5:1_5 2:0.25 9:3_0 1:2_0\n-1 3:1_0 1:7\n")
    assert block.indices.tolist() == [1, 2, 5, 9, 1, 3]
    assert block.data.tolist() == [20.0, 0.25, 15.0, 30.0, 7.0, 10.0]


def test_more_slow_tokens_than_the_kernels_table():
    """Thousands of tokens left to Python's float (underscores), in unsorted rows, with bad lines skipped: every
    value equals Python's float of its token, whatever the size of the table the kernel fills first."""
    rng = np.random.default_rng(5)
    lines, rows = [], []
    for r in range(600):
        if r % 97 == 5:
            lines.append("1 4:x")  # a bad line: skipped, and its tokens dropped
            continue
        idx = rng.choice(10**5, size=12, replace=False)
        toks = [f"{i}:{rng.integers(1, 10**6)}_{rng.integers(0, 10)}" for i in idx]
        lines.append(f"{r % 3}_0 " + " ".join(toks))
        order = np.argsort(idx)
        rows.append((float(f"{r % 3}_0"), idx[order], [float(toks[k].split(":")[1]) for k in order]))
    text = "\n".join(lines).encode()
    n = count_entries(text)
    for buffers in (None, (np.empty(n, np.int64), np.empty(n)), (np.empty(n - 1, np.int64), np.empty(n))):
        block = parse_block(text, skip_errors=True, buffers=buffers)  # (buffers one short: not used)
        assert block.n_skipped == sum(1 for r in range(600) if r % 97 == 5)
        assert block.labels.tolist() == [r[0] for r in rows]
        assert block.indices.tolist() == [int(i) for r in rows for i in r[1]]
        assert block.data.tolist() == [v for r in rows for v in r[2]]
        if buffers is not None:
            assert np.shares_memory(block.indices, buffers[0]) == (buffers[0].size == n)


def test_long_unsorted_rows_are_sorted():
    rng = np.random.default_rng(3)
    idx = rng.choice(10**6, size=1000, replace=False)
    vals = rng.standard_normal(1000)
    toks = [f"{i}:{v!r}" for i, v in zip(idx, vals.tolist(), strict=True)]
    toks[::7] = [f"{i}:{int(v * 1000)}_0" for i, v in zip(idx[::7], vals[::7], strict=True)]
    block = parse_block(("1 " + " ".join(toks) + "\n2 5:1\n").encode())
    order = np.argsort(idx)
    expected = np.array([float(t.split(":")[1]) for t in toks])[order]
    assert block.indices[:-1].tolist() == idx[order].tolist()
    assert np.array_equal(bits(block.data[:-1]), bits(expected))
    assert block.indptr.tolist() == [0, 1000, 1001]
    # a duplicate far apart in a long unsorted row: the offset of its second occurrence
    line = "1 " + " ".join(toks[:500] + [toks[3]] + toks[500:])
    block = parse_block(line.encode())
    assert block.error_code == ErrorCode.DUPLICATE_INDEX
    assert block.error_offset == len("1 " + " ".join(toks[:500]) + " ")


def test_bookkeeping():
    text = b"\n# comment\n1 3:1 # tail\r\n  \t\n-1\n2 0:2 7:1\n+1 7:1\n#end"
    block = parse_block(text)
    assert block.n_lines == 8
    assert (block.n_blank, block.n_comment, block.n_rows) == (2, 2, 4)
    assert block.row_lines.tolist() == [3, 5, 6, 7]
    assert block.indptr.tolist() == [0, 1, 1, 3, 4]
    assert (block.min_index, block.max_index, block.max_index_line) == (0, 7, 6)
    assert (block.error_code, block.error_line, block.error_offset) == (0, 0, -1)
    assert block.error_reason == "no error"


@pytest.mark.parametrize(
    "text, n_lines", [(b"", 0), (b"\n", 1), (b"1", 1), (b"1\n", 1), (b"1\n\n", 2), (b"1\r\n2", 2)]
)
def test_line_counts(text, n_lines):
    block = parse_block(text)
    assert block.n_lines == n_lines
    assert block.min_index == block.max_index == block.max_index_line == -1
    assert_matches(block, text)


def test_input_validation():
    with pytest.raises(ParameterError, match="'buf' parameter of parse_block"):
        parse_block(np.zeros(4, dtype=np.int32))
    with pytest.raises(ParameterError, match="'max_recorded' parameter"):
        parse_block(b"1\n", max_recorded=-1)
    with pytest.raises(ParameterError, match="'index_limit' parameter"):
        parse_block(b"1\n", index_limit=-5)
    strided = np.empty(8, np.int64)[::2]
    for bad in ((np.empty(4, np.int32), np.empty(4)), (np.empty(4, np.int64),), (strided, np.empty(4))):
        with pytest.raises(ParameterError, match="'buffers' parameter"):
            parse_block(b"1 2:3\n", buffers=bad)
    with pytest.raises(ParameterError, match="Unknown libsvm error code"):
        error_message(99)
    assert set(ERROR_MESSAGES) == set(ErrorCode)
    assert error_message(ErrorCode.QID) == "qid is not supported"


# ---------------------------------------------------------------- errors

E = ErrorCode
BAD_LINES = [
    # (bad line, code, offset of the offending token within the line, or None for "somewhere in it")
    ("abc 1:2", E.NON_NUMERIC_LABEL, 0),
    ("1x 1:2", E.NON_NUMERIC_LABEL, 0),
    ("- 1:2", E.NON_NUMERIC_LABEL, 0),
    ("1 1:abc", E.NON_NUMERIC_VALUE, 4),
    ("1 1:1x", E.NON_NUMERIC_VALUE, 4),
    ("1 1:1:2", E.NON_NUMERIC_VALUE, 4),
    ("1 2:1 1:1e", E.NON_NUMERIC_VALUE, 8),
    ("1 1:.", E.NON_NUMERIC_VALUE, 4),
    ("1 1:1__5", E.NON_NUMERIC_VALUE, 4),
    ("nan 1:2", E.NONFINITE_LABEL, 0),
    ("-inf 1:2", E.NONFINITE_LABEL, 0),
    ("Infinity 1:2", E.NONFINITE_LABEL, 0),
    ("1e999 1:2", E.NONFINITE_LABEL, 0),
    ("1 1:NaN", E.NONFINITE_VALUE, 4),
    ("1 1:inf", E.NONFINITE_VALUE, 4),
    ("1 1:-INFINITY", E.NONFINITE_VALUE, 4),
    ("1 1:2 3:-1e400", E.NONFINITE_VALUE, 8),
    ("1 1:" + "9" * 400, E.NONFINITE_VALUE, 4),
    ("1 -3:1", E.NEGATIVE_INDEX, 2),
    ("1 1.5:3", E.INDEX_NOT_INTEGER, 2),
    ("1 a:3", E.INDEX_NOT_INTEGER, 2),
    ("1 1e3:3", E.INDEX_NOT_INTEGER, 2),
    ("1 2__0:1", E.INDEX_NOT_INTEGER, 2),
    ("1 2147483648:1", E.INDEX_TOO_LARGE, 2),
    ("1 99999999999999999999999:1", E.INDEX_TOO_LARGE, 2),
    ("1 3:1 3:2", E.DUPLICATE_INDEX, 6),
    ("1 5:1 3:2 5:3", E.DUPLICATE_INDEX, 10),
    ("1 3:", E.TRUNCATED_PAIR, 2),
    ("1 3", E.TRUNCATED_PAIR, 2),
    ("1 :4", E.TRUNCATED_PAIR, 2),
    ("1 3: 4:1", E.TRUNCATED_PAIR, 2),
    ("1 3:#x", E.TRUNCATED_PAIR, 2),
    ("3:1 4:2", E.MISSING_LABEL, 0),
    ("\ufeff1 3:1", E.BYTE_ORDER_MARK, 0),
    ("1 3:1\ufeff", E.BYTE_ORDER_MARK, 5),
    ("1 3:1 # \ufeff", E.BYTE_ORDER_MARK, 8),
    ("1 3:1\x00", E.NUL_BYTE, 5),
    ("1\x00 3:1", E.NUL_BYTE, 1),
    ("1 3:1 # com\x00ment", E.NUL_BYTE, 11),
    ("# com\x00ment", E.NUL_BYTE, 5),
    ("1,2 3:1", E.MULTILABEL, 0),
    ("1 qid:3 3:1", E.QID, 2),
]
GOOD = ["1 1:0.5 4:2", "-1", "# comment", "", "+1 0:1e-3 2:7"]


@pytest.mark.parametrize("bad, code, offset", BAD_LINES, ids=[repr(b[0]) for b in BAD_LINES])
def test_one_bad_line(bad, code, offset):
    before, after = GOOD[:2], GOOD[2:] + ["2 3:4"]
    text = ("\n".join(before + [bad] + after) + "\n").encode()
    line_start = len("\n".join(before)) + 1
    line_end = line_start + len(bad.encode())

    block = parse_block(text)
    assert (block.error_code, block.error_line) == (code, 3), error_message(block.error_code)
    assert line_start <= block.error_offset < line_end
    assert block.error_offset == line_start + offset
    assert block.error_reason == ERROR_MESSAGES[code]
    assert_ok = parse_block(("\n".join(before) + "\n").encode())
    assert block.n_rows == 2 and np.array_equal(block.indptr, assert_ok.indptr)
    assert np.array_equal(block.labels, assert_ok.labels)
    assert block.n_lines == len(before) + 1 + len(after)

    skipped = parse_block(text, skip_errors=True)
    good_text = ("\n".join(before + after) + "\n").encode()
    assert skipped.error_code == 0
    assert_matches(skipped, good_text)
    assert skipped.n_skipped == 1
    assert skipped.skipped_lines.tolist() == [3]
    assert skipped.skipped_codes.tolist() == [code]
    assert skipped.skipped_offsets.tolist() == [block.error_offset]
    assert skipped.row_lines.tolist() == [1, 2, 6, 7]
    assert (skipped.n_blank, skipped.n_comment, skipped.n_lines) == (1, 1, 7)


def test_bom_at_buffer_start():
    block = parse_block(b"\xef\xbb\xbf1 3:1\n")
    assert (block.error_code, block.error_line, block.error_offset, block.n_rows) == (
        E.BYTE_ORDER_MARK,
        1,
        0,
        0,
    )


def test_index_limit_is_a_parameter():
    assert parse_block(b"1 2147483647:1\n").max_index == 2**31 - 1
    block = parse_block(b"1 10:1\n1 11:1\n", index_limit=10)
    assert (block.error_code, block.error_line, block.n_rows) == (E.INDEX_TOO_LARGE, 2, 1)
    assert parse_block(b"1 11:1\n", index_limit=2**40).max_index == 11


def test_first_error_wins_and_slow_tokens_count():
    # a non-finite value needing Python's float on line 2 comes before a syntax error on line 3
    text = b"1 1:1\n1 2:1e999\n1 x:1\n"
    block = parse_block(text)
    assert (block.error_code, block.error_line, block.error_offset) == (E.NONFINITE_VALUE, 2, 10)
    assert block.n_rows == 1 and block.n_lines == 3
    # ... and in the same line it is reported before a later syntax error and before a duplicate
    block = parse_block(b"1 1:1e999 2:x\n")
    assert (block.error_code, block.error_offset) == (E.NONFINITE_VALUE, 4)
    block = parse_block(b"1 1:2 1:1e999\n")
    assert (block.error_code, block.error_offset) == (E.NONFINITE_VALUE, 8)


def test_skip_many_records_the_first_ones():
    good = "1 1:2 5:1_0"  # the underscore takes the slow path
    lines = []
    bad_lines = []
    for k in range(30):
        if k % 3 == 1:
            lines.append("1 3:1e999" if k % 2 else "1 x:1")
            bad_lines.append(k + 1)
        else:
            lines.append(good)
    text = ("\n".join(lines)).encode()
    block = parse_block(text, skip_errors=True, max_recorded=4)
    assert block.n_skipped == 10
    assert block.skipped_lines.tolist() == bad_lines[:4]
    assert block.skipped_codes.tolist() == [
        E.NONFINITE_VALUE if (line - 1) % 2 else E.INDEX_NOT_INTEGER for line in bad_lines[:4]
    ]
    assert block.n_rows == 20
    assert block.data.tolist() == [2.0, 10.0] * 20
    assert block.row_lines.tolist() == [k + 1 for k in range(30) if k % 3 != 1]
    none = parse_block(text, skip_errors=True, max_recorded=0)
    assert none.n_skipped == 10 and none.skipped_lines.size == 0


# ------------------------------------------------------------------------------------------------ qid
QID_TEXT = b"1 qid:3 1:0.5 4:2\n-1 qid:3 2:1\n# a comment\n1 3:7\n0 qid:12\n"


def test_qid_fields_are_read_and_ignored_like_sklearn():
    """allow_qid=True: ``qid:N`` right after the label is skipped, and the rows equal scikit-learn's (which reads
    and drops them, ``query_id=False``); ``row_qid`` says which rows had one."""
    block = parse_block(QID_TEXT, allow_qid=True)
    assert_matches(block, QID_TEXT)
    assert block.row_qid.tolist() == [True, True, False, True]


@pytest.mark.parametrize("bad", ["1 qid: 3:1", "1 qid:x 3:1", "1 qid:1.5 3:1", "1 qid:3"])
def test_a_malformed_qid_is_an_error(bad):
    text = f"1 1:1\n{bad}\n".encode()
    block = parse_block(text, allow_qid=True)
    if bad == "1 qid:3":  # a row with a qid and no features is fine
        assert block.error_code == 0 and block.row_qid.tolist() == [False, True]
        return
    assert (block.error_code, block.error_line) == (ErrorCode.BAD_QID, 2)
    assert "qid" in error_message(ErrorCode.BAD_QID)
    assert parse_block(text).error_code == ErrorCode.QID  # the strict default names qid too
