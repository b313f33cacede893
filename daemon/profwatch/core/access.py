"""Who may talk to what (pure): the security settings, the one table of control commands and their roles, the
roles each socket admits, and which endpoints stay on loopback.

Trust model (README "Security", ``docs/security.md``):

- Every TCP socket that binds or connects beyond loopback uses CURVE (ZeroMQ's CurveZMQ, RFC 26/CURVEZMQ,
  authenticated through ZAP, RFC 27/ZAP). Each client certificate carries one role: ``node`` (may connect to
  ingest; its certificate name *is* its node id), ``read`` (control read commands and the event stream) or
  ``act`` (read, plus the commands that change what the coordinator does).
- Without CURVE (loopback sockets, or ``curve = "off"``) there is no key: a peer is "a process on this host".
  The control socket then grants :attr:`SecuritySettings.loopback_roles`, and a node id is what the node says
  (the latest connection for an id wins; the one it replaces is told to reconnect).
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Role = Literal["node", "read", "act"]
ControlRole = Literal["read", "act"]
SocketName = Literal["ingest", "control", "pub"]

COMMAND_ROLES: dict[str, ControlRole] = {
    "ping": "read",
    "status": "read",
    "events": "read",
    "captures": "read",
    "capture": "read",
    "dump_telemetry": "read",
    "arm": "act",
    "set_thresholds": "act",
    "cancel": "act",
}
"""Every control command and the role it needs. A command not in this table is denied (``unknown_command``),
whatever handler exists."""

ROLE_GRANTS: dict[Role, frozenset[ControlRole]] = {
    "node": frozenset(),
    "read": frozenset({"read"}),
    "act": frozenset({"read", "act"}),
}
"""What each certificate role may do on the control socket."""

SOCKET_ROLES: dict[SocketName, frozenset[Role]] = {
    "ingest": frozenset({"node"}),
    "control": frozenset({"read", "act"}),
    "pub": frozenset({"read", "act"}),
}
"""Which certificate roles each coordinator socket admits (checked during the CURVE handshake, through ZAP)."""

DEFAULT_KEYS_DIR = Path("/etc/profwatch/keys")
RANK_ENDPOINT_KEYS = ("node.bind",)
"""Endpoints ranks connect to: the rank hook has no keys, so these never use CURVE."""


class AccessDenied(Exception):
    """A control request is not allowed. ``code`` is ``unknown_command`` or ``denied``."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


def authorize(cmd: str, grants: frozenset[ControlRole]) -> ControlRole:
    """Return the role ``cmd`` needs when ``grants`` include it.

    Raises:
        AccessDenied: ``unknown_command`` for a command outside :data:`COMMAND_ROLES`; ``denied`` when the
            peer's grants lack the role.
    """
    need = COMMAND_ROLES.get(cmd)
    if need is None:
        raise AccessDenied("unknown_command", f"unknown command {cmd[:64]!r}")
    if need not in grants:
        have = ",".join(sorted(grants)) or "none"
        raise AccessDenied("denied", f"{cmd!r} needs the {need!r} role; this connection has: {have}")
    return need


def is_loopback_endpoint(endpoint: str) -> bool:
    """True for ``ipc://``, ``inproc://`` and ``tcp://`` on a loopback address (``127.0.0.0/8``, ``::1``,
    ``localhost``). A wildcard (``*``, ``0.0.0.0``, ``::``) or a host name is beyond loopback."""
    if endpoint.startswith(("ipc://", "inproc://")):
        return True
    if endpoint.startswith("tcp://"):
        host = endpoint[len("tcp://") :].rsplit(":", 1)[0].strip("[]")
        if ";" in host:  # "source;destination" form: the destination decides
            host = host.split(";", 1)[1]
        if host == "localhost":
            return True
        try:
            return ipaddress.ip_address(host).is_loopback
        except ValueError:
            return False
    return False


def endpoint_problem(endpoint: str, *, bind: bool) -> str | None:
    """Why ``endpoint`` (a ZeroMQ endpoint from the config) is malformed, with the fix; None when it is well formed.

    Checked: a transport (``tcp://``, ``ipc://``, ...; other transports than tcp are left to ZeroMQ), and for tcp
    a host (to connect, not the bind wildcard ``*``) and a port of digits in 1-65535, or ``0`` / ``*`` (ZeroMQ
    picks a free one) when ``bind``. libzmq refuses most malformed endpoints only when the daemon starts (``Invalid
    argument``) or the CLI connects (a traceback), and reads a port above 65535 modulo 65536
    (``tcp://127.0.0.1:99999`` listens on 34463): all are refused here, so ``profwatch config check`` says what the
    daemon would do. Endpoint syntax: libzmq's zmq_tcp(7) and zmq_ipc(7)."""
    scheme, sep, rest = endpoint.partition("://")
    if not sep or not scheme or not rest:
        return f"{endpoint!r} names no transport: write tcp://HOST:PORT" + (" (or ipc://PATH)" if bind else "")
    if scheme != "tcp":
        return None
    host, colon, port = rest.rpartition(":")
    if not colon or not host:
        return f"{endpoint!r} needs a host and a port: tcp://HOST:PORT (e.g. tcp://127.0.0.1:7711)"
    if bind and port in ("0", "*"):
        return None
    if not bind and host == "*":
        return f"{endpoint!r}: '*' means every interface when binding; to connect, name the host (e.g. 127.0.0.1)"
    if not (port.isascii() and port.isdigit()) or not 1 <= int(port) <= 65535:
        free = " (or 0 or * for a free port the kernel picks)" if bind else ""
        return f"{endpoint!r}: the port {port!r} must be a number from 1 to 65535{free}"
    return None


class SecuritySettings(BaseModel):
    """``[security]``: CURVE keys and the escape hatches.

    Key layout (what ``profwatch keys init|add`` writes, in the format of ``zmq.auth.create_certificates``):
    ``<keys_dir>/server.key`` + ``server.key_secret`` (the coordinator), ``<keys_dir>/clients/<name>.key`` (one
    public certificate per allowed client, with ``role`` metadata), and on each client host
    ``<keys_dir>/client.key_secret`` (its own certificate) plus a copy of ``server.key``.
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    curve: Literal["auto", "on", "off"] = Field(
        "auto", description="auto: CURVE on every TCP socket that binds or connects beyond loopback")
    insecure: bool = Field(False, description="allow sockets beyond loopback without CURVE (warned on every start)")
    keys_dir: Path = Field(DEFAULT_KEYS_DIR, description=(
        "where profwatch keys init/add/list write and read CURVE keys"))
    server_secret_key: Path | None = Field(None, description="coordinator: default <keys_dir>/server.key_secret")
    server_public_key: Path | None = Field(None, description="clients: default <keys_dir>/server.key")
    client_keys_dir: Path | None = Field(None, description="coordinator: default <keys_dir>/clients")
    client_secret_key: Path | None = Field(None, description="node and CLI: default <keys_dir>/client.key_secret")
    loopback_roles: list[ControlRole] = Field(
        default_factory=lambda: list[ControlRole](["read", "act"]),
        description="control roles granted without CURVE (loopback: any process on the coordinator host)")
    selftest_timeout_s: float = Field(5.0, gt=0, le=120, description=(
        "longest the start-up CURVE self-test of each bound socket may take"))

    def curve_for(self, endpoint: str) -> bool:
        """Whether a socket on ``endpoint`` uses CURVE (``ipc://``/``inproc://`` never do)."""
        if not endpoint.startswith("tcp://"):
            return False
        if self.curve == "on":
            return True
        if self.curve == "off":
            return False
        return not is_loopback_endpoint(endpoint)

    def server_secret_path(self) -> Path:
        return self.server_secret_key or self.keys_dir / "server.key_secret"

    def server_public_path(self) -> Path:
        return self.server_public_key or self.keys_dir / "server.key"

    def client_keys_path(self) -> Path:
        return self.client_keys_dir or self.keys_dir / "clients"

    def client_secret_path(self) -> Path:
        return self.client_secret_key or self.keys_dir / "client.key_secret"

    def loopback_grants(self) -> frozenset[ControlRole]:
        return frozenset(self.loopback_roles)


def exposure_problems(endpoints: dict[str, str], security: SecuritySettings) -> list[str]:
    """Sockets that would be reachable beyond loopback without CURVE, each with the fix; empty when none or when
    ``security.insecure`` is set. ``endpoints`` maps a config key (``coordinator.ingest_bind``) to its endpoint."""
    if security.insecure:
        return []
    out = []
    for key, ep in endpoints.items():
        if not is_loopback_endpoint(ep) and not _uses_curve(key, ep, security):
            why = ("ranks cannot use CURVE: keep node.bind on ipc:// or loopback" if key == "node.bind"
                   else 'set security.curve = "auto" (or "on") and create keys with `profwatch keys init`')
            out.append(f"{key}={ep!r} is reachable beyond loopback without CURVE; {why}, "
                       "or set security.insecure = true on a trusted network (warned on every start)")
    return out


def insecure_endpoints(endpoints: dict[str, str], security: SecuritySettings) -> list[str]:
    """Endpoints beyond loopback without CURVE (what ``insecure = true`` lets through; logged at every start)."""
    return [f"{k}={ep}" for k, ep in endpoints.items() if not is_loopback_endpoint(ep) and not _uses_curve(k, ep, security)]


def _uses_curve(key: str, endpoint: str, security: SecuritySettings) -> bool:
    return key not in RANK_ENDPOINT_KEYS and security.curve_for(endpoint)


def parse_peer_address(peer: str | None) -> tuple[int, int, int] | None:
    """``(uid, gid, pid)`` from ZeroMQ's ``Peer-Address`` of an ``ipc://`` connection (``"host:uid:gid:pid"``,
    libzmq appends the ``SO_PEERCRED`` credentials on Linux); None for other transports or formats."""
    if not peer:
        return None
    parts = peer.rsplit(":", 3)
    if len(parts) != 4:
        return None
    try:
        uid, gid, pid = int(parts[1]), int(parts[2]), int(parts[3])
    except ValueError:
        return None
    if not (0 <= uid < 2**32 and 0 <= gid < 2**32 and 0 <= pid < 2**32):
        return None
    return uid, gid, pid
