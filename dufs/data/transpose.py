"""The out-of-core transpose of a store build (:class:`~dufs.data.builder.StoreBuilder`'s second step): feature
blocks balanced by nonzeros on granule boundaries, then each CSC feature block assembled from one contiguous slice
of every row block's spill (one stable counting sort by feature, a granule at a time), and the row blocks' column
indices shifted where the index base was decided only at the end."""

from __future__ import annotations

import math
import time

import numpy as np

from dufs import config
from dufs.data import layout
from dufs.data._fs import Location
from dufs.data._scratch import scratch
from dufs.data.layout import FEATURES, ROWS
from dufs.data.store import read_array, write_array, write_arrays
from dufs.errors import StoreError


def content_checksum(*arrays: np.ndarray, start: str | None = None) -> str:
    """``crc32c:<hex>`` of the arrays' bytes in order (continuing the checksum ``start``): what a store records per
    feature block and of its labels, so that two stores of the same sparsity pattern but other values are told
    apart without reading them."""
    import crc32c

    value = 0 if start is None else int(start.split(":")[1], 16)
    for a in arrays:
        value = crc32c.crc32c(np.ascontiguousarray(a).view(np.uint8), value=value)
    return f"crc32c:{value:08x}"


class TransposeSteps:
    """The transpose's steps, methods of :class:`~dufs.data.builder.StoreBuilder` (they read its partial store's
    path, granule, chunk size and value dtype)."""

    def _feature_bounds(self, n_row_blocks: int, n_features: int, shift: int,
                        feature_block: int | None) -> np.ndarray:
        """Raw-index feature block boundaries on granule multiples, balanced by nonzeros."""
        G = self.granule
        n_raw = n_features + shift
        n_gran = max(1, math.ceil(n_raw / G))
        if feature_block:  # a fixed number of features per block (rounded to granules)
            step = max(1, round(feature_block / G))
            gb = list(range(0, n_gran, step)) + [n_gran]
        else:
            counts = np.zeros(n_gran, dtype=np.int64)
            for i in range(n_row_blocks):
                goff = self._spill_goff(i)
                c = np.diff(goff)[:n_gran]
                counts[:c.shape[0]] += c
            target = int(config.get("store.feature-block-nnz"))
            max_gran = max(1, int(config.get("store.feature-block-max-features")) // G)
            gb, acc = [0], 0
            for k in range(n_gran):
                if k > gb[-1] and (acc + counts[k] > target or k - gb[-1] >= max_gran):
                    gb.append(k)
                    acc = 0
                acc += counts[k]
            gb.append(n_gran)
        bounds = np.asarray(gb, dtype=np.int64) * G
        bounds[-1] = n_raw
        if n_features == 0:
            bounds = np.array([0, shift], dtype=np.int64)
        return bounds

    # ------------------------------------------------------------------ the tasks of finalize (run on workers)
    def _reindex_row_block(self, i: int, shift: int) -> None:
        """Rewrite row block ``i``'s indices for the final index base ``shift`` (its provisional guess was wrong).

        Idempotent under kills: the fixed array is written beside the old one, the attributes then record the new
        base with ``fix_pending``, and only then is it moved into place.
        """
        blk = layout.block_group(self._group(), ROWS, i)
        attrs = dict(blk.attrs)
        meta = layout.read_row_block(attrs, i)
        indices_path = layout.block_array_path(ROWS, i, layout.INDICES)
        fix = Location(self.partial.child(layout.block_array_path(ROWS, i, layout.INDICES_FIX)))
        if not meta.fix_pending:
            if meta.indices_shift == shift:
                return
            idx = read_array(blk[layout.INDICES], f"row block {i}")
            write_array(blk, layout.INDICES_FIX, (idx.astype(np.int64) + meta.indices_shift - shift).astype(np.int32),
                        chunk=self.chunk)
            blk.attrs.put(layout.reindex_pending_attrs(attrs, shift))
            attrs = dict(blk.attrs)
        if fix.exists():
            Location(self.partial.child(indices_path)).remove()
            fix.rename_to(Location(self.partial.child(indices_path)))
        blk.attrs.put(layout.reindex_done_attrs(attrs))

    def _spill_head(self, i: int) -> layout.SpillHeader:
        """Row block ``i``'s spill header, the file checked whole."""
        name = layout.spill_file(i)
        where = self.partial.child(name)
        try:
            with self.partial.reader(name) as r:
                head = layout.SpillHeader.decode(r.read(0, layout.SPILL_HEADER_BYTES), where)
                size = r.size
        except (FileNotFoundError, EOFError):
            size, head = -1, None
        if head is None or size != head.file_bytes or head.value_dtype != self.value_dtype:
            raise StoreError(f"{where}: the spill file of row block {i} is missing or truncated: the partial build "
                             f"is damaged; start again with --overwrite")
        return head

    def _spill_goff(self, i: int) -> np.ndarray:
        """Row block ``i``'s spill offsets: where each granule of raw columns starts."""
        head = self._spill_head(i)
        at, dtype = head.sections()["goff"]
        goff = np.empty(head.n_offsets, dtype=dtype)
        with self.partial.reader(layout.spill_file(i)) as r:
            r.read_into(at, goff)
        return goff

    def _spill_offsets(self, n_row_blocks: int, bounds_raw: np.ndarray) -> np.ndarray:
        """``off[i, j]``: where feature block ``j`` starts in row block ``i``'s spill (one read of each offsets
        array)."""
        G = self.granule
        gb = np.asarray(bounds_raw, dtype=np.int64) // G
        gb[-1] = -(-int(bounds_raw[-1]) // G)
        off = np.zeros((n_row_blocks, len(bounds_raw)), dtype=np.int64)
        for i in range(n_row_blocks):
            goff = self._spill_goff(i)
            off[i] = goff[np.minimum(gb, goff.shape[0] - 1)]
        return off

    def _assemble_feature_block(self, j: int, bounds_raw: np.ndarray, row_bounds: np.ndarray, shift: int,
                                n_features: int, offsets: np.ndarray,
                                row_nnz: list) -> tuple[dict[str, float], np.ndarray]:
        """Task: feature block ``j`` from one slice of every row block's spill. Returns the seconds of its phases and
        the block's nonzeros per feature (int32: a feature has at most ``n_rows`` < 2**31 of them)."""
        from dufs.kernels.sparse import entry_dtype, merge_spills

        t0 = time.perf_counter()
        lo_raw, hi_raw = int(bounds_raw[j]), int(bounds_raw[j + 1])
        lo_f = min(max(lo_raw - shift, 0), n_features)
        hi_f = min(hi_raw - shift, n_features) if j < len(bounds_raw) - 2 else n_features
        width = max(hi_f - lo_f, 0)
        count = offsets[:, j + 1] - offsets[:, j]
        starts = np.concatenate([[0], np.cumsum(np.maximum(count, 0))])
        n = int(starts[-1])  # in this process's scratch memory, as the parse tasks' arrays (dufs.data._scratch)
        entries = scratch("transpose entries", n, entry_dtype(self.value_dtype))
        G = self.granule
        g0, g1 = lo_raw // G, -(-hi_raw // G)  # the block's granules (its raw bounds are granule multiples)
        # where each row block's entries of each of those granules lie in `entries`: its spill's granule offsets
        bounds = np.repeat(starts[:-1, None], g1 - g0 + 1, axis=1)
        for i in np.flatnonzero(count > 0).tolist():  # one slice of row block i's spill, and its offsets
            lo, a, b = int(offsets[i, j]), int(starts[i]), int(starts[i + 1])
            head = self._spill_head(i)
            if head.nnz != row_nnz[i] or offsets[i, j + 1] > head.nnz:
                raise StoreError(f"{self.partial.child(layout.spill_file(i))}: the spill holds {head.nnz} entries, row "
                                 f"block {i} {row_nnz[i]}: the partial build is damaged; start again with --overwrite")
            sections = head.sections()
            at, dtype = sections["entries"]
            n_gran = head.n_offsets - 1
            ga, gb = min(g0, n_gran), min(g1, n_gran)
            goff = np.empty(gb - ga + 1, np.int64)
            with self.partial.reader(layout.spill_file(i)) as r:
                r.read_into(at + lo * dtype.itemsize, entries[a:b])
                r.read_into(sections["goff"][0] + 8 * ga, goff)
            if goff[0] != lo or goff[-1] != offsets[i, j + 1]:
                raise StoreError(f"{self.partial.child(layout.spill_file(i))}: its granule offsets disagree with "
                                 f"the ones read before: the partial build is damaged; start again with --overwrite")
            bounds[i, :gb - ga + 1] = a + goff - lo
            bounds[i, gb - ga + 1:] = b
        t1 = time.perf_counter()
        # rows within their row block -> rows of the store
        indptr, indices, data = merge_spills(entries, width, granule=G, bounds=bounds, first_granule=g0,
                                             col0=shift + lo_f, seg_rows=row_bounds[:-1],
                                             out=(scratch("transpose rows", n, np.int32),
                                                  scratch("transpose values", n, self.value_dtype)))
        del entries
        t2 = time.perf_counter()
        blk = self._new_block(FEATURES, j)
        write_arrays(blk, dict(zip(layout.BLOCK_ARRAYS, (indptr, indices, data), strict=True)), chunk=self.chunk)
        self._finish_block(blk, layout.feature_block_attrs(layout.FeatureBlockMeta(
            int(indptr[-1]), lo_f, lo_f + width, content_checksum(indptr, indices, data))))  # one write
        phases = {"transpose read": t1 - t0, "transpose merge": t2 - t1, "transpose write": time.perf_counter() - t2}
        return phases, np.diff(indptr).astype(np.int32)
