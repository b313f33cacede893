"""Prometheus metrics for the daemons (I/O: the exposition HTTP server). One registry per daemon, no globals."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server


class DaemonMetrics:
    """Counters and gauges shared by the node daemon and the coordinator.

    Names: ``profwatch_messages_in_total{kind}``, ``profwatch_messages_out_total{kind}``,
    ``profwatch_rejected_total{reason}``, ``profwatch_dropped_total{where}``, ``profwatch_queue_depth{queue}``,
    ``profwatch_auth_refused_total{socket,reason}`` (CURVE handshakes refused or failed: ``unknown_key``,
    ``role_not_allowed``, ``mechanism_mismatch``, ``protocol``, ``refused``, ``no_detail``),
    plus coordinator-only ``profwatch_alerts_total{type}``, ``profwatch_captures_total{state}`` and
    ``profwatch_watch_fallbacks_total{reason}`` (prof_dir watches degraded to polling: ``watch_limit`` for a
    subtree inotify could not watch, ``inotify_root_failed`` for a whole prof_dir).
    """

    def __init__(self, daemon: str) -> None:
        self.registry = CollectorRegistry()
        self.messages_in = Counter("profwatch_messages_in", "Messages received", ["kind"], registry=self.registry)
        self.messages_out = Counter("profwatch_messages_out", "Messages sent or relayed", ["kind"], registry=self.registry)
        self.rejected = Counter("profwatch_rejected", "Messages rejected by validation", ["reason"], registry=self.registry)
        self.dropped = Counter("profwatch_dropped", "Messages dropped (queue full, peer down)", ["where"], registry=self.registry)
        self.queue_depth = Gauge("profwatch_queue_depth", "Messages waiting", ["queue"], registry=self.registry)
        self.alerts = Counter("profwatch_alerts", "Alerts and events published", ["type"], registry=self.registry)
        self.captures = Counter("profwatch_captures", "Capture state transitions", ["state"], registry=self.registry)
        self.auth_refused = Counter("profwatch_auth_refused", "Connections refused or failed during authentication",
                                    ["socket", "reason"], registry=self.registry)
        self.watch_fallbacks = Counter("profwatch_watch_fallbacks", "prof_dir watches degraded to polling",
                                       ["reason"], registry=self.registry)
        self.daemon = daemon
        self._server: Any = None

    def serve(self, port: int | None, addr: str = "127.0.0.1") -> None:
        """Start the ``/metrics`` HTTP server (no-op when ``port`` is None)."""
        if port is not None:
            self._server, _thread = start_http_server(port, addr=addr, registry=self.registry)

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server = None
