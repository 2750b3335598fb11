"""Overwriting: only a dufs store (finished or not) is ever replaced, and a replacement that fails or is killed at any
point leaves the previous store readable as it was.

Every writer goes through ``StoreBuilder``: ``write_store``, ``convert_libsvm`` and ``make_synthetic`` are each run
against targets that are not dufs stores (a directory of other files, an empty directory, a regular file, a Zarr group
or array of someone else's), with and without ``overwrite``, on local paths and ``memory://``; the target must come out
byte for byte as it was and nothing may be created beside it. Replacements are then failed by bad input, by an error
in ``finalize``, by a failing rename, and by SIGKILL of a real converting process, during the parse and during the
transpose.
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import dask
import fsspec
import numpy as np
import pytest
import scipy.sparse as sp
import zarr
from sklearn.datasets import dump_svmlight_file, load_svmlight_file

import dufs
from dufs.data import StoreBuilder, store_kind, write_store
from dufs.data._fs import Location
from dufs.data.convert import convert_libsvm
from dufs.data.synthetic import SyntheticSpec
from dufs.data.writers import make_synthetic
from dufs.errors import InputFormatError, ParameterError, StoreError
from dufs.testing import assert_store_matches, canonical, patience
from dufs.testing.strategies import Blocking
from tests.data.test_convert import _complete  # how many blocks of a partial store are complete

BLOCKING = Blocking(row_block=10, granule=4, block_nnz=40, chunk_elements=50)
NOT_A_STORE = "exists and is not a dufs store"


def _matrix(n: int, d: int, seed: int) -> tuple[sp.csr_array, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = sp.random_array((n, d), density=0.2, format="csr", rng=rng)
    return canonical(X), rng.integers(0, 3, n).astype(np.float64)


OLD_X, OLD_Y = _matrix(37, 19, 1)
NEW_X, NEW_Y = _matrix(23, 11, 2)


# ------------------------------------------------------------------------------------------- snapshots of a tree
def _snapshot(path: str) -> dict:
    """Everything at and beside ``path``: each file's bytes, each directory's name (local or fsspec)."""
    fs, p = fsspec.core.url_to_fs(path)
    parent = p.rsplit("/", 1)[0] or "/"
    out = {}
    for q, info in sorted(fs.find(parent, withdirs=True, detail=True).items()):
        out[q] = fs.cat_file(q) if info["type"] == "file" else "<dir>"
    if Location.of(path).local:  # file modes too, where there are any
        for q in list(out):
            out[q] = (out[q], os.stat(q).st_mode)
    return out


def _make_target(path: str, kind: str) -> None:
    fs, p = fsspec.core.url_to_fs(path)
    if kind == "directory":  # a thesis folder: files and a subdirectory
        fs.makedirs(p + "/figures", exist_ok=True)
        fs.pipe(p + "/thesis.tex", b"\\chapter{One}\n")
        fs.pipe(p + "/figures/plot.png", bytes(range(256)))
    elif kind == "empty-directory":
        fs.makedirs(p, exist_ok=True)
    elif kind == "file":
        fs.pipe(p, b"not a store\n" * 10)
    elif kind == "zarr-group":  # a Zarr group of someone else's, with an array
        g = zarr.open_group(store=Location.of(path).zarr_store(read_only=False), mode="w")
        g.attrs["project"] = "other"
        g.create_array("a", shape=(5,), dtype="int64")[...] = np.arange(5)
    elif kind == "zarr-array":
        a = zarr.create_array(store=Location.of(path).zarr_store(read_only=False), shape=(4,), dtype="f8")
        a[...] = 1.5
    else:
        raise AssertionError(kind)


def _svm_file(where: Path, X, y, name: str = "in.svm") -> Path:
    src = where / name
    dump_svmlight_file(X, y, str(src))
    return src


@pytest.fixture(scope="module")
def new_svm(tmp_path_factory) -> Path:
    """NEW_X, NEW_Y as libsvm text, away from the stores' directory (whose snapshots must not change)."""
    return _svm_file(tmp_path_factory.mktemp("inputs"), NEW_X, NEW_Y)


WRITERS = {
    "write_store": lambda src, out, **kw: write_store(NEW_X, out, NEW_Y, **kw),
    "convert_libsvm": lambda src, out, **kw: convert_libsvm(src, out, **kw),
    "make_synthetic": lambda src, out, **kw: make_synthetic(
        out, SyntheticSpec(n_rows=40, n_features=30, nnz_per_row=3, n_informative=2), row_block=10, **kw),
}
TARGETS = ["directory", "empty-directory", "file", "zarr-group", "zarr-array"]


@pytest.mark.parametrize("where", ["local", "memory"])
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("writer", list(WRITERS))
def test_what_is_not_a_dufs_store_is_never_replaced(new_svm, store_path, writer, target, where):
    """Refused before any work, with a one-line error naming the path, with and without overwrite; the target and
    its directory are exactly as they were (no partial store, no renamed copy)."""
    out = store_path(where, name="out")
    _make_target(out, target)
    assert store_kind(out)[0] == "other"
    before = _snapshot(out)
    for overwrite in (True, False):
        with BLOCKING.config(), pytest.raises(StoreError) as e:
            WRITERS[writer](new_svm, out, overwrite=overwrite)
        msg = str(e.value)
        assert "\n" not in msg
        assert msg.startswith(f"{Location.of(out).url} {NOT_A_STORE} (")
        assert msg.endswith("refusing to overwrite it (remove it yourself or choose another output)")
        assert _snapshot(out) == before


@pytest.mark.parametrize("target", ["directory", "file", "zarr-group"])
def test_what_is_not_a_dufs_build_under_the_partial_name_is_left_alone(store_path, target):
    out = store_path()
    _make_target(out + ".dufs-partial", target)
    before = _snapshot(out)
    for overwrite in (True, False):
        with BLOCKING.config(), pytest.raises(StoreError, match=r"\.dufs-partial exists and is not a dufs build"):
            write_store(NEW_X, out, overwrite=overwrite)
        with pytest.raises(StoreError, match=r"\.dufs-partial exists and is not a dufs build"):
            StoreBuilder(out, overwrite=overwrite, resume=True).begin()
        assert _snapshot(out) == before


def test_what_is_not_a_dufs_store_under_the_old_name_is_left_alone(store_path):
    """Replacing may need ``<path>.dufs-old``: someone else's file there is refused before any work."""
    out = store_path()
    with BLOCKING.config():
        write_store(OLD_X, out, OLD_Y)
    _make_target(out + ".dufs-old", "directory")
    before = _snapshot(out)
    with BLOCKING.config(), pytest.raises(StoreError, match=r"\.dufs-old exists and is not a dufs store"):
        write_store(NEW_X, out, overwrite=True)
    assert _snapshot(out) == before


def test_convert_refuses_every_output_before_writing_any(tmp_path):
    a, b = _svm_file(tmp_path, NEW_X, NEW_Y, "a.svm"), _svm_file(tmp_path, OLD_X, OLD_Y, "b.svm")
    _make_target(str(tmp_path / "ob.zarr"), "directory")
    before = _snapshot(str(tmp_path / "ob.zarr"))
    with pytest.raises(StoreError, match=NOT_A_STORE):
        convert_libsvm([a, b], [tmp_path / "oa.zarr", tmp_path / "ob.zarr"], overwrite=True)
    assert _snapshot(str(tmp_path / "ob.zarr")) == before  # and no oa.zarr(.dufs-partial) either


def test_a_symbolic_link_is_not_replaced(tmp_path):
    real = tmp_path / "real"
    _make_target(str(real), "directory")
    (tmp_path / "out.zarr").symlink_to(real)
    with pytest.raises(StoreError, match=rf"{NOT_A_STORE} \(a symbolic link\)"):
        write_store(NEW_X, tmp_path / "out.zarr", overwrite=True)
    assert (real / "thesis.tex").read_bytes() == b"\\chapter{One}\n"


# ------------------------------------------------------------------------------------------- what is replaced
@pytest.mark.parametrize("where", ["local", "memory"])
@pytest.mark.parametrize("writer", list(WRITERS))
def test_a_dufs_store_is_replaced(new_svm, store_path, writer, where):
    out = store_path(where)
    with BLOCKING.config():
        write_store(OLD_X, out, OLD_Y)
        with pytest.raises(StoreError, match="exists; pass overwrite=True"):
            WRITERS[writer](new_svm, out)
        assert_store_matches(dufs.open(out), OLD_X, OLD_Y)
        WRITERS[writer](new_svm, out, overwrite=True)
    st = dufs.open(out)
    assert st.shape != OLD_X.shape
    if writer != "make_synthetic":
        assert_store_matches(st, NEW_X, NEW_Y, value_dtype=st.dtype)
    fs, p = fsspec.core.url_to_fs(out)
    assert not fs.exists(p + ".dufs-partial") and not fs.exists(p + ".dufs-old")
    assert not fs.exists(p + "/dufs.lock")


@pytest.mark.parametrize("where", ["local", "memory"])
def test_an_unfinished_dufs_store_in_place_is_replaced(store_path, where):
    """A partial store moved into place by hand (no completion marker) is dufs' own: overwrite replaces it."""
    out = store_path(where)
    b = StoreBuilder(out, value_dtype=np.float64, options={"t": 1})
    b.begin()
    b.write_row_block(0, np.array([0, 1]), np.array([1]), np.array([2.0]))
    b.abort(remove=False)
    part, final = Location.of(out).sibling(".dufs-partial"), Location.of(out)
    part.rename_to(final)
    assert store_kind(out)[0] == "partial"
    with BLOCKING.config():
        with pytest.raises(StoreError, match="exists; pass overwrite"):
            write_store(NEW_X, out)
        st = write_store(NEW_X, out, NEW_Y, overwrite=True)
    assert_store_matches(st, NEW_X, NEW_Y)


def _interrupted_build(out: str) -> None:
    b = StoreBuilder(out, overwrite=True, options={"t": 1})
    b.begin()
    b.write_row_block(0, np.array([0, 1]), np.array([1]), np.array([2.0]))
    b.abort(remove=False)  # as if its process had died
    assert store_kind(out + ".dufs-partial")[0] == "partial"


@pytest.mark.parametrize("old_store", [False, True])
def test_overwrite_discards_an_interrupted_build(store_path, old_store):
    """Without resume, overwrite replaces an interrupted build's partial store (its process is gone) instead of
    asking for --resume; without overwrite it is refused and kept."""
    out = store_path()
    with BLOCKING.config():
        if old_store:
            write_store(OLD_X, out, OLD_Y)
        _interrupted_build(out)
        refusal = "exists; pass overwrite" if old_store else "an unfinished build is at .*--resume.*--overwrite"
        with pytest.raises(StoreError, match=refusal):
            write_store(NEW_X, out, NEW_Y)
        assert store_kind(out + ".dufs-partial")[0] == "partial"
        if old_store:
            assert_store_matches(dufs.open(out), OLD_X, OLD_Y)
        st = write_store(NEW_X, out, NEW_Y, overwrite=True)
    assert_store_matches(st, NEW_X, NEW_Y)
    assert not os.path.exists(out + ".dufs-partial")


# ------------------------------------------------------------------------------------------- failed replacements
def _assert_old_intact(out: str) -> None:
    st = dufs.open(out)
    assert st.shape == OLD_X.shape
    assert_store_matches(st, OLD_X, OLD_Y)
    fs, p = fsspec.core.url_to_fs(out)
    assert not fs.exists(p + ".dufs-old")


@pytest.mark.parametrize("where", ["local", "memory"])
def test_an_error_in_finalize_keeps_the_old_store(store_path, where):
    out = store_path(where)
    with BLOCKING.config():
        write_store(OLD_X, out, OLD_Y)
        with pytest.raises(ParameterError, match="feature_ids has shape"):  # raised by finalize, after the CSC side
            write_store(NEW_X, out, NEW_Y, feature_ids=np.arange(3), overwrite=True)
    _assert_old_intact(out)
    fs, p = fsspec.core.url_to_fs(out)
    assert not fs.exists(p + ".dufs-partial")


def test_a_bad_input_line_keeps_the_old_store(tmp_path):
    out = tmp_path / "out.zarr"
    with BLOCKING.config():
        write_store(OLD_X, out, OLD_Y)
    src = tmp_path / "bad.svm"
    src.write_bytes(b"1 1:1\n" * 50 + b"1 2:abc\n")
    with pytest.raises(InputFormatError, match=r"bad\.svm:51: a feature value is not a number"):
        convert_libsvm(src, out, overwrite=True, block_bytes=60)
    _assert_old_intact(str(out))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.svm", "out.zarr"]


@pytest.mark.parametrize("where", ["local", "memory"])
def test_replacement_by_two_renames(store_path, where, monkeypatch):
    """Where no atomic exchange is available (fsspec URLs, other systems), the old store goes to ``.dufs-old`` and
    is removed once the new one is in place; a failing second rename puts it back."""
    monkeypatch.setattr(Location, "exchange", lambda self, other: False)
    out = store_path(where)
    with BLOCKING.config():
        write_store(OLD_X, out, OLD_Y)
        real = Location.rename_to
        calls = []

        def flaky(self, dest):
            calls.append((self.url, dest.url))
            if self.url.endswith(".dufs-partial"):
                raise OSError("no space left on device (injected)")
            return real(self, dest)

        monkeypatch.setattr(Location, "rename_to", flaky)
        with pytest.raises(OSError, match="injected"):
            write_store(NEW_X, out, NEW_Y, overwrite=True)
        name = Path(out).name  # final -> .dufs-old, partial -> final (fails), .dufs-old -> final (put back)
        assert [c[1].rsplit("/", 1)[-1] for c in calls] == [name + ".dufs-old", name, name]
        _assert_old_intact(out)
        monkeypatch.setattr(Location, "rename_to", real)
        st = write_store(NEW_X, out, NEW_Y, overwrite=True)
    assert_store_matches(st, NEW_X, NEW_Y)
    fs, p = fsspec.core.url_to_fs(out)
    assert [q for q in (p + ".dufs-partial", p + ".dufs-old") if fs.exists(q)] == []


def test_local_replacement_is_one_atomic_exchange(store_path, monkeypatch):
    """On a local Linux path the old store is swapped out in one step: ``.dufs-old`` is never used."""
    if not sys.platform.startswith("linux"):
        pytest.skip("renameat2 is Linux's")
    out = store_path()
    with BLOCKING.config():
        write_store(OLD_X, out, OLD_Y)
        seen = []
        real = Location.rename_to
        monkeypatch.setattr(Location, "rename_to", lambda self, dest: (seen.append(dest.url), real(self, dest))[1])
        write_store(NEW_X, out, NEW_Y, overwrite=True)
    assert seen == []  # no rename: the exchange did it all
    assert_store_matches(dufs.open(out), NEW_X, NEW_Y)


# ------------------------------------------------------------------------------------------- interrupted swaps
def _two_stores(tmp_path: Path) -> tuple[str, str]:
    old, new = str(tmp_path / "old.zarr"), str(tmp_path / "new.zarr")
    with BLOCKING.config():
        write_store(OLD_X, old, OLD_Y)
        write_store(NEW_X, new, NEW_Y)
    return old, new


def test_killed_between_the_two_renames(tmp_path):
    """The old store at ``.dufs-old``, the new finished one under the partial name, nothing in place: opening says
    where each is; the next build puts the finished one in place and removes the old copy."""
    old, new = _two_stores(tmp_path)
    out = str(tmp_path / "out.zarr")
    os.rename(old, out + ".dufs-old")
    os.rename(new, out + ".dufs-partial")
    with pytest.raises(StoreError, match=r"no dufs store at .*out\.zarr, but a finished one is at .*\.dufs-partial"):
        dufs.open(out)
    b = StoreBuilder(out, overwrite=True)
    b.begin()
    b.abort()
    assert_store_matches(dufs.open(out), NEW_X, NEW_Y)
    assert sorted(os.listdir(tmp_path)) == ["out.zarr"]


def test_killed_after_the_first_rename_of_a_fresh_swap(tmp_path):
    """Only the old store, under ``.dufs-old``: it is put back."""
    old, _ = _two_stores(tmp_path)
    out = str(tmp_path / "out.zarr")
    os.rename(old, out + ".dufs-old")
    with pytest.raises(StoreError, match=r"its previous version is at .*\.dufs-old"):
        dufs.open(out)
    with BLOCKING.config(), pytest.raises(StoreError, match="exists; pass overwrite"):
        write_store(NEW_X, out)
    _assert_old_intact(out)


@pytest.mark.parametrize("leftover", [".dufs-partial", ".dufs-old"])
def test_killed_after_the_exchange(tmp_path, leftover):
    """The new store in place and the old one left beside it: the old copy is removed by the next build."""
    old, new = _two_stores(tmp_path)
    out = str(tmp_path / "out.zarr")
    os.rename(new, out)
    os.rename(old, out + leftover)
    assert_store_matches(dufs.open(out), NEW_X, NEW_Y)
    with BLOCKING.config():
        write_store(OLD_X, out, OLD_Y, overwrite=True)
    _assert_old_intact(out)
    assert sorted(os.listdir(tmp_path)) == ["out.zarr"]


# ------------------------------------------------------------------------------------------- SIGKILL mid-build
KILL = {"DASK_DUFS__STORE__FEATURE_GRANULE": "16", "DASK_DUFS__STORE__FEATURE_BLOCK_NNZ": "1000"}
KILL_BB = 8300
CONVERT = textwrap.dedent("""
    import sys
    from dufs.data.convert import convert_libsvm
    convert_libsvm(sys.argv[1], sys.argv[2], overwrite=True, resume=sys.argv[3] == "1", block_bytes=int(sys.argv[4]),
                   value_dtype="float64")
    print("done", flush=True)
""")


def _killed_at(src: Path, out: Path, side: str, k: int, *, resume: bool = False) -> None:
    """Run a converting process that replaces ``out``; SIGKILL it once ``k`` blocks of ``side`` are written."""
    partial = Path(str(out) + ".dufs-partial")
    proc = subprocess.Popen([sys.executable, "-c", CONVERT, str(src), str(out), "1" if resume else "0",
                             str(KILL_BB)], env={**os.environ, **KILL}, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    t0 = time.monotonic()
    try:
        while _complete(partial, side) < k:
            if proc.poll() is not None:
                pytest.fail(f"the conversion ended (rc {proc.returncode}) before {k} {side} blocks: "
                            f"{proc.communicate()[1].decode()[-2000:]}")
            if time.monotonic() - t0 > patience(120):
                pytest.fail("timed out")
            time.sleep(0.005)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
    assert proc.returncode == -signal.SIGKILL


@pytest.fixture(scope="module")
def kill_input(tmp_path_factory):
    d = tmp_path_factory.mktemp("kill")
    rng = np.random.default_rng(5)
    X = sp.random_array((800, 600), density=10 / 600, format="csr", rng=rng)
    y = rng.integers(0, 2, 800).astype(np.float64)
    buf = io.BytesIO()
    dump_svmlight_file(X, y, buf)
    src = d / "big.svm"
    src.write_bytes(buf.getvalue())
    Xr, yr = load_svmlight_file(str(src), dtype=np.float64)
    return src, sp.csr_array(Xr), yr


@pytest.mark.slow
@pytest.mark.parametrize("side, k", [("csr", 4), ("csc", 2)], ids=["parsing", "transposing"])
def test_sigkill_mid_build_keeps_the_old_store(tmp_path, kill_input, side, k):
    """A converting process replacing a store is SIGKILLed while it parses (row blocks) or while it transposes
    (feature blocks, inside finalize): the old store opens with its old contents. A new overwrite then discards the
    dead build and replaces the store; a resume (with overwrite) finishes the dead build and replaces it."""
    src, X, y = kill_input
    out = tmp_path / "out.zarr"
    with BLOCKING.config():
        write_store(OLD_X, out, OLD_Y)
    _killed_at(src, out, side, k)
    assert Path(str(out) + ".dufs-partial").exists()
    _assert_old_intact(str(out))
    with dask.config.set({"dufs.store.feature-granule": 16, "dufs.store.feature-block-nnz": 1000}):
        st, _ = convert_libsvm(src, out, overwrite=True, block_bytes=KILL_BB, value_dtype="float64")
        assert_store_matches(st, X, y)
        write_store(OLD_X, out, OLD_Y, overwrite=True)
    _killed_at(src, out, side, k)
    _assert_old_intact(str(out))
    with dask.config.set({"dufs.store.feature-granule": 16, "dufs.store.feature-block-nnz": 1000}):
        st, _ = convert_libsvm(src, out, overwrite=True, resume=True, block_bytes=KILL_BB, value_dtype="float64")
    assert_store_matches(st, X, y)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.zarr"]
