"""Streaming reader of torch.profiler (Kineto) rank dirs into ``ClusterEvidence`` (I/O: reads files).

Traces are parsed with ijson (C backend when installed), one event at a time, so a multi-GB trace never sits in
RAM: only the columns :class:`profwatch.core.verdict.kineto.RankTrace` keeps (about 16 bytes per compute event) do.
Format: Chrome trace JSON as Kineto writes it (``{"distributedInfo": {"rank": ...}, "traceEvents": [{"ph": "X",
"name", "cat", "ts", "dur", "pid", "tid", "args"}, ...]}``, µs), optionally gzip-compressed (``.json.gz``), the
input HTA reads. Rank dir layout (``docs/architecture.md``): ``*_torch_pt/`` with ``*.pt.trace.json``,
``profiler_info_{rank}.json`` and ``trace.done``.
"""

from __future__ import annotations

import gzip
import json
import time
from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import ijson
import ijson.backends.python as ijson_python

from profwatch.adapters.tools.rank_prefetch import RankPrefetcher
from profwatch.core.verdict.evidence import ClusterEvidence, RecipeStatus
from profwatch.core.verdict.kineto import (
    CPU_COMPUTE_CATS,
    DEVICE_CATS,
    MEMORY_CATS,
    RankTrace,
    collective_class,
    is_step_marker,
    parse_step,
    summarize_traces,
)

RECIPE = "kineto_breakdown"
OP_COMPARE = "kineto_op_compare"
"""The torch.profiler follow-up (enrich phase): each suspect's ops against a reference rank's."""


class TraceFormatError(ValueError):
    """A trace file is not a readable Kineto Chrome trace (truncated JSON, no ``traceEvents``)."""


def _overflow(exc: BaseException) -> bool:
    """True for the C parser's (yajl) refusal of an integer beyond 64 bits, which the pure-Python backend reads."""
    return "integer overflow" in str(exc)


def _events(path: Path) -> Iterator[Any]:
    """The ``traceEvents`` items of a trace, streamed with ijson's fastest backend (yajl2_c). A trace holding an integer
    beyond int64 anywhere (real NCCL traces carry ``"Comms Id": 10159970886766084423`` in ``args``; HTA's parser
    falls back the same way) is read again from the start with ijson's pure-Python backend, which reads integers
    of any size (slower, still streaming) by the callers (:func:`read_rank_trace`, :func:`op_totals`,
    :func:`_header_rank`), which drop what the first pass had built.

    Raises:
        ijson.JSONError / IncompleteJSONError, OSError, EOFError, UnicodeDecodeError: as ijson and gzip do.
    """
    with _open(path) as fh:
        yield from ijson.items(fh, "traceEvents.item", use_float=True)


def _events_python(path: Path) -> Iterator[Any]:
    with _open(path) as fh:
        yield from ijson_python.items(fh, "traceEvents.item", use_float=True)


def _tokens(path: Path, *, python: bool = False) -> Iterator[tuple[str, str, Any]]:
    with _open(path) as fh:
        yield from (ijson_python if python else ijson).parse(fh)


@contextmanager
def _open(path: Path) -> Iterator[IO[bytes]]:
    """Open a trace as bytes, transparently gunzipping ``*.gz``."""
    fh: IO[bytes] = gzip.open(path, "rb") if path.suffix == ".gz" else path.open("rb")  # type: ignore[assignment]  # noqa: SIM115
    try:
        yield fh
    finally:
        fh.close()


def find_trace_files(rank_dir: Path) -> list[Path]:
    """Kineto traces in a rank dir (``*.pt.trace.json`` / ``.json.gz``, also one level down), sorted."""
    pats = ("*.pt.trace.json", "*.pt.trace.json.gz")
    found = [p for pat in pats for p in rank_dir.glob(pat)] + [p for pat in pats for p in rank_dir.glob("*/" + pat)]
    return sorted(set(found))


def _header_rank(path: Path) -> int | None:
    """``distributedInfo.rank`` from the trace header, scanning tokens only until ``traceEvents`` starts.

    Kineto writes ``distributedInfo`` before ``traceEvents``; if it does not, the rank is looked up by a full
    token scan (slower, still streaming).
    """
    try:
        return _scan_rank(path, python=False)
    except ijson.JSONError as exc:
        if not _overflow(exc):
            raise
    return _scan_rank(path, python=True)


def _scan_rank(path: Path, *, python: bool) -> int | None:
    for prefix, event, value in _tokens(path, python=python):
        if prefix == "distributedInfo.rank" and event == "number":
            return int(value)
        if prefix == "traceEvents" and event == "start_array":
            break
    for prefix, event, value in _tokens(path, python=python):
        if prefix == "distributedInfo.rank" and event == "number":
            return int(value)
    return None


def read_rank_trace(path: Path, *, rank: int | None = None) -> RankTrace:
    """Stream one Kineto trace into a :class:`RankTrace`.

    Args:
        path: ``*.pt.trace.json`` or ``*.json.gz``.
        rank: the rank when known (else ``distributedInfo.rank``, else 0).

    Raises:
        TraceFormatError: truncated or malformed JSON, or no ``traceEvents`` array.
    """
    try:
        if rank is None:
            rank = _header_rank(path)
        try:
            tr, n_items = _fill(path, rank, _events(path))
        except ijson.JSONError as exc:
            if not _overflow(exc):
                raise
            tr, n_items = _fill(path, rank, _events_python(path))  # the first pass's partial trace is dropped
    except (ijson.JSONError, ijson.IncompleteJSONError, OSError, EOFError, UnicodeDecodeError) as exc:
        raise TraceFormatError(f"{path}: {exc}") from exc
    if n_items == 0:
        raise TraceFormatError(f"{path}: no traceEvents")
    return tr


def _fill(path: Path, rank: int | None, events: Iterator[Any]) -> tuple[RankTrace, int]:
    tr = RankTrace(rank if rank is not None else 0)
    n_items = 0
    for ev in events:
        n_items += 1
        if not isinstance(ev, dict) or ev.get("ph") != "X":
            continue
        ts, dur = ev.get("ts"), ev.get("dur", 0.0)
        if not isinstance(ts, (int, float)) or not isinstance(dur, (int, float)):
            continue
        tr.add_event(str(ev.get("name", "")), str(ev.get("cat", "")), float(ts), float(dur))
    return tr, n_items


TraceFile = tuple[str, int, int]
"""``(path relative to the rank dir, mtime_ns, size)`` of the trace a rank was judged on."""


@dataclass(frozen=True, slots=True)
class TraceRead:
    """One rank's trace parsed ahead of its batch's analysis (:class:`TracePrefetcher`): the file it was read from,
    its header rank (``distributedInfo.rank``) and the parsed :class:`RankTrace`."""

    file: TraceFile
    header: int | None
    trace: RankTrace


def _newest_trace(rank_dir: Path) -> Path | None:
    """The newest trace of ``rank_dir`` (the first of equal mtimes in :func:`find_trace_files` order); a file that
    cannot be stat'ed (deleted since it was listed, a dangling link) is not one. None without any."""
    best: tuple[float, Path] | None = None
    for p in find_trace_files(rank_dir):
        try:
            mtime = p.stat().st_mtime
        except OSError:
            continue
        if best is None or mtime > best[0]:
            best = (mtime, p)
    return best[1] if best is not None else None


def _trace_file(rank_dir: Path, path: Path) -> TraceFile:
    st = path.stat()
    return path.relative_to(rank_dir).as_posix(), st.st_mtime_ns, st.st_size


def read_trace_ahead(rank: int, rank_dir: Path) -> TraceRead:
    """Parse the trace :func:`analyze_torch_batch` would judge ``rank`` on (the newest in ``rank_dir``), as it
    would, noting which file that was.

    Raises:
        TraceFormatError: no trace, a malformed one, or one that changed while it was read.
        OSError: the dir or file cannot be read.
        (The analysis then reads the rank itself and words the failure.)
    """
    path = _newest_trace(rank_dir)
    if path is None:
        raise TraceFormatError(f"no *.pt.trace.json in {rank_dir}")
    file = _trace_file(rank_dir, path)
    header = _header_rank(path)
    trace = read_rank_trace(path, rank=rank)
    if _trace_file(rank_dir, path) != file:
        raise TraceFormatError(f"{path}: changed while it was read")
    return TraceRead(file, header, trace)


class TracePrefetcher(RankPrefetcher[TraceRead]):
    """Parses each torch.profiler rank's trace once, as soon as the capture's scan sees its rank dir finished
    (``trace.done``), on a pool of ``workers`` threads while the other ranks still write theirs
    (``rank_prefetch.RankPrefetcher``); :meth:`take` hands a capture's reads (rank dir path -> :class:`TraceRead`)
    to its analysis (``analyze_torch_batch(prefetched=...)``, which re-reads a rank whose trace file changed)."""

    def __init__(self, workers: int = 4, max_captures: int = 8) -> None:
        super().__init__(read_trace_ahead, workers, max_captures, thread_name="profwatch-traces")


def analyze_torch_batch(rank_dirs: Mapping[int, Path], *, armed_steps: Sequence[int] | None = None,
                        prefetched: Mapping[int, TraceRead] | None = None) -> ClusterEvidence:
    """Kineto breakdown of one staged torch_pt batch.

    Args:
        rank_dirs: rank -> rank dir (one trace per dir; the newest when several).
        armed_steps: the ``ProfilerStep#`` labels the capture was armed to record, when profwatch armed it (step
            alignment pairs ranks that recorded exactly those at any clock offset: ``summarize_traces``).
        prefetched: rank -> its trace parsed ahead (:class:`TracePrefetcher`; the staged dir links the same
            files): used when the file this call would read is the one it was parsed from (same relative path,
            mtime and size) and the rank matches, else parsed here. The result is the same either way.

    Returns:
        ``ClusterEvidence(kind="torch_pt")`` with summaries, ``unusable_ranks`` (rank -> why: no trace, trace
        cannot be parsed, steps not alignable), ``alignment`` (how steps were aligned across ranks) and a
        ``kineto_breakdown`` recipe status: ``ok`` when at least two ranks could be compared (the others are
        ``unusable_ranks``, which makes the analysis ``partial``) or when the batch is one rank with steps (a
        single-device job: its breakdown, judged ``not_applicable`` by ``overall_status``: no peer), ``no_data``
        (no steps/traces) or
        ``tool_error`` (fewer than two readable traces, some unreadable). A trace whose header
        (``distributedInfo.rank``) names another rank than its rank dir is used as the dir's rank, with a note.
        Never raises for bad data.
    """
    t0 = time.monotonic()
    traces: dict[int, RankTrace] = {}
    unusable: dict[int, str] = {}
    notes: list[str] = []
    paths: dict[int, str] = {}
    for rank, rdir in sorted(rank_dirs.items()):
        path = _newest_trace(Path(rdir))
        if path is None:
            unusable[rank] = f"no *.pt.trace.json in {rdir}"
            continue
        ahead = (prefetched or {}).get(rank)
        try:
            if ahead is not None and ahead.trace.rank == rank and ahead.file == _trace_file(Path(rdir), path):
                header, traces[rank] = ahead.header, ahead.trace
            else:
                header = _header_rank(path)
                traces[rank] = read_rank_trace(path, rank=rank)
        except (TraceFormatError, ijson.JSONError, ijson.IncompleteJSONError, OSError, EOFError,
                UnicodeDecodeError) as exc:
            unusable[rank] = f"trace cannot be parsed: {exc}"
            continue
        if header is not None and header != rank:
            notes.append(f"rank {rank}: trace header says rank {header} (distributedInfo.rank) but its rank dir is "
                         f"rank {rank}'s; judged as rank {rank}")
        paths[rank] = str(rdir)
    ev = ClusterEvidence(kind="torch_pt", rank_paths=paths, notes=notes + [f"rank {r}: {why}" for r, why in
                                                                          sorted(unusable.items())])
    bad = any("cannot be parsed" in why for why in unusable.values())
    one_rank = len(rank_dirs) == 1 and len(traces) == 1  # a single-device job: its breakdown, no peer
    if len(traces) < 2 and not one_rank:
        ev.unusable_ranks = dict(unusable)
        status: Any = "tool_error" if bad else "no_data"
        ev.recipes[RECIPE] = RecipeStatus(RECIPE, status, "; ".join(f"rank {r}: {w}" for r, w in unusable.items())
                                          or "fewer than 2 readable traces", duration_s=time.monotonic() - t0)
        return ev
    ev.accelerator = not traces or any(tr.has_device for tr in traces.values())
    brk = summarize_traces(traces, armed_labels=frozenset(armed_steps) if armed_steps else None)
    ev.summaries = brk.summaries
    ev.notes.extend(brk.notes)
    ev.alignment = brk.alignment.to_json()
    ev.step_labels = {r: dict(labels) for r, labels in brk.alignment.labels.items()}
    n_steps = len({s.step for s in brk.summaries})
    ev.collectives_per_step = brk.instances_matched / n_steps if n_steps and brk.instances_matched else None
    unusable.update({r: f"steps cannot be aligned with its peers: {why}" for r, why in brk.alignment.unaligned.items()})
    ev.unusable_ranks = dict(unusable)
    judged = {s.rank for s in brk.summaries}
    detail = (f"{len(judged)} of {len(rank_dirs)} ranks, {len({s.step for s in brk.summaries})} steps "
              f"(aligned: {brk.alignment.method}), collective class {brk.collective_class}, "
              f"{brk.instances_matched} instances matched")
    if unusable:
        detail += "; not judged: " + "; ".join(f"rank {r}: {w}" for r, w in sorted(unusable.items()))
    status = "ok" if len(judged) >= 2 or (one_rank and judged) else ("tool_error" if bad else "no_data")
    ev.recipes[RECIPE] = RecipeStatus(RECIPE, status, detail, rows=len(brk.summaries),
                                      duration_s=time.monotonic() - t0)
    return ev


def op_totals(path: Path, steps: Collection[int] | None = None) -> tuple[dict[str, float], int]:
    """``(op / kernel name -> total duration in µs, windows)``: :func:`op_totals_by_kind` summed over the kinds.

    Raises:
        TraceFormatError: truncated or malformed JSON.
    """
    by_kind, windows = op_totals_by_kind(path, steps)
    out: dict[str, float] = {}
    for (_kind, name), us in by_kind.items():
        out[name] = out.get(name, 0.0) + us
    return out, windows


def op_totals_by_kind(path: Path, steps: Collection[int] | None = None) -> tuple[dict[tuple[str, str], float], int]:
    """``({(kind, name): total duration in µs}, windows)`` inside the trace's ``ProfilerStep#N`` windows (those
    of ``steps`` only when given; device-lane windows for device work when the trace has them), streamed in two
    passes (windows, then ops). ``kind``: ``kernel`` (device work, :data:`DEVICE_CATS`, not memory), ``memory``
    (:data:`MEMORY_CATS`: copies and fills) or ``operator`` (host ``cpu_op``, its SELF time: its duration less its
    child CPU ops', per thread, as torch.profiler's ``self_cpu_time_total``, so ``aten::matmul`` and the
    ``aten::mm`` inside it never count one interval twice). Step markers (``ProfilerStep#N``,
    ``kineto.is_step_marker``) are left out. ``windows``: how many step windows the totals cover.

    Raises:
        TraceFormatError: truncated or malformed JSON.
    """
    try:
        try:
            return _op_totals(path, steps, python=False)
        except ijson.JSONError as exc:
            if not _overflow(exc):
                raise
        return _op_totals(path, steps, python=True)
    except (ijson.JSONError, ijson.IncompleteJSONError, OSError, EOFError, UnicodeDecodeError) as exc:
        raise TraceFormatError(f"{path}: {exc}") from exc


def _op_totals(path: Path, steps: Collection[int] | None, *,
               python: bool) -> tuple[dict[tuple[str, str], float], int]:
    wanted = set(steps) if steps is not None else None
    host: dict[int, tuple[float, float]] = {}
    dev: dict[int, tuple[float, float]] = {}
    events = _events_python if python else _events
    for ev in events(path):
        if isinstance(ev, dict) and ev.get("ph") == "X":
            step = parse_step(str(ev.get("name", "")))
            ts, dur = ev.get("ts"), ev.get("dur")
            if (step is not None and (wanted is None or step in wanted) and isinstance(ts, (int, float))
                    and isinstance(dur, (int, float))):
                lane = dev if str(ev.get("cat", "")).startswith("gpu_") else host
                lane[step] = (float(ts), float(ts) + float(dur))
    out: dict[tuple[str, str], float] = {}
    cpu_ops: dict[tuple[str, str], list[tuple[float, float, str]]] = {}
    for ev in events(path):
        if not isinstance(ev, dict) or ev.get("ph") != "X":
            continue
        cat, ts, dur = str(ev.get("cat", "")), ev.get("ts"), ev.get("dur")
        if cat not in DEVICE_CATS and cat not in CPU_COMPUTE_CATS:
            continue
        if not isinstance(ts, (int, float)) or not isinstance(dur, (int, float)) or dur <= 0:
            continue
        name = str(ev.get("name", ""))
        if is_step_marker(name):
            continue
        lanes = (dev or host) if cat in DEVICE_CATS else host
        if any(a <= ts < b for a, b in lanes.values()):
            if cat in DEVICE_CATS:
                key = ("memory" if cat in MEMORY_CATS else "kernel", name)
                out[key] = out.get(key, 0.0) + float(dur)
            else:
                thread = (str(ev.get("pid", "")), str(ev.get("tid", "")))
                cpu_ops.setdefault(thread, []).append((float(ts), float(dur), name))
    for ops in cpu_ops.values():
        for name, us in _self_times(ops):
            out[("operator", name)] = out.get(("operator", name), 0.0) + us
    return out, len(host)


def _self_times(ops: list[tuple[float, float, str]]) -> Iterator[tuple[str, float]]:
    """``(name, self µs)`` of one thread's CPU ops ``(ts, dur, name)``: each op's duration less its direct
    children's (an op starting inside another and ending by its end is its child; Kineto writes a thread's ops
    as a call tree), as torch.profiler's ``self_cpu_time_total``. Floor 0 (rounding of ``dur`` in the trace)."""
    ops.sort(key=lambda o: (o[0], -o[1]))
    stack: list[list[Any]] = []  # [end, self µs, name]

    def pop() -> tuple[str, float]:
        end, own, name = stack.pop()
        return name, max(0.0, own)

    for ts, dur, name in ops:
        while stack and ts >= stack[-1][0]:
            yield pop()
        if stack:
            stack[-1][1] -= min(dur, stack[-1][0] - ts)
        stack.append([ts + dur, dur, name])
    while stack:
        yield pop()


def compare_suspects(rank_dirs: Mapping[int, Path], suspects: Sequence[int], reference: int,
                     steps: Mapping[int, Collection[int]] | None = None) -> tuple[list[dict[str, Any]], RecipeStatus]:
    """The torch.profiler drill-down (enrich phase): for each suspect, the operators / kernels / collectives where
    it spends more time per step than the ``reference`` rank (its median peer), largest first
    (``profwatch.core.verdict.drilldown``). Each rank's totals are over the step windows of its own trace (a rank's
    step labels may be offset from its peers': ``daemon/profwatch/core/verdict/kineto_align.py``), divided by its
    own window count (``op_totals_by_kind``). ``steps``: rank -> its own ``ProfilerStep#`` labels of the steps
    the verdict used (``evidence.used_steps``: a truncated last step the verdict left out is left out here too);
    None: every step window of the trace. A trace with device work is compared on its device work (kernels,
    copies, collective kernels: host operators measure the host, often waiting for the device); a host-only trace
    on its operators' self times (exclusive of child CPU ops, so the listed excesses add up). Returns
    ``([{"rank", "reference_rank", "steps", "source", "ops": [...]}], RecipeStatus)``; never raises for bad data."""
    from profwatch.core.changes.detail import entries_from_op_totals
    from profwatch.core.verdict.drilldown import drilldown_text, excess_over_peer

    t0 = time.monotonic()
    kinds: dict[str, str] = {}

    def per_rank(rank: int) -> tuple[dict[str, float], int]:
        newest = _newest_trace(Path(rank_dirs[rank]))
        if newest is None:
            raise TraceFormatError(f"no *.pt.trace.json in {rank_dirs[rank]}")
        wanted = None if steps is None else steps.get(rank, ())
        by_kind, windows = op_totals_by_kind(newest, wanted)
        if not windows:
            raise TraceFormatError(f"rank {rank}: no ProfilerStep window in its trace"
                                   + ("" if wanted is None else f" among the steps the verdict used {sorted(wanted)}"))
        totals: dict[str, float] = {}
        for (kind, name), us in by_kind.items():
            totals[name] = totals.get(name, 0.0) + us
            if kinds.get(name) in (None, "operator"):
                kinds[name] = kind
        return totals, windows

    try:
        ref, ref_windows = per_rank(reference)
        out: list[dict[str, Any]] = []
        for r in suspects:
            if r in rank_dirs:
                mine, windows = per_rank(r)
                entries = entries_from_op_totals(mine, ref, steps_now=windows, steps_baseline=ref_windows,
                                                 is_collective=lambda name: collective_class(name, "") is not None,
                                                 kinds=kinds)
                out.append({"rank": r, "reference_rank": reference, "steps": windows, "source": "kineto op totals",
                            "ops": excess_over_peer(entries)})
    except (TraceFormatError, OSError, KeyError, ValueError) as exc:
        return [], RecipeStatus(OP_COMPARE, "no_data", f"cannot compare ops: {exc}", phase="enrich",
                                duration_s=round(time.monotonic() - t0, 3))
    named = "; ".join(drilldown_text(c) for c in out)
    return out, RecipeStatus(OP_COMPARE, "ok", f"per step: {named}",
                             rows=sum(len(c["ops"]) for c in out), phase="enrich",
                             duration_s=round(time.monotonic() - t0, 3))


def write_torch_trace(path: Path, rank: int, world_size: int, events: list[dict[str, Any]]) -> Path:
    """Write a minimal Kineto-shaped trace (used by tests and simulators; real traces come from torch).

    ``events`` are Chrome trace events (``ph``, ``name``, ``cat``, ``ts``, ``dur``, ``pid``, ``tid``).
    """
    doc = {"schemaVersion": 1, "distributedInfo": {"backend": "gloo", "rank": rank, "world_size": world_size},
           "displayTimeUnit": "ms", "traceEvents": events}
    path.write_text(json.dumps(doc))
    return path
