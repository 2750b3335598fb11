"""Where the example scripts find their data: ``--data DIR``.

Every script in this folder takes ``--data DIR``. The default is the folder ``shared/data`` beside the repository
(``<repository>/../shared/data``), found from this file's place, not from the working directory. What the scripts
look for in DIR:

- ``ALLAML.mat``, ``COIL20.mat``, ``ORL.mat``, ``Isolet.mat``: MATLAB files holding ``X`` (samples x features)
  and ``Y`` (labels), as in the scikit-feature repository (``skfeature/data``). When one is missing the script
  uses the lossless copy bundled with dufs (:func:`dufs.data.datasets.load`) and says so;
- ``libsvm/reuters.trn.bz2``, ``libsvm/reuters.tst.bz2``: Reuters-21578 money-fx in libsvm format
  (``examples/mmfs_text.py``; skipped when missing);
- ``uci/ionosphere.data``, ``uci/satimage.csv``, ``uci/letter-recognition.data``: the UCI files of the M3FS
  tables (``examples/m3fs_tables.py``; each row is skipped when its file is missing).

The scripts import this module as ``_data``: run them as ``python examples/<name>.py`` (the script's folder is
then the first entry of ``sys.path``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

#: ``<repository>/../shared/data``: the default of ``--data``
DEFAULT_DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data"

#: the MATLAB file of each bundled data set (names of :func:`dufs.data.datasets.load`)
MAT = {"allaml": "ALLAML.mat", "coil20": "COIL20.mat", "orl": "ORL.mat", "isolet": "Isolet.mat",
       "basehock": "BASEHOCK.mat", "pcmac": "PCMAC.mat", "relathe": "RELATHE.mat"}


def add_data_argument(ap: argparse.ArgumentParser, what: str) -> None:
    """Add ``--data DIR`` (a :class:`~pathlib.Path`, default :data:`DEFAULT_DATA`) to ``ap``; ``what`` says
    which files the script reads from it."""
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA, metavar="DIR",
                    help=f"folder holding {what} (default: {DEFAULT_DATA}, the shared/data folder beside the "
                         f"repository)")


def missing(data: Path, path: Path, then: str) -> None:
    """Say that ``path`` (under the data folder ``data``) was looked for and not found, what the script does
    instead (``then``), and how to point it elsewhere."""
    data = Path(data)
    where = f"the data folder {data} does not exist" if not data.is_dir() else f"{path} is not there"
    print(f"({where}: {then}; --data DIR points the script at another folder)", flush=True)


def find(data: Path, relative: str, then: str) -> Path | None:
    """``data / relative`` when it is a file, else None after saying so (see :func:`missing`)."""
    path = Path(data) / relative
    if path.is_file():
        return path
    missing(data, path, then)
    return None


def load_mat(name: str, data: Path) -> tuple[np.ndarray, np.ndarray, str]:
    """``(X, y, source)`` of data set ``name`` (a key of :data:`MAT`): X dense float64, y raveled, from
    ``data / MAT[name]`` when it is there, else from the bundled copy (the same values), saying so."""
    src = f"dufs.data.datasets.load({name!r})"
    path = find(data, MAT[name], f"using the bundled copy, {src}")
    if path is not None:
        import scipy.io

        d = scipy.io.loadmat(path)
        return np.asarray(d["X"], dtype=np.float64), np.asarray(d["Y"]).ravel(), str(path)
    from dufs.data.datasets import load

    X, y = load(name, sparse=False)
    return np.asarray(X, dtype=np.float64), np.asarray(y).ravel(), src
