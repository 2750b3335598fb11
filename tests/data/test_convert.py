"""libsvm ingest (``dufs.data.convert``): scikit-learn equality, errors naming ``file:line``, skip, kill and resume.

Every input is made here: random sparse matrices and the bundled ``basehock`` set written with scikit-learn's
``dump_svmlight_file``, plus hand-written text. scikit-learn's ``load_svmlight_file`` on the same text is the
reference; block sizes are kept small so that files are cut into many row and feature blocks.
"""

from __future__ import annotations

import bz2
import gzip
import io
import json
import lzma
import os
import random
import re
import signal
import subprocess
import sys
import time
import zlib
from pathlib import Path

import dask
import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.datasets import dump_svmlight_file, load_svmlight_file, load_svmlight_files

import dufs
from dufs.data.convert import convert_libsvm
from dufs.data.datasets import load
from dufs.errors import (
    IncompleteStoreError,
    InputFormatError,
    ParameterError,
    StoreError,
    StoreLockedError,
)
from dufs.testing import patience

SMALL = {"dufs.store.feature-granule": 16, "dufs.store.feature-block-nnz": 500}
PARTIAL = ".dufs-partial"


@pytest.fixture(autouse=True)
def small_blocks():
    with dask.config.set(SMALL):
        yield


# ---------------------------------------------------------------------------------------------------- helpers
def random_data(n: int, d: int, density: float, seed: int) -> tuple[sp.csr_array, np.ndarray]:
    """A random sparse matrix with values of every magnitude and sign, and labels (ints and halves)."""
    rng = np.random.default_rng(seed)
    X = sp.random_array((n, d), density=density, format="csr", rng=rng,
                        data_sampler=lambda size: rng.standard_normal(size) * 10.0 ** rng.integers(-9, 9, size))
    ints = rng.random(X.nnz) < 0.2
    X.data[ints] = rng.integers(1, 5, int(ints.sum()))
    y = rng.integers(-1, 3, n).astype(np.float64)
    y[rng.random(n) < 0.1] += 0.5
    return X, y


def svm_text(X, y, *, zero_based: bool = False) -> bytes:
    buf = io.BytesIO()
    dump_svmlight_file(X, y, buf, zero_based=zero_based)
    return buf.getvalue()


_OPENERS = {".bz2": bz2.open, ".gz": gzip.open, ".xz": lzma.open}


def write(path: Path, text: bytes) -> Path:
    with _OPENERS.get(path.suffix, open)(path, "wb") as f:
        f.write(text)
    return path


def sk_load(text: bytes, **kw):
    """scikit-learn's reading of the text (float64)."""
    X, y = load_svmlight_file(io.BytesIO(text), dtype=np.float64, **kw)
    return sp.csr_array(X), y


def lines_of(text: bytes) -> list[bytes]:
    return text.splitlines(keepends=True)


def _same_arrays(a, b, what: str) -> None:
    assert a.dtype == b.dtype, (what, a.dtype, b.dtype)
    np.testing.assert_array_equal(a, b, err_msg=what)


def assert_equals_sklearn(st: dufs.SparseStore, X, y) -> None:
    """Both orientations, labels and per-feature counts of the store are exactly scikit-learn's X and y."""
    X = sp.csr_array(X)
    assert X.has_sorted_indices
    assert st.shape == X.shape
    assert st.nnz == X.nnz
    A = st.to_scipy("csr")
    assert A.shape == X.shape
    np.testing.assert_array_equal(A.indptr, X.indptr)
    np.testing.assert_array_equal(A.indices, X.indices)
    _same_arrays(A.data.view(np.int64), X.data.view(np.int64), "csr data, bit for bit")
    Xc = X.tocsc()
    Xc.sort_indices()
    C = st.to_scipy("csc")
    assert C.shape == X.shape
    np.testing.assert_array_equal(C.indptr, Xc.indptr)
    np.testing.assert_array_equal(C.indices, Xc.indices)
    _same_arrays(C.data.view(np.int64), Xc.data.view(np.int64), "csc data, bit for bit")
    for o in ("csr", "csc"):  # every block's indices sorted (and unique) within its rows / features
        for i in range(st.n_blocks(o)):
            b = st.block(i, o)
            step = np.diff(b.indices.astype(np.int64))
            step[b.indptr[1:-1][(b.indptr[1:-1] > 0) & (b.indptr[1:-1] < b.nnz)] - 1] = 1  # row starts
            assert np.all(step > 0), f"{o} block {i}: indices not sorted within rows"
    _same_arrays(st.y, np.asarray(y, dtype=np.float64), "labels")
    np.testing.assert_array_equal(st.feature_nnz, np.diff(Xc.indptr))


def assert_no_output(out: Path) -> None:
    assert not out.exists(), f"{out} was left behind"
    assert not Path(str(out) + PARTIAL).exists(), f"{out}{PARTIAL} was left behind"


def convert(src, out, **kw):
    kw.setdefault("value_dtype", "float64")
    return convert_libsvm(src, out, **kw)


@pytest.fixture(scope="module")
def basehock_text() -> bytes:
    X, y = load("basehock")
    return svm_text(X, y)


# ---------------------------------------------------------------------------------------------------- equality
@pytest.mark.parametrize("suffix, parts", [(s, k) for s in ("", ".bz2") for k in (1, 2, 3, 6)]
                         + [(".gz", 3), (".xz", 2)])
def test_basehock_equals_sklearn_for_every_split(tmp_path, basehock_text, suffix, parts):
    src = write(tmp_path / f"basehock.svm{suffix}", basehock_text)
    bb = 10**9 if parts == 1 else len(basehock_text) // parts + 1
    with dask.config.set({"dufs.store.feature-block-nnz": 50000}):
        st, rep = convert(src, tmp_path / "out.zarr", block_bytes=bb)
    assert st.n_blocks("csr") == parts
    assert st.n_blocks("csc") > 1
    X, y = sk_load(basehock_text)
    assert_equals_sklearn(st, X, y)
    assert (rep.rows, rep.nnz, rep.lines, rep.n_features) == (1993, X.nnz, 1993, 4862)
    assert rep.zero_based is False and rep.skipped_lines == 0
    assert rep.bytes == len(basehock_text)
    assert st.provenance["inputs"] == [str(src)] and st.provenance["zero_based"] is False
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([src.name, "out.zarr"])  # no leftovers


# A small text with everything scikit-learn accepts: comments, blank lines, CRLF, tabs, explicit zeros, signs,
# exponents, a row with no features, and no newline at the end; its largest value is dufs's largest (MAX_ABS, 1e150:
# beyond it a value is refused, "beyond-max-abs" below; the parser's own tests cover float64's whole range).
AWKWARD = (b"# a comment line" + b"-" * 83 + b"\n"
           b"1 3:1 4:.5  # a trailing comment\r\n"
           b"\n"
           b"-1\t2:-0 5:+2e0 \t\r\n"
           b"   \n"
           b"+1.5 1:1e-3 7:123456789012345678901234567890\n"
           b"2 3:0\n"
           b"#\n"
           b"0\n"
           b"3 1:-1.0000000000000000e150 2:5e-324 6:0.1\r\n"
           b"-2 6:7 7:-7e-7 8:8 # 9:9\n"
           b"4 2:2")


@pytest.mark.parametrize("suffix, block_bytes", [("", 1), ("", 99), ("", 100), ("", 101), ("", 10**6),
                                                 (".bz2", 1), (".bz2", 100)])
def test_awkward_text_any_cut(tmp_path, suffix, block_bytes):
    # every line a block; the first cut on the first newline, just after it, just before it; no cut
    assert len(AWKWARD.split(b"\n")[0]) + 1 == 100
    src = write(tmp_path / f"a.svm{suffix}", AWKWARD)
    st, rep = convert(src, tmp_path / "out.zarr", block_bytes=block_bytes)
    X, y = sk_load(AWKWARD)
    assert_equals_sklearn(st, X, y)
    assert X.shape == (8, 8) and st.nnz == 14
    assert (rep.lines, rep.blank_lines, rep.comment_lines, rep.rows) == (12, 2, 2, 8)


def test_unsorted_indices_are_sorted(tmp_path):
    X, y = random_data(60, 30, 0.2, seed=3)
    text = svm_text(X, y)
    rng = np.random.default_rng(0)
    shuffled = []
    for ln in lines_of(text):
        label, *pairs = ln.split()
        rng.shuffle(pairs)
        shuffled.append(b" ".join([label, *pairs]) + b"\r\n")
    st, _ = convert(write(tmp_path / "u.svm", b"".join(shuffled)), tmp_path / "out.zarr", block_bytes=3000)
    assert st.n_blocks("csr") >= 3
    assert_equals_sklearn(st, *sk_load(text))


def _zero_based_text(seed: int, n: int = 90, d: int = 25, zero_in_rows: slice | None = None):
    """A zero-based text; column 0 has entries only in ``zero_in_rows`` (none: no index 0 at all)."""
    X, y = random_data(n, d, 0.15, seed)
    X = X.tolil()
    X[:, 0] = 0
    if zero_in_rows is not None:
        X[zero_in_rows, 0] = 3.25
    X = sp.csr_array(X)
    X.eliminate_zeros()
    return svm_text(X, y, zero_based=True), X, y


@pytest.mark.parametrize("file_base, zero_based", [
    ("zero", "auto"), ("zero", True), ("one", "auto"), ("one", False), ("one", True)])
@pytest.mark.parametrize("n_extra", [0, 7])
def test_index_base_and_n_features(tmp_path, file_base, zero_based, n_extra):
    X, y = random_data(90, 25, 0.15, seed=5)
    text = svm_text(X, y, zero_based=file_base == "zero")
    if file_base == "zero":
        assert b" 0:" in text  # "auto" must find the index 0 (it is in column 0 of some row)
    kw = {"zero_based": zero_based}
    Xs, ys = sk_load(text, **kw)
    if n_extra:
        kw["n_features"] = Xs.shape[1] + n_extra
        Xs, ys = sk_load(text, **kw)
    st, rep = convert(write(tmp_path / "b.svm", text), tmp_path / "out.zarr", block_bytes=len(text) // 3 + 1,
                      **kw)
    assert st.n_blocks("csr") >= 3
    assert_equals_sklearn(st, Xs, ys)
    assert rep.zero_based is (file_base == "zero" or zero_based is True)
    assert rep.n_features == Xs.shape[1]


@pytest.mark.parametrize("base", ["zero", "one"])
def test_several_inputs_appended(tmp_path, base):
    """A file cut by lines into parts (plain, .bz2, .gz, .xz) and given as several inputs equals the whole."""
    if base == "zero":  # the only index 0 is in the last part: the base is decided over all inputs
        text, _, _ = _zero_based_text(seed=7, n=200, zero_in_rows=slice(185, 190))
    else:
        X, y = random_data(200, 25, 0.15, seed=7)
        text = svm_text(X, y)
    lines = lines_of(text)
    cuts = [0, 37, 38, 120, 200]  # a part of a single line, too
    srcs = [write(tmp_path / f"part{k}.svm{suf}", b"".join(lines[a:b]))
            for k, (a, b, suf) in enumerate(zip(cuts[:-1], cuts[1:], ["", ".bz2", ".gz", ".xz"], strict=True))]
    st, rep = convert([str(s) for s in srcs], tmp_path / "out.zarr", block_bytes=len(text) // 4)
    assert st.n_blocks("csr") >= 6
    assert_equals_sklearn(st, *sk_load(text))
    assert rep.zero_based is (base == "zero") and rep.lines == 200
    assert st.provenance["inputs"] == [str(s) for s in srcs]


def test_several_inputs_to_several_outputs(tmp_path):
    """``output=[a, b, c]`` equals ``load_svmlight_files``: a shared index base and n_features."""
    text, _, _ = _zero_based_text(seed=11, n=240, zero_in_rows=slice(130, 132))
    lines = lines_of(text)
    parts = [b"".join(lines[:100]), b"".join(lines[100:150]), b"".join(lines[150:])]
    # the first part has a smaller largest index than the others: the stores still share n_features
    parts[0] = b"".join(re.sub(rb" (2[0-4]):\S+", b"", ln) for ln in lines_of(parts[0]))
    srcs = [write(tmp_path / name, p) for name, p in zip(["p0.svm", "p1.svm.bz2", "p2.svm"], parts, strict=True)]
    outs = [tmp_path / "o0.zarr", tmp_path / "o1.zarr", tmp_path / "o2.zarr"]
    stores, rep = convert(srcs, outs, block_bytes=len(text) // 4)
    assert isinstance(stores, list) and len(stores) == 3
    ref = load_svmlight_files([io.BytesIO(p) for p in parts], dtype=np.float64, zero_based="auto")
    assert ref[0].shape[1] == 25
    for k, st in enumerate(stores):
        assert st.path == str(outs[k])
        assert_equals_sklearn(st, ref[2 * k], ref[2 * k + 1])
    assert rep.zero_based is True and rep.n_features == 25
    # one-based everywhere: the shared base is one
    parts1 = [re.sub(rb" 0:\S+", b"", p) for p in parts]
    srcs = [write(tmp_path / f"q{k}.svm", p) for k, p in enumerate(parts1)]
    outs = [tmp_path / "r0.zarr", tmp_path / "r1.zarr", tmp_path / "r2.zarr"]
    stores, rep = convert(srcs, outs, block_bytes=len(text) // 4, n_features=30)
    ref = load_svmlight_files([io.BytesIO(p) for p in parts1], dtype=np.float64, n_features=30)
    for k, st in enumerate(stores):
        assert_equals_sklearn(st, ref[2 * k], ref[2 * k + 1])
    assert rep.zero_based is False


def test_parameters_are_checked(tmp_path):
    src = write(tmp_path / "a.svm", b"1 1:1\n")
    for kw in [{"zero_based": "yes"}, {"n_features": -1}, {"n_features": 2**31 + 1}, {"on_error": "warn"},
               {"block_bytes": -5}, {"value_dtype": "not a dtype"}]:
        with pytest.raises(ParameterError):
            convert_libsvm(src, tmp_path / "o.zarr", **kw)
    with pytest.raises(ParameterError, match="no such file"):
        convert_libsvm(tmp_path / "missing.svm", tmp_path / "o.zarr")
    with pytest.raises(ParameterError, match="2 inputs but 1 outputs"):
        convert_libsvm([src, src], [tmp_path / "o.zarr"])
    assert_no_output(tmp_path / "o.zarr")
    st, _ = convert_libsvm(src, tmp_path / "o.zarr")
    assert st.dtype == np.float32
    with pytest.raises(StoreError, match="exists"):
        convert_libsvm(src, tmp_path / "o.zarr")
    write(src, b"1 2:1\n")
    st, _ = convert_libsvm(src, tmp_path / "o.zarr", overwrite=True)
    assert st.shape == (1, 2)
    assert_no_output(tmp_path / "o.zarr.dufs-old")


def test_several_outputs_one_exists_leaves_nothing_new(tmp_path):
    a, b = write(tmp_path / "a.svm", b"1 1:1\n"), write(tmp_path / "b.svm", b"1 2:1\n")
    convert_libsvm(b, tmp_path / "ob.zarr")
    with pytest.raises(StoreError, match="exists"):
        convert_libsvm([a, b], [tmp_path / "oa.zarr", tmp_path / "ob.zarr"])
    assert_no_output(tmp_path / "oa.zarr")
    convert_libsvm([a, b], [tmp_path / "oa.zarr", tmp_path / "ob.zarr"], overwrite=True)


@pytest.mark.parametrize("suffix", ["", ".bz2"])
@pytest.mark.parametrize("text", [b"", b"# only a comment\n\n", b"\n\r\n  \n", b"# no newline at the end"])
@pytest.mark.parametrize("zero_based", ["auto", True, False])
def test_no_data_lines_is_an_error_naming_the_file(tmp_path, suffix, text, zero_based):
    """An empty file, or one of only comments and blank lines, is an InputFormatError naming the file (whatever
    the index base: no 0 x 0 store), and nothing is left behind."""
    src = write(tmp_path / f"empty.svm{suffix}", text)
    with pytest.raises(InputFormatError, match=f"^no data lines in {re.escape(str(src))}$") as e:
        convert(src, tmp_path / "out.zarr", zero_based=zero_based)
    assert e.value.path == str(src)
    assert_no_output(tmp_path / "out.zarr")
    with pytest.raises(InputFormatError, match="^no data lines in "):
        convert(src, tmp_path / "out.zarr", n_features=5)
    assert_no_output(tmp_path / "out.zarr")


def test_no_data_lines_when_every_line_is_skipped(tmp_path):
    src = write(tmp_path / "bad.svm", b"# c\nabc 1:1\n1 2:x\n")
    with pytest.raises(InputFormatError, match=f"^no data lines in {re.escape(str(src))} \\(2 bad lines skipped\\)$"):
        convert(src, tmp_path / "out.zarr", on_error="skip")
    assert_no_output(tmp_path / "out.zarr")


def test_no_data_lines_with_several_inputs(tmp_path):
    """Appended into one store, an empty input among others is fine; a store of its own would have no rows: an
    error naming it, and none of the stores is left."""
    text = b"1 1:2 3:4\n0 2:1\n"
    a, e = write(tmp_path / "a.svm", text), write(tmp_path / "e.svm.gz", b"# nothing here\n")
    st, rep = convert([e, a], tmp_path / "one.zarr")
    assert_equals_sklearn(st, *sk_load(text))
    assert rep.rows == 2 and rep.comment_lines == 1
    with pytest.raises(InputFormatError, match=f"^no data lines in {re.escape(str(e))}$"):
        convert([a, e], [tmp_path / "oa.zarr", tmp_path / "oe.zarr"])
    assert_no_output(tmp_path / "oa.zarr")
    assert_no_output(tmp_path / "oe.zarr")
    with pytest.raises(InputFormatError, match=f"^no data lines in {re.escape(str(e))}, {re.escape(str(e))}$"):
        convert([e, e], tmp_path / "ee.zarr")
    assert_no_output(tmp_path / "ee.zarr")


def test_no_data_lines_keeps_the_store_it_would_overwrite(tmp_path):
    src = write(tmp_path / "a.svm", b"1 1:2\n")
    convert(src, tmp_path / "out.zarr")
    write(src, b"")
    with pytest.raises(InputFormatError, match="no data lines"):
        convert(src, tmp_path / "out.zarr", overwrite=True)
    assert dufs.open(tmp_path / "out.zarr").shape == (1, 1)


def test_comment_line_and_two_data_lines_are_counted(tmp_path):
    src = write(tmp_path / "c.svm", b"# comment\n1 1:2 3:4\n0 2:1\n")
    st, rep = convert(src, tmp_path / "out.zarr")
    assert st.shape == (2, 3)
    assert (rep.rows, rep.lines, rep.comment_lines, rep.blank_lines, rep.skipped_lines) == (2, 3, 1, 0, 0)


@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_report_splits_the_time_by_phase(tmp_path, suffix):
    """Every phase of the parse tasks, the transpose and the driver is timed in the report (what `dufs bench ingest`
    prints); the tasks' phases are summed over the row and feature blocks."""
    X, y = random_data(300, 40, 0.2, seed=5)
    src = write(tmp_path / f"r.svm{suffix}", svm_text(X, y))
    t0 = time.perf_counter()
    st, rep = convert(src, tmp_path / "out.zarr", block_bytes=1500)
    wall = time.perf_counter() - t0
    assert st.n_blocks("csr") > 3 and st.n_blocks("csc") > 1
    assert set(rep.timings) == {"read", "parse", "write rows", "spill", "transpose read", "transpose merge",
                                "transpose write", "driver: units", "finalize: plan", "finalize: labels",
                                "finalize: feature nnz", "finalize: close"}
    assert all(v >= 0 for v in rep.timings.values())
    driver = sum(v for k, v in rep.timings.items() if k.startswith(("driver", "finalize")))
    assert 0 < driver < wall


@pytest.mark.parametrize("zero_based", ["auto", True, False])
def test_lines_of_labels_only(tmp_path, zero_based):
    """Data lines with a label and no feature are rows with no nonzeros (the index base does not matter)."""
    src = write(tmp_path / "labels.svm", b"1\n# c\n0\n")
    st, rep = convert(src, tmp_path / "out.zarr", zero_based=zero_based)
    assert st.shape == (2, 0) and st.nnz == 0
    np.testing.assert_array_equal(st.y, [1.0, 0.0])
    assert rep.rows == 2 and rep.comment_lines == 1


# ---------------------------------------------------------------------------------------------------- errors
N_LINES, BAD_LINE, D = 300, 137, 40


def _base_text(zero_at: int | None = None) -> bytes:
    """300 one-based lines, largest index 40 (and an index 0 on line ``zero_at``, when given)."""
    X, y = random_data(N_LINES, D, 0.15, seed=1)
    X = X.tolil()
    X[:, D - 1] = 0
    X[[5, 250], D - 1] = 1.5  # index 40 on lines 6 and 251 only
    text = svm_text(sp.csr_array(X), y)
    if zero_at is not None:
        lines = lines_of(text)
        lines[zero_at - 1] = b"2 0:1 3:1\n"
        text = b"".join(lines)
    return text


def with_line(text: bytes, line: int, bad: bytes) -> bytes:
    lines = lines_of(text)
    lines[line - 1] = bad + b"\n"
    return b"".join(lines)


def line_span(text: bytes, line: int) -> tuple[int, int]:
    lines = lines_of(text)
    start = sum(len(x) for x in lines[:line - 1])
    return start, start + len(lines[line - 1])


# (id, bad line, options, reason)
BAD = [
    ("value-not-a-number", b"1 3:1 7:abc 9:1", {}, "a feature value is not a number"),
    ("label-not-a-number", b"abc 3:1", {}, "the label is not a number"),
    ("value-nan", b"1 3:nan 7:1", {}, "a feature value is nan or infinite"),
    ("value-inf", b"1 3:1 7:-inf", {}, "a feature value is nan or infinite"),
    ("label-nan", b"NaN 3:1", {}, "the label is nan or infinite"),
    ("label-inf", b"+Infinity 3:1", {}, "the label is nan or infinite"),
    ("index-0-one-based", b"1 0:1 3:1", {"zero_based": False}, "feature index 0 in one-based data"),
    ("negative-index", b"1 -3:1", {}, "a feature index is negative"),
    ("index-beyond-int32", b"1 3:1 2147483648:1", {}, "a feature index exceeds the index limit"),
    ("beyond-n_features-one", b"1 3:1 41:1", {"zero_based": False, "n_features": 40},
     "feature index beyond n_features=40"),
    ("beyond-n_features-zero", b"1 3:1 41:1", {"zero_based": True, "n_features": 41},
     "feature index beyond n_features=41"),
    ("beyond-n_features-auto", b"1 3:1 41:1", {"n_features": 40},
     r"feature index 41 is beyond n_features=40 \(one-based\)"),
    ("beyond-n_features-auto-zero", b"1 3:1 41:1", {"n_features": 41, "zero_at": 20},
     r"feature index 41 is beyond n_features=41 \(zero-based\)"),
    ("duplicate-index", b"1 3:1 7:1 3:2", {}, "a feature index appears twice in the line"),
    ("cut-after-colon", b"1 3:1 7:", {}, r"an index:value pair is cut off"),
    ("cut-before-colon", b"1 3:1 7", {}, r"an index:value pair is cut off"),
    ("missing-label", b"3:1 7:2", {}, "the line has no label"),
    ("byte-order-mark", b"\xef\xbb\xbf1 3:1", {}, "a byte-order mark"),
    ("nul-byte", b"1 3:1\x00 7:1", {}, "a NUL byte in the line"),
    ("beyond-float32", b"1 3:1e39", {"value_dtype": None}, "value out of range for float32"),
    ("beyond-max-abs", b"1 3:1 7:-2e150", {}, r"value beyond 1e\+150 in magnitude \(its square, and the "
     r"feature's variance and every distance it enters, overflow float64: scale the data down\)"),
]


# compressed input numbers lines another way (from the stream, not from byte offsets): a few of every path
BZ2 = {"value-not-a-number", "label-nan", "index-0-one-based", "beyond-n_features-zero", "beyond-n_features-auto",
       "beyond-n_features-auto-zero", "duplicate-index", "byte-order-mark", "nul-byte", "beyond-float32",
       "beyond-max-abs"}


@pytest.mark.parametrize("suffix, bad, opts, reason",
                         [("", *b[1:]) for b in BAD] + [(".bz2", *b[1:]) for b in BAD if b[0] in BZ2],
                         ids=[b[0] for b in BAD] + [b[0] + "-bz2" for b in BAD if b[0] in BZ2])
def test_bad_line_is_named(tmp_path, suffix, bad, opts, reason):
    opts = dict(opts)
    text = with_line(_base_text(opts.pop("zero_at", None)), BAD_LINE, bad)
    src = write(tmp_path / f"in.svm{suffix}", text)
    out = tmp_path / "out.zarr"
    opts.setdefault("value_dtype", "float64")
    with pytest.raises(InputFormatError, match=rf"^{re.escape(str(src))}:{BAD_LINE}: {reason}") as ei:
        convert_libsvm(src, out, block_bytes=len(text) // 4, **opts)
    e = ei.value
    assert (e.path, e.line) == (str(src), BAD_LINE)
    if e.offset is not None:  # a byte offset (in the decompressed text) inside the bad line
        a, b = line_span(text, BAD_LINE)
        assert a <= e.offset < b
        assert f"(byte offset {e.offset})" in str(e)
    assert_no_output(out)
    assert [p.name for p in tmp_path.iterdir()] == [src.name]


def test_first_bad_line_of_several(tmp_path):
    """With bad lines in several blocks (and of several kinds in one block), the first one is named."""
    text = _base_text()
    for line, bad in [(290, b"x 1:1"), (200, b"1 0:1"), (150, b"1 1:1 1:1"), (120, b"1 0:2"), (121, b"1 2:z")]:
        text = with_line(text, line, bad)
    src = write(tmp_path / "in.svm", text)
    for _ in range(3):
        with pytest.raises(InputFormatError, match=r"in\.svm:120: feature index 0 in one-based"):
            convert_libsvm(src, tmp_path / "out.zarr", zero_based=False, block_bytes=len(text) // 6)
        assert_no_output(tmp_path / "out.zarr")


def test_bad_line_in_a_later_input(tmp_path):
    text = _base_text()
    lines = lines_of(text)
    a = write(tmp_path / "first.svm", b"".join(lines[:100]))
    b = write(tmp_path / "second.svm.bz2", with_line(b"".join(lines[100:]), 37, b"1 3:x"))
    c = write(tmp_path / "third.svm", with_line(b"".join(lines[100:]), 12, b"1 3:x"))
    for outs in [tmp_path / "out.zarr", [tmp_path / "o1.zarr", tmp_path / "o2.zarr", tmp_path / "o3.zarr"]]:
        with pytest.raises(InputFormatError, match=rf"^{re.escape(str(b))}:37: a feature value is not"):
            convert_libsvm([a, b, c], outs, block_bytes=len(text) // 4)
        for o in outs if isinstance(outs, list) else [outs]:
            assert_no_output(o)
    # beyond n_features in a later input, the base known only at the end ("auto")
    d = write(tmp_path / "fourth.svm", with_line(b"".join(lines[100:]), 55, b"1 3:1 41:1"))
    with pytest.raises(InputFormatError, match=rf"^{re.escape(str(d))}:55: feature index 41 is beyond"):
        convert_libsvm([a, d], tmp_path / "out.zarr", block_bytes=len(text) // 4, n_features=40)
    assert_no_output(tmp_path / "out.zarr")


SKIP_AT = {3: b"1 3:abc", 40: b"nan 3:1", 41: b"\xef\xbb\xbf1 3:1", 90: b"1 2:1 2:1", 137: b"1 0:1 5:1",
           150: b"1 3:1\x00", 151: b"3:1", 200: b"1 -4:1", 230: b"1 3:1 7:", 260: b"1 41:1", 290: b"1 3:inf",
           300: b"x"}


@pytest.mark.parametrize("suffix", ["", ".bz2"])
def test_skip_bad_lines(tmp_path, suffix):
    good = _base_text()
    text = good
    for line, bad in SKIP_AT.items():
        text = with_line(text, line, bad)
    src = write(tmp_path / f"in.svm{suffix}", text)
    st, rep = convert(src, tmp_path / "out.zarr", on_error="skip", zero_based=False, n_features=D,
                      block_bytes=len(text) // 6)
    assert rep.skipped_lines == len(SKIP_AT) == 12
    first = sorted(SKIP_AT)[:10]
    assert [(f, line) for f, line, _, _ in rep.skipped] == [(str(src), line) for line in first]
    for _, line, offset, why in rep.skipped:
        a, b = line_span(text, line)
        assert a <= offset < b, (line, offset, a, b)
        assert isinstance(why, str) and why
    assert rep.lines == N_LINES and rep.rows == N_LINES - 12
    kept = b"".join(ln for k, ln in enumerate(lines_of(text), 1) if k not in SKIP_AT)
    assert_equals_sklearn(st, *sk_load(kept, zero_based=False, n_features=D))
    assert st.provenance["skipped_lines"] == 12
    assert [s[1] for s in st.provenance["skipped"]] == first


# ---------------------------------------------------------------------------------------------------- kill, resume
KILL = {"dufs.store.feature-granule": 16, "dufs.store.feature-block-nnz": 1000}
ENV = {**os.environ, "DASK_DUFS__STORE__FEATURE_GRANULE": "16", "DASK_DUFS__STORE__FEATURE_BLOCK_NNZ": "1000"}
KILL_BB = 8300


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "dufs.cli", "convert", *args, "--workers", "0", "--dtype", "float64",
            "--block-bytes", str(KILL_BB)]


def _complete(partial: Path, side: str) -> int:
    """How many blocks of ``side`` (csr or csc) the partial store has marked complete."""
    n = 0
    d = partial / side
    if not d.is_dir():
        return 0
    for sub in list(d.iterdir()):
        try:
            n += bool(json.loads((sub / "zarr.json").read_text())["attributes"].get("complete"))
        except (OSError, ValueError, KeyError):
            pass
    return n


def _run_until(cmd: list[str], partial: Path, side: str, k: int,
              timeout: float = patience(120)) -> subprocess.Popen:
    """Start ``cmd``; return once ``k`` blocks of ``side`` are complete (the process still running)."""
    proc = subprocess.Popen(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    t0 = time.monotonic()
    while _complete(partial, side) < k:
        if proc.poll() is not None:
            _, err = proc.communicate()
            pytest.fail(f"the conversion ended (rc {proc.returncode}) before {k} {side} blocks were done: "
                        f"{err.decode()[-2000:]}")
        if time.monotonic() - t0 > timeout:
            proc.kill()
            pytest.fail("timed out")
        time.sleep(0.005)
    return proc


def _kill(proc: subprocess.Popen, *, may_be_done: bool = False) -> None:
    proc.send_signal(signal.SIGKILL)
    _, err = proc.communicate()
    assert proc.returncode == -signal.SIGKILL or (may_be_done and proc.returncode == 0), err.decode()[-2000:]


def _nodes(path: Path) -> dict[str, dict]:
    """Every node (group, array) of the store with its metadata and attributes, less the creation time."""
    out = {}
    for f in sorted(path.rglob("zarr.json")):
        meta = json.loads(f.read_text())
        attrs = meta.get("attributes", {})
        if "dufs" in attrs:
            attrs = {**attrs, "dufs": {k: v for k, v in attrs["dufs"].items() if k != "created"}}
        out[str(f.parent.relative_to(path))] = {**meta, "attributes": attrs}
    return out


def assert_identical_stores(a: dufs.SparseStore, b: dufs.SparseStore) -> None:
    assert {k: v for k, v in a.attrs.items() if k != "created"} == \
        {k: v for k, v in b.attrs.items() if k != "created"}
    assert _nodes(Path(a.path)) == _nodes(Path(b.path))  # no leftovers (spill, raw indices, lock) either
    assert sorted(p.name for p in Path(a.path).iterdir()) == sorted(p.name for p in Path(b.path).iterdir())
    for o in ("csr", "csc"):
        assert a.n_blocks(o) == b.n_blocks(o)
        for i in range(a.n_blocks(o)):
            x, y = a.block(i, o), b.block(i, o)
            for name in ("indptr", "indices", "data"):
                _same_arrays(getattr(x, name), getattr(y, name), f"{o} block {i} {name}")
    _same_arrays(a.y, b.y, "y")
    _same_arrays(a.feature_nnz, b.feature_nnz, "feature_nnz")


@pytest.fixture(scope="module")
def kill_data(tmp_path_factory):
    """A 100-block file (and an 8-block .bz2), and the store of a one-shot conversion of each. Enough blocks that a
    conversion seen k blocks in (k at most half) is still running when the kill lands: a 20-block one has finished
    in between."""
    d = tmp_path_factory.mktemp("kill")
    X, y = random_data(4000, 600, 10 / 600, seed=21)
    text = svm_text(X, y)
    src = write(d / "big.svm", text)
    srcz = write(d / "big.svm.bz2", b"".join(lines_of(text)[:320]))
    with dask.config.set(KILL):
        ref, _ = convert_libsvm(src, d / "ref.zarr", value_dtype="float64", block_bytes=KILL_BB)
        refz, _ = convert_libsvm(srcz, d / "refz.zarr", value_dtype="float64", block_bytes=KILL_BB)
    assert 75 <= ref.n_blocks("csr") <= 125 and ref.n_blocks("csc") >= 6
    assert 6 <= refz.n_blocks("csr") and refz.n_blocks("csc") >= 3
    assert_equals_sklearn(ref, *sk_load(text))
    return src, srcz, ref, refz


@pytest.mark.slow
def test_second_converter_is_refused_and_a_killed_one_points_to_resume(tmp_path, kill_data):
    """While a conversion runs, another one into the same output is refused; killed, it leaves a resumable
    partial store that ``dufs.open`` and a plain rerun point to ``--resume`` for."""
    from typer.testing import CliRunner

    from dufs.cli import app

    src, _, ref, _ = kill_data
    out = tmp_path / "out.zarr"
    partial = Path(str(out) + PARTIAL)
    proc = _run_until(_cli(str(src), str(out)), partial, "csr", random.randint(1, ref.n_blocks("csr") // 2))
    try:
        with dask.config.set(KILL):
            for resume in (False, True):
                with pytest.raises(StoreLockedError, match="being written by another process"):
                    convert(src, out, block_bytes=KILL_BB, resume=resume)
        for extra in ([], ["--resume"]):
            res = CliRunner().invoke(app, ["convert", str(src), str(out), "--workers", "0", *extra])
            assert res.exit_code == 2, res.output
            assert "being written by another process" in res.stderr
            assert f"pid {proc.pid}" in res.stderr
    finally:
        _kill(proc)
    assert partial.exists() and not out.exists()
    with pytest.raises(IncompleteStoreError, match=rf"dufs convert <inputs> {re.escape(str(out))} --resume"):
        dufs.open(out)
    with dask.config.set(KILL):
        with pytest.raises(StoreError, match="finish it with --resume"):  # refused, the partial kept
            convert(src, out, block_bytes=KILL_BB)
        assert partial.exists()
        with pytest.raises(StoreError, match="other options"):  # a resume must ask for the same
            convert(src, out, block_bytes=KILL_BB + 1, resume=True)
        with pytest.raises(StoreError, match="other options"):
            convert(src, out, block_bytes=KILL_BB, resume=True, value_dtype="float32")
    assert partial.exists() and not (partial / "dufs.lock").exists()


@pytest.mark.slow
def test_kill_and_resume(tmp_path, kill_data):
    """SIGKILL while parsing, resume, SIGKILL during the transpose, resume: the store of a one-shot run."""
    src, _, ref, _ = kill_data
    rnd = random.Random()
    seed = rnd.randrange(2**32)
    rnd.seed(seed)
    print("kill points from seed", seed)
    out = tmp_path / "out.zarr"
    partial = Path(str(out) + PARTIAL)
    n_row, n_col = ref.n_blocks("csr"), ref.n_blocks("csc")

    # 1. killed while parsing (in the first half: blocks complete in bursts, and a kill point 3 blocks from the end
    # once came after the last one, seed 1580551359)
    _kill(_run_until(_cli(str(src), str(out)), partial, "csr", rnd.randint(2, n_row // 2)))
    assert 0 < _complete(partial, "csr") < n_row

    # 2. resumed, killed again during the transpose
    _kill(_run_until(_cli(str(src), str(out), "--resume"), partial, "csc", rnd.randint(1, max(1, n_col // 2))))
    assert partial.exists() and not out.exists()
    with pytest.raises(IncompleteStoreError, match=r"--resume"):
        dufs.open(out)

    # 3. resumed to the end: the same store as one conversion in one go
    with dask.config.set(KILL):
        st, rep = convert(src, out, block_bytes=KILL_BB, resume=True)
    assert not partial.exists()
    assert (rep.rows, rep.lines, rep.nnz) == (ref.shape[0], ref.shape[0], ref.nnz)
    assert_identical_stores(st, ref)


@pytest.mark.slow
def test_kill_compressed_at_random_time_and_resume(tmp_path, kill_data):
    _, srcz, _, refz = kill_data
    out = tmp_path / "out.zarr"
    partial = Path(str(out) + PARTIAL)
    proc = _run_until(_cli(str(srcz), str(out)), partial, "csr", 1)
    time.sleep(random.uniform(0.0, 0.3))
    _kill(proc, may_be_done=True)
    if not out.exists():
        assert partial.exists()
        res = subprocess.run(_cli(str(srcz), str(out), "--resume"), env=ENV, capture_output=True, timeout=patience(120))
        assert res.returncode == 0, res.stderr.decode()
        assert res.stdout.decode().strip() == str(out)
    assert not partial.exists()
    assert_identical_stores(dufs.open(out), refz)


# ---------------------------------------------------------------------------------------------------- broken streams
@pytest.fixture
def no_hang():
    """Fail (instead of hanging the run) a test that takes more than a minute (scaled by DUFS_TEST_PATIENCE, as
    every wait of the suite: on an oversubscribed machine a small conversion has taken over a minute)."""
    def on_alarm(signum, frame):
        raise TimeoutError("the conversion hung")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(int(patience(60)))
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


_DECOMPRESSORS = {".gz": lambda: zlib.decompressobj(31), ".bz2": bz2.BZ2Decompressor, ".xz": lzma.LZMADecompressor}


def _recoverable(cut: bytes, suffix: str) -> bytes:
    """All the data a one-shot decompressor gets out of a cut-off compressed stream (the reference)."""
    return _DECOMPRESSORS[suffix]().decompress(cut)


@pytest.mark.parametrize("suffix", [".gz", ".bz2", ".xz"])
@pytest.mark.parametrize("keep", [0.1, 0.6, 0.97])
def test_truncated_compressed_input_is_one_error_naming_the_file(tmp_path, no_hang, suffix, keep):
    """A compressed file cut short is an InputFormatError naming the file, how many bytes of data it gave and the
    line it ended in (not the decompressor's EOFError); blocks parsed before are thrown away with the partial store,
    and a store it was to replace is kept as it was."""
    X, y = random_data(3000, 200, 0.03, seed=31)
    text = svm_text(X, y)
    whole = tmp_path / f"in.svm{suffix}"
    if suffix == ".bz2":  # blocks of 100 kB (not 900): a cut file still has whole blocks to give
        whole.write_bytes(bz2.compress(text, 1))
    else:
        write(whole, text)
    comp = whole.read_bytes()
    cut = comp[: int(len(comp) * keep)]
    got = _recoverable(cut, suffix)
    assert text.startswith(got) and len(got) < len(text)
    old = tmp_path / "out.zarr"
    prev, _ = convert(write(tmp_path / "prev.svm", b"1 1:1\n2 2:2\n"), old)
    src = tmp_path / f"cut.svm{suffix}"
    src.write_bytes(cut)
    block_bytes = len(text) // 8  # blocks are parsed and written before the stream ends
    for overwrite, out in [(False, tmp_path / "new.zarr"), (True, old)]:
        with pytest.raises(InputFormatError) as ei:
            convert(src, out, overwrite=overwrite, block_bytes=block_bytes)
        e = ei.value
        msg = str(e)
        assert "\n" not in msg
        assert re.fullmatch(rf"{re.escape(str(src))}: compressed stream ends early \(truncated file\?\) after "
                            rf"[0-9,]+ bytes of data, line \d+; .*", msg), msg
        line = got.count(b"\n") + 1
        assert (e.path, e.offset, e.line) == (str(src), len(got), line)
        assert f"after {len(got):,} bytes of data, line {line};" in msg
    assert_no_output(tmp_path / "new.zarr")
    assert not Path(str(old) + PARTIAL).exists()
    assert_equals_sklearn(dufs.open(old), *sk_load(b"1 1:1\n2 2:2\n"))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([whole.name, src.name, "prev.svm", "out.zarr"])
    # the repaired file converts (nothing of the failed build was in the way)
    st, _ = convert(whole, tmp_path / "new.zarr", block_bytes=block_bytes)
    assert_equals_sklearn(st, *sk_load(text))


@pytest.mark.parametrize("suffix", [".gz", ".xz"])
@pytest.mark.parametrize("bad_line", [20, 185])  # in an early block; in the last whole block before the cut
def test_a_bad_line_before_the_truncation_is_the_error(tmp_path, no_hang, suffix, bad_line):
    """The first error by position wins: a bad line in a block parsed before the stream was found cut short (still
    in flight when it was, or collected before)."""
    text = with_line(_base_text(), bad_line, b"1 3:abc")
    comp = write(tmp_path / f"in.svm{suffix}", text).read_bytes()
    src = tmp_path / f"cut.svm{suffix}"
    src.write_bytes(comp[: len(comp) * 3 // 4])
    assert _recoverable(src.read_bytes(), suffix).count(b"\n") > bad_line + 10
    with pytest.raises(InputFormatError, match=rf"^{re.escape(str(src))}:{bad_line}: a feature value is not a nu"):
        convert(src, tmp_path / "out.zarr", block_bytes=len(text) // 10)
    assert_no_output(tmp_path / "out.zarr")


@pytest.mark.parametrize("suffix", [".gz", ".bz2", ".xz"])
def test_corrupt_compressed_input_is_one_error_naming_the_file(tmp_path, no_hang, suffix):
    X, y = random_data(2000, 100, 0.05, seed=32)
    raw = bytearray(write(tmp_path / f"x.svm{suffix}", svm_text(X, y)).read_bytes())
    # garble the stream's own checksum, so that the data are right and only the decompressor can tell (garbled
    # data would decompress to garbage text, which may fail to parse before the stream's check fails): the CRC-32 in
    # gzip's trailer, bz2's combined CRC in its last bytes, xz's footer CRC
    raw[len(raw) + {".gz": -8, ".bz2": -2, ".xz": -12}[suffix]] ^= 0x5A
    src = tmp_path / f"bad.svm{suffix}"
    src.write_bytes(bytes(raw))
    with pytest.raises(InputFormatError) as ei:
        convert(src, tmp_path / "out.zarr", block_bytes=20000)
    msg = str(ei.value)
    assert "\n" not in msg and ei.value.path == str(src)
    assert re.match(rf"{re.escape(str(src))}: compressed data is corrupt after [0-9,]+ bytes of data, line \d+ "
                    rf"\(.+\); download or copy the file again$", msg), msg
    assert_no_output(tmp_path / "out.zarr")


def test_a_plain_file_named_gz_is_one_error(tmp_path, no_hang):
    src = tmp_path / "text.svm.gz"
    src.write_bytes(b"1 1:1\n2 2:2\n")
    with pytest.raises(InputFormatError, match=rf"^{re.escape(str(src))}: compressed data is corrupt after 0 bytes "
                                               rf"of data, line 1 \(Not a gzipped file"):
        convert(src, tmp_path / "out.zarr")
    assert_no_output(tmp_path / "out.zarr")


@pytest.mark.slow
def test_truncated_input_in_the_cli_is_one_line(tmp_path):
    """``dufs convert`` prints the one-line error (not ``Aborted.``), exits 2 and leaves no partial store."""
    X, y = random_data(3000, 200, 0.03, seed=33)
    comp = write(tmp_path / "in.svm.bz2", svm_text(X, y)).read_bytes()
    src = tmp_path / "cut.svm.bz2"
    src.write_bytes(comp[: len(comp) // 2])
    res = subprocess.run([sys.executable, "-m", "dufs.cli", "convert", str(src), str(tmp_path / "out.zarr"),
                          "--workers", "0", "--block-bytes", "20000"], capture_output=True, timeout=patience(120))
    err = res.stderr.decode()
    assert res.returncode == 2, err
    assert f"{src}: compressed stream ends early (truncated file?) after " in " ".join(err.split())
    assert "Traceback" not in err and "Aborted" not in err
    assert_no_output(tmp_path / "out.zarr")


# ---------------------------------------------------------------------------------------------------- qid
def _qid_text(seed: int, n: int = 400, with_qid: float = 0.7) -> tuple[bytes, int]:
    """libsvm text (scikit-learn's dump) where a fraction of the lines carry ``qid:N``; and how many do."""
    X, y = random_data(n, 60, 0.1, seed)
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    dump_svmlight_file(X, y, buf, query_id=rng.integers(-3, 10**12, n))
    lines = lines_of(buf.getvalue())
    keep = rng.random(n) < with_qid
    out = [ln if k else re.sub(rb" qid:\S+", b"", ln) for ln, k in zip(lines, keep, strict=True)]
    assert sum(b" qid:" in ln for ln in out) == int(keep.sum()) > 0
    return b"".join(out), int(keep.sum())


@pytest.mark.parametrize("suffix, parts", [("", 1), ("", 7), (".bz2", 1), (".bz2", 5), (".gz", 3)])
def test_qid_fields_are_read_and_ignored_as_sklearn(tmp_path, suffix, parts):
    """Lines with ``qid:N`` convert to exactly scikit-learn's X and y (which ignores the qid unless asked for it),
    whole or cut into byte ranges / blocks of lines parsed in parallel; the lines with one are counted in the report
    and the provenance."""
    text, n_qid = _qid_text(seed=40 + parts)
    src = write(tmp_path / f"q.svm{suffix}", text)
    st, rep = convert(src, tmp_path / "out.zarr", block_bytes=10**9 if parts == 1 else len(text) // parts + 1)
    assert st.n_blocks("csr") == parts
    assert_equals_sklearn(st, *sk_load(text))
    assert (rep.qid_lines, rep.rows) == (n_qid, 400)
    assert st.provenance["qid_lines"] == n_qid


def test_qid_with_comments_and_rows_without_features(tmp_path):
    text = (b"# queries\n"
            b"1 qid:1 3:1 7:2.5 # a comment\n"
            b"-1 qid:+2\n"
            b"2 qid:-3\t1:4\n"
            b"0 4:1\n"
            b"1 qid:0 # only a qid\n")
    st, rep = convert(write(tmp_path / "q.svm", text), tmp_path / "out.zarr")
    assert_equals_sklearn(st, *sk_load(text))
    assert (rep.rows, rep.qid_lines, rep.comment_lines) == (5, 4, 1)


@pytest.mark.parametrize("bad", [b"1 qid:abc 3:1", b"1 qid: 3:1", b"1 qid 3:1", b"1 qid:1.5 3:1", b"1 qidx:3 3:1"])
def test_a_malformed_qid_is_a_bad_line(tmp_path, bad):
    text = with_line(_base_text(), BAD_LINE, bad)
    src = write(tmp_path / "in.svm", text)
    with pytest.raises(InputFormatError, match=rf"^{re.escape(str(src))}:{BAD_LINE}: the qid field is not "
                                               rf"'qid:<integer>' \(byte offset \d+\)$") as ei:
        convert(src, tmp_path / "out.zarr", block_bytes=len(text) // 4)
    a, b = line_span(text, BAD_LINE)
    assert ei.value.offset == a + 2  # the qid token
    assert_no_output(tmp_path / "out.zarr")


def test_qid_lines_skipped_for_other_reasons_are_not_counted(tmp_path):
    text = b"1 qid:1 3:1\n2 qid:2 3:nan\n3 qid:x 1:1\n4 qid:4 2:1 2:2\n5 qid:5 1:1e39\n6 2:1\n"
    st, rep = convert(write(tmp_path / "q.svm", text), tmp_path / "out.zarr", on_error="skip", value_dtype=None)
    assert (rep.rows, rep.skipped_lines, rep.qid_lines) == (2, 4, 1)
    X, y = sk_load(b"1 qid:1 3:1\n6 2:1\n")
    np.testing.assert_array_equal(st.to_scipy("csr").toarray(), X.toarray())
    np.testing.assert_array_equal(st.y, y)
    assert st.provenance["qid_lines"] == 1


@pytest.mark.slow
def test_qid_on_a_process_cluster(tmp_path, cluster_client):
    text, n_qid = _qid_text(seed=50, n=600)
    src = write(tmp_path / "q.svm", text)
    st, rep = convert(src, tmp_path / "out.zarr", block_bytes=len(text) // 6 + 1, client=cluster_client)
    assert st.n_blocks("csr") == 6
    assert_equals_sklearn(st, *sk_load(text))
    assert rep.qid_lines == n_qid == st.provenance["qid_lines"]


@pytest.mark.slow
def test_many_blocks_a_worker_reuse_scratch_memory_and_leave_none(tmp_path, cluster_client):
    """Blocks of several sizes, many a worker (each task's arrays in memory an earlier task used: dufs.data._scratch):
    the store is scikit-learn's; once the conversion is over the workers keep no scratch memory."""
    from dufs.data import _scratch

    X, y = random_data(1500, 400, 12 / 400, seed=52)
    long_lines = sp.random_array((60, 400), density=0.5, rng=1, format="csr")  # a few much longer lines
    X = sp.vstack([X[:700], long_lines, X[760:]], format="csr")
    text = svm_text(X, y)
    src = write(tmp_path / "m.svm", text)
    st, rep = convert(src, tmp_path / "out.zarr", block_bytes=len(text) // 25 + 1, client=cluster_client)
    assert st.n_blocks("csr") >= 20
    assert_equals_sklearn(st, *sk_load(text))
    assert set(cluster_client.run(_scratch.kept_bytes).values()) == {0}


def test_relative_input_paths_on_workers_with_another_working_directory(tmp_path, cluster_client, monkeypatch):
    """A relative input is this process's file, not one of that name in the workers' working directory: a
    ``dask worker`` started elsewhere read the other file, or failed with "No such file"."""
    theirs = cluster_client.run(os.getcwd)
    assert all(os.path.realpath(d) != os.path.realpath(tmp_path) for d in theirs.values())
    text = b"1 1:0.5 3:2\n-1 2:1.5\n1 3:1 4:0.25\n"
    write(tmp_path / "rel.svm", text)
    monkeypatch.chdir(tmp_path)
    st, rep = convert("rel.svm", "rel.zarr", client=cluster_client)
    assert rep.rows == 3 and os.path.isdir(tmp_path / "rel.zarr")
    assert_equals_sklearn(st, *sk_load(text))
