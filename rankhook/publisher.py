"""Rank-side ZeroMQ publisher: lazy, per-PID, never blocks, never raises (I/O; stdlib + pyzmq).

Design (field cases FC-19 and FC-22 in ``docs/field-cases.md``, section ZeroMQ):

- One PUSH socket that *connects* to the node daemon's PULL socket (the stable side binds). ZeroMQ's own
  per-pipe queue is the bounded queue: ``SNDHWM`` messages, then ``send(NOBLOCK)`` raises ``EAGAIN`` and the
  message is dropped and counted. ZeroMQ reconnects by itself when the node daemon restarts.
- ``linger=0``: closing never waits for undelivered messages (no hang at interpreter exit).
- The context is created lazily and owned by the creating PID. A forked child (data loader workers, torch_npu's
  monitor process) that calls :meth:`Publisher.send` gets its own fresh context; the parent's is never touched.
- Every exception is caught and counted; the first of each kind is logged once through ``logging``.
- A message larger than ``rankhook.wire.MAX_MESSAGE_BYTES`` is never handed to ZeroMQ: it is counted as dropped
  (and as ``oversize``) and logged once, instead of being counted as sent and then discarded by the node daemon.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("rankhook")

DEFAULT_RUNTIME_DIR = "/run/profwatch"
DROP_BACKOFF_S = 0.05
"""After ZeroMQ reports a full queue, messages are dropped locally for this long before trying again."""
IPC_PATH_MAX = 107
"""``sizeof(sockaddr_un.sun_path) - 1`` on Linux: longer ``ipc://`` paths cannot be bound or connected."""


class EndpointError(ValueError):
    """The node endpoint cannot be used (e.g. an ``ipc://`` path longer than 107 bytes)."""


def default_endpoint(env: dict[str, str] | os._Environ[str] | None = None) -> str:
    """Return ``PROFWATCH_NODE_ENDPOINT`` or ``ipc://$PROFWATCH_RUNTIME_DIR/node.sock``.

    ``PROFWATCH_RUNTIME_DIR`` defaults to ``/run/profwatch`` (the systemd ``RuntimeDirectory`` of the node service).
    """
    env = os.environ if env is None else env
    explicit = env.get("PROFWATCH_NODE_ENDPOINT", "").strip()
    if explicit:
        return explicit
    runtime = env.get("PROFWATCH_RUNTIME_DIR", "").strip() or DEFAULT_RUNTIME_DIR
    return f"ipc://{runtime.rstrip('/')}/node.sock"


def check_endpoint(endpoint: str) -> str:
    """Validate an endpoint; raise :class:`EndpointError` with a clear message for unusable ones."""
    if endpoint.startswith("ipc://"):
        path = endpoint[len("ipc://") :]
        if len(path.encode()) > IPC_PATH_MAX:
            raise EndpointError(
                f"ipc path is {len(path.encode())} bytes, the limit is {IPC_PATH_MAX}: {path!r}; "
                "set PROFWATCH_RUNTIME_DIR (or PROFWATCH_NODE_ENDPOINT) to a shorter folder"
            )
        if not path:
            raise EndpointError("empty ipc:// path")
    elif not endpoint.startswith(("tcp://", "inproc://")):
        raise EndpointError(f"unsupported endpoint {endpoint!r} (use ipc:// or tcp://)")
    return endpoint


@dataclass
class PublisherCounters:
    """Monotonic counters of one publisher (per process)."""

    sent: int = 0
    dropped: int = 0
    errors: int = 0
    oversize: int = 0
    """Messages over ``max_message_bytes`` (also counted in ``dropped``)."""


def _user() -> str:
    """This process's user name (its uid when the name is unknown)."""
    import pwd

    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


class Publisher:
    """Non-blocking sender of ``[topic, payload]`` frames to the node daemon.

    Args:
        endpoint: ``ipc://...`` or ``tcp://...`` of the node daemon's PULL socket.
        sndhwm: messages queued while the node daemon is down or slow; beyond that, drops.
        max_message_bytes: topic plus payload above this are dropped and counted (default: the wire limit).
    Raises:
        EndpointError: at construction, for an unusable endpoint.
    """

    def __init__(self, endpoint: str, sndhwm: int = 10_000, max_message_bytes: int | None = None) -> None:
        from rankhook.wire import MAX_MESSAGE_BYTES

        self.endpoint = check_endpoint(endpoint)
        self.sndhwm = sndhwm
        self.max_message_bytes = MAX_MESSAGE_BYTES if max_message_bytes is None else max_message_bytes
        self.counters = PublisherCounters()
        self._pid = -1
        self._ctx: object | None = None
        self._sock: object | None = None
        self._send: Any = None
        self._flags = 0
        self._logged: set[str] = set()
        self._closed = False
        self._backoff_until = 0.0  # after a full queue, drop locally for a moment instead of asking ZeroMQ again
        # Capture backends emit events from their own threads; a ZeroMQ socket must not be used by two threads
        # at once. Uncontended, this lock costs ~0.1 us on the step path.
        self._lock = threading.Lock()
        if hasattr(os, "register_at_fork"):
            # A lock inherited through fork may be held by a thread that does not exist in the child.
            os.register_at_fork(after_in_child=self._reset_lock_after_fork)

    def _reset_lock_after_fork(self) -> None:
        self._lock = threading.Lock()

    def _log_once(self, kind: str, msg: str, *args: object) -> None:
        if kind not in self._logged:
            self._logged.add(kind)
            log.warning(msg, *args)

    def _connect(self) -> bool:
        import zmq

        self._pid = os.getpid()
        self._ctx = zmq.Context()  # a fresh context per PID; never zmq.Context.instance() (shared across fork)
        sock = self._ctx.socket(zmq.PUSH)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, self.sndhwm)
        sock.setsockopt(zmq.RECONNECT_IVL, 100)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, 2000)
        sock.connect(self.endpoint)  # asynchronous: a socket it cannot reach fails silently, retried for ever
        self._check_reachable()
        self._sock = sock
        self._send = sock.send_multipart
        self._flags = zmq.NOBLOCK
        return True

    def _check_reachable(self) -> None:
        """Say once on stderr (per process) why an ``ipc://`` node socket cannot be reached: missing (no node daemon),
        or not writable by this user (then name the socket's group, which the user must join): ZeroMQ's connect
        retries silently, so without this a training user outside the group gets no telemetry and no message."""
        if not self.endpoint.startswith("ipc://"):
            return
        path = self.endpoint[len("ipc://") :]
        try:
            st = os.stat(path)
        except FileNotFoundError:
            self._stderr_once("missing", f"rankhook: the profwatch node socket {path} does not exist (is the node "
                                         "daemon running on this host?); telemetry is queued, then dropped")
            return
        except PermissionError:
            self._stderr_once("permission", f"rankhook: cannot connect to the profwatch node socket {path}: permission "
                                            f"denied on a folder of its path for user {_user()!r} (the node's "
                                            "runtime folder must be open to the training users); this process "
                                            "sends no telemetry")
            return
        except OSError as exc:
            self._stderr_once("stat", f"rankhook: cannot reach the profwatch node socket {path}: {exc.strerror}")
            return
        if os.access(path, os.W_OK):
            return
        import grp

        try:
            group = grp.getgrgid(st.st_gid).gr_name
        except KeyError:
            group = str(st.st_gid)
        user = _user()
        self._stderr_once("permission", f"rankhook: cannot connect to the profwatch node socket {path}: permission "
                                        f"denied (it belongs to group {group!r}; add user {user!r} to it: usermod "
                                        f"-aG {group} {user}, then log in again); this process sends no telemetry")

    def _stderr_once(self, kind: str, text: str) -> None:
        if kind not in self._logged:
            self._logged.add(kind)
            print(text, file=sys.stderr, flush=True)

    def send(self, topic: bytes, payload: bytes) -> bool:
        """Queue one message; return False if it was dropped. Never raises, never blocks."""
        if self._closed:
            return False
        if len(payload) + len(topic) > self.max_message_bytes:
            self.counters.dropped += 1
            self.counters.oversize += 1
            self._log_once("oversize", "rankhook: dropping a %d-byte message (limit %d bytes); counted as dropped",
                           len(payload) + len(topic), self.max_message_bytes)
            return False
        if self._backoff_until and time.perf_counter() < self._backoff_until:
            self.counters.dropped += 1  # the queue was full a moment ago: a raised zmq.Again costs ~4 us
            return False
        try:
            with self._lock:
                if self._pid != os.getpid():
                    # First use, or we are a forked child: build our own context, leave the parent's alone.
                    self._sock = None
                    self._connect()
                self._send([topic, payload], self._flags)
            self.counters.sent += 1
            self._backoff_until = 0.0
            return True
        except Exception as exc:  # noqa: BLE001 - never raise into the training loop
            import zmq

            if isinstance(exc, zmq.Again):
                self.counters.dropped += 1
                self._backoff_until = time.perf_counter() + DROP_BACKOFF_S
                self._log_once("drop", "rankhook: node daemon queue full or down, dropping telemetry (%s)", self.endpoint)
            else:
                self.counters.errors += 1
                self._log_once(type(exc).__name__, "rankhook: publish failed: %r", exc)
            return False

    def close(self, linger_ms: int = 0) -> None:
        """Close the socket, waiting at most ``linger_ms`` for queued messages. Safe twice and in a forked child."""
        self._closed = True
        with self._lock:
            self._close_locked(linger_ms)

    def _close_locked(self, linger_ms: int) -> None:
        if self._sock is not None and self._pid == os.getpid():
            try:
                self._sock.close(linger_ms)  # type: ignore[attr-defined]
                self._ctx.term()  # type: ignore[union-attr]
            except Exception:  # noqa: BLE001
                pass
        self._sock = None
        self._ctx = None
