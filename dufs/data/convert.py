"""Streaming libsvm/svmlight ingest into sparse stores (``dufs convert``).

Plain text is split into byte ranges at line boundaries and every range is read, parsed (a numba parser on raw
bytes) and written as one row block by a task on the cluster, so memory is bounded by the block size whatever the
file size. A .bz2 file is split into ranges of its bzip2 blocks that the tasks decompress themselves
(:mod:`dufs.data.bz2blocks`; ``dufs.convert.parallel-bz2``). Other compressed input (.gz, .xz), and a .bz2 file
that does not end with an end-of-stream marker (truncated), is decompressed as one stream on the driver and cut
into blocks of whole lines that are parsed on the cluster, a bounded number in flight. The CSC side is then built
by the store builder's out-of-core transpose.

Every malformed line is reported as ``file:line: what is wrong (byte offset N)``, and a compressed stream that ends
early (a truncated file) or does not decompress as ``file: ... after N bytes of data, line L``; the build is then
removed, so no half-written output is left (a store it was to replace stays as it was). ``on_error="skip"`` drops
bad lines and reports how many and the first few. A ``qid:N`` field after the label is read and ignored, as by
scikit-learn's ``load_svmlight_file``; the lines that had one are counted (``ConvertReport.qid_lines``, and
``qid_lines`` in the store's provenance).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import fsspec
import numpy as np

from dufs import config
from dufs._logging import get_logger
from dufs.data import bz2blocks
from dufs.data._exec import Executor
from dufs.data._fs import Location
from dufs.data._scratch import scratch
from dufs.data.builder import StoreBuilder
from dufs.data.bz2blocks import Bz2Range
from dufs.data.layout import MAX_ABS, IngestRecord, RowBlockMeta
from dufs.data.store import SparseStore
from dufs.data.units import (
    Unit,
    _decompress_error,
    _file_size,
    _is_url,
    _lines_before,
    _parallel_bz2,
    _read_range,
    _units,
)
from dufs.errors import InputFormatError, ParameterError

log = get_logger(__name__)
INT32_MAX = 2**31 - 1


@dataclass
class ConvertReport:
    """What a conversion saw: counts, skipped lines, the index base used."""

    rows: int = 0
    nnz: int = 0
    lines: int = 0
    blank_lines: int = 0
    comment_lines: int = 0
    skipped_lines: int = 0
    skipped: list = field(default_factory=list)  # (file, line, offset, reason) of the first few
    bytes: int = 0
    zero_based: bool = True
    n_features: int = 0
    qid_lines: int = 0  # data lines with a ``qid:N`` field (read and ignored, as scikit-learn's default)
    # seconds by phase: the tasks' ``read`` (text read or decompressed), ``parse``, ``write rows`` and ``spill``,
    # then the transpose's ``transpose read``, ``transpose merge`` and ``transpose write``, summed over tasks; the
    # driver's ``driver: units`` (cutting the input; compressed text that the driver decompresses, its decompression)
    # and ``finalize: ...`` phases (see StoreBuilder.finalize), wall time. Blocks done by an earlier run count 0.
    timings: dict = field(default_factory=dict)


def _parse_and_write(builder: StoreBuilder, unit: Unit, path: str, payload: Any, opts: dict) -> dict:
    """Task: parse one unit and write it as a row block. Returns counts, or the first error (nothing written)."""
    from dufs.kernels.libsvm import count_lines_and_entries, error_message, parse_block

    t0 = time.perf_counter()
    base = unit.start
    if isinstance(payload, Bz2Range):
        base = 0
        try:
            payload = bz2blocks.range_text(path, payload)
        except (OSError, EOFError, ValueError) as exc:  # corrupt (or a block magic found by chance): see the driver
            return {"block": unit.block, "unit": unit, "n_lines": 0, "n_blank": 0, "n_comment": 0, "n_skipped": 0,
                    "bytes": 0, "skipped": [], "error": None, "decompress": " ".join(str(exc).split())}
    buf = _read_range(path, unit.start, unit.stop) if payload is None else np.frombuffer(payload, np.uint8)
    t1 = time.perf_counter()
    counts = count_lines_and_entries(buf)  # the parser's entries in scratch memory too, counted once
    n = counts[1]
    pb = parse_block(buf, skip_errors=opts["skip"], max_recorded=10, index_limit=INT32_MAX, allow_qid=True,
                     buffers=(scratch("parsed indices", n, np.int64), scratch("parsed values", n, np.float64)),
                     counts=counts)
    timings = {"read": t1 - t0, "parse": time.perf_counter() - t1}
    skipped = [(int(a), int(b), error_message(int(c))) for a, b, c in
               zip(pb.skipped_lines, pb.skipped_offsets, pb.skipped_codes, strict=True)]
    res = {"block": unit.block, "unit": unit, "n_lines": pb.n_lines, "n_blank": pb.n_blank,
           "n_comment": pb.n_comment, "n_skipped": pb.n_skipped, "bytes": int(buf.size),
           "skipped": skipped, "error": None, "timings": timings}
    data = scratch("values", pb.data.size, builder.value_dtype)
    with np.errstate(over="ignore", invalid="ignore"):
        np.copyto(data, pb.data, casting="unsafe")
    indptr, indices, labels, row_lines, row_qid = pb.indptr, pb.indices, pb.labels, pb.row_lines, pb.row_qid
    # the rows before a parse error come first: a line that breaks the options there is the first bad line
    bad = _option_errors(pb, data, opts)
    if bad and not opts["skip"]:
        row = min(bad)
        line = int(row_lines[row])
        res["error"] = (line, base + _line_start(buf, line), bad[row])
        return res
    if pb.error_code:
        res["error"] = (int(pb.error_line), base + int(pb.error_offset), error_message(int(pb.error_code)))
        return res
    max_index_line = int(pb.max_index_line)
    if bad:  # on_error="skip": drop the rows that break the options, as the parser drops malformed lines
        keep = np.ones(labels.shape[0], dtype=bool)
        keep[list(bad)] = False
        entry_keep = np.repeat(keep, np.diff(indptr))
        indptr = np.concatenate([[0], np.cumsum(np.diff(indptr)[keep])]).astype(np.int64)
        indices, data, labels, row_lines = indices[entry_keep], data[entry_keep], labels[keep], row_lines[keep]
        row_qid = row_qid[keep]
        max_index_line = -1
        if indices.size:
            first = int(np.argmax(indices == indices.max()))
            max_index_line = int(row_lines[np.searchsorted(indptr, first, side="right") - 1])
        more = [(int(pb.row_lines[r]), _line_start(buf, int(pb.row_lines[r])), why) for r, why in bad.items()]
        skipped = sorted(skipped + more)[:10]
        res.update(n_skipped=pb.n_skipped + len(bad), skipped=skipped)
    info = builder.write_row_block(
        unit.block, indptr, indices - 1 if opts["zero_based"] is False else indices, data, labels,
        raw_indices=opts["zero_based"] == "auto",
        extra=IngestRecord(n_lines=pb.n_lines, n_blank=pb.n_blank, n_comment=pb.n_comment,
                           n_skipped=res["n_skipped"], n_qid=int(np.count_nonzero(row_qid)), bytes=int(buf.size),
                           max_index_line=max_index_line, skipped=[list(s) for s in skipped],
                           unit=[unit.file, unit.start, unit.stop]).attrs(), timings=timings)
    res.update(n_rows=info.n_rows, nnz=info.nnz, min_index=info.min_index, max_index=info.max_index,
               max_index_line=max_index_line, n_qid=int(np.count_nonzero(row_qid)))
    return res


def _option_errors(pb: Any, data: np.ndarray, opts: dict) -> dict[int, str]:
    """Rows that break the options (index 0 when one-based, index beyond n_features, values beyond the dtype).

    Returns {row: reason} (the first reason of each bad row).
    """
    checks = []
    if opts["zero_based"] is False:
        checks.append((pb.indices == 0, "feature index 0 in one-based data (if the file is zero-based, pass "
                                        "zero_based=True, --zero-based true)"))
    if opts["n_features"] is not None and opts["zero_based"] != "auto":
        lim = opts["n_features"] + (0 if opts["zero_based"] else 1)
        checks.append((pb.indices >= lim, f"feature index beyond n_features={opts['n_features']}"))
    if data.size and not np.isfinite(data).all():
        checks.append((~np.isfinite(data), f"value out of range for {data.dtype}"))
    if data.dtype == np.float64 and data.size:  # float32 holds no value beyond MAX_ABS
        with np.errstate(invalid="ignore"):
            big = np.abs(data) > MAX_ABS
        if big.any():
            checks.append((big, f"value beyond {MAX_ABS:.0e} in magnitude (its square, and the feature's variance "
                                f"and every distance it enters, overflow float64: scale the data down)"))
    bad: dict[int, str] = {}
    for mask, why in checks:
        hits = np.flatnonzero(mask)
        if hits.size:
            for row in np.unique(np.searchsorted(pb.indptr, hits, side="right") - 1).tolist():
                bad.setdefault(int(row), why)
    return bad


def _line_start(buf: np.ndarray, line: int) -> int:
    """Byte offset in ``buf`` where its (1-based) ``line`` starts."""
    if line <= 1:
        return 0
    return int(np.flatnonzero(buf == 10)[line - 2]) + 1


def _check_options(zero_based: Any, n_features: Any, on_error: str, block_bytes: int) -> None:
    if zero_based not in (True, False, "auto"):
        raise ParameterError(f"The 'zero_based' parameter of convert_libsvm must be True, False or 'auto'; "
                             f"got {zero_based!r}.")
    if n_features is not None and (not isinstance(n_features, (int, np.integer)) or not
                                   0 <= n_features <= INT32_MAX + 1):
        raise ParameterError(f"The 'n_features' parameter of convert_libsvm must be an int in [0, 2**31] or "
                             f"None; got {n_features!r}.")
    if on_error not in ("raise", "skip"):
        raise ParameterError(f"The 'on_error' parameter of convert_libsvm must be 'raise' or 'skip'; "
                             f"got {on_error!r}.")
    if block_bytes < 1:
        raise ParameterError(f"The 'block_bytes' parameter of convert_libsvm must be >= 1; got {block_bytes}.")


def convert_libsvm(inputs: str | os.PathLike | list, output: str | os.PathLike | list, *,
                   zero_based: bool | Literal["auto"] = "auto", n_features: int | None = None,
                   on_error: Literal["raise", "skip"] = "raise", value_dtype: Any = None,
                   resume: bool = False, overwrite: bool = False, block_bytes: int | str | None = None,
                   client: Any = None, progress: Callable[[dict], None] | None = None,
                   ) -> tuple[SparseStore | list[SparseStore], ConvertReport]:
    """Convert libsvm/svmlight text files (plain, .bz2, .gz, .xz) into dufs stores.

    Parameters
    ----------
    inputs : path or list of paths
        Local paths or fsspec URLs.
    output : path or list of paths
        One store (all inputs appended, in order) or one store per input (same length as ``inputs``; the
        stores then share the index base and ``n_features``, as ``sklearn.datasets.load_svmlight_files``).
    zero_based : True, False or "auto"
        As scikit-learn: "auto" means zero-based if any index 0 occurs in any input, else one-based.
    n_features : int, optional
        Number of features; an index beyond it is an error. Default: the largest index seen, plus one.
    on_error : "raise" or "skip"
        Raise on the first malformed line (naming ``file:line``), or skip malformed lines and count them.
    resume : bool
        Finish an interrupted conversion of the same inputs with the same options.
    overwrite : bool
        Replace a dufs store at the output, once the new one is complete (until then the old one stays readable
        as it was), and discard an interrupted conversion's partial store instead of asking for ``resume``.
        Anything at the output that is not a dufs store (a file, a directory of other files) is refused with a
        :class:`~dufs.errors.StoreError` before any work, and left untouched.
    block_bytes : int or str
        Bytes of text per row block (default ``dufs.convert.block-bytes``).
    client : distributed.Client, optional
        Where to run the parse tasks (default: the active client, else local threads).
    progress : callable, optional
        Called with a dict (``rows``, ``bytes``, ``total_bytes``, ``stage``) as blocks finish.

    Returns
    -------
    (store or list of stores, ConvertReport)

    Raises
    ------
    InputFormatError
        A malformed line (``file:line: what is wrong (byte offset N)``), a compressed input that ends early
        (``file: compressed stream ends early (truncated file?) after N bytes of data, line L; ...``) or does not
        decompress, or no data lines; nothing of the conversion is left behind.
    StoreError
        An output that must not be written (see ``overwrite``), or an unfinished conversion in the way.
    """
    ins, outs, many, block_bytes = _arguments(inputs, output, zero_based, n_features, on_error, value_dtype,
                                              block_bytes)
    store_of = list(range(len(ins))) if many else [0] * len(ins)
    opts = {"skip": on_error == "skip", "zero_based": zero_based, "n_features": n_features}
    in_ranges = [_parallel_bz2(p, block_bytes) for p in ins]
    builders = _builders(ins, outs, many, store_of, in_ranges, value_dtype, overwrite, resume,
                         {"zero_based": zero_based, "n_features": n_features, "on_error": on_error,
                          "block_bytes": block_bytes})
    begun, fresh = [], []  # the builders begun; those begun here, not resumed
    report = ConvertReport()
    for b in builders:  # every output refused before any is begun (nothing written, nothing replaced)
        b.check_target()
    ex = Executor(client)
    try:
        done = _begin(builders, begun, fresh)
        total = sum(_file_size(p) for p in ins)
        _run_units(ins, store_of, builders, done, opts, block_bytes, ex, report, progress, total, in_ranges)
        infos = [b.row_block_infos() for b in builders]
        zb, shift, nf = _index_base(builders, infos, ins, store_of, zero_based, n_features)
        report.zero_based, report.n_features = bool(zb), int(nf)
        stores = _finalize(builders, infos, ins, store_of, nf, shift, zb, ex, report, progress)
        return (stores if many else stores[0]), report
    except InputFormatError:
        for b in begun:
            b.abort(remove=True)
        raise
    except BaseException:
        for b in begun:  # keep the partial store for --resume (unless nothing was written), release the lock
            b.abort(remove=b in fresh and len(begun) < len(builders))
        raise
    finally:
        ex.close()


#: what ``dufs convert`` reads, for the messages about files of other formats
LIBSVM_TEXT = ("libsvm/svmlight text, lines of 'label index:value index:value ...' (plain, .bz2, .gz or .xz)")


def foreign_format(path: str) -> str | None:
    """A one-line message when ``path`` (that failed to parse) is a MATLAB ``.mat`` file or looks like CSV, saying
    what dufs reads and how to load it instead; None when it looks like neither (or cannot be read)."""
    import re

    try:
        with fsspec.open(path, "rb", compression="infer") as f:
            head = f.read(1 << 16)
    except Exception:  # noqa: BLE001 - a guess for a better message only: the parse error stands
        return None
    if (head.startswith(b"MATLAB ") and b"MAT-file" in head[:128]) or path.lower().endswith(".mat"):
        return (f"{path} is a MATLAB .mat file, not {LIBSVM_TEXT}: load it with scipy.io.loadmat (v7.3 files: "
                f"h5py) and give the matrix and labels to dufs.fit(X, y, ...) or dufs.write_store(X, OUT, y)")
    if head.startswith(b"\x89HDF"):
        return (f"{path} is an HDF5 file (a MATLAB v7.3 .mat file?), not {LIBSVM_TEXT}: load it with h5py and "
                f"give the matrix and labels to dufs.fit(X, y, ...) or dufs.write_store(X, OUT, y)")
    for raw in head.splitlines():
        line = raw.split(b"#", 1)[0].strip()
        if not line:
            continue
        if b"," in line and not any(re.fullmatch(rb"\d+:\S+", t) for t in line.split()):
            return (f"{path} looks like CSV (comma-separated values), not {LIBSVM_TEXT}: read it with pandas or "
                    f"numpy and give it to dufs.fit(X, y, ...) or dufs.write_store(X, OUT, y)")
        return None
    return None


def _arguments(inputs: Any, output: Any, zero_based: Any, n_features: Any, on_error: str, value_dtype: Any,
               block_bytes: Any) -> tuple[list[str], list[str], bool, int]:
    """convert_libsvm's arguments checked: the input paths (local ones made absolute), the outputs, whether there
    is one output per input, and the block size in bytes."""
    # local paths made absolute here: the tasks that read them run on workers whose working directory may be another
    # (`dask worker` processes started elsewhere); a relative name read there was another file, or none
    ins = [p if _is_url(p) else os.path.abspath(p)
           for p in (os.fspath(q) for q in (inputs if isinstance(inputs, (list, tuple)) else [inputs]))]
    many = isinstance(output, (list, tuple))
    outs = [os.fspath(p) for p in (output if many else [output])]
    if not ins:
        raise ParameterError("The 'inputs' parameter of convert_libsvm must name at least one file; got none.")
    if many and len(outs) != len(ins):
        raise ParameterError(f"{len(ins)} inputs but {len(outs)} outputs: give one output, or one per input")
    first: dict[str, int] = {}
    for i, o in enumerate(outs):  # one store twice: its second build found the first's, begun by this very process
        j = first.setdefault(o if _is_url(o) else os.path.abspath(o), i)
        if j != i:
            raise ParameterError(f"{ins[j]} and {ins[i]} are both to be converted to {o}: give one output per input")
    block_bytes = config.parse_bytes(block_bytes or config.get("convert.block-bytes"))
    _check_options(zero_based, n_features, on_error, block_bytes)
    try:
        np.dtype(value_dtype)
    except TypeError:
        raise ParameterError(f"The 'value_dtype' parameter of convert_libsvm must be a float dtype; "
                             f"got {value_dtype!r}.") from None
    for p in ins:
        fs, fp = fsspec.core.url_to_fs(p)
        if not fs.exists(fp):
            raise ParameterError(f"{p}: no such file")
    return ins, outs, many, block_bytes


def _builders(ins: list[str], outs: list[str], many: bool, store_of: list[int], in_ranges: list, value_dtype: Any,
              overwrite: bool, resume: bool, given: dict) -> list[StoreBuilder]:
    """One builder per output, its options (what a resume must match) recorded: ``given`` is the options as
    passed (zero_based, n_features, on_error, block_bytes)."""
    builders = []
    for s, out in enumerate(outs):
        mine = [(p, r) for p, r, k in zip(ins, in_ranges, store_of, strict=False) if k == s]
        # a .bz2 input read in ranges of its bzip2 blocks is cut into other row blocks than one decompressed on
        # the driver: a resume must cut it the same way
        options = {"inputs": [[Location.of(p).url, _file_size(p), *(["bz2 ranges"] * r)] for p, r in mine],
                   **given, "together_with": [Location.of(o).url for o in outs] if many else None}
        b = StoreBuilder(out, value_dtype=value_dtype, overwrite=overwrite, resume=resume, options=options)
        b.options["value_dtype"] = str(b.value_dtype)  # a resume must write the same dtype
        builders.append(b)
    return builders


def _begin(builders: list[StoreBuilder], begun: list[StoreBuilder], fresh: list[StoreBuilder]) -> list:
    """Begin every build (``begun``; ``fresh``: those begun here, not resumed); the row blocks each has already."""
    done = []
    for b in builders:
        new = not b.partial.exists()
        done.append(b.begin())
        begun.append(b)
        if new:
            fresh.append(b)
    return done


def _index_base(builders: list[StoreBuilder], infos: list[list[RowBlockMeta]], ins: list[str], store_of: list[int],
                zero_based: Any, n_features: int | None) -> tuple[bool, int, int]:
    """The index base and n_features, over every input together (as load_svmlight_files), and the shift of the
    "auto" blocks' indices. Raises on a store of no rows or an index beyond n_features."""
    for s, inf in enumerate(infos):  # a store of no rows: empty input, or only comments and blank lines
        if not sum(blk.n_rows for blk in inf):
            mine = [p for p, k in zip(ins, store_of, strict=False) if k == s]
            n_skipped = sum(_record(blk).n_skipped for blk in inf)
            why = f" ({n_skipped:,} bad line{'' if n_skipped == 1 else 's'} skipped)" if n_skipped else ""
            foreign = next((m for m in map(foreign_format, mine) if m), None) if n_skipped else None
            raise InputFormatError(foreign or f"no data lines in {', '.join(mine)}{why}", path=mine[0])
    all_blocks = [blk for inf in infos for blk in inf if blk.nnz]
    min_idx = min((blk.min_index for blk in all_blocks), default=1)
    zb = zero_based if zero_based != "auto" else (min_idx == 0)
    # blocks of a known base were shifted as they were parsed; "auto" blocks are shifted at finalize
    shift = (0 if zb else 1) if zero_based == "auto" else 0
    max_idx = max((blk.max_index for blk in all_blocks), default=-1)
    nf = n_features if n_features is not None else max(max_idx - shift + 1, 0)
    if max_idx - shift >= nf:
        max_idx_text = max_idx + (0 if zb or zero_based == "auto" else 1)
        s, inf = next((s, inf) for s, inf in enumerate(infos) for blk in inf if blk.max_index == max_idx)
        blk = next(blk for blk in inf if blk.max_index == max_idx)
        f, line = _global_line(builders[s], inf, blk, ins, store_of, s)
        raise InputFormatError(f"{f}:{line}: feature index {max_idx_text} is beyond n_features={nf} "
                               f"({'zero' if zb else 'one'}-based)", path=f, line=line)
    return zb, shift, nf


def _finalize(builders: list[StoreBuilder], infos: list[list[RowBlockMeta]], ins: list[str], store_of: list[int],
              nf: int, shift: int, zb: bool, ex: Executor, report: ConvertReport,
              progress: Callable[[dict], None] | None) -> list[SparseStore]:
    """Finalize every store (the transpose, the move into place), with the conversion's provenance."""
    stores = []
    for s, b in enumerate(builders):
        mine = [p for p, k in zip(ins, store_of, strict=False) if k == s]
        stores.append(b.finalize(  # rows of labels only (no index at all) need no shift
            n_features=nf, index_shift=shift if any(blk.nnz for blk in infos[s]) else 0, executor=ex,
            provenance={"source": "libsvm", "inputs": [Location.of(p).url for p in mine],
                        "zero_based": bool(zb), "lines": report.lines, "qid_lines": report.qid_lines,
                        "skipped_lines": report.skipped_lines, "skipped": report.skipped[:10]},
            progress=(lambda stage, k, n: progress({"stage": stage, "done": k, "total": n}))
            if progress else None, timings=report.timings))
    return stores


def _record(blk: RowBlockMeta) -> IngestRecord:
    """What the parse of a written row block saw."""
    return IngestRecord.from_attrs(blk.extra)


def _global_line(b: StoreBuilder, infos: list[RowBlockMeta], blk: RowBlockMeta, ins: list[str], store_of: list[int],
                 s: int) -> tuple[str, int]:
    rec = _record(blk)
    file_no = rec.unit[0]
    before = sum(r.n_lines for r in map(_record, infos) if r.unit[0] == file_no and r.unit[1] < rec.unit[1])
    return ins[file_no], before + int(rec.max_index_line)


def _run_units(ins, store_of, builders, done, opts, block_bytes, ex, report, progress, total, in_ranges) -> None:
    """Parse and write every unit of every input not written before (``done``: by store), counting into ``report``;
    the first bad line of all raises, once every task in flight has ended."""
    run = _UnitRun(store_of, builders, opts, block_bytes, ex, report, progress, total)
    try:
        run.submit_all(ins, done, in_ranges)
        while run.in_flight:
            run.collect(next(iter(ex.as_completed(list(run.in_flight)))))
    except InputFormatError:
        # a compressed stream that ends early or is corrupt (a bad line has drained in_flight already): every
        # block in flight comes before that point and may hold a bad line, which is then the error; and the partial
        # store is removed next, so the tasks writing into it must end first
        errors = run.drain()
        if errors:
            try:
                run.fail(*min(errors, key=lambda e: (e[0].file, e[0].start)))
            except InputFormatError as first:
                raise first from None
        raise
    except BaseException:
        ex.cancel(list(run.in_flight))
        raise
    run.number_skipped()


class _UnitRun:
    """The parse tasks of one conversion: submitted in order, a bounded number in flight, their counts summed into
    the report as they finish, and the sizes of the finished units kept to number lines without re-reading."""

    def __init__(self, store_of, builders, opts, block_bytes, ex, report, progress, total) -> None:
        self.store_of, self.builders, self.opts, self.block_bytes = store_of, builders, opts, block_bytes
        self.ex, self.report, self.progress, self.total = ex, report, progress, total
        self.in_flight: dict = {}
        self.max_in_flight = max(2, ex.n_workers * int(config.get("convert.in-flight")))
        self.sizes: dict = {}  # (file, start) -> (lines, bytes) of that unit, to number lines without re-reading
        # the first few skipped lines by position: (file, start, offset, unit, path, line, why)
        self.first_skipped: list = []

    def submit_all(self, ins: list[str], done: list, in_ranges: list) -> None:
        """Cut every input into units, in order; submit those not written before, count the others."""
        report, store_of = self.report, self.store_of
        next_block = [0] * len(self.builders)
        for k, path in enumerate(ins):
            s = store_of[k]
            units = _units(path, k, self.block_bytes, next_block[s], in_ranges[k])
            while True:
                t0 = time.perf_counter()  # cutting the input; for compressed text, the driver's decompression
                u, payload = next(units, (None, None))
                report.timings["driver: units"] = report.timings.get("driver: units", 0.0) + time.perf_counter() - t0
                if u is None:
                    break
                next_block[s] = u.block + 1
                if u.block in done[s]:
                    self.account(_done_counts(self.builders[s], u.block), u, path)
                    continue
                self.submit(u, path, payload)

    def before(self, unit: Unit) -> tuple[int, int]:
        """Lines and bytes of the units before ``unit`` in its file (every one of them has finished)."""
        got = [v for (f, st), v in self.sizes.items() if f == unit.file and st < unit.start]
        return sum(v[0] for v in got), sum(v[1] for v in got)

    def drain(self) -> list:
        """Wait for every task in flight; the (unit, path, result) of those that found a bad line."""
        errors = []
        for f in self.ex.as_completed(list(self.in_flight)):
            u, p = self.in_flight.pop(f)
            try:
                rr = f.result()
            except BaseException:  # noqa: BLE001 - cancelled, or failed: either way it no longer writes
                continue
            if rr["error"] is not None or rr.get("decompress"):
                errors.append((u, p, rr))
            else:
                self.sizes[(u.file, u.start)] = (rr["n_lines"], rr["bytes"])
        return errors

    def collect(self, fut) -> None:
        """Account a finished task, or fail on its bad line."""
        unit, path = self.in_flight.pop(fut)
        r = fut.result()
        if r["error"] is not None or r.get("decompress"):
            self.fail(unit, path, r)
        self.account(r, unit, path)

    def fail(self, unit: Unit, path: str, r: dict) -> None:
        """Raise the first bad line of all, as ``file:line: why (byte offset N)``."""
        # Wait for the tasks still in flight: they write into the partial store, which is removed next. Report
        # the first bad line of all (every unit before the failed ones was submitted, in order).
        if self.ex.client is None:
            self.ex.cancel(list(self.in_flight))  # drops only the queued ones; a running thread cannot be stopped
        errors = [(unit, path, r), *self.drain()]
        unit, path, r = min(errors, key=lambda e: (e[0].file, e[0].start))
        if r.get("decompress"):
            _decompress_error(path, self.block_bytes, r["decompress"])
        line, offset, why = r["error"]
        if unit.relative:
            lines, offset0 = self.before(unit)
            first, offset = lines + 1, offset + offset0
        else:
            first = unit.first_line if unit.first_line > 0 else _lines_before(path, unit.start) + 1
        gl = first + line - 1
        where = f" (byte offset {offset})" if offset is not None else ""
        foreign = foreign_format(path) if gl <= 10 else None  # a file of another format fails on its first lines
        raise InputFormatError(foreign or f"{path}:{gl}: {why}{where}", path=path, line=gl, offset=offset,
                               reason=why)

    def account(self, r: dict, unit: Unit, path: str) -> None:
        """Add a unit's counts to the report, keep its first skipped lines, report progress."""
        report = self.report
        report.rows += r.get("n_rows", 0)
        report.nnz += r.get("nnz", 0)
        report.lines += r["n_lines"]
        report.blank_lines += r["n_blank"]
        report.comment_lines += r["n_comment"]
        report.skipped_lines += r["n_skipped"]
        report.qid_lines += r.get("n_qid", 0)
        report.bytes += r["bytes"]
        for phase, dt in r.get("timings", {}).items():
            report.timings[phase] = report.timings.get(phase, 0.0) + dt
        self.sizes[(unit.file, unit.start)] = (r["n_lines"], r["bytes"])
        if r["skipped"]:  # blocks finish in any order: keep the first few by position in the input
            self.first_skipped.extend((unit.file, unit.start, off, unit, path, line, why)
                                      for line, off, why in r["skipped"])
            self.first_skipped.sort(key=lambda e: e[:3])
            del self.first_skipped[10:]
        if self.progress:
            self.progress({"stage": "parse", "rows": report.rows, "bytes": report.bytes, "total_bytes": self.total})

    def submit(self, unit: Unit, path: str, payload: Any) -> None:
        """Submit a unit's parse task, once fewer than the limit are in flight."""
        # byte ranges of plain files and ranges of bzip2 blocks carry no data (workers read them): queue them all
        # on the scheduler; blocks of decompressed text are held in memory until parsed: keep only a few in flight
        limit = self.max_in_flight if isinstance(payload, bytes) else 64 * self.max_in_flight
        while len(self.in_flight) >= limit:
            self.collect(next(iter(self.ex.as_completed(list(self.in_flight)))))
        fut = self.ex.submit(_parse_and_write, self.builders[self.store_of[unit.file]], unit, path, payload,
                             self.opts)
        self.in_flight[fut] = (unit, path)

    def number_skipped(self) -> None:
        """Every unit is done: number the skipped lines (the lines of the units before them, in the same file)."""
        for _, _, off, unit, path, line, why in self.first_skipped:
            if unit.first_line > 0:
                first, offset = unit.first_line, unit.start + off
            else:
                lines, base = self.before(unit)
                first, offset = lines + 1, (base if unit.relative else unit.start) + off
            self.report.skipped.append((path, first + line - 1, offset, why))


def _done_counts(b: StoreBuilder, i: int) -> dict:
    """The counts of row block ``i``, written before a resume, as a parse task returns them."""
    blk = b.row_block_meta(i)
    rec = _record(blk)
    return {"n_rows": blk.n_rows, "nnz": blk.nnz, "n_lines": rec.n_lines, "n_blank": rec.n_blank,
            "n_comment": rec.n_comment, "n_skipped": rec.n_skipped, "n_qid": rec.n_qid, "bytes": rec.bytes,
            "skipped": [tuple(x) for x in rec.skipped]}
