"""Capture orchestration (the I/O shell around ``daemon/profwatch/core/capture/lifecycle.py``): arming, config writes, scans,
analyses, events and persistence, through narrow collaborators (``daemon/profwatch/captures/ports.py``), never the coordinator.
The shell owns three parts built with explicit arguments: :class:`~profwatch.arming.arm_checks.ArmChecks` (hello
and arm checks), :class:`~profwatch.captures.config_writes.ConfigWrites` (the arm and the idle config) and
:class:`~profwatch.captures.analysis_steps.AnalysisSteps` (analyses, enrichment, retention); the last two reach the
captures only through the shell's ``find`` and ``apply``.

Every decision is a lifecycle transition; this module applies it: persist the new record (typed rows), publish
its events, perform its :class:`~profwatch.core.capture.lifecycle.Action` s. Runs on the coordinator's main thread; file
system work and analyses go to worker pools and come back through ``post`` (the main loop's queue). Captures in
flight live in memory (loaded once at start); the store is written on every transition and read only at start
and for listings.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import structlog

from profwatch.adapters.fs.paths import PathRefused, make_dirs
from profwatch.adapters.zmq.control import ControlError
from profwatch.arming.arm_checks import ArmChecks
from profwatch.arming.episode_desk import EpisodeDesk
from profwatch.arming.port import ArmRefusal, ArmResult
from profwatch.captures.analysis_steps import AnalysisSteps
from profwatch.captures.config_writes import ConfigWrites
from profwatch.captures.ports import (
    AnalyserPort,
    Clock,
    ConfigWriterPort,
    DetectorsPort,
    Emit,
    Post,
    ScannerPort,
    SendNodeCommand,
    WatcherPort,
)
from profwatch.changes.reference_desk import ReferenceDesk
from profwatch.core.alerts.alertmanager import VERDICT_TYPES
from profwatch.core.alerts.event_types import TYPE_PATH_REFUSED
from profwatch.core.arming.policy import ArmHistory, ArmingPolicy, ArmingSettings, planning_step_time_s
from profwatch.core.arming.targeting import JobTopology, estimate_capture_bytes
from profwatch.core.batches.completeness import BatchState, CaptureHint
from profwatch.core.capture import lifecycle as lc
from profwatch.core.capture.planner import CannotPlanCapture, CaptureRequest, JobProgress, new_capture_id, plan_capture
from profwatch.core.capture.report import describe, explain_ranks, rank_causes, refusal
from profwatch.core.changes.reference import REFERENCE_REASON, yield_start_after
from profwatch.core.fleet.host_load import LoadExplanation, explain_job_change
from profwatch.core.fleet.step_window import median
from profwatch.core.step_numbering import profiled_report_steps
from rankhook import wire

if TYPE_CHECKING:
    from profwatch.adapters.store.state import StateStore
    from profwatch.config import Settings
    from profwatch.core.arming.episodes import Episode
    from profwatch.core.detection.job_detector import Anomaly
    from profwatch.core.fleet.registry import JobState, NodeState

log = structlog.get_logger("profwatch.captures.shell")
RECENT_PER_JOB = 8
"""Final captures kept in memory per job (late rank events still count their bytes); older ones are in the store."""
PARSING = lc.ARM_PENDING | lc.SCANNED
"""Capture states in which the ranks may still be writing or parsing their dirs: the steps after the window stay
out of detection (``DetectorsPort.exclude_until_closed``) until the capture leaves them (batch complete or ended)."""


def parse_reason(capture_id: str) -> str:
    """The detector's exclusion reason for the steps after ``capture_id``'s window."""
    return f"parse {capture_id}"


def lifecycle_settings(s: Settings) -> lc.LifecycleSettings:
    """Deadline inputs from the configuration: ``[capture] write_timeout_s`` / ``final_scan_grace_s``,
    ``[coordinator] ack_timeout_s``, ``[watch] parse_allowance_s``. The analysis deadline is the alert phase's
    tool timeouts: its two recipes in ``ceil(2 / max_concurrent_runs)`` rounds (auto concurrency counts as 1) of
    ``[analysis.msprof] timeout_s``, each retried once at most after a timeout, plus 300 s for staging, ranking and
    the report; enrichment: its runs one after another (communication matrix, advisor, its html) plus 300 s, and
    with ``[analysis] own_tables`` (the first verdict on the ranks' own tables) the alert recipes' rounds too, since
    msprof-analyze's cluster_time_summary and slow_rank then run in the enrich phase as the confirmation."""
    m = s.analysis.msprof
    rounds = -(-2 // max(m.max_concurrent_runs, 1))
    enrich_runs = int(m.communication_matrix) + ((1 + int(m.advisor_html)) if m.advisor else 0) + (
        rounds if s.analysis.own_tables else 0)
    per_run = m.timeout_s * (1 + min(m.retries, 1))
    return lc.LifecycleSettings(
        write_timeout_s=s.capture.write_timeout_s, ack_timeout_s=s.coordinator.ack_timeout_s,
        parse_allowance_s=s.watch.parse_allowance_s, final_scan_grace_s=s.capture.final_scan_grace_s,
        analysis_timeout_s=rounds * per_run + 300.0, enrich_timeout_s=enrich_runs * per_run + 300.0)


def unknown_job_text(job_id: str, jobs: Mapping[str, Any], shown: int = 10) -> str:
    """Why an arm names no known job: no rank of ``job_id`` said hello; then the jobs this coordinator knows (the
    first ``shown`` by name, and how many more), or that it knows none."""
    known = sorted(jobs)
    more = f" and {len(known) - shown} more" if len(known) > shown else ""
    knows = (f"jobs it knows: {', '.join(known[:shown])}{more}" if known
             else "it knows no job yet: start the job with the rank hook")
    return f"unknown job {job_id!r} (no rank of it has said hello); {knows}"


@dataclass
class _Job:
    """Per-job shell state: in-flight and recent captures, the arm history, and the communication groups the
    job's last complete batch recorded (``parallel_group_info``; for targeted captures; kept in memory only)."""

    active: dict[str, lc.Capture]
    recent: deque[lc.Capture]
    history: ArmHistory
    groups: dict[str, tuple[int, ...]] | None = None
    groups_from: str | None = None


class CaptureShell:
    """Applies lifecycle transitions for every capture of one coordinator (see the module doc).

    Args:
        settings: the whole configuration tree (coordinator, capture, watch, analysis, arming sections).
        store: the state store (typed capture rows, batches).
        jobs, nodes: the registry's job and node maps (read only).
        writer, send_node_command, scanner, analyser, detectors: collaborators (``daemon/profwatch/captures/ports.py``).
        make_watcher: builds the prof_dir watcher given its two callbacks, ``on_wake(prof_dir)`` (a full look) and
            ``on_rank_dirs(prof_dir, rank_dirs)`` (read those rank dirs); None when watching is unavailable.
        emit, post, clock, count_state: publish an event; hand work to the main loop; wall clock; metrics hook.

    Parts: ``checks`` (:class:`ArmChecks`: hellos, arm refusals and warnings), ``writes`` (:class:`ConfigWrites`) and
    ``steps`` (:class:`AnalysisSteps`); the shell owns the one file system worker (``fs_pool``: config writes, scans
    and retention keep their order) and hands it to the last two.
    """

    def __init__(self, *, settings: Settings, store: StateStore, jobs: Mapping[str, JobState],
                 nodes: Mapping[str, NodeState], writer: ConfigWriterPort, send_node_command: SendNodeCommand,
                 scanner: ScannerPort, analyser: AnalyserPort, detectors: DetectorsPort, emit: Emit, post: Post,
                 clock: Clock, make_watcher: Any = None, count_state: Any = None) -> None:
        self.s = settings
        self.ls = lifecycle_settings(settings)
        self.store, self.jobs, self.nodes = store, jobs, nodes
        self.writer, self.send_node_command, self.scanner, self.analyser = writer, send_node_command, scanner, analyser
        self.detectors, self.emit, self.post, self.clock = detectors, emit, post, clock
        self.count_state = count_state or (lambda state: None)
        self.policy = ArmingPolicy(settings.arming, settings.analysis.ranking)
        self.fs_pool = ThreadPoolExecutor(1, thread_name_prefix="profwatch-fs")
        cs = settings.coordinator
        self.writes = ConfigWrites(
            jobs=jobs, nodes=nodes, writer=writer, send_node_command=send_node_command,
            allowed_config_roots=[str(r) for r in cs.allowed_config_roots], node_timeout_s=cs.node_timeout_s,
            settings=self.ls, fs_pool=self.fs_pool, find=self._find, apply=self._apply, emit=emit, post=post,
            clock=clock)
        self.checks = ArmChecks(coordinator=cs, nodes=nodes, emit=emit)
        self.steps = AnalysisSteps(
            store=store, jobs=jobs, analyser=analyser, scanner=scanner, work_dir=cs.work_dir, watch=settings.watch,
            analysis_workers=cs.analysis_workers, settings=self.ls, fs_pool=self.fs_pool, find=self._find,
            apply=self._apply, post=post, clock=clock,
            reference_for=lambda cap: self.references.for_analysis(cap, self.clock()),
            protected=lambda: self.references.protected())
        self._make_watcher = make_watcher
        self._watcher: WatcherPort | None = None
        self._jobs: dict[str, _Job] = {}
        self._batches: dict[str, BatchState] = {}  # capture_id -> its complete batch, until analysed
        self._scanning: set[str] = set()
        self._want_full: set[str] = set()  # captures whose prof_dir waits for a full look
        self._want_dirs: dict[str, set[str]] = {}  # capture_id -> rank dirs events named, waiting to be read
        self._next_scan: dict[str, float] = {}
        self.episodes = EpisodeDesk(  # anomalies as episodes; the capture queue (arming/episode_desk.py)
            settings=settings, store=store, jobs=jobs, detectors=detectors, emit=emit, arm=self.arm,
            in_flight=self._slot_held_for_episodes, topology=self.topology, policy=lambda: self.policy,
            withdraw=self.withdraw, host_load=self._host_load)
        self.references = ReferenceDesk(  # the job's healthy reference capture (changes/reference_desk.py)
            settings=settings, store=store, jobs=jobs, detectors=detectors, arm=self.arm,
            slot_busy=lambda job_id: lc.blocking_capture(self._job(job_id).active.values(),
                                                         self._generation(job_id)) is not None,
            open_episodes=lambda job_id: [e.opened_unix_s for e in self.episodes.book(job_id).open.values()],
            history=lambda job_id: self._job(job_id).history, topology=self.topology, policy=lambda: self.policy,
            find=self._find)

    def _slot_held_for_episodes(self, job_id: str) -> bool:
        """Whether a capture holds the job's config slot against an episode: a reference never does (an episode's
        arm cancels it: ``core/changes/reference.py``)."""
        blocker = lc.blocking_capture(self._job(job_id).active.values(), self._generation(job_id))
        return blocker is not None and blocker.reason != REFERENCE_REASON

    # -- start, stop ----------------------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the watcher, then resume the store's captures: in-flight ones from their state; those of the last
        hour also fill the arm history (older final ones stay in the store only); an ended one whose window is still
        ahead and that owes the idle config gets it again (``lc.owes_idle``: the write before the stop may have been
        lost)."""
        if self._make_watcher is not None:
            try:
                self._watcher = self._make_watcher(
                    lambda path: self.post(lambda: self.on_wake(path)),
                    lambda path, dirs: self.post(lambda: self.on_rank_dirs(path, dirs)))
            except Exception as exc:  # noqa: BLE001 - the periodic scan still finds every batch
                log.warning("watcher_unavailable", error=repr(exc))
        now = self.clock()
        self.episodes.start()
        self.references.start()
        hour = {c.capture_id: c for c in self.store.captures(since_unix_s=now - 3600)}
        ahead = {c.capture_id: c for c in self.store.captures(states=lc.IDLE_ENDINGS, judged_after_unix_s=now)}
        active = {c.capture_id: c for c in self.store.captures(states=lc.ACTIVE)}
        for cap in sorted({**hour, **ahead, **active}.values(), key=lambda c: (c.created_unix_s, c.capture_id)):
            job = self._job(cap.job_id)
            if cap.state in lc.ACTIVE:
                log.info("capture_resumed", capture_id=cap.capture_id, state=cap.state.value, prof_dir=cap.prof_dir)
                job.active[cap.capture_id] = cap
                self.writes.index(cap)
                self._apply(lc.resume(cap, now, self.ls), force_save=True)
            else:
                job.recent.append(cap)
                if lc.owes_idle(cap, now):
                    self.writes.write_idle(cap)
            gen = self._generation(cap.job_id)
            if (cap.created_unix_s >= now - 3600 and (cap.written_unix_s is not None or cap.state in lc.ACTIVE)
                    and (gen is None or cap.generation >= gen)):  # an older generation's arms: not this budget
                if cap.reason != REFERENCE_REASON and not lc.is_withdrawn(cap):  # a reference: bytes only
                    # stored as wall time; a clock that moved back meanwhile never holds an hourly slot > 1 h
                    job.history.record_arm(min(cap.created_unix_s, now), cap.capture_id)
                    repeat, named = self.episodes.book(cap.job_id).arm_marks(cap.capture_id)
                    # what the named-rank reserve and the gap read
                    job.history.mark_arm(cap.capture_id, repeat=repeat, named=named)
                if cap.analysis_status == "no_suspect":
                    job.history.release(cap.capture_id)  # found nothing: its hourly slot was given back
                if cap.state not in lc.ACTIVE and cap.total_bytes:
                    job.history.record_bytes(cap.state_since_unix_s, cap.total_bytes, ranks=len(cap.ranks),
                                             active_steps=cap.active)

    def close(self) -> None:
        """Stop the watcher; kill running tools (not awaited: an interrupted capture stays ``analysing`` in the
        store and is redone after the next start); join the workers."""
        if self._watcher is not None:
            self._watcher.close()
        self.analyser.cancel_all()
        try:
            self.fs_pool.shutdown(wait=True, cancel_futures=True)
            self.steps.shutdown()
        finally:
            self.analyser.close()

    def update_arming(self, settings: ArmingSettings) -> None:
        self.policy = ArmingPolicy(settings, self.s.analysis.ranking)

    # -- applying a transition ------------------------------------------------------------------------------------
    def _job(self, job_id: str) -> _Job:
        job = self._jobs.get(job_id)
        if job is None:
            job = self._jobs[job_id] = _Job({}, deque(maxlen=RECENT_PER_JOB), self.episodes.book(job_id).history)
        return job

    def _generation(self, job_id: str) -> int | None:
        """The job's current generation in the registry (None: not known there)."""
        job = self.jobs.get(job_id)
        return job.generation if job is not None else None

    def _caps(self, job_id: str) -> list[lc.Capture]:
        job = self._jobs.get(job_id)
        if job is None:
            return []
        return sorted([*job.recent, *job.active.values()], key=lambda c: (c.created_unix_s, c.capture_id))

    def _find(self, capture_id: str) -> lc.Capture | None:
        return next((j.active[capture_id] for j in self._jobs.values() if capture_id in j.active), None)

    def _apply(self, t: lc.Transition, ranks: Sequence[int] | None = None, force_save: bool = False) -> lc.Capture:
        """Apply one transition: store the new record (its ``ranks`` rows only, when given), move it between the
        job's in-flight and recent captures, publish its events, perform its actions. Returns the new record."""
        cap = t.capture
        job = self._job(cap.job_id)
        old = job.active.get(cap.capture_id) or next((c for c in job.recent if c.capture_id == cap.capture_id), None)
        if old is not cap or force_save:
            self.store.save_capture(cap, ranks if old is not None else None)
        if cap.state in lc.ACTIVE:
            job.active[cap.capture_id] = cap
        else:
            if job.active.pop(cap.capture_id, None) is not None:
                job.recent.append(cap)
                job.history.settle(cap.capture_id, self.clock(), cap.total_bytes, ranks=len(cap.ranks),
                                   active_steps=cap.active)
                self._forget(cap.capture_id)
            else:
                job.recent = deque((cap if c.capture_id == cap.capture_id else c for c in job.recent),
                                   maxlen=RECENT_PER_JOB)
        if old is None or old.state is not cap.state:
            self.count_state(cap.state.value)
        for ev in t.events:
            data = dict(ev.data)
            if ev.type in VERDICT_TYPES:  # whose generation it judged: after that generation's end, information only
                data.setdefault("generation", cap.generation)
            self.emit(ev.type, cap.job_id, data, event_id=ev.event_id)
        if old is not None and old.state in PARSING and cap.state not in PARSING:
            self.detectors.close_exclusion(cap.job_id, parse_reason(cap.capture_id))
        if old is not None and old.state in lc.IN_FLIGHT and cap.state not in lc.IN_FLIGHT:
            self.episodes.capture_ended(cap, t.events, self.clock())
            self.references.capture_ended(cap)
        for action in sorted(t.actions, key=lambda a: a.value):
            self._do(action, cap)
        return cap

    def _forget(self, capture_id: str) -> None:
        self._batches.pop(capture_id, None)
        self._next_scan.pop(capture_id, None)
        self._want_full.discard(capture_id)
        self._want_dirs.pop(capture_id, None)
        self.writes.forget(capture_id)

    def _do(self, action: lc.Action, cap: lc.Capture) -> None:
        if action is lc.Action.WRITE_CONFIG:
            self.writes.write_config(cap)
        elif action is lc.Action.WATCH and self._watcher is not None:
            try:  # mkdir -p without following a link below the allowed root (daemon/profwatch/adapters/fs/paths.py)
                make_dirs(cap.prof_dir, self.s.coordinator.allowed_prof_roots)
                self._watcher.watch(cap.prof_dir)
            except PathRefused as exc:
                self.on_path_refused(cap.capture_id, "mkdir", str(exc))
            except Exception as exc:  # noqa: BLE001 - the periodic scan covers an unwatchable dir
                log.warning("watch_failed", prof_dir=cap.prof_dir, error=repr(exc))
        elif action is lc.Action.UNWATCH and self._watcher is not None:
            try:
                self._watcher.unwatch(cap.prof_dir)
            except Exception:  # noqa: BLE001
                pass
        elif action is lc.Action.SCAN:
            self._schedule_scan(cap, self.clock())
        elif action is lc.Action.ANALYSE:
            batch = self._batches.get(cap.capture_id)
            if batch is not None:
                self.steps.analyse(cap, batch)
        elif action is lc.Action.STOP_ANALYSIS:
            self.analyser.cancel(cap.capture_id)
        elif action is lc.Action.RETAIN:
            self.steps.retain()
        elif action is lc.Action.ENRICH:
            self.steps.enrich(cap.capture_id)
        elif action is lc.Action.IDLE_CONFIG:
            self.writes.write_idle(cap)

    def causes(self, cap: lc.Capture, now: float) -> dict[int, str]:
        """Known causes per covered rank (node down or stale torch_npu state, backend failure, rank gone)."""
        return rank_causes(cap.expected_ranks, self.jobs.get(cap.job_id), self.nodes, now,
                           self.s.coordinator.node_timeout_s)

    # -- rank events, wake-ups, ticks ---------------------------------------------------------------------------------
    def on_capture_event(self, ev: wire.CaptureEvent, node_id: str, now: float) -> None:
        """A rank's capture event (from its hook, or torch_npu's dp log relayed by its node daemon)."""
        cap = lc.match_capture(self._caps(ev.job_id), ev)
        if cap is not None:
            self._apply(lc.rank_event(cap, ev, now, self.ls), ranks=[ev.rank])

    def on_wake(self, path: str) -> None:
        """The watcher asks for a full look under ``path``: scan the captures whose prof_dir holds it or lies under
        it."""
        p = os.path.abspath(path)
        for job in self._jobs.values():
            for cap in list(job.active.values()):
                d = os.path.abspath(cap.prof_dir)
                if lc.wants_scan(cap) and os.path.commonpath([p, d]) in (p, d):
                    self._schedule_scan(cap, self.clock())

    def on_rank_dirs(self, path: str, rank_dirs: frozenset[str]) -> None:
        """Events named ``rank_dirs`` under the watched ``path``: each capture waiting for its batch reads those of
        them inside its prof_dir (and only those)."""
        p = os.path.abspath(path)
        for job in self._jobs.values():
            for cap in list(job.active.values()):
                d = os.path.abspath(cap.prof_dir)
                if not lc.wants_scan(cap) or os.path.commonpath([p, d]) not in (p, d):
                    continue
                mine = frozenset(r for r in rank_dirs if r == d or r.startswith(d.rstrip("/") + "/"))
                if mine:
                    self._schedule_scan(cap, self.clock(), rank_dirs=mine)

    def tick(self, now: float) -> None:
        """Expire what is due; scan what waits for its batch every ``reconcile_interval_s``; (re)send idle writes."""
        self.writes.tick(now)
        self.episodes.tick(now)
        self.references.tick(now)
        for job in list(self._jobs.values()):
            for cap in list(job.active.values()):
                if lc.is_due(cap, now):
                    self._apply(lc.expire(cap, now, self.ls, self.causes(cap, now)))
                elif lc.wants_scan(cap) and now >= self._next_scan.get(cap.capture_id, 0.0):
                    self._schedule_scan(cap, now)

    # -- scans -------------------------------------------------------------------------------------------------------
    def _schedule_scan(self, cap: lc.Capture, now: float, rank_dirs: frozenset[str] | None = None) -> None:
        """Ask for a full look (``rank_dirs`` None) or for reads of ``rank_dirs``; what is asked while a scan of the
        capture runs waits and follows it (one scan per capture at a time, nothing asked is dropped)."""
        cid = cap.capture_id
        if rank_dirs is None:
            self._want_full.add(cid)
            self._next_scan[cid] = now + float(self.s.watch.reconcile_interval_s)
        else:
            waiting = self._want_dirs.setdefault(cid, set())
            waiting |= rank_dirs
            if len(waiting) > self.s.watch.max_changed_rank_dirs:  # bounded: one full look reads them all
                del self._want_dirs[cid]
                self._want_full.add(cid)
        if cid not in self._scanning:
            self._submit_scan(cap)

    def _submit_scan(self, cap: lc.Capture, resume: bool = False) -> None:
        """Start the next scan of ``cap``: the rank dirs waiting first (their change may complete the batch), then a
        full look; ``resume``: neither waits, continue the reconcile pass in progress."""
        cid = cap.capture_id
        dirs = self._want_dirs.pop(cid, None)
        rank_dirs: frozenset[str] | None
        if dirs:
            rank_dirs = frozenset(dirs)
        elif cid in self._want_full:
            self._want_full.discard(cid)
            rank_dirs = None
        elif resume:
            rank_dirs = frozenset()
        else:
            return
        self._scanning.add(cid)
        hint = CaptureHint(world_size=cap.world_size, rank_list=cap.rank_list, steps=cap.warmup + cap.active,
                           step_time_s=cap.step_time_s, armed_unix_s=cap.created_unix_s,
                           deadline_unix_s=cap.judge_unix_s - self.ls.parse_allowance_s)
        self.fs_pool.submit(self._scan, cid, cap.prof_dir, cap.world_size, hint, rank_dirs)

    def _scan(self, cid: str, prof_dir: str, world_size: int, hint: CaptureHint,
              rank_dirs: frozenset[str] | None = None) -> None:
        try:
            batches = self.scanner.scan(prof_dir, world_size=world_size, capture_id=cid, hint=hint,
                                        rank_dirs=rank_dirs)
            more = self.scanner.reconciling(prof_dir)
            self.post(lambda: self._on_scan(cid, batches, more))
        except PathRefused as exc:
            why = str(exc)
            self.post(lambda: self._on_scan_error(cid, why, refused=True))
        except Exception as exc:  # noqa: BLE001 - unknown is retried at the next tick, never judged
            err = repr(exc)
            self.post(lambda: self._on_scan_error(cid, err))

    def on_path_refused(self, cid: str, op: str, detail: str) -> None:
        """A capture's prof_dir failed its re-check before ``op`` (a component became a symlink): nothing was
        followed; one ``path_refused`` alert per capture and operation. The capture is judged at its deadline."""
        cap = self._find(cid) or self.store.get_capture(cid)
        job_id = cap.job_id if cap is not None else None
        log.warning("path_refused", capture_id=cid, op=op, detail=detail)
        self.emit(TYPE_PATH_REFUSED, job_id, {
            "capture_id": cid, "op": op, "reason": "path_swapped", "prof_dir": cap.prof_dir if cap else None,
            "problems": [detail]}, event_id=f"path_refused-{cid}-{op}")

    def _on_scan_error(self, cid: str, err: str, refused: bool = False) -> None:
        self._scanning.discard(cid)
        self._want_dirs.pop(cid, None)  # the next full look (tick) reads them again
        if refused:
            self.on_path_refused(cid, "scan", err)
        else:
            log.warning("scan_failed", capture_id=cid, error=err)

    def _on_scan(self, cid: str, batches: list[BatchState] | None, more: bool = False) -> None:
        """A scan's answer: judge it (None: nothing to decide yet), then start what waits, or resume the pass."""
        self._scanning.discard(cid)
        cap = self._find(cid)
        if cap is None:
            return
        if batches is not None:
            self._judge_scan(cap, batches)
        cap = self._find(cid)
        if cap is not None and lc.wants_scan(cap):
            self._submit_scan(cap, resume=more)

    def _judge_scan(self, cap: lc.Capture, batches: list[BatchState]) -> None:
        cid = cap.capture_id
        now = self.clock()
        batch = lc.pick_batch(cap, batches)
        if batch is not None:  # read each parsed rank dir's own tables now, while the others still parse
            self.steps.prefetch(cid, batch)
        t = lc.scan_result(cap, batch, now, self.ls, self.causes(cap, now))
        if lc.Action.ANALYSE in t.actions and batch is not None:
            self._batches[cid] = batch
            self.store.save_batch(batch.batch_id, cid, cap.job_id, batch.status, now, batch.to_json())
            groups = batch.parallel_groups()
            if groups:  # the communicators the next targeted capture of the job can pick group peers from
                job = self._job(cap.job_id)
                job.groups, job.groups_from = groups, cid
        self._apply(t)

    # -- arming --------------------------------------------------------------------------------------------------------
    def topology(self, job_id: str) -> JobTopology | None:
        """The job's layout for targeted captures: its size, each rank's host (hellos) and the communication groups
        of its last complete batch (None for an unknown job)."""
        job = self.jobs.get(job_id)
        if job is None:
            return None
        mine = self._job(job_id)
        return JobTopology(world_size=job.world_size,
                           hosts={r.rank: r.hostname for r in job.ranks.values() if r.hostname},
                           groups=mine.groups or {}, groups_from=mine.groups_from)

    def _host_load(self, job_id: str, ep: Episode, now: float) -> LoadExplanation | None:
        """The host-load evidence of a job-wide episode over the nodes the job's ranks run on
        (``daemon/profwatch/core/fleet/host_load.py``; None: unknown job or no data)."""
        job = self.jobs.get(job_id)
        if job is None:
            return None
        ids = sorted({r.node_id for r in job.ranks.values() if r.node_id})
        return explain_job_change([(n, self.nodes[n].host_load) for n in ids if n in self.nodes],
                                  opened_s=ep.opened_unix_s, now_s=now, magnitude=ep.magnitude)

    def on_anomaly(self, an: Anomaly, now: float) -> None:
        """A detector's report: its episode is opened or updated and the job's capture queue runs
        (``daemon/profwatch/arming/episode_desk.py``; the arming path shared with ``profwatch replay``)."""
        self.episodes.on_anomaly(an, now)

    def arm(self, job_id: str, req: CaptureRequest, now: float, dry_run: bool = False) -> ArmResult:
        """Plan one capture and start its life (the arm port of the desks, ``daemon/profwatch/arming/port.py``; the
        ``arm`` control command replies with ``arm_reply`` of it). A dry run plans the same and says whether the arm
        would be refused. A capture in flight (named, with its deadline) refuses it: :attr:`ArmResult.refused`
        (``conflict``), nothing opened. Raises ``ControlError``: ``not_found``, ``refused`` (paths, ranks or nodes not
        ready), ``bad_request`` (cannot plan, e.g. no step time measured yet: ``core/capture/planner.py``; the
        refusal rules: ``core/arming/admission.py``)."""
        job = self.jobs.get(job_id)
        if job is None:
            raise ControlError("not_found", unknown_job_text(job_id, self.jobs))
        self.checks.check_armable(job, req, now)
        req = self._yield_reference(job, req, now, dry_run)
        live = {r.rank: r for r in job.ranks.values() if not r.left}
        times: dict[int, float] = {}
        for r, st in live.items():
            m = median(st.window.recent_times(20)) if st.window is not None else None
            if m:
                times[r] = m
        # one step-time definition with replay: the detector's baseline, else the registry's recent median; none
        # measured yet is the planner's refusal (no step time is assumed: the lead of an absolute start_step
        # placed on a guess may be passed before the ranks read the config)
        step_time = planning_step_time_s(self.detectors.baseline_step_time_s(job.job_id), job.median_step_time_s())
        progress = JobProgress(job_id=job.job_id, world_size=job.world_size, furthest_step=max(0, job.furthest_step()),
                               step_time_s=step_time, prof_root=job.prof_root or "", now_unix_s=now,
                               rank_steps={r: max(0, s.last_step) for r, s in live.items()}, rank_step_time_s=times)
        if req.capture_id is None:  # ids come from the job and the time: two arms within 1 ms get a suffix
            base = cid = new_capture_id(job.job_id, now)
            n = 0
            while any(c.capture_id == cid for c in self._caps(job.job_id)) or self.store.get_capture(cid):
                n += 1
                cid = f"{base}-{n}"
            req = req.model_copy(update={"capture_id": cid})
        try:
            plan = plan_capture(req, progress, self.s.capture)
        except (CannotPlanCapture, ValueError) as exc:
            raise ControlError("bad_request", str(exc)) from None
        covered = plan.rank_list if plan.rank_list is not None else list(range(job.world_size))
        writer = self.s.coordinator.config_writer
        nodes = sorted({live[r].node_id for r in covered if r in live and live[r].node_id}) if writer == "node" else []
        out = ArmResult(plan=plan, job_id=job.job_id, world_size=job.world_size,
                        profiler_config_path=job.profiler_config_path, writer=writer, nodes=tuple(nodes),
                        furthest_step=progress.furthest_step, step_time_s=step_time, dry_run=dry_run, at_unix_s=now,
                        warnings=tuple(self.checks.arm_warnings(job, set(covered))))
        blocker = lc.blocking_capture(self._job(job.job_id).active.values(), job.generation)
        if blocker is not None and dry_run and req.reason != REFERENCE_REASON and blocker.reason == REFERENCE_REASON:
            blocker = None  # the arm would cancel it (_yield_reference)
        if blocker is not None:
            return replace(out, refused=ArmRefusal("conflict", refusal(blocker, now), blocker.capture_id,
                                                   blocker.state.value, blocker.deadline_unix_s))
        if dry_run:
            return out
        t = lc.open_capture(plan, world_size=job.world_size, profiler_config_path=job.profiler_config_path or "",
                            writer=writer, rank_steps=progress.rank_steps, rank_step_time_s=times,
                            rank_backends={r: s.backend for r, s in live.items()}, nodes=nodes, now=now,
                            settings=self.ls, step_time_s=step_time, generation=job.generation)
        history = self._job(job.job_id).history
        if req.reason != REFERENCE_REASON:  # a reference is not counted toward max_captures_per_hour
            history.record_arm(now, plan.capture_id)
        per_rank = history.bytes_per_rank_step
        history.reserve(plan.capture_id, now, estimate_capture_bytes(
            len(covered), plan.active, per_rank if per_rank is not None else self.s.arming.targeting.bytes_per_rank_step))
        first, last = profiled_report_steps(plan.start_step, plan.warmup, plan.active)
        self.detectors.exclude_steps(job.job_id, first, last, f"capture {plan.capture_id}")
        # and the steps after it while the ranks write and parse their dirs (torch_npu's parse competes with the
        # job for the host): until the batch is complete or the capture ends (_apply closes it, so it is opened
        # first)
        self.detectors.exclude_until_closed(job.job_id, last + 1, parse_reason(plan.capture_id))
        return replace(out, capture=self._apply(t))

    def _yield_reference(self, job: JobState, req: CaptureRequest, now: float, dry_run: bool) -> CaptureRequest:
        """An arm that is not a reference cancels the job's reference whose window has not ended (an episode never
        waits for a reference) and starts after that window (``yield_start_after``); a dry run cancels nothing."""
        if req.reason == REFERENCE_REASON or req.start_step is not None:
            return req
        ref = lc.reference_in_window(self._job(job.job_id).active.values())
        if ref is None:
            return req
        after = yield_start_after(ref.start_step, ref.warmup, ref.active, max(0, job.furthest_step()))
        if not dry_run:
            log.info("reference_yields", job_id=job.job_id, capture_id=ref.capture_id, reason=req.reason)
            self._apply(lc.cancel(ref, now, self.ls, by=f"an episode's arm ({req.reason})"))
        return req.model_copy(update={"in_steps": max(req.in_steps or 0, after)}) if after else req

    def withdraw(self, job_id: str, capture_id: str, why: str, now: float) -> bool:
        """Withdraw ``capture_id`` before its window (its episode's excursion came back: ``why``;
        ``lc.withdraw``: cancelled with the idle config over its arm). Returns False, changing nothing, when it is
        not in flight or a rank started its window."""
        cap = self._job(job_id).active.get(capture_id)
        t = lc.withdraw(cap, now, self.ls, why) if cap is not None else None
        if t is None:
            return False
        log.info("capture_withdrawn", job_id=job_id, capture_id=capture_id, why=why)
        self._apply(t)
        return True

    # -- control commands ----------------------------------------------------------------------------------------------
    def cancel(self, job_id: str, capture_id: str | None, now: float) -> list[dict[str, Any]]:
        """Cancel ``capture_id`` (of ``job_id``) or every in-flight capture of the job (an ``enriching`` one, whose
        verdict is out and which holds no config slot, is left to finish: before, it refused the whole cancel with
        "nothing to cancel" while an arm made after it stayed pending). Raises ``ControlError``."""
        active = list(self._job(job_id).active.values())
        caps = [c for c in active if c.capture_id == capture_id or (capture_id is None and c.state in lc.IN_FLIGHT)]
        if capture_id is not None and not caps:
            known = next((c for c in self.store.captures(job_id) if c.capture_id == capture_id), None)
            if known is None:
                raise ControlError("not_found", f"job {job_id!r} has no capture {capture_id!r}")
            caps = [known]
        if not caps:
            busy = "".join(f"; {c.capture_id} is {c.state.value} (its verdict is out)" for c in active)
            raise ControlError("not_found", f"job {job_id!r} has no capture in flight{busy}")
        out = []
        for cap in caps:
            try:
                t = lc.cancel(cap, now, self.ls, by="profwatch cancel")
            except lc.TransitionRefused as exc:
                raise ControlError("conflict", str(exc)) from None
            out.append({**describe(self._apply(t), now), "idle_config": lc.Action.IDLE_CONFIG in t.actions})
        return out

    def capture_view(self, capture_id: str, now: float) -> dict[str, Any]:
        """One capture for ``profwatch arm --wait``: its ``status`` view plus each unacknowledged rank explained."""
        cap = self._find(capture_id) or self.store.get_capture(capture_id)
        if cap is None:
            raise ControlError("not_found", f"unknown capture {capture_id!r}")
        missing = [r for r, p in sorted(cap.ranks.items()) if not p.acknowledged]
        view = describe(cap, now)
        view["unacknowledged"] = explain_ranks(cap, missing[:64], self.causes(cap, now))
        return view

    @property
    def scans_in_flight(self) -> int:
        """Scans submitted and not yet handed back (tests wait on it; ``status`` may show it)."""
        return len(self._scanning)

    def summary(self, job_id: str | None, now: float) -> list[dict[str, Any]]:
        """The last 20 captures (of ``job_id``) for ``status``, those the failing store has not taken yet marked
        ``stored: false``; an analysing or enriching one names the recipes
        running for it with their elapsed time (``running``: ``"<recipe> (<elapsed> s)"``; ``running_recipes``:
        the same as objects, with phase and resident memory when the analyser tells them) and, while a worker
        holds or queues it, its ``stage`` and the captures ``ahead`` of it (``AnalysisSteps.stage_of``)."""
        live = {c.capture_id: c for j in self._jobs.values() for c in j.active.values()}
        out = []
        for cap, stored in self.store.captures_with_pending(job_id, newest=20):
            view = describe(live.get(cap.capture_id, cap), now)
            if not stored:
                view["stored"] = False  # the state store failed: kept in memory for a retry (status marks it)
            if live.get(cap.capture_id, cap).state in (lc.S.ANALYSING, lc.S.ENRICHING):
                where = self.steps.stage_of(cap.capture_id)
                if where is not None:  # queued for a worker, or on one (AnalysisSteps.STAGES)
                    view.update(where)
                queued = where is not None and where["stage"].endswith("_queued")
                view["running"] = [] if queued else self.analyser.running(cap.capture_id)
                detailed = getattr(self.analyser, "running_recipes", None)
                if detailed is not None:
                    view["running_recipes"] = [] if queued else detailed(cap.capture_id)
            out.append(view)
        return out

    def on_node_ack(self, ack: wire.NodeAck, now: float) -> None:
        """A node daemon answered a ``write_config`` command (``ConfigWrites.on_node_ack``)."""
        self.writes.on_node_ack(ack, now)

    def on_hello(self, job: JobState, msg: wire.RankHello, now: float) -> None:
        """Check the paths and the capture backend a hello names (``ArmChecks.on_hello``)."""
        self.checks.on_hello(job, msg, now)

    # -- hellos ----------------------------------------------------------------------------------------------------------
    def on_job_ended(self, job_id: str, now: float) -> None:
        """The job ended: cancel its captures whose window has not started (``lc.job_ended``); the others run to
        their deadlines."""
        job = self._jobs.get(job_id)
        for cap in list(job.active.values()) if job is not None else []:
            t = lc.job_ended(cap, now, self.ls)
            if t is not None:
                self._apply(t)

    def supersede_generation(self, job_id: str, generation: int, now: float) -> None:
        """The job started ``generation``: close its captures of older generations that still wait for their ranks
        as superseded (``lc.supersede``; data kept, nothing deleted; an ``analysing`` one finishes without holding
        the new generation's arms back) and start the job's arm history afresh (cooldown and hourly caps count the
        new generation's arms only; ``docs/generations.md``)."""
        job = self._job(job_id)
        for cap in list(job.active.values()):
            self._apply(lc.supersede(cap, generation, now, self.ls))
        # its episodes close and its budget starts afresh: the old run's arms never hold the new run's
        self._job(job_id).history = self.episodes.new_generation(job_id, now)
        self.references.new_generation(job_id)
