"""Outgoing HTTP POSTs from a background thread with a bounded queue, retries, TLS and an Authorization header (I/O).

The caller never blocks: :meth:`HttpPoster.post` puts the body on a bounded queue and returns; when the queue
is full the body is dropped and counted. One worker thread POSTs with ``urllib`` (stdlib) and retries transient
failures (connection errors, timeouts, HTTP 5xx and 429) with tenacity (exponential back-off, a stop after
``retries`` extra attempts, cut short by :meth:`close`); other 4xx answers are not retried.
"""

from __future__ import annotations

import queue
import ssl
import stat
import threading
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
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

from profwatch.adapters.fs.bounded_read import InputTooLarge, read_capped
from profwatch.core.alerts.settings import HttpClientSettings

log = structlog.get_logger("profwatch.sinks")
_STOP = object()
MAX_AUTHORIZATION_BYTES = 8192


class SinkConfigError(ValueError):
    """A sink cannot be set up (unreadable Authorization file, missing env var, bad TLS files)."""


class _Transient(Exception):
    """A failure worth retrying (5xx, 429, connection refused, timeout)."""


def read_authorization(settings: HttpClientSettings, environ: Mapping[str, str], section: str) -> str | None:
    """The ``Authorization`` header value from ``authorization_file`` or the env var ``authorization_env``.

    The file is read whole and stripped (one line such as ``Bearer <token>``); a file readable by others is
    accepted with a warning.

    Raises:
        SinkConfigError: the file is unreadable, empty, over 8 KiB or holds a line break inside; the env var is
            unset or empty.
    """
    if settings.authorization_file is not None:
        path = Path(settings.authorization_file)
        try:
            st = path.stat()
            value = read_capped(path, MAX_AUTHORIZATION_BYTES, f"[{section}] authorization_file").decode("utf-8").strip()
        except InputTooLarge as exc:  # a device (/dev/zero), a FIFO or a file over 8 KiB: never read whole
            raise SinkConfigError(str(exc)) from None
        except OSError as exc:
            raise SinkConfigError(f"[{section}] authorization_file {path} cannot be read: {exc.strerror}") from None
        except UnicodeDecodeError:
            raise SinkConfigError(f"[{section}] authorization_file {path} is not UTF-8 text") from None
        if st.st_mode & stat.S_IROTH:
            log.warning("authorization_file_world_readable", section=section, path=str(path),
                        hint="chmod 600 (or 640 with the service group)")
        source = f"authorization_file {path}"
    elif settings.authorization_env is not None:
        value = (environ.get(settings.authorization_env) or "").strip()
        source = f"env var {settings.authorization_env}"
    else:
        return None
    if not value:
        raise SinkConfigError(f"[{section}] {source} is empty or unset: it must hold the whole Authorization "
                              "header value, e.g. 'Bearer <token>'")
    if "\n" in value or "\r" in value:
        raise SinkConfigError(f"[{section}] {source} must hold one line (the Authorization header value)")
    return value


def ssl_context(settings: HttpClientSettings, section: str) -> ssl.SSLContext:
    """TLS context: the system store or ``ca_file``; the client certificate for mutual TLS; ``verify=false``
    disables checks (warned).

    Raises:
        SinkConfigError: a CA, certificate or key file cannot be loaded.
    """
    try:
        ctx = ssl.create_default_context(cafile=str(settings.ca_file) if settings.ca_file else None)
        if settings.cert_file is not None:
            ctx.load_cert_chain(str(settings.cert_file), str(settings.key_file) if settings.key_file else None)
    except (OSError, ssl.SSLError) as exc:
        raise SinkConfigError(f"[{section}] TLS files cannot be loaded: {exc}") from None
    if not settings.verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        log.warning("tls_verification_off", section=section)
    return ctx


@dataclass(slots=True)
class PostStats:
    """Counters of one poster (monotonic): queued, sent, failed (gave up after retries), rejected (4xx),
    dropped (queue full or closed), attempts (HTTP requests made)."""

    queued: int = 0
    sent: int = 0
    failed: int = 0
    rejected: int = 0
    dropped: int = 0
    attempts: int = 0


class HttpPoster:
    """Bounded, non-blocking HTTP POST worker for one endpoint.

    Args:
        name: sink name for logs, thread and metrics (``alertmanager``, ``webhook``).
        url: ``http(s)://`` endpoint.
        settings: timeouts, retries, back-off, queue size, TLS.
        content_type: ``Content-Type`` of every body.
        authorization: ``Authorization`` header value (from :func:`read_authorization`) or None.
        on_outcome: called from the worker with ``(outcome, count)`` for ``sent``, ``failed``, ``rejected``,
            ``dropped``, ``retried`` (and from the caller for ``queued``/``dropped``); e.g. Prometheus counters.
    Raises:
        SinkConfigError: TLS files cannot be loaded.
    """

    def __init__(self, name: str, url: str, settings: HttpClientSettings, *, content_type: str,
                 authorization: str | None = None, on_outcome: Callable[[str, int], None] | None = None) -> None:
        if not url.startswith(("http://", "https://")):
            raise SinkConfigError(f"[{name}] url must be http(s): {url!r}")
        self.name = name
        self.url = url
        self.s = settings
        self.headers = {"Content-Type": content_type, "User-Agent": "profwatch"}
        if authorization:
            self.headers["Authorization"] = authorization
        self._ctx = ssl_context(settings, name) if url.startswith("https://") else None
        self._on_outcome = on_outcome or (lambda outcome, n: None)
        self.stats = PostStats()
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=settings.queue_size)
        self._closing = threading.Event()
        self._idle = threading.Condition()
        self._in_flight = 0
        self._thread = threading.Thread(target=self._run, name=f"profwatch-sink-{name}", daemon=True)
        self._thread.start()

    def _count(self, outcome: str, n: int = 1) -> None:
        if hasattr(self.stats, outcome):
            setattr(self.stats, outcome, getattr(self.stats, outcome) + n)
        if outcome == "attempts":
            return
        try:
            self._on_outcome(outcome, n)
        except Exception:  # noqa: BLE001 - a metrics callback never breaks delivery
            pass

    # -- caller side ---------------------------------------------------------------------------------------------
    def post(self, body: bytes) -> bool:
        """Queue one body; ``False`` (and ``dropped`` counted) if the queue is full or the poster closed."""
        if self._closing.is_set():
            self._count("dropped")
            return False
        with self._idle:
            try:
                self._queue.put_nowait(body)
            except queue.Full:
                full = True
            else:
                full = False
                self._in_flight += 1
        if full:
            self._count("dropped")
            log.warning("alert_sink_dropped", sink=self.name, reason="queue_full", dropped=self.stats.dropped)
            return False
        self._count("queued")
        return True

    def depth(self) -> int:
        """Bodies queued or in flight."""
        return self._in_flight

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait (bounded) until every queued body was sent or given up; ``True`` if drained."""
        with self._idle:
            return self._idle.wait_for(lambda: self._in_flight == 0, timeout=timeout_s)

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the worker: pending bodies are dropped (counted), retries in progress end at once."""
        if self._closing.is_set():
            return
        self._closing.set()
        try:
            self._queue.put_nowait(_STOP)
        except queue.Full:
            pass
        self._thread.join(timeout_s)

    # -- worker side ---------------------------------------------------------------------------------------------
    def _post_once(self, body: bytes) -> None:
        self._count("attempts")
        req = urllib.request.Request(self.url, data=body, headers=self.headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=self.s.timeout_s, context=self._ctx) as resp:
                resp.read(65536)
        except urllib.error.HTTPError as exc:
            if exc.code >= 500 or exc.code == 429:
                raise _Transient(f"HTTP {exc.code}") from exc
            raise
        except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as exc:
            raise _Transient(str(exc)) from exc

    def _deliver(self, body: bytes) -> None:
        def before_sleep(_state: Any) -> None:
            self._count("retried")

        def sleep(seconds: float) -> None:
            self._closing.wait(seconds)  # close() cuts a back-off short

        retrying = Retrying(
            stop=stop_after_attempt(self.s.retries + 1) | stop_when_event_set(self._closing),
            wait=wait_exponential(multiplier=self.s.backoff_s, min=self.s.backoff_s, max=self.s.max_backoff_s),
            retry=retry_if_exception(lambda e: isinstance(e, _Transient)),
            sleep=sleep,
            before_sleep=before_sleep,
            reraise=False,
        )
        try:
            retrying(self._post_once, body)
            self._count("sent")
        except RetryError as exc:
            self._count("failed")
            log.warning("alert_sink_failed", sink=self.name, url=self.url, reason=str(exc.last_attempt.exception()),
                        attempts=exc.last_attempt.attempt_number)
        except urllib.error.HTTPError as exc:
            self._count("rejected")
            detail = b""
            try:
                detail = exc.read(500)
            except Exception:  # noqa: BLE001
                pass
            log.warning("alert_sink_rejected", sink=self.name, url=self.url, status=exc.code,
                        detail=detail.decode(errors="replace"))
        except Exception as exc:  # noqa: BLE001 - the worker must survive anything a body does
            self._count("failed")
            log.error("alert_sink_error", sink=self.name, error=repr(exc))

    def _run(self) -> None:
        while True:
            try:
                item = self._queue.get(timeout=0.2)
            except queue.Empty:
                if self._closing.is_set():  # close() could not queue _STOP into a full queue
                    break
                continue
            if item is _STOP:
                break
            if self._closing.is_set():
                self._count("dropped")
            else:
                self._deliver(item)
            with self._idle:
                self._in_flight -= 1
                self._idle.notify_all()
        while True:  # drop what is left so flush() waiters wake up
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not _STOP:
                self._count("dropped")
                with self._idle:
                    self._in_flight -= 1
        with self._idle:
            self._idle.notify_all()



class OutboxPoster(HttpPoster):
    """Ordered, at-least-once HTTP POSTs of keyed bodies (the webhook's outbox).

    Unlike :class:`HttpPoster`, a body is never given up on a transient failure (connection error, timeout, 5xx,
    429): the head of the outbox is retried with exponential back-off (``backoff_s`` doubling up to
    ``max_backoff_s``) until the receiver takes it, and the bodies behind it wait, so they arrive in order once the
    receiver is back. A 4xx answer drops that body (``rejected``). At most ``queue_size`` bodies are kept (the one
    in flight included); :meth:`post_keyed` at the bound drops the oldest waiting one (``dropped``) and returns its
    key. Every body that left the outbox (sent or rejected) is reported by :meth:`take_done`, so the caller can
    forget its persisted copy; :meth:`close` keeps what is undelivered (the caller has it persisted).

    Raises:
        SinkConfigError: TLS files cannot be loaded.
    """

    def __init__(self, name: str, url: str, settings: HttpClientSettings, *, content_type: str,
                 authorization: str | None = None, on_outcome: Callable[[str, int], None] | None = None) -> None:
        self._outbox: deque[tuple[str, bytes]] = deque()
        self._current: tuple[str, bytes] | None = None
        self._done: list[str] = []
        self._cv = threading.Condition()
        self._warned = False  # alert_sink_waiting logged for the current outage
        super().__init__(name, url, settings, content_type=content_type, authorization=authorization,
                         on_outcome=on_outcome)

    def post(self, body: bytes) -> bool:
        """Queue an unkeyed body (its key is empty); see :meth:`post_keyed`."""
        self.post_keyed("", body)
        return True

    def post_keyed(self, key: str, body: bytes) -> list[str]:
        """Append one body; returns the keys dropped at the bound (oldest first, counted as ``dropped``)."""
        dropped: list[str] = []
        with self._cv:
            self._outbox.append((key, body))
            while self._outbox and len(self._outbox) + (self._current is not None) > self.s.queue_size:
                dropped.append(self._outbox.popleft()[0])
            self._cv.notify_all()
        self._count("queued")
        if dropped:
            self._count("dropped", len(dropped))
            log.warning("alert_sink_dropped", sink=self.name, reason="outbox_full", dropped=len(dropped),
                        bound=self.s.queue_size, note="the oldest undelivered events were dropped")
        return dropped

    def take_done(self) -> list[str]:
        """Keys of the bodies that left the outbox (sent or rejected) since the last call."""
        with self._cv:
            done, self._done = self._done, []
        return done

    def depth(self) -> int:
        with self._cv:
            return len(self._outbox) + (self._current is not None)

    def flush(self, timeout_s: float = 10.0) -> bool:
        with self._cv:
            return self._cv.wait_for(lambda: not self._outbox and self._current is None, timeout=timeout_s)

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the worker (a back-off in progress ends at once); undelivered bodies stay with the caller."""
        if self._closing.is_set():
            return
        with self._cv:
            self._closing.set()
            self._cv.notify_all()
        self._thread.join(timeout_s)

    def _run(self) -> None:
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self._outbox or self._closing.is_set())
                if self._closing.is_set():
                    return
                self._current = self._outbox.popleft()
            key, body = self._current
            wait_s = self.s.backoff_s
            outcome = ""
            while not self._closing.is_set():
                try:
                    self._post_once(body)
                    outcome = "sent"
                    break
                except _Transient as exc:
                    self._count("retried")
                    if self._closing.wait(wait_s):
                        break
                    if wait_s >= self.s.max_backoff_s and self._once_per_outage(str(exc)):
                        log.warning("alert_sink_waiting", sink=self.name, url=self.url, reason=str(exc),
                                    waiting=self.depth(), note="kept and re-sent in order when the receiver is back")
                    wait_s = min(wait_s * 2, self.s.max_backoff_s)
                except urllib.error.HTTPError as exc:
                    outcome = "rejected"
                    log.warning("alert_sink_rejected", sink=self.name, url=self.url, status=exc.code)
                    break
                except Exception as exc:  # noqa: BLE001 - the worker must survive anything a body does
                    outcome = "failed"
                    log.error("alert_sink_error", sink=self.name, error=repr(exc))
                    break
            with self._cv:
                if outcome:
                    self._count(outcome)
                    self._done.append(key)
                    self._current = None
                elif self._current is not None:  # closing: put it back at the head, undelivered
                    self._outbox.appendleft(self._current)
                    self._current = None
                if outcome == "sent":
                    self._warned = False
                self._cv.notify_all()

    def _once_per_outage(self, _reason: str) -> bool:
        if self._warned:
            return False
        self._warned = True
        return True
