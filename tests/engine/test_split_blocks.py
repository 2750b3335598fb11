"""Blocks cut where they are persisted so that every worker thread holds one: the pieces against SciPy's column
slices, the products and a selection on a cluster against dense NumPy and the uncut blocks."""

from __future__ import annotations

import dask
import numpy as np
import scipy.sparse as sp

import dufs
from dufs.data import write_store
from dufs.engine import Matrix
from dufs.engine.blocks import BlockInfo, FeatureBlock, materialize
from dufs.engine.placement import split_blocks
from dufs.testing.references import dense_z

TOL = {"rtol": 1e-10, "atol": 1e-10}


def _skewed(n, d, seed):
    """A sparse matrix whose columns' nonzeros fall off as a power law (a few columns hold most of them)."""
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, d + 1) ** 0.9
    cols = rng.choice(d, size=6 * n, p=p / p.sum())
    rows = rng.integers(0, n, cols.size)
    X = sp.csc_array((rng.random(cols.size) + 0.5, (rows, cols)), shape=(n, d))
    X.sum_duplicates()
    X.sort_indices()
    return X


def _blocks(X, width):
    out = []
    for a in range(0, X.shape[1], width):
        b = min(X.shape[1], a + width)
        S = X[:, a:b].tocsc()
        out.append(FeatureBlock(a, b, S.indptr.astype(np.int64), S.indices.astype(np.int32), S.data.copy()))
    return out


def test_pieces_are_scipys_column_slices_balanced_by_nonzeros():
    X = _skewed(2000, 600, 3)
    src = _blocks(X, 400)  # two blocks of unequal nonzeros
    info = [BlockInfo(b.start, b.stop, b.nnz) for b in src]
    new_src, new = split_blocks(src, info, slots=8, min_nnz=100, workers=2)
    assert len(new) % 2 == 0 and 2 < len(new) <= 8
    assert [b.start for b in new] == sorted(b.start for b in new) and new[0].start == 0 and new[-1].stop == 600
    assert all(p.stop == q.start for p, q in zip(new[:-1], new[1:], strict=True))
    for s, b in zip(new_src, new, strict=True):
        got = materialize(s)
        ref = X[:, b.start:b.stop].tocsc()
        assert (got.start, got.stop, got.nnz) == (b.start, b.stop, b.nnz) == (b.start, b.stop, ref.nnz)
        assert np.array_equal(got.indptr, ref.indptr) and np.array_equal(got.indices, ref.indices)
        assert np.array_equal(got.data, ref.data)
        assert not np.shares_memory(got.data, X.data)
    # within each block the pieces are balanced to within its largest column
    counts = np.diff(X.indptr)
    for blk in info:
        pieces = [b.nnz for b in new if blk.start <= b.start < blk.stop]
        if len(pieces) > 1:
            assert max(pieces) - min(pieces) <= 2 * counts[blk.start:blk.stop].max()


def test_blocks_are_left_whole_where_no_cut_is_wanted():
    X = _skewed(500, 100, 4)
    src = _blocks(X, 50)
    info = [BlockInfo(b.start, b.stop, b.nnz) for b in src]
    for kw in ({"slots": 2, "min_nnz": 10}, {"slots": 8, "min_nnz": 0}, {"slots": 8, "min_nnz": 10 ** 9}):
        assert split_blocks(src, info, **kw) == (src, info)
    unknown = [BlockInfo(b.start, b.stop) for b in src]  # a Dask array's: nonzeros not known
    assert split_blocks(src, unknown, slots=8, min_nnz=10) == (src, unknown)


def test_a_store_of_one_block_is_cut_for_the_workers(cluster_client, tmp_path):
    X = _skewed(3000, 400, 5).tocsr()
    store = write_store(X, tmp_path / "s.zarr", feature_block=400, value_dtype=np.float64)
    assert dufs.open(store.path).n_blocks("csc") == 1
    Z = dense_z(X.toarray(), "zscore")
    rng = np.random.default_rng(6)
    V, U = rng.standard_normal((3000, 2)), rng.standard_normal((400, 2))
    with cluster_client.as_current(), dask.config.set({"dufs.engine.split-block-nnz": X.nnz // 4}):
        M = Matrix(store, standardize="zscore").persist()
        assert M.n_blocks == 2 and "cut into 2" in M.residency["reason"]
        where = M.executor.placement()
        assert len(set(where)) == 2  # one a worker: before, both workers' passes ran on one
        np.testing.assert_allclose(M.rmatvec(V), Z.T @ V, **TOL)
        np.testing.assert_allclose(M.matvec(U), Z @ U, **TOL)
        cut = dufs.fit(M, method="lapaofs", n_features=5, client=cluster_client)
        M.release()
        with dask.config.set({"dufs.engine.split-block-nnz": 0}):
            W = Matrix(store, standardize="zscore").persist()
            assert W.n_blocks == 1
            whole = dufs.fit(W, method="lapaofs", n_features=5, client=cluster_client)
            W.release()
    assert list(cut.indices) == list(whole.indices)
    np.testing.assert_allclose(cut.scores, whole.scores, rtol=1e-9)
