"""The capture lifecycle: one typed state machine, read top to bottom as a capture's life (pure; time passed in).

::

    planned -> written -> acknowledged -> collecting -> analysing -> analysed [-> enriching -> enriched | analysed]
       |          |  ack deadline: ack_missing ---^         |             '-> incomplete | failed (by result status)
       |          '-- batch complete (any time) ------------+-> analysing
       '-> failed (write refused or write deadline)         '-> incomplete (judgement time, batch not complete)
    any in-flight state -> cancelled (profwatch cancel); planned..collecting -> superseded (new job generation); data
    always kept

Every waiting state has a deadline from settings (:func:`deadline_for`); expiry is a transition with a reason
(:func:`expire`). Every transition is ``(Capture, ..., now) -> Transition``: the new frozen :class:`Capture`, the
events to publish and the I/O the shell must do (:class:`Action`). The states and the record are
``daemon/profwatch/core/capture/record.py`` (re-exported here); no state name and no transition decision lives
anywhere else (a unit test greps for them). The torch_npu facts the rules rest on: ``docs/capture-lifecycle.md``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any

from profwatch.core.alerts.event_types import TYPE_REFERENCE_CAPTURED
from profwatch.core.alerts.events import (
    TYPE_ANALYSIS_ENRICHED,
    TYPE_ANALYSIS_FAILED,
    TYPE_ARM,
    TYPE_BATCH,
    TYPE_BATCH_INCOMPLETE,
    TYPE_CAPTURE,
    TYPE_SUSPECT_RANKS,
)
from profwatch.core.batches.completeness import BatchState, rank_summary
from profwatch.core.capture.planner import CapturePlan, poll_interval_s
from profwatch.core.capture.record import (  # the record's names are the lifecycle's vocabulary: re-exported
    ACTIVE,  # noqa: F401
    ARM_PENDING,  # noqa: F401
    DEADLINE_BOUNDS,  # noqa: F401
    IN_FLIGHT,
    SCANNED,
    Capture,
    CaptureState,
    NodeWrite,
    RankProgress,
    S,
)
from profwatch.core.capture.report import explain_ranks, plan_notes, verdict_payload
from profwatch.core.changes.reference import REFERENCE_REASON
from rankhook import wire


class TransitionRefused(ValueError):
    """The asked transition is not allowed from the capture's state (the message says which and why)."""


class Action(str, Enum):
    """I/O the orchestration shell performs after a transition (the lifecycle itself does none)."""

    WRITE_CONFIG = "write_config"  # (re)send the rendered config to its writer(s)
    WATCH = "watch"  # watch the capture's prof_dir
    SCAN = "scan"  # scan the prof_dir now (completion, or the final scan at the judgement time)
    ANALYSE = "analyse"  # analyse the complete batch
    STOP_ANALYSIS = "stop_analysis"  # the capture left analysing/enriching without a result: stop its tool runs
    ENRICH = "enrich"  # run the follow-up (advisor) for the analysed batch
    UNWATCH = "unwatch"  # stop watching the prof_dir
    RETAIN = "retain"  # apply the retention caps (only analysed batches are ever removed)
    IDLE_CONFIG = "idle_config"  # write the idle config (start_step 0) over an arm that ended unused: it never fires


# -- settings and deadlines -----------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class LifecycleSettings:
    """Deadline inputs, seconds. ``write_timeout_s``: planned; ``ack_timeout_s``: written; ``parse_allowance_s``:
    added to the latest rank's window end (acknowledged/collecting); ``final_scan_grace_s``: how long the final
    scan may take after that; ``analysis_timeout_s`` (the tool timeouts); ``enrich_timeout_s`` (the advisor's)."""

    write_timeout_s: float = 30.0
    ack_timeout_s: float = 60.0
    parse_allowance_s: float = 600.0
    final_scan_grace_s: float = 120.0
    analysis_timeout_s: float = 3900.0
    enrich_timeout_s: float = 3600.0


@dataclass(frozen=True, slots=True)
class Event:
    """One event to publish: CloudEvents ``type``, ``data`` and a deterministic ``event_id`` (exactly once)."""

    type: str
    data: Mapping[str, Any]
    event_id: str | None = None


@dataclass(frozen=True, slots=True)
class Transition:
    """Result of every lifecycle function: the new record, events to publish, I/O for the shell."""

    capture: Capture
    events: tuple[Event, ...] = ()
    actions: frozenset[Action] = frozenset()


def ack_window_s(cap: Capture, settings: LifecycleSettings) -> float:
    """How long (s) a written arm waits for every rank's acknowledgement:
    ``max(ack_timeout_s, 3 x step time + the monitor's poll interval)``.

    torch_npu's monitor reads the config at most once per poll interval (``int(step time)`` clamped to [1, 50] s
    after step 10, :func:`~profwatch.core.capture.planner.poll_interval_s`), and logs the acknowledgement from the
    training thread at a step boundary; with steps over ~30 s that takes longer than the 60 s default. Step time:
    the slowest covered rank's at plan time, else the job's; none known: ``ack_timeout_s``."""
    times = [r.step_time_s for r in cap.ranks.values() if r.step_time_s]
    step_time = max(times) if times else cap.step_time_s
    if not step_time:
        return settings.ack_timeout_s
    furthest = max((r.step_at_plan for r in cap.ranks.values()), default=0)
    return max(settings.ack_timeout_s, 3.0 * step_time + poll_interval_s(furthest, step_time))


def deadline_for(cap: Capture, state: CaptureState, now: float, settings: LifecycleSettings) -> float | None:
    """The deadline of ``state`` entered at ``now``: planned: write timeout; written: :func:`ack_window_s` (never
    after the judgement time); acknowledged/collecting: the judgement time; analysing / enriching: their tool
    timeouts; final states: None."""
    if state is S.PLANNED:
        return now + settings.write_timeout_s
    if state is S.WRITTEN:
        return min(now + ack_window_s(cap, settings), cap.judge_unix_s)
    if state in (S.ACKNOWLEDGED, S.COLLECTING):
        return cap.judge_unix_s
    if state is S.ANALYSING:
        return now + settings.analysis_timeout_s
    if state is S.ENRICHING:
        return now + settings.enrich_timeout_s
    return None


def _enter(cap: Capture, state: CaptureState, now: float, settings: LifecycleSettings, **changes: Any) -> Capture:
    moved = replace(cap, state=state, state_since_unix_s=now, **changes)
    return replace(moved, deadline_unix_s=deadline_for(moved, state, now, settings))


def _progress(cap: Capture, event: str, now: float, **data: Any) -> Event:
    """The ``capture`` event (``core/alerts/event_types.py``) of one step in the capture's life."""
    body = {"capture_id": cap.capture_id, "event": event, "state": cap.state.value,
            "deadline_unix_s": cap.deadline_unix_s, "ts_unix_s": now, **data}
    return Event(TYPE_CAPTURE, body, f"capture-{cap.capture_id}-{event}")


# -- 1. birth: planned ----------------------------------------------------------------------------------------------
def blocking_capture(captures: Iterable[Capture], generation: int | None = None) -> Capture | None:
    """The capture of a job that blocks a new arm (torch_npu keeps one pending config slot), or None. With the job's
    current ``generation``, an ``analysing`` capture of an older generation blocks nothing: its window is over (the
    slot is free) and a new run's arms are never held back by the old run's captures. An ``analysing`` reference
    capture blocks nothing either (``core/changes/reference.py``: a reference yields the slot)."""
    return next((c for c in captures if c.state in IN_FLIGHT and not (c.state is S.ANALYSING and (
        c.reason == REFERENCE_REASON or (generation is not None and c.generation < generation)))), None)


def reference_in_window(captures: Iterable[Capture]) -> Capture | None:
    """The job's reference capture whose window has not ended (planned, written, acknowledged, collecting), or
    None: the one an episode's arm cancels (``core/changes/reference.py``: an episode never waits for a
    reference)."""
    return next((c for c in captures if c.reason == REFERENCE_REASON and c.state in WINDOW_PENDING), None)


def _verdict_event(cap: Capture, etype: str, data: Mapping[str, Any], event_id: str) -> Event:
    """The verdict event of ``cap``; for a reference capture ``reference_captured`` instead (never an alert), its
    data the same plus ``outcome`` (the verdict type it replaces, short name)."""
    if cap.reason == REFERENCE_REASON:
        return Event(TYPE_REFERENCE_CAPTURED, {**data, "outcome": etype.split(".")[2]},
                     f"reference-{cap.capture_id}-{etype.split('.')[2]}")
    return Event(etype, dict(data), event_id)


def open_capture(plan: CapturePlan, *, world_size: int, profiler_config_path: str, writer: str,
                 rank_steps: Mapping[int, int], rank_step_time_s: Mapping[int, float],
                 rank_backends: Mapping[int, str], nodes: Sequence[str], now: float, settings: LifecycleSettings,
                 step_time_s: float | None = None, generation: int = 0) -> Transition:
    """A new capture in ``planned`` from a :class:`CapturePlan`. ``nodes``: node daemons that must write the config
    (``writer == "node"``); ``rank_*``: each covered rank's step, step time and backend in use at plan time."""
    covered = plan.rank_list if plan.rank_list is not None else list(range(world_size))
    ranks = {r: RankProgress(rank=r, step_at_plan=rank_steps.get(r, -1), step_time_s=rank_step_time_s.get(r),
                             window_end_unix_s=plan.rank_deadlines_unix_s.get(r, plan.deadline_unix_s),
                             backend=rank_backends.get(r, "")) for r in covered}
    notes = plan_notes(plan, covered, rank_steps, rank_backends)
    judge = max(r.window_end_unix_s for r in ranks.values()) + settings.parse_allowance_s
    cap = Capture(
        capture_id=plan.capture_id, job_id=plan.job_id, reason=plan.reason, state=S.PLANNED, created_unix_s=now,
        state_since_unix_s=now, deadline_unix_s=None, start_step=plan.start_step, warmup=plan.warmup,
        active=plan.active, rank_list=tuple(plan.rank_list) if plan.rank_list is not None else None,
        world_size=world_size, prof_dir=str(plan.prof_dir), profiler_config_path=profiler_config_path,
        writer=writer, step_time_s=step_time_s, judge_unix_s=judge, config=plan.config.render(), ranks=ranks,
        nodes={n: NodeWrite(n, f"w-{plan.capture_id}-{n}", now) for n in nodes}, generation=generation,
        notes=tuple(notes))
    cap = replace(cap, deadline_unix_s=deadline_for(cap, S.PLANNED, now, settings))
    return Transition(cap, (_progress(cap, "planned", now, start_step=cap.start_step, writer=writer,
                                      nodes=sorted(cap.nodes), notes=list(cap.notes),
                                      rank_list=list(cap.rank_list) if cap.rank_list is not None else None,
                                      targeting=plan.targeting),),
                      frozenset({Action.WRITE_CONFIG, Action.WATCH}))


# -- 2. the config is written: written | failed ---------------------------------------------------------------------
def config_written(cap: Capture, result: Mapping[str, Any], now: float, settings: LifecycleSettings) -> Transition:
    """The writer confirmed the config (``result``: ``path``, ``mtime_s``...). planned -> written; else no-op."""
    if cap.state is not S.PLANNED:
        return Transition(cap)
    mtime = result.get("mtime_s")
    cap = _enter(cap, S.WRITTEN, now, settings, written_unix_s=now,
                 config_mtime_s=int(mtime) if isinstance(mtime, (int, float)) else cap.config_mtime_s)
    data = {"capture_id": cap.capture_id, "status": cap.state.value, "start_step": cap.start_step,
            "warmup": cap.warmup, "active": cap.active, "rank_list": list(cap.rank_list) if cap.rank_list else None,
            "prof_dir": cap.prof_dir, "profiler_config_path": cap.profiler_config_path, "writer": cap.writer,
            "world_size": cap.world_size, "deadline_unix_s": cap.deadline_unix_s, "judge_unix_s": cap.judge_unix_s,
            "nodes": sorted(cap.nodes), **result}
    return Transition(cap, (Event(TYPE_ARM, data, f"arm-{cap.capture_id}"),))


def config_write_failed(cap: Capture, error: str, now: float, settings: LifecycleSettings) -> Transition:
    """The writer refused, failed or did not confirm in time: planned -> failed with the error. Another node may
    have written the arm, or a slow write may still land: the idle config follows (written only where the file
    holds this capture's arm), so no rank runs a window nobody watches."""
    if cap.state is not S.PLANNED:
        return Transition(cap)
    cap = _enter(cap, S.FAILED, now, settings, outcome=f"config not written: {error}", idle_owed=True)
    return Transition(cap, (Event(TYPE_ARM, {"capture_id": cap.capture_id, "status": cap.state.value,
                                             "error": error}, f"arm-{cap.capture_id}"),
                            _progress(cap, "write_failed", now, detail=cap.outcome)),
                      frozenset({Action.UNWATCH, Action.IDLE_CONFIG}))


def node_write_result(cap: Capture, node_id: str, ok: bool, detail: str, result: Mapping[str, Any], now: float,
                      settings: LifecycleSettings) -> Transition:
    """One node daemon answered its ``write_config``: written once every node confirmed; failed at the first no."""
    nw = cap.nodes.get(node_id)
    if nw is None or cap.state is not S.PLANNED:
        return Transition(cap)
    cap = replace(cap, nodes={**cap.nodes, node_id: replace(nw, ok=ok, detail=detail)})
    if not ok:
        return config_write_failed(cap, f"node {node_id}: {detail}", now, settings)
    if all(n.ok for n in cap.nodes.values()):
        return config_written(cap, {**result, "nodes_confirmed": sorted(cap.nodes)}, now, settings)
    return Transition(cap)


# -- 3. the ranks acknowledge: acknowledged, then collecting ---------------------------------------------------------
def match_capture(captures: Sequence[Capture], ev: wire.CaptureEvent) -> Capture | None:
    """The capture a rank's event belongs to: by ``capture_id`` (hook events carry it from the config metadata),
    else by step (torch_npu's dp log names only steps: "Start step will be set to S" / "Start ... at S step" /
    "Stop ... at S + warmup + active step"), else the newest capture in flight for a window event."""
    mine = [c for c in captures if c.job_id == ev.job_id]
    if ev.capture_id:
        return next((c for c in mine if c.capture_id == ev.capture_id), None)
    for c in reversed(mine):
        if ev.start_step is not None and ev.start_step == c.start_step:
            return c
        if ev.event == "started" and ev.step == c.start_step:
            return c
        if ev.event == "completed" and ev.step == c.start_step + c.warmup + c.active:
            return c
    if ev.event in ("started", "completed"):
        return next((c for c in reversed(mine) if c.state in SCANNED), None)
    return None


MAX_RANK_CAPTURE_BYTES = 1 << 40
"""Most bytes one rank's capture may claim (1 TiB: far above one rank's few-step capture; a peer saying more is
capped, so a job's byte total stays below 2**60 at the largest world size, 2**20 ranks)."""


def rank_event(cap: Capture, ev: wire.CaptureEvent, now: float, settings: LifecycleSettings) -> Transition:
    """Record one rank's capture event; move written -> acknowledged once every covered rank acknowledged (see
    :attr:`RankProgress.acknowledged`), acknowledged -> collecting when a window started or finished anywhere.
    Events of final captures are still recorded (late bytes count); ranks the capture does not cover are ignored."""
    r = cap.ranks.get(ev.rank)
    if r is None:
        return Transition(cap)
    ts = ev.ts_unix_s
    if ev.event == "arm_seen":
        r = replace(r, tool_seen_unix_s=ts) if ev.source == "dp_log" else replace(r, hook_seen_unix_s=ts)
    elif ev.event == "arm_rejected":
        r = replace(r, rejected=ev.detail or ev.event)
    elif ev.event == "failed":
        r = replace(r, failure=ev.detail or ev.event)
    elif ev.event == "started":
        r = replace(r, started_unix_s=r.started_unix_s or ts)
    elif ev.event == "completed":
        # a rank's bytes are the largest it reported, capped per rank: repeated or inflated claims cannot push the
        # job's byte history (which gates automatic arms) past MAX_RANK_CAPTURE_BYTES per rank
        said = min(max(ev.total_bytes or 0, 0), MAX_RANK_CAPTURE_BYTES)
        r = replace(r, completed_unix_s=r.completed_unix_s or ts, rank_dir=ev.rank_dir or r.rank_dir,
                    steps=tuple(ev.steps) or r.steps, total_bytes=max(r.total_bytes, said))
    before_done = all(p.completed_unix_s is not None for p in cap.ranks.values())
    cap = replace(cap, ranks={**cap.ranks, ev.rank: r})
    events: list[Event] = []
    actions: set[Action] = set()
    if ev.event in ("arm_rejected", "failed"):
        events.append(Event(TYPE_CAPTURE, {"capture_id": cap.capture_id, "rank": ev.rank, "event": ev.event,
                                           "detail": ev.detail, "source": ev.source}))
    if cap.state is S.WRITTEN and all(p.acknowledged for p in cap.ranks.values()):
        cap = _enter(cap, S.ACKNOWLEDGED, now, settings)
        events.append(_progress(cap, "acknowledged", now, ranks=cap.expected_ranks))
    if cap.state is S.ACKNOWLEDGED and any(p.started_unix_s or p.completed_unix_s for p in cap.ranks.values()):
        cap = _enter(cap, S.COLLECTING, now, settings)
        events.append(_progress(cap, "collecting", now))
    if ev.event == "completed" and cap.state in SCANNED:
        actions.add(Action.SCAN)
    if not before_done and all(p.completed_unix_s is not None for p in cap.ranks.values()):
        events.append(Event(TYPE_CAPTURE, {"capture_id": cap.capture_id, "event": "all_ranks_completed",
                                           "total_bytes": cap.total_bytes}, f"captured-{cap.capture_id}"))
    return Transition(cap, tuple(events), frozenset(actions))


# -- 4. the batch lands: analysing | incomplete ---------------------------------------------------------------------
def wants_scan(cap: Capture) -> bool:
    """True while the capture's prof_dir must be scanned for its batch."""
    return cap.state in SCANNED


def pick_batch(cap: Capture, batches: Sequence[BatchState]) -> BatchState | None:
    """This capture's batch among a scan of its own prof_dir: stamped with its id first, else unstamped rank dirs
    (an older torch_npu writes no metadata); a batch stamped with another id is never ours. Complete ones first."""
    mine = [b for b in batches if b.capture_id == cap.capture_id] or [b for b in batches if b.capture_id is None]
    return next((b for b in mine if b.status == "complete"), next((b for b in mine if b.judgeable()),
                                                                  mine[0] if mine else None))


def scan_result(cap: Capture, batch: BatchState | None, now: float, settings: LifecycleSettings,
                causes: Mapping[int, str] | None = None) -> Transition:
    """Judge a scan: a complete batch -> analysing (also a judgeable one: every rank finished, some without usable
    device data; the analysis judges the others and says which could not be judged); at or after the judgement time anything else -> incomplete
    (every missing rank named with what it said and the known cause); earlier, rank dirs appearing while
    acknowledged -> collecting. Late data of a lagging rank is therefore picked up until the batch is judged."""
    if cap.state not in SCANNED:
        return Transition(cap)
    if batch is not None and batch.judgeable():
        cap = _enter(cap, S.ANALYSING, now, settings, batch_id=batch.batch_id)
        return Transition(cap, (Event(TYPE_BATCH, {"capture_id": cap.capture_id, "batch": batch.to_json(),
                                                   "event": "batch_complete"}, f"batch_complete-{cap.capture_id}"),
                                _progress(cap, "analysing", now, batch_id=batch.batch_id)),
                          frozenset({Action.ANALYSE}))
    if cap.state in (S.ACKNOWLEDGED, S.COLLECTING) and now >= (cap.deadline_unix_s or 0.0):
        return _judge_incomplete(cap, batch, now, settings, causes or {}, "judged at its deadline")
    if cap.state is S.ACKNOWLEDGED and batch is not None and batch.ranks:
        cap = _enter(cap, S.COLLECTING, now, settings)
        return Transition(cap, (_progress(cap, "collecting", now),))
    return Transition(cap)


def _judge_incomplete(cap: Capture, batch: BatchState | None, now: float, settings: LifecycleSettings,
                      causes: Mapping[int, str], why: str) -> Transition:
    missing = sorted(batch.missing_ranks) if batch is not None else cap.expected_ranks
    problems = ([p.to_json() for p in batch.problems] if batch is not None else
                [{"rank": None, "path": cap.prof_dir, "reason": "no rank dir appeared"}])
    explained = explain_ranks(cap, missing, causes)
    # what is wrong: the missing ranks, or (every rank has a dir) the batch's problems; never "missing ranks []"
    what = (f"missing ranks {rank_summary(missing)}" if missing else
            batch.describe(limit=3) if batch is not None else "no rank dir appeared")
    detail = (f"batch incomplete ({why}): {what}"
              + (f"; {explained[0]}" if explained else "") + (f" (+{len(explained) - 1} more)" if len(explained) > 1 else ""))
    cap = _enter(cap, S.INCOMPLETE, now, settings, outcome=detail, batch_id=batch.batch_id if batch else None)
    data = verdict_payload(cap, status="incomplete", detail=detail, batch=batch, missing_ranks=missing,
                           problems=problems, causes=explained)
    return Transition(cap, (_verdict_event(cap, TYPE_BATCH_INCOMPLETE, data, f"batch_incomplete-{cap.capture_id}"),
                            _progress(cap, "incomplete", now, detail=detail)),
                      frozenset({Action.UNWATCH}))


# -- 5. the analysis: analysed | incomplete | failed ----------------------------------------------------------------
OUTCOMES: Mapping[str, tuple[str, CaptureState]] = {
    "ok": (TYPE_SUSPECT_RANKS, S.ANALYSED),
    "weak": (TYPE_SUSPECT_RANKS, S.ANALYSED),
    "no_suspect": (TYPE_SUSPECT_RANKS, S.ANALYSED),
    "partial": (TYPE_SUSPECT_RANKS, S.ANALYSED),
    "not_applicable": (TYPE_SUSPECT_RANKS, S.ANALYSED),
    "incomplete": (TYPE_BATCH_INCOMPLETE, S.INCOMPLETE),
    "no_data": (TYPE_ANALYSIS_FAILED, S.FAILED),
    "failed": (TYPE_ANALYSIS_FAILED, S.FAILED),
}
"""The one analysis status -> (event type, capture state) mapping. Every status ``analyse`` returns
(``profwatch.analysis.result.AnalysisStatus``) has a row: a verdict that names suspects on weak evidence (``weak``)
or that says this capture cannot answer (``not_applicable``: one rank has no peer to compare with, a Level0 or
text-only export) is a verdict, published as ``suspect_ranks`` with its status and detail, not an analysis that
failed. An unknown status counts as ``failed``."""
_EVENT_IDS = {TYPE_SUSPECT_RANKS: "suspects", TYPE_BATCH_INCOMPLETE: "batch_incomplete",
              TYPE_ANALYSIS_FAILED: "analysis_failed"}


def event_type_for(status: str) -> str:
    """CloudEvent type of a verdict with analysis ``status`` (``OUTCOMES``)."""
    return OUTCOMES.get(status, OUTCOMES["failed"])[0]


def analysis_context(cap: Capture) -> dict[str, Any]:
    """The capture's part of the verdict payload, handed to the analysis so ``report.json`` and the alert carry
    the same data (``VERDICT_KEYS``). ``job_world_size``: the job's size (a targeted capture holds fewer ranks;
    the impact figure counts the job's accelerators)."""
    return {"capture_id": cap.capture_id, "capture_reason": cap.reason, "job_id": cap.job_id,
            "armed_steps": cap.armed_steps, "missing_ranks": [], "problems": [], "causes": [],
            "notes": list(cap.notes), "job_world_size": cap.world_size}


def analysis_done(cap: Capture, status: str, payload: Mapping[str, Any], now: float,
                  settings: LifecycleSettings) -> Transition:
    """The analysis returned a result with ``status`` and its verdict ``payload`` (published as is: it is also
    ``report.json``). analysing -> analysed | incomplete | failed per ``OUTCOMES``; a result for a capture that
    left ``analysing`` meanwhile (cancelled, expired) is dropped. An analysed verdict whose payload names
    ``pending_recipes`` (the enrich phase: advisor, slow links, the html report) goes on to ``enriching`` at once
    (:func:`begin_enrich`): the verdict event is always published first, the follow-up only after it."""
    if cap.state is not S.ANALYSING:
        return Transition(cap)
    etype, state = OUTCOMES.get(status, OUTCOMES["failed"])
    detail = str(payload.get("detail") or status)
    cap = _enter(cap, state, now, settings, analysis_status=status,
                 outcome="" if state is S.ANALYSED else detail)
    t = Transition(cap, (_verdict_event(cap, etype, payload, f"{_EVENT_IDS[etype]}-{cap.capture_id}"),
                         _progress(cap, state.value, now, analysis_status=status)),
                   frozenset({Action.UNWATCH, Action.RETAIN} if state is S.ANALYSED else {Action.UNWATCH}))
    if state is S.ANALYSED and payload.get("pending_recipes") and cap.reason != REFERENCE_REASON:
        follow = begin_enrich(cap, now, settings)
        return Transition(follow.capture, t.events + tuple(
            replace(e, data={**e.data, "pending_recipes": list(payload["pending_recipes"])}) for e in follow.events),
            t.actions | follow.actions)
    return t


def analysis_raised(cap: Capture, error: str, now: float, settings: LifecycleSettings) -> Transition:
    """The analysis crashed: analysing -> failed, published as ``analysis_failed`` with the error (data kept)."""
    if cap.state is not S.ANALYSING:
        return Transition(cap)
    return _fail_analysis(cap, f"analysis crashed: {error}", now, settings)


def _fail_analysis(cap: Capture, detail: str, now: float, settings: LifecycleSettings) -> Transition:
    cap = _enter(cap, S.FAILED, now, settings, analysis_status="failed", outcome=detail)
    data = verdict_payload(cap, status="failed", detail=detail)
    return Transition(cap, (_verdict_event(cap, TYPE_ANALYSIS_FAILED, data, f"analysis_failed-{cap.capture_id}"),
                            _progress(cap, "analysis_failed", now, detail=detail)), frozenset({Action.UNWATCH}))


# -- 6. the follow-up: enriching -> enriched | analysed -------------------------------------------------------------
def begin_enrich(cap: Capture, now: float, settings: LifecycleSettings) -> Transition:
    """analysed -> enriching: the advisor's follow-up starts for the published verdict (once per capture)."""
    if cap.state is not S.ANALYSED:
        raise TransitionRefused(f"capture {cap.capture_id} is {cap.state.value}: only an analysed capture is enriched")
    cap = _enter(cap, S.ENRICHING, now, settings)
    return Transition(cap, (_progress(cap, "enriching", now),), frozenset({Action.ENRICH}))


def enrich_done(cap: Capture, findings: Mapping[str, Any], now: float, settings: LifecycleSettings) -> Transition:
    """The follow-up returned. enriching -> enriched: publish ``analysis_enriched`` with the same ids as the
    verdict (capture, batch) and the whole verdict again (``findings``: the verdict payload judged on the fuller
    evidence, each recipe's status, e.g. an advisor killed at its memory cap is ``oom`` there). A follow-up that
    crashed (``findings["enrich_error"]``) publishes nothing new: :func:`enrich_failed`."""
    if cap.state is not S.ENRICHING:
        return Transition(cap)
    if findings.get("enrich_error"):
        return enrich_failed(cap, str(findings["enrich_error"]), now, settings)
    cap = _enter(cap, S.ENRICHED, now, settings)
    data = {**findings, "capture_id": cap.capture_id, "batch_id": cap.batch_id, "job_id": cap.job_id}
    statuses = {k: v.get("status") for k, v in (findings.get("recipes") or {}).items() if isinstance(v, Mapping)}
    return Transition(cap, (Event(TYPE_ANALYSIS_ENRICHED, data, f"enriched-{cap.capture_id}"),
                            _progress(cap, "enriched", now, recipes=statuses,
                                      enrich_duration_s=findings.get("enrich_duration_s"))))


def enrich_failed(cap: Capture, error: str, now: float, settings: LifecycleSettings) -> Transition:
    """enriching -> analysed: the follow-up failed; the verdict already published stands (reason kept)."""
    if cap.state is not S.ENRICHING:
        return Transition(cap)
    cap = _enter(cap, S.ANALYSED, now, settings, outcome=f"enrichment failed: {error}")
    return Transition(cap, (_progress(cap, "enrich_failed", now, detail=cap.outcome),))


# -- 7. endings from outside: cancelled, superseded ------------------------------------------------------------------
WINDOW_PENDING = frozenset({S.PLANNED, S.WRITTEN, S.ACKNOWLEDGED, S.COLLECTING})
"""States whose config may still wait in the ranks' pending slot: a cancel writes the idle config over it."""


def cancel(cap: Capture, now: float, settings: LifecycleSettings, by: str = "operator") -> Transition:
    """An in-flight capture -> cancelled (its job may arm again). Before analysis the idle config (start_step 0,
    :func:`profwatch.core.capture.profiler_config.idle_config`) is written over the arm (only while the file still holds
    it), so ranks that have not started the window drop it; a window already running ends as armed. Whatever the
    ranks write is left in place. Raises :class:`TransitionRefused` otherwise."""
    if cap.state not in IN_FLIGHT:
        raise TransitionRefused(f"capture {cap.capture_id} is {cap.state.value}: nothing to cancel")
    was = cap.state
    idle = was in WINDOW_PENDING
    cap = _enter(cap, S.CANCELLED, now, settings, outcome=f"cancelled by {by} while {was.value}", idle_owed=idle)
    note = "data kept; nothing deleted" + ("; the idle config (start_step 0) replaces the arm on ranks that have "
                                           "not started the window" if idle else "")
    actions = _leaving(was) | ({Action.IDLE_CONFIG} if idle else frozenset())
    return Transition(cap, (_progress(cap, "cancelled", now, by=by, was=was.value, note=note),), actions)


def job_ended(cap: Capture, now: float, settings: LifecycleSettings) -> Transition | None:
    """The capture's job ended (no rank reported for ``job_end_after_s``): a capture whose window has not started
    (planned, written, acknowledged: no rank started or finished it) -> cancelled, reason ``job ended``, with the
    idle config over its arm (a later run of the job in the same folder must not fire it). A capture collecting or
    analysing runs to its deadline (torch_npu may still be parsing what it recorded): None, nothing changes."""
    if cap.state not in (S.PLANNED, S.WRITTEN, S.ACKNOWLEDGED) or any(
            p.started_unix_s is not None or p.completed_unix_s is not None for p in cap.ranks.values()):
        return None
    was = cap.state
    cap = _enter(cap, S.CANCELLED, now, settings, outcome=f"job ended before its window started (was {was.value})")
    return Transition(cap, (_progress(cap, "cancelled", now, by="job ended", reason="job ended", was=was.value,
                                      note="the window at start_step was never reached; the idle config replaces "
                                           "the arm"),), _leaving(was) | {Action.IDLE_CONFIG})


WITHDRAWN = "withdrawn"
"""The start of a withdrawn capture's ``outcome`` (:func:`withdraw`)."""


def withdraw(cap: Capture, now: float, settings: LifecycleSettings, why: str) -> Transition | None:
    """Its episode's excursion came back before the window (``why``: the evidence, one line): a capture whose
    window has not started (planned, written, acknowledged; no rank started or finished it) -> cancelled, outcome
    ``withdrawn: <why>``, with the idle config over its arm, as :func:`job_ended`. Its arm leaves the job's budget
    (:meth:`~profwatch.core.arming.policy.ArmHistory.withdraw`; :func:`is_withdrawn` after a restart). A window
    already started runs as armed: None, nothing changes."""
    if cap.state not in (S.PLANNED, S.WRITTEN, S.ACKNOWLEDGED) or any(
            p.started_unix_s is not None or p.completed_unix_s is not None for p in cap.ranks.values()):
        return None
    was = cap.state
    cap = _enter(cap, S.CANCELLED, now, settings, outcome=f"{WITHDRAWN}: {why}", idle_owed=True)
    return Transition(cap, (_progress(cap, "cancelled", now, by="profwatch", reason=WITHDRAWN, was=was.value,
                                      note=f"withdrawn before its window: {why}; the idle config replaces the arm"),),
                      _leaving(was) | {Action.IDLE_CONFIG})


def is_withdrawn(cap: Capture) -> bool:
    """Whether ``cap`` was withdrawn before its window (:func:`withdraw`): it spent no budget."""
    return cap.state is S.CANCELLED and (cap.outcome or "").startswith(WITHDRAWN + ":")


IDLE_ENDINGS = frozenset({S.CANCELLED, S.FAILED, S.SUPERSEDED})
"""Final states whose arm may still wait on ranks: the transitions into them decide whether the idle config is
owed (:attr:`Capture.idle_owed`)."""


def owes_idle(cap: Capture, now: float) -> bool:
    """True when a restarted coordinator writes the idle config for ``cap`` again (the write before the stop may
    have been lost): the transition that ended it asked for it (:attr:`Capture.idle_owed`: a cancel before the
    analysis, a superseded generation, a failed write) and its window's judgement time is still ahead. A repeat
    is harmless: the idle config goes only where the file still holds this capture's arm."""
    return cap.idle_owed and cap.judge_unix_s > now


class IdleOutcome(str, Enum):
    """What one writer's idle write came to."""

    WRITTEN = "written"
    SKIPPED = "skipped"  # the file no longer held this capture's arm: nothing to take back
    FAILED = "failed"  # refused, or no answer before the window's end


def idle_config_result(cap: Capture, writer: str, outcome: IdleOutcome, detail: str, now: float) -> Event:
    """The ``capture`` event of one writer's idle write: ``idle_config_written``,
    ``idle_config_skipped`` or ``idle_config_failed`` (:class:`IdleOutcome`); ``writer``: "coordinator" or the
    node id (one event each). Raises ValueError for an outcome that is not an :class:`IdleOutcome`."""
    outcome = IdleOutcome(outcome)
    ev = _progress(cap, f"idle_config_{outcome.value}", now, writer=writer, detail=detail[:500])
    return Event(ev.type, ev.data, f"{ev.event_id}-{writer}")


SUPERSEDABLE = IN_FLIGHT - {S.ANALYSING}
"""States a new job generation ends: the capture still waits for the old generation's ranks (write, acknowledgement,
window, rank dirs). An ``analysing`` capture has its complete batch and is judged as the old generation was."""


def supersede(cap: Capture, generation: int, now: float, settings: LifecycleSettings) -> Transition:
    """A capture of an older job generation still waiting for its ranks -> superseded (the job restarted or
    resized: its new processes count steps anew and ignore a config written before they started; one still being
    written may land after, so the idle config follows it, only where the file holds this capture's arm). Data
    kept. No-op for newer captures, ``analysing`` ones (the batch is complete: its verdict stands for the old
    generation) and final ones."""
    if cap.state not in SUPERSEDABLE or cap.generation >= generation:
        return Transition(cap)
    was = cap.state
    cap = _enter(cap, S.SUPERSEDED, now, settings,
                 outcome=f"job generation {cap.generation} -> {generation} while {was.value}", idle_owed=True)
    return Transition(cap, (_progress(cap, "superseded", now, old_generation=cap.generation, generation=generation,
                                      was=was.value, note="data kept; nothing deleted"),),
                      _leaving(was) | {Action.IDLE_CONFIG})


def _leaving(was: CaptureState) -> frozenset[Action]:
    return frozenset({Action.UNWATCH, Action.STOP_ANALYSIS} if was is S.ANALYSING else {Action.UNWATCH})


# -- 8. deadlines: every waiting state ends -------------------------------------------------------------------------
def is_due(cap: Capture, now: float) -> bool:
    """True when the capture's state deadline has passed (call :func:`expire`)."""
    return cap.deadline_unix_s is not None and now >= cap.deadline_unix_s


def expire(cap: Capture, now: float, settings: LifecycleSettings, causes: Mapping[int, str] | None = None) -> Transition:
    """The state's deadline passed. planned -> failed (the writer never confirmed: named nodes and causes);
    written -> collecting with ``ack_missing`` naming each unacknowledged rank and why; acknowledged/collecting:
    ask for the final scan (:func:`scan_result` judges), and -> incomplete if none came within
    ``final_scan_grace_s``; analysing -> failed (``analysis_failed``); enriching -> analysed (the verdict stands;
    its tool runs are stopped)."""
    if not is_due(cap, now):
        return Transition(cap)
    causes = causes or {}
    if cap.state is S.PLANNED:
        pending = sorted(n for n, w in cap.nodes.items() if w.ok is None)
        who = f"node(s) {pending} did not confirm" if pending else "the coordinator's writer did not finish"
        extra = sorted({c for r, c in causes.items() if r in cap.ranks and c})
        error = (f"config not written within {settings.write_timeout_s:g} s: {who}"
                 + (f" ({'; '.join(extra[:3])})" if extra else ""))
        return config_write_failed(cap, error, now, settings)
    if cap.state is S.WRITTEN:
        missing = sorted(r for r, p in cap.ranks.items() if not p.acknowledged)
        explained = explain_ranks(cap, missing, causes)
        cap = _enter(cap, S.COLLECTING, now, settings, outcome=f"ranks {missing} did not acknowledge the arm")
        return Transition(cap, (Event(TYPE_CAPTURE, {"capture_id": cap.capture_id, "event": "ack_missing",
                                                     "ranks": missing, "causes": explained,
                                                     "detail": "; ".join(explained[:4])},
                                      f"ack_missing-{cap.capture_id}"),
                                _progress(cap, "collecting", now)), frozenset({Action.SCAN}))
    if cap.state in (S.ACKNOWLEDGED, S.COLLECTING):
        if now < (cap.deadline_unix_s or 0.0) + settings.final_scan_grace_s:
            return Transition(cap, (), frozenset({Action.SCAN}))
        return _judge_incomplete(cap, None, now, settings, causes,
                                 f"no scan of {cap.prof_dir} finished within {settings.final_scan_grace_s:g} s "
                                 "of the deadline: the file system may be unreachable")
    if cap.state is S.ANALYSING:
        t = _fail_analysis(cap, f"analysis did not finish within {settings.analysis_timeout_s:g} s", now, settings)
        return replace(t, actions=t.actions | {Action.STOP_ANALYSIS})
    if cap.state is S.ENRICHING:
        cap = _enter(cap, S.ANALYSED, now, settings,
                     outcome=f"enrichment did not finish within {settings.enrich_timeout_s:g} s")
        return Transition(cap, (_progress(cap, "enrich_expired", now, detail=cap.outcome),),
                          frozenset({Action.STOP_ANALYSIS}))
    return Transition(cap)


# -- 9. a coordinator restart -----------------------------------------------------------------------------------------
def rebase(cap: Capture, now: float, settings: LifecycleSettings) -> Capture:
    """A persisted capture's deadline in a restarted coordinator's time (``adapters/clock.py``): the time left is
    bounded to ``[min(stage, parse_allowance_s), stage]`` where ``stage`` is the length of its current stage
    (deadline - state_since), and the judgement time moves with it. So a wall clock that moved forward while the
    coordinator was down expires nothing at once, and one that moved back holds nothing longer than its stage.
    Returns ``cap`` unchanged when it has no deadline or its deadline already lies in that range."""
    if cap.deadline_unix_s is None:
        return cap
    stage = max(0.0, cap.deadline_unix_s - cap.state_since_unix_s)
    left = cap.deadline_unix_s - now
    bounded = min(max(left, min(stage, settings.parse_allowance_s)), stage)
    delta = bounded - left
    if delta == 0:
        return cap
    return replace(cap, deadline_unix_s=cap.deadline_unix_s + delta, judge_unix_s=cap.judge_unix_s + delta)


def resume(cap: Capture, now: float, settings: LifecycleSettings) -> Transition:
    """Pick a persisted capture up after a restart: planned -> the write is sent again (an absolute start_step
    makes a repeat harmless); waiting states are watched and scanned again (a judgement time that passed while
    the coordinator was down leaves a fresh grace for the final scan); an interrupted analysis is redone
    (analysing -> collecting); an interrupted enrichment leaves the verdict as it is (enriching -> analysed)."""
    cap = rebase(cap, now, settings)
    if cap.state is S.PLANNED:
        return Transition(cap, (), frozenset({Action.WRITE_CONFIG, Action.WATCH}))
    if cap.state is S.ANALYSING:
        cap = _enter(cap, S.COLLECTING, now, settings, outcome="analysis interrupted by a coordinator stop: redone")
    if cap.state in (S.ACKNOWLEDGED, S.COLLECTING):
        cap = replace(cap, deadline_unix_s=max(cap.deadline_unix_s or now, now))
    if cap.state in SCANNED:
        return Transition(cap, (), frozenset({Action.WATCH, Action.SCAN}))
    if cap.state is S.ENRICHING:
        cap = _enter(cap, S.ANALYSED, now, settings, outcome="enrichment interrupted by a coordinator stop")
    return Transition(cap)
