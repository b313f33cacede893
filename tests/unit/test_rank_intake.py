"""What a node accepts from its ranks (pure): re-encoded relays, uid pins, oversize, bounded hello cache."""

from __future__ import annotations

import json

import pytest

from profwatch.core.fleet.limits import LimitSettings
from profwatch.core.fleet.rank_intake import RankIntake
from profwatch.core.messages import MessageRejected
from rankhook import wire


def hello(job: str = "j", rank: int = 0, **kw: object) -> bytes:
    d = wire.to_dict(wire.RankHello(job_id=job, rank=rank, local_rank=rank, world_size=64, hostname="h", pid=1,
                                    backend="torch_npu", ts_unix_s=1.0, profiler_config_path=f"/cfg/{job}"))
    d.update(kw)
    return json.dumps(d, ensure_ascii=False).encode()


def test_relays_re_encoded_validated_bytes_with_the_peer_uid() -> None:
    intake = RankIntake()
    raw = b'  {"kind": "hello", "v": 1, "job_id": "j", "rank": 0, "local_rank": 0, "world_size": 2, "hostname": ' \
          b'"h\xc3\xa9", "pid": 5, "backend": "none", "ts_unix_s": 1, "peer_uid": 0, "extra": "ignored"}'
    msg, data = intake.accept(raw, 1234, 0.0)
    assert data != raw and b"extra" not in data
    assert json.loads(data)["peer_uid"] == 1234 and json.loads(data)["hostname"] == "h\u00e9"
    data.decode("ascii")  # re-encoded: plain ASCII JSON whatever the rank sent
    _msg, data2 = intake.accept(raw, None, 0.0)
    assert json.loads(data2)["peer_uid"] is None  # a rank cannot claim a uid


def test_the_sending_process_is_attested_whatever_the_rank_wrote() -> None:
    """``peer_pid`` (one process, one vote for a new job generation) comes from the transport, never the rank."""
    raw = (b'{"kind": "hello", "v": 1, "job_id": "j", "rank": 1, "local_rank": 1, "world_size": 2, "hostname": "h", '
           b'"pid": 5, "backend": "none", "ts_unix_s": 1, "peer_pid": 99}')
    msg, data = RankIntake().accept(raw, 1000, 0.0, 4321)
    assert msg.peer_pid == 4321 and json.loads(data)["peer_pid"] == 4321
    msg, data = RankIntake().accept(raw, None, 0.0)
    assert msg.peer_pid is None and json.loads(data)["peer_pid"] is None


@pytest.mark.parametrize("encode", [lambda s: s.encode("utf-16"), lambda s: s.encode("utf-16-le"),
                                    lambda s: s.encode("utf-32"), lambda s: b"\xef\xbb\xbf" + s.encode(),
                                    lambda s: s.replace("h", "\\ud800", 1).encode()])
def test_other_encodings_are_refused(encode) -> None:
    text = hello().decode()
    with pytest.raises(MessageRejected) as ei:
        RankIntake().accept(encode(text), None, 0.0)
    assert ei.value.reason == "bad_encoding"


def test_a_job_is_pinned_to_the_first_uid_until_it_is_silent() -> None:
    intake = RankIntake(LimitSettings(job_expiry_s=100))
    intake.accept(hello(), 1000, 0.0)
    with pytest.raises(MessageRejected) as ei:
        intake.accept(hello(rank=1), 2000, 50.0)
    assert ei.value.reason == "job_uid_mismatch"
    intake.accept(hello(rank=1), 1000, 60.0)
    intake.accept(hello(job="k"), 2000, 60.0)  # another job of another user
    intake.accept(hello(rank=2), 2000, 161.0)  # pin lapsed after job_expiry_s of silence


def test_oversize_and_bounded_caches() -> None:
    intake = RankIntake(LimitSettings(node_max_cached_hellos=3, max_jobs_per_node=2))
    with pytest.raises(MessageRejected) as ei:
        intake.accept(b"{" + b" " * wire.MAX_MESSAGE_BYTES + b"}", 1, 0.0)
    assert ei.value.reason == "oversize"
    for r in range(5):
        intake.accept(hello(job=f"j{r}"), 7, float(r))
    assert [k[0] for k in intake.hellos] == ["j2", "j3", "j4"] and len(intake.pins.pins) == 3
    assert set(intake.dp_jobs) == {"j0", "j1"}


def test_a_new_shape_of_a_job_drops_its_older_cached_hellos_so_a_reregistration_never_replays_them() -> None:
    intake = RankIntake()
    for r in range(8):  # generation 0: 8 ranks, restart count 0
        intake.accept(hello(rank=r, world_size=8, restart_count=0), 1000, 0.0)
    intake.accept(hello(job="other", rank=5), 1000, 0.0)
    intake.accept(hello(rank=0, world_size=4, restart_count=1), 1000, 1.0)  # the elastic restart at 4 ranks
    shapes = {k: (json.loads(v)["world_size"], json.loads(v)["restart_count"]) for k, v in intake.hellos.items()}
    assert shapes == {("other", 5): (64, None), ("j", 0): (4, 1)}
    intake.accept(hello(rank=6, world_size=8, restart_count=0), 1000, 2.0)  # a late hello of the old generation
    intake.accept(hello(rank=1, world_size=4, restart_count=1), 1000, 3.0)
    assert ("j", 1) in intake.hellos and ("j", 0) in intake.hellos  # the newer shape is never dropped by an older
    intake.accept(hello(rank=1, world_size=2, restart_count=2), 1000, 4.0)
    assert {k: json.loads(v)["world_size"] for k, v in intake.hellos.items() if k[0] == "j"} == {("j", 1): 2}


def test_a_version_2_step_in_integer_microseconds_is_relayed_as_seconds_with_its_sender() -> None:
    """The hook's version-2 step report (``step_time_us``, ``ts_unix_us``) is read exactly to the microsecond and
    relayed in the coordinator's form, stamped with the attested sender; a version-1 report (floats) is still
    taken, and stamped too; what a rank writes as ``peer_pid`` is overwritten."""
    v2 = (b'{"job_id":"j","rank":1,"step":7,"step_time_us":412345,"ts_unix_us":1764500042500001,'
          b'"kind":"step","v":2}')
    msg, data = RankIntake().accept(v2, 1000, 0.0, 4321)
    relayed = json.loads(data)
    assert (msg.step_time_s, msg.ts_unix_s, msg.peer_pid) == (0.412345, 1764500042.500001, 4321)
    assert (relayed["step_time_s"], relayed["peer_pid"], relayed["v"]) == (0.412345, 4321, 2)
    assert "step_time_us" not in relayed
    v1 = (b'{"job_id":"j","rank":1,"step":8,"step_time_s":0.4,"ts_unix_s":1764500043.0,"peer_pid":7,'
          b'"kind":"step","v":1}')
    msg, data = RankIntake().accept(v1, 1000, 0.0, 4321)
    assert msg.peer_pid == 4321 and json.loads(data)["peer_pid"] == 4321 and json.loads(data)["v"] == 1
    msg, data = RankIntake().accept(v1, None, 0.0, None)  # tcp: nothing attested, nothing kept
    assert msg.peer_pid is None and json.loads(data)["peer_pid"] is None
    for bad, reason in ((b'"step_time_us":-1', "bad_value"), (b'"step_time_us":1.5', "bad_schema"),
                        (b'"step_time_us":true', "bad_schema"), (b'"step_time_us":604800000001', "bad_value")):
        with pytest.raises(MessageRejected) as ei:
            RankIntake().accept(v2.replace(b'"step_time_us":412345', bad), 1000, 0.0, 4321)
        assert ei.value.reason == reason, bad
