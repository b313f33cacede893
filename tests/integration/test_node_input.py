"""Bad input at the node socket, with a live node daemon and coordinator: other encodings cost no honest step and
never poison re-registration; lone surrogates never reach the store; strict types; oversize messages counted on
both sides; the socket's mode, group and peer uid; a job pinned to the uid that runs it."""

from __future__ import annotations

import grp
import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import structlog

from profwatch.node import RANK_MAXMSGSIZE, NodeDaemon
from rankhook import wire
from rankhook.publisher import Publisher
from tests.conftest import wait_for
from tests.integration.live_stack import Stack, batch, hello, job_view, rank_view, step


@pytest.fixture
def stack(short_tmp: Path):
    st = Stack(short_tmp)
    st.start()
    yield st
    st.close()


def _encoded(msg: object, how: str) -> bytes:
    text = json.dumps(wire.to_dict(msg))
    return {"utf16": text.encode("utf-16"), "utf16le": text.encode("utf-16-le"), "utf32": text.encode("utf-32"),
            "bom": b"\xef\xbb\xbf" + text.encode()}[how]


def test_other_encodings_cost_no_honest_step_and_never_poison_reregistration(stack: Stack, short_tmp: Path) -> None:
    node = stack.node("n1")
    push = stack.push("n1")
    push.send_multipart(wire.frames(hello("jobU", 0, world=1)))
    hows = ["utf16", "utf16le", "utf32", "bom"]
    poison = 0
    for s in range(1, 201):
        push.send_multipart(wire.frames(step("jobU", 0, s)))
        if s % 10 == 0:  # a local process sends the same kinds of message in other encodings
            how = hows[(s // 10) % 4]
            push.send_multipart([b"t", _encoded(step("jobU", 0, 10_000 + s), how)])
            push.send_multipart([b"t", _encoded(hello("jobU", 0, world=1, hostname=f"evil{s}"), how)])
            poison += 2
    wait_for(lambda: rank_view(stack.control("status"), "jobU").get(0, {}).get("last_step") == 200, 30,
             what="all honest steps")
    jsonl = stack.control("dump_telemetry", {"job_id": "jobU"})
    steps = sorted(json.loads(line)["step"] for line in jsonl.splitlines() if '"step"' in line)
    assert steps == list(range(1, 201))  # 200 of 200 honest steps, none of the poison
    assert node.counters["rejected"] == poison
    coord = stack.coord
    assert coord is not None and coord.counters["rejected"] == 0  # nothing bad was relayed
    # a coordinator restart: the node re-registers from its cache, which holds only validated hellos
    stack.stop_coordinator()
    fresh = stack.start()
    wait_for(lambda: job_view(stack.control("status"), "jobU") is not None and fresh.counters["batches"] > 0, 30,
             what="re-registration")
    push.send_multipart(wire.frames(step("jobU", 0, 201)))
    wait_for(lambda: rank_view(stack.control("status"), "jobU")[0]["last_step"] == 201, 30)
    assert fresh.counters["rejected"] == 0
    assert rank_view(stack.control("status"), "jobU")[0]["hostname"] == "h"


def test_lone_surrogates_never_reach_the_store(stack: Stack, short_tmp: Path) -> None:
    stack.node("n1")
    push = stack.push("n1")
    evil = json.dumps(wire.to_dict(hello("jobS", 0, world=1, hostname="\ud800"))).encode()
    push.send_multipart([b"t", evil])  # through the node
    old_node = stack.dealer()  # and straight into ingest, as an old node daemon relayed it
    old_node.send(batch("old", hello("jobS", 0, world=1, hostname="\udfff"), hello("jobT", 0, world=1)))
    push.send_multipart(wire.frames(hello("jobV", 0, world=1)))
    wait_for(lambda: all(job_view(stack.control("status"), j) for j in ("jobT", "jobV")), 20)
    coord = stack.coord
    assert coord is not None
    wait_for(lambda: coord.metrics.registry.get_sample_value("profwatch_rejected_total",
                                                             {"reason": "bad_encoding"}) == 1, 20)
    stack.stop_coordinator()  # its last registry flush must succeed: every job registered survives the restart
    stack.start()
    status = stack.control("status")
    assert {j["job_id"] for j in status["jobs"]} == {"jobT", "jobV"}


def test_lax_types_and_absurd_values_are_refused_live(stack: Stack) -> None:
    node = stack.node("n1")
    push = stack.push("n1")
    push.send_multipart(wire.frames(hello("jobL", 0, world=2)))
    push.send_multipart(wire.frames(step("jobL", 0, 1)))
    base = wire.to_dict(step("jobL", 0, 2))
    for bad in ({"rank": "1"}, {"rank": True}, {"step_time_s": 1e308}, {"step": 2.0}, {"capturing": "yes"}):
        push.send_multipart([b"t", json.dumps(base | bad).encode()])
    push.send_multipart(wire.frames(step("jobL", 0, 3)))
    wait_for(lambda: rank_view(stack.control("status"), "jobL").get(0, {}).get("last_step") == 3, 20)
    ranks = rank_view(stack.control("status"), "jobL")
    assert set(ranks) == {0} and ranks[0]["step_time_s"] < 1.0
    assert node.counters["rejected"] == 5


def test_hostile_mode_role_and_work_are_refused_live(stack: Stack) -> None:
    node = stack.node("n1")
    push = stack.push("n1")
    push.send_multipart(wire.frames(hello("jobM", 0, world=1, mode="serving", role="pp1")))
    push.send_multipart(wire.frames(step("jobM", 0, 1)))
    h, s = wire.to_dict(hello("jobM", 0, world=1)), wire.to_dict(step("jobM", 0, 2))
    bad_hellos = [{"mode": "x" * 100_000}, {"role": "pp1\n"}, {"role": "\u00e9\u202e"}, {"mode": 7}, {"role": ["a"]},
                  {"job_id": "jobM\n"}]
    bad_steps = [{"work": -1.0}, {"work": 1e16}, {"work": "5"}, {"work": True}, {"mode": "serving\n"}, {"role": ""}]
    for bad in bad_hellos:
        push.send_multipart([b"t", json.dumps(h | bad).encode()])
    for bad in bad_steps:
        push.send_multipart([b"t", json.dumps(s | bad).encode()])
    for token in (b"NaN", b"Infinity"):  # not JSON (RFC 8259), but Python's json writes them
        push.send_multipart([b"t", json.dumps(s).encode()[:-1] + b', "work": ' + token + b"}"])
    push.send_multipart(wire.frames(step("jobM", 0, 3)))
    wait_for(lambda: rank_view(stack.control("status"), "jobM").get(0, {}).get("last_step") == 3, 20)
    assert node.counters["rejected"] == len(bad_hellos) + len(bad_steps) + 2
    assert {j["job_id"] for j in stack.control("status")["jobs"]} == {"jobM"}  # no "jobM\n" twin
    jsonl = stack.control("dump_telemetry", {"job_id": "jobM"})
    rows = [json.loads(line) for line in jsonl.splitlines() if '"step"' in line]
    assert sorted(r["step"] for r in rows) == [1, 3] and {(r.get("mode"), r.get("role")) for r in rows} == {
        ("serving", "pp1")}
    coord = stack.coord
    assert coord is not None and coord.counters["rejected"] == 0  # nothing bad was relayed


def test_oversize_messages_are_counted_on_both_sides(stack: Stack, short_tmp: Path) -> None:
    node = stack.node("n1")
    pub = Publisher(f"ipc://{short_tmp}/n1.sock")
    try:
        big = json.dumps(wire.to_dict(hello("jobO", 0, world=1, hostname="h"))).encode() + b" " * (300 * 1024)
        assert pub.send(b"profwatch.hello.jobO.0", big) is False
        assert (pub.counters.oversize, pub.counters.dropped, pub.counters.sent) == (1, 1, 0)
        assert pub.send(*wire.frames(hello("jobO", 0, world=1)))
        assert pub.counters.sent == 1
    finally:
        pub.close(linger_ms=1000)
    push = stack.push("n1")  # a sender that ignores the limit: the node counts and logs it
    with structlog.testing.capture_logs() as logs:
        push.send_multipart([b"t", big])
        push.send_multipart(wire.frames(hello("jobO", 0, world=1)))
        push.send_multipart(wire.frames(step("jobO", 0, 1)))
        wait_for(lambda: rank_view(stack.control("status"), "jobO").get(0, {}).get("last_step") == 1, 20)
    assert node.counters["oversize"] == 1
    assert node.metrics.registry.get_sample_value("profwatch_rejected_total", {"reason": "oversize"}) == 1
    assert any(e["event"] == "rank_message_oversize" for e in logs)


def test_socket_mode_group_and_peer_uid(stack: Stack, short_tmp: Path) -> None:
    group = grp.getgrgid(os.getgid()).gr_name
    stack.node("n1", socket_group=group)
    st = os.stat(short_tmp / "n1.sock")
    assert stat.S_IMODE(st.st_mode) == 0o660 and st.st_gid == os.getgid()
    push = stack.push("n1")
    push.send_multipart(wire.frames(hello("jobG", 0, world=1)))
    rank = wait_for(lambda: rank_view(stack.control("status"), "jobG").get(0), 20)
    assert rank["uid"] == os.getuid()
    with pytest.raises(ValueError, match="does not exist"):
        stack.node("n2", socket_group="no-such-group-pw")


NOBODY = 65534


def _as_nobody(action) -> int:
    """Run ``action()`` in a forked child with uid/gid 65534; return its exit status (13: permission denied)."""
    pid = os.fork()
    if pid == 0:  # child: never returns into pytest
        code = 1
        try:
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            code = action()
        except PermissionError:
            code = 13
        finally:
            os._exit(code)
    _pid, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def _connect(path: str) -> int:
    import socket

    with socket.socket(socket.AF_UNIX) as s:
        s.connect(path)
    return 0


def _send(path: str, payload: bytes) -> int:
    import zmq

    ctx = zmq.Context()
    p = ctx.socket(zmq.PUSH)
    p.setsockopt(zmq.LINGER, 5000)
    p.connect("ipc://" + path)
    p.send_multipart([b"t", payload])
    p.close()
    ctx.term()
    return 0


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a child process as another uid")
def test_other_users_cannot_connect_and_cannot_speak_for_a_job(stack: Stack, short_tmp: Path) -> None:
    os.chmod(short_tmp, 0o755)
    stack.node("n1")  # default mode 0660: another user cannot even connect
    assert _as_nobody(lambda: _connect(str(short_tmp / "n1.sock"))) == 13
    node = stack.node("n2", socket_mode=0o666)  # a world-writable socket: the job's uid pin still holds
    push = stack.push("n2")
    push.send_multipart(wire.frames(hello("jobP", 0, world=2)))
    wait_for(lambda: job_view(stack.control("status"), "jobP"), 20)
    spoof = json.dumps(wire.to_dict(hello("jobP", 1, world=2, hostname="spoof"))).encode()
    assert _as_nobody(lambda: _send(str(short_tmp / "n2.sock"), spoof)) == 0
    wait_for(lambda: node.metrics.registry.get_sample_value("profwatch_rejected_total",
                                                            {"reason": "job_uid_mismatch"}) == 1, 20)
    # the squatted id is alerted (docs/security.md), with the owning uid
    rows = wait_for(lambda: [r["event"] for r in stack.control("events", {"job_id": "jobP", "alerts_only": True})
                             if r["event"]["type"] == "io.profwatch.job_id_collision.v1"], 20)
    assert len(rows) == 1 and rows[0]["data"]["reason"] == "uid_mismatch"
    assert rows[0]["data"]["owner_uid"] == os.getuid() and rows[0]["data"]["uid"] != os.getuid()
    push.send_multipart(wire.frames(hello("jobP", 1, world=2)))
    ranks = wait_for(lambda: (r := rank_view(stack.control("status"), "jobP")) and 1 in r and r, 20)
    assert ranks[1]["hostname"] == "h" and ranks[1]["uid"] == os.getuid()


def test_a_batch_of_another_protocol_version_is_refused_and_counted_live(stack: Stack) -> None:
    """A node batch whose envelope says another protocol version (or none) is refused whole, counted as
    ``bad_version`` like a message of another version; the next good batch of the same node is taken."""
    coord = stack.coord
    assert coord is not None
    peer = stack.dealer()
    other = json.loads(batch("vnode", hello("jobV2", 0, world=1), seq=1))
    peer.send(json.dumps(other | {"v": 3}).encode())  # versions 1 and 2 are taken (wire.ACCEPTED_VERSIONS)
    peer.send(json.dumps({k: v for k, v in (other | {"seq": 2}).items() if k != "v"}).encode())
    peer.send(batch("vnode", hello("jobV1", 0, world=1), seq=3))
    wait_for(lambda: job_view(stack.control("status"), "jobV1") is not None, 20, what="the good batch")
    assert job_view(stack.control("status"), "jobV2") is None
    assert coord.metrics.registry.get_sample_value("profwatch_rejected_total", {"reason": "bad_version"}) == 2
    assert coord.counters["rejected"] == 2 and coord.counters["batches"] == 1


def _node_sample(node: NodeDaemon, name: str, labels: dict[str, str] | None = None) -> float:
    if name == "profwatch_rank_connections_dropped_total" and labels is None:  # both peer kinds
        return sum(_node_sample(node, name, {"peer": p}) for p in ("running", "unknown"))
    return node.metrics.registry.get_sample_value(name, labels or {}) or 0.0


def test_a_rank_message_over_the_node_cap_is_counted_from_the_disconnect(stack: Stack, short_tmp: Path) -> None:
    """Issue 33 #7 (node side): a message over the rank socket's MAXMSGSIZE (512 KiB) is dropped by libzmq with
    its connection; the node counts it from the socket monitor when the peer process is still running and never
    said bye, and logs it once a minute per peer. A rank process that exits, or says bye and closes, is a close but
    no drop."""
    node = stack.node("n1")
    push = stack.push("n1")
    push.send_multipart(wire.frames(hello("jobZ", 0, world=1)))
    push.send_multipart(wire.frames(step("jobZ", 0, 1)))
    wait_for(lambda: rank_view(stack.control("status"), "jobZ").get(0, {}).get("last_step") == 1, 30, what="step 1")
    dropped = "profwatch_rank_connections_dropped_total"
    assert _node_sample(node, dropped) == 0
    with structlog.testing.capture_logs() as logs:
        push.send_multipart([b"t", b" " * (RANK_MAXMSGSIZE + 1)])  # over MAXMSGSIZE: libzmq drops it unread
        wait_for(lambda: _node_sample(node, dropped) >= 1, 30, 0.05, "the dropped connection counted")
        push.send_multipart([b"t", b" " * (RANK_MAXMSGSIZE + 1)])  # the same peer again, within the minute
        wait_for(lambda: _node_sample(node, dropped) >= 2, 30, 0.05, "the second drop counted")
    assert _node_sample(node, "profwatch_connections_closed_total", {"socket": "rank"}) >= 2
    said = [e for e in logs if e["event"] == "rank_connection_dropped"]
    # the first drop's connection was long open: its process is named, once a minute (the second, right after the
    # PUSH reconnected, may close before the node reads its peer: peer="unknown")
    assert len([e for e in said if e["pid"] == os.getpid()]) == 1 and len(said) <= 2
    assert _node_sample(node, dropped, {"peer": "running"}) >= 1
    push.send_multipart(wire.frames(step("jobZ", 0, 2)))  # the PUSH reconnected by itself; nothing else was lost
    wait_for(lambda: rank_view(stack.control("status"), "jobZ")[0]["last_step"] == 2, 30, what="step 2")
    # a rank process that exits closes its connection: counted as closed, never as dropped
    closed_before = _node_sample(node, "profwatch_connections_closed_total", {"socket": "rank"})
    code = ("import sys, zmq; from rankhook import wire; from tests.integration.live_stack import hello\n"
            "c = zmq.Context(); s = c.socket(zmq.PUSH); s.setsockopt(zmq.LINGER, 5000); s.connect(sys.argv[1])\n"
            "s.send_multipart(wire.frames(hello('jobE', 0, world=1))); s.close(); c.term()\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    subprocess.run([sys.executable, "-c", code, f"ipc://{short_tmp}/n1.sock"], check=True, timeout=60, env=env)
    wait_for(lambda: _node_sample(node, "profwatch_connections_closed_total", {"socket": "rank"}) > closed_before
             and not node._closed and not node._unknown_closed, 30, 0.05, "the exited process's close judged")
    assert _node_sample(node, dropped) == 2
    # a bye followed by more messages from the same process does not excuse a later drop
    push.send_multipart(wire.frames(wire.RankBye(job_id="jobZ", rank=0, step=2, ts_unix_s=time.time())))
    push.send_multipart(wire.frames(step("jobZ", 0, 3)))
    wait_for(lambda: rank_view(stack.control("status"), "jobZ")[0]["last_step"] == 3, 30, what="step 3")
    assert os.getpid() not in node._byes
    push.send_multipart([b"t", b" " * (RANK_MAXMSGSIZE + 1)])
    wait_for(lambda: _node_sample(node, dropped) >= 3, 30, 0.05, "the drop after a bye and a step counted")
    # a process that says bye and closes its socket while it keeps running: a close, never a drop
    bye_push = stack.push("n1")
    bye_push.send_multipart(wire.frames(hello("jobB", 0, world=1)))
    bye_push.send_multipart(wire.frames(wire.RankBye(job_id="jobB", rank=0, step=0, ts_unix_s=time.time())))
    wait_for(lambda: os.getpid() in node._byes, 30, 0.05, "the bye arrived")
    closed_before = _node_sample(node, "profwatch_connections_closed_total", {"socket": "rank"})
    bye_push.close(0)
    wait_for(lambda: _node_sample(node, "profwatch_connections_closed_total", {"socket": "rank"}) > closed_before
             and not node._closed and not node._unknown_closed, 30, 0.05, "the closed connection judged")
    assert _node_sample(node, dropped) == 3


def test_a_short_lived_process_closing_before_its_peer_is_read_is_no_drop(
        stack: Stack, short_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A connection whose peer the node could not read (its fd gone before the accept was looked at: a process
    that connects, sends its hello and ends within one loop turn, as on a loaded box) is explained by the process
    that spoke just before the close and has ended since: a close, not a drop. An oversize message from a process
    that keeps running, on a connection whose peer could not be read either, is still a drop (``peer="unknown"``)."""
    import profwatch.node as node_mod

    monkeypatch.setattr(node_mod, "peer_of_fd", lambda fd: f"fd:{fd}")  # every accept loses the race
    node = stack.node("n1")
    dropped = "profwatch_rank_connections_dropped_total"
    code = ("import sys, zmq; from rankhook import wire; from tests.integration.live_stack import hello\n"
            "c = zmq.Context(); s = c.socket(zmq.PUSH); s.setsockopt(zmq.LINGER, 5000); s.connect(sys.argv[1])\n"
            "s.send_multipart(wire.frames(hello('jobS', 0, world=1))); s.close(); c.term()\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    subprocess.run([sys.executable, "-c", code, f"ipc://{short_tmp}/n1.sock"], check=True, timeout=60, env=env)
    wait_for(lambda: job_view(stack.control("status"), "jobS") is not None, 30, what="the hello relayed")
    wait_for(lambda: _node_sample(node, "profwatch_connections_closed_total", {"socket": "rank"}) >= 1
             and not node._unknown_closed, 30, 0.05, "the unknown close judged")
    assert _node_sample(node, dropped) == 0
    push = stack.push("n1")
    push.send_multipart(wire.frames(hello("jobT", 0, world=1)))
    wait_for(lambda: job_view(stack.control("status"), "jobT") is not None, 30, what="the running process's hello")
    push.send_multipart([b"t", b" " * (RANK_MAXMSGSIZE + 1)])
    wait_for(lambda: _node_sample(node, dropped, {"peer": "unknown"}) >= 1, 30, 0.05, "the drop counted")
    assert _node_sample(node, dropped, {"peer": "running"}) == 0
