"""The passes of a :class:`~dufs.engine.matrix.Matrix`: its products with the implicit standardization (Z^T V,
Z U, the label sums), functions mapped over its feature blocks (with state kept beside them, sums, placement and
partitions), and the scores of its features with their top k and argmax. A mixin: the matrix's data, transform
and executor are :class:`~dufs.engine.matrix.Matrix` 's (docs/architecture.md, "The engine")."""

from __future__ import annotations

from typing import Any

import numpy as np

from dufs import config
from dufs.engine.blocks import block_scores_and_top, block_topk, local_topk, map_one
from dufs.engine.dispatch import delayed, mark_spread, ship, tree_sum
from dufs.engine.executor import inline_when_small
from dufs.engine.inputs import as_2d, check_label_codes, check_product_dtype
from dufs.engine.state import BlockState
from dufs.errors import ParameterError
from dufs.kernels.blockops import col_sums

__all__ = ["Passes"]


class Passes:
    """The passes of a feature-blocked matrix (the module docstring)."""

    # ------------------------------------------------------------------ products
    @inline_when_small
    def rmatvec(self, V: Any, *, gather: bool = True, dtype: Any = np.float64, sums: Any = None) -> Any:
        """Z^T V for a dense ``V`` of shape (n_samples,) or (n_samples, p); float64 (n_features,) or (n_features, p).

        One pass; ``V`` travels to the workers once, each block computes its rows of the result. With
        ``gather=False`` the per-block results (float64 (width, p) arrays) stay where they were computed: a
        :class:`BlockState` for a following :meth:`map_blocks` (``state=``), gathered only when asked.
        ``dtype`` float32: every sum is still made in float64 (and the transform applied in float64), then rounded
        once to float32 where it is made: half the bytes come back. ``V`` may be a future of an (n_samples, p)
        float64 array (kept on a worker: :mod:`dufs.engine.kept`), with ``sums``, its p column sums, given.
        """
        check_product_dtype(dtype, "rmatvec")
        if hasattr(V, "key"):  # a future of an (n_samples, p) float64 array kept on a worker (dufs.engine.kept)
            if sums is None:
                raise ParameterError("rmatvec: V given as a future needs its column 'sums'")
            sums = np.asarray(sums, dtype=np.float64)
            vsum = sums if self.transform[0] is not None else None
            return self._rmatvec(mark_spread(V), 0, vsum, gather, dtype, sums.shape[0])
        n = self.shape[0]
        # a float32 V over float32 data stays float32: exact (the kernel multiplies and sums in float64), and the
        # randomly read vector takes half the cache and half the bytes shipped
        V2, one = as_2d(V, n, "V", "n_samples", keep_float32=np.dtype(self.dtype) == np.float32)
        vsum = col_sums(V2) if self.transform[0] is not None else None
        out = self._rmatvec(V2, 0, vsum, gather, dtype)
        return out if not gather else out[:, 0] if one else out

    @inline_when_small
    def label_rmatvec(self, labels: Any, n_labels: int, *, dtype: Any = np.float64, counts: Any = None
                      ) -> np.ndarray:
        """Z^T U for U the n_samples x ``n_labels`` indicator of ``labels`` (U[i, labels[i]] = 1): each label's
        column sums of the transformed data, float64 (n_features, n_labels) (or ``dtype``).

        The same numbers as ``rmatvec(U)`` (each sum made in the same order; U's zeros add nothing), in one pass
        that ships the labels (4 bytes a sample) instead of U (8 n_labels bytes a sample) and reads them at random
        instead of U's rows. ``labels`` may be a future of int32 codes (kept on a worker: :mod:`dufs.engine.kept`),
        with ``counts``, each label's count, given (they are not read here).
        """
        check_product_dtype(dtype, "label_rmatvec")
        if hasattr(labels, "key"):  # a future of int32 codes kept on a worker: their sizes are the caller's
            if counts is None:
                raise ParameterError("label_rmatvec: labels given as a future need their 'counts'")
            lab, counts = mark_spread(labels), np.asarray(counts)
        else:
            lab, counts = check_label_codes(labels, n_labels, self.shape[0])
            lab = np.ascontiguousarray(lab, dtype=np.int32)
        vsum = None
        if self.transform[0] is not None:
            vsum = counts.astype(np.float64) if counts is not None else np.zeros(int(n_labels))
        return self._rmatvec(lab, int(n_labels), vsum, True, dtype)

    def _rmatvec(self, V2: Any, classes: int, vsum: Any, gather: bool, dtype: Any, p: int = 0) -> Any:
        """Z^T V for a 2-D ``V2`` (of ``p`` columns where it is a future), or with ``classes`` > 0 for the
        indicator of the integer labels ``V2`` (:meth:`label_rmatvec`); ``vsum``: V's column sums where the
        transform centres."""
        dt = None if np.dtype(dtype) == np.float64 else np.dtype(dtype)
        shape = (self.shape[1], classes or p or V2.shape[1])
        return self.executor.rmatvec(V2, classes, vsum, self._block_transform(), dt, shape, dtype, gather)

    @inline_when_small
    def matvec(self, U: Any, *, hold: bool = False) -> Any:
        """Z U for a dense ``U`` of shape (n_features,) or (n_features, p); float64 (n_samples,) or (n_samples, p).

        One pass; the per-block partial products are summed on the workers by a tree in block order (fixed, so
        the result does not depend on the number of workers), and only the sum comes back. On workers of several
        machines each machine's partials are summed there first, then one a machine by a tree over the machines
        (:func:`~dufs.engine.dispatch.tree_sum_machines`): the rounding then depends on the blocks' machines.

        ``hold`` (a 2-D ``U``): the sum left on the worker that made it where the pass runs as tasks on a
        distributed client (else it comes back), returned with the row to subtract from each of its rows: (X
        diag(inv) U, its future, or the array; the centring's row, or None), for work that goes on where it is
        (:mod:`dufs.engine.kept`).
        """
        n, d = self.shape
        U2, one = as_2d(U, d, "U", "n_features")
        mu, inv = self.transform
        if not self.blocks:
            out = np.zeros((n, U2.shape[1]))
        else:
            # direct calls read U as it is (one shared copy) and scale their blocks' rows by the blocks' part of
            # the transform, kept on their workers: the driver makes no scaled copy of U
            tf = self._block_transform() if inv is not None else None
            out = self.executor.matvec(U2, inv, tf, n, hold=hold)
        shift = None if mu is None else self._centre_scaled_row() @ U2
        if hold:
            return out, shift
        if shift is not None:
            out = out - shift[None, :]
        return out[:, 0] if one else out

    def _centre_scaled_row(self) -> np.ndarray:
        """centre diag(inv) (the centring's part of Z U is 1 (centre diag(inv) U)), kept for this transform."""
        mu, inv = self.transform
        key = (self.standardize, id(self._stats))
        got = self._centre_scaled
        if got is None or got[0] != key:
            got = self._centre_scaled = (key, mu * inv if inv is not None else np.asarray(mu, dtype=np.float64))
        return got[1]

    # ------------------------------------------------------------------ functions over the blocks
    @inline_when_small
    def map_blocks(self, fn: Any, *args: Any, state: Any = None, reduce: str | None = None,
                   partitions: list | None = None, hold: bool | str = False, rows_touched: bool = False,
                   **kwargs: Any) -> Any:
        """Run ``fn(block, *args, **kwargs)`` on every feature block where it is loaded: one task a block, one pass.

        ``block`` is a :class:`FeatureBlock`. Arguments wrapped in :class:`PerBlock` are given block by block;
        large arrays travel once per pass. Results (small) come back in block order, or, with ``reduce="sum"``,
        summed on the workers by a fixed tree and returned as one value.

        With ``partitions`` (lists of block indices, e.g. :meth:`partition`) there is one task a partition
        instead: ``fn(blocks, ...)`` gets the partition's blocks as a list, and each :class:`PerBlock` argument as a
        list with one item per block of the partition; results (and state) are one per partition, in partition
        order.

        With ``state`` (a :class:`BlockState` or a list, one item per block or partition) the call is
        ``fn(block, state_i, *args, **kwargs)`` and must return ``(new_state_i, result_i)``; the new state stays
        beside its block (on the worker) and ``(results, BlockState)`` is returned.

        ``hold`` (with ``reduce="sum"``): where the pass runs as tasks on a distributed client, the sum is left on
        the worker that made it and its ``distributed.Future`` returned in its place (the pass has completed; a
        failed one raises here), for work that goes on from it there (:mod:`dufs.engine.held`); elsewhere the
        value, as without it. ``hold="pieces"``: where the machines' partials are added by a reduce-scatter, the
        sum is left in the pieces of its rows on the machines' receivers (a :class:`HeldPieces`), for work kept in
        pieces of rows beside them; elsewhere as ``hold=True``.

        ``rows_touched`` (with ``reduce="sum"``): each result is an n-row array (or has ``dufs_rows``) that is zero
        off the rows its blocks touch, so that a sum over machines sends each machine's touched rows only
        (:mod:`dufs.engine.touched`).
        """
        if reduce not in (None, "sum"):
            raise ParameterError(f"The 'reduce' parameter of map_blocks must be None or 'sum'; got {reduce!r}.")
        parts = None if partitions is None else self.executor.check_partitions(partitions)
        items = None
        if state is not None:
            items = state.items if isinstance(state, BlockState) else list(state)
            n = self.n_blocks if parts is None else len(parts)
            if len(items) != n:
                raise ParameterError(f"map_blocks: state has {len(items)} items for {n} "
                                     f"{'blocks' if parts is None else 'partitions'}")
        return self.executor.map(fn, args, kwargs, items, reduce, parts, _name(fn),
                                 hold=hold if reduce == "sum" else False,
                                 rows=self.shape[0] if rows_touched and reduce == "sum" else 0)

    @inline_when_small
    def map_sums(self, fn: Any, keys: list, *args: Any, then: Any = None, then_args: tuple = ()) -> list:
        """One pass of ``len(keys)`` sums: for each key, the sum over blocks of ``fn(block, key, *args)`` (the fixed
        tree of :meth:`map_blocks`), then ``then(sum, key, *then_args)`` where that sum was made (on a worker),
        whose result comes back; results in key order. The keys are small (row ranges, say); ``args`` as in
        :meth:`map_blocks` (:class:`PerBlock` allowed), each shipped once for all keys, like ``then_args``. With no
        blocks every sum is None.

        For reductions whose sums are large and whose use of them small (the exact kNN graph's n x rows Gram
        blocks): the sums stay on the workers, up to one (and its parts) a key in flight: give a few keys a pass.
        """
        keys = list(keys)
        if not keys:
            return []
        ex = self.executor
        if not ex.src:  # no blocks: every sum is None (map_blocks' sum of nothing), finished here
            return [None if then is None else then(None, key, *then_args) for key in keys]
        shared = [ex.scatter_per_block(ship(a)) for a in args]
        fin = [ship(a) for a in then_args]
        f = delayed(map_one)
        g = delayed(then) if then is not None else None
        out = []
        for key in keys:
            parts = [f(fn, s, (key, *(ex.block_item(a, i) for a in shared)), {}) for i, s in enumerate(ex.src)]
            out.append(tree_sum(parts) if g is None else g(tree_sum(parts), key, *fin))
        return ex.run(out, _name(fn))

    def placement(self) -> list[str | None]:
        """The worker address holding each block (persisted blocks); None for every block otherwise."""
        return self.executor.placement()

    def partition(self, n: int, where: list[str | None] | None = None) -> list[list[int]]:
        """The blocks cut into ``n`` partitions, balanced by nonzeros, a worker's persisted blocks together
        (:func:`dufs.engine.placement.partition`; ``where``: :meth:`placement`, asked when not given)."""
        return self.executor.partition(n, where)

    @inline_when_small
    def topk(self, fn: Any, k: int, *args: Any, largest: bool = True, **kwargs: Any) -> tuple[np.ndarray, np.ndarray]:
        """The ``k`` best features by ``fn(block, *args, **kwargs)`` (a score per feature of the block): each block
        proposes its own best, the driver merges. Returns ``(indices, scores)`` best first; NaN counts as worst,
        ties go to the lower index."""
        if not isinstance(k, int | np.integer) or k < 1:
            raise ParameterError(f"The 'k' parameter of topk must be an int >= 1; got {k!r}.")
        shared = tuple(ship(a) for a in args)
        f = delayed(block_topk)
        parts = self.executor.run([f(s, fn, int(k), largest, shared, kwargs, b.start)
                                   for s, b in zip(self.executor.src, self.blocks, strict=True)], "top-k")
        if not parts:
            return np.zeros(0, np.int64), np.zeros(0)
        ids = np.concatenate([p[0] for p in parts])
        sc = np.concatenate([p[1] for p in parts])
        sel, _ = local_topk(sc, int(k), largest, 0)
        return ids[sel], sc[sel]

    @inline_when_small
    def block_scores(self, fn: Any, *args: Any, k: int | None = None, largest: bool = True,
                     dtype: Any = None, **kwargs: Any) -> tuple[np.ndarray, np.ndarray | None]:
        """Every feature's score by ``fn(block, *args, **kwargs)`` (a score per feature of the block, computed where
        the block lives), and, with ``k``, the ``k`` best features (NaN worst, ties to the lower index), in one
        pass. The driver holds the scores (``dtype``) and one block's result at a time: each block's scores are
        written into place as they arrive and its ``k`` best merged with the others' (``Matrix.topk``'s rule).
        ``dtype`` (None: float64, float32 above ``dufs.engine.driver-features`` features) is the scores' type on
        the driver; blocks compute and rank in float64 either way."""
        d = self.shape[1]
        if dtype is None:
            dtype = np.float32 if d > int(config.get("engine.driver-features")) else np.float64
        scores = np.empty(d, dtype=dtype)
        shared = tuple(ship(a) for a in args)
        kw = {key: ship(v) for key, v in kwargs.items()}
        kk = None if k is None else int(k)
        cands: dict[int, tuple] = {}  # block -> its (ids, scores), merged in block order: ties to the lower index

        def consume(i: int, got: Any) -> None:
            s, top = got
            b = self.blocks[i]
            scores[b.start:b.stop] = s
            if kk is not None:
                cands[i] = top

        f = delayed(block_scores_and_top)
        tasks = [f(s, fn, kk, largest, shared, kw, b.start, dtype)
                 for s, b in zip(self.executor.src, self.blocks, strict=True)]
        self.executor.run_streaming(tasks, _name(fn), consume)
        if kk is None:
            return scores, None
        if not cands:
            return scores, np.zeros(0, np.int64)
        ids = np.concatenate([cands[i][0] for i in sorted(cands)])
        sel, _ = local_topk(np.concatenate([cands[i][1] for i in sorted(cands)]), kk, largest, 0)
        return scores, ids[sel]

    def argmax(self, fn: Any, *args: Any, **kwargs: Any) -> tuple[int, float]:
        """The feature with the largest ``fn`` score (see :meth:`topk`) and its score."""
        i, s = self.topk(fn, 1, *args, **kwargs)
        return int(i[0]), float(s[0])


def _name(fn: Any) -> str:
    return str(getattr(fn, "__name__", "map_blocks")).lstrip("_").replace("_", " ")
