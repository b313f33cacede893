"""The telemetry record format shared by the coordinator's dump and replay (daemon/profwatch/core/fleet/telemetry.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from profwatch.core.fleet.telemetry import TelemetryRecord, dump_jsonl, window_records


def test_window_records_rebuild_timestamps_backwards_and_round_trip() -> None:
    rows = window_records("j1", 3, [(10, 0.5), (11, 0.25), (12, 1.0)], last_ts_unix_s=100.0)
    assert [(r["step"], r["ts_unix_s"]) for r in rows] == [(12, 100.0), (11, 99.0), (10, 98.75)]
    text = dump_jsonl(sorted(rows, key=lambda r: r["step"]), world_size=4)
    recs = [TelemetryRecord.model_validate(json.loads(line)) for line in text.splitlines()]
    assert [(r.rank, r.step, r.step_time_s, r.world_size) for r in recs] == [(3, 10, 0.5, 4), (3, 11, 0.25, 4),
                                                                             (3, 12, 1.0, 4)]


def test_dump_keeps_only_record_keys_and_renders_bye() -> None:
    text = dump_jsonl([{"job_id": "j", "rank": 0, "step": 1, "step_time_s": 0.1, "ts_unix_s": 1.0, "v": 1,
                        "kind": "step", "flags": [], "capturing": False, "extra": "x"},
                       {"kind": "bye", "job_id": "j", "rank": 0, "step": 1, "ts_unix_s": 2.0, "v": 1}])
    a, b = (json.loads(line) for line in text.splitlines())
    assert a == {"job_id": "j", "rank": 0, "step": 1, "step_time_s": 0.1, "ts_unix_s": 1.0}
    assert b == {"kind": "bye", "job_id": "j", "rank": 0, "step": 1, "ts_unix_s": 2.0}
    with pytest.raises(ValueError):
        dump_jsonl([{"job_id": "j", "rank": 0, "step": 1, "step_time_s": float("nan"), "ts_unix_s": 1.0}])


def test_record_validation() -> None:
    with pytest.raises(ValidationError):
        TelemetryRecord.model_validate({"job_id": "j", "rank": 4, "world_size": 4, "step": 1, "step_time_s": 1,
                                        "ts_unix_s": 1})
    with pytest.raises(ValidationError):
        TelemetryRecord.model_validate({"job_id": "j", "rank": 0, "step": 1, "ts_unix_s": 1})


def test_work_mode_role_pid_node_round_trip_through_window_and_replay_format() -> None:
    """What ``profwatch telemetry`` writes for a rank that reports work and labels (issue 20: the replay format
    carries what the new detectors and the new-run rule read)."""
    from profwatch.core.fleet.step_window import StepWindow

    w = StepWindow(3)
    w.append(1, 0.5)
    w.append(2, 0.25, 128.0)  # the work ring is allocated here, step 1 has none
    assert w.items_with_work() == [(1, 0.5, None), (2, 0.25, 128.0)]
    w.append(3, 0.5, 64.0)
    w.append(4, 1.0)  # wraps: step 1 is dropped
    assert w.items_with_work() == [(2, 0.25, 128.0), (3, 0.5, 64.0), (4, 1.0, None)]
    rows = window_records("j1", 1, w.items_with_work(), 100.0,
                          {"mode": "serving", "role": "pp1", "pid": 4242, "node": "n1", "unused": None})
    text = dump_jsonl(sorted(rows, key=lambda r: r["step"]), world_size=2)
    recs = [TelemetryRecord.model_validate(json.loads(line)) for line in text.splitlines()]
    assert [(r.step, r.work) for r in recs] == [(2, 128.0), (3, 64.0), (4, None)]
    assert {(r.mode, r.role, r.pid, r.node) for r in recs} == {("serving", "pp1", 4242, "n1")}
    assert "unused" not in text and '"work"' not in text.splitlines()[-1]
    w.clear()
    assert w.items_with_work() == []


@pytest.mark.parametrize(("field", "value"), [("work", -1.0), ("role", "a b"), ("mode", "x" * 65), ("pid", 0),
                                              ("node", "../n")])
def test_record_refuses_bad_new_fields(field: str, value: object) -> None:
    rec = {"job_id": "j", "rank": 0, "step": 1, "step_time_s": 0.1, "ts_unix_s": 1.0, field: value}
    with pytest.raises(ValidationError):
        TelemetryRecord.model_validate(rec)


@pytest.mark.parametrize("value", ["pp1", "a" * 64, "a" * 65, "", "pp1\n", "\u00e9", "a b", "x:y.z-1_2", "a\x00"])
def test_record_labels_and_node_ids_are_spelled_as_on_the_live_wire(value: str) -> None:
    from profwatch.core.messages import MessageRejected, parse_node_message, parse_rank_message
    from rankhook import wire

    def wire_ok(make) -> bool:
        try:
            make()
            return True
        except MessageRejected:
            return False

    step = {"job_id": "j", "rank": 0, "step": 1, "step_time_s": 0.1, "ts_unix_s": 1.0}
    hb = wire.to_dict(wire.NodeHeartbeat(node_id=value, hostname="h", pid=1, ts_unix_s=1.0, started_unix_s=1.0))
    cases = [("role", wire_ok(lambda: parse_rank_message(json.dumps(step | {"kind": "step", "role": value})))),
             ("mode", wire_ok(lambda: parse_rank_message(json.dumps(step | {"kind": "step", "mode": value})))),
             ("node", wire_ok(lambda: parse_node_message(json.dumps(hb).encode())))]
    for field, accepted_live in cases:
        try:
            TelemetryRecord.model_validate(step | {field: value})
            accepted = True
        except ValidationError:
            accepted = False
        assert accepted == accepted_live, field


_STEP = {"job_id": "j", "rank": 0, "step": 1, "step_time_s": 0.1, "ts_unix_s": 1.0}
_BYE = {"kind": "bye", "job_id": "j", "rank": 0, "step": 1, "ts_unix_s": 1.0}


@pytest.mark.parametrize("rec", [
    _STEP | {"step_time_s": 1e300}, _STEP | {"step_time_s": 8 * 86400.0}, _STEP | {"step_time_s": -0.1},
    _STEP | {"ts_unix_s": 1e12}, _STEP | {"ts_unix_s": -1.0}, _STEP | {"step": 2**62}, _STEP | {"step": -1},
    _STEP | {"rank": 1 << 20}, _STEP | {"rank": -1}, _STEP | {"job_id": "../etc"}, _STEP | {"job_id": "x" * 129},
    _STEP | {"stages": {"fwd": 1e300}}, _STEP | {"stages": {"a b": 0.1}}, _STEP | {"stages": {f"s{i}": 0.1 for i in range(33)}},
    _STEP | {"flags": ["x" * 65]}, _STEP | {"flags": ["a"] * 65}, _STEP | {"work": 1e16}, _STEP | {"mode": "a b"},
    _BYE | {"ts_unix_s": 1e12}, _BYE | {"step": -2}, _BYE | {"job_id": "j\n"},
    _STEP, _STEP | {"step_time_s": 7 * 86400.0, "stages": {"fwd": 0.5}, "flags": ["eval"], "work": 64.0}, _BYE,
    _BYE | {"step": -1},
], ids=range(25))
def test_replay_takes_what_the_live_wire_takes_and_refuses_what_it_refuses(rec: dict[str, object]) -> None:
    """A telemetry record is judged by the live wire's value rules (issue 26): replay never takes a record the
    coordinator would have refused (a 1e300 s step time was replayed), nor refuses one it takes."""
    from profwatch.core.messages import MessageRejected, parse_rank_message

    try:
        parse_rank_message(json.dumps({"kind": "step"} | rec))
        live = True
    except MessageRejected:
        live = False
    try:
        TelemetryRecord.model_validate(rec)
        replayed = True
    except ValidationError:
        replayed = False
    assert replayed == live


def test_replay_counts_a_record_out_of_the_wire_bounds_as_a_bad_line() -> None:
    from profwatch.commands.replay import replay_lines

    lines = [json.dumps(_STEP | {"world_size": 1, "step": s, "ts_unix_s": 1.0 + s}) for s in range(1, 6)]
    lines.insert(2, json.dumps(_STEP | {"step": 9, "step_time_s": 1e300}))
    res = replay_lines(lines)
    assert res["records"] == 5 and res["bad_lines"]["count"] == 1 and res["bad_lines"]["lines"][0]["line"] == 3
    assert "step_time_s" in res["bad_lines"]["lines"][0]["error"]


@pytest.mark.parametrize("change", [
    {"rank": "0"}, {"rank": True}, {"step": 1.0}, {"step": "1"}, {"step_time_s": "0.1"}, {"ts_unix_s": "1.0"},
    {"capturing": "yes"}, {"capturing": 1}, {"work": "5"}, {"stages": {"fwd": "0.5"}}, {"flags": "eval"},
], ids=range(11))
def test_replay_refuses_the_types_the_live_wire_refuses(change: dict[str, object]) -> None:
    """The live wire parses rank messages strictly ("rank": "0", true or 1.0 are refused); replay took them,
    converted (a "rank": true replayed as rank 1)."""
    from profwatch.commands.replay import replay_lines
    from profwatch.core.messages import MessageRejected, parse_rank_message

    with pytest.raises(MessageRejected):
        parse_rank_message(json.dumps({"kind": "step"} | _STEP | change))
    lines = [json.dumps(_STEP | {"world_size": 2, "step": s, "ts_unix_s": 1.0 + s}) for s in range(1, 4)]
    lines.append(json.dumps(_STEP | {"world_size": 2, "step": 4, "ts_unix_s": 5.0} | change))
    res = replay_lines(lines)
    assert res["records"] == 3 and res["bad_lines"]["count"] == 1 and res["bad_lines"]["lines"][0]["line"] == 4


def test_stages_are_kept_by_the_registry_and_dumped_for_replay() -> None:
    """Issue 35: ``profwatch telemetry`` dropped stages, so a replay of exported telemetry never showed rank
    outliers. The registry's windows keep each step's stages (bounded: the window's steps x the stage names, at
    most MAX_STAGE_SERIES names, later ones counted) and the dump carries them with work, mode and role."""
    from profwatch.core.fleet.registry import Registry
    from profwatch.core.fleet.step_window import MAX_STAGE_SERIES, StepWindow
    from rankhook import wire

    reg = Registry(window_steps=3)
    reg.hello(wire.RankHello(job_id="j", rank=0, local_rank=0, world_size=2, hostname="h0", pid=100,
                             backend="torch", ts_unix_s=1.0, mode="training", role="pp0"), "n0", 1.0)
    for s in range(1, 6):
        stages = {"forward": 0.1 * s, "backward": 0.2} if s != 4 else None
        if s == 5:
            stages = {"forward": 0.5, "optimizer": 0.05}  # a new name after the ring wrapped
        reg.step(wire.StepReport(job_id="j", rank=0, step=s, step_time_s=0.5, ts_unix_s=100.0 + s, stages=stages,
                                 work=64.0, mode="training", role="pp0"), 2.0)
    r = reg.jobs["j"].ranks[0]
    assert r.window is not None
    assert r.window.stage_rows() == [{"forward": pytest.approx(0.3), "backward": pytest.approx(0.2)}, None,
                                     {"forward": 0.5, "optimizer": pytest.approx(0.05)}]
    rows = window_records("j", 0, r.window.items_with_work(), r.last_ts_unix_s,
                          {"mode": r.mode, "role": r.role}, r.window.stage_rows())
    text = dump_jsonl(sorted(rows, key=lambda d: d["step"]), world_size=2)
    recs = [TelemetryRecord.model_validate(json.loads(line)) for line in text.splitlines()]
    assert [(x.step, x.stages, x.work, x.mode, x.role) for x in recs] == [
        (3, {"forward": 0.3, "backward": 0.2}, 64.0, "training", "pp0"), (4, None, 64.0, "training", "pp0"),
        (5, {"forward": 0.5, "optimizer": 0.05}, 64.0, "training", "pp0")]
    w = StepWindow(2)
    w.append(1, 0.1, None, {f"s{i}": 0.001 for i in range(MAX_STAGE_SERIES + 2)})
    assert len(w.stage_rows()[0] or {}) == MAX_STAGE_SERIES and w.stages_dropped == 2



def _cpu_job(ranks: int, n: int, seed: int, base: float) -> list[Any]:
    """A lockstep job's step reports with the hook's CPU samples (``tests/unit/test_cpu_time.py``'s simulation):
    rank 1 spends 30 % more CPU per step from step ``n * 3 // 4``, the host's load moves every wall time."""
    import random

    from rankhook import wire
    from tests.unit.test_cpu_time import _lockstep, _SimSampler

    cpu = _lockstep(n, ranks, seed=seed, slow_rank=1, onset=n * 3 // 4, base=base)
    sampler, rng = _SimSampler(ranks, seed), random.Random(seed)
    out: list[Any] = []
    t = 100.0
    for k, row in enumerate(cpu, start=1):
        wall = max(row) / min(0.95, max(0.05, 0.4 * rng.uniform(0.6, 2.2)))
        t += wall
        out += [wire.StepReport(job_id="j", rank=r, step=k, step_time_s=wall, ts_unix_s=t,
                                **sampler.fields(r, k, t, row[r])) for r in range(ranks)]
    return out


def _telemetry_of(reports: list[Any], ranks: int) -> str:
    """What ``profwatch telemetry`` writes after the coordinator's registry took ``reports`` (its
    ``_cmd_dump_telemetry``)."""
    from profwatch.core.fleet.registry import Registry
    from rankhook import wire

    reg = Registry(window_steps=len(reports))
    for r in range(ranks):
        reg.hello(wire.RankHello(job_id="j", rank=r, local_rank=r, world_size=ranks, hostname="h0", pid=100 + r,
                                 backend="torch", ts_unix_s=1.0), "n0", 1.0)
    for rep in reports:
        reg.step(rep, 2.0)
    rows = []
    for r in reg.jobs["j"].ranks.values():
        assert r.window is not None
        rows += window_records("j", r.rank, r.window.items_with_work(), r.last_ts_unix_s, None,
                               r.window.stage_rows(), r.window.cpu_rows())
    rows.sort(key=lambda d: (d["step"], d["rank"]))
    return dump_jsonl(rows, world_size=ranks)


def test_cpu_samples_are_kept_by_the_registry_and_a_replay_sees_the_live_cpu_series() -> None:
    """``profwatch telemetry`` of a zero-code job carried no CPU fields (the windows kept none, the record format
    had none), so a replay never saw ``cpu/step``. Now the registry's windows keep each report's CPU sample
    (``cpu_at_step``, ``cpu_total_s``) or ``cpu_s``, the dump writes them and the replay reads them: the replayed
    reports give the aggregation the same per-step CPU series as the live ones."""
    from rankhook import wire
    from tests.unit.test_cpu_time import _sampled_series

    live = _cpu_job(2, 120, 3, 0.008)
    live.append(wire.StepReport(job_id="j", rank=0, step=121, step_time_s=0.02, ts_unix_s=1e6,
                                cpu_s=0.008))  # an older hook's per-step CPU time rides along too
    assert sum(rep.cpu_at_step is not None for rep in live) >= 10
    replayed = [TelemetryRecord.model_validate_json(line).as_wire() for line in _telemetry_of(live, 2).splitlines()]
    assert [(m.rank, m.step, m.cpu_s, m.cpu_at_step, m.cpu_total_s) for m in replayed] == [
        (m.rank, m.step, m.cpu_s, m.cpu_at_step, m.cpu_total_s) for m in live]
    live_series, _ = _sampled_series(live)
    replay_series, _ = _sampled_series(replayed)
    assert live_series and replay_series == live_series


def test_a_replay_of_exported_telemetry_names_a_rank_by_its_cpu_time() -> None:
    """4 lockstep ranks, rank 1 +30 % CPU per step from step 1200 of 1600 (wall times equal: only the CPU time
    tells): ``profwatch replay`` of the job's telemetry names it on ``cpu/step`` (before, the dump had no CPU fields
    and the replay named nobody). The job runs 400 steps after the onset: a rank named on ``cpu/step`` from samples
    needs independent CPU observations past its own noise (``RankOutlierDetector._cpu_evidence``; ``OBS_LAG_STEPS``
    in ``tests/unit/test_cpu_time.py``); the 100 steps this test gave it before named nobody."""
    from profwatch.commands.replay import replay_lines

    res = replay_lines(_telemetry_of(_cpu_job(4, 1600, 4, 0.0066), 4).splitlines())
    assert res["bad_lines"]["count"] == 0
    named = [a for a in res["anomalies"] if a["kind"] == "rank_outlier"]
    assert named and named[0]["ranks"] == [1] and named[0]["detail"]["stage"] == {1: "cpu/step"}
    assert named[0]["step"] >= 450


def test_the_window_keeps_cpu_fields_in_rings_aligned_with_its_steps() -> None:
    """CPU fields in typed rings (12 bytes a step for samples, allocated at the first one), wrapping with the
    steps: a step that carried none reads None, an older hook's cpu_s is kept to the µs."""
    from profwatch.core.fleet.step_window import CPU_SAMPLE_STEP_BYTES, StepWindow

    w = StepWindow(3)
    w.append(1, 0.5)
    assert w.cpu_rows() == [None]
    w.append(2, 0.5, cpu_sample=(1, 10.25))
    w.append(3, 0.5, cpu_s=0.125)
    w.append(4, 0.5, cpu_sample=(3, 11.5))  # wraps: step 1 dropped
    assert [st for st, _ in w.items()] == [2, 3, 4]
    assert w.cpu_rows() == [{"cpu_at_step": 1, "cpu_total_s": 10.25}, {"cpu_s": 0.125},
                            {"cpu_at_step": 3, "cpu_total_s": 11.5}]
    assert w._cpu_at is not None and w._cpu_total is not None
    assert w._cpu_at.itemsize + w._cpu_total.itemsize == CPU_SAMPLE_STEP_BYTES and len(w._cpu_at) == 3
    w.clear()
    assert w.cpu_rows() == []


def test_the_memory_bound_counts_every_ring_of_a_rank_sending_cpu_s_and_samples() -> None:
    """``limits.STEP_BYTES`` (the coordinator's state bound per rank and step, work and stages aside) is what the
    largest such window holds a step: a rank whose reports carry both an older hook's ``cpu_s`` and CPU samples
    keeps both rings, 8 + 12 + 4 = 24 bytes. Before: 20 (the ``cpu_s`` ring was not counted)."""
    from profwatch.core.fleet.limits import STEP_BYTES
    from profwatch.core.fleet.step_window import StepWindow

    w = StepWindow(4)
    for k in range(6):  # wraps: the rings stay one value a step
        w.append(k, 0.5, cpu_s=0.1, cpu_sample=(k, 1.0 + k))
    rings = [w._steps, w._times, w._cpu_s, w._cpu_at, w._cpu_total]
    assert all(r is not None and len(r) == 4 for r in rings)
    assert sum(r.itemsize for r in rings if r is not None) == STEP_BYTES == 24


@pytest.mark.parametrize("step_time_s", [0.006400080914317202, 8.120033787316688, 38.25143337376783])
def test_a_dumped_cpu_time_at_the_wire_bound_stays_a_valid_record(step_time_s: float) -> None:
    """The live wire takes ``cpu_s`` up to ``MAX_CPU_CORES x step_time_s``; the window keeps both in float32 and the
    dump rounds them to the µs, so a report at that bound (a hook that reads a busy process's clock, or a hostile
    peer) came back a few µs over the rounded step time's bound: the replay of ``profwatch telemetry`` refused the
    whole record (its step time too) as a bad line, a step the live detector had judged. The dump now keeps the
    CPU time within the bound of the step time it writes."""
    from profwatch.core.fleet.step_window import StepWindow
    from rankhook import wire

    cpu_s = wire.MAX_CPU_CORES * step_time_s
    w = StepWindow(4)
    w.append(7, step_time_s, cpu_s=cpu_s)
    rows = window_records("j", 0, w.items_with_work(), 1.7e9, None, w.stage_rows(), w.cpu_rows())
    rec = TelemetryRecord.model_validate_json(dump_jsonl(rows, world_size=2), strict=True)
    assert rec.step == 7 and rec.cpu_s is not None
    # at most the written step time's bound, which the µs rounding of a 6.4 ms step moved by 1.3e-5 of itself
    assert rec.cpu_s <= wire.MAX_CPU_CORES * max(rec.step_time_s or 0.0, 0.001)
    assert rec.cpu_s == pytest.approx(cpu_s, rel=1e-4)
