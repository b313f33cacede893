"""Per-rank state machine, batch grouping and completeness (pure; fake clock, hand-built observations)."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import pydantic
import pytest

from profwatch.core.batches.completeness import (
    CaptureHint,
    assess_batches,
    compute_deadline,
    evaluate_rank_dir,
)
from profwatch.core.batches.prof_layout import (
    REQUIRED_ANALYSIS_TABLES,
    REQUIRED_PROFILER_TABLES,
    DbObservation,
    ProfilerInfo,
    ProfilerMetadata,
    RankDirObservation,
    parse_rank_dir_name,
)
from profwatch.core.batches.settings import WatchSettings

T0 = datetime(2026, 1, 1, 12, 0, 0)
T0_UNIX = 1_767_268_800.0  # only used as "start"; the core never converts the name itself
SETTINGS = WatchSettings(quiet_period_s=60, parse_allowance_s=100, default_capture_window_s=200)
NOW = T0_UNIX + 10  # well before the default deadline (T0 + 300 s)
LATE = T0_UNIX + 10_000
PROFILER_TABLES = frozenset(REQUIRED_PROFILER_TABLES) | {"STEP_TIME", "META_DATA"}


def _name(rank: int, offset_s: float, pid: int | None) -> str:
    t = T0 + timedelta(seconds=offset_s)
    return f"node{rank // 8}_{pid or 4000 + rank}_{t:%Y%m%d%H%M%S}{t.microsecond // 1000:03d}_ascend_pt"


def obs(rank: int, *, offset_s: float = 0.0, pid: int | None = None, capture_id: str | None = "cap", world: int = 4,
        stage: str = "parsed", steps: tuple[int, ...] | None = (1, 2, 3), rdm: tuple[int, ...] | None = None,
        db_error: str | None = None, tables: frozenset[str] = PROFILER_TABLES, level: str = "Level1",
        export: tuple[str, ...] = ("db",), marker: bool = True, groups: frozenset[str] = frozenset({"hccl_g"}),
        comm_rows: int = 1, unknown: str | None = None, **extra: Any) -> RankDirObservation:
    """One rank dir at ``stage`` in appearing / raw_complete / parsing / parsed."""
    name = _name(rank, offset_s, pid)
    parsed_name = parse_rank_dir_name(name)
    assert parsed_name is not None
    base: dict[str, Any] = {"path": f"/prof/{name}", "name": parsed_name, "dir_ts_unix_s": T0_UNIX + offset_s,
                            "unknown": unknown}
    if stage == "appearing":
        return RankDirObservation(**base)
    base.update(info_file=f"profiler_info_{rank}.json",
                info=ProfilerInfo(rank_id=rank, export_types=export, profiler_level=level),
                metadata=ProfilerMetadata(capture_id=capture_id, world_size=world, group_names=groups))
    if stage == "raw_complete":
        return RankDirObservation(**base)
    if stage == "parsing":
        return RankDirObservation(output_dir=True, output_files=frozenset({"trace_view.json"}), **base)
    db = DbObservation(name=f"ascend_pytorch_profiler_{rank}.db", checked=True, error=db_error, tables=tables,
                       rank_device_map=(rank,) if rdm is None else rdm, step_ids=steps,
                       rows={"COMMUNICATION_OP": comm_rows})
    adb = DbObservation(name="analysis.db", checked=True, tables=frozenset(REQUIRED_ANALYSIS_TABLES),
                        rows={"StepTraceTime": 1, "CommAnalyzerTime": 1})
    base.update(output_dir=True, marker=marker, profiler_dbs=(db,), analysis_db=adb,
                output_files=frozenset({db.name, "analysis.db"} | ({"analyse.done"} if marker else set())),
                newest_output_mtime_s=T0_UNIX)
    base.update(extra)
    return RankDirObservation(**base)


def batches(observations: list[RankDirObservation], now: float = NOW, **kw: Any) -> list[Any]:
    return assess_batches(observations, now_unix_s=now, settings=SETTINGS, **kw)


def one(observations: list[RankDirObservation], now: float = NOW, **kw: Any) -> Any:
    out = batches(observations, now, **kw)
    assert len(out) == 1, [b.to_json() for b in out]
    return out[0]


def test_complete_batch_json_shape() -> None:
    b = one([obs(r) for r in range(4)])
    j = b.to_json()
    assert {"batch_id", "status", "kind", "expected_ranks", "ranks", "missing_ranks", "problems", "steps"} <= set(j)
    assert j["status"] == "complete" and j["kind"] == "ascend_pt" and j["batch_id"] == "cap"
    assert j["expected_ranks"] == [0, 1, 2, 3] and j["ranks"] == [0, 1, 2, 3] and j["missing_ranks"] == []
    assert j["problems"] == [] and j["steps"] == [1, 2, 3] and j["capture_id"] == "cap"
    assert set(j["rank_dirs"]) == {"0", "1", "2", "3"}


def test_rank_state_machine() -> None:
    for stage, state in [("appearing", "appearing"), ("raw_complete", "raw_complete"), ("parsing", "parsing"),
                         ("parsed", "parsed")]:
        assert evaluate_rank_dir(obs(0, stage=stage), now_unix_s=NOW, settings=SETTINGS).state == state


def test_missing_rank_is_parsing_until_deadline_then_incomplete() -> None:
    ranks = [obs(r) for r in (0, 1, 3)]
    assert one(ranks).status == "parsing"
    late = one(ranks, now=LATE)
    assert late.status == "incomplete" and late.missing_ranks == [2]
    assert [(p.rank, p.path) for p in late.problems] == [(2, None)] and "after deadline" in late.problems[0].reason


def test_rank_still_parsing_and_reparsed() -> None:
    b = one([obs(0), obs(1), obs(2, stage="parsing"), obs(3)])
    assert b.status == "parsing" and b.ranks[2].state == "parsing"
    # a re-parse deletes ASCEND_PROFILER_OUTPUT: the rank goes back from parsed to raw_complete (docs/rank-dirs.md#completion)
    b = one([obs(0), obs(1), obs(2, stage="raw_complete"), obs(3)])
    assert b.status == "parsing" and b.ranks[2].state == "raw_complete"
    assert one([obs(0), obs(1), obs(2, stage="raw_complete"), obs(3)], now=LATE).status == "incomplete"


def test_duplicate_rank_is_invalid_naming_both_paths() -> None:
    dup = obs(1, pid=9999, offset_s=0.5)
    b = one([obs(r) for r in range(4)] + [dup])
    assert b.status == "invalid"
    msgs = [p.reason for p in b.problems if p.rank == 1]
    assert any(obs(1).path in m and dup.path in m for m in msgs)


def test_two_captures_by_id_never_mix() -> None:
    out = batches([obs(r, capture_id="a") for r in range(4)] + [obs(r, capture_id="b", pid=5000 + r) for r in range(4)])
    assert [(b.batch_id, b.status) for b in out] == [("a", "complete"), ("b", "complete")]


def test_hand_armed_captures_split_by_time() -> None:
    first = [obs(r, capture_id=None) for r in range(4)]
    later = [obs(r, capture_id=None, offset_s=600 + r * 0.01, pid=5000 + r) for r in range(4)]
    out = batches(first + later)
    assert [b.status for b in out] == ["complete", "complete"]
    assert {len(b.ranks) for b in out} == {4}
    # back-to-back captures (5 s apart): the repeated ranks split the cluster at its largest gap
    close = [obs(r, capture_id=None, offset_s=5 + r * 0.01, pid=6000 + r) for r in range(4)]
    assert [b.status for b in batches(first + close)] == ["complete", "complete"]
    # a stray second dir for one rank 0.3 s later cannot be split off: invalid, not silently mixed
    stray = obs(2, capture_id=None, offset_s=0.3, pid=7000)
    assert one(first + [stray]).status == "invalid"


def test_different_jobs_in_one_folder_are_separate_batches() -> None:
    a = [obs(r, capture_id=None, groups=frozenset({"jobA"})) for r in range(2)]
    b = [obs(r, capture_id=None, groups=frozenset({"jobB"}), pid=5000 + r) for r in range(2)]
    assert len(batches(a + b, world_size=2)) == 2


def test_appearing_dir_joins_nearest_batch() -> None:
    b = one([obs(r) for r in range(3)] + [obs(3, stage="appearing", offset_s=0.2)])
    assert b.status == "parsing" and b.missing_ranks == [3] and len(b.unassigned) == 1


def test_text_only_export_fails_rank() -> None:
    text = replace(obs(1, export=("text",)), profiler_dbs=(), analysis_db=None,
                   output_files=frozenset({"trace_view.json", "step_trace_time.csv", "analyse.done"}))
    b = one([obs(0), text, obs(2), obs(3)])
    assert b.status == "incomplete" and b.ranks[1].state == "failed"
    assert any("text-only" in p.reason for p in b.problems)


def test_truncated_and_wrong_rank_dbs() -> None:
    b = one([obs(0), obs(1, db_error="database disk image is malformed"), obs(2, rdm=(5,)), obs(3, rdm=(3, 3))])
    assert b.status == "incomplete"
    reasons = {p.rank: p.reason for p in b.problems}
    assert "malformed" in reasons[1] and "rankId is 5" in reasons[2] and "2 rows" in reasons[3]


def test_missing_tables_fail() -> None:
    b = one([obs(0, tables=PROFILER_TABLES - {"TASK"})] + [obs(r) for r in (1, 2, 3)])
    assert b.status == "incomplete" and "TASK" in b.problems[0].reason


def test_no_step_time_is_a_note_not_a_failure() -> None:
    b = one([obs(r, steps=None, tables=PROFILER_TABLES - {"STEP_TIME"}) for r in range(4)])
    assert b.status == "complete" and b.steps == []
    assert any("no step boundaries" in n for n in b.notes)


def test_common_steps_only() -> None:
    b = one([obs(0, steps=(1, 2, 3)), obs(1, steps=(2, 3)), obs(2), obs(3)])
    assert b.status == "complete" and b.steps == [2, 3] and any("common steps" in n for n in b.notes)
    assert one([obs(0, steps=(1, 2)), obs(1, steps=(7, 8)), obs(2), obs(3)]).status == "invalid"


def test_level0_without_communication_is_complete_with_note() -> None:
    b = one([obs(r, level="Level0", tables=PROFILER_TABLES - {"COMMUNICATION_OP"}) for r in range(4)])
    assert b.status == "complete" and any("no communication data" in n for n in b.notes)


def test_fallback_without_marker() -> None:
    def no_marker(**kw: Any) -> RankDirObservation:
        return obs(0, marker=False, **kw)

    quiet = T0_UNIX + SETTINGS.quiet_period_s + 1
    assert evaluate_rank_dir(no_marker(), now_unix_s=T0_UNIX + 5, settings=SETTINGS).state == "parsing"
    assert evaluate_rank_dir(no_marker(), now_unix_s=quiet, settings=SETTINGS).state == "parsed"
    for kw in ({"leftover_sqlite": True}, {"journal_files": ("analysis.db-journal",)}):
        assert evaluate_rank_dir(no_marker(**kw), now_unix_s=quiet, settings=SETTINGS).state == "parsing"
    empty_stt = DbObservation(name="analysis.db", checked=True, tables=frozenset(REQUIRED_ANALYSIS_TABLES),
                              rows={"StepTraceTime": 0})
    state = evaluate_rank_dir(no_marker(analysis_db=empty_stt), now_unix_s=quiet, settings=SETTINGS)
    assert state.state == "parsing" and "StepTraceTime" in state.reasons[0]


def test_expected_ranks_sources() -> None:
    assert one([obs(r) for r in range(4)], world_size=8).missing_ranks == [4, 5, 6, 7]
    hints = {"cap": CaptureHint(rank_list=(0, 2))}
    assert one([obs(0), obs(2)], hints=hints).status == "complete"
    b = one([obs(r) for r in range(4)], world_size=2)
    assert b.status == "invalid" and {p.rank for p in b.problems} >= {2, 3}


def test_unreadable_rank_is_unknown_not_deleted() -> None:
    b = one([obs(0), obs(1, unknown="ESTALE: Stale file handle"), obs(2), obs(3)])
    assert b.status == "parsing" and b.ranks[1].state == "unknown" and b.missing_ranks == []
    assert one([obs(0), obs(1, unknown="EIO"), obs(2), obs(3)], now=LATE).status == "incomplete"


def test_deadline_formula() -> None:
    hint = CaptureHint(steps=10, step_time_s=2.0)
    assert compute_deadline(100.0, hint, SETTINGS) == 100.0 + 10 * 2.0 * SETTINGS.deadline_factor + 100
    assert compute_deadline(100.0, None, SETTINGS) == 100.0 + 200 + 100
    assert compute_deadline(100.0, CaptureHint(deadline_unix_s=5.0), SETTINGS) == 5.0
    assert compute_deadline(None, None, SETTINGS) is None


def test_settings_forbid_unknown_keys() -> None:
    with pytest.raises(pydantic.ValidationError):
        WatchSettings(poll_interval=1)  # type: ignore[call-arg]
    assert WatchSettings(observer="polling").observer == "polling"


def test_1024_ranks_pure() -> None:
    b = one([obs(r, world=1024) for r in range(1024)])
    assert b.status == "complete" and len(b.ranks) == 1024


def test_torch_pt_rank_dirs() -> None:
    def torch_obs(rank: int, *, marker: bool, traces: tuple[str, ...]) -> RankDirObservation:
        name = parse_rank_dir_name(f"host_{100 + rank}_20260101120000000_torch_pt")
        assert name is not None
        return RankDirObservation(
            path=f"/prof/{name.worker}_{name.pid}_{name.ts}_torch_pt", name=name, dir_ts_unix_s=T0_UNIX,
            info_file=f"profiler_info_{rank}.json", info=ProfilerInfo(rank_id=rank, world_size=2),
            metadata=ProfilerMetadata(capture_id="t"), marker=marker, trace_files=traces)

    trace = ("host_100.1767268800000.pt.trace.json",)
    b = one([torch_obs(0, marker=True, traces=trace), torch_obs(1, marker=False, traces=trace)])
    assert b.kind == "torch_pt" and b.status == "parsing" and b.expected_ranks == [0, 1]
    b = one([torch_obs(0, marker=True, traces=trace), torch_obs(1, marker=True, traces=trace)])
    assert b.status == "complete"
    assert one([torch_obs(0, marker=True, traces=()), torch_obs(1, marker=True, traces=trace)]).status == "incomplete"


def _no_device_rows(rank: int, **kw: Any) -> RankDirObservation:
    o = obs(rank, **kw)
    db = replace(o.profiler_dbs[0], rows={"COMMUNICATION_OP": 1, "TASK": 0, "COMPUTE_TASK_INFO": 0})
    return replace(o, profiler_dbs=(db,))


def test_rank_without_device_data_is_not_complete_but_judgeable() -> None:
    """issue 11 item 5a: analyse.done with empty TASK / COMPUTE_TASK_INFO counted as parsed (batch COMPLETE)."""
    b = one([obs(0), _no_device_rows(1), obs(2), obs(3)])
    assert b.status == "incomplete" and b.ranks[1].state == "failed"
    assert "no usable device data" in b.ranks[1].reasons[0] and "TASK" in b.ranks[1].reasons[0]
    assert b.unusable_ranks() == {1: b.ranks[1].reasons[0]} and b.judgeable()
    # an empty PROF_*/device_N (and nothing else in any device dir) says the same
    empty_dev = replace(obs(2), device_dirs=("PROF_1/device_2",), empty_device_dirs=("PROF_1/device_2",))
    b = one([obs(0), obs(1), empty_dev, obs(3)])
    assert set(b.unusable_ranks()) == {2} and "device_2 empty" in b.ranks[2].reasons[0] and b.judgeable()
    ok_dev = replace(obs(2), device_dirs=("PROF_1/device_2", "PROF_1/device_3"), empty_device_dirs=("PROF_1/device_3",))
    assert one([obs(0), obs(1), ok_dev, obs(3)]).status == "complete"


def test_not_judgeable_when_other_problems_or_too_few_usable_ranks() -> None:
    assert not one([obs(0), _no_device_rows(1), obs(2)], world_size=4).judgeable()  # rank 3 missing
    assert not one([_no_device_rows(0), _no_device_rows(1), obs(2)], world_size=3).judgeable()  # 1 usable rank
    assert not one([obs(0), _no_device_rows(1), obs(2), obs(3, db_error="malformed")]).judgeable()
    assert one([obs(r) for r in range(4)]).judgeable()
