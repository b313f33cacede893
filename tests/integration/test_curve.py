"""CURVE end to end with live daemons and real keys: a node and the CLI with keys work; without a key, with an
unknown key or with the wrong server key they are refused and the refusal is visible (CLI message and exit code,
logs, metrics); half-configured daemons refuse to start; the self-test catches an authenticator that lets anyone
in; control roles; the event stream needs a key too."""

from __future__ import annotations

from pathlib import Path

import pytest
import structlog
import zmq
from click.testing import CliRunner

from profwatch.adapters.zmq.control import ControlAuthFailed, ControlError
from profwatch.adapters.zmq.curve import CurveAuthenticator, HandshakeMonitor
from profwatch.adapters.zmq.keyfiles import CurveSetupError, create_certificate
from profwatch.adapters.zmq.publish import subscribe
from profwatch.cli import cli
from profwatch.config import load_settings
from profwatch.coordinator import Coordinator
from profwatch.exitcodes import EXIT_UNAVAILABLE, EXIT_USAGE
from profwatch.node import NodeDaemon
from rankhook import wire
from tests.conftest import wait_for
from tests.integration.live_stack import Keys, Stack, free_port, hello, job_view, rank_view, step


@pytest.fixture
def keys(short_tmp: Path) -> Keys:
    return Keys(short_tmp)


@pytest.fixture
def stacks():
    made: list[Stack] = []
    yield made
    for s in made:
        s.close()


def _metric(registry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


def _cli_config(root: Path, st: Stack, name: str, security: str) -> Path:
    cs = st.settings.coordinator
    p = root / f"{name}.toml"
    p.write_text(f'[coordinator]\ncontrol_bind = "{cs.control_bind}"\npub_bind = "{cs.pub_bind}"\n'
                 f'[security]\n{security}\n[logging]\nformat = "console"\n')
    return p


def test_node_and_cli_with_keys_work_and_without_are_refused_visibly(short_tmp: Path, keys: Keys, stacks) -> None:
    node_key, reader = keys.issue("nodeA", "node"), keys.issue("alice", "read")
    rogue_cli, rogue_node = keys.issue("mallory", "act", allowed=False), keys.issue("nodeB", "node", allowed=False)
    st = Stack(short_tmp, security=keys.security())
    stacks.append(st)
    coord = st.start()
    st.node("nodeA", security=keys.security(node_key))
    push = st.push("nodeA")
    for r in range(2):
        push.send_multipart(wire.frames(hello("jobC", r)))
    for s in range(1, 6):
        for r in range(2):
            push.send_multipart(wire.frames(step("jobC", r, s)))
    alice = keys.client(reader)
    wait_for(lambda: {r: v["last_step"] for r, v in rank_view(st.control("status", curve=alice), "jobC").items()}
             == {0: 5, 1: 5}, 30, what="steps through a CURVE node")
    runner = CliRunner()
    ok = runner.invoke(cli, ["status", "--job", "jobC", "--config", str(_cli_config(
        short_tmp, st, "alice", f'curve = "on"\nkeys_dir = "{keys.dir}"\nclient_secret_key = "{reader}"'))])
    assert ok.exit_code == 0 and "job jobC" in ok.output, ok.output
    # a CLI without a key, with an unknown key, and with the wrong server key: "authentication failed", exit 3
    other = Keys(short_tmp / "other")
    cases = {"nokey": 'curve = "off"',
             "rogue": f'curve = "on"\nkeys_dir = "{keys.dir}"\nclient_secret_key = "{rogue_cli}"',
             "wrongserver": f'curve = "on"\nkeys_dir = "{keys.dir}"\nclient_secret_key = "{reader}"\n'
                            f'server_public_key = "{other.server_public}"'}
    for name, sec in cases.items():
        res = runner.invoke(cli, ["status", "--config", str(_cli_config(short_tmp, st, name, sec))])
        assert res.exit_code == EXIT_UNAVAILABLE and "authentication failed" in res.output, (name, res.output)
        assert "no reply" not in res.output
    m = coord.metrics.registry
    # the coordinator saw and counted them too (a key it does not know, and two handshakes that broke off)
    wait_for(lambda: _metric(m, "profwatch_auth_refused_total", socket="control", reason="unknown_key") >= 1, 20)
    wait_for(lambda: sum(_metric(m, "profwatch_auth_refused_total", socket="control", reason=r)
                         for r in ("mechanism_mismatch", "no_detail", "protocol")) >= 2, 20, what="failed handshakes")
    # a node with a key the coordinator does not know: refused, visible on both sides, its ranks never arrive
    with structlog.testing.capture_logs() as logs:
        nb = st.node("nodeB", security=keys.security(rogue_node))
        pb = st.push("nodeB")
        pb.send_multipart(wire.frames(hello("jobD", 0, world=1)))
        wait_for(lambda: _metric(nb.metrics.registry, "profwatch_auth_refused_total", socket="coordinator",
                                 reason="refused") >= 1, 20, what="the node sees its refusal")
        wait_for(lambda: _metric(m, "profwatch_auth_refused_total", socket="ingest", reason="unknown_key") >= 1, 20)
    assert any(e["event"] == "coordinator_auth_failed" for e in logs)
    assert any(e["event"] == "auth_refused" and e["socket"] == "ingest" and e["peer"] for e in logs)
    status = st.control("status", curve=alice)
    assert job_view(status, "jobD") is None and {n["node_id"] for n in status["nodes"]} == {"nodeA"}


def test_half_configured_daemons_refuse_to_start(short_tmp: Path, keys: Keys) -> None:
    no_keys = {"curve": "on", "keys_dir": str(short_tmp / "missing")}
    st = Stack(short_tmp, security=no_keys)
    with pytest.raises(CurveSetupError, match="profwatch keys init"):
        Coordinator(st.settings)
    cfg = short_tmp / "c.toml"
    cfg.write_text(f'[coordinator]\ningest_bind = "tcp://0.0.0.0:{free_port()}"\nstate_db = "{short_tmp}/s.db"\n'
                   f'work_dir = "{short_tmp}/w"\n[security]\nkeys_dir = "{short_tmp}/missing"\n')
    res = CliRunner().invoke(cli, ["coordinator", "--config", str(cfg)])
    assert res.exit_code == EXIT_USAGE and "cannot start" in res.output and "keys init" in res.output, res.output
    cfg.write_text(cfg.read_text() + 'curve = "off"\n')
    res = CliRunner().invoke(cli, ["coordinator", "--config", str(cfg)])
    assert res.exit_code == EXIT_USAGE and "without CURVE" in res.output and "insecure" in res.output
    node_key = keys.issue("node7", "node")
    for sec, needle in (({"curve": "on", "keys_dir": str(keys.dir)}, "client secret key"),
                        (keys.security(node_key), "node_id")):
        s = load_settings(None, node={"node_id": "other", "bind": f"ipc://{short_tmp}/n.sock"}, security=sec)
        with pytest.raises(CurveSetupError, match=needle):
            NodeDaemon(s.node, security=s.security)


def test_insecure_escape_hatch_warns_on_every_start(short_tmp: Path) -> None:
    st = Stack(short_tmp, security={"curve": "off", "insecure": True},
               ingest_bind=f"tcp://0.0.0.0:{free_port()}")
    for _ in range(2):
        with structlog.testing.capture_logs() as logs:
            coord = Coordinator(st.settings)
            coord.close()
        warn = [e for e in logs if e["event"] == "insecure_sockets"]
        assert warn and warn[0]["log_level"] == "warning" and "ingest" in warn[0]["endpoints"][0]


def test_self_test_refuses_an_authenticator_that_admits_anyone(short_tmp: Path, keys: Keys,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(CurveAuthenticator, "callback", lambda self, domain, key: True)
    st = Stack(short_tmp, security=keys.security(selftest_timeout_s=10.0))
    with pytest.raises(CurveSetupError, match="self-test failed.*unknown key was admitted"):
        Coordinator(st.settings)


def test_control_roles_under_curve(short_tmp: Path, keys: Keys, stacks) -> None:
    reader, actor, node = keys.issue("alice", "read"), keys.issue("bob", "act"), keys.issue("node1", "node")
    st = Stack(short_tmp, security=keys.security())
    stacks.append(st)
    st.start()
    alice, bob = keys.client(reader), keys.client(actor)
    assert st.control("ping", curve=alice)["pong"]
    for cmd, args in (("arm", {"job_id": "j"}), ("set_thresholds", {"arming": {"mode": "off"}}), ("cancel", {})):
        with pytest.raises(ControlError) as ei:
            st.control(cmd, args, curve=alice)
        assert ei.value.code == "denied", (cmd, ei.value)
    assert st.settings.arming.mode == "act"  # the read key switched nothing off
    with pytest.raises(ControlError) as ei:
        st.control("arm", {"job_id": "nope"}, curve=bob)
    assert ei.value.code == "not_found"  # past the role check
    assert st.control("set_thresholds", {"arming": {"mode": "observe"}}, curve=bob)["arming"]["mode"] == "observe"
    for cmd in ("close", "_flush_registry", "stop"):
        with pytest.raises(ControlError) as ei:
            st.control(cmd, curve=bob)
        assert ei.value.code == "unknown_command"
    with pytest.raises(ControlAuthFailed):  # a node key has no control role: refused at the handshake
        st.control("status", curve=keys.client(node))


def test_loopback_without_curve_grants_the_configured_roles(short_tmp: Path, stacks) -> None:
    st = Stack(short_tmp, security={"loopback_roles": ["read"]})
    stacks.append(st)
    st.start()
    assert "jobs" in st.control("status")
    with pytest.raises(ControlError) as ei:
        st.control("set_thresholds", {"arming": {"mode": "off"}})
    assert ei.value.code == "denied" and st.settings.arming.mode == "act"


def test_event_stream_needs_a_read_key(short_tmp: Path, keys: Keys, stacks) -> None:
    reader, node_key = keys.issue("alice", "read"), keys.issue("nodeA", "node")
    st = Stack(short_tmp, security=keys.security())
    stacks.append(st)
    st.start()
    pub_ep = st.settings.coordinator.pub_bind
    sub = subscribe(st.ctx, pub_ep, ["profwatch.alert."], curve=keys.client(reader))
    bad = st.ctx.socket(zmq.SUB)
    bad.linger = 0
    from profwatch.adapters.zmq.curve import make_client

    make_client(bad, *keys.client(node_key))
    mon = HandshakeMonitor(bad)
    bad.connect(pub_ep)
    try:
        wait_for(lambda: any(f for _e, _v, f in mon.poll()), 20, what="node key refused on the event stream")
        st.node("nodeA", security=keys.security(node_key))
        push = st.push("nodeA")
        push.send_multipart(wire.frames(hello("jobE", 0, root=short_tmp)))
        wait_for(lambda: job_view(st.control("status", curve=keys.client(reader)), "jobE"), 20)
        # a second hello that tries to move the job's paths: refused, and alerted on the stream
        push.send_multipart(wire.frames(hello("jobE", 1, root=short_tmp, prof_root="/tmp/elsewhere")))
        assert sub.poll(20_000), "no alert on the CURVE stream"
        topic, body = sub.recv_multipart()
        assert topic == b"profwatch.alert.jobE" and b"paths_changed" in body
    finally:
        mon.close()
        bad.close(0)
        sub.close(0)


def test_revocation_cuts_open_connections_for_every_role(short_tmp: Path, keys: Keys, stacks) -> None:
    """Issue 24 item 13: keys removed from clients/ (node, read) or edited in place (act) stop working on the
    connections already open: a revoked node's heartbeats and hellos are refused, a revoked reader's open control
    connection is denied and its event subscription is cut (the stream is re-bound), while an admitted
    subscriber gets events again without doing anything."""
    node_key, reader, actor, other = (keys.issue("nodeA", "node"), keys.issue("alice", "read"),
                                      keys.issue("bob", "act"), keys.issue("carol", "read"))
    node_b = keys.issue("nodeB", "node")
    st = Stack(short_tmp, security=keys.security())
    stacks.append(st)
    coord = st.start()
    m = coord.metrics.registry
    st.node("nodeA", security=keys.security(node_key))
    push = st.push("nodeA")
    push.send_multipart(wire.frames(hello("jobR", 0, world=1, root=short_tmp)))
    carol = keys.client(other)
    wait_for(lambda: job_view(st.control("status", curve=carol), "jobR") is not None, 30, what="job over CURVE")
    # open connections: alice's and bob's control REQ sockets, alice's and carol's subscriptions
    from profwatch.adapters.zmq.curve import make_client

    def req(secret: Path) -> zmq.Socket:
        s = st.ctx.socket(zmq.REQ)
        s.linger = 0
        make_client(s, *keys.client(secret))
        s.connect(st.settings.coordinator.control_bind)
        st._socks.append(s)
        return s

    def ask(s: zmq.Socket, cmd: str) -> dict:
        s.send_json({"cmd": cmd, "args": {}})
        assert s.poll(20_000), f"no reply to {cmd}"
        return s.recv_json()

    alice_req, bob_req = req(reader), req(actor)
    assert ask(alice_req, "ping")["ok"] and ask(bob_req, "ping")["ok"]
    subs = {name: subscribe(st.ctx, st.settings.coordinator.pub_bind, ["profwatch."], curve=keys.client(sec))
            for name, sec in (("alice", reader), ("carol", other))}
    mons = {name: HandshakeMonitor(s) for name, s in subs.items()}
    tags = iter(range(10_000))

    def hears(name: str, push_: zmq.Socket, job: str) -> bool:
        """A new paths_changed alert for ``job`` (a hello claiming other paths) reaches subscriber ``name``."""
        push_.send_multipart(wire.frames(hello(job, 0, world=1, root=short_tmp, prof_root=f"/tmp/p{next(tags)}")))
        got = False
        while subs[name].poll(300):
            got |= subs[name].recv_multipart()[0] == f"profwatch.alert.{job}".encode()
        return got

    try:
        wait_for(lambda: hears("alice", push, "jobR") and hears("carol", push, "jobR"), 30,
                 what="both subscribers receive alerts")
        # revoke: remove the node's and alice's public keys, edit bob's in place (another key, same name)
        (keys.clients / "nodeA.key").unlink()
        (keys.clients / "alice.key").unlink()
        new_pub, _new_sec = create_certificate(short_tmp / "rekey", "bob", "act")
        with open(keys.clients / "bob.key", "r+b") as f:  # in place: same inode, the directory's mtime unchanged
            body = new_pub.read_bytes()
            f.write(body)
            f.truncate(len(body))
        refused = lambda: _metric(m, "profwatch_auth_refused_total", socket="ingest", reason="revoked")  # noqa: E731
        wait_for(lambda: refused() >= 1, 20, what="the revoked node's heartbeats refused")
        wait_for(lambda: not ask(alice_req, "ping")["ok"], 20, what="alice's open control connection denied")
        assert ask(alice_req, "status")["error"]["code"] == "denied"
        assert ask(bob_req, "ping")["error"]["code"] == "denied"  # edited in place: the old key is gone
        # the stream was re-bound: alice's subscription dropped and refused at its reconnect
        wait_for(lambda: _metric(m, "profwatch_auth_refused_total", socket="pub", reason="revoked") >= 1, 20,
                 what="the event stream re-bound")
        wait_for(lambda: any(f for _e, _v, f in mons["alice"].poll()), 20, what="alice refused at reconnect")
        # the revoked node registers nothing new
        before = refused()
        push.send_multipart(wire.frames(hello("jobT", 0, world=1, root=short_tmp)))
        wait_for(lambda: refused() > before, 20, what="the revoked node's hello refused")
        assert job_view(st.control("status", curve=carol), "jobT") is None
        # an admitted subscriber gets events again by itself (carol, through a node with a valid key); alice not
        st.node("nodeB", security=keys.security(node_b))
        push_b = st.push("nodeB")
        wait_for(lambda: hears("carol", push_b, "jobS"), 30, what="carol receives events after the re-bind")
        assert not hears("alice", push_b, "jobS"), "the revoked subscriber still receives the stream"
        assert not hears("alice", push_b, "jobS")
    finally:
        for mon in mons.values():
            mon.close()
        for s in subs.values():
            s.close(0)
