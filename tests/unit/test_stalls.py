"""Stalled ranks judged from arrival times on the coordinator's clock (daemon/profwatch/core/detection/stalls.py), never from the
rank host's clock."""

from __future__ import annotations

from dataclasses import replace

from profwatch.core.detection.job_detector import DetectionSettings, JobDetector
from profwatch.simulate.telemetry import TelemetryScenario, generate_telemetry
from rankhook.wire import StepReport
from tests.unit.detection_helpers import kinds, run

BASE = TelemetryScenario(world_size=8, steps=300, cv=0.01, step_time_s=0.5)
QUICK = DetectionSettings(stall_after_s=10.0)


def test_stalled_rank_is_stalled_not_regression() -> None:
    found, det = run(generate_telemetry(replace(BASE, stall_rank=3, stall_from_step=150)), 8, QUICK)
    assert kinds(found) == ["stalled_rank"]
    a = found[0]
    assert a.ranks == (3,)
    assert a.detail["last_step"][3] == 149
    assert a.detail["steps_behind"][3] >= 5
    assert a.detail["clock"] == "coordinator_arrival"
    assert det.stalled_ranks == {3}
    # the rank comes back: cleared, and it may be reported again later
    det.observe(StepReport("sim", 3, 400, 0.5, 2e9), 2e9)
    assert det.stalled_ranks == frozenset()


def test_rank_that_left_is_not_stalled() -> None:
    det = JobDetector("sim", 8, QUICK)
    recs = generate_telemetry(replace(BASE, stall_rank=3, stall_from_step=150))
    run(recs[: 149 * 8 + 8], 8, det=det)
    det.mark_left(3)
    found, _ = run(recs[149 * 8 + 8:], 8, det=det)
    assert found == []


def test_stall_needs_both_steps_behind_and_silence() -> None:
    det = JobDetector("j", 2, DetectionSettings(stall_after_s=10.0, stall_steps_behind=5, warmup_steps=0))
    for k in range(1, 4):
        det.observe(StepReport("j", 0, k, 1.0, 100.0 + k), 100.0 + k)
        det.observe(StepReport("j", 1, k, 1.0, 100.0 + k), 100.0 + k)
    det.observe(StepReport("j", 0, 4, 1.0, 104.0), 104.0)
    assert det.tick(1000.0) == []  # silent long enough, but only 1 step behind
    for k in range(5, 10):
        det.observe(StepReport("j", 0, k, 1.0, 100.0 + k), 100.0 + k)
    assert det.tick(105.0) == []  # 6 steps behind, silent only 2 s
    found = det.tick(114.0)
    assert [a.ranks for a in found] == [(1,)]
    assert det.tick(200.0) == []  # reported once per stall episode


def test_host_clock_skew_neither_fakes_nor_hides_a_stall() -> None:
    """Rank 2's host clock is an hour behind and rank 5's is frozen; rank 6 stops while its clock runs a day
    ahead. Only rank 6 is stalled: arrivals decide, the reports' ts_unix_s do not."""
    recs = generate_telemetry(replace(BASE, stall_rank=6, stall_from_step=150))
    for r in recs:
        r["arrival_s"] = r["ts_unix_s"] + 0.05  # node relay delay
        if r["rank"] == 2:
            r["ts_unix_s"] -= 3600.0
        elif r["rank"] == 5:
            r["ts_unix_s"] = 1_000_000.0
        elif r["rank"] == 6:
            r["ts_unix_s"] += 86_400.0
    found, det = run(recs, 8, QUICK)
    assert [(a.kind, a.ranks) for a in found] == [("stalled_rank", (6,))]
    assert det.stalled_ranks == {6}


def test_restart_gap_is_not_a_stall() -> None:
    sc = replace(BASE, steps=200, restart_after_step=150, restart_steps=150, restart_gap_s=60.0, cv=0.02)
    found, _ = run(generate_telemetry(sc), 8, QUICK)
    assert found == []


class _CountingProgress:
    """A :class:`RankProgress` that counts the per-rank reads a stall check makes."""

    def __init__(self, world: int) -> None:
        self.reads = 0
        self.steps = [0] * world
        self.furthest_step: int | None = 0
        self.epoch = 0
        self.epoch_start_arrival_s = 0.0
        outer = self

        class _Seq(list):  # type: ignore[type-arg]
            def __getitem__(self, i):  # type: ignore[no-untyped-def]
                outer.reads += 1
                return list.__getitem__(self, i)

        self.last_step = _Seq(self.steps)
        self.rank_epoch = _Seq([0] * world)


def test_a_stall_check_reads_only_the_ranks_that_fell_silent() -> None:
    """The deadline queue: ranks that keep reporting cost a check nothing, whatever the world size; a silent rank
    is judged when it falls silent and again only when the furthest step moves."""
    from profwatch.core.detection.stalls import ArrivalStallDetector

    world = 4096
    det = ArrivalStallDetector("j", world, DetectionSettings(stall_after_s=10.0, stall_steps_behind=5))
    prog = _CountingProgress(world)
    for t in range(1, 40):
        for r in range(world):
            if r != 7 or t < 5:  # rank 7 stops after t=4
                det.on_arrival(r, float(t))
                prog.last_step[r] = t  # type: ignore[index]
        prog.furthest_step = t
        before = prog.reads
        found = det.check(prog, float(t) + 0.5)
        assert prog.reads - before <= 8, (t, prog.reads - before)  # a few reads of rank 7, never O(world)
        if t == 14:
            assert [a.ranks for a in found] == [(7,)] and found[0].detail["steps_behind"] == {7: 10}
        else:
            assert found == [], t


def test_arrivals_of_a_run_leave_the_state_arrivals_one_by_one_leave() -> None:
    """``on_arrivals`` (one call per run of a batch) is ``on_arrival`` per report: ranks out of range ignored, a
    stalled, silent or left rank cleared, the deadline order and the latest arrival the same, and the stalls the
    later checks find the same."""
    from profwatch.core.detection.stalls import ArrivalStallDetector

    def state(d: ArrivalStallDetector) -> tuple[object, ...]:
        return (list(d._queue.items()), d._latest, dict(d._silent), set(d._recheck), set(d._left), set(d._stalled))

    runs = [([0, 1, 2, 3], 100.0), ([2, -1, 9, 0], 101.0), ([1], 101.0), ([3, 3, 0], 100.5), ([], 102.0),
            ([8, 12], 103.0), ([0, 1, 2], 140.0)]
    one, many = ArrivalStallDetector("j", 4, QUICK), ArrivalStallDetector("j", 4, QUICK)
    det = JobDetector("j", 4, QUICK)
    for step in range(1, 40):  # ranks 0 and 1 run ahead, 2 and 3 stop at step 2: behind, so silence stalls them
        for r in range(4):
            if r < 2 or step <= 2:
                det.observe(StepReport("j", r, step, 0.5, 90.0), 90.0)
    progress = det.units[0].aggregator  # a RankProgress: what the stall check reads
    stalled = []
    for d in (one, many):
        d.mark_left(2)
    for ranks, t in runs:
        reports = [StepReport("j", r, 1, 0.5, t) for r in ranks]
        for r in ranks:
            one.on_arrival(r, t)
        many.on_arrivals(reports, 0, len(reports), t)
        assert state(one) == state(many)
        found = one.check(progress, t + 30.0)
        assert found == many.check(progress, t + 30.0)
        assert state(one) == state(many)
        stalled.append(sorted(one.stalled_ranks))
    assert stalled[0] == [2, 3]  # the checks found stalls, and the later runs met stalled ranks (cleared, again)
