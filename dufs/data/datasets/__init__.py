"""Small real benchmark data sets bundled with dufs (lossless copies; see ``README.md`` beside).

From the scikit-feature repository (jundongl/scikit-feature, skfeature/data, commit 48cffad), which
redistributes the ASU feature selection repository's benchmark sets (Li et al., "Feature selection:
A data perspective", ACM Computing Surveys 50(6), 2018).

>>> from dufs.data.datasets import load
>>> X, y = load("coil20")
>>> X.shape, y.shape
((1440, 1024), (1440,))
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources

import numpy as np
import scipy.sparse as sp

from dufs.errors import ParameterError

__all__ = ["DatasetInfo", "available", "info", "load"]


@dataclass(frozen=True)
class DatasetInfo:
    """What :func:`load` gives for one bundled data set."""

    name: str
    source: str  #: the original file in skfeature/data
    n_samples: int
    n_features: int
    n_classes: int
    sparse: bool  #: whether :func:`load` gives a sparse matrix by default (the text sets)
    description: str
    sha256_X: str  #: of the decoded X as a C-contiguous dense float64 array
    sha256_y: str  #: of the decoded y (int64)


_INFO = {
    d.name: d
    for d in [
        DatasetInfo("allaml", "ALLAML.mat", 72, 7129, 2, False,
                    "leukemia gene expression (ALL vs AML); 'Leukemia' in MMFS",
                    "f635d5335c26330f4d33a471bacd8849bafc379bccdf34af2c57649c6b57e6ae",
                    "82950afe2487ba072f689ba7ecc5efa90334672b3e5d87ede05ea752ba1b7b8b"),
        DatasetInfo("coil20", "COIL20.mat", 1440, 1024, 20, False,
                    "Columbia object images, 20 objects x 72 poses, 32x32 grey levels in [0, 1]",
                    "f6eb3a1aa58ac984b4acaf63c596b5f15216018a098e734654a43148f4df01e5",
                    "50ed2ddad13d3631044d9b10118d06f21ecad616895da57b9eeb8cd4bae40d27"),
        DatasetInfo("orl", "ORL.mat", 400, 1024, 40, False,
                    "AT&T (ORL) faces, 40 people x 10 images, 32x32 grey levels in [0, 255]",
                    "78791e8c2e36ca4f48d3798a5a9ef57afc7ee6b6906ef9a4d373b9818b34c9da",
                    "39f5024e2df290f62043d0e3f0b4c57e43981a88269d1db4ea34acf2733103a3"),
        DatasetInfo("isolet", "Isolet.mat", 1560, 617, 26, False,
                    "spoken letters (UCI ISOLET subset), 617 acoustic features in [-1, 1]",
                    "479f7932e7f5196348ae8c26d325d91db0b116b916892697d72e315011048ec4",
                    "b4d425bf468a495d72a4a964dc9e9d861704126e802ac857197e75704db910cc"),
        DatasetInfo("basehock", "BASEHOCK.mat", 1993, 4862, 2, True,
                    "20 newsgroups baseball vs hockey, word counts (~67 nonzeros a row)",
                    "ab233c560bb6888d2f05a64628df35b76c1da8acd1717297ae57d91440426cef",
                    "0712ac8c9f61c003bbd769ec55f165a34dd4652e94453e9f6155817b1d9e5783"),
        DatasetInfo("pcmac", "PCMAC.mat", 1943, 3289, 2, True,
                    "20 newsgroups pc vs mac, word counts (~48 nonzeros a row)",
                    "ebc49cf5d262662a7d0f45924c9ac50175094d628210bffe37a459c01093e416",
                    "cc005bf926675f0259bbcad2db7874c5def219453c4d1fbbadee5f1a235a28b7"),
        DatasetInfo("relathe", "RELATHE.mat", 1427, 4322, 2, True,
                    "20 newsgroups religion vs atheism, word counts (~84 nonzeros a row)",
                    "f3d80bcac5d3cbac6362fa1439c04246032e3d2177c2779577cdcb483fc5d354",
                    "1d931b07710abfb0b11df9996a56a6b0d81d2f7a3f2c3d8f31318887a868157e"),
    ]
}


def available() -> list[str]:
    """Names of the bundled data sets, for :func:`load`."""
    return list(_INFO)


def _lookup(name) -> DatasetInfo:
    key = name.lower() if isinstance(name, str) else None
    if key not in _INFO:
        raise ParameterError(f"The 'name' parameter of load must be one of {available()} "
                             f"(any case); got {name!r}.")
    return _INFO[key]


def info(name: str) -> DatasetInfo:
    """Shape, classes, default format and checksums of a bundled data set (any case)."""
    return _lookup(name)


def load(name: str, *, sparse: bool | None = None):
    """Load a bundled data set.

    Parameters
    ----------
    name : str
        One of :func:`available` (case-insensitive): ``"allaml"``, ``"coil20"``, ``"orl"``,
        ``"isolet"``, ``"basehock"``, ``"pcmac"``, ``"relathe"``.
    sparse : bool or None, default None
        ``True``: X as a ``scipy.sparse.csr_array``; ``False``: a dense array; ``None``: sparse for
        the text sets (basehock, pcmac, relathe), dense for the others.

    Returns
    -------
    X : ndarray or csr_array of float64, (n_samples, n_features)
        Exactly the values of ``scipy.io.loadmat(<source>)["X"]``, as float64.
    y : ndarray of int64, (n_samples,)
        The labels ``Y`` of the .mat file, raveled (1..n_classes).
    """
    d = _lookup(name)
    if sparse is not None and not isinstance(sparse, (bool, np.bool_)):
        raise ParameterError("The 'sparse' parameter of load must be a bool or None; "
                             f"got {sparse!r}.")
    with resources.files(__name__).joinpath(f"{d.name}.npz").open("rb") as f, np.load(f) as z:
        divisor = float(z["divisor"])
        y = z["y"].astype(np.int64)
        if "indptr" in z:
            data = z["data"].astype(np.float64) / divisor
            indices, indptr = z["indices"].astype(np.int32), z["indptr"].astype(np.int32)
            X = sp.csr_array((data, indices, indptr), shape=tuple(int(v) for v in z["shape"]))
        else:
            X = z["X"].astype(np.float64) / divisor
    if sparse is None:
        sparse = d.sparse
    if sparse and not sp.issparse(X):
        X = sp.csr_array(X)
    elif not sparse and sp.issparse(X):
        X = X.toarray()
    return X, y
