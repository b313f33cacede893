"""Control socket: request/reply over ZeroMQ (I/O). Server side is a ROUTER (talks to REQ clients); the client is
a REQ socket with a timeout that is rebuilt after every failure (a REQ socket is unusable after a lost reply).

Protocol: request ``{"cmd": str, "args": {...}}`` as strict UTF-8 JSON; reply ``{"ok": true, "result": ...}`` or
``{"ok": false, "error": {"code": str, "message": str}}``. Error codes: ``bad_request``, ``unknown_command``,
``denied``, ``not_found``, ``refused``, ``conflict``, ``unavailable``, ``auth_failed``, ``internal``.

Which command needs which role is one table, ``daemon/profwatch/core/access.py: COMMAND_ROLES``; under CURVE the role comes
from the client's certificate (the connection's ZAP User-Id), see ``daemon/profwatch/adapters/zmq/curve.py``.
"""

from __future__ import annotations

import json
import time
from typing import Any, NoReturn

import zmq

from profwatch.adapters.zmq.curve import HandshakeMonitor, make_client, make_server
from profwatch.adapters.zmq.keyfiles import KeyPair
from profwatch.core.messages import utf8_clean

ERROR_CODES = ("bad_request", "unknown_command", "denied", "not_found", "refused", "conflict", "unavailable",
               "auth_failed", "internal")
MAX_REQUEST_BYTES = 1024 * 1024


class ControlError(Exception):
    """The coordinator answered with an error (``code`` is one of :data:`ERROR_CODES`)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class ControlUnavailable(ControlError):
    """No reply: nothing listens at the endpoint (``refused``: the connection was refused, seen at once), or no
    reply came within the timeout (the coordinator is down or busy, the host unreachable, or the endpoint wrong)."""

    def __init__(self, endpoint: str, timeout_s: float, refused: bool = False) -> None:
        why = ("nothing is listening there (connection refused)" if refused
               else f"no reply within {timeout_s:g}s")
        super().__init__("unavailable", f"no coordinator at {endpoint}: {why}")
        self.endpoint = endpoint
        self.refused = refused


class ControlAuthFailed(ControlError):
    """The connection was refused during the CURVE handshake (wrong, unknown or missing key)."""

    def __init__(self, endpoint: str, explanation: str) -> None:
        super().__init__("auth_failed", f"authentication failed at {endpoint}: {explanation}")


def bind_control(ctx: zmq.Context, endpoint: str, curve: KeyPair | None = None, rcvhwm: int = 8) -> zmq.Socket:
    """Bind the server ROUTER socket (a CURVE server in ZAP domain ``control`` when ``curve`` is given).

    ``rcvhwm`` bounds the requests queued per client (each at most :data:`MAX_REQUEST_BYTES`)."""
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.MAXMSGSIZE, MAX_REQUEST_BYTES)
    sock.setsockopt(zmq.RCVHWM, rcvhwm)
    sock.setsockopt(zmq.ROUTER_MANDATORY, 0)
    try:  # a socket left open on a failed bind would hang the context's term() (a silent hang at start)
        if curve is not None:
            make_server(sock, "control", curve)
        sock.bind(endpoint)
    except BaseException:
        sock.close(0)
        raise
    return sock


class DuplicateKey(ValueError):
    """A JSON object names one key twice (the rank wire refuses them too: which value counts is not defined)."""


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise DuplicateKey(k)
        out[k] = v
    return out


def recv_request(sock: zmq.Socket) -> tuple[list[bytes], dict[str, Any] | ControlError, zmq.Frame]:
    """Receive one request: ``(envelope, request_dict or ControlError when malformed, body frame)``.

    The body frame carries the connection's properties (``User-Id`` under CURVE). Requests must be strict UTF-8
    JSON objects whose strings all encode to UTF-8 (no lone surrogates)."""
    frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
    raw = [f.bytes for f in frames]
    try:
        sep = raw.index(b"")
    except ValueError:
        return raw[:-1], ControlError("bad_request", "missing REQ envelope"), frames[-1]
    envelope, body = raw[: sep + 1], raw[sep + 1 :]
    if len(body) != 1:
        return envelope, ControlError("bad_request", "expected exactly one body frame"), frames[-1]
    try:
        req = json.loads(body[0].decode("utf-8"), object_pairs_hook=_no_duplicate_keys)
    except DuplicateKey as exc:
        return envelope, ControlError("bad_request", f"duplicate key {str(exc)[:100]!r} in the request"), frames[-1]
    except UnicodeDecodeError:
        return envelope, ControlError("bad_request", "request is not UTF-8"), frames[-1]
    except (ValueError, RecursionError) as exc:
        return envelope, ControlError("bad_request", f"invalid JSON: {exc}"[:200]), frames[-1]
    if not isinstance(req, dict) or not isinstance(req.get("cmd"), str):
        return envelope, ControlError("bad_request", 'expected {"cmd": str, "args": {...}}'), frames[-1]
    if not isinstance(req.get("args", {}), dict):
        return envelope, ControlError("bad_request", "args must be an object"), frames[-1]
    if not utf8_clean(req):
        return envelope, ControlError("bad_request", "a string in the request is not valid UTF-8"), frames[-1]
    return envelope, req, frames[-1]


def send_reply(sock: zmq.Socket, envelope: list[bytes], result: Any = None, error: ControlError | None = None) -> None:
    """Send a reply to the client that sent ``envelope``."""
    body = {"ok": False, "error": {"code": error.code, "message": error.message}} if error else {"ok": True, "result": result}
    try:
        sock.send_multipart([*envelope, json.dumps(body, default=str).encode()], zmq.NOBLOCK)
    except zmq.ZMQError:
        pass  # the client went away; nothing to do


def call(endpoint: str, cmd: str, args: dict[str, Any] | None = None, timeout_s: float = 5.0,
         curve: tuple[KeyPair, bytes] | None = None) -> Any:
    """Send one request and return its ``result``.

    Args:
        curve: ``(client key pair, server public key)`` when the endpoint uses CURVE
            (``profwatch.adapters.zmq.curve.client_keys``).
    Raises:
        ControlAuthFailed: the handshake was refused or never completed (wrong or unknown key, CURVE on one side
            only); seen through the socket monitor, so it is reported as such instead of as a timeout.
        ControlUnavailable: no reply within ``timeout_s``; at once (``refused``) when every connection attempt
            was refused and none succeeded since, i.e. nothing listens at ``endpoint``.
        ControlError: the coordinator refused the request; ``request_too_large`` (before sending) when the
            request is over :data:`MAX_REQUEST_BYTES`.
    """
    body = json.dumps({"cmd": cmd, "args": args or {}}).encode()
    if len(body) > MAX_REQUEST_BYTES:  # the coordinator's ZeroMQ would drop it unread, and close the connection
        raise ControlError("request_too_large", f"the {cmd} request is {len(body)} bytes; the coordinator takes at "
                                                f"most {MAX_REQUEST_BYTES} (control.MAX_REQUEST_BYTES)")
    ctx: zmq.Context = zmq.Context.instance()
    sock = ctx.socket(zmq.REQ)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDTIMEO, int(timeout_s * 1000))
    if curve is not None:
        make_client(sock, curve[0], curve[1])
    mon = HandshakeMonitor(sock)
    try:
        sock.connect(endpoint)
        try:
            sock.send(body)
        except zmq.Again:  # no pipe within SNDTIMEO: a refused handshake tore it down before the send
            _classify_silence(mon, endpoint, timeout_s, curve is not None)
        reply = _await_reply(sock, mon, endpoint, timeout_s, curve is not None)
    finally:
        mon.close()
        sock.close(0)
    if not reply.get("ok"):
        err = reply.get("error") or {}
        raise ControlError(str(err.get("code", "internal")), str(err.get("message", "")))
    return reply.get("result")


def _await_reply(sock: zmq.Socket, mon: HandshakeMonitor, endpoint: str, timeout_s: float, curve: bool) -> Any:
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    poller.register(mon.sock, zmq.POLLIN)
    deadline = time.monotonic() + timeout_s
    while True:
        left_ms = int((deadline - time.monotonic()) * 1000)
        if left_ms <= 0:
            break
        events = dict(poller.poll(left_ms))
        if mon.sock in events:
            for _name, _value, failure in mon.poll():
                if failure is not None:
                    raise ControlAuthFailed(endpoint, failure[1])
            if mon.retried and not mon.connected:
                raise ControlUnavailable(endpoint, timeout_s, refused=True)
        if sock in events:
            return json.loads(sock.recv())
    _classify_silence(mon, endpoint, timeout_s, curve)


def _classify_silence(mon: HandshakeMonitor, endpoint: str, timeout_s: float, curve: bool) -> NoReturn:
    """Raise what the socket monitor saw when no reply (or no send) came within ``timeout_s``: a refused
    handshake, nothing listening, a CURVE handshake that never completed, or a silent endpoint."""
    for _name, _value, failure in mon.poll():
        if failure is not None:
            raise ControlAuthFailed(endpoint, failure[1])
    if mon.retried and not mon.connected:
        raise ControlUnavailable(endpoint, timeout_s, refused=True)
    if curve and mon.connected and not mon.succeeded:
        raise ControlAuthFailed(endpoint, f"connected, but no CURVE handshake completed within {timeout_s:g}s")
    raise ControlUnavailable(endpoint, timeout_s)
