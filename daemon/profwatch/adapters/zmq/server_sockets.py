"""The coordinator's three listening sockets with their security (I/O): ingest ROUTER, control ROUTER, event PUB.

Each TCP socket that :meth:`SecuritySettings.curve_for` says must use CURVE becomes a CURVE server in its ZAP
domain (``ingest``, ``control``, ``pub``), admitted keys come from the client key directory, handshakes are
watched by socket monitors (every failure is counted and logged), and a self-test proves at start that a known key
gets in and an unknown one does not (``daemon/profwatch/adapters/zmq/curve.py``). Sockets beyond loopback without CURVE are only
possible with ``security.insecure = true`` and are warned about at every start.

Revocation: the key ring is looked at again at most every 0.5 s (``KeyRing.refresh``), and every message of an
open connection is checked against it (:meth:`ServerSockets.admitted`: the connection's key still there, under
the same name, with a role the socket admits); the event stream, which cannot refuse one subscriber, is re-bound
when a key that subscribed is revoked (:meth:`ServerSockets.check_revocations`, ``adapters/zmq/publish.py``).

Queued memory per peer is bounded: ``MAXMSGSIZE`` times the receive high-water mark derived from
``[limits]`` (``ingest_queue_bytes_per_peer``, ``control_queue_bytes_per_peer``).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from typing import Any

import structlog
import zmq

from profwatch.adapters.zmq import control
from profwatch.adapters.zmq.curve import (
    CurveAuthenticator,
    HandshakeMonitor,
    make_server,
    peer_address,
    peer_key,
    selftest,
    user_id,
)
from profwatch.adapters.zmq.keyfiles import ClientKey, CurveSetupError, KeyPair, KeyRing, load_keypair, require_curve
from profwatch.adapters.zmq.publish import EventPublisher
from profwatch.core.access import (
    ROLE_GRANTS,
    SOCKET_ROLES,
    ControlRole,
    SecuritySettings,
    SocketName,
    insecure_endpoints,
    parse_peer_address,
)
from profwatch.core.fleet.limits import LimitSettings
from rankhook import wire

log = structlog.get_logger("profwatch.sockets")


CLOSE_COUNTED = ("ingest",)
"""Sockets whose closed peer connections are counted (``ServerSockets`` doc: oversize messages). Node daemons hold
their ingest connection for good, so a close is a dropped oversize batch or a node that stopped; control clients
close their connection after every request, so there a close says nothing (the client checks its request's size
itself: ``control.call``)."""
STOP_CLOSE_WITHIN_S = 10.0
"""A connection that closes this long after its node daemon said it stops (its last heartbeat) closed routinely."""
MAX_TRACKED_PEERS = 10_000


def peer_of_fd(fd: int) -> str:
    """The remote address of an accepted connection's file descriptor (``ip`` for TCP, ``pid:N`` for ipc from the
    kernel's SO_PEERCRED), or ``fd:N`` when it cannot be told (already closed)."""
    import socket as pysocket
    import struct

    try:
        s = pysocket.socket(fileno=os.dup(fd))
    except OSError:
        return f"fd:{fd}"
    try:
        if s.family == pysocket.AF_UNIX:
            pid = struct.unpack("3i", s.getsockopt(pysocket.SOL_SOCKET, pysocket.SO_PEERCRED, 12))[0]
            return f"pid:{pid}"
        return str(s.getpeername()[0])
    except OSError:
        return f"fd:{fd}"
    finally:
        s.close()


def peer_of_frame(frame: zmq.Frame) -> str | None:
    """The peer of the connection ``frame`` came from, as :func:`peer_of_fd` names it (``pid:N`` over ipc, from
    ZeroMQ's ``Peer-Address`` credentials; the ip over TCP), None when ZeroMQ does not say."""
    address = peer_address(frame)
    if not address:
        return None
    creds = parse_peer_address(address)
    return f"pid:{creds[2]}" if creds is not None else address


def load_server_keypair(security: SecuritySettings) -> KeyPair:
    """The coordinator's CURVE key pair (``security.server_secret_path()``), as its CURVE sockets need it.

    Raises:
        CurveSetupError: libzmq without CURVE, or the secret key missing or unreadable (the message says the fix).
    """
    require_curve()
    return load_keypair(security.server_secret_path(), "server secret key",
                        "run `profwatch keys init` on the coordinator (or set security.server_secret_key)")


class BindError(Exception):
    """A listening endpoint cannot be bound; the message names the setting and the endpoint."""


@contextlib.contextmanager
def _naming(name: str, endpoint: str) -> Iterator[None]:
    """Re-raise a failed bind as :class:`BindError` naming ``coordinator.<name>_bind`` and its endpoint."""
    try:
        yield
    except zmq.ZMQError as exc:
        raise BindError(f"coordinator.{name}_bind {endpoint}: cannot bind: {exc.strerror}") from exc


class ServerSockets:
    """Bind ingest, control and pub as configured; raises :class:`CurveSetupError` (exit 2) when CURVE is
    required but not usable, and ``zmq.ZMQError`` when an endpoint cannot be bound.

    Args:
        binds: ``{"ingest": ..., "control": ..., "pub": ...}`` endpoints.
        on_refused: ``(socket, reason) -> None`` called for every refused or failed handshake (a metric).
        on_closed: ``(socket) -> None`` called for every peer connection of ``ingest`` that closed (a metric:
            ``profwatch_connections_closed_total``). ZeroMQ drops a message over the socket's ``MAXMSGSIZE`` (the
            wire's 4 MiB batch cap) before the application sees it and closes its connection: this count, from the
            socket monitor's disconnect events, is where such drops show (a node that restarts or goes away closes
            its connection too). Logged once a minute per peer (``peer_connection_closed``).
    """

    def __init__(self, ctx: zmq.Context, binds: dict[str, str], security: SecuritySettings, limits: LimitSettings,
                 on_refused: Any = None, on_closed: Any = None) -> None:
        self.security = security
        self.on_refused = on_refused
        self.on_closed = on_closed
        self._peers: dict[tuple[str, int], str] = {}  # (socket, fd) -> peer address, from ACCEPTED
        self._closed_logged: dict[tuple[str, str], float] = {}
        self._stopping: dict[str, float] = {}  # peer -> when its node said it stops (monotonic)
        self.curve = {name: security.curve_for(ep) for name, ep in binds.items()}
        self.auth: CurveAuthenticator | None = None
        self.keyring: KeyRing | None = None
        self.monitors: dict[str, HandshakeMonitor] = {}
        self._logged: dict[tuple[str, str], float] = {}
        keys: KeyPair | None = None
        if any(self.curve.values()):
            keys = load_server_keypair(security)
            self.keyring = KeyRing(security.client_keys_path())
            self.auth = CurveAuthenticator(ctx, self.keyring, on_refused=on_refused)
            self.auth.start()
        open_eps = insecure_endpoints(binds, security)
        if open_eps:
            log.warning("insecure_sockets", endpoints=open_eps,
                        note="security.insecure = true: reachable beyond loopback without authentication")
        try:
            self.ingest = ctx.socket(zmq.ROUTER)
            self.ingest.setsockopt(zmq.LINGER, 0)
            self.ingest.setsockopt(zmq.MAXMSGSIZE, wire.MAX_BATCH_BYTES)
            self.ingest.setsockopt(zmq.RCVHWM, limits.hwm_for(limits.ingest_queue_bytes_per_peer, wire.MAX_BATCH_BYTES))
            # commands to a node that went away are dropped, never queued for a peer that may not return
            self.ingest.setsockopt(zmq.SNDHWM, 100)
            # ZMTP heartbeats: a dead peer's connection is closed within ~10 s (half-open TCP after a host crash)
            self.ingest.setsockopt(zmq.HEARTBEAT_IVL, 2000)
            self.ingest.setsockopt(zmq.HEARTBEAT_TIMEOUT, 10_000)
            if self.curve["ingest"] and keys is not None:
                make_server(self.ingest, "ingest", keys)
            with _naming("ingest", binds["ingest"]):
                self.ingest.bind(binds["ingest"])
            with _naming("control", binds["control"]):
                self.control = control.bind_control(
                    ctx, binds["control"], curve=keys if self.curve["control"] else None,
                    rcvhwm=limits.hwm_for(limits.control_queue_bytes_per_peer, control.MAX_REQUEST_BYTES))
            with _naming("pub", binds["pub"]):
                self.pub = EventPublisher(ctx, binds["pub"], curve=keys if self.curve["pub"] else None)
            # the endpoints as bound: a port 0 or * (ZeroMQ picks one) is the real port here, not the configured 0
            self.bound = {"ingest": str(self.ingest.getsockopt_string(zmq.LAST_ENDPOINT)),
                          "control": str(self.control.getsockopt_string(zmq.LAST_ENDPOINT)), "pub": self.pub.endpoint}
            for name, sock in (("ingest", self.ingest), ("control", self.control), ("pub", self.pub.sock)):
                if self.curve[name] or name in CLOSE_COUNTED:  # ingest: closed connections are counted
                    self.monitors[name] = HandshakeMonitor(sock, side="server")
            if self.auth is not None and keys is not None:
                targets = {name: str(sock.getsockopt_string(zmq.LAST_ENDPOINT)) for name, sock in
                           (("ingest", self.ingest), ("control", self.control), ("pub", self.pub.sock))
                           if self.curve[name]}
                problems = selftest(ctx, targets, keys.public, self.auth, security.selftest_timeout_s)
                if problems:
                    raise CurveSetupError("CURVE self-test failed: " + "; ".join(problems))
                self.poll_monitors(quiet=True)
                log.info("curve_ready", sockets=sorted(targets), client_keys=len(self.keyring or ()),
                         key_dir=str(security.client_keys_path()))
        except BaseException:
            self.close()
            raise

    def grants(self, frame: zmq.Frame) -> frozenset[ControlRole]:
        """Control roles of the connection a request frame came from: under CURVE, the current role of the key it
        authenticated with (none once that key was removed, renamed or changed); ``security.loopback_roles``
        without CURVE."""
        if not self.curve["control"] or self.keyring is None:
            return self.security.loopback_grants()
        key = self._current_key(frame, "control")
        return ROLE_GRANTS[key.role] if key is not None else frozenset()

    def _current_key(self, frame: zmq.Frame, socket: SocketName) -> ClientKey | None:
        if self.keyring is None:
            return None
        public = peer_key(frame)
        if public is None:
            return None
        return self.keyring.admits(public, user_id(frame), SOCKET_ROLES[socket])

    def admitted(self, frame: zmq.Frame, socket: SocketName) -> bool:
        """Whether a message of an open connection may still be served: always without CURVE on ``socket``;
        under CURVE only while the key its connection authenticated with is in the key ring, under the same
        name, with a role the socket admits (checked per message; the ring is re-read at most every 0.5 s)."""
        if not self.curve[socket]:
            return True
        return self._current_key(frame, socket) is not None

    def node_key(self, frame: zmq.Frame) -> str | None:
        """The certificate name an ingest message's connection authenticated with (None without CURVE)."""
        if not self.curve["ingest"]:
            return None
        return user_id(frame) or ""

    @property
    def revocable(self) -> bool:
        """Whether a subscriber of the event stream can be revoked (CURVE on it, with a key ring): then
        :meth:`check_revocations` belongs in every turn of the loop; else it only reads subscription messages."""
        return bool(self.curve["pub"]) and self.keyring is not None

    def check_revocations(self) -> bool:
        """Drain the event stream's subscription messages and, under CURVE, re-bind it when a key that
        subscribed is no longer admitted (the revoked subscriber is cut off; see ``publish.py``). Returns True
        when the sockets to poll changed (the pub monitor was replaced). Raises ``zmq.ZMQError`` when the
        endpoint cannot be bound again."""
        if not self.curve["pub"] or self.keyring is None:
            self.pub.drain_subscriptions()
            return False
        self.keyring.refresh()
        ring, roles = self.keyring, SOCKET_ROLES["pub"]
        revoked = self.pub.revoked_subscribers(lambda k: ring.admits(k, None, roles) is not None)
        if not revoked:
            return False
        mon = self.monitors.pop("pub", None)
        if mon is not None:
            mon.close()
        self.pub.rebind()
        self.monitors["pub"] = HandshakeMonitor(self.pub.sock, side="server")
        if self.on_refused is not None:
            for _ in revoked:
                self.on_refused("pub", "revoked")
        log.warning("event_stream_rebound", revoked_keys=[k.decode("ascii", "replace") for k in revoked],
                    endpoint=self.pub.endpoint,
                    note="a key that subscribed was revoked: every subscriber was disconnected; admitted ones "
                         "reconnect by themselves, the revoked one is refused")
        return True

    def poll_monitors(self, quiet: bool = False) -> None:
        """Count and log handshake failures the monitors saw (a refused key is also logged by the ZAP handler,
        with the peer's address; failures before ZAP, such as a client without CURVE, only show here)."""
        now = time.monotonic()
        for name, mon in self.monitors.items():
            for ev, value, failure in mon.poll():
                if name in CLOSE_COUNTED and ev in ("EVENT_ACCEPTED", "EVENT_DISCONNECTED"):
                    self._connection_event(name, ev, value, now)
                    continue
                if failure is None or quiet:
                    continue
                reason, explanation = failure
                if reason == "refused":
                    continue  # the ZAP handler counted and logged it with the peer address
                if self.on_refused is not None:
                    self.on_refused(name, reason)
                if now - self._logged.get((name, reason), -1e9) >= 60.0:
                    self._logged[(name, reason)] = now
                    log.warning("handshake_failed", socket=name, reason=reason, detail=explanation,
                                note="logged once a minute per socket and reason; see profwatch_auth_refused_total")

    def note_stopping(self, frame: zmq.Frame) -> None:
        """The node daemon that sent ``frame`` on ingest said it stops (its last heartbeat): the close of its
        connection within :data:`STOP_CLOSE_WITHIN_S` is routine (logged at info, not counted)."""
        peer = peer_of_frame(frame)
        if peer is None:
            return
        if len(self._stopping) >= MAX_TRACKED_PEERS:
            self._stopping.pop(next(iter(self._stopping)))
        self._stopping[peer] = time.monotonic()

    def _connection_event(self, name: str, ev: str, fd: int, now: float) -> None:
        """Remember an accepted connection's peer by its fd; a closed one is routine when its node said it stops
        just before (:meth:`note_stopping`: logged at info, not counted), else counted and logged as a warning once
        a minute per peer."""
        if ev == "EVENT_ACCEPTED":
            if len(self._peers) >= MAX_TRACKED_PEERS:
                self._peers.pop(next(iter(self._peers)))
            self._peers[(name, fd)] = peer_of_fd(fd)
            return
        peer = self._peers.pop((name, fd), f"fd:{fd}")
        said = self._stopping.pop(peer, None)
        if said is not None and now - said <= STOP_CLOSE_WITHIN_S:
            log.info("peer_connection_closed", socket=name, peer=peer, reason="stopped",
                     note="the node daemon said it stops: a routine close")
            return
        if self.on_closed is not None:
            self.on_closed(name)
        if now - self._closed_logged.get((name, peer), -1e9) >= 60.0:
            if len(self._closed_logged) >= MAX_TRACKED_PEERS:
                self._closed_logged.clear()
            self._closed_logged[(name, peer)] = now
            log.warning("peer_connection_closed", socket=name, peer=peer, reason="unannounced",
                        note="closed without its node daemon saying it stops: the node was killed or its network "
                             f"dropped, or it sent a message over {wire.MAX_BATCH_BYTES} bytes (ZeroMQ MAXMSGSIZE "
                             "drops it with its connection; a running node reconnects by itself); logged once a "
                             "minute per peer, see profwatch_connections_closed_total")

    def monitor_sockets(self) -> list[zmq.Socket]:
        return [m.sock for m in self.monitors.values()]

    def close(self) -> None:
        for mon in self.monitors.values():
            mon.close()
        self.monitors = {}
        for attr in ("ingest", "control"):
            sock = getattr(self, attr, None)
            if sock is not None:
                sock.close(0)
        pub = getattr(self, "pub", None)
        if pub is not None:
            pub.close()
        if self.auth is not None:
            self.auth.stop()
            self.auth = None
