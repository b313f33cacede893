"""CURVE authentication for the daemons' ZeroMQ sockets (I/O): the ZAP authenticator thread, socket setup,
handshake monitors and the start-up self-test. Key files and the allowed-client key ring: ``keyfiles.py``.

Formats and protocols: certificates are the files ``zmq.auth.create_certificates`` writes (ZeroMQ's "ZPL"
text format: a ``metadata`` section, then ``curve`` with ``public-key`` / ``secret-key`` in Z85); the handshake is
CurveZMQ (RFC 26) and the authentication ZAP (RFC 27), served by pyzmq's ``zmq.auth.thread.ThreadAuthenticator``.
Each client certificate carries ``name`` and ``role`` metadata; the name becomes the ZAP ``User-Id`` every message
of that connection carries (frame property ``"User-Id"``), which is how the coordinator knows who sent it.

Field case: a wrong key looks like a network outage (the peer just never answers). Hence the self-test at start,
a log line and a metric for every refused handshake, and clients that say "authentication failed".
"""

from __future__ import annotations

import itertools
import logging
import os
import struct
import time
from typing import Any

import structlog
import zmq
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils import z85
from zmq.utils.monitor import parse_monitor_message

from profwatch.adapters.zmq.keyfiles import ClientKey, KeyPair, KeyRing
from profwatch.core.access import SOCKET_ROLES

log = structlog.get_logger("profwatch.curve")

_mon_ids = itertools.count(1)
KEY_PROPERTY = "X-Profwatch-Key"
"""Metadata property (ZAP reply, RFC 27) that carries an admitted connection's Z85 public key."""


def zmtp_metadata(props: dict[str, bytes]) -> bytes:
    """Properties in the ZMTP/ZAP metadata format (RFC 23/ZMTP 3.0 "metadata": name length as one octet, name,
    value length as four octets in network order, value)."""
    out = b""
    for name, value in props.items():
        raw = name.encode("ascii")
        out += bytes([len(raw)]) + raw + struct.pack("!I", len(value)) + value
    return out


# -- the ZAP handler ----------------------------------------------------------------------------------------------
class CurveAuthenticator(ThreadAuthenticator):
    """ZAP handler of one context: admits a CURVE client when its key is in the :class:`KeyRing` with a role the
    socket's ZAP domain (``ingest``, ``control``, ``pub``) admits (:data:`~profwatch.core.access.SOCKET_ROLES`).

    Every refusal increments ``on_refused(socket, reason)`` and is logged with the peer address (at most once
    per peer, key and socket per minute). Keys listed in ``quiet_keys`` (the self-test's) are refused silently.
    """

    def __init__(self, context: zmq.Context, keyring: KeyRing, on_refused: Any = None) -> None:
        super().__init__(context, log=logging.getLogger("profwatch.zap"))
        self.keyring = keyring
        self.on_refused = on_refused
        self.quiet_keys: set[bytes] = set()
        self._address = ""
        self._admitted_key = b""
        self._logged: dict[tuple[str, str, bytes], float] = {}

    def start(self) -> None:
        super().start()
        for domain in SOCKET_ROLES:
            self.configure_curve_callback(domain, credentials_provider=self)

    async def handle_zap_message(self, msg: list[bytes]) -> None:
        self._address = msg[3].decode("utf-8", "replace") if len(msg) > 3 else ""
        await super().handle_zap_message(msg)

    def callback(self, domain: str, public_z85: bytes) -> bool:
        """pyzmq's credentials-provider hook (runs on the authenticator thread)."""
        key = self.keyring.lookup(public_z85)
        allowed = SOCKET_ROLES.get(domain, frozenset())  # type: ignore[call-overload]
        if key is not None and key.role in allowed:
            return True
        reason = "unknown_key" if key is None else "role_not_allowed"
        if public_z85 in self.quiet_keys:
            return False
        if self.on_refused is not None:
            self.on_refused(domain, reason)
        now = time.monotonic()
        tag = (domain, self._address, public_z85)
        if now - self._logged.get(tag, -1e9) >= 60.0:
            if len(self._logged) > 10_000:
                self._logged.clear()
            self._logged[tag] = now
            log.warning("auth_refused", socket=domain, peer=self._address, reason=reason,
                        key=public_z85.decode("ascii", "replace"), key_name=key.name if key else None,
                        role=key.role if key else None, note="logged once a minute per peer and key")
        return False

    def curve_user_id(self, client_public_key: bytes) -> str:
        self._admitted_key = z85.encode(client_public_key)
        key = self.keyring.lookup(self._admitted_key)
        return key.name if key is not None else "unknown"

    def _send_zap_reply(self, request_id: bytes, status_code: bytes, status_text: bytes,
                        user_id: str = "anonymous") -> None:
        """pyzmq's ZAP reply (``zmq.auth.base.Authenticator._send_zap_reply``, pyzmq 25-27), plus the admitted
        key as metadata :data:`KEY_PROPERTY`. ``curve_user_id`` runs just before it for the same request, on the
        same thread, with no await in between, so ``_admitted_key`` is this request's key."""
        ok = status_code == b"200"
        metadata = zmtp_metadata({KEY_PROPERTY: self._admitted_key}) if ok and self._admitted_key else b""
        self._admitted_key = b""
        uid = user_id.encode(self.encoding, "replace") if ok else b""
        self.zap_socket.send_multipart([b"1.0", request_id, status_code, status_text, uid, metadata])


def user_id(frame: zmq.Frame) -> str | None:
    """The ZAP User-Id of the connection a frame came from (the certificate name), None without ZAP."""
    try:
        return str(frame.get("User-Id"))
    except zmq.ZMQError:
        return None


def peer_key(frame: zmq.Frame) -> bytes | None:
    """The Z85 public key the connection of a frame authenticated with (:data:`KEY_PROPERTY`), None without it."""
    try:
        return str(frame.get(KEY_PROPERTY)).encode("ascii")
    except (zmq.ZMQError, UnicodeEncodeError):
        return None


def peer_address(frame: zmq.Frame) -> str | None:
    """ZeroMQ's ``Peer-Address`` of a frame (for ``ipc://``: ``host:uid:gid:pid``), None when not available."""
    try:
        return str(frame.get("Peer-Address"))
    except zmq.ZMQError:
        return None


# -- socket setup -------------------------------------------------------------------------------------------------
def make_server(sock: zmq.Socket, domain: str, keys: KeyPair) -> None:
    """Make ``sock`` a CURVE server authenticated through ZAP ``domain``; call before ``bind``."""
    sock.curve_secretkey = keys.secret
    sock.curve_publickey = keys.public
    sock.curve_server = True
    sock.zap_domain = domain.encode()


def make_client(sock: zmq.Socket, keys: KeyPair, server_public: bytes) -> None:
    """Make ``sock`` a CURVE client of the server with ``server_public``; call before ``connect``."""
    sock.curve_secretkey = keys.secret
    sock.curve_publickey = keys.public
    sock.curve_serverkey = server_public


_EVENT_NAMES = {v: k for k, v in vars(zmq).items() if k.startswith("EVENT_") and isinstance(v, int)}
_FAILURES = {zmq.EVENT_HANDSHAKE_FAILED_AUTH, zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL,
             zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL}


_SERVER_TEXT = {
    "refused": "a client's key was refused (see auth_refused for its address)",
    "mechanism_mismatch": "a client connected without CURVE (or with another mechanism): it needs a key",
    "protocol": "a client's CURVE handshake failed: it does not hold this coordinator's server.key",
    "no_detail": "a client's handshake broke off: it has no CURVE key, or not this coordinator's server.key",
}


def describe_failure(event: int, value: int, side: str = "client") -> tuple[str, str]:
    """``(reason, explanation)`` of a handshake failure event seen by a ``client`` or a ``server``. The reason a
    server sees for the same client fault varies with timing (``mechanism_mismatch`` or ``no_detail``)."""
    if side == "server":
        reason = describe_failure(event, value)[0]
        return reason, _SERVER_TEXT[reason]
    if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
        return "refused", (f"the coordinator refused this client's key (ZAP status {value}): add its public key with "
                           "`profwatch keys add NAME --role ...` on the coordinator, with a role this socket admits")
    if event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL and value == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
        return "mechanism_mismatch", ("one side uses CURVE and the other does not: set security.curve the same on "
                                      "both sides (and give this client a key)")
    if event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
        return "protocol", ("the CURVE handshake failed (cryptographic error): the client's server_public_key is "
                            "not this coordinator's server.key")
    return "no_detail", ("the CURVE handshake failed without detail: server_public_key is probably not the "
                         "coordinator's server.key")


class HandshakeMonitor:
    """A socket monitor reduced to what matters for security: handshake successes and failures.

    ``poll()`` drains pending events without blocking and returns ``[(event_name, value, failure)]`` where
    ``failure`` is ``(reason, explanation)`` for a failed handshake, else None. ``sock`` is the monitor's PAIR
    socket (register it with a poller). ``close()`` before closing the monitored socket. The counters
    ``connected`` and ``retried`` (connection attempts refused, e.g. nothing listens on that port) let a client tell
    "nothing there" from "there, but silent".
    """

    def __init__(self, target: zmq.Socket, side: str = "client") -> None:
        self.target = target
        self.side = side
        addr = f"inproc://profwatch-monitor-{os.getpid()}-{next(_mon_ids)}"
        events = zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_AUTH | \
            zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_CONNECTED | \
            zmq.EVENT_DISCONNECTED | zmq.EVENT_CONNECT_RETRIED | zmq.EVENT_ACCEPTED
        target.monitor(addr, events)
        self.sock = target.context.socket(zmq.PAIR)
        self.sock.linger = 0
        self.sock.connect(addr)
        self.succeeded = 0
        self.failed = 0
        self.connected = 0
        self.retried = 0  # connection attempts that failed (refused: nothing listens there), retried by ZeroMQ

    def poll(self) -> list[tuple[str, int, tuple[str, str] | None]]:
        out: list[tuple[str, int, tuple[str, str] | None]] = []
        while True:
            try:
                frames = self.sock.recv_multipart(zmq.NOBLOCK)
            except (zmq.Again, zmq.ZMQError):
                return out
            try:
                msg = parse_monitor_message(frames)
            except Exception:  # noqa: BLE001 - a malformed monitor frame is ignored
                continue
            ev, value = int(msg["event"]), int(msg["value"])
            failure = describe_failure(ev, value, self.side) if ev in _FAILURES else None
            if failure is not None:
                self.failed += 1
            elif ev == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self.succeeded += 1
            elif ev == zmq.EVENT_CONNECTED:
                self.connected += 1
            elif ev == zmq.EVENT_CONNECT_RETRIED:
                self.retried += 1
            out.append((_EVENT_NAMES.get(ev, str(ev)), value, failure))

    def close(self) -> None:
        try:
            self.target.disable_monitor()
        except zmq.ZMQError:
            pass
        self.sock.close(0)


# -- self-test ----------------------------------------------------------------------------------------------------
def connect_address(bound: str) -> str:
    """A connectable endpoint for a bound one: wildcards become loopback (``tcp://0.0.0.0:7711`` ->
    ``tcp://127.0.0.1:7711``, ``tcp://[::]:7711`` -> ``tcp://[::1]:7711``)."""
    host, _, port = bound[len("tcp://") :].rpartition(":")
    if host in ("0.0.0.0", "*", ""):
        host = "127.0.0.1"
    elif host in ("[::]", "::"):
        host = "[::1]"
    return f"tcp://{host}:{port}"


def selftest(ctx: zmq.Context, targets: dict[str, str], server_public: bytes, auth: CurveAuthenticator,
             timeout_s: float = 5.0) -> list[str]:
    """Handshake with each bound CURVE socket twice: with a probe key the socket admits (must succeed) and with
    an unknown key (must be refused). ``targets`` maps a ZAP domain to the socket's bound endpoint
    (``sock.last_endpoint``). Returns the problems found (empty: CURVE works as configured)."""
    problems: list[str] = []
    probes: list[tuple[str, str, zmq.Socket, HandshakeMonitor, bool]] = []
    added: list[bytes] = []
    try:
        for domain, bound in targets.items():
            for expect_ok in (True, False):
                pub, sec = zmq.curve_keypair()
                if expect_ok:
                    role = sorted(SOCKET_ROLES[domain])[0]  # type: ignore[index]
                    auth.keyring.add_probe(ClientKey(f"_selftest_{domain}", role, pub))
                    added.append(pub)
                else:
                    auth.quiet_keys.add(pub)
                sock = ctx.socket(zmq.SUB if domain == "pub" else zmq.DEALER)
                sock.linger = 0
                if bound.startswith("tcp://[") or "::" in bound:
                    sock.ipv6 = True
                make_client(sock, KeyPair(pub, sec, {}), server_public)
                mon = HandshakeMonitor(sock)
                sock.connect(connect_address(bound))
                probes.append((domain, bound, sock, mon, expect_ok))
        deadline = time.monotonic() + timeout_s
        pending = list(probes)
        while pending and time.monotonic() < deadline:
            for p in list(pending):
                p[3].poll()
                if p[3].succeeded or p[3].failed:
                    pending.remove(p)
            time.sleep(0.01)
        for domain, bound, _sock, mon, expect_ok in probes:
            if expect_ok and not mon.succeeded:
                problems.append(f"{domain} ({bound}): a key it admits could not complete the CURVE handshake within "
                                f"{timeout_s:g}s")
            if not expect_ok and mon.succeeded:
                problems.append(f"{domain} ({bound}): an unknown key was admitted")
            if not expect_ok and not mon.failed:
                problems.append(f"{domain} ({bound}): an unknown key was neither admitted nor refused within "
                                f"{timeout_s:g}s")
    finally:
        for _d, _b, sock, mon, _e in probes:
            mon.close()
            sock.close(0)
        for pub in added:
            auth.keyring.remove_probe(pub)
    return problems
