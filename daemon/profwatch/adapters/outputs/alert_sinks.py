"""Alert sinks (I/O): every event the coordinator stores and publishes goes through :class:`AlertSinks`, which
hands it to each configured sink; each sink decides what it forwards.

* :class:`AlertmanagerSink` (``[alertmanager] url``): API v2 postable alerts (``POST <url>/api/v2/alerts``),
  standing alerts re-sent every ``resend_interval_s``, resolutions sent as ``endsAt`` = now. The rules of what
  fires and what resolves are pure (``daemon/profwatch/core/alerts/alertmanager.py: AlertBook``); the book is rebuilt from the
  state store's events when the coordinator restarts.
* :class:`CloudEventsWebhookSink` (``[webhook] url``): each event as one CloudEvent, HTTP protocol binding,
  structured content mode (https://github.com/cloudevents/spec/blob/v1.0.2/cloudevents/bindings/http-protocol-binding.md
  section 3.2): body = the event JSON, ``Content-Type: application/cloudevents+json; charset=utf-8``. Deliveries
  survive an outage and a restart: undelivered events wait in order (``OutboxPoster``), at most ``queue_size`` of
  them (the oldest dropped and counted beyond), each kept in the state store's ``sink_outbox`` until delivered.

Nothing here blocks the caller: bodies go to bounded queues served by one thread per sink
(``daemon/profwatch/adapters/outputs/http_post.py``); a full queue drops and counts.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

import structlog

from profwatch.adapters.outputs.http_post import HttpPoster, OutboxPoster, read_authorization
from profwatch.core.alerts.alertmanager import AlertBook
from profwatch.core.alerts.event_types import RESTORE_TYPES
from profwatch.core.alerts.settings import AlertmanagerSettings, WebhookSettings

log = structlog.get_logger("profwatch.sinks")

CLOUDEVENTS_CONTENT_TYPE = "application/cloudevents+json; charset=utf-8"
MAX_ALERTS_PER_POST = 500


class SinkMetrics(Protocol):
    """What the sinks report to (``daemon/profwatch/adapters/outputs/metrics.py: DaemonMetrics`` provides it)."""

    def sink_outcome(self, sink: str, outcome: str, n: int) -> None: ...

    def sink_state(self, sink: str, queued: int, standing: int | None) -> None: ...


class OutboxStore(Protocol):
    """Where a sink keeps its undelivered events (``StateStore`` provides it); methods raise ``sqlite3.Error``."""

    def outbox_add(self, sink: str, event_id: str, body: bytes) -> None: ...

    def outbox_remove(self, sink: str, event_ids: Iterable[str]) -> None: ...

    def outbox_load(self, sink: str) -> list[tuple[str, bytes]]: ...


class AlertmanagerSink:
    """Alertmanager API v2 client with the standing-alert book.

    Args:
        settings: the ``[alertmanager]`` section (``url`` set).
        authorization: ``Authorization`` header value or None.
        metrics: counters and gauges (optional).
    Raises:
        SinkConfigError: TLS files cannot be loaded.
    """

    name = "alertmanager"

    def __init__(self, settings: AlertmanagerSettings, authorization: str | None = None,
                 metrics: SinkMetrics | None = None) -> None:
        self.settings = settings
        self.metrics = metrics
        self.book = AlertBook(cluster=settings.cluster, resend_interval_s=settings.resend_interval_s,
                              max_suspects=settings.max_suspects, external_url=settings.external_url)
        on = (lambda outcome, n: metrics.sink_outcome(self.name, outcome, n)) if metrics else None
        self.poster = HttpPoster(self.name, settings.alerts_url(), settings, content_type="application/json",
                                 authorization=authorization, on_outcome=on)

    def restore(self, events: Iterable[Mapping[str, Any]]) -> int:
        """Rebuild the standing alerts from stored events (oldest first); they are re-sent at the next tick."""
        n = self.book.restore(events)
        if n:
            log.info("alertmanager_alerts_restored", standing=n)
        return n

    def submit(self, event: Mapping[str, Any], is_alert: bool, now_unix_s: float) -> None:
        self._post(self.book.apply(event, now_unix_s))

    def tick(self, now_unix_s: float) -> None:
        self._post(self.book.due(now_unix_s))
        if self.metrics is not None:
            self.metrics.sink_state(self.name, self.poster.depth(), len(self.book.alerts))

    def _post(self, alerts: list[dict[str, Any]]) -> None:
        for i in range(0, len(alerts), MAX_ALERTS_PER_POST):
            body = json.dumps(alerts[i : i + MAX_ALERTS_PER_POST], separators=(",", ":"), default=str).encode()
            self.poster.post(body)

    def close(self) -> None:
        self.poster.close()


class CloudEventsWebhookSink:
    """One CloudEvent per POST, structured mode, in order, at least once (module doc).

    Args:
        settings: the ``[webhook]`` section (``url`` set); ``events`` picks alerts only or every event;
            ``queue_size`` bounds the undelivered events kept.
        authorization: ``Authorization`` header value or None.
        metrics: counters and gauges (optional).
    Raises:
        SinkConfigError: TLS files cannot be loaded.
    """

    name = "webhook"

    def __init__(self, settings: WebhookSettings, authorization: str | None = None,
                 metrics: SinkMetrics | None = None) -> None:
        self.settings = settings
        self.metrics = metrics
        self.store: OutboxStore | None = None
        self._store_failed = False
        on = (lambda outcome, n: metrics.sink_outcome(self.name, outcome, n)) if metrics else None
        self.poster = OutboxPoster(self.name, settings.url, settings, content_type=CLOUDEVENTS_CONTENT_TYPE,
                                   authorization=authorization, on_outcome=on)

    def attach(self, store: OutboxStore) -> int:
        """Keep undelivered events in ``store`` from now on, and queue the ones a previous run left there (in
        their order). Returns how many were restored."""
        self.store = store
        rows = self._persist(lambda: store.outbox_load(self.name)) or []
        for event_id, body in rows:
            self._forget(self.poster.post_keyed(event_id, body))
        if rows:
            log.info("webhook_outbox_restored", events=len(rows), note="re-sent in order")
        return len(rows)

    def restore(self, events: Iterable[Mapping[str, Any]]) -> int:
        return 0

    def submit(self, event: Mapping[str, Any], is_alert: bool, now_unix_s: float) -> None:
        if is_alert or self.settings.events == "all":
            body = json.dumps(event, separators=(",", ":"), default=str).encode()
            event_id = str(event.get("id", ""))
            store = self.store
            if store is not None:
                self._persist(lambda: store.outbox_add(self.name, event_id, body))
            self._forget(self.poster.post_keyed(event_id, body))

    def tick(self, now_unix_s: float) -> None:
        self._forget(self.poster.take_done())
        if self.metrics is not None:
            self.metrics.sink_state(self.name, self.poster.depth(), None)

    def _forget(self, event_ids: list[str]) -> None:
        store = self.store
        if event_ids and store is not None:
            self._persist(lambda: store.outbox_remove(self.name, event_ids))

    def _persist(self, op: Any) -> Any:
        try:
            result = op()
        except sqlite3.Error as exc:
            if not self._store_failed:
                self._store_failed = True
                log.warning("webhook_outbox_not_stored", error=str(exc),
                            note="undelivered events are kept in memory only until the state store takes writes")
            return None
        self._store_failed = False
        return result

    def close(self) -> None:
        self.poster.close()
        self._forget(self.poster.take_done())


class AlertSinks:
    """The sinks facade the coordinator talks to: ``submit`` every stored and published event, ``tick`` from the
    main loop, ``close`` at shutdown. Never raises into the caller after construction.

    Args:
        sinks: configured sinks (may be empty).
    """

    def __init__(self, sinks: list[AlertmanagerSink | CloudEventsWebhookSink]) -> None:
        self.sinks = sinks
        self._failed_once: set[str] = set()

    @classmethod
    def from_settings(cls, alertmanager: AlertmanagerSettings, webhook: WebhookSettings,
                      environ: Mapping[str, str], metrics: SinkMetrics | None = None) -> AlertSinks:
        """Build the sinks whose ``url`` is set; Authorization values come from files or ``environ``.

        Raises:
            SinkConfigError: an Authorization file or env var or a TLS file is unusable.
        """
        sinks: list[AlertmanagerSink | CloudEventsWebhookSink] = []
        try:
            if alertmanager.url:
                sinks.append(AlertmanagerSink(alertmanager, read_authorization(alertmanager, environ, "alertmanager"),
                                              metrics))
            if webhook.url:
                sinks.append(CloudEventsWebhookSink(webhook, read_authorization(webhook, environ, "webhook"), metrics))
        except Exception:
            for s in sinks:
                s.close()
            raise
        for s in sinks:
            log.info("alert_sink_configured", sink=s.name, url=s.poster.url,
                     authorization=bool(s.poster.headers.get("Authorization")))
        return cls(sinks)

    @property
    def restore_types(self) -> tuple[str, ...]:
        """Event types :meth:`restore` needs (empty when no sink keeps state)."""
        return RESTORE_TYPES if any(isinstance(s, AlertmanagerSink) for s in self.sinks) else ()

    def restore(self, events: Iterable[Mapping[str, Any]]) -> None:
        """Rebuild sink state from stored events, oldest first (the ``restore_types`` only)."""
        for s in self.sinks:
            if isinstance(s, AlertmanagerSink):  # the only sink with state
                s.restore(events)
                return

    def attach_outbox(self, store: OutboxStore) -> None:
        """Give the sinks that keep undelivered events (the webhook) the state store, and re-queue what a previous
        run left undelivered there."""
        for s in self.sinks:
            if isinstance(s, CloudEventsWebhookSink):
                s.attach(store)

    def submit(self, event: Mapping[str, Any], is_alert: bool, now_unix_s: float) -> None:
        """Hand one stored and published event to every sink (never blocks, never raises)."""
        for s in self.sinks:
            try:
                s.submit(event, is_alert, now_unix_s)
            except Exception as exc:  # noqa: BLE001 - a sink bug must not stop the coordinator
                self._log_once(s.name, exc)

    def tick(self, now_unix_s: float) -> None:
        """Re-send standing alerts that are due; refresh the sink gauges."""
        for s in self.sinks:
            try:
                s.tick(now_unix_s)
            except Exception as exc:  # noqa: BLE001
                self._log_once(s.name, exc)

    def close(self, flush_s: float = 2.0) -> None:
        """Give queued requests (e.g. a resolution just decided) up to ``flush_s`` in all, then stop every sink."""
        deadline = time.monotonic() + flush_s
        for s in self.sinks:
            s.poster.flush(max(0.0, deadline - time.monotonic()))
        for s in self.sinks:
            s.close()

    def _log_once(self, name: str, exc: Exception) -> None:
        key = f"{name}:{type(exc).__name__}"
        if key not in self._failed_once:
            self._failed_once.add(key)
            log.exception("alert_sink_internal_error", sink=name, error=repr(exc))
