"""The iterative solvers hold the driver's BLAS to one thread while they run passes: OpenBLAS's threads spin-wait
after a threaded call, and a pass started right after one ran 3-6 ms slower on the 2-core test machine (the
workers share the driver's cores). Checked where it matters, at every pass each solver makes, and undone after."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from dufs.engine import Matrix
from dufs.scheduling import _controller


def _blas_threads() -> set[int]:
    return {int(m["num_threads"]) for m in _controller().info() if m.get("user_api") == "blas"}


def _spied(M: Matrix) -> list[set[int]]:
    """The driver's BLAS threads noted at every pass the matrix's executor counts."""
    seen: list[set[int]] = []
    ex = M.executor

    class _Spy(type(ex)):
        @property
        def passes(self) -> int:
            return self.__dict__["_spied_passes"]

        @passes.setter
        def passes(self, v: int) -> None:
            seen.append(_blas_threads())
            self.__dict__["_spied_passes"] = v

    ex.__dict__["_spied_passes"] = ex.__dict__.pop("passes")
    ex.__class__ = _Spy
    return seen


def _data(seed: int = 0):
    rng = np.random.default_rng(seed)
    X = sp.random_array((120, 60), density=0.15, format="csr", rng=rng)
    y = np.where(X[:, :5].sum(axis=1) > np.median(X[:, :5].sum(axis=1)), 1.0, -1.0)
    return X, y


def _run(which: str, M: Matrix, y: np.ndarray) -> None:
    if which == "m3fs":
        from dufs.methods.m3fs import m3fs_alternating

        m3fs_alternating(M, n_features=4, C=10.0, lambda_=0.01, n_neighbors=5, max_iter=2, init="random")
    elif which == "ufcm":
        from dufs.methods.ufcm import ufcm

        ufcm(M, n_clusters=3, n_components=3, max_iter=2, dense_below=1)
    elif which == "mmfs":
        from dufs.methods.mmfs import mmfs

        mmfs(M, y, gamma=0.5, tol=1e-6, checkpoint=None)
    else:
        from dufs.methods.greedy import lapofs

        lapofs(M, n_features=3, criterion="A", n_neighbors=5, checkpoint=None)


@pytest.mark.parametrize("which", ["m3fs", "ufcm", "mmfs", "lapaofs"])
def test_solvers_hold_blas_to_one_thread_during_their_passes(which):
    before = _blas_threads()
    if before <= {1}:
        pytest.skip("BLAS runs one thread here already: nothing to hold")
    X, y = _data()
    M = Matrix(X, standardize="scale" if which != "ufcm" else None, block_width=16)
    M.column_stats()
    seen = _spied(M)
    _run(which, M, y)
    during = [s for s in seen if s]  # the solver's passes (UFCM's start, before its iterations, may use threads)
    assert during and during[-1] == {1}, (which, during)
    assert _blas_threads() == before  # given back
