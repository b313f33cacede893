"""Issue 33 #7 and #8: what is dropped for size is counted, and control refuses what it cannot judge. A live
coordinator (in-process harness, real ZeroMQ sockets): a batch over the ingest socket's 4 MiB MAXMSGSIZE is dropped
by libzmq with its connection, and the socket monitor's disconnect event counts it
(``profwatch_connections_closed_total{socket="ingest"}``); a control request over the cap fails in the client with
a clear error; a control request naming a key twice is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import zmq

from profwatch.adapters.zmq import control
from profwatch.adapters.zmq.control import ControlError, call
from rankhook import wire
from tests.conftest import wait_for
from tests.integration.sink_support import CoordinatorHarness


@pytest.fixture
def harness(short_tmp: Path):
    h = CoordinatorHarness(short_tmp)
    yield h
    h.close()


def _closed(h: CoordinatorHarness) -> float:
    assert h.coord is not None
    return h.coord.metrics.registry.get_sample_value("profwatch_connections_closed_total", {"socket": "ingest"}) or 0.0


def test_an_oversize_batch_is_dropped_and_counted_from_the_disconnect(harness: CoordinatorHarness) -> None:
    h = harness
    h.hellos("jobD", 1)
    wait_for(lambda: h.coord is not None and "jobD" in h.coord.registry.jobs, 30, 0.1, "job registered")
    assert _closed(h) == 0
    ctx = zmq.Context.instance()
    big = ctx.socket(zmq.DEALER)
    big.setsockopt(zmq.LINGER, 0)
    big.connect(h.settings.coordinator.ingest_bind)
    try:
        big.send(b" " * (wire.MAX_BATCH_BYTES + 1))  # over MAXMSGSIZE: libzmq drops it unread
        wait_for(lambda: _closed(h) >= 1, 30, 0.1, "the dropped connection counted")
    finally:
        big.close(0)
    h.steps("jobD", 1, 1, 3)  # the honest node's connection is untouched
    wait_for(lambda: h.coord.registry.jobs["jobD"].furthest_step() >= 3, 30, 0.1, "honest steps")  # type: ignore[union-attr]
    assert _closed(h) == 1


def test_a_control_request_over_the_cap_fails_in_the_client_with_a_clear_error(harness: CoordinatorHarness) -> None:
    with pytest.raises(ControlError) as ei:
        call(harness.control, "status", {"job_id": "x" * (control.MAX_REQUEST_BYTES + 1)}, timeout_s=5)
    assert ei.value.code == "request_too_large" and str(control.MAX_REQUEST_BYTES) in ei.value.message
    assert call(harness.control, "ping", timeout_s=5)["pong"] is True


def test_a_control_request_naming_a_key_twice_is_refused(harness: CoordinatorHarness) -> None:
    ctx = zmq.Context.instance()
    req = ctx.socket(zmq.REQ)
    req.setsockopt(zmq.LINGER, 0)
    req.setsockopt(zmq.RCVTIMEO, 10_000)
    req.connect(harness.control)
    try:
        req.send(b'{"cmd": "status", "args": {"job_id": "a", "job_id": "b"}}')
        reply = json.loads(req.recv())
    finally:
        req.close(0)
    assert reply["ok"] is False and reply["error"]["code"] == "bad_request"
    assert "duplicate key 'job_id'" in reply["error"]["message"]


def test_a_node_daemons_routine_stop_closes_its_connection_quietly(short_tmp: Path) -> None:
    """A node daemon that stops says so in its last heartbeat: the close of its ingest connection is logged at info
    as routine (no oversize wording) and not counted; a connection that closes unannounced is counted and warned
    about, naming the possible causes."""
    import structlog

    from tests.integration.live_stack import Stack, hello

    st = Stack(short_tmp)
    coord = st.start()
    try:
        def closed() -> float:
            return coord.metrics.registry.get_sample_value("profwatch_connections_closed_total",
                                                           {"socket": "ingest"}) or 0.0

        with structlog.testing.capture_logs() as logs:
            st.node("n1")
            wait_for(lambda: "n1" in coord.registry.nodes, 30, 0.1, "the node registered")
            st.stop_node("n1")
            wait_for(lambda: [e for e in logs if e["event"] == "peer_connection_closed"], 30, 0.1,
                     "the node's close seen")
            (quiet,) = [e for e in logs if e["event"] == "peer_connection_closed"]
            assert quiet["log_level"] == "info" and quiet["reason"] == "stopped", quiet
            assert "MAXMSGSIZE" not in quiet["note"] and "bytes" not in quiet["note"]
            assert closed() == 0
            raw = st.dealer()  # a node that goes away without saying so (killed, network lost)
            raw.send(wire.encode(wire.NodeBatch(node_id="n2", hostname="h", seq=1, ts_unix_s=1.0,
                                                messages=[wire.to_dict(hello("jobQ", 0, world=1, root=short_tmp))])))
            wait_for(lambda: "n2" in coord.registry.nodes, 30, 0.1, "the second node seen")
            raw.close(0)
            wait_for(lambda: closed() == 1, 30, 0.1, "the unannounced close counted")
            loud = [e for e in logs if e["event"] == "peer_connection_closed" and e["log_level"] == "warning"]
            assert len(loud) == 1 and loud[0]["reason"] == "unannounced" and "MAXMSGSIZE" in loud[0]["note"]
    finally:
        st.close()
