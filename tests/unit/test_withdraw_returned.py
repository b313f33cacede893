"""A capture armed for a job-wide excursion that came back before its window opened is withdrawn: the first unflagged
checkpoint longer than the spike hold cannot be told from a change when it starts, but by the capture's start_step
the job is back at its level (daemon/profwatch/core/detection/interruptions.py ``returned``,
daemon/profwatch/core/arming/episodes.py ``withdraw_returned``, the replay's and the coordinator's arming path).

Deterministic series (seeded numpy) replayed through ``replay_lines`` (the coordinator's detector, episodes, policy
and planner): a 2-4 rank job at 1.8 s steps (the planner's lead, and so the spike hold, is 4 steps)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from profwatch.commands.replay import replay_lines
from profwatch.core.arming.episodes import JobEpisodes
from profwatch.core.arming.policy import (
    EXCURSION_RUN_FACTOR,
    RETURN_PLAN_MAX_RATIO,
    WITHDRAW_SLACK_STEPS,
    ArmDecision,
    ArmHistory,
    capture_request,
    withdrawal_lead,
)
from profwatch.core.arming.settings import ArmingSettings
from profwatch.core.capture.planner import CaptureSettings, lead_steps
from profwatch.core.detection.interruptions import RETURN_STEPS, RecurringInterruptions
from profwatch.core.detection.types import Anomaly

STEP_S = 1.8
T0 = 1_764_500_000.0


def lines(steps: int, *, onset: int, duration: int | None, factor: float, cv: float = 0.03, world: int = 2,
          seed: int = 0, step_s: float = STEP_S) -> list[str]:
    """Telemetry of a ``world``-rank job at ``step_s`` with ``cv`` noise; every rank ``factor`` x slower for
    ``duration`` steps from step ``onset`` (None: to the end)."""
    rng = np.random.default_rng(seed)
    out, t = [], T0
    for step in range(1, steps + 1):
        on = step >= onset and (duration is None or step < onset + duration)
        st_s = step_s * (factor if on else 1.0) * max(0.2, 1.0 + cv * float(rng.standard_normal()))
        t += st_s
        for r in range(world):
            out.append(json.dumps({"job_id": "j", "rank": r, "world_size": world, "step": step,
                                   "step_time_s": round(st_s, 6), "ts_unix_s": round(t, 6),
                                   "stages": {"compute": round(0.8 * st_s, 6), "comm": round(0.2 * st_s, 6)}}))
    return out


def spent(res: dict) -> list[dict]:
    """Arms that were not withdrawn (a capture that recorded, or would have)."""
    gone = {w["capture_id"] for w in res["withdrawn"]}
    return [a for a in res["arms"] if a["capture_id"] not in gone]


def test_the_first_checkpoint_of_5_steps_is_withdrawn_before_its_window() -> None:
    """5 steps at 7x at step 200 of a 1.8 s job (the corpus' interrupts run 47): reported as a level change at its
    5th step, armed with start_step 4 steps ahead; the 3 steps in between are back at the level: the arm is
    withdrawn, no capture is spent, and one ``episode_closed`` (reason ``returned``) says why."""
    res = replay_lines(lines(400, onset=200, duration=5, factor=7.0))
    [arm] = res["arms"]
    [w] = res["withdrawn"]
    assert w["capture_id"] == arm["capture_id"] and not spent(res)
    closed = [e for e in res["episode_events"] if e.get("reason") == "returned"]
    assert len(closed) == 1 and closed[0]["withdrawn"] == arm["capture_id"]
    assert closed[0]["relabelled"] == "step_spike" and closed[0]["evidence"]["steps_back"] >= RETURN_STEPS
    assert closed[0]["evidence"]["last_elevated_step"] == 204 and "before the window" in closed[0]["why"]
    assert res["jobs"]["j"]["withdrawn"] == 1


def test_a_lasting_change_keeps_its_capture() -> None:
    """The same 7x rise that does not end: the capture is kept (its steps stay elevated through the lead); its window
    starts the planner's lead (4 steps), EXCURSION_RUN_FACTOR times the excursion's age (4) and WITHDRAW_SLACK_STEPS
    after the report at step 204."""
    res = replay_lines(lines(400, onset=200, duration=None, factor=7.0))
    assert not res["withdrawn"] and spent(res)
    assert spent(res)[0]["start_step"] <= 204 + 4 + EXCURSION_RUN_FACTOR * 4 + WITHDRAW_SLACK_STEPS


def test_a_checkpoint_that_ends_on_a_new_level_keeps_or_rearms_a_capture() -> None:
    """A 7x checkpoint after which the job stays 1.5x slower (a change that started with it): never withdrawn
    into nothing: a capture covering the new level is spent."""
    ls = lines(400, onset=200, duration=None, factor=1.5)
    burst = lines(400, onset=200, duration=5, factor=7.0 / 1.5, seed=1)
    # the job 1.5x from step 200, and 7x for its first 5 steps
    merged = []
    for a, b in zip(ls, burst, strict=True):
        ra, rb = json.loads(a), json.loads(b)
        if 200 <= ra["step"] < 205:
            ra["step_time_s"] = round(rb["step_time_s"] * 1.5, 6)
        merged.append(json.dumps(ra))
    res = replay_lines(merged)
    assert [a for a in spent(res) if a["start_step"] >= 200]


def test_withdraw_needs_the_window_ahead_and_a_job_wide_level_report() -> None:
    """The book withdraws only an own in-flight capture of a job-wide ``pattern "level"`` regression whose
    start_step the job has not reached, only when the detector says it came back and the shell could cancel it;
    the arm leaves the hourly cap and the gap."""
    def book_with_arm(ranks: tuple[int, ...] = (), pattern: str = "level") -> tuple[JobEpisodes, str]:
        b = JobEpisodes("j", ArmingSettings(), ArmHistory())
        an = Anomaly("step_regression", "j", 204, ranks, 6.0,
                     {"pattern": pattern, "first_step": 200, "baseline_s": 1.8, "step_time_s": 12.6})
        ep, _ = b.observe(an, 100.0)
        assert ep is not None
        b.history.record_arm(100.0, "c1")
        b.armed(ep.episode_id, "c1", 100.0, covered=None, start_step=208)
        return b, ep.episode_id

    evidence = {"first_step": 200, "last_elevated_step": 204, "steps_back": 2, "level_back": 0.01, "before_s": 1.8}
    b, eid = book_with_arm()
    assert not b.withdraw_returned(101.0, reach_steps=1, furthest_step=206, returned=lambda f: None)
    assert not b.withdraw_returned(101.0, reach_steps=1, furthest_step=208, returned=lambda f: evidence)  # window reached
    assert not b.withdraw_returned(101.0, reach_steps=1, furthest_step=206, returned=lambda f: evidence, confirm=lambda c, w: False)
    assert b.history.state(101.0, capture_in_flight=False).captures_last_hour == 1
    [(cid, why, events)] = b.withdraw_returned(101.0, reach_steps=1, furthest_step=206, returned=lambda f: evidence)
    assert cid == "c1" and "step 200" in why
    assert b.history.state(101.0, capture_in_flight=False).captures_last_hour == 0
    assert b.history.last_arm_unix_s is None and b.withdrawn == 1
    ep = b.find(eid)
    assert ep is not None and ep.close_reason == "returned" and ep.captures[-1].status == "withdrawn"
    assert [e.data["reason"] for e in events] == ["returned"]
    for other in (book_with_arm(ranks=(1,))[0], book_with_arm(pattern="cusum")[0]):
        assert not other.withdraw_returned(101.0, reach_steps=1, furthest_step=206, returned=lambda f: evidence)


def test_returned_wants_every_step_back_and_their_median_under_min_effect() -> None:
    """``returned``: None while the excursion goes on, after one step back, or when the steps after it sit on a
    new level (1.3x); the evidence once :data:`RETURN_STEPS` steps are back."""
    def watch(after: list[float]) -> RecurringInterruptions:
        rec = RecurringInterruptions()
        rec.reported(200, 204, 6.0, 1.8, 0.03)
        for i, x in enumerate(after):
            rec.observe(205 + i, x, 0.3, 6.0, 0.1)
        return rec

    assert watch([12.6]).returned(200, 0.1) is None
    assert watch([1.8]).returned(200, 0.1) is None
    assert watch([1.8 * 1.3, 1.8 * 1.3]).returned(200, 0.1) is None
    r = watch([1.8, 1.81]).returned(200, 0.1)
    assert r is not None and r.steps == 2 and r.last_step == 204 and abs(r.level) < 0.01
    assert watch([1.8, 1.81]).returned(199, 0.1) is None
    assert watch([1.8, 12.6]).returned(200, 0.1) is None  # it went on (merged)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow],
          phases=[Phase.explicit, Phase.reuse, Phase.generate])
@given(duration=st.integers(1, 5), factor=st.floats(2.0, 10.0), onset=st.integers(80, 300),
       cv=st.floats(0.01, 0.05), seed=st.integers(0, 2**16))
def test_a_single_excursion_that_returns_never_spends_a_capture(duration: int, factor: float, onset: int, cv: float,
                                                               seed: int) -> None:
    """Invariant: any single job-wide excursion of 1-5 steps at 2-10x that returns to the level (1.8 s steps,
    hold and lead 4 steps, so it ends at least 3 steps before a capture armed at its report could start: a step is
    judged once the next one arrives, and :data:`RETURN_STEPS` must be back) never results in a spent capture. A
    6-step one ends 2 steps before the window and keeps its capture (not covered here)."""
    res = replay_lines(lines(onset + 150, onset=onset, duration=duration, factor=factor, cv=cv, seed=seed))
    assert not spent(res), (res["arms"], res["withdrawn"])


def furthest_at(ls: list[str], at_unix_s: float) -> int:
    """The job's furthest step reported by ``at_unix_s`` (the replay's clock is the records' time)."""
    return max(r["step"] for r in map(json.loads, ls) if r["ts_unix_s"] <= at_unix_s)


def assert_one_arm_withdrawn_with_its_lead_left(ls: list[str], step_s: float) -> None:
    """Replayed ``ls`` armed once, that arm was withdrawn with no budget spent, and at its withdrawal its window
    was still at least the planner's lead at ``step_s`` seconds per step away."""
    res = replay_lines(ls)
    [arm] = res["arms"]
    [w] = res["withdrawn"]
    assert w["capture_id"] == arm["capture_id"] and not spent(res)
    at = furthest_at(ls, w["at_unix_s"])
    assert arm["start_step"] - at >= lead_steps(at, step_s, CaptureSettings())


def test_a_withdrawal_leaves_the_idle_config_time_to_reach_the_ranks() -> None:
    """A withdrawal writes the idle config over the arm; torch_npu reads it at its next poll, so it must leave the
    planner's lead (poll interval + margin_s, + margin_steps: the rule every config write follows) before the
    window. Armed at the lead alone, a 5-step 7x checkpoint at 1.8 s steps was withdrawn with the furthest step
    207 and the window at 208: the ranks ran the window and its data lay under a capture that said it was
    withdrawn before its window, never analysed. Now the window of such an arm starts WITHDRAW_SLACK_STEPS later
    and no withdrawal is made closer than the lead; the checkpoint is still withdrawn."""
    withdrawn = 0
    for duration in range(1, 9):
        ls = lines(400, onset=200, duration=duration, factor=7.0)
        res = replay_lines(ls)
        starts = {a["capture_id"]: a["start_step"] for a in res["arms"]}
        for w in res["withdrawn"]:
            at = furthest_at(ls, w["at_unix_s"])
            assert starts[w["capture_id"]] - at >= lead_steps(at, STEP_S, CaptureSettings()), (duration, at, starts)
            withdrawn += 1
    assert withdrawn >= 1


def test_no_withdrawal_inside_the_lead_or_without_a_step_time() -> None:
    """The book withdraws only with ``start_step - furthest_step >= reach_steps`` (and never without a reach)."""
    b = JobEpisodes("j", ArmingSettings(), ArmHistory())
    an = Anomaly("step_regression", "j", 204, (), 6.0,
                 {"pattern": "level", "first_step": 200, "baseline_s": 1.8, "step_time_s": 12.6})
    ep, _ = b.observe(an, 100.0)
    assert ep is not None
    b.history.record_arm(100.0, "c1")
    b.armed(ep.episode_id, "c1", 100.0, covered=None, start_step=211)
    evidence = {"first_step": 200, "last_elevated_step": 204, "steps_back": 2, "level_back": 0.01, "before_s": 1.8}
    assert not b.withdraw_returned(101.0, furthest_step=208, reach_steps=4, returned=lambda f: evidence)
    assert not b.withdraw_returned(101.0, furthest_step=207, reach_steps=None, returned=lambda f: evidence)
    assert b.withdraw_returned(101.0, furthest_step=207, reach_steps=4, returned=lambda f: evidence)


def dipped(factor: float, dip: tuple[int, ...], seed: int = 0) -> list[str]:
    """A lasting ``factor`` x change from step 200 whose steps ``dip`` are back at the level before it."""
    out = []
    for line in lines(420, onset=200, duration=None, factor=1.0, seed=seed):
        r = json.loads(line)
        if r["step"] >= 200 and r["step"] not in dip:
            r["step_time_s"] = round(r["step_time_s"] * factor, 6)
        out.append(json.dumps(r))
    return out


def test_a_lasting_change_that_dips_for_two_steps_after_its_report_is_still_captured() -> None:
    """A lasting 2x (or 7x) change whose first 2 steps after the report are back at the old level: the return
    seen on those 2 steps withdraws the capture, and the steps that follow, elevated again, went on (3 strays: the
    watch drops it as a change). Before, nothing reported it again (the detector's level was already the
    change's) and no capture of it was ever spent in the 216 steps after; now the watch reports it again as a new
    level from its first elevated step after the dip, and a capture covering it is spent."""
    for factor in (2.0, 7.0):
        for seed in range(3):
            res = replay_lines(dipped(factor, (205, 206), seed))
            assert res["withdrawn"], (factor, seed)
            again = [a for a in res["anomalies"] if a["kind"] == "step_regression" and a["step"] > 204]
            assert again and again[0]["detail"]["reference"] == "before_interruption", (factor, seed, again)
            assert again[0]["detail"]["first_step"] == 207 and again[0]["step"] <= 210, again[0]
            assert abs(again[0]["magnitude"] - (factor - 1.0)) <= 0.2 * factor, again[0]
            assert [a for a in spent(res) if a["start_step"] >= 207], (factor, seed, res["arms"])


def test_an_excursion_said_to_have_come_back_that_goes_on_is_a_new_level() -> None:
    """``returned`` vouched for the excursion on 2 steps back; more than REVERT_STRAYS elevated steps after them
    end the watch with a :class:`NewLevel` from the first of them (an excursion not vouched for is dropped
    silently, as before: its report stands)."""
    from profwatch.core.detection.interruptions import REVERT_STRAYS, NewLevel

    def run(vouch: bool) -> list[object]:
        rec = RecurringInterruptions()
        rec.reported(200, 204, 1.0, 1.8, 0.03)
        out = [rec.observe(205, 1.8, 0.3, 6.0, 0.1), rec.observe(206, 1.81, 0.3, 6.0, 0.1)]
        if vouch:
            assert rec.returned(200, 0.1) is not None
        out += [rec.observe(207 + i, 3.6, 0.3, 6.0, 0.1) for i in range(REVERT_STRAYS + 1)]
        return [o for o in out if o is not None]

    [new] = run(True)
    assert isinstance(new, NewLevel) and new.first_step == 207 and abs(new.level - 1.0) < 0.01
    assert new.before_s == 1.8 and new.steps == REVERT_STRAYS + 1
    assert run(False) == []


def test_a_fast_jobs_checkpoint_is_withdrawn_its_lead_planned_at_the_level_it_returns_to() -> None:
    """A 0.56 s job's first 5-step 6x checkpoint (``bench_corpus.py --healthy-hours``, ``interrupts`` seed 33,
    healthy run 3; its last step an evaluation at 25x): the detector's step time at the report already followed the risen steps, and the window was
    planned at it (7 steps ahead); the job came back with 3 steps left where the lead at 0.56 s is 7-8, too close
    to withdraw: a capture of a checkpoint. Planned at the level before the excursion, it is withdrawn, and a
    withdrawal still leaves the lead at that level; a 6x change that lasts keeps its capture."""
    recs = [json.loads(line) for line in lines(400, onset=200, duration=5, factor=6.0, step_s=0.56)]
    longer = next(r["step_time_s"] for r in recs if r["step"] == 204) * (25 / 6 - 1)
    for r in recs:  # its last step an evaluation too, 25x: the hold is the lead at that step's time
        if r["step"] == 204:
            r["step_time_s"], r["stages"] = r["step_time_s"] * 25 / 6, {k: v * 25 / 6 for k, v in r["stages"].items()}
        if r["step"] >= 204:
            r["ts_unix_s"] += longer
    assert_one_arm_withdrawn_with_its_lead_left([json.dumps(r) for r in recs], 0.56)
    lasting = replay_lines(lines(400, onset=200, duration=None, factor=6.0, step_s=0.56))
    assert not lasting["withdrawn"] and spent(lasting)


def test_an_evaluation_that_runs_on_past_its_report_is_withdrawn() -> None:
    """A 57 ms job's first unflagged evaluation, 42 steps at 2.3x (``bench_new_shapes.py --shapes eval_ckpt --seed 31``,
    run 0): reported 25 steps in (the spike hold at its 131 ms steps), it runs 17 steps past the report. Its window
    was planned 60 steps after the report (the lead at 57 ms, 55, and WITHDRAW_SLACK_STEPS): it came back with 42
    steps left, under that lead, and the capture was spent on healthy steps. The excursion's age at the report is
    now added to the window's lead: it is withdrawn, still the lead at 57 ms before the window; a 2.3x change that
    lasts keeps its capture, its window at most the lead and EXCURSION_RUN_FACTOR leads later."""
    assert_one_arm_withdrawn_with_its_lead_left(lines(700, onset=300, duration=42, factor=2.3, step_s=0.057), 0.057)
    lasting = replay_lines(lines(700, onset=300, duration=None, factor=2.3, step_s=0.057))
    [kept] = spent(lasting)
    assert not lasting["withdrawn"]
    assert kept["start_step"] <= kept["step"] + (1 + EXCURSION_RUN_FACTOR) * 55 + WITHDRAW_SLACK_STEPS


@pytest.mark.parametrize(("before", "now"), [(0.005, 5.0), (0.01, 30.0), (1e-6, 0.5), (1e-12, 1.0)])
def test_a_lasting_large_level_change_is_not_planned_at_a_level_far_below(before: float, now: float) -> None:
    """A job-wide level report at 1000-500,000x (or a degenerate ``baseline_s`` of 1e-12 s): its window opens
    within the lead planned at 1/``RETURN_PLAN_MAX_RATIO`` of the risen step time. Before, planned at the level
    before alone: 607 steps (51 minutes at the risen level) after a 1000x report, 307 (2.6 hours) after a 3000x
    one, 3e12 steps after the degenerate one, the capture in flight all the while."""
    cs = CaptureSettings()
    a = Anomaly("step_regression", "j", 1000, (), now / before - 1.0, {"pattern": "level", "baseline_s": before})
    req = capture_request(a, ArmDecision("arm", "ok", 2, 5, None, "x"), furthest_step=1000, step_time_s=now,
                          capture=cs)
    assert req.in_steps == lead_steps(1000, now / RETURN_PLAN_MAX_RATIO, cs) + WITHDRAW_SLACK_STEPS
    assert req.in_steps <= RETURN_PLAN_MAX_RATIO * lead_steps(1000, now, cs) + WITHDRAW_SLACK_STEPS
    # a 6x excursion (a checkpoint) is still planned at its level before
    six = Anomaly("step_regression", "j", 1000, (), 5.0, {"pattern": "level", "baseline_s": 0.56})
    req = capture_request(six, ArmDecision("arm", "ok", 2, 5, None, "x"), furthest_step=1000, step_time_s=3.36,
                          capture=cs)
    assert req.in_steps == lead_steps(1000, 0.56, cs) + WITHDRAW_SLACK_STEPS


def test_the_withdrawal_lead_is_the_planners_lead_at_the_planners_step_time() -> None:
    """One rule for the coordinator and replay (``withdrawal_lead``): the planner's lead at the detector's baseline,
    else at the registry's recent median (the step time ``CaptureShell.arm`` plans with); no step known or no
    positive finite step time measured: None (nothing withdrawn); the registry's -1 before any report is step 0."""
    cap = CaptureSettings()
    assert withdrawal_lead(100, STEP_S, 0.5, cap) == lead_steps(100, STEP_S, cap)  # the baseline comes first
    assert withdrawal_lead(100, None, 0.5, cap) == lead_steps(100, 0.5, cap)  # else the recent median
    assert lead_steps(100, 0.5, cap) != lead_steps(100, STEP_S, cap)
    assert withdrawal_lead(-1, STEP_S, None, cap) == lead_steps(0, STEP_S, cap)
    for furthest, base, recent in [(None, STEP_S, 9.0), (100, None, None), (100, 0.0, None), (100, None, 0.0),
                                   (100, None, float("nan")), (100, -1.0, None)]:
        assert withdrawal_lead(furthest, base, recent, cap) is None


def test_an_evaluation_that_runs_on_longer_than_its_age_is_withdrawn() -> None:
    """A 0.57 s job's first unflagged evaluation, 21 steps at 3.5x (``bench_new_shapes.py --shapes eval_ckpt --seed
    31``, run 2): reported 8 steps in (the spike hold), it runs 13 steps past the report, longer than its age. With
    one age added to the window's lead (the lead at 0.57 s is 8) it came back 6 steps before the window, under
    that lead, and the capture was spent on the evaluation. With EXCURSION_RUN_FACTOR ages it is withdrawn, the
    lead still left; a 3.5x change that lasts keeps its capture, its window at most that many leads later."""
    ls = lines(700, onset=300, duration=21, factor=3.5, step_s=0.57, cv=0.04)
    assert_one_arm_withdrawn_with_its_lead_left(ls, 0.57)
    lasting = replay_lines(lines(700, onset=300, duration=None, factor=3.5, step_s=0.57, cv=0.04))
    [kept] = spent(lasting)
    lead = lead_steps(kept["step"], 0.57, CaptureSettings())
    assert not lasting["withdrawn"]
    assert kept["start_step"] <= kept["step"] + (1 + EXCURSION_RUN_FACTOR) * lead + WITHDRAW_SLACK_STEPS
