"""Control socket: request/reply over ZeroMQ (I/O). Server side is a ROUTER (talks to REQ clients); the client is
a REQ socket with a timeout that is rebuilt after every failure (a REQ socket is unusable after a lost reply).

Protocol: request ``{"cmd": str, "args": {...}}``; reply ``{"ok": true, "result": ...}`` or
``{"ok": false, "error": {"code": str, "message": str}}``. Error codes: ``bad_request``, ``unknown_command``,
``not_found``, ``refused``, ``conflict``, ``unavailable``, ``internal``.
"""

from __future__ import annotations

import json
from typing import Any

import zmq

ERROR_CODES = ("bad_request", "unknown_command", "not_found", "refused", "conflict", "unavailable", "internal")
MAX_REQUEST_BYTES = 1024 * 1024


class ControlError(Exception):
    """The coordinator answered with an error (``code`` is one of :data:`ERROR_CODES`)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class ControlUnavailable(ControlError):
    """No reply within the timeout: the coordinator is down, or the endpoint is wrong."""

    def __init__(self, endpoint: str, timeout_s: float) -> None:
        super().__init__("unavailable", f"no reply from coordinator at {endpoint} within {timeout_s:g}s")


def bind_control(ctx: zmq.Context, endpoint: str) -> zmq.Socket:
    """Bind the server ROUTER socket."""
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.MAXMSGSIZE, MAX_REQUEST_BYTES)
    sock.setsockopt(zmq.ROUTER_MANDATORY, 0)
    sock.bind(endpoint)
    return sock


def recv_request(sock: zmq.Socket) -> tuple[list[bytes], dict[str, Any] | ControlError]:
    """Receive one request: ``(envelope, request_dict)`` or ``(envelope, ControlError)`` when malformed."""
    frames = sock.recv_multipart(zmq.NOBLOCK)
    try:
        sep = frames.index(b"")
    except ValueError:
        return frames[:-1], ControlError("bad_request", "missing REQ envelope")
    envelope, body = frames[: sep + 1], frames[sep + 1 :]
    if len(body) != 1:
        return envelope, ControlError("bad_request", "expected exactly one body frame")
    try:
        req = json.loads(body[0])
    except (ValueError, RecursionError) as exc:
        return envelope, ControlError("bad_request", f"invalid JSON: {exc}"[:200])
    if not isinstance(req, dict) or not isinstance(req.get("cmd"), str):
        return envelope, ControlError("bad_request", 'expected {"cmd": str, "args": {...}}')
    if not isinstance(req.get("args", {}), dict):
        return envelope, ControlError("bad_request", "args must be an object")
    return envelope, req


def send_reply(sock: zmq.Socket, envelope: list[bytes], result: Any = None, error: ControlError | None = None) -> None:
    """Send a reply to the client that sent ``envelope``."""
    body = {"ok": False, "error": {"code": error.code, "message": error.message}} if error else {"ok": True, "result": result}
    try:
        sock.send_multipart([*envelope, json.dumps(body, default=str).encode()], zmq.NOBLOCK)
    except zmq.ZMQError:
        pass  # the client went away; nothing to do


def call(endpoint: str, cmd: str, args: dict[str, Any] | None = None, timeout_s: float = 5.0) -> Any:
    """Send one request and return its ``result``.

    Raises:
        ControlUnavailable: no reply within ``timeout_s``.
        ControlError: the coordinator refused the request.
    """
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.REQ)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, int(timeout_s * 1000))
    sock.setsockopt(zmq.SNDTIMEO, int(timeout_s * 1000))
    try:
        sock.connect(endpoint)
        sock.send(json.dumps({"cmd": cmd, "args": args or {}}).encode())
        try:
            reply = json.loads(sock.recv())
        except zmq.Again:
            raise ControlUnavailable(endpoint, timeout_s) from None
    finally:
        sock.close(0)
    if not reply.get("ok"):
        err = reply.get("error") or {}
        raise ControlError(str(err.get("code", "internal")), str(err.get("message", "")))
    return reply.get("result")
