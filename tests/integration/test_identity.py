"""Node identity is proven, not declared (live coordinator, live node daemons, CURVE keys): key B claiming node A
is refused and node A keeps its job and its commands; a node speaks only for the ranks that run on it; a second
connection with node A's own key replaces the first, whose daemon is told to reconnect and carries on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import structlog
import zmq

from rankhook import wire
from tests.conftest import wait_for
from tests.integration.live_stack import Keys, Stack, batch, hello, job_view, rank_view, step


@pytest.fixture
def secured(short_tmp: Path):
    keys = Keys(short_tmp)
    secrets = {n: keys.issue(n, "node") for n in ("nodeA", "nodeB")}
    reader = keys.client(keys.issue("ops", "act"))
    st = Stack(short_tmp, security=keys.security(), config_writer="node", allowed_config_roots=[])
    st.start()
    node_a = st.node("nodeA", security=keys.security(secrets["nodeA"]))
    push = st.push("nodeA")
    (short_tmp / "cfg" / "jobA").mkdir(parents=True)
    for r in range(2):
        push.send_multipart(wire.frames(hello("jobA", r, root=short_tmp)))
    yield st, keys, secrets, reader, node_a, push
    st.close()


def _steps(st: Stack, reader, job: str = "jobA") -> dict[int, int]:
    return {r: v["last_step"] for r, v in rank_view(st.control("status", curve=reader), job).items()}


def _written_start(root: Path) -> int | None:
    try:
        return json.loads((root / "cfg" / "jobA" / "profiler_config.json").read_text()).get("start_step")
    except (OSError, ValueError):
        return None


def _feed(push: zmq.Socket, first: int, last: int) -> None:
    for s in range(first, last + 1):
        for r in range(2):
            push.send_multipart(wire.frames(step("jobA", r, s)))


def test_key_b_claiming_node_a_is_refused_and_node_a_keeps_its_job(secured, short_tmp: Path) -> None:
    st, keys, secrets, reader, _node_a, push = secured
    _feed(push, 1, 5)
    wait_for(lambda: _steps(st, reader) == {0: 5, 1: 5}, 30, what="node A's ranks")
    impostor = st.dealer(keys.client(secrets["nodeB"]))  # a valid key, but node B's
    with structlog.testing.capture_logs() as logs:
        impostor.send(wire.encode(wire.NodeHeartbeat(node_id="nodeA", hostname="x", pid=1, ts_unix_s=1.0,
                                                     started_unix_s=1.0)))
        impostor.send(batch("nodeA", step("jobA", 0, 999, t=500.0),
                            hello("jobA", 1, root=short_tmp, prof_root=str(short_tmp / "evil"))))
        coord = st.coord
        assert coord is not None
        wait_for(lambda: coord.metrics.registry.get_sample_value(
            "profwatch_rejected_total", {"reason": "node_id_mismatch"}) == 2, 20, what="both refused")
    assert any(e["event"] == "peer_refused" and e["peer"] == "key:nodeB" for e in logs)
    _feed(push, 6, 10)
    wait_for(lambda: _steps(st, reader) == {0: 10, 1: 10}, 30, what="node A still reporting")
    job = job_view(st.control("status", curve=reader), "jobA")
    assert job is not None and job["prof_root"] == str(short_tmp / "prof")
    assert max(r["step_time_s"] for r in job["ranks"]) < 1.0  # the impostor's step never landed
    # commands for node A still reach node A, not the impostor
    res = st.control("arm", {"job_id": "jobA", "in_steps": 50}, curve=reader)
    assert res["nodes"] == ["nodeA"]
    wait_for(lambda: _written_start(short_tmp) == res["start_step"], 20, what="node A wrote it")
    assert not impostor.poll(500), "the impostor received a command"


def test_a_node_speaks_only_for_its_own_ranks(secured, short_tmp: Path) -> None:
    st, keys, secrets, reader, _node_a, push = secured
    _feed(push, 1, 3)
    wait_for(lambda: _steps(st, reader) == {0: 3, 1: 3}, 30)
    node_b = st.dealer(keys.client(secrets["nodeB"]))  # node B, honest about its id, lying about the ranks
    node_b.send(batch("nodeB", step("jobA", 0, 500, t=300.0),
                      wire.RankBye(job_id="jobA", rank=1, step=3, ts_unix_s=1.0),
                      hello("jobA", 0, root=short_tmp),
                      wire.CaptureEvent(job_id="jobA", rank=0, event="completed", ts_unix_s=1.0, capture_id="c")))
    coord = st.coord
    assert coord is not None
    wait_for(lambda: coord.metrics.registry.get_sample_value(
        "profwatch_rejected_total", {"reason": "rank_on_other_node"}) == 4, 20, what="all four refused")
    ranks = rank_view(st.control("status", curve=reader), "jobA")
    assert {r: (v["node_id"], v["last_step"], v["left"]) for r, v in ranks.items()} == {
        0: ("nodeA", 3, False), 1: ("nodeA", 3, False)}


def test_second_connection_with_the_same_key_replaces_the_first_which_reconnects(secured, short_tmp: Path) -> None:
    st, keys, secrets, reader, node_a, push = secured
    _feed(push, 1, 3)
    wait_for(lambda: _steps(st, reader) == {0: 3, 1: 3}, 30)
    twin = st.dealer(keys.client(secrets["nodeA"]))  # node A's own key on a second connection
    with structlog.testing.capture_logs() as logs:
        twin.send(wire.encode(wire.NodeHeartbeat(node_id="nodeA", hostname="h", pid=2, ts_unix_s=1.0,
                                                 started_unix_s=1.0)))
        wait_for(lambda: any(e["event"] == "coordinator_reconnected" for e in logs), 30,
                 what="the replaced daemon reconnected")
    assert any(e["event"] == "node_connection_replaced" for e in logs)
    assert any(e["event"] == "coordinator_asked_reconnect" for e in logs)
    # the real daemon carries on: its steps arrive and commands reach it again once it has spoken
    _feed(push, 4, 8)
    wait_for(lambda: _steps(st, reader) == {0: 8, 1: 8}, 30, what="steps after the reconnect")
    res = st.control("arm", {"job_id": "jobA", "in_steps": 50}, curve=reader)
    wait_for(lambda: _written_start(short_tmp) == res["start_step"], 20, what="config written by node A")
    assert node_a.counters["received"] >= 16
