"""A job-wide level that grows while its capture is in flight is a change of its own, never learned as the job's new
normal on that capture's ``no_suspect`` (daemon/profwatch/core/arming/episodes.py: ``_new_change``,
``_seen_by_flight``, ``_found_nobody``).

Seen in the e2e demo's ``reference`` scenario beside two CPU hogs: the hogs made the job +30 % slower, that episode's
capture was in flight when every rank got 3x slower; the 3x report was folded into the load episode, its capture
(taken before the 3x) found nobody, and the 3x level was learned as normal: the 3x was never captured."""

from __future__ import annotations

import pytest

from profwatch.core.alerts.event_types import TYPE_EPISODE_CLOSED, TYPE_EPISODE_OPENED, TYPE_LEVEL_LEARNED
from profwatch.core.arming.episodes import Episode, JobEpisodes
from profwatch.core.arming.policy import ArmingPolicy, ArmingSettings
from profwatch.core.detection.types import Anomaly
from tests.unit.straggler_load_sim import run_job

T0 = 100_000.0


def _reg(step: int, base: float, reached: float, first: int) -> Anomaly:
    return Anomaly("step_regression", "j", step, (), reached / base - 1.0,
                   {"pattern": "cusum", "baseline_s": base, "step_time_s": reached, "first_step": first})


def _load_captured(**s: float) -> tuple[JobEpisodes, ArmingPolicy, Episode]:
    """A job-wide +30 % (1.0 -> 1.3 s, onset step 90, reported at 100) and its capture ``c1`` of every rank armed,
    window from step 105, in flight."""
    settings = ArmingSettings(**{"cooldown_s": 900.0, "min_arm_gap_s": 60.0, "episode_quiet_steps": 20, **s})
    b, p = JobEpisodes("j", settings), ArmingPolicy(settings)
    load, _ = b.observe(_reg(100, 1.0, 1.3, 90), T0)
    assert load is not None
    b.advance(T0, furthest_step=100, step_time_s=1.3)
    picked = b.next_arm(p, T0, capture_in_flight=False)
    assert picked is not None and picked[0] is load
    b.history.record(picked[1], T0, "c1")
    b.armed(load.episode_id, "c1", T0, covered=None, start_step=105)
    return b, p, load


def _settle(b: JobEpisodes, t: float, first: int, step_time_s: float) -> list[str]:
    """Advance 100 steps at ``step_time_s`` (five times episode_quiet_steps); the event types."""
    return [e.type for s in range(first, first + 100, 5) for e in b.advance(t + s - first, furthest_step=s,
                                                                               step_time_s=step_time_s)]


def _arm(b: JobEpisodes, p: ArmingPolicy, now: float, cid: str) -> Episode | None:
    picked = b.next_arm(p, now, capture_in_flight=False)
    if picked is None:
        return None
    b.history.record(picked[1], now, cid)
    b.armed(picked[0].episode_id, cid, now, covered=None, start_step=10_000)
    return picked[0]


@pytest.mark.parametrize("report_s", [20.0, 59.0])  # mid-flight, and just before the capture ends (T0 + 60)
def test_a_3x_slowdown_while_the_load_level_is_captured_is_captured_not_learned(report_s: float) -> None:
    b, p, load = _load_captured()
    jump, evs = b.observe(_reg(130, 1.3, 3.0, 120), T0 + report_s)  # onset 120: after the window began (105)
    assert jump is not None and jump is not load, "folded into the load episode as an update"
    assert [e.type for e in evs] == [TYPE_EPISODE_CLOSED, TYPE_EPISODE_OPENED]
    assert load.close_reason == "new_change" and jump.reference_s == 1.3 and jump.captures == []
    assert b.next_arm(p, T0 + report_s, capture_in_flight=True) is None  # behind the capture in flight
    b.capture_ended("c1", T0 + 60, "no_suspect")
    types = _settle(b, T0 + 61, 140, 3.0)
    assert TYPE_LEVEL_LEARNED not in types, types  # nobody saw the 3x: it is no new normal
    assert jump.closed_unix_s is None and _arm(b, p, T0 + 160, "c2") is jump  # its own capture, after the gap


def test_a_3x_folded_into_the_captured_episode_is_captured_again_not_learned() -> None:
    """A 3x report whose evidence began before the episode's last report (not a new change point: an update) while
    the capture that began before it is in flight: that capture's no_suspect did not see it, so the 3x level is not
    learned; the episode, grown since its capture, is captured again as new (not held by that capture's cooldown)."""
    b, p, load = _load_captured()
    b.observe(_reg(125, 1.0, 1.3, 90), T0 + 20)  # the load level reported again at step 125
    folded, _ = b.observe(_reg(130, 1.3, 3.0, 120), T0 + 30)  # onset 120 <= 125: an update
    assert folded is load and load.level == pytest.approx(2.0) and load.captures[0].level == pytest.approx(0.3)
    b.capture_ended("c1", T0 + 60, "no_suspect")
    types = _settle(b, T0 + 61, 140, 3.0)
    assert TYPE_LEVEL_LEARNED not in types and load.closed_unix_s is None, types
    assert _arm(b, p, T0 + 161, "c2") is load  # not captured_unchanged (it grew since c1), nor held by c1's cooldown
    assert [c.capture_id for c in load.captures] == ["c1", "c2"]


def test_a_level_grown_past_a_capture_that_named_a_rank_still_waits_for_its_cooldown() -> None:
    """The same fold, but the capture named rank 2: the growth is the episode's as before (captured again once its
    cooldown is over), only a capture that found nobody leaves a grown level uncaptured."""
    b, p, load = _load_captured()
    b.observe(_reg(125, 1.0, 1.3, 90), T0 + 20)
    b.observe(_reg(130, 1.3, 3.0, 120), T0 + 30)
    b.capture_ended("c1", T0 + 60, "ok", named=(2,))
    _settle(b, T0 + 61, 140, 3.0)
    assert b.next_arm(p, T0 + 200, capture_in_flight=False) is None and load.waiting == "cooldown"
    assert _arm(b, p, T0 + 901, "c2") is load


def test_a_3x_that_began_before_the_window_is_seen_by_the_capture_and_learned_when_it_finds_nobody() -> None:
    """Armed, waiting for its window (from step 105): a 3x from step 103 is an update the window records; when that
    capture finds nobody, the 3x level it saw is the job's new normal (no second capture)."""
    b, _, load = _load_captured()
    folded, _ = b.observe(_reg(104, 1.3, 3.0, 103), T0 + 5)
    assert folded is load and load.captures[0].level == pytest.approx(2.0)
    b.capture_ended("c1", T0 + 60, "no_suspect")
    events = [e for s in range(140, 240, 5) for e in b.advance(T0 + s, furthest_step=s, step_time_s=3.0)]
    learned = [e for e in events if e.type == TYPE_LEVEL_LEARNED]
    assert len(learned) == 1 and learned[0].data["new_level_s"] == 3.0 and learned[0].data["capture_id"] == "c1"


def test_growth_under_recapture_growth_while_in_flight_is_still_learned() -> None:
    """+5 % more on the +30 % level (1.3 -> 1.365 s) after the window began: under recapture_growth (10 %), an
    update; the capture's no_suspect makes the level the job's new normal as before."""
    b, _, load = _load_captured()
    folded, _ = b.observe(_reg(130, 1.3, 1.365, 120), T0 + 20)
    assert folded is load
    b.capture_ended("c1", T0 + 60, "no_suspect")
    events = [e for s in range(140, 240, 5) for e in b.advance(T0 + s, furthest_step=s, step_time_s=1.365)]
    assert [e.type for e in events] == [TYPE_LEVEL_LEARNED, TYPE_EPISODE_CLOSED]
    assert events[0].data["new_level_s"] == 1.365 and events[1].data["reason"] == "level_learned"


def test_a_rank_change_while_a_job_wide_capture_is_in_flight_is_its_own_episode() -> None:
    """Rank 2 +40 % from step 120 (after the job-wide window began at 105) while the load episode's capture is in
    flight: its own episode, not covered by that capture (which found nobody), captured after it; the load level is
    still learned."""
    b, p, load = _load_captured()
    rank, _ = b.observe(Anomaly("rank_outlier", "j", 130, (2,), 0.4,
                                {"stage": {2: "forward"}, "excess": {2: 0.4}, "first_step": 120}), T0 + 20)
    assert rank is not None and rank is not load and rank.captures == [] and load.ranks == ()
    b.capture_ended("c1", T0 + 60, "no_suspect")
    assert load.closed_unix_s is None and rank.captures == []
    ongoing = {"rank_outlier": frozenset({2})}
    events = [e for s in range(140, 240, 5)
              for e in b.advance(T0 + s, furthest_step=s, step_time_s=1.3, ongoing=ongoing)]
    assert TYPE_LEVEL_LEARNED in [e.type for e in events] and load.close_reason == "level_learned"
    assert _arm(b, p, T0 + 240, "c2") is rank


def test_the_demo_reference_sequence_under_cpu_load_captures_the_3x() -> None:
    """The e2e failure, replayed through the detector (tests/unit/straggler_load_sim.py, zero-code step times): the
    job +30 % at 120 s (CPU hogs), its capture's verdict 60 steps after its window (analysis time), every rank 3x at
    140 s while that capture is in flight. The 3x is captured by an arm after its onset; the only level learned
    after it is the one the 3x's own capture found nobody behind."""
    res = run_job(420, lambda r, t: 1.0, load=False, stages=False, verdict_steps=60,
                  job_factor=lambda t: 3.0 if t >= 140.0 else (1.3 if t >= 120.0 else 1.0))
    assert res.arms and res.arms[0]["t"] >= 120.0 and res.arms[0]["t"] < 140.0, res.arms  # the load level's
    assert any(a["t"] > 140.0 for a in res.arms), res.arms  # the 3x's own capture
    first = res.arms[0]["episode"]
    learned = [e.data for e in res.events if e.type == TYPE_LEVEL_LEARNED]
    assert all(d["episode_id"] != first or d["new_level_s"] < 0.5 * 1.3 * 1.1 for d in learned), learned
