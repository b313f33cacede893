"""Wire validation: every rejection reason, the batch fast path, and a bad message isolated inside a batch."""

from __future__ import annotations

import json

import msgspec
import pytest

from profwatch.core.messages import (
    MessageRejected,
    PlainStepReport,
    parse_node_command,
    parse_node_message,
    parse_rank_message,
)
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
        (json.dumps(_step(v=3)).encode(), "bad_version"),
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
    assert not bad and len(good) == 50 and all(isinstance(m, (wire.StepReport, PlainStepReport)) for m in good)
    assert [msgspec.structs.asdict(m) for m in good] == [d | {"flags": ()} for d in batch.messages]  # plain reports


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


# -- strict encodings, types and bounds (issue: bad input that harms) -------------------------------------------
def _capture(**kw):
    d = wire.to_dict(wire.CaptureEvent(job_id="j1", rank=1, event="completed", ts_unix_s=1.0, capture_id="c1"))
    d.update(kw)
    return d


def _with_lone_surrogate(d: dict, path: list) -> bytes:
    """JSON of ``d`` with the string at ``path`` made a lone surrogate escape (as json.dumps writes it)."""
    target = d
    for p in path[:-1]:
        target = target[p]
    last = path[-1]
    if last == "<key>":
        (k, v), = target.items()
        target.clear()
        target["\ud800" + k] = v
    else:
        target[last] = "x\udfff"
    return json.dumps(d).encode()


@pytest.mark.parametrize(("base", "path"), [
    (_hello, ["hostname"]), (_hello, ["job_id"]), (_hello, ["profiler_config_path"]), (_hello, ["prof_root"]),
    (lambda: _hello(versions={"torch": "2"}), ["versions", "torch"]),
    (lambda: _hello(versions={"torch": "2"}), ["versions", "<key>"]),
    (lambda: _step(stages={"fwd": 0.1}), ["stages", "<key>"]), (lambda: _step(flags=["a"]), ["flags", 0]),
    (_capture, ["detail"]), (_capture, ["rank_dir"]), (_capture, ["capture_id"]),
])
def test_lone_surrogates_are_refused_in_every_field(base, path) -> None:
    with pytest.raises(MessageRejected) as ei:
        parse_rank_message(_with_lone_surrogate(base(), path))
    assert ei.value.reason == "bad_encoding"


@pytest.mark.parametrize("codec", ["utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-le", "utf-8-sig", "latin-1"])
def test_only_utf8_without_bom_is_accepted(codec: str) -> None:
    text = json.dumps(_hello(hostname="h\u00e9"), ensure_ascii=False)
    with pytest.raises(MessageRejected) as ei:
        parse_rank_message(text.encode(codec))
    assert ei.value.reason == "bad_encoding"
    assert parse_rank_message(text.encode("utf-8")).hostname == "h\u00e9"


@pytest.mark.parametrize("kw", [{"rank": "1"}, {"rank": True}, {"rank": 1.0}, {"step": "7"}, {"step_time_s": "0.1"},
                                {"capturing": 1}, {"flags": "checkpoint"}, {"stages": {"fwd": "0.1"}}])
def test_types_are_strict(kw: dict) -> None:
    with pytest.raises(MessageRejected) as ei:
        parse_rank_message(json.dumps(_step(**kw)).encode())
    assert ei.value.reason == "bad_schema"


@pytest.mark.parametrize("kw", [{"step_time_s": 1e308}, {"step_time_s": 8 * 86400.0}, {"ts_unix_s": 1e12},
                                {"stages": {"fwd": 1e300}}, {"flags": ["x" * 65]}, {"flags": ["a"] * 65}])
def test_physical_bounds(kw: dict) -> None:
    with pytest.raises(MessageRejected) as ei:
        parse_rank_message(json.dumps(_step(**kw)).encode())
    assert ei.value.reason == "bad_value"
    assert parse_rank_message(json.dumps(_step(step_time_s=3600.0, ts_unix_s=1.8e9)).encode()).step_time_s == 3600.0


@pytest.mark.parametrize("kw", [{"hostname": "h" * 300}, {"hostname": "a\u0000b"}, {"profiler_config_path": "/" * 5000},
                                {"versions": {f"k{i}": "v" for i in range(100)}}, {"peer_uid": -1}])
def test_hello_text_bounds(kw: dict) -> None:
    with pytest.raises(MessageRejected) as ei:
        parse_rank_message(json.dumps(_hello(**kw)).encode())
    assert ei.value.reason == "bad_value"


def _batch_bytes(elements: list[bytes], node_id: str = "n1") -> bytes:
    head = json.dumps({"kind": "node_batch", "v": 1, "node_id": node_id, "hostname": "h", "seq": 1, "ts_unix_s": 1.0})
    return head[:-1].encode() + b',"messages":[' + b",".join(elements) + b"]}"


def test_a_bad_batch_is_split_never_dropped_whole() -> None:
    good = [json.dumps(_step(step=s)).encode() for s in range(1, 201)]
    poison = [json.dumps(_step(step=999)).encode("utf-16"),  # what an old node relayed raw
              json.dumps(_step(step=998)).encode("utf-32"),
              b'{"kind":"step","v":1,"job_id":"j\xff","rank":1,"step":997,"step_time_s":0.1,"ts_unix_s":1}',
              json.dumps(_hello(hostname="\ud800")).encode(),
              b'{"kind":"step","v":1,"job_id":"j1","rank":1,"step":',
              json.dumps(_step(rank="1")).encode()]
    elements = good[:50] + poison[:2] + good[50:120] + poison[2:4] + good[120:] + poison[4:]
    env, msgs, bad = parse_node_message(_batch_bytes(elements))
    assert env.node_id == "n1" and env.seq == 1
    assert sorted(m.step for m in msgs) == list(range(1, 201))  # 200 of 200 honest steps kept
    assert len(bad) >= len(poison) - 1 and {b.reason for b in bad} <= {"bad_json", "bad_encoding", "bad_schema"}


def test_a_batch_of_garbage_is_given_up_after_a_bounded_number_of_resyncs() -> None:
    from profwatch.core.messages import MAX_RESYNC

    _env, msgs, bad = parse_node_message(_batch_bytes([b"{" + b'"a":' * 10 + b"x"] * 5000))
    assert msgs == [] and len(bad) == MAX_RESYNC + 1 and bad[-1].detail.startswith("split abandoned")


@pytest.mark.parametrize("node_id", ["", "../x", "a b", "n" * 200, "\u00e9"])
def test_node_ids_are_safe_names(node_id: str) -> None:
    hb = wire.to_dict(wire.NodeHeartbeat(node_id=node_id, hostname="h", pid=1, ts_unix_s=1.0, started_unix_s=1.0))
    with pytest.raises(MessageRejected) as ei:
        parse_node_message(json.dumps(hb).encode())
    assert ei.value.reason == "bad_node_id"


@pytest.mark.parametrize("kw", [{"mode": "training\n"}, {"role": "pp1\n"}, {"role": "a" * 65}, {"role": "\u00e9"},
                                {"mode": ""}, {"role": "a b"}, {"role": "a\u0000"}, {"job_id": "j1\n"},
                                {"stages": {"fwd\n": 0.1}}, {"work": -1.0}, {"work": 1e16}])
def test_labels_work_and_job_ids_are_refused_when_hostile(kw: dict) -> None:
    kinds = [_step] if "work" in kw or "stages" in kw else [_step, _hello]
    for make in kinds:  # a dollar anchor would let "pp1\n" in: the spelling rules end at the end of the string
        with pytest.raises(MessageRejected) as ei:
            parse_rank_message(json.dumps(make(**kw)).encode())
        assert ei.value.reason in ("bad_value", "bad_job_id")
    ok = parse_rank_message(json.dumps(_step(mode="serving", role="a" * 64, work=0.0)).encode())
    assert (ok.mode, ok.role, ok.work) == ("serving", "a" * 64, 0.0)


@pytest.mark.parametrize("token", [b"NaN", b"Infinity", b"-Infinity", b"1e309", b"true", b'"5"', b"[1]"])
def test_work_must_be_a_finite_number(token: bytes) -> None:
    raw = json.dumps(_step()).encode()[:-1] + b', "work": ' + token + b"}"
    with pytest.raises(MessageRejected) as ei:
        parse_rank_message(raw)
    assert ei.value.reason in ("bad_value", "bad_schema")


def test_node_ids_end_at_the_end_of_the_string() -> None:
    from profwatch.core.messages import node_id_ok

    assert node_id_ok("n1") and not node_id_ok("n1\n")


@pytest.mark.parametrize("kw", [{"hostname": "h\x1b]0;owned\x07"}, {"hostname": "h\u009b2J"}, {"hostname": "h\n"},
                                {"versions": {"torch": "2.1\x1b[2J"}}])
def test_shown_names_carry_no_control_characters(kw: dict) -> None:
    with pytest.raises(MessageRejected) as ei:  # status and alerts print them as they are: no terminal escapes
        parse_rank_message(json.dumps(_hello(**kw)).encode())
    assert ei.value.reason == "bad_value"
    assert parse_rank_message(json.dumps(_hello(hostname="hôte-1", versions={"torch": "2.1"})).encode()).hostname == \
        "hôte-1"
    hb = wire.to_dict(wire.NodeHeartbeat(node_id="n1", hostname="h\x1b[2J", pid=1, ts_unix_s=1.0, started_unix_s=1.0))
    with pytest.raises(MessageRejected):
        parse_node_message(json.dumps(hb).encode())


def test_encode_writes_the_bytes_of_asdict_for_every_message_kind() -> None:
    from dataclasses import asdict

    msgs = [
        wire.RankHello(job_id="j1", rank=0, local_rank=0, world_size=2, hostname="h\u00f4te", pid=1, backend="none",
                       ts_unix_s=2.0, versions={"torch": "2.13"}, counters={"sent": 3}, mode="serving", role="pp1"),
        wire.StepReport(job_id="j1", rank=0, step=3, step_time_s=0.1, ts_unix_s=2.0, stages={"forward": 0.05},
                        flags=("checkpoint", "eval"), capturing=True, work=512.0),
        wire.StepReport(job_id="j1", rank=0, step=3, step_time_s=0.1, ts_unix_s=2.0),
        wire.CaptureEvent(job_id="j1", rank=0, event="completed", ts_unix_s=3.0, capture_id="c1", steps=(5, 6)),
        wire.RankBye(job_id="j1", rank=0, step=9, ts_unix_s=4.0),
        wire.NodeHeartbeat(node_id="n1", hostname="h", pid=1, ts_unix_s=1.0, started_unix_s=1.0, counters={"a": 1}),
        wire.NodeBatch(node_id="n1", hostname="h", seq=1, ts_unix_s=1.0, messages=[_step(), _hello()]),
        wire.NodeCommand(cmd="write_config", command_id="w1", args={"config": {"a": [1, 2]}}),
        wire.NodeAck(node_id="n1", command_id="w1", ok=True, result={"mtime_s": 1}),
        wire.NodeJobIdCollision(node_id="n1", hostname="h", job_id="j1", reason="uid_mismatch", owner_uid=1, uid=2,
                                rank=0, ts_unix_s=1.0),
    ]
    for m in msgs:
        assert wire.encode(m) == json.dumps(asdict(m), separators=(",", ":"), allow_nan=False).encode()
    with pytest.raises(ValueError):
        wire.encode(wire.StepReport(job_id="j1", rank=0, step=1, step_time_s=float("nan"), ts_unix_s=1.0))


def _hook_step(**kw: object) -> bytes:
    d: dict[str, object] = {"job_id": "j1", "rank": 1, "step": 7, "step_time_us": 250_000,
                            "ts_unix_us": 1_764_500_042_500_000, "kind": "step", "v": 2}
    d.update(kw)
    return json.dumps({k: v for k, v in d.items() if v is not None}).encode()


def test_the_hook_form_names_its_own_bad_field_and_needs_its_kind() -> None:
    """A float (or text) in the hook form's microsecond fields is refused naming that field, not the relayed form's
    step_time_s; a step report without kind (either form) is refused with a clear reason, never taken for a step."""
    assert parse_rank_message(_hook_step()).step_time_s == 0.25
    for field, bad in (("step_time_us", 1.5), ("step_time_us", "250000"), ("ts_unix_us", 1.7645e15)):
        with pytest.raises(MessageRejected) as ei:
            parse_rank_message(_hook_step(**{field: bad}))
        assert ei.value.reason == "bad_schema" and str(ei.value.detail).startswith(f"{field}: "), ei.value
        assert "step_time_s" not in str(ei.value.detail).replace("step_time_us", "")
    for raw in (_hook_step(kind=None), json.dumps({k: v for k, v in _step().items() if k != "kind"}).encode()):
        with pytest.raises(MessageRejected) as ei:
            parse_rank_message(raw)
        assert ei.value.reason == "bad_schema" and str(ei.value.detail).startswith("kind: missing"), ei.value
    # the text "step_time_us" inside a string is no hook form: the general rules accept the relayed report
    assert parse_rank_message(json.dumps(_step(job_id="step_time_us")).encode()).job_id == "step_time_us"
