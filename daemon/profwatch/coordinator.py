"""Coordinator daemon (composition root): telemetry ingest, registry, detection, arming, capture tracking,
control socket, event/alert stream and state store.

Sockets (``daemon/profwatch/adapters/zmq/server_sockets.py``): ingest ROUTER (node DEALERs connect), control ROUTER (CLI REQ
clients), PUB (subscribers); CURVE-authenticated beyond loopback. A node speaks for the node id its key names
(``daemon/profwatch/core/fleet/peers.py``); each control command needs the role ``daemon/profwatch/core/access.py`` lists for it.
One thread owns the sockets and the SQLite connection (the main loop). File system work (config writes on shared
storage, rank-dir scans) and analyses run on worker threads and hand results back through a queue (FC-15).
"""

from __future__ import annotations

import hashlib
import os
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog
import zmq

from profwatch.adapters.clock import SteadyClock
from profwatch.adapters.outputs.alert_sinks import AlertSinks
from profwatch.adapters.outputs.metrics import DaemonMetrics
from profwatch.adapters.outputs.sd_notify import SdNotifier
from profwatch.adapters.store.state import Stored
from profwatch.adapters.store.state_open import open_state_store
from profwatch.adapters.zmq import control
from profwatch.adapters.zmq.server_sockets import ServerSockets
from profwatch.captures.ports import BatchAnalyser, RankDirScanner
from profwatch.captures.shell import CaptureShell
from profwatch.config import Settings
from profwatch.coordinator_control import ControlCommands
from profwatch.core.alerts.alertmanager import VERDICT_TYPES
from profwatch.core.alerts.event_types import (
    ALERT_TYPES,
    ANOMALY_KIND_TYPES,
    TYPE_ANOMALY,
    TYPE_JOB_ENDED,
    TYPE_JOB_GENERATION,
    TYPE_JOB_ID_COLLISION,
    TYPE_PATH_REFUSED,
    TYPE_STATE_STORE_RESET,
    TYPE_STORAGE_FAILED,
    TYPE_STORAGE_RECOVERED,
)
from profwatch.core.alerts.events import collision_data, collision_event_id, make_cloudevent
from profwatch.core.capture.planner import spike_hold
from profwatch.core.detection.job_detector import Anomaly, JobDetector
from profwatch.core.fleet.generations import GenerationOpened
from profwatch.core.fleet.job_end import EndedJobs, JobEnded, JobEndTracker
from profwatch.core.fleet.peers import NodeRoutes
from profwatch.core.fleet.registry import GenerationPending, Registry, RegistryError
from profwatch.core.fleet.registry_state import HelloOutcome, JobState, changed_rows, jobs_from_rows, registry_rows
from profwatch.core.messages import MessageRejected, parse_node_message
from profwatch.logsetup import OncePerKind
from rankhook import wire

log = structlog.get_logger("profwatch.coordinator")
INGEST_PASS_S = 0.2
"""Longest one pass over the ingest socket runs before control requests and timers get their turn (seconds)."""



class _DetectorView:
    """The capture shell's narrow view of the coordinator's detectors (``DetectorsPort``)."""

    def __init__(self, detectors: dict[str, JobDetector]) -> None:
        self._d = detectors

    def exclude_steps(self, job_id: str, first: int, last: int, reason: str) -> None:
        det = self._d.get(job_id)
        if det is not None:
            det.exclude_steps(first, last, reason)

    def exclude_until_closed(self, job_id: str, first: int, reason: str) -> None:
        det = self._d.get(job_id)
        if det is not None:
            det.exclude_until_closed(first, reason)

    def close_exclusion(self, job_id: str, reason: str) -> None:
        det = self._d.get(job_id)
        if det is not None:
            det.close_exclusion(reason)

    def stalled_ranks(self, job_id: str) -> frozenset[int]:
        det = self._d.get(job_id)
        return frozenset(det.stalled_ranks) if det is not None else frozenset()

    def baseline_step_time_s(self, job_id: str) -> float | None:
        det = self._d.get(job_id)
        return det.baseline_step_time_s if det is not None else None

    def ongoing(self, job_id: str) -> dict[str, frozenset[int]]:
        det = self._d.get(job_id)
        return det.ongoing() if det is not None else {}

    def unit_steps(self, job_id: str) -> dict[int, int] | None:
        det = self._d.get(job_id)
        return det.unit_steps() if det is not None else None

    def excursion_returned(self, job_id: str, first_step: int) -> dict[str, Any] | None:
        det = self._d.get(job_id)
        r = det.excursion_returned(first_step) if det is not None else None
        return r.to_json() if r is not None else None


def _start_watcher(on_wake: Callable[[str], None], on_rank_dirs: Callable[[str, frozenset[str]], None],
                   settings: Settings, metrics: Any = None) -> Any:
    from profwatch.adapters.fs.prof_watch import ProfWatcher

    watcher = ProfWatcher(on_wake, settings=settings.watch, metrics=metrics, on_rank_dirs=on_rank_dirs,
                          reconcile=False)  # the capture shell's tick is the one reconcile timer
    watcher.start()
    return watcher


def _peer(route: bytes, key: str | None) -> str:
    """A refused message's sender as logged: its certificate name under CURVE, else its connection's routing id."""
    return f"key:{key}" if key is not None else f"conn:{route.hex()}"


class WorkDirUnusable(Exception):
    """``[coordinator] work_dir`` cannot be created or written: the coordinator does not start (exit 2)."""


def make_work_dir(path: Path) -> None:
    """Create ``[coordinator] work_dir`` (with its parents) and check this user may write in it.

    Raises:
        WorkDirUnusable: it cannot be created or is not a writable folder; the message names the key, the path and
            the cause. Before, such a coordinator started and each analysis then failed to stage or write its
            report (``work_dir = "/proc/nope"`` started without a word)."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise WorkDirUnusable(f"[coordinator] work_dir {path}: cannot create {exc.filename or path}: "
                              f"{exc.strerror or exc}; give work_dir a folder this user may create and write") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise WorkDirUnusable(f"[coordinator] work_dir {path}: this user (uid {os.getuid()}) may not write in it; "
                              "give work_dir a folder this user may write")


def work_dir_problem(path: Path) -> str | None:
    """Why ``make_work_dir(path)`` would refuse ``path`` for any user, judged without writing (``profwatch config
    check``): the nearest existing path on its way is not a folder. ``None``: it may be usable. Permissions are left
    to the coordinator's start (:func:`make_work_dir`), which runs as the service's user: a check run by another user
    would judge the wrong one. Only ``stat``."""
    here = path
    while not here.exists() and here != here.parent:
        here = here.parent
    if not here.is_dir():
        return f"{path}: {here} is not a folder, so work_dir cannot be created there"
    return None


class Coordinator:
    """The coordinator. ``run()`` blocks until ``stop()``; everything persistent is in ``settings.coordinator.state_db``.

    Raises:
        zmq.ZMQError: an endpoint cannot be bound (address in use).
        sqlite3.DatabaseError: the state database is not usable.
        profwatch.adapters.zmq.curve.CurveSetupError: CURVE is required but a key is missing or the self-test failed.
        SinkConfigError: an alert sink's Authorization or TLS file is unusable.
    """

    def __init__(self, settings: Settings, metrics: DaemonMetrics | None = None,
                 notifier: SdNotifier | None = None) -> None:
        self.settings = settings
        cs = settings.coordinator
        self.metrics = metrics or DaemonMetrics("coordinator")
        self._rank_messages_in = self.metrics.messages_in.labels("rank_message")  # per batch: looked up once
        self.notifier = notifier or SdNotifier({})
        self._stop = threading.Event()
        self.clock = SteadyClock()  # deadlines, last heard, job end and expiry never step with the wall clock
        self._ended = EndedJobs()  # (job, generation) pairs silent since their job_ended: verdicts are information
        # alert sinks: every emitted event goes to them; standing Alertmanager alerts are rebuilt from the store
        make_work_dir(cs.work_dir)  # before anything is opened: a refusal leaves nothing to close
        self.sinks = AlertSinks.from_settings(settings.alertmanager, settings.webhook, os.environ, self.metrics)
        try:
            lim = settings.limits
            # a corrupt file is moved aside (kept) and the store starts empty; a newer schema still stops the start
            self.state, self._store_reset = open_state_store(
                cs.state_db, time.time(), retry_max_items=lim.state_retry_queue_items,
                retry_max_bytes=lim.state_retry_queue_bytes,
                on_failed=lambda op, _err: self.metrics.state_store_failures.labels(op).inc(),
                on_dropped=lambda kind, n: self.metrics.state_store_dropped.labels(kind).inc(n))
            self.sinks.restore(self.state.iter_events(self.sinks.restore_types))
            self.sinks.attach_outbox(self.state)
        except Exception:
            self.sinks.close()
            if getattr(self, "state", None) is not None:
                self.state.close()  # releases the single-writer lock
            raise
        self._job_end = JobEndTracker(cs.job_end_after_s, cs.job_startup_allowance_s)
        self._next_observe = 0.0
        self._ctx = zmq.Context()
        self.registry = Registry(window_steps=cs.window_steps, limits=settings.limits)
        self.routes = NodeRoutes(settings.limits.max_nodes)  # node id <-> ingest connection (identity binding)
        self.detectors: dict[str, JobDetector] = {}
        self._previous_levels: dict[str, tuple[float, int]] = {}
        """Per job whose generation changed, the old generation's learned level until the new detector is built
        (``JobDetector.generation_level``; one entry per known job at most, dropped when the job expires)."""
        self._detector_ranks = 0  # sum of world sizes of jobs with a detector (bounded by limits.max_ranks_total)
        self._known_nodes: set[str] = set()  # nodes seen since this process started (others must re-register)
        self._once = OncePerKind()
        self._storage_failed: float | None = None  # when the current storage_failed alert was raised
        self._flushed_generation: dict[str, int] = {}  # job -> generation whose rank rows the store holds
        self._peer_logged: dict[tuple[str, str], float] = {}
        self._arrival_s = self.clock()  # the current batch's arrival (detectors' stall checks), on the steady clock
        self.counters = {"received": 0, "rejected": 0, "batches": 0, "lost_batches": 0, "events": 0}
        self.results: queue.Queue[Callable[[], None]] = queue.Queue()
        self._restore_registry()
        self._restore_ended()
        try:
            self.sockets = ServerSockets(self._ctx, cs.binds(), settings.security, settings.limits,
                                         on_refused=lambda sock, why: self.metrics.auth_refused.labels(sock, why).inc(),
                                         on_closed=lambda sock: self.metrics.connections_closed.labels(sock).inc())
        except BaseException:
            self.state.close()
            self._ctx.term()
            raise
        self.ingest = self.sockets.ingest
        self.control_sock = self.sockets.control
        self.pub = self.sockets.pub
        from profwatch.adapters.fs.config_writer import ConfigWriter

        self.captures = CaptureShell(
            settings=settings, store=self.state, jobs=self.registry.jobs, nodes=self.registry.nodes,
            writer=ConfigWriter(), send_node_command=self.send_node_command, scanner=RankDirScanner(settings.watch, settings.coordinator.allowed_prof_roots),
            analyser=BatchAnalyser(settings.analysis, assets_dir=Path(settings.coordinator.work_dir)), detectors=_DetectorView(self.detectors), emit=self.emit,
            post=self.results.put, clock=self.clock, make_watcher=lambda on_wake, on_rank_dirs: _start_watcher(
                on_wake, on_rank_dirs, settings, self.metrics),
            count_state=lambda state: self.metrics.captures.labels(state).inc())
        self.control = ControlCommands(
            sockets=self.sockets, settings=settings, registry=self.registry,
            captures=self.captures, state=self.state, detectors=self.detectors, counters=self.counters,
            bounds=self._bounds, reject=self._reject, refuse_peer=self._refuse_peer, clock=self.clock)
        bound = settings.limits.coordinator_peak_bytes(cs.window_steps, wire.MAX_BATCH_BYTES, control.MAX_REQUEST_BYTES)
        self._state_bound_mib = round(bound["total"] / 2**20)
        if self._store_reset is not None:
            self.metrics.state_store_resets.inc()
            self.emit(TYPE_STATE_STORE_RESET, None, self._store_reset.to_json(),
                      event_id=f"state_store_reset-{int(time.time() * 1000)}")
        log.info("coordinator_started", ingest=self.sockets.bound["ingest"], control=self.sockets.bound["control"],
                 pub=self.sockets.bound["pub"],
                 curve=sorted(k for k, v in self.sockets.curve.items() if v), state_db=str(cs.state_db),
                 jobs=len(self.registry.jobs), state_bound_mib=self._state_bound_mib)

    # -- persistence --------------------------------------------------------------------------------------------
    def _restore_registry(self) -> None:
        jobs, ranks, _nodes = self.state.load_registry()
        for job in jobs_from_rows(jobs, ranks, self.registry.window_steps):
            self.registry.restore(job)
            self._flushed_generation[job.job_id] = job.generation

    def _restore_ended(self) -> None:
        """Rebuild the ended (job, generation) pairs from the stored ``job_ended`` events (an event stored before
        they carried ``generation`` counts for the job's restored generation), and the end of each restored job
        whose current generation ended: its next report opens a new generation (``resumed_after_end``), as it
        does without a restart, so an ended generation is never live again."""
        for ev in self.state.iter_events((TYPE_JOB_ENDED,)):
            data = ev.get("data") or {}
            job_id = str(ev.get("subject") or "")
            gen = data.get("generation")
            if not isinstance(gen, int) or isinstance(gen, bool):
                job = self.registry.jobs.get(job_id)
                gen = job.generation if job is not None else 0
            last = data.get("last_report_unix_s")
            self._ended.mark(job_id, gen, float(last) if isinstance(last, (int, float)) else 0.0)
            job = self.registry.jobs.get(job_id)
            if job is not None and job.generation == gen:
                self.registry.note_ended(job_id, self.clock())

    def _flush_registry(self, full: bool = True) -> None:
        """Write the registry's rows. ``full``: every job, rank and node with its per-step fields (last step, step
        time, last heard), at ``registry_full_flush_s`` and on shutdown; else only the records whose identity
        changed since the last flush (hello, bye, new rank or node, a new generation: its rank rows are replaced),
        every ``registry_flush_s``: work proportional to what changed, not to the ranks. Raises what the store
        raises; the changes are then kept for the next flush."""
        reg = self.registry
        changed = reg.take_changes()
        try:
            reset = [j.job_id for j in reg.jobs.values()
                     if self._flushed_generation.get(j.job_id, j.generation) != j.generation]
            if full:
                jobs, ranks, nodes = registry_rows(reg.jobs.values(), reg.nodes.values())
            else:
                jobs, ranks, nodes = changed_rows(reg.jobs, reg.nodes, changed, reset)
            if jobs or ranks or nodes or reset:
                self.state.save_registry(jobs, ranks, nodes, reset_ranks_of=reset)
        except BaseException:
            reg.changed_jobs |= changed[0]
            reg.changed_ranks |= changed[1]
            reg.changed_nodes |= changed[2]
            raise
        self._flushed_generation = {j.job_id: j.generation for j in reg.jobs.values()}

    # -- events -------------------------------------------------------------------------------------------------
    def emit(self, type_: str, job_id: str | None, data: dict[str, Any], event_id: str | None = None) -> dict[str, Any] | None:
        """Store and publish one CloudEvent; events are deduplicated by ``event_id`` on every path (store, PUB,
        sinks). When the store fails the event is published anyway and kept for a retry (``storage_failed``).
        Returns the event, or None when it was a duplicate."""
        now = time.time()
        if type_ in VERDICT_TYPES and job_id:
            data = self._stamp_verdict(job_id, data)
        ev = make_cloudevent(type_, job_id or "_", data, source=self.settings.coordinator.event_source,
                             now_unix_s=now, event_id=event_id)
        is_alert = type_ in ALERT_TYPES
        stored = self.state.add_event(ev, is_alert)
        if stored is Stored.DUPLICATE:
            return None
        self.pub.publish(ev, is_alert)
        self.metrics.observe_event(ev)
        self.counters["events"] += 1
        self.sinks.submit(ev, is_alert, now)
        log.info("event_published", type=type_, job_id=job_id, event_id=ev["id"], stored=stored.value)
        if stored is Stored.QUEUED:
            self._check_store(self.clock())
        return ev

    def _stamp_verdict(self, job_id: str, data: dict[str, Any]) -> dict[str, Any]:
        """A capture verdict's ``generation`` (the capture's, else the job's current one) and ``job_ended``: True
        when that generation ended and has not reported since (information only: no firing alert,
        ``docs/alerts.md``)."""
        gen = data.get("generation")
        if not isinstance(gen, int) or isinstance(gen, bool):
            job = self.registry.jobs.get(job_id) if hasattr(self, "registry") else None
            gen = job.generation if job is not None else None
        out = dict(data)
        if gen is not None:
            out["generation"] = gen
        out["job_ended"] = self._ended.ended(job_id, gen)
        return out

    def _bounds(self) -> dict[str, int]:
        """The sizes ``status`` shows against their limits, and the coordinator's computed memory bound (MiB)."""
        return {"jobs": len(self.registry.jobs), "ranks": self.registry.rank_count, "nodes": len(self.registry.nodes),
                "detector_ranks": self._detector_ranks, "state_bound_mib": self._state_bound_mib}

    def _check_store(self, now: float) -> None:
        """Retry the store's queued writes when due; raise ``storage_failed`` once per failure episode and say
        ``storage_recovered`` when everything is stored again."""
        ok = self.state.retry(now)
        self.metrics.state_store_pending.set(len(self.state.queue))
        if not ok and self._storage_failed is None:
            self._storage_failed = now
            st = self.state.status()
            self.emit(TYPE_STORAGE_FAILED, None, {
                "path": self.state.path, "error": st["last_error"], "pending": st["pending"],
                "failures": st["failures"], "since_unix_s": st["failing_since_unix_s"],
                "note": "events are published anyway and stored when the store takes writes again; "
                        "free space on the state disk"}, event_id=f"storage_failed-{int(now * 1000)}")
        elif ok and self._storage_failed is not None:
            since, self._storage_failed = self._storage_failed, None
            self.emit(TYPE_STORAGE_RECOVERED, None, {"path": self.state.path, "failed_for_s": round(now - since, 3),
                                                     "dropped": dict(self.state.dropped)},
                      event_id=f"storage_recovered-{int(now * 1000)}")

    # -- main loop ----------------------------------------------------------------------------------------------
    def stop(self) -> None:
        self._stop.set()

    def ready_checks(self) -> dict[str, tuple[bool, str]]:
        """``/readyz`` (``profwatch.core.health``): the state db open, the sockets bound (each with the endpoint it
        is bound to: the real port where the config says 0), the analysis workers up. Read from the HTTP thread:
        attribute reads only, no SQL, no socket call."""
        store_open = not getattr(self.state, "closed", False)
        failing = getattr(self.state, "failing_since_unix_s", None)
        binds = self.sockets.bound  # as bound (a configured port 0 is the port ZeroMQ picked), set before serving
        socks = {"ingest": self.ingest, "control": self.control_sock, "pub": getattr(self.pub, "sock", None)}
        unbound = [n for n, s in socks.items() if s is None or s.closed]  # pub: None while it is being rebound
        workers_ok, workers = self.captures.steps.workers_up()
        return {
            "state_db": (store_open, f"{self.settings.coordinator.state_db} "
                         + ("open" if store_open else "closed")
                         + (f" (writes failing since {failing:.0f}, queued for retry)" if failing else "")),
            "sockets": (not unbound, "bound: " + ", ".join(f"{n} {binds[n]}" for n in socks if n not in unbound)
                        + (f"; not bound: {', '.join(unbound)}" if unbound else "")),
            "analysis_workers": (workers_ok, workers),
        }

    def run(self) -> None:
        """Serve until stopped; always closes sockets, workers and the state store."""
        cs = self.settings.coordinator
        poller = self._poller()
        next_tick = next_flush = next_expiry = 0.0
        next_full = self.clock() + cs.registry_full_flush_s
        revocable = self.sockets.revocable  # the event stream under CURVE with a key ring: checked every turn
        self.captures.start()
        self.notifier.ready("serving")
        try:
            while not self._stop.is_set():
                self.notifier.watchdog(time.monotonic())  # only while this loop turns (systemd WatchdogSec)
                self.metrics.health.tick(time.monotonic())  # /healthz: the same loop turning
                events = dict(poller.poll(int(cs.tick_interval_s * 1000 / 2)))
                if self.ingest in events:
                    self._drain_ingest()
                if self.control_sock in events:
                    self.control.drain()
                if len(events) > (self.ingest in events) + (self.control_sock in events):
                    self.sockets.poll_monitors()
                if revocable and self._check_revocations():  # else subscriptions are drained at each tick
                    poller = self._poller()
                self._drain_results()
                now = self.clock()
                if self._storage_failed is not None or len(self.state.queue):
                    self._check_store(now)
                if now >= next_tick:
                    next_tick = now + cs.tick_interval_s
                    self._tick(now)
                if now >= next_expiry:
                    next_expiry = now + min(10.0, self.settings.limits.job_expiry_s / 4)
                    self._expire(now)
                if now >= next_flush:
                    next_flush = now + cs.registry_flush_s
                    full = now >= next_full
                    if full:
                        next_full = now + cs.registry_full_flush_s
                    try:
                        self._flush_registry(full)
                    except Exception as exc:  # noqa: BLE001 - a failed flush is retried at the next period
                        if self._once.first(f"flush:{type(exc).__name__}"):
                            log.exception("registry_flush_failed", error=repr(exc))
        finally:
            self.close()

    def _poller(self) -> zmq.Poller:
        poller = zmq.Poller()
        poller.register(self.ingest, zmq.POLLIN)
        poller.register(self.control_sock, zmq.POLLIN)
        for mon in self.sockets.monitor_sockets():
            poller.register(mon, zmq.POLLIN)
        return poller

    def _check_revocations(self) -> bool:
        """Cut the event stream's revoked subscribers off (True when the sockets to poll changed)."""
        try:
            return self.sockets.check_revocations()
        except zmq.ZMQError as exc:
            if self._once.first(f"rebind:{exc.errno}"):
                log.error("event_stream_rebind_failed", error=str(exc), endpoint=self.pub.endpoint,
                          note="the event stream is down until the endpoint can be bound again")
            return True

    def _drain_results(self) -> None:
        results = self.results
        while not results.empty():  # workers only put: this loop is the one reader (no queue.Empty per turn)
            fn = results.get_nowait()
            try:
                fn()
            except Exception as exc:  # noqa: BLE001 - a failing handler must not kill the loop
                log.exception("result_handler_failed", error=repr(exc))

    def _tick(self, now: float) -> None:
        self.metrics.queue_depth.labels("results").set(self.results.qsize())
        if not self.sockets.revocable:
            self._check_revocations()  # no key to revoke: only the event stream's subscription messages to read
        try:
            for det in list(self.detectors.values()):
                for an in det.tick(now):  # the clock of the arrival times the detectors were given (_arrival_s)
                    self._on_anomaly(an, now)
            self.captures.tick(now)
            self._tick_jobs_and_sinks(now)
        except Exception as exc:  # noqa: BLE001
            if self._once.first(f"tick:{type(exc).__name__}"):
                log.exception("tick_failed", error=repr(exc))

    def _tick_jobs_and_sinks(self, now: float) -> None:
        """Job ends (no rank reported for ``job_end_after_s``: ``job_ended`` event), alert re-sends, gauges."""
        cs = self.settings.coordinator
        self.sinks.tick(self.clock.wall())  # Alertmanager's endsAt is a time of day
        if now >= self._next_observe:  # once a second: O(ranks)
            self._next_observe = now + 1.0
            last = {j.job_id: j.heard_unix_s for j in self.registry.jobs.values()}  # kept on ingest: O(jobs)
            waiting = {j.job_id for j in self.registry.jobs.values() if j.furthest_step() < 0}  # hellos only
            for end in self._job_end.check(last, now, waiting):
                self._end_job(end, now)
            rows = self.registry.gauge_rows(now, cs.node_timeout_s)  # not the status snapshot: bounded per job
            active = {j for j, t in last.items() if now - t < cs.job_end_after_s}
            self.metrics.observe_state(rows["jobs"], rows["nodes"], active, self.state.capture_state_summary(), now)

    def _end_job(self, end: JobEnded, now: float) -> None:
        """The job's current generation ended (silent for ``job_end_after_s``, or every rank said bye): publish
        ``job_ended`` once per generation, cancel its captures whose window has not started and close its episodes
        (reason ``job_ended`` or ``all_ranks_left``)."""
        job = self.registry.jobs.get(end.job_id)
        gen = job.generation if job is not None else 0
        if self._ended.ended(end.job_id, gen):
            # this generation's end is already on record (ended by its byes, or restored after a restart: a crash
            # restores the last report time of the last full flush, so the silence would get another event id)
            return
        self._ended.mark(end.job_id, gen, end.last_report_unix_s)
        self.emit(TYPE_JOB_ENDED, end.job_id, end.to_json() | {"generation": gen}, event_id=end.event_id())
        self.registry.note_ended(end.job_id, now)
        self.captures.on_job_ended(end.job_id, now)
        self.captures.episodes.close_job(end.job_id, now, "all_ranks_left" if end.reason == "all_ranks_left"
                                         else "job_ended")

    def _reject(self, exc: MessageRejected | RegistryError, node_id: str = "", quiet: bool = False) -> None:
        self.counters["rejected"] += 1
        self.metrics.rejected.labels(exc.reason).inc()
        if not quiet and self._once.first(exc.reason):
            log.warning("message_rejected", reason=exc.reason, detail=str(exc), node_id=node_id,
                        note="logged once per reason; see profwatch_rejected_total")

    def _refuse_peer(self, reason: str, detail: str, peer: str) -> None:
        """Count a refusal by a peer and log it once a minute per (reason, peer)."""
        self._reject(MessageRejected(reason, detail), peer, quiet=True)
        now = time.monotonic()
        if now - self._peer_logged.get((reason, peer), -1e9) >= 60.0:
            if len(self._peer_logged) > 10_000:
                self._peer_logged.clear()
            self._peer_logged[(reason, peer)] = now
            log.warning("peer_refused", reason=reason, detail=detail, peer=peer,
                        note="logged once a minute per peer and reason; see profwatch_rejected_total")

    def _drain_ingest(self) -> None:
        # at most 100 batches (~100k reports) and INGEST_PASS_S per pass, so control requests (the CLI's 3 s ping)
        # and SIGTERM are never starved, however costly each batch is (e.g. 1000 hellos)
        until = time.monotonic() + INGEST_PASS_S
        ingest = self.ingest
        for k in range(100):
            if time.monotonic() > until:
                return
            if k and not ingest.get(zmq.EVENTS) & zmq.POLLIN:  # the poll said readable before the first
                return  # (asked, not tried: a zmq.Again raised at the end of every pass costs more)
            try:
                frames = ingest.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            route = frames[0].bytes
            key = self.sockets.node_key(frames[-1])
            if not self.sockets.admitted(frames[-1], "ingest"):
                # the key was removed or changed since this connection's handshake: nothing it sends counts, and
                # commands no longer go to it
                self.metrics.auth_refused.labels("ingest", "revoked").inc()
                self._refuse_peer("key_revoked", "message on a connection whose key was removed or changed", _peer(route, key))
                revoked_node = self.routes.node(route)
                if revoked_node is not None:
                    self.routes.forget(revoked_node)
                continue
            if len(frames) != 2:
                self._reject(MessageRejected("bad_framing", f"{len(frames)} frames"), _peer(route, key))
                continue
            try:
                env, msgs, bad = parse_node_message(frames[1].bytes)
            except MessageRejected as exc:
                self._reject(exc, _peer(route, key))
                continue
            except Exception as exc:  # noqa: BLE001 - whatever a peer sends, the loop keeps serving
                self._reject(MessageRejected("bad_message", repr(exc)[:200]), _peer(route, key))
                continue
            verdict = self.routes.admit(route, env.node_id, key)
            if verdict.action == "refuse":
                self._refuse_peer(verdict.reason, verdict.detail, _peer(route, key))
                continue
            node_id = env.node_id
            for b in bad:
                self._reject(b, node_id)
            now = self.clock()
            self._arrival_s = now  # when the batch arrived, for the stall checks (a wall step moves nothing)
            if verdict.old_route is not None:
                log.warning("node_connection_replaced", node_id=node_id, key=key, detail=verdict.detail,
                            note="the previous connection was told to reconnect")
                self._send_node(verdict.old_route, wire.NodeCommand(
                    cmd="reconnect", command_id=f"reconnect-{int(now)}", args={"after_s": 2.0}))
            if env.kind == "node_heartbeat" and getattr(env, "stopping", False):
                self.sockets.note_stopping(frames[-1])  # the close of this connection that follows is routine
            try:
                self._on_node_message(route, env, msgs, now)
            except RegistryError as exc:
                self._refuse_peer(exc.reason, str(exc), _peer(route, key))

    def _on_node_message(self, route: bytes, env: Any, msgs: list[Any], now: float) -> None:
        node_id = env.node_id
        if node_id not in self._known_nodes:
            self.registry.touch_node(node_id, getattr(env, "hostname", ""), now)  # refused beyond limits.max_nodes
            self._known_nodes.add(node_id)
            if env.kind != "node_batch" or not any(m.kind == "hello" for m in msgs):
                self._send_node(route, wire.NodeCommand(cmd="register", command_id=f"reg-{int(now)}"))
        if env.kind == "node_heartbeat":
            self.registry.heartbeat(env, now)
            # answered, so a node dialling the wrong endpoint (or refused here) notices: it warns when unanswered
            self._send_node(route, wire.NodeCommand(cmd="heartbeat_ack", command_id=f"hb-{int(now)}"))
        elif env.kind == "node_ack":
            self.captures.on_node_ack(env, now)
        elif env.kind == "node_job_id_collision":
            self._node_collision(env, node_id)
        elif env.kind == "node_batch":
            node, _new = self.registry.touch_node(node_id, env.hostname, now)
            lost = self.registry.note_batch_seq(node, env.seq)
            if lost:
                self.counters["lost_batches"] += lost
            self.counters["batches"] += 1
            self._ingest_messages(msgs, node_id, now)

    def _ingest_messages(self, msgs: list[Any], node_id: str, now: float) -> None:
        """A node batch's rank messages, in order: each run of consecutive step reports of one job goes through
        :meth:`_ingest_steps`, any other message through :meth:`_ingest_message`."""
        self.counters["received"] += len(msgs)
        self._rank_messages_in.inc(len(msgs))
        i, n = 0, len(msgs)
        while i < n:
            if msgs[i].kind == "step":
                i = self._ingest_steps(msgs, i, node_id, now)
            else:
                self._ingest_message(msgs[i], node_id, now)
                i += 1

    def _ingest_steps(self, msgs: list[Any], start: int, node_id: str, now: float) -> int:
        """The step reports of one job from ``msgs[start]`` on (consecutive in a batch, all arrived at ``now``): the
        registry takes them (:meth:`Registry.step_run`, and :meth:`Registry.step_of` for a report that needs its
        checks), then the job's detector takes those of its current generation (:meth:`_detect`), in order; returns
        the index of the first message after them. The same refusals and counters as one by one; a step counter
        that went back (a possible new generation, which replaces the detector) first hands the detector the
        reports before it. What an anomaly starts sees the registry after the batch (its reports arrived
        together)."""
        reg = self.registry
        job_id = msgs[start].job_id
        n = len(msgs)
        job = reg.jobs.get(job_id)
        if job is None:
            i = start
            while i < n and msgs[i].kind == "step" and msgs[i].job_id == job_id:
                self._reject(MessageRejected("unknown_job", f"step for job {job_id} before any hello"), node_id)
                i += 1
            return i
        if job.ended_unix_s is not None:  # the first step after the job's end: a new generation
            resumed = reg.resume_after_end(job, now, msgs[start].rank, node_id)
            if resumed is not None:
                self._on_generation(resumed, now)
        judged: list[Any] = []
        i = start
        while True:
            i = reg.step_run(job, msgs, i, now, node_id, judged)
            if i >= n or (m := msgs[i]).kind != "step" or m.job_id != job_id:
                break
            i += 1
            try:  # a report that needs the registry's checks
                rank, restarted = reg.step_of(job, m, now, node_id)
                if restarted:
                    if judged:
                        self._detect(job, judged, node_id, now)
                        judged = []
                    opened = reg.note_restart(job, rank, now, m.peer_pid)
                    if opened is not None:
                        self._on_generation(opened, now)
                if rank.gen == job.generation:  # else a worker of an older generation not restarted yet
                    judged.append(m)
            except Exception as exc:  # noqa: BLE001 - one bad handler run must not stop ingest for everyone
                self._message_failed(exc, m, node_id, now)
        if judged:
            self._detect(job, judged, node_id, now)
        return i

    def _detect(self, job: JobState, reports: list[Any], node_id: str, now: float) -> None:
        """Hand the job's detector (created at its first step) step reports that arrived at ``now``, acting on each
        anomaly as it comes (stalls are judged from the batch's arrival on the steady clock, ``_arrival_s``). An anomaly whose handling fails is counted
        (``internal_errors``) and the reports after it are still judged; a detector that fails is counted and the
        rest of these reports is not judged (where it stopped inside them is not known: none is judged twice)."""
        i, n = 0, len(reports)
        while i < n:
            try:
                det = self.detectors.get(job.job_id) or self._detector_for(job.job_id, job.world_size)
                if det is None:
                    return
                i, anomalies = det.observe_many(reports, self._arrival_s, i)
            except Exception as exc:  # noqa: BLE001 - one bad handler run must not stop ingest for everyone
                self._message_failed(exc, reports[min(i, n - 1)], node_id, now)
                return
            for an in anomalies:
                try:
                    self._on_anomaly(an, now)
                except Exception as exc:  # noqa: BLE001 - one failed anomaly must not hide the next ones
                    self._message_failed(exc, reports[max(0, min(i, n) - 1)], node_id, now)

    def _ingest_message(self, m: Any, node_id: str, now: float) -> None:
        """One rank message of a batch other than a step report (those go through :meth:`_ingest_steps`)."""
        reg = self.registry
        kind = m.kind
        try:
            if kind == "hello":
                known = m.job_id in reg.jobs
                outcome = reg.admit_hello(m, node_id, now)
                if outcome.opened is None:  # the first hello after the job's end opens a new generation
                    outcome = HelloOutcome(outcome.job, reg.resume_after_end(outcome.job, now, m.rank, node_id))
                if not known:
                    log.info("job_registered", job_id=m.job_id, world_size=m.world_size, backend=m.backend,
                             node_id=node_id, uid=m.peer_uid, restart_count=m.restart_count)
                if outcome.opened is not None:
                    self._on_generation(outcome.opened, now)
                self.captures.on_hello(outcome.job, m, now)
            elif kind == "capture":
                reg.rank_for(m, node_id)  # a node speaks only for the ranks that run on it
                self.captures.on_capture_event(m, node_id, now)
            elif kind == "bye":
                last_bye = reg.bye(m, now, node_id)
                left = self.detectors.get(m.job_id)
                if left is not None:
                    left.mark_left(m.rank)
                if last_bye:  # every rank of the generation left: the job ends now, not after job_end_after_s
                    heard = reg.jobs[m.job_id].last_heard_unix_s()
                    self._end_job(JobEnded(m.job_id, heard, max(0.0, now - heard), "all_ranks_left"), now)
        except Exception as exc:  # noqa: BLE001 - one bad handler run must not stop ingest for everyone
            self._message_failed(exc, m, node_id, now)

    def _message_failed(self, exc: Exception, m: Any, node_id: str, now: float) -> None:
        """What a rank message's handler raised: a registry refusal (counted, some alerted), a held claim, or an
        internal error (counted, logged once per kind). Called from the ``except`` block (it logs the traceback)."""
        kind = m.kind
        if isinstance(exc, GenerationPending):
            self.counters["generation_pending"] = self.counters.get("generation_pending", 0) + 1
            self._reject(exc, node_id, quiet=True)
            if self._once.first(f"claim:{m.job_id}:{getattr(m, 'world_size', '')}:{getattr(m, 'restart_count', '')}"):
                log.info("generation_claimed", job_id=m.job_id, detail=str(exc), node_id=node_id)
        elif isinstance(exc, RegistryError):
            if exc.reason == "paths_changed":
                self._paths_changed(m, node_id, str(exc), now)
            elif exc.reason == "job_id_collision" and kind == "hello":
                self._hello_collision(m, node_id, str(exc))
            self._reject(exc, node_id, quiet=kind != "hello" and exc.reason == "job_id_collision")
        else:
            self.counters["internal_errors"] = self.counters.get("internal_errors", 0) + 1
            if self._once.first(f"internal:{kind}:{type(exc).__name__}"):
                log.exception("message_handler_failed", kind=kind, job_id=getattr(m, "job_id", None))

    def _detector_for(self, job_id: str, world_size: int) -> JobDetector | None:
        """Create a job's detector at its first step (its per-rank tables are ``world_size`` long), while the sum
        of world sizes with a detector stays within ``limits.max_ranks_total``; else None (logged once per job)."""
        if self._detector_ranks + world_size > self.settings.limits.max_ranks_total:
            if self._once.first(f"detector_budget:{job_id}"):
                log.warning("detection_skipped", job_id=job_id, world_size=world_size,
                            ranks_with_detectors=self._detector_ranks, limit=self.settings.limits.max_ranks_total,
                            note="limits.max_ranks_total reached: the job is tracked, not analysed for anomalies")
            return None
        det = JobDetector(job_id, world_size, self.settings.detection, hold=spike_hold(self.settings.capture))
        det.inherit(self._previous_levels.pop(job_id, None))
        self.detectors[job_id] = det
        self._detector_ranks += world_size
        return det

    def _on_generation(self, g: GenerationOpened, now: float) -> None:
        """A job started a new generation: drop its detector (rebuilt for the new shape at its next step: windows
        and baselines of the old shape would judge the new one), close its old captures as superseded (data
        kept), and publish ``job_generation``. The old detector's learned level is kept for the new one
        (``JobDetector.inherit``: a change early in the new generation's learning is judged against it too)."""
        det = self.detectors.pop(g.job_id, None)
        if det is not None:
            self._detector_ranks -= det.world_size
            level = det.generation_level()
            if level is not None:
                self._previous_levels[g.job_id] = level
        log.info("job_generation", job_id=g.job_id, generation=g.generation, world_size=g.world_size,
                 old_world_size=g.old_world_size, restart_count=g.restart_count, reason=g.reason, nodes=list(g.nodes),
                 refused=dict(g.refused))
        self.captures.supersede_generation(g.job_id, g.generation, now)
        self.emit(TYPE_JOB_GENERATION, g.job_id, g.to_json(), event_id=g.event_id())

    def _paths_changed(self, m: Any, node_id: str, detail: str, now: float) -> None:
        """Alert once per job and claimed paths: a hello tried to move a job's pinned paths."""
        claimed = repr((m.profiler_config_path, m.prof_root)).encode("utf-8", "backslashreplace")
        digest = hashlib.sha256(claimed).hexdigest()[:16]
        self.emit(TYPE_PATH_REFUSED, m.job_id,
                  {"rank": m.rank, "hostname": m.hostname, "node_id": node_id, "reason": "paths_changed",
                   "problems": [detail]}, event_id=f"paths_changed-{m.job_id}-{digest}")

    def _hello_collision(self, m: wire.RankHello, node_id: str, detail: str) -> None:
        """A hello names other paths than its job's while the job's ranks are alive (the hello came through
        another node than the job's, or an older node daemon): one ``job_id_collision`` alert per claimant."""
        job = self.registry.jobs.get(m.job_id)
        owner_uid = next((r.uid for r in job.ranks.values() if r.uid is not None), None) if job else None
        paths = (m.profiler_config_path, m.prof_root)
        data = collision_data(reason="paths_changed", owner_uid=owner_uid, uid=m.peer_uid, node_id=node_id,
                              hostname=m.hostname, rank=m.rank, pid=m.peer_pid, paths=paths,
                              owner_paths=job.pinned_paths if job else None, refused=1, detail=detail)
        self._collision(m.job_id, data, collision_event_id(m.job_id, "paths_changed", node_id, m.peer_uid, paths))

    def _node_collision(self, env: wire.NodeJobIdCollision, node_id: str) -> None:
        """A node refused a process that claims a job id another job owns there: one alert per claimant."""
        paths = (env.profiler_config_path, env.prof_root)
        data = collision_data(reason=env.reason, owner_uid=env.owner_uid, uid=env.uid, node_id=node_id,
                              hostname=env.hostname, rank=env.rank, pid=env.pid, paths=paths,
                              owner_paths=(env.owner_profiler_config_path, env.owner_prof_root),
                              refused=env.refused, detail=env.detail)
        self._collision(env.job_id, data, collision_event_id(env.job_id, env.reason, node_id, env.uid, paths))

    def _collision(self, job_id: str, data: dict[str, Any], event_id: str) -> None:
        self.counters["job_id_collisions"] = self.counters.get("job_id_collisions", 0) + 1
        if self.emit(TYPE_JOB_ID_COLLISION, job_id, data, event_id=event_id) is not None:
            log.warning("job_id_collision", job_id=job_id, reason=data["reason"], owner_uid=data["owner_uid"],
                        uid=data["uid"], node_id=data["node_id"], detail=data["detail"])

    def _expire(self, now: float) -> None:
        """Forget jobs with no rank heard for ``limits.job_expiry_s`` (and their detectors and stored rows)."""
        gone = self.registry.expire(now)
        for job_id in gone:
            self.captures.episodes.close_job(job_id, now, "job_expired")
            det = self.detectors.pop(job_id, None)
            self._previous_levels.pop(job_id, None)
            if det is not None:
                self._detector_ranks -= det.world_size
            log.info("job_expired", job_id=job_id, silent_for_s=self.settings.limits.job_expiry_s)
        self.captures.episodes.forget(gone)
        self.captures.references.forget(gone)
        if gone:
            try:
                self.state.forget_jobs(gone)
            except Exception as exc:  # noqa: BLE001 - retried at the next restart's expiry
                log.warning("forget_jobs_failed", error=repr(exc))
        for node_id in self.routes.node_ids():
            if node_id not in self.registry.nodes:
                self.routes.forget(node_id)
                self._known_nodes.discard(node_id)

    def _on_anomaly(self, an: Anomaly, now: float) -> None:
        data = {"kind": an.kind, "step": an.step, "ranks": list(an.ranks), "magnitude": an.magnitude, "detail": an.detail}
        self.emit(ANOMALY_KIND_TYPES.get(an.kind, TYPE_ANOMALY), an.job_id, data)
        self.captures.on_anomaly(an, now)

    def _send_node(self, route: bytes, cmd: wire.NodeCommand) -> None:
        try:
            self.ingest.send_multipart([route, wire.encode(cmd)], zmq.NOBLOCK)
        except zmq.ZMQError as exc:
            log.warning("node_command_failed", node_id=self.routes.node(route), cmd=cmd.cmd, error=str(exc))

    def send_node_command(self, node_id: str, cmd: wire.NodeCommand) -> None:
        """Send a command to one node daemon: to the connection that speaks for ``node_id`` (dropped and logged
        when the node has none)."""
        route = self.routes.route(node_id)
        if route is None:
            log.warning("node_command_failed", node_id=node_id, cmd=cmd.cmd, error="node not connected")
            return
        self._send_node(route, cmd)

    # -- shutdown -----------------------------------------------------------------------------------------------
    def close(self) -> None:
        if self._ctx.closed:
            return
        self._stop.set()
        self.notifier.stopping()
        try:
            self.captures.close()
            self.sinks.close()
        finally:
            try:
                self._flush_registry()
            except Exception as exc:  # noqa: BLE001
                log.warning("registry_flush_failed", error=repr(exc))
            self.state.close()
            self.sockets.close()
            self._ctx.term()
            log.info("coordinator_stopped", **self.counters)
