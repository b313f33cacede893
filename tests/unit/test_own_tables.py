"""profwatch's own cluster_time_summary from each rank's tables (core/verdict/own_tables.py)."""

from __future__ import annotations

import pytest

from profwatch.core.verdict.own_tables import (
    KIND_COMM,
    KIND_COMPUTE,
    KIND_MEMORY,
    NO_STEP,
    CommOp,
    RankTables,
    TraceRow,
    combine_rank_tables,
    comm_ops,
    memory_by_step,
    memory_not_overlapped_us,
    steps_of,
)


def test_step_of_a_launch_includes_both_ends_and_drops_gaps() -> None:
    spans = [(1, 0, 100), (2, 200, 300)]
    assert steps_of(spans, 0) == [1]
    assert steps_of(spans, 100) == [1]
    assert steps_of(spans, 150) == []
    assert steps_of(spans, 300) == [2]


def test_comm_ops_place_by_launch_and_without_step_time_are_step_minus_one() -> None:
    rows = [("g", "op1", 1_000, 3_000, 50), ("g", "op2", 5_000, 6_000, 150)]
    ops = comm_ops(rows, [(1, 0, 100)])
    assert [(o.op, o.step, o.duration_us) for o in ops] == [("op1", 1, 2.0)]
    assert {o.step for o in comm_ops(rows, None)} == {NO_STEP}


@pytest.mark.parametrize(("intervals", "expected_ns"), [
    ([], 0),
    ([(0, 100, KIND_MEMORY)], 100),
    ([(0, 100, KIND_COMPUTE), (10, 50, KIND_MEMORY)], 0),            # memcpy inside compute
    ([(0, 100, KIND_MEMORY), (40, 60, KIND_COMPUTE)], 80),           # compute inside memcpy
    ([(0, 50, KIND_COMPUTE), (30, 120, KIND_MEMORY)], 70),           # memcpy sticks out of compute
    ([(0, 100, KIND_MEMORY), (50, 200, KIND_COMM)], 50),             # communication takes over the frontier
    ([(0, 10, KIND_MEMORY), (20, 30, KIND_MEMORY)], 20),             # two apart
])
def test_memory_sweep(intervals: list[tuple[int, int, int]], expected_ns: int) -> None:
    assert memory_not_overlapped_us(intervals) == pytest.approx(expected_ns / 1000.0)


def test_memory_by_step_only_steps_with_a_memcpy() -> None:
    spans = [(1, 0, 1_000), (2, 2_000, 3_000)]
    rows = [(0, 500, KIND_COMPUTE, 0), (400, 900, KIND_MEMORY, 400), (2_100, 2_500, KIND_COMPUTE, 2_050)]
    assert memory_by_step(rows, spans) == {1: pytest.approx(0.4)}


def _tables(rank: int, durs: dict[str, float], *, step_time: float | None = 100.0) -> RankTables:
    t = RankTables(rank, trace={1: TraceRow(60.0, 20.0, 30.0, 10.0 + rank)})
    if step_time is not None:
        t.step_time_us = {1: step_time}
    t.comm = [CommOp("g", op, 1, d) for op, d in durs.items()]
    return t


def test_combine_takes_the_shortest_of_each_instance() -> None:
    out = combine_rank_tables({0: _tables(0, {"a": 10.0, "b": 4.0}), 1: _tables(1, {"a": 3.0, "b": 6.0}),
                               2: _tables(2, {"a": 5.0, "b": 4.0})})
    rows = {r.rank: r for r in out.summaries}
    assert out.instances == 2
    assert (rows[0].wait_us, rows[0].transmit_us) == (7.0, 7.0)
    assert (rows[1].wait_us, rows[1].transmit_us) == (2.0, 7.0)
    assert (rows[2].wait_us, rows[2].transmit_us) == (2.0, 7.0)
    assert rows[1].computation_us == 60.0 and rows[1].communication_us == 30.0 and rows[1].free_us == 11.0
    assert rows[1].step_time_us == 100.0


def test_combine_fallback_step_time_and_memory_subtracted() -> None:
    t = _tables(0, {"a": 1.0}, step_time=None)
    t.memory_not_overlapped_us = {1: 4.0}
    out = combine_rank_tables({0: t, 1: _tables(1, {"a": 2.0})})
    row = next(r for r in out.summaries if r.rank == 0)
    assert row.step_time_us == 60.0 + 20.0 + 10.0
    assert row.free_us == 6.0


def test_one_communicating_rank_has_no_wait() -> None:
    out = combine_rank_tables({0: _tables(0, {"a": 9.0}), 1: _tables(1, {})})
    assert all(r.wait_us == 0.0 and r.transmit_us == 0.0 for r in out.summaries)
    assert any("one rank" in n for n in out.notes)


def test_the_enrich_deadline_counts_the_confirming_recipes() -> None:
    from profwatch.captures.shell import lifecycle_settings
    from profwatch.config import Settings

    s = Settings()
    s.analysis.msprof.max_concurrent_runs = 1
    with_first = lifecycle_settings(s).enrich_timeout_s
    s.analysis.own_tables = False
    without = lifecycle_settings(s).enrich_timeout_s
    per_run = s.analysis.msprof.timeout_s * (1 + min(s.analysis.msprof.retries, 1))
    assert with_first - without == pytest.approx(2 * per_run)  # cluster_time_summary, then slow_rank
