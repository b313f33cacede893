"""Prometheus metrics for the daemons (I/O: the exposition HTTP server). One registry per daemon, no globals.

``dashboards/profwatch-grafana.json`` and ``dashboards/profwatch-alerts.rules.yml`` query these names; a test
scrapes both live daemons and checks that every name they use is exported.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, make_wsgi_app

from profwatch import __version__
from profwatch.adapters.outputs.http_probe import probe_app, serve
from profwatch.core.alerts.events import EVENT_TYPES
from profwatch.core.capture.lifecycle import ACTIVE, CaptureState
from profwatch.core.health import Health

CAPTURE_STATES = tuple(s.value for s in CaptureState)
"""Capture states exported with a zero value before the first capture (a missing series is not a zero)."""
_ACTIVE_STATES = frozenset(s.value for s in ACTIVE)
SINK_OUTCOMES = ("queued", "sent", "failed", "rejected", "dropped", "retried")
ANALYSIS_BUCKETS_S = (1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 900, 1800, 3600)


class DaemonMetrics:
    """Counters and gauges of the node daemon and the coordinator.

    Both: ``profwatch_daemon_info{daemon,version}``, ``profwatch_messages_in_total{kind}``,
    ``profwatch_messages_out_total{kind}``, ``profwatch_rejected_total{reason}``, ``profwatch_dropped_total{where}``,
    ``profwatch_queue_depth{queue}``, ``profwatch_auth_refused_total{socket,reason}`` (CURVE handshakes refused or
    failed: ``unknown_key``, ``role_not_allowed``, ``mechanism_mismatch``, ``protocol``, ``refused``,
    ``no_detail``).
    Node: ``profwatch_connections_closed_total{socket="rank"}`` (rank connections closed, a rank process ending
    closes one), ``profwatch_rank_connections_dropped_total{peer}`` (of those, the ones closed under a running
    process that had not just said bye, ``running``, or before the node could read their peer, ``unknown``: a
    rank message over the node's 512 KiB ``MAXMSGSIZE`` dropped unread; ``node.py``).
    Coordinator: ``profwatch_connections_closed_total{socket}`` (``ingest``: node connections closed,
    from the socket monitor's disconnect events, but for the routine close of a node daemon that said it stops;
    an oversize message, over ZeroMQ's ``MAXMSGSIZE``, is dropped
    unread with its connection, so its drops show here; ``adapters/zmq/server_sockets.py``), ``profwatch_events_total{type}`` (every event published, alerts and the others), ``profwatch_captures_total{state}``
    (transitions), ``profwatch_captures_in_state{state}``, ``profwatch_capture_oldest_active_age_seconds``,
    ``profwatch_analysis_duration_seconds`` (histogram), ``profwatch_jobs``, ``profwatch_job_ranks{job_id}``,
    ``profwatch_job_step_time_seconds{job_id}`` (median of the ranks' latest step times),
    ``profwatch_job_furthest_step{job_id}``, ``profwatch_job_rank_drops_total{job_id}`` (messages the ranks could not
    queue), ``profwatch_nodes{state}``, ``profwatch_sink_requests_total{sink,outcome}``,
    ``profwatch_sink_queue_depth{sink}``, ``profwatch_alertmanager_alerts_standing``,
    ``profwatch_watch_fallbacks_total{reason}`` (prof_dir watches degraded to polling: ``watch_limit`` for a
    subtree inotify could not watch, ``inotify_root_failed`` for a whole prof_dir),
    ``profwatch_watch_poll_deferred_total`` (rank dir listings the polling observer served from its cache: beyond
    ``watch.poll_max_rank_dir_listings`` a poll, ``adapters/fs/poll_listing.py``).
    """

    def __init__(self, daemon: str) -> None:
        self.registry = r = CollectorRegistry()
        self.daemon = daemon
        self.info = Gauge("profwatch_daemon_info", "Constant 1, labelled with the daemon kind and version",
                          ["daemon", "version"], registry=r)
        self.info.labels(daemon, __version__).set(1)
        self.messages_in = Counter("profwatch_messages_in", "Messages received", ["kind"], registry=r)
        self.messages_out = Counter("profwatch_messages_out", "Messages sent or relayed", ["kind"], registry=r)
        self.rejected = Counter("profwatch_rejected", "Messages rejected by validation", ["reason"], registry=r)
        self.dropped = Counter("profwatch_dropped", "Messages dropped (queue full, peer down)", ["where"], registry=r)
        self.queue_depth = Gauge("profwatch_queue_depth", "Messages waiting", ["queue"], registry=r)
        self.dropped.labels("relay")  # exported as 0 before the first drop (a missing series is not a zero)
        self.rejected.labels("bad_message")
        self.events = Counter("profwatch_events", "Events published (alerts and the others), by CloudEvents type",
                              ["type"], registry=r)
        self.captures = Counter("profwatch_captures", "Capture state transitions", ["state"], registry=r)
        self.auth_refused = Counter("profwatch_auth_refused", "Connections refused or failed during authentication",
                                    ["socket", "reason"], registry=r)
        self.connections_closed = Counter(
            "profwatch_connections_closed", "Peer connections of a listening socket that closed: ZeroMQ drops a "
            "message over the socket's MAXMSGSIZE with its connection (a peer that stopped closes one too)",
            ["socket"], registry=r)
        self.connections_closed.labels("ingest" if daemon == "coordinator" else "rank")  # 0 before the first close
        self.rank_connections_dropped = Counter(
            "profwatch_rank_connections_dropped", "Node: rank connections the node closed under a running process "
            "that never said bye (peer=running) or before its peer could be read (peer=unknown): ZeroMQ drops a rank message "
            "over 512 KiB (MAXMSGSIZE) unread with its connection", ["peer"],
            registry=r if daemon != "coordinator" else None)
        for peer in ("running", "unknown"):
            self.rank_connections_dropped.labels(peer)  # 0 before the first drop
        self.watch_fallbacks = Counter("profwatch_watch_fallbacks", "prof_dir watches degraded to polling",
                                       ["reason"], registry=r)
        self.watch_poll_deferred = Counter(
            "profwatch_watch_poll_deferred", "Rank dir listings the polling observer served from its cache (beyond "
            "watch.poll_max_rank_dir_listings a poll; each rank dir is re-listed within ceil(rank dirs / that) polls)",
            registry=r)
        self._server: Any = None
        self.health = Health()
        """Liveness and readiness served at /healthz and /readyz (the daemon's loop ticks it, sets its checks)."""
        if daemon != "coordinator":
            return
        for t in sorted(EVENT_TYPES):
            self.events.labels(t)
        for s in CAPTURE_STATES:
            self.captures.labels(s)
        self.captures_in_state = Gauge("profwatch_captures_in_state", "Captures currently in each state",
                                       ["state"], registry=r)
        self.capture_oldest_active_age = Gauge(
            "profwatch_capture_oldest_active_age_seconds",
            "Age of the oldest capture not yet analysed, incomplete, failed or refused (0 when none)", registry=r)
        self.analysis_duration = Histogram("profwatch_analysis_duration_seconds",
                                           "Batch analysis wall time (staging, tools, ranking, report)",
                                           buckets=ANALYSIS_BUCKETS_S, registry=r)
        self.jobs = Gauge("profwatch_jobs", "Jobs with a rank report within coordinator.job_end_after_s", registry=r)
        self.job_ranks = Gauge("profwatch_job_ranks", "Ranks of the job that have not left", ["job_id"], registry=r)
        self.job_step_time = Gauge("profwatch_job_step_time_seconds",
                                   "Median over the job's ranks of their latest step time", ["job_id"], registry=r)
        self.job_furthest_step = Gauge("profwatch_job_furthest_step", "Highest step reported by any rank",
                                       ["job_id"], registry=r)
        self.job_rank_drops = Counter("profwatch_job_rank_drops",
                                      "Telemetry messages the job's ranks dropped (their queue was full)",
                                      ["job_id"], registry=r)
        self._rank_drops_seen: dict[str, float] = {}  # job -> the ranks' summed drop count last exported
        self.nodes = Gauge("profwatch_nodes", "Node daemons known to the coordinator", ["state"], registry=r)
        for s in ("up", "down"):
            self.nodes.labels(s)
        self.sink_requests = Counter("profwatch_sink_requests", "Alert sink requests by outcome",
                                     ["sink", "outcome"], registry=r)
        self.sink_queue = Gauge("profwatch_sink_queue_depth", "Alert sink requests queued or in flight", ["sink"],
                                registry=r)
        self.alerts_standing = Gauge("profwatch_alertmanager_alerts_standing",
                                     "Alerts profwatch keeps firing in Alertmanager", registry=r)
        self.state_store_failures = Counter(
            "profwatch_state_store_failures", "State store writes refused (disk full, I/O error), kept for a retry",
            ["op"], registry=r)
        self.state_store_pending = Gauge("profwatch_state_store_pending", "State store writes waiting for a retry",
                                         registry=r)
        self.state_store_dropped = Counter(
            "profwatch_state_store_dropped", "Queued state store writes dropped (retry queue full, refused at retry)",
            ["kind"], registry=r)
        self.state_store_resets = Counter(
            "profwatch_state_store_resets", "Corrupt state dbs moved aside at start (the coordinator started empty)",
            registry=r)
        for op in ("event", "capture", "batch"):
            self.state_store_failures.labels(op)
            self.state_store_dropped.labels(op)
        self.job_generation = Gauge("profwatch_job_generation",
                                    "The job's generation: elastic restarts and resizes seen", ["job_id"], registry=r)
        self._job_labels: set[str] = set()

    # -- coordinator updates --------------------------------------------------------------------------------------
    def observe_event(self, event: Mapping[str, Any]) -> None:
        """Count one published event; a ``suspect_ranks`` event carrying ``analysis_duration_s`` feeds the
        analysis-duration histogram."""
        self.events.labels(str(event.get("type"))).inc()
        data = event.get("data")
        if self.daemon == "coordinator" and isinstance(data, Mapping):
            d = data.get("analysis_duration_s")
            if isinstance(d, (int, float)) and not isinstance(d, bool) and d >= 0:
                self.analysis_duration.observe(float(d))

    def observe_state(self, jobs: Iterable[Mapping[str, Any]], nodes: Iterable[Mapping[str, Any]],
                      active_jobs: set[str], capture_states: Mapping[str, tuple[int, float | None]],
                      now_unix_s: float) -> None:
        """Refresh the coordinator gauges.

        Args:
            jobs: gauge rows (:func:`profwatch.core.fleet.registry_state.gauge_rows`: ``job_id``, ``ranks_live``,
                ``median_step_time_s``, ``furthest_step``, ``rank_drops``, ``generation``); only ``active_jobs`` are
                exported, labels of other jobs are removed.
            nodes: gauge node rows (``down``).
            capture_states: state -> (count, oldest ``created_unix_s`` or None).
        """
        seen = set()
        for j in jobs:
            job_id = str(j.get("job_id"))
            if job_id not in active_jobs:
                continue
            seen.add(job_id)
            self.job_ranks.labels(job_id).set(int(j.get("ranks_live") or 0))
            self.job_step_time.labels(job_id).set(float(j.get("median_step_time_s") or 0.0))
            self.job_furthest_step.labels(job_id).set(float(j.get("furthest_step") or 0))
            # the ranks report cumulative counts; the counter grows by their increase (a rank that restarted counts
            # from zero again: its drop is not a negative increase)
            total = float(j.get("rank_drops") or 0)
            last = self._rank_drops_seen.get(job_id, 0.0)
            self.job_rank_drops.labels(job_id).inc(max(0.0, total - last))
            self._rank_drops_seen[job_id] = total
            self.job_generation.labels(job_id).set(float(j.get("generation") or 0))
        for gone in self._job_labels - seen:
            self._rank_drops_seen.pop(gone, None)
            for g in (self.job_ranks, self.job_step_time, self.job_furthest_step, self.job_rank_drops,
                      self.job_generation):
                try:
                    g.remove(gone)
                except KeyError:
                    pass
        self._job_labels = seen
        self.jobs.set(len(seen))
        node_rows = list(nodes)
        down = sum(1 for n in node_rows if n.get("down"))
        self.nodes.labels("down").set(down)
        self.nodes.labels("up").set(len(node_rows) - down)
        oldest: float | None = None
        for state in sorted(set(CAPTURE_STATES) | set(capture_states)):
            count, first = capture_states.get(state, (0, None))
            self.captures_in_state.labels(state).set(count)
            if state in _ACTIVE_STATES and first is not None:
                oldest = first if oldest is None else min(oldest, first)
        self.capture_oldest_active_age.set(max(0.0, now_unix_s - oldest) if oldest is not None else 0.0)

    # -- sinks (daemon/profwatch/adapters/outputs/alert_sinks.py: SinkMetrics) -------------------------------------------------------
    def sink_outcome(self, sink: str, outcome: str, n: int) -> None:
        self.sink_requests.labels(sink, outcome).inc(n)

    def sink_state(self, sink: str, queued: int, standing: int | None) -> None:
        for o in SINK_OUTCOMES:  # export zeros for a configured sink
            self.sink_requests.labels(sink, o)
        self.sink_queue.labels(sink).set(queued)
        if standing is not None:
            self.alerts_standing.set(standing)

    # -- exposition -----------------------------------------------------------------------------------------------
    def serve(self, port: int | None, addr: str = "127.0.0.1", *, certfile: str | None = None,
              keyfile: str | None = None, client_cafile: str | None = None, health_only: bool = False) -> None:
        """Start the HTTP server on ``addr:port`` (no-op when ``port`` is None): ``/metrics`` (unless
        ``health_only``), ``/healthz`` and ``/readyz`` (``adapters/outputs/http_probe.py``); HTTPS with
        ``certfile``/``keyfile`` (PEM), and then client certificates signed by ``client_cafile`` required when it
        is given. Raises ``OSError`` (address in use) or ``ssl.SSLError`` (unusable certificate files)."""
        if port is not None:
            app = probe_app(self.health, None if health_only else make_wsgi_app(self.registry))
            self._server = serve(app, port, addr, certfile=certfile, keyfile=keyfile, client_cafile=client_cafile)

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
