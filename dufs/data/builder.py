"""Building a sparse store out of core: row blocks in, both orientations out.

The build runs in three steps, each resumable:

1. ``write_row_block(i, ...)`` (any order, in parallel, on any worker): writes CSR row block ``i`` and a *spill* of
   its entries bucketed by granules of ``feature-granule`` features (rows ascending in each bucket), with the
   buckets' offsets;
   a block is done when its group carries ``complete: true`` (written last).
2. ``finalize()`` picks feature blocks balanced by nonzeros on granule boundaries, then assembles every CSC feature
   block from the spills (each task reads one contiguous slice of every row block's spill), writes labels,
   per-feature nonzeros and the attributes, and the completion marker last.
3. The partial store ``<path>.dufs-partial`` is renamed to ``<path>``; a store already there (only a dufs store:
   anything else at ``<path>`` is refused before any work starts) is replaced in one atomic exchange where the
   filesystem allows (local paths on Linux), else by two renames through ``<path>.dufs-old``. Until that step the
   previous store stays readable as it was, whatever fails or is killed.

Memory per task is bounded by the block sizes, never by the data size. Row blocks may carry raw column indices with
an index base decided only at the end (libsvm's ``zero_based="auto"``): ``finalize(index_shift=1)`` subtracts it.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import zarr

from dufs import config
from dufs._logging import get_logger
from dufs.data import _direct, layout
from dufs.data._exec import Executor
from dufs.data._fs import Location, acquire_lock, lock_is_live, release_lock
from dufs.data._scratch import scratch
from dufs.data.layout import FEATURES, FORMAT_VERSION, LOCK_NAME, ROWS, RowBlockMeta, StoreMeta
from dufs.data.store import SparseStore, compressors, read_array, store_kind, write_array, write_arrays
from dufs.data.transpose import TransposeSteps, content_checksum
from dufs.errors import ParameterError, StoreError

log = get_logger(__name__)
INT32_MAX = 2**31 - 1
#: what ``write_row_block`` returns (the block's record, as ``row_block_meta`` reads it back)
RowBlockInfo = RowBlockMeta


class StoreBuilder(TransposeSteps):
    """Writes a store under ``<path>.dufs-partial`` and renames it to ``<path>`` on success.

    Picklable (it holds only the path and options), so row-block writes run as tasks on workers.

    Parameters
    ----------
    path : str or path-like
        The final store location (local directory or fsspec URL).
    value_dtype : dtype, default from ``dufs.store.value-dtype`` (float32)
    overwrite : bool
        Replace a dufs store (finished or not) at ``path``, only once the new one is complete, and discard an
        interrupted build at ``<path>.dufs-partial`` (one whose process is gone) instead of asking for ``resume``.
        Anything at ``path`` that is not a dufs store is never replaced: :meth:`check_target` refuses it.
    resume : bool
        Continue a partial store left by an interrupted build.
    options : dict
        What the build was asked to do (inputs, parser options); a resume must ask for the same.
    """

    def __init__(self, path: Any, *, value_dtype: Any = None, overwrite: bool = False,
                 resume: bool = False, options: dict | None = None):
        self.final = Location.of(path)
        self.partial = layout.partial_location(self.final)
        self.value_dtype = np.dtype(value_dtype or config.get("store.value-dtype"))
        if self.value_dtype.kind != "f":
            raise ParameterError(f"The 'value_dtype' parameter must be a float dtype; got {self.value_dtype}.")
        self.overwrite = overwrite
        self.resume = resume
        self.options = dict(options or {})
        self.granule = int(config.get("store.feature-granule"))
        from dufs.kernels.sparse import MAX_GRANULE

        if not 1 <= self.granule <= MAX_GRANULE:  # a spill entry holds its feature's offset in its granule in 16 bits
            raise ParameterError(f"The 'dufs.store.feature-granule' setting must be an int in [1, {MAX_GRANULE}]; "
                                 f"got {self.granule}.")
        self.chunk = int(config.get("store.chunk-elements"))
        self._locked = False

    def __getstate__(self) -> dict:
        d = dict(self.__dict__)
        d["_locked"] = False
        return d

    # ------------------------------------------------------------------ lifecycle
    def check_target(self) -> None:
        """Refuse, before any work, an output this build must not write: raises a one-line :class:`StoreError`.

        Refused: anything at ``path`` that is not a dufs store (a regular file, a directory of other files, a Zarr
        group without dufs metadata), with or without ``overwrite``; a dufs store there without ``overwrite``;
        anything at ``<path>.dufs-partial`` that is not a dufs build; and, when replacing, anything at
        ``<path>.dufs-old`` that is not a dufs store. Nothing is changed.
        """
        kind, what = store_kind(self.final)
        if kind == "other":
            raise StoreError(f"{self.final.url} exists and is not a dufs store ({what}); refusing to overwrite it "
                             f"(remove it yourself or choose another output)")
        if kind != "missing" and not self.overwrite:
            raise StoreError(f"{self.final.url} exists; pass overwrite=True (--overwrite) to replace it")
        pkind, pwhat = store_kind(self.partial)
        if pkind == "other":
            raise StoreError(f"{self.partial.url} exists and is not a dufs build ({pwhat}); dufs builds "
                             f"{self.final.url} under that name first: move it away or choose another output")
        if kind != "missing":
            old = layout.old_location(self.final)
            okind, owhat = store_kind(old)
            if okind == "other":
                raise StoreError(f"{old.url} exists and is not a dufs store ({owhat}); dufs needs that name to "
                                 f"replace {self.final.url}: move it away or choose another output")

    def _recover(self) -> None:
        """Finish what a replacement killed between its renames left: the store in place, no stray copies."""
        pkind = store_kind(self.partial)[0]
        if pkind == "store":  # a finished store under the partial name: its move into place was interrupted
            held = self.partial.read_json(LOCK_NAME)
            if held and lock_is_live(held):
                acquire_lock(self.partial, what="build")  # being moved right now: raises naming the holder
            if not self.final.exists():
                log.warning("moving the finished store %s into place at %s (its move was interrupted)",
                            self.partial.url, self.final.url)
                self.partial.rename_to(self.final)
                release_lock(self.final)
            elif store_kind(self.final)[0] == "store":
                log.warning("removing %s, a copy left by an interrupted replacement of %s", self.partial.url,
                            self.final.url)
                self.partial.remove()
        old = layout.old_location(self.final)
        if store_kind(old)[0] == "store":
            if not self.final.exists():
                log.warning("restoring %s from %s (its replacement was interrupted)", self.final.url, old.url)
                old.rename_to(self.final)
            elif store_kind(self.final)[0] == "store":
                log.info("removing %s, left by an interrupted replacement of %s", old.url, self.final.url)
                old.remove()

    def begin(self) -> set[int]:
        """Check the output, create (or, resuming, reopen) the partial store and lock it; return the finished row
        blocks. Refuses (:meth:`check_target`) an output that is not a dufs store before anything is written."""
        self.check_target()  # before anything changes, even the recovery of an interrupted replacement
        self._recover()
        self.check_target()
        if self.partial.exists():
            held = self.partial.read_json(LOCK_NAME)
            if held and lock_is_live(held):
                acquire_lock(self.partial, what="build")  # raises StoreLockedError naming the holder
            if layout.NODE_FILE not in self.partial.names():  # killed between taking its lock and writing anything
                log.info("removing %s: its build was interrupted before it wrote anything", self.partial.url)
                self.partial.remove()
            elif not self.resume and self.overwrite:
                log.warning("discarding the interrupted build at %s (overwrite)", self.partial.url)
                self.partial.remove()
        if self.partial.exists():
            if not self.resume:
                raise StoreError(
                    f"{self.final.url}: an unfinished build is at {self.partial.url}"
                    + (f" (pid {held.get('pid')} on {held.get('host')})" if held else "")
                    + "; finish it with --resume (resume=True), or replace it with --overwrite")
            acquire_lock(self.partial, what="build")
            self._locked = True
            g = self.partial.open_group("r+")
            started = layout.read_partial(dict(g.attrs))
            if started.version not in (None, FORMAT_VERSION):
                self.abort(remove=False)
                raise StoreError(f"cannot resume {self.partial.url}: it was started by a dufs writing format version "
                                 f"{started.version!r}, this one writes {FORMAT_VERSION}; finish it with that dufs, or "
                                 f"start again with --overwrite")
            prev = started.options
            if prev is not None and _jsonable(prev) != _jsonable(self.options):
                self.abort(remove=False)
                raise StoreError(f"cannot resume {self.partial.url}: it was started with other options "
                                 f"({prev}); now {self.options}")
            settings = layout.build_settings(str(self.value_dtype), self.granule)
            was = started.settings
            if was != settings:
                self.abort(remove=False)
                how = ("Resume with the same settings" if was["spill"] == settings["spill"] else
                       "It was started by a dufs writing another spill format: finish it with that dufs, or start "
                       "again with --overwrite")
                raise StoreError(f"cannot resume {self.partial.url}: it was started with {was} (dtype, "
                                 f"dufs.store.feature-granule, spill format); now {settings}. {how}")
            _remove_temp_files(self.partial)
            done = self.finished_row_blocks()
            log.info("resuming %s: %d row blocks already written", self.partial.url, len(done))
            return done
        if self.resume:
            log.info("nothing to resume at %s: starting afresh", self.partial.url)
        acquire_lock(self.partial, what="build")
        self._locked = True
        g = zarr.open_group(store=self.partial.zarr_store(read_only=False), mode="a", zarr_format=3)
        key, record = layout.new_partial(_jsonable(self.options), str(self.value_dtype), self.granule)
        g.attrs[key] = record
        layout.create_build_groups(g)
        return set()

    def abort(self, *, remove: bool = True) -> None:
        """Give up: remove the partial store (nothing half-written is left) or just release the lock."""
        if remove:
            self.partial.remove()
        elif self._locked:
            release_lock(self.partial)
        self._locked = False

    def _group(self) -> zarr.Group:
        # the partial store is always Zarr v3: no probing for v2 metadata (.zgroup, .zattrs: requests on S3)
        return zarr.open_group(store=self.partial.zarr_store(read_only=False), mode="r+", zarr_format=3)

    def finished_row_blocks(self) -> set[int]:
        """The row blocks written completely (their spill included)."""
        spill = Location(self.partial.child(layout.SPILL))
        spilled = {n for n in spill.names() if n.isdigit()} if spill.exists() else set()
        return {i for i in layout.finished_blocks(self._group(), ROWS) if str(i) in spilled}

    # ------------------------------------------------------------------ step 1
    def write_row_block(self, i: int, indptr: np.ndarray, indices: np.ndarray, data: np.ndarray,
                        y: np.ndarray | None = None, extra: dict | None = None, *,
                        raw_indices: bool = False, timings: dict[str, float] | None = None) -> RowBlockMeta:
        """Write CSR row block ``i`` (indices sorted within rows) and its spill.

        With ``raw_indices=True`` the column indices carry an index base decided only at ``finalize``. The spill
        keeps them raw; the CSR block is written with a provisional base: one-based (``indices - 1``) unless the
        block holds an index 0. ``finalize(index_shift=...)`` rewrites only the blocks whose guess was wrong
        (for one-based files, none). ``extra``: what the writer records besides, returned by
        :meth:`row_block_meta` (``.extra``) and :meth:`row_block_infos`. ``timings``: seconds of the phases
        ``write rows`` (the CSR arrays into Zarr) and ``spill`` (bucketing the entries, writing the spill file) are
        added to it.
        """
        from dufs.kernels.sparse import csr_to_spill, entry_dtype

        t0 = time.perf_counter()

        indptr = np.ascontiguousarray(indptr, dtype=np.int64)
        n_rows = indptr.shape[0] - 1
        nnz = int(indptr[-1])
        indices = np.asarray(indices)[:nnz]
        lo, hi = (int(indices.min()), int(indices.max())) if nnz else (-1, -1)
        if nnz and (lo < 0 or hi > INT32_MAX):
            raise ParameterError(f"row block {i}: column indices must lie in [0, 2**31 - 1]")
        # the block's arrays in this process's scratch memory (no fresh pages a block: dufs.data._scratch)
        indices = _in_scratch("row block indices", indices, np.int32)
        data = _in_scratch("row block values", np.asarray(data)[:nnz], self.value_dtype)
        if n_rows > INT32_MAX:
            raise ParameterError(f"row block {i} has too many rows ({n_rows})")
        blk = self._new_block(ROWS, i)
        indptr_name, indices_name, data_name = layout.BLOCK_ARRAYS
        guess = 1 if raw_indices and (nnz == 0 or lo >= 1) else 0
        stored = indices
        if guess:  # the spill keeps the raw indices
            stored = np.subtract(indices, np.int32(guess), out=scratch("row block indices, based", nnz, np.int32))
        arrays = {indptr_name: indptr, indices_name: stored, data_name: data}
        if y is not None:
            y = np.asarray(y, dtype=np.float64).ravel()
            if y.shape[0] != n_rows:
                raise ParameterError(f"row block {i}: {y.shape[0]} labels for {n_rows} rows")
            arrays[layout.ROW_LABELS] = y
        write_arrays(blk, arrays, chunk=self.chunk)
        t1 = time.perf_counter()
        entries, goff = csr_to_spill(indptr, indices, data, self.granule,
                                     out=scratch("spill", nnz, entry_dtype(self.value_dtype)))
        head = layout.SpillHeader(int(goff.shape[0]), int(entries.shape[0]), self.value_dtype)
        self.partial.write_parts(layout.spill_file(i), [head.encode(), goff, entries])
        if timings is not None:
            timings["write rows"] = timings.get("write rows", 0.0) + t1 - t0
            timings["spill"] = timings.get("spill", 0.0) + time.perf_counter() - t1
        info = RowBlockMeta(i, n_rows, nnz, lo, hi,
                            has_y=y is not None, raw_indices=raw_indices, indices_shift=guess, extra=dict(extra or {}))
        # one write (zarr's attrs.update writes key by key): "complete" never lands without the counts
        self._finish_block(blk, layout.row_block_attrs(info))
        return info

    def _new_block(self, orientation: str, i: int) -> zarr.Group | str:
        """Block ``i``'s group, marked unfinished: on a local disk its directory (written as files, see
        :mod:`dufs.data._direct`: creating a group and setting its attributes through Zarr are 4-5 trips through its
        I/O threads; docs/measurements.md, "Writing arrays"), else the Zarr group."""
        if self.partial.local:
            where = os.path.join(self.partial.url, layout.block_path(orientation, i))
            _direct.write_group(where, layout.unfinished_block_attrs())
            return where
        blk = layout.new_block_group(self._group(), orientation, i)
        blk.attrs.put(layout.unfinished_block_attrs())
        return blk

    @staticmethod
    def _finish_block(blk: zarr.Group | str, attrs: dict) -> None:
        """Give the block's group its final attributes (its completion marker among them) in one write."""
        if isinstance(blk, str):
            _direct.write_group(blk, attrs)
        else:
            blk.attrs.put(attrs)

    def row_block_meta(self, i: int) -> RowBlockMeta:
        """What row block ``i`` (written) records: its counts, index range and the writer's ``extra``."""
        return layout.read_row_block(dict(layout.block_group(self._group(), ROWS, i).attrs), i)

    def row_block_infos(self) -> list[RowBlockMeta]:
        """The record of every finished row block, in block order (blocks must be numbered 0..k-1)."""
        g = self._group()
        done = sorted(self.finished_row_blocks())
        if done != list(range(len(done))):
            missing = sorted(set(range(max(done, default=-1) + 1)) - set(done))
            raise StoreError(f"{self.partial.url}: row blocks {missing[:5]} were never written")
        return [layout.read_row_block(dict(layout.block_group(g, ROWS, i).attrs), i) for i in done]

    # ------------------------------------------------------------------ step 2
    def finalize(self, *, n_features: int | None = None, index_shift: int = 0, feature_ids: Any = None,
                 provenance: dict | None = None, ground_truth: dict | None = None,
                 executor: Executor | None = None, feature_block: int | None = None,
                 progress: Callable[[str, int, int], None] | None = None,
                 timings: dict[str, float] | None = None) -> SparseStore:
        """Assemble the CSC side, write labels and attributes, mark complete and rename into place.

        The feature blocks are assembled by tasks (``executor``) while the driver writes the labels and then, as the
        blocks finish in order, the per-feature nonzeros: each a chunk at a time, so the driver holds no array of the
        data's size. ``timings``: seconds of the phases are added to it: the tasks' ``transpose read`` (the spill
        slices), ``transpose merge`` and ``transpose write`` (the CSC arrays into Zarr), summed over tasks, and the
        driver's ``finalize: plan``, ``finalize: labels``, ``finalize: feature nnz`` and ``finalize: close`` (spill
        removed, marker written, moved into place), wall time.
        """
        timings = {} if timings is None else timings
        t0 = time.perf_counter()
        infos = self.row_block_infos()
        row_bounds, n_features, labelled = _check_row_blocks(infos, n_features, index_shift)
        g = self._group()
        ex = executor or Executor()
        try:
            csc_bounds, y_checksum = self._transpose(g, infos, ex, row_bounds, n_features, index_shift, feature_block,
                                                     labelled, progress, timings, t0)
        finally:
            if executor is None:
                ex.close()
        t1 = time.perf_counter()
        feature_blocks = [layout.read_feature_block(dict(layout.block_group(g, FEATURES, j).attrs))
                          for j in range(len(csc_bounds) - 1)]
        if feature_ids is not None:
            self._write_feature_ids(g, feature_ids, n_features)
        meta = StoreMeta(
            version=FORMAT_VERSION,
            shape=(int(row_bounds[-1]), int(n_features)),
            nnz=int(sum(b.nnz for b in infos)),
            dtype=self.value_dtype, index_dtype="int32", indptr_dtype="int64",
            row_bounds=tuple(int(x) for x in row_bounds), row_block_nnz=tuple(int(b.nnz) for b in infos),
            feature_bounds=tuple(int(x) for x in csc_bounds), feature_block_nnz=tuple(f.nnz for f in feature_blocks),
            feature_checksums=tuple(f.checksum for f in feature_blocks),
            y_checksum=y_checksum,
            has_labels=labelled, has_feature_ids=feature_ids is not None,
            provenance=_jsonable({**(provenance or {}), "options": self.options}),
            ground_truth=_jsonable(ground_truth) if ground_truth else None,
            created=datetime.datetime.now(datetime.timezone.utc).isoformat(),
            dufs_version=_dufs_version(),
        )
        # the spill is scratch: drop it before the marker goes in
        Location(self.partial.child(layout.SPILL)).remove()
        g = self._group()
        attrs = layout.finished_root_attrs(dict(g.attrs), meta)  # the completion marker, written last
        g.attrs.put(attrs) if hasattr(g.attrs, "put") else g.attrs.update(attrs)
        self._move_into_place()
        timings["finalize: close"] = timings.get("finalize: close", 0.0) + time.perf_counter() - t1
        return SparseStore(self.final.url)

    def _transpose(self, g: zarr.Group, infos: list[RowBlockMeta], ex: Executor, row_bounds: np.ndarray,
                   n_features: int, index_shift: int, feature_block: int | None, labelled: bool,
                   progress: Callable[[str, int, int], None] | None, timings: dict[str, float],
                   t0: float) -> tuple[np.ndarray, str | None]:
        """Reindex the row blocks that need it, then assemble the feature blocks on ``ex`` while the driver writes
        the labels and the per-feature nonzeros. Returns the CSC feature bounds and the labels' checksum."""
        todo = [b.index for b in infos
                if b.raw_indices and (b.indices_shift != index_shift or b.fix_pending)]
        if any(b.raw_indices is False for b in infos) and index_shift:
            raise StoreError("cannot shift the index base of row blocks written with final indices")
        ex.map_ordered(lambda i: self._reindex_row_block(i, index_shift), todo,
                       on_done=lambda _: progress and progress("reindex", 1, len(todo)))
        bounds_raw = self._feature_bounds(len(infos), n_features, index_shift, feature_block)
        done = layout.finished_blocks(g, FEATURES)
        prev_bounds = layout.read_partial(dict(g.attrs)).csc_bounds
        if prev_bounds is not None and prev_bounds != [int(x) for x in bounds_raw]:
            done = set()
        g.attrs.put(layout.with_csc_bounds(dict(g.attrs), [int(x) for x in bounds_raw]))
        offsets = self._spill_offsets(len(infos), bounds_raw)
        row_nnz = [int(b.nnz) for b in infos]
        csc_bounds = np.clip(bounds_raw - index_shift, 0, n_features)
        csc_bounds[-1] = n_features
        timings["finalize: plan"] = timings.get("finalize: plan", 0.0) + time.perf_counter() - t0
        futures = {j: ex.submit(self._assemble_feature_block, j, bounds_raw, row_bounds, index_shift, n_features,
                                offsets, row_nnz) for j in range(len(bounds_raw) - 1) if j not in done}
        try:
            with _timed(timings, "finalize: labels"):  # while the workers transpose
                y_checksum = self._write_labels(g, infos, int(row_bounds[-1])) if labelled else None
            self._write_feature_nnz(g, futures, done, csc_bounds, n_features, progress, timings)
        except BaseException:
            ex.cancel(list(futures.values()))
            raise
        return csc_bounds, y_checksum

    def _write_feature_nnz(self, g: zarr.Group, futures: dict, done: set, csc_bounds: np.ndarray, n_features: int,
                           progress: Callable[[str, int, int], None] | None, timings: dict[str, float]) -> None:
        """Write the per-feature nonzeros, block by block as the feature blocks finish, in order (a finished
        block's task returns them: its indptr is not read back)."""
        nb = len(csc_bounds) - 1
        fnnz = _Streamed(_new_array(g, layout.FEATURE_NNZ, n_features, np.int64, self.chunk))
        for j in range(nb):
            if j in futures:
                phases, nnz = futures.pop(j).result()
                for phase, dt in phases.items():
                    timings[phase] = timings.get(phase, 0.0) + dt
                if progress:
                    progress("transpose", 1, nb - len(done))
            with _timed(timings, "finalize: feature nnz"):
                if j in done:  # finished by an earlier run
                    ip = read_array(layout.block_group(g, FEATURES, j)[layout.INDPTR], f"csc block {j}")
                    nnz = np.diff(ip)
                if nnz.shape[0] != csc_bounds[j + 1] - csc_bounds[j]:
                    raise StoreError(f"{self.partial.url}: csc block {j} holds {nnz.shape[0]} features, "
                                     f"not {csc_bounds[j + 1] - csc_bounds[j]}")
                fnnz.append(nnz)
        with _timed(timings, "finalize: feature nnz"):
            fnnz.close()

    def _write_feature_ids(self, g: zarr.Group, feature_ids: Any, n_features: int) -> None:
        """Write the feature ids (strings or integers), checked against ``n_features``."""
        fid = np.asarray(feature_ids)
        if fid.shape != (n_features,):
            raise ParameterError(f"feature_ids has shape {fid.shape}; expected ({n_features},)")
        if fid.dtype.kind in "OUST":  # T: NumPy 2 StringDType (as Zarr v3 reads strings back)
            fid = np.array([str(v) for v in fid.tolist()], dtype=str)
            arr = g.create_array(layout.FEATURE_IDS, shape=fid.shape, dtype=str, fill_value="", overwrite=True,
                                 chunks=(max(1, min(self.chunk, fid.size)),), compressors=compressors(),
                                 config={"write_empty_chunks": True})  # crc32c-checked like every array
            if fid.size:
                arr[...] = fid
        else:
            write_array(g, layout.FEATURE_IDS, fid.astype(np.int64))

    def _write_labels(self, g: zarr.Group, infos: list[RowBlockMeta], n_rows: int) -> str:
        """Write the labels of every row block as one array, a chunk at a time; return their checksum."""
        ys = _Streamed(_new_array(g, layout.LABELS, n_rows, np.float64, self.chunk))
        y_checksum = None
        for i in range(len(infos)):
            yi = read_array(layout.block_group(g, ROWS, i)[layout.ROW_LABELS], f"row block {i}").astype(np.float64)
            ys.append(yi)
            y_checksum = content_checksum(yi, start=y_checksum)  # of the whole vector, block by block
        ys.close()
        return y_checksum

    def _move_into_place(self) -> None:
        """Put the finished partial store at the final path, the lock held until it is there.

        A dufs store already there is replaced by one atomic exchange where the filesystem allows, else by two
        renames through ``<path>.dufs-old`` (put back if the second fails); anything else there is refused.
        """
        kind, what = store_kind(self.final)
        if kind == "other" or (kind != "missing" and not self.overwrite):
            raise StoreError(f"{self.final.url} was created by someone else during the build ({what}); refusing "
                             f"to replace it: move it away or choose another output, and build again")
        if kind == "missing":
            self.partial.rename_to(self.final)
        elif self.final.exchange(self.partial):
            self.partial.remove()  # the previous store, now under the partial name
        else:
            old = layout.old_location(self.final)
            if store_kind(old)[0] == "other":
                raise StoreError(f"{old.url} exists and is not a dufs store; dufs needs that name to replace "
                                 f"{self.final.url}: move it away and build again")
            old.remove()  # a dufs store left by an earlier interrupted replacement
            self.final.rename_to(old)
            try:
                self.partial.rename_to(self.final)
            except BaseException:
                old.rename_to(self.final)
                raise
            old.remove()
        release_lock(self.final)
        self._locked = False


def _check_row_blocks(infos: list[RowBlockMeta], n_features: int | None,
                      index_shift: int) -> tuple[np.ndarray, int, bool]:
    """The row bounds, n_features (default: the largest index, less the base, plus one) and whether the rows have
    labels, with the row blocks checked against the index base, n_features and one another."""
    n_rows_blk = np.array([b.n_rows for b in infos], dtype=np.int64)
    row_bounds = np.concatenate([[0], np.cumsum(n_rows_blk)]).astype(np.int64)
    max_raw = max((b.max_index for b in infos), default=-1)
    min_raw = min((b.min_index for b in infos if b.nnz), default=0)
    if index_shift and min_raw < index_shift:
        raise ParameterError(f"index {min_raw} is below the index base {index_shift}")
    needed = max_raw - index_shift + 1
    if n_features is None:
        n_features = max(needed, 0)
    elif needed > n_features:
        raise ParameterError(f"the data has feature index {max_raw} (base {index_shift}) but "
                             f"n_features={n_features}")
    has_y = [b.has_y for b in infos]
    if any(has_y) and not all(has_y):
        raise StoreError("some row blocks have labels and some do not")
    return row_bounds, n_features, bool(all(has_y) and infos)


def _in_scratch(name: str, a: np.ndarray, dtype: Any) -> np.ndarray:
    """``a`` as a C-contiguous array of ``dtype``: itself when it is one, else a copy in scratch memory."""
    if a.dtype == dtype and a.flags.c_contiguous:
        return a
    out = scratch(name, a.size, dtype)
    np.copyto(out, a, casting="unsafe")
    return out


@contextlib.contextmanager
def _timed(timings: dict[str, float], phase: str) -> Iterator[None]:
    t0 = time.perf_counter()
    try:
        yield
    finally:
        timings[phase] = timings.get(phase, 0.0) + time.perf_counter() - t0


def _new_array(g: zarr.Group, name: str, n: int, dtype: Any, chunk: int) -> zarr.Array:
    """An empty 1-D array of ``n`` items laid out as :func:`~dufs.data.store.write_array` writes one, to fill in
    order (:class:`_Streamed`)."""
    return g.create_array(name, shape=(n,), dtype=dtype, chunks=(max(1, min(chunk, n)),), fill_value=0,
                          overwrite=True, compressors=compressors(), config={"write_empty_chunks": True})


class _Streamed:
    """Fills a 1-D Zarr array front to back from pieces of any size, storing each chunk once, whole: memory is one
    chunk, whatever the array's length (no chunk is read back and written again, as a slice across chunks would)."""

    def __init__(self, arr: zarr.Array):
        self.arr = arr
        self.chunk = int(arr.chunks[0])
        self.buf = np.empty(min(self.chunk, arr.shape[0]), dtype=arr.dtype)
        self.at = 0  # items written or buffered

    def append(self, values: np.ndarray) -> None:
        pos = 0
        while pos < values.shape[0]:
            k = self.at % self.chunk
            take = min(self.chunk - k, values.shape[0] - pos)
            self.buf[k:k + take] = values[pos:pos + take]
            pos += take
            self.at += take
            if self.at % self.chunk == 0:
                self.arr[self.at - self.chunk:self.at] = self.buf
        if self.at > self.arr.shape[0]:
            raise StoreError(f"{self.arr.path}: more than its {self.arr.shape[0]} items written")

    def close(self) -> None:
        if self.at != self.arr.shape[0]:
            raise StoreError(f"{self.arr.path}: {self.at} items written of {self.arr.shape[0]}")
        k = self.at % self.chunk
        if k:
            self.arr[self.at - k:self.at] = self.buf[:k]


def _dufs_version() -> str:
    from dufs._version import __version__

    return __version__


def _jsonable(obj: Any) -> Any:
    import json

    return json.loads(json.dumps(obj, default=lambda o: o.item() if hasattr(o, "item") else str(o)))


def _remove_temp_files(loc: Any) -> None:
    """Delete the temporary files a killed writer left in a partial store (they are never part of the store)."""
    try:
        names = loc.fs.find(loc.fspath)
    except FileNotFoundError:
        return
    for name in names:
        if layout.ZARR_TEMP.search(name):
            log.info("removing %s, left by an interrupted write", name)
            loc.fs.rm(name)
