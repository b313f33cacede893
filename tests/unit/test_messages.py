"""Wire validation: every rejection reason, the batch fast path, and a bad message isolated inside a batch."""

from __future__ import annotations

import json

import pytest

from daemon.core.messages import MessageRejected, parse_node_command, parse_node_message, parse_rank_message
from rankhook import wire


def _step(**kw):
    d = wire.to_dict(wire.StepReport(job_id="j1", rank=1, step=7, step_time_s=0.25, ts_unix_s=1.0))
    d.update(kw)
    return d


def _hello(**kw):
    d = wire.to_dict(wire.RankHello(job_id="j1", rank=1, local_rank=1, world_size=4, hostname="h", pid=10,
                                    backend="torch", ts_unix_s=1.0))
    d.update(kw)
    return d


def test_round_trip_every_rank_kind() -> None:
    msgs = [wire.RankHello(job_id="j1", rank=0, local_rank=0, world_size=2, hostname="h", pid=1, backend="none",
                           ts_unix_s=2.0, versions={"torch": "2.13"}),
            wire.StepReport(job_id="j1", rank=0, step=3, step_time_s=0.1, ts_unix_s=2.0, stages={"forward": 0.05},
                            flags=("checkpoint",)),
            wire.CaptureEvent(job_id="j1", rank=0, event="completed", ts_unix_s=3.0, capture_id="c1", steps=(5, 6)),
            wire.RankBye(job_id="j1", rank=0, step=9, ts_unix_s=4.0)]
    for m in msgs:
        assert parse_rank_message(wire.encode(m)) == m


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"not json", "bad_json"),
        (json.dumps([1]).encode(), "bad_schema"),
        (json.dumps({"kind": "teleport", "v": 1}).encode(), "unknown_kind"),
        (json.dumps(_step(v=2)).encode(), "bad_version"),
        (json.dumps(_step(job_id="../etc")).encode(), "bad_job_id"),
        (json.dumps(_step(rank=-1)).encode(), "bad_rank"),
        (json.dumps(_step(step_time_s=-0.1)).encode(), "bad_value"),
        (b'{"job_id":"j1","rank":1,"step":7,"step_time_s":Infinity,"ts_unix_s":1,"kind":"step","v":1}', "bad_value"),
        (json.dumps(_step(stages={"x" * 100: 1.0})).encode(), "bad_value"),
        (json.dumps(_step(step="seven")).encode(), "bad_schema"),
        (json.dumps(_hello(rank=4)).encode(), "bad_rank"),
        (json.dumps(_hello(world_size=0, rank=0)).encode(), "bad_rank"),
        (json.dumps(_hello(backend="cuda-magic")).encode(), "bad_schema"),
    ],
)
def test_rejections_have_stable_reasons(raw: bytes, reason: str) -> None:
    with pytest.raises(MessageRejected) as ei:
        parse_rank_message(raw)
    assert ei.value.reason == reason


def test_batch_keeps_good_messages_and_isolates_bad_ones() -> None:
    batch = {"kind": "node_batch", "v": 1, "node_id": "n1", "hostname": "h", "seq": 3, "ts_unix_s": 1.0,
             "messages": [_step(), {"kind": "step"}, _step(rank=2, step_time_s=float("nan")), _hello()]}
    env, good, bad = parse_node_message(json.dumps(batch).encode())
    assert env.node_id == "n1" and env.seq == 3
    assert [m.kind for m in good] == ["step", "hello"]
    assert sorted(b.reason for b in bad) == ["bad_schema", "bad_value"]


def test_batch_fast_path_types_every_message() -> None:
    batch = wire.NodeBatch(node_id="n1", hostname="h", seq=1, ts_unix_s=1.0, messages=[_step(rank=r) for r in range(50)])
    env, good, bad = parse_node_message(wire.encode(batch))
    assert not bad and len(good) == 50 and all(isinstance(m, wire.StepReport) for m in good)


@pytest.mark.parametrize("raw", [b"{}", b"[]", b"garbage", json.dumps({"kind": "node_batch", "v": 9}).encode(),
                                 json.dumps({"kind": "node_heartbeat", "v": 1}).encode()])
def test_bad_envelopes_raise(raw: bytes) -> None:
    with pytest.raises(MessageRejected):
        parse_node_message(raw)


def test_node_command_validation() -> None:
    cmd = wire.NodeCommand(cmd="register", command_id="r1")
    assert parse_node_command(wire.encode(cmd)) == cmd
    with pytest.raises(MessageRejected):
        parse_node_command(b'{"kind":"node_command","v":1,"cmd":"rm -rf","command_id":"x"}')


def test_topics() -> None:
    assert wire.topic_for("step", "j1", 3) == "profwatch.step.j1.3"
    assert wire.frames(wire.RankBye(job_id="j1", rank=2, step=1, ts_unix_s=1.0))[0] == b"profwatch.bye.j1.2"


def test_deeply_nested_json_is_rejected_not_fatal() -> None:
    with pytest.raises(MessageRejected) as ei:
        parse_rank_message(b"[" * 200_000)
    assert ei.value.reason in ("bad_json", "bad_schema")
    with pytest.raises(MessageRejected):
        parse_node_message(b"[" * 200_000)


@pytest.mark.parametrize("hello_kw", [{"pid": 2**70}, {"world_size": 2**30, "rank": 0}, {"local_rank": 2**40},
                                      {"counters": {"dropped": 2**70}}])
def test_absurd_integers_are_refused(hello_kw: dict) -> None:
    with pytest.raises(MessageRejected):
        parse_rank_message(json.dumps(_hello(**hello_kw)).encode())


def test_heartbeat_values_are_bounded() -> None:
    hb = wire.to_dict(wire.NodeHeartbeat(node_id="n", hostname="h", pid=1, ts_unix_s=1.0, started_unix_s=1.0))
    hb["pid"] = 2**70
    with pytest.raises(MessageRejected):
        parse_node_message(json.dumps(hb).encode())
