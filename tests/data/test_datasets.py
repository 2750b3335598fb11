"""The bundled real data sets: shapes, classes, formats, checksums, equality with the originals."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from dufs.data.datasets import available, info, load
from dufs.errors import ParameterError

NAMES = ["allaml", "coil20", "orl", "isolet", "basehock", "pcmac", "relathe"]
SHAPES = {  # the table of README.md: (samples, features, classes)
    "allaml": (72, 7129, 2),
    "coil20": (1440, 1024, 20),
    "orl": (400, 1024, 40),
    "isolet": (1560, 617, 26),
    "basehock": (1993, 4862, 2),
    "pcmac": (1943, 3289, 2),
    "relathe": (1427, 4322, 2),
}
TEXT = {"basehock", "pcmac", "relathe"}
ORIGINALS = Path(__file__).resolve().parents[2].parent / "shared" / "data"


def _sha256(a, dtype) -> str:
    return hashlib.sha256(np.ascontiguousarray(a, dtype=dtype).tobytes()).hexdigest()


def test_available():
    assert available() == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_shape_classes_dtypes(name):
    n, p, c = SHAPES[name]
    X, y = load(name)
    assert X.shape == (n, p) and X.dtype == np.float64
    assert y.shape == (n,) and y.dtype == np.int64
    np.testing.assert_array_equal(np.unique(y), np.arange(1, c + 1))
    assert sp.issparse(X) == (name in TEXT)
    if name in TEXT:
        assert isinstance(X, sp.csr_array) and X.has_sorted_indices and np.all(X.data != 0)
    d = info(name)
    assert (d.n_samples, d.n_features, d.n_classes, d.sparse) == (n, p, c, name in TEXT)


@pytest.mark.parametrize("name", NAMES)
def test_sparse_and_dense_agree_and_match_checksums(name):
    Xs, ys = load(name, sparse=True)
    Xd, yd = load(name, sparse=False)
    assert isinstance(Xs, sp.csr_array) and isinstance(Xd, np.ndarray)
    np.testing.assert_array_equal(Xs.toarray(), Xd)
    np.testing.assert_array_equal(ys, yd)
    d = info(name)
    assert _sha256(Xd, np.float64) == d.sha256_X
    assert _sha256(yd, np.int64) == d.sha256_y


def test_names_are_case_insensitive():
    X, y = load("COIL20")
    X2, y2 = load("Coil20")
    np.testing.assert_array_equal(X, X2)
    np.testing.assert_array_equal(y, y2)


def test_known_values():
    X, _ = load("coil20")
    assert X.min() == 0.0 and X.max() == 1.0
    X, _ = load("orl")
    assert np.all(X == np.round(X)) and X.max() <= 255
    X, _ = load("isolet")
    assert X.min() >= -1.0 and X.max() <= 1.0


def test_unknown_name():
    msg = r"The 'name' parameter of load must be one of \['allaml'.*'relathe'\]"
    with pytest.raises(ParameterError, match=msg):
        load("mnist")
    with pytest.raises(ParameterError, match="'name' parameter"):
        load(3)


def test_bad_sparse():
    with pytest.raises(ParameterError, match="'sparse' parameter"):
        load("allaml", sparse="yes")


@pytest.mark.skipif(not ORIGINALS.is_dir(), reason=f"no original .mat files at {ORIGINALS}")
@pytest.mark.parametrize("name", NAMES)
def test_equal_to_the_original_mat_files(name):
    from scipy.io import loadmat

    m = loadmat(ORIGINALS / info(name).source)
    X, y = load(name, sparse=False)
    Xo = np.asarray(m["X"]).astype(np.float64)
    assert X.dtype == Xo.dtype and X.shape == Xo.shape
    assert np.array_equal(X, Xo)  # exact, bit for bit (no NaNs in these sets)
    assert np.array_equal(y, np.asarray(m["Y"]).ravel())
