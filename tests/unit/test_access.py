"""Access rules (pure): the one command table, roles per socket, loopback detection, exposure refusals, peer
credentials, and which endpoints use CURVE."""

from __future__ import annotations

import pytest

from profwatch.core.access import (
    COMMAND_ROLES,
    ROLE_GRANTS,
    AccessDenied,
    SecuritySettings,
    authorize,
    exposure_problems,
    is_loopback_endpoint,
    parse_peer_address,
)


def test_every_existing_control_command_is_classified() -> None:
    from profwatch.coordinator_control import ControlCommands

    handlers = {n[len("_cmd_"):] for n in dir(ControlCommands) if n.startswith("_cmd_")}
    assert handlers <= set(COMMAND_ROLES), handlers - set(COMMAND_ROLES)
    assert {c for c, r in COMMAND_ROLES.items() if r == "act"} == {"arm", "set_thresholds", "cancel"}


@pytest.mark.parametrize("cmd", sorted(COMMAND_ROLES))
def test_roles(cmd: str) -> None:
    need = COMMAND_ROLES[cmd]
    assert authorize(cmd, ROLE_GRANTS["act"]) == need
    if need == "read":
        assert authorize(cmd, ROLE_GRANTS["read"]) == "read"
    else:
        with pytest.raises(AccessDenied) as ei:
            authorize(cmd, ROLE_GRANTS["read"])
        assert ei.value.code == "denied" and "act" in ei.value.message
    with pytest.raises(AccessDenied):
        authorize(cmd, ROLE_GRANTS["node"])


@pytest.mark.parametrize("cmd", ["close", "__init__", "_flush_registry", "", "ARM", "status "])
def test_unknown_commands_are_denied_whatever_the_role(cmd: str) -> None:
    with pytest.raises(AccessDenied) as ei:
        authorize(cmd, ROLE_GRANTS["act"])
    assert ei.value.code == "unknown_command"


@pytest.mark.parametrize(("ep", "local"), [
    ("tcp://127.0.0.1:7711", True), ("tcp://127.9.9.9:1", True), ("tcp://[::1]:7711", True),
    ("tcp://localhost:7711", True), ("ipc:///run/profwatch/node.sock", True), ("inproc://x", True),
    ("tcp://0.0.0.0:7711", False), ("tcp://*:7711", False), ("tcp://[::]:7711", False), ("tcp://10.0.0.5:7711", False),
    ("tcp://coord-host:7711", False), ("tcp://eth0:7711", False), ("tcp://127.0.0.1;10.0.0.5:7711", False),
])
def test_loopback_detection(ep: str, local: bool) -> None:
    assert is_loopback_endpoint(ep) is local


def test_curve_follows_the_endpoint_unless_forced() -> None:
    auto = SecuritySettings()
    assert not auto.curve_for("tcp://127.0.0.1:1") and auto.curve_for("tcp://0.0.0.0:1")
    assert not auto.curve_for("ipc:///x")  # ipc never: file permissions guard it
    assert SecuritySettings(curve="on").curve_for("tcp://127.0.0.1:1")
    assert not SecuritySettings(curve="off").curve_for("tcp://0.0.0.0:1")


def test_exposure_is_refused_with_the_fix_unless_insecure() -> None:
    eps = {"coordinator.ingest_bind": "tcp://0.0.0.0:7711", "coordinator.control_bind": "tcp://127.0.0.1:7712",
           "node.bind": "tcp://0.0.0.0:7700"}
    assert [p.split("=")[0] for p in exposure_problems(eps, SecuritySettings())] == ["node.bind"]
    off = exposure_problems(eps, SecuritySettings(curve="off"))
    assert len(off) == 2 and "profwatch keys init" in off[0] and "insecure" in off[0]
    assert exposure_problems(eps, SecuritySettings(curve="off", insecure=True)) == []


@pytest.mark.parametrize(("peer", "creds"), [
    ("localhost:1000:1001:4242", (1000, 1001, 4242)), ("host:0:0:1", (0, 0, 1)),
    ("127.0.0.1", None), (None, None), ("", None), ("a:b:c:d", None), ("h:-1:0:1", None), ("h:99999999999:0:1", None),
])
def test_peer_credentials(peer: str | None, creds: tuple[int, int, int] | None) -> None:
    assert parse_peer_address(peer) == creds


@pytest.mark.parametrize(("endpoint", "bind", "needle"), [
    ("127.0.0.1:7711", False, "names no transport: write tcp://HOST:PORT"),
    ("127.0.0.1:7711", True, "(or ipc://PATH)"),
    ("tcp://127.0.0.1", True, "needs a host and a port"),
    ("tcp://:7711", False, "needs a host and a port"),
    ("tcp://127.0.0.1:99999", True, "the port '99999' must be a number from 1 to 65535 (or 0 or *"),
    ("tcp://127.0.0.1:abc", False, "the port 'abc' must be a number from 1 to 65535"),
    ("tcp://127.0.0.1: 7711", False, "the port ' 7711'"),
    ("tcp://127.0.0.1:*", False, "the port '*' must be"),
    ("tcp://127.0.0.1:0", False, "the port '0' must be"),
    ("tcp://*:7712", False, "'*' means every interface when binding"),
])
def test_a_malformed_endpoint_is_named_with_the_fix(endpoint: str, bind: bool, needle: str) -> None:
    """libzmq refuses these only at bind/connect time, or (a port above 65535) uses another port than named."""
    from profwatch.core.access import endpoint_problem

    problem = endpoint_problem(endpoint, bind=bind)
    assert problem is not None and needle in problem and repr(endpoint) in problem, problem


@pytest.mark.parametrize(("endpoint", "bind"), [
    ("tcp://127.0.0.1:7711", False), ("tcp://127.0.0.1:65535", True), ("tcp://*:7711", True), ("tcp://*:*", True),
    ("tcp://127.0.0.1:0", True), ("tcp://[::1]:7711", False), ("tcp://0.0.0.0:7712", False),
    ("tcp://eth0:7711", True), ("ipc:///run/profwatch/node.sock", True), ("ipc://*", True),
    ("inproc://x", False),
])
def test_every_endpoint_zeromq_takes_is_well_formed(endpoint: str, bind: bool) -> None:
    from profwatch.core.access import endpoint_problem

    assert endpoint_problem(endpoint, bind=bind) is None
