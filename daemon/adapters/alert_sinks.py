"""Alert sinks: POST Alertmanager-webhook-v4 JSON to an HTTP endpoint from a background thread (I/O).

The caller never blocks: :meth:`WebhookSink.send` puts the payload on a bounded queue and returns; when the
queue is full the payload is dropped and counted. One worker thread POSTs with ``urllib`` (stdlib) and retries
transient failures (connection errors, timeouts, HTTP 5xx and 429) with tenacity, exponential backoff and a
stop; other 4xx answers are not retried. :meth:`close` stops the thread (pending retries are cut short).
"""

from __future__ import annotations

import json
import queue
import threading
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import structlog
from tenacity import (
    RetryError,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    stop_when_event_set,
    wait_exponential,
)

from daemon.core.alerts import to_alertmanager

log = structlog.get_logger()
_STOP = object()


class _Transient(Exception):
    """A failure worth retrying (5xx, 429, connection refused, timeout)."""


@dataclass(slots=True)
class SinkStats:
    """Counters of one sink (monotonic): queued, sent, failed (gave up after retries or 4xx), dropped (queue
    full or sink closed), attempts (HTTP requests made)."""

    queued: int = 0
    sent: int = 0
    failed: int = 0
    dropped: int = 0
    attempts: int = 0


class WebhookSink:
    """Bounded, non-blocking webhook poster.

    Args:
        url: ``http(s)://`` endpoint (an Alertmanager-compatible receiver, or a Slack/relay proxy).
        timeout_s: per-request timeout.
        retries: extra attempts after the first for a transient failure (0 = one try).
        queue_size: pending payloads kept; more are dropped and counted.
        backoff_s: first retry delay; doubles up to ``max_backoff_s``.
        headers: extra HTTP headers (e.g. ``Authorization``).
        external_url: ``externalURL`` / ``generatorURL`` of payloads built by :meth:`submit`.
    """

    def __init__(self, url: str, timeout_s: float = 5.0, retries: int = 3, queue_size: int = 100, *,
                 backoff_s: float = 0.2, max_backoff_s: float = 5.0, headers: Mapping[str, str] | None = None,
                 external_url: str = "", name: str = "webhook") -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"webhook url must be http(s): {url!r}")
        self.url = url
        self.external_url = external_url
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.headers = {"Content-Type": "application/json", "User-Agent": "profwatch", **dict(headers or {})}
        self.stats = SinkStats()
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=queue_size)
        self._closing = threading.Event()
        self._idle = threading.Condition()
        self._in_flight = 0
        self._thread = threading.Thread(target=self._run, name=f"profwatch-sink-{name}", daemon=True)
        self._thread.start()

    # -- caller side ---------------------------------------------------------------------------------------------
    def send(self, payload: Mapping[str, Any]) -> bool:
        """Queue one JSON payload; ``False`` (and ``stats.dropped += 1``) if the queue is full or the sink closed."""
        if self._closing.is_set():
            self.stats.dropped += 1
            return False
        with self._idle:
            try:
                self._queue.put_nowait(dict(payload))
            except queue.Full:
                full = True
            else:
                full = False
                self._in_flight += 1
        if full:
            self.stats.dropped += 1
            log.warning("alert_sink_dropped", sink=self.url, reason="queue_full", dropped=self.stats.dropped)
            return False
        self.stats.queued += 1
        return True

    def send_events(self, events: Sequence[Mapping[str, Any]], *, external_url: str | None = None) -> bool:
        """Convert CloudEvents with :func:`daemon.core.alerts.to_alertmanager` and queue the payload if it has
        alerts; ``True`` when queued (or nothing to send). Raises ``AlertFormatError`` for a non-profwatch event."""
        payload = to_alertmanager(events, external_url=self.external_url if external_url is None else external_url)
        return self.send(payload) if payload["alerts"] else True

    def submit(self, event: Mapping[str, Any]) -> bool:
        """Queue one CloudEvent as an Alertmanager payload (what the coordinator calls per alert event)."""
        return self.send_events([event])

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait (bounded) until every queued payload was sent or given up; ``True`` if drained."""
        with self._idle:
            return self._idle.wait_for(lambda: self._in_flight == 0, timeout=timeout_s)

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the worker: pending payloads are dropped (counted), retries in progress end at once."""
        if self._closing.is_set():
            return
        self._closing.set()
        try:
            self._queue.put_nowait(_STOP)
        except queue.Full:
            pass
        self._thread.join(timeout_s)

    def __enter__(self) -> WebhookSink:  # noqa: PYI034
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- worker side ---------------------------------------------------------------------------------------------
    def _post_once(self, body: bytes) -> None:
        self.stats.attempts += 1
        req = urllib.request.Request(self.url, data=body, headers=self.headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                resp.read(1024)
        except urllib.error.HTTPError as exc:
            if exc.code >= 500 or exc.code == 429:
                raise _Transient(f"HTTP {exc.code}") from exc
            raise
        except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as exc:
            raise _Transient(str(exc)) from exc

    def _deliver(self, payload: dict[str, Any]) -> None:
        body = json.dumps(payload, separators=(",", ":")).encode()
        retrying = Retrying(
            stop=stop_after_attempt(self.retries + 1) | stop_when_event_set(self._closing),
            wait=wait_exponential(multiplier=self.backoff_s, min=self.backoff_s, max=self.max_backoff_s),
            retry=retry_if_exception(lambda e: isinstance(e, _Transient)),
            sleep=self._closing.wait,
            reraise=False,
        )
        try:
            retrying(self._post_once, body)
            self.stats.sent += 1
        except RetryError as exc:
            self.stats.failed += 1
            log.warning("alert_sink_failed", sink=self.url, reason=str(exc.last_attempt.exception()),
                        attempts=exc.last_attempt.attempt_number)
        except urllib.error.HTTPError as exc:
            self.stats.failed += 1
            log.warning("alert_sink_rejected", sink=self.url, status=exc.code)
        except Exception as exc:  # noqa: BLE001 - the worker must survive anything a payload does
            self.stats.failed += 1
            log.error("alert_sink_error", sink=self.url, error=repr(exc))

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                break
            if self._closing.is_set():
                self.stats.dropped += 1
            else:
                self._deliver(item)
            with self._idle:
                self._in_flight -= 1
                self._idle.notify_all()
        # drain what is left so flush() waiters wake up
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not _STOP:
                self.stats.dropped += 1
                with self._idle:
                    self._in_flight -= 1
        with self._idle:
            self._idle.notify_all()
