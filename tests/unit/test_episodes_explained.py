"""A known slow rank explains the job-wide changes host load makes around it (daemon/profwatch/core/arming/episodes.py,
``EXPLAINED_GROWTH``): one capture, not the hourly budget; a genuinely new change is still captured."""

from __future__ import annotations

import pytest

from profwatch.core.arming.episodes import Episode, JobEpisodes
from profwatch.core.arming.policy import ArmingPolicy, ArmingSettings
from profwatch.core.detection.types import Anomaly
from tests.unit.straggler_load_sim import run_job

T0 = 100_000.0


def _reg(step: int, base: float, reached: float) -> Anomaly:
    return Anomaly("step_regression", "j", step, (), reached / base - 1.0,
                   {"pattern": "cusum", "baseline_s": base, "step_time_s": reached, "first_step": step - 20})


def _arm(b: JobEpisodes, p: ArmingPolicy, now: float, cid: str) -> Episode | None:
    picked = b.next_arm(p, now, capture_in_flight=False)
    if picked is None:
        return None
    ep, d = picked
    b.history.record(d, now, cid)
    b.armed(ep.episode_id, cid, now, covered=None)
    return ep


def _slow_rank_named(settings: ArmingSettings, *, excess: bool) -> tuple[JobEpisodes, ArmingPolicy, Episode]:
    """A book whose rank 1 outlier episode (2x, stage timings; ``excess``: with its excess) was captured at ``T0``
    by ``c1`` and named by its verdict at ``T0 + 60``, and the policy that armed it."""
    b, p = JobEpisodes("j", settings), ArmingPolicy(settings)
    detail: dict = {"stage": {1: "compute"}, **({"excess": {1: 2.0}} if excess else {})}
    slow, _ = b.observe(Anomaly("rank_outlier", "j", 100, (1,), 2.0, detail), T0)
    b.advance(T0, furthest_step=100, step_time_s=1.3, ongoing={"rank_outlier": frozenset({1})})
    assert slow is not None and _arm(b, p, T0, "c1") is slow
    b.capture_ended("c1", T0 + 60, "ok", named=(1,))
    return b, p, slow


def test_a_job_wide_change_within_the_known_slow_ranks_share_waits_and_a_large_one_is_captured() -> None:
    settings = ArmingSettings(cooldown_s=900, min_arm_gap_s=60)
    b, p, slow = _slow_rank_named(settings, excess=True)
    # the host gets 40 % busier: every step waits for rank 1 all the same
    load, evs = b.observe(_reg(400, 1.3, 1.82), T0 + 300)
    assert load is not None and load.explained_by == slow.episode_id
    assert [e.data.get("reason") for e in evs if e.type.endswith("updated.v1")] == ["explained"]
    assert _arm(b, p, T0 + 300, "c2") is None and load.waiting == "explained_by_ranks"
    assert Episode.from_json(load.to_json()).explained_by == slow.episode_id
    # rank 1 itself got twice as slow (its excess 2.0 -> 5.0): still its own finding, not the job's
    b.observe(Anomaly("rank_outlier", "j", 500, (1,), 5.0, {"stage": {1: "compute"}, "excess": {1: 5.0}}), T0 + 400)
    b.observe(_reg(500, 1.82, 3.6), T0 + 400)
    assert load.explained_by == slow.episode_id
    # the whole job 2x slower on top: +100 % with rank 1's share taken out, captured as a change of its own
    evs = b.observe(_reg(700, 3.6, 7.2), T0 + 500)[1]
    assert load.explained_by == "" and "unexplained" in [e.data.get("reason") for e in evs]
    assert _arm(b, p, T0 + 500, "c3") is load


def test_without_a_ranked_episode_a_whole_job_verdict_explains_for_an_hour_within_the_level_band() -> None:
    settings = ArmingSettings(cooldown_s=900, min_arm_gap_s=60)
    b, p = JobEpisodes("j", settings), ArmingPolicy(settings)
    first, _ = b.observe(_reg(100, 0.5, 1.3), T0)  # zero-code: a 3x rank seen only as the job's step time
    assert first is not None and _arm(b, p, T0, "c1") is first
    b.advance(T0 + 50, furthest_step=150, step_time_s=1.3)
    b.capture_ended("c1", T0 + 60, "ok", named=(1,))
    load, _ = b.observe(_reg(400, 1.3, 1.7), T0 + 300)  # +31 %: host load
    assert load is not None and load.explained_by == "c1" and _arm(b, p, T0 + 300, "c2") is None
    b.advance(T0 + 3700, furthest_step=3000, step_time_s=1.7)  # an hour after the verdict: confirmed once more
    assert load.explained_by == "" and _arm(b, p, T0 + 3700, "c2") is load


def test_the_mark_goes_when_the_slow_ranks_episode_ends_or_a_verdict_names_another_rank() -> None:
    settings = ArmingSettings(cooldown_s=900, min_arm_gap_s=60, episode_quiet_steps=20)
    b, p, slow = _slow_rank_named(settings, excess=False)
    load, _ = b.observe(_reg(400, 1.3, 1.6), T0 + 300)
    assert load is not None and load.explained_by
    b.capture_ended("c9", T0 + 310, "ok", named=(3,))  # a verdict (another episode's) names rank 3: not known
    b.advance(T0 + 311, furthest_step=410, step_time_s=1.6, ongoing={"rank_outlier": frozenset({1})})
    assert load.explained_by == "" and _arm(b, p, T0 + 311, "c2") is load


@pytest.mark.parametrize("stages", [True, False], ids=["stages", "zero_code"])
@pytest.mark.parametrize("seed", [31, 32, 33])
def test_a_persistent_3x_rank_under_wandering_host_load_takes_at_most_two_captures_an_hour(seed: int,
                                                                                          stages: bool) -> None:
    """4-rank synchronous job, rank 1 3x from 300 s and left slow, host load x0.9-1.3 every 2-6 minutes: before,
    every load move re-opened a job-wide change naming rank 1 again, 4 captures an hour (the hourly cap), with stage
    timings (a rank outlier episode holds rank 1) or without (zero-code: only job-wide changes)."""
    res = run_job(3600, lambda r, t: 3.0 if r == 1 and t >= 300 else 1.0, seed=seed, stages=stages)
    assert 1 <= len(res.arms) <= 2, res.arms
    assert res.arms[0]["named"] == [1] and 300 <= res.arms[0]["t"] <= 360


@pytest.mark.parametrize("stages", [True, False], ids=["stages", "zero_code"])
@pytest.mark.parametrize("seed", [31, 33])
def test_the_whole_job_2x_slower_on_top_of_a_known_slow_rank_is_captured(seed: int, stages: bool) -> None:
    res = run_job(3600, lambda r, t: 3.0 if r == 1 and t >= 300 else 1.0, seed=seed, stages=stages,
                  job_factor=lambda t: 2.0 if t >= 1800 else 1.0)
    assert [a for a in res.arms if 1800 <= a["t"] <= 1900 and a["kind"] == "step_regression"], res.arms


@pytest.mark.parametrize("stages", [True, False], ids=["stages", "zero_code"])
@pytest.mark.parametrize("seed", [31, 33])
def test_a_second_rank_going_slow_later_is_captured(seed: int, stages: bool) -> None:
    """Rank 2 5x slower from 1800 s on top of rank 1's 3x: its own change, captured with rank 2 named."""
    res = run_job(3600, lambda r, t: 3.0 if r == 1 and t >= 300 else 5.0 if r == 2 and t >= 1800 else 1.0,
                  seed=seed, stages=stages)
    assert [a for a in res.arms if 1800 <= a["t"] <= 2100 and 2 in (a.get("named") or [])], res.arms


@pytest.mark.parametrize("seed", [31, 32])
def test_a_change_after_the_slow_rank_healed_is_captured(seed: int) -> None:
    """Zero-code: rank 1 3x from 300 s to 1500 s, then the whole job 1.6x from 2400 s: the job is far below the
    level the verdict named rank 1 at, so the +60 % is not the healed rank's and is captured."""
    res = run_job(3600, lambda r, t: 3.0 if r == 1 and 300 <= t < 1500 else 1.0, seed=seed, stages=False,
                  job_factor=lambda t: 1.6 if t >= 2400 else 1.0)
    assert [a for a in res.arms if 2400 <= a["t"] <= 2500 and a["kind"] == "step_regression"], res.arms


def _found_normal(settings: ArmingSettings) -> tuple[JobEpisodes, ArmingPolicy]:
    """A book whose job-wide change (1.0 s -> 1.3 s at step 100) was captured at ``T0`` by ``c1``, a capture of
    every rank, whose verdict at ``T0 + 60`` found nobody (``no_suspect``); and the policy that armed it."""
    b, p = JobEpisodes("j", settings), ArmingPolicy(settings)
    first, _ = b.observe(_reg(100, 1.0, 1.3), T0)
    assert first is not None and _arm(b, p, T0, "c1") is first
    b.advance(T0 + 50, furthest_step=150, step_time_s=1.3)
    b.capture_ended("c1", T0 + 60, "no_suspect")
    return b, p


def _restarted(b: JobEpisodes, settings: ArmingSettings) -> JobEpisodes:
    """A coordinator restart: a fresh book seeded one stored row at a time, oldest first (the episode desk's start)."""
    fresh = JobEpisodes("j", settings, b.history)
    for ep in sorted([*b.closed, *b.open.values()], key=lambda e: e.opened_unix_s):
        fresh.restore([Episode.from_json(ep.to_json())])
    return fresh


def test_a_restart_keeps_what_explains_a_job_wide_change_with_stage_timings() -> None:
    """Before, the restored book forgot the verdict that named rank 1: the explained change read 'no longer
    explained by a known slow rank' at the first advance and was captured again, naming rank 1 once more."""
    settings = ArmingSettings(cooldown_s=900, min_arm_gap_s=60)
    b, p, slow = _slow_rank_named(settings, excess=True)
    load, _ = b.observe(_reg(400, 1.3, 1.82), T0 + 300)
    assert load is not None and load.explained_by == slow.episode_id
    r = _restarted(b, settings)
    evs = r.advance(T0 + 400, furthest_step=420, step_time_s=1.82, ongoing={"rank_outlier": frozenset({1})})
    assert "unexplained" not in [e.data.get("reason") for e in evs]
    again = r.find(load.episode_id)
    assert again is not None and again.explained_by == slow.episode_id and _arm(r, p, T0 + 1000, "c2") is None
    # the whole job 2x slower on top is still captured after the restart
    r.observe(_reg(700, 1.82, 3.64), T0 + 1100)
    assert again.explained_by == "" and _arm(r, p, T0 + 1100, "c2") is again


def test_a_restart_keeps_a_whole_job_verdict_for_its_hour_and_forgets_it_after_a_new_generation() -> None:
    settings = ArmingSettings(cooldown_s=900, min_arm_gap_s=60)
    b, p = JobEpisodes("j", settings), ArmingPolicy(settings)
    first, _ = b.observe(_reg(100, 0.5, 1.3), T0)  # zero-code: a 3x rank seen only as the job's step time
    assert first is not None and _arm(b, p, T0, "c1") is first
    b.advance(T0 + 50, furthest_step=150, step_time_s=1.3)
    b.capture_ended("c1", T0 + 60, "ok", named=(1,))
    load, _ = b.observe(_reg(400, 1.3, 1.7), T0 + 300)
    assert load is not None and load.explained_by == "c1"
    r = _restarted(b, settings)
    r.advance(T0 + 400, furthest_step=500, step_time_s=1.7)
    again = r.find(load.episode_id)
    assert again is not None and again.explained_by == "c1" and _arm(r, p, T0 + 400, "c2") is None
    r.advance(T0 + 3700, furthest_step=3000, step_time_s=1.7)  # the verdict's hour is over: confirmed once more
    assert again.explained_by == "" and _arm(r, p, T0 + 3700, "c2") is again
    # a new generation forgets the old run's verdict, a restart after it too
    b.new_run(T0 + 500, "new_generation")
    b.observe(_reg(900, 1.3, 1.7), T0 + 800)
    r = _restarted(b, settings)
    assert r._verdict is None and r._last_named == ()


@pytest.mark.xfail(strict=True, reason="undecidable from zero-code data: the hook sends each rank's time between "
                   "optimizer steps (rankhook/autoinstall.py: no stages, no waits, no work), the same on every rank of "
                   "a synchronous job, so all there is is the job step time. Rank 1's heal is a -24 % fall, inside "
                   "what host load does (x0.9-1.3: falls to -31 %), and leaves the job within +50 % of the verdict's "
                   "level; a new +40 % job-wide change reaching that level again looks like the rank (or load) coming "
                   "back, so it is explained by the verdict until its hour ends (seeds 34, 36: captured at 3912-3917 "
                   "s, some 40 minutes late). Dropping the verdict on such a fall would re-capture a mild rank that "
                   "persists under load each time the load falls")
@pytest.mark.parametrize("seed", [34, 36])
def test_a_job_wide_change_after_a_mild_slow_rank_healed_is_captured_without_stage_timings(seed: int) -> None:
    """Zero-code: rank 1 1.4x from 300 s to 1200 s (captured, the verdict names it), then the whole job 1.4x from
    1500 s: a software change of its own, expected captured within 200 s of its onset."""
    res = run_job(1800, lambda r, t: 1.4 if r == 1 and 300 <= t < 1200 else 1.0, seed=seed, stages=False,
                  job_factor=lambda t: 1.4 if t >= 1500 else 1.0)
    assert [a for a in res.arms if 1500 <= a["t"] <= 1700 and a["kind"] == "step_regression"], res.arms


def test_a_job_wide_change_within_host_load_behind_a_known_slow_rank_is_captured_within_the_verdicts_hour() -> None:
    """Stage timings, rank 1 3x from 300 s and left slow, the whole job 1.4x from 1800 s (seed 50): the change sits
    inside what host load does (+-45 %), so it is explained at first; before, the ranked episode explained it for as
    long as rank 1 stayed slow (never captured in 4,500 s). Now a verdict explains for an hour, as without stage
    timings: the change is captured by the verdict's hour (rank 1 named at ~300 s)."""
    res = run_job(4200, lambda r, t: 3.0 if r == 1 and t >= 300 else 1.0, seed=50, stages=True,
                  job_factor=lambda t: 1.4 if t >= 1800 else 1.0)
    first = next(a for a in res.arms if a.get("named") == [1])
    assert [a for a in res.arms if 1800 <= a["t"] <= first["t"] + 3600 + 200 and a["kind"] == "step_regression"], \
        res.arms


def test_a_stored_reference_of_zero_or_not_a_number_is_dropped_not_divided_by() -> None:
    settings = ArmingSettings(cooldown_s=900, min_arm_gap_s=60)
    b, p, slow = _slow_rank_named(settings, excess=False)
    load, _ = b.observe(_reg(400, 1.3, 1.82), T0 + 300)
    assert load is not None and load.explained_by
    rows = [e.to_json() for e in (slow, load)]
    rows[0]["confirmed"] = [0.0, 0.0]
    rows[0]["captures"][0].update(job_step_s=0.0, verdict_unix_s=float("nan"))
    r = JobEpisodes("j", settings, b.history)
    r.restore([Episode.from_json(row) for row in rows])
    assert r.find(slow.episode_id).confirmed is None  # type: ignore[union-attr]
    r.advance(T0 + 400, furthest_step=420, step_time_s=1.82, ongoing={"rank_outlier": frozenset({1})})
    assert r.find(load.episode_id).explained_by == ""  # type: ignore[union-attr]  # nothing left to explain it


@pytest.mark.xfail(strict=True, reason="undecidable from zero-code data: the hook sends each rank's time between "
                   "optimizer steps (rankhook/autoinstall.py: no stages, no waits), the same on every rank of a "
                   "synchronous job, so the job step time is all there is; rank 2 (3.5x on rank 1's 3x) moves it +17 %, "
                   "a move host load makes every 2-6 minutes (x0.9-1.3), so it is explained by the verdict naming rank "
                   "1 until that verdict's hour ends (seeds 37-56: rank 2 named 953-2,522 s after its onset, 19 of 20 "
                   "at the hour). Capturing such moves instead spends the budget on rank 1 (the persistent-rank test's "
                   "at most 2 captures an hour); with stage timings rank 2 is named 12 s after its onset")
def test_a_second_slow_rank_that_moves_the_job_little_is_named_soon_without_stage_timings() -> None:
    """Zero-code: rank 1 3x from 300 s, rank 2 3.5x from 1800 s (the job +17 %): expected named within 300 s."""
    res = run_job(2400, lambda r, t: 3.0 if r == 1 and t >= 300 else 3.5 if r == 2 and t >= 1800 else 1.0,
                  seed=37, stages=False)
    assert [a for a in res.arms if 1800 <= a["t"] <= 2100 and 2 in (a.get("named") or [])], res.arms


def test_a_whole_job_capture_armed_before_a_restart_still_explains_when_its_verdict_comes_after() -> None:
    """Zero-code: the capture of every rank is in flight when the coordinator restarts (its flight is not kept);
    its verdict naming rank 1 comes after. Before, it was taken for a targeted capture and explained nothing: the
    next host-load move was captured again, naming rank 1 once more."""
    settings = ArmingSettings(cooldown_s=900, min_arm_gap_s=60)
    b, p = JobEpisodes("j", settings), ArmingPolicy(settings)
    first, _ = b.observe(_reg(100, 0.5, 1.3), T0)
    assert first is not None and _arm(b, p, T0, "c1") is first
    r = _restarted(b, settings)
    r.advance(T0 + 50, furthest_step=150, step_time_s=1.3)
    r.capture_ended("c1", T0 + 60, "ok", named=(1,))
    load, _ = r.observe(_reg(400, 1.3, 1.7), T0 + 300)
    assert load is not None and load.explained_by == "c1" and _arm(r, p, T0 + 300, "c2") is None


def test_a_level_a_capture_of_every_rank_found_normal_explains_load_moves_for_an_hour_but_not_a_larger_jump() -> None:
    """A job-wide change captured and found nobody (``no_suspect``) at 1.3 s: a later move from 1.2 s to 1.6 s
    (+33 %, +23 % over that level) is host load's, not captured, for the verdict's hour; a jump of +60 % from its
    reference is captured at once. Before, every such move was captured again, each finding nobody."""
    settings = ArmingSettings(cooldown_s=900, min_arm_gap_s=60)
    b, p = _found_normal(settings)
    b.observe(_reg(300, 1.3, 1.2), T0 + 200)  # a fall (the detector re-learned at 1.2 s)
    b.advance(T0 + 250, furthest_step=400, step_time_s=1.2)
    move, evs = b.observe(_reg(500, 1.2, 1.6), T0 + 400)
    assert move is not None and move.explained_by == "c1"
    assert [e.data.get("named") for e in evs if e.data.get("reason") == "explained"] == [[]]
    assert _arm(b, p, T0 + 400, "c2") is None and move.waiting == "explained_by_level"
    b.advance(T0 + 3700, furthest_step=3000, step_time_s=1.6)  # the verdict's hour is over: confirmed once more
    assert move.explained_by == "" and _arm(b, p, T0 + 3700, "c2") is move
    # a jump larger than host load makes is a change of its own, even inside the hour of a verdict that found nobody
    b2, p2 = _found_normal(settings)
    b2.observe(_reg(300, 1.3, 1.0), T0 + 200)
    jump, _ = b2.observe(_reg(500, 1.0, 1.6), T0 + 400)
    assert jump is not None and jump.explained_by == "" and _arm(b2, p2, T0 + 400, "c2") is jump


@pytest.mark.parametrize("seed", [31, 32, 33, 34])
def test_host_load_moves_alone_take_at_most_one_capture_an_hour(seed: int) -> None:
    """Zero-code (stage timings change nothing here: no rank is slow), host load x0.9-1.3 every 2-6 minutes, no
    slow rank: before, each move was a new job-wide change, captured and found nobody, 3-5 captures an hour."""
    res = run_job(3600, lambda r, t: 1.0, seed=seed, stages=False)
    assert len(res.arms) <= 1, res.arms
    assert all(not a["named"] for a in res.arms)


@pytest.mark.parametrize("stages", [True, False], ids=["stages", "zero_code"])
@pytest.mark.parametrize("seed", [31, 33])
def test_a_slow_rank_after_load_moves_found_normal_is_captured_at_once(seed: int, stages: bool) -> None:
    """The load simulation's first move is captured and found nobody; rank 1 3x from 2400 s, inside that verdict's
    hour, is captured and named within 60 s (a rank outlier with stage timings, the job +160 % without)."""
    res = run_job(3000, lambda r, t: 3.0 if r == 1 and t >= 2400 else 1.0, seed=seed, stages=stages)
    assert not res.arms[0]["named"] and res.arms[0]["t"] < 1800, res.arms
    assert [a for a in res.arms if 2400 <= a["t"] <= 2460 and a["named"] == [1]], res.arms


def test_a_restart_keeps_the_level_a_capture_of_every_rank_found_normal() -> None:
    settings = ArmingSettings(cooldown_s=900, min_arm_gap_s=60)
    b, p = _found_normal(settings)
    r = _restarted(b, settings)
    r.observe(_reg(300, 1.3, 1.2), T0 + 200)
    move, _ = r.observe(_reg(500, 1.2, 1.6), T0 + 400)
    assert move is not None and move.explained_by == "c1" and _arm(r, p, T0 + 400, "c2") is None
    assert move.waiting == "explained_by_level"


def test_a_move_a_level_found_normal_explains_is_not_learned_on_that_capture() -> None:
    """Explained by the capture that found nobody and held at its level for ``episode_quiet_steps``: it stays open
    as ``explained_by_level`` (a change never captured itself is no new normal on another capture's verdict)."""
    settings = ArmingSettings(cooldown_s=900, min_arm_gap_s=60, episode_quiet_steps=20)
    b, p = _found_normal(settings)
    b.observe(_reg(300, 1.3, 1.2), T0 + 200)
    move, _ = b.observe(_reg(500, 1.2, 1.6), T0 + 400)
    assert move is not None and move.explained_by == "c1"
    b.advance(T0 + 410, furthest_step=510, step_time_s=1.6)
    evs = b.advance(T0 + 440, furthest_step=530, step_time_s=1.6)
    assert not [e for e in evs if e.type.endswith("level_learned.v1")] and move.closed_unix_s is None
    assert _arm(b, p, T0 + 440, "c2") is None and move.waiting == "explained_by_level"


def test_a_job_wide_move_a_level_found_normal_explains_is_captured_once_its_hour_is_over() -> None:
    """The job captured at 1.3 s and found nobody (c1, T0 + 60), then 1.2 s -> 1.68 s at T0 + 400 (+40 % from its
    reference, +29 % over the verdict's level): explained by that level for the verdict's hour, then captured once.
    Before, it was closed as ``level_learned`` on c1's verdict once it held 50 steps (T0 + 500) and never captured:
    a job-wide slowdown of +30-45 % starting within that hour was lost for good (the what-changed verdict compares
    captures, and none was taken); at 5df09c5 it was captured at once."""
    settings = ArmingSettings(cooldown_s=900, min_arm_gap_s=60)
    b, p = _found_normal(settings)
    b.observe(_reg(300, 1.3, 1.2), T0 + 200)
    b.advance(T0 + 250, furthest_step=400, step_time_s=1.2)
    move, _ = b.observe(_reg(500, 1.2, 1.68), T0 + 400)
    assert move is not None and move.explained_by == "c1"
    armed = None
    for k in range(1, 331):  # 6 steps per 10 s (1.68 s a step), for the verdict's hour and a bit
        now = T0 + 400 + 10 * k
        b.advance(now, furthest_step=500 + 6 * k, step_time_s=1.68)
        armed = armed or _arm(b, p, now, f"c{k + 1}")
    assert armed is move and move.closed_unix_s is None, (move.close_reason, move.closed_unix_s)
    assert move.captures[0].armed_unix_s >= T0 + 60 + 3600  # not before the verdict's hour ended


@pytest.mark.parametrize("restart", ["none", "in_flight", "after_verdict"])
def test_a_whole_job_verdict_is_judged_at_its_windows_step_time_not_at_its_arrival(restart: str) -> None:
    """A capture of every rank armed (its window planned) at 1.0 s per step finds nobody; its verdict comes after
    the job slowed to 1.45 s while the analysis ran. The level it found normal is its window's, 1.0 s
    (``EpisodeCapture.job_step_s``, kept across a restart): a later move to 1.9 s (+31 % from 1.45 s, +90 % over
    what the capture saw) is a change of its own and captured. Before, the verdict took the job step time at its
    arrival (1.45 s) and explained the move away as host load's for the hour."""
    settings = ArmingSettings(cooldown_s=900, min_arm_gap_s=60)
    b, p = JobEpisodes("j", settings), ArmingPolicy(settings)
    first, _ = b.observe(_reg(100, 0.8, 1.0), T0)
    b.advance(T0, furthest_step=100, step_time_s=1.0)
    assert first is not None and _arm(b, p, T0, "c1") is first
    assert [c.job_step_s for c in first.captures] == [1.0]
    b.advance(T0 + 50, furthest_step=150, step_time_s=1.45)  # the job slowed after the window
    if restart == "in_flight":
        b = _restarted(b, settings)
        b.advance(T0 + 55, furthest_step=155, step_time_s=1.45)
    b.capture_ended("c1", T0 + 60, "no_suspect")
    if restart == "after_verdict":
        b = _restarted(b, settings)
        b.advance(T0 + 65, furthest_step=160, step_time_s=1.45)
    move, _ = b.observe(_reg(400, 1.45, 1.9), T0 + 300)
    assert move is not None and move.explained_by == "" and _arm(b, p, T0 + 300, "c2") is move


def test_a_capture_keeps_the_step_time_its_window_was_planned_on() -> None:
    """The arm path hands ``armed`` the planner's step time (the coordinator's falls back to the registry's recent
    median while the detector has no baseline): that is the window's, not the one the last advance was given; none
    given, the advance's; neither known, none until the verdict (then the step time at the verdict)."""
    settings = ArmingSettings(cooldown_s=900, min_arm_gap_s=60)
    b, p = JobEpisodes("j", settings), ArmingPolicy(settings)
    first, _ = b.observe(_reg(100, 0.8, 1.0), T0)
    picked = b.next_arm(p, T0, capture_in_flight=False)
    assert first is not None and picked is not None and picked[0] is first
    b.history.record(picked[1], T0, "c1")
    b.armed(first.episode_id, "c1", T0, covered=None, step_time_s=1.1)
    b.advance(T0 + 50, furthest_step=150, step_time_s=1.45)
    b.capture_ended("c1", T0 + 60, "no_suspect")
    assert [(c.job_step_s, c.verdict_unix_s) for c in first.captures] == [(1.1, T0 + 60)]
    b2, p2 = JobEpisodes("j", settings), ArmingPolicy(settings)
    second, _ = b2.observe(_reg(100, 0.8, 1.0), T0)
    assert second is not None and _arm(b2, p2, T0, "c1") is second and second.captures[0].job_step_s is None
    b2.advance(T0 + 50, furthest_step=150, step_time_s=1.45)
    b2.capture_ended("c1", T0 + 60, "no_suspect")
    assert second.captures[0].job_step_s == 1.45


@pytest.mark.parametrize("restart", [False, True])
def test_a_verdict_of_the_previous_generations_capture_explains_nothing_in_the_new_one(restart: bool) -> None:
    """A capture of every rank armed in generation 0 (1.0 s per step) is still analysed when the job starts
    generation 1 (``new_run``: an analysing capture finishes, ``CaptureShell.supersede_generation``); its verdict,
    nobody, comes in the new run at 1.1 s. The new run forgot the old run's verdicts (``new_run``,
    ``_restore_verdict``): a move of the new run to 1.4 s (+27 %) is captured as a change of its own, as it is
    without that late verdict. Before, the late verdict became the new run's latest and explained the move away
    as host load's for the hour (and again after a restart)."""
    settings = ArmingSettings(cooldown_s=900, min_arm_gap_s=60)
    b, p = JobEpisodes("j", settings), ArmingPolicy(settings)
    first, _ = b.observe(_reg(100, 0.8, 1.0), T0)
    b.advance(T0, furthest_step=100, step_time_s=1.0)
    assert first is not None and _arm(b, p, T0, "c1") is first
    b.new_run(T0 + 30, "new_generation")
    b.advance(T0 + 40, furthest_step=10, step_time_s=1.1)
    b.capture_ended("c1", T0 + 60, "no_suspect")
    if restart:
        b = _restarted(b, settings)
        b.advance(T0 + 65, furthest_step=30, step_time_s=1.1)
    move, _ = b.observe(_reg(300, 1.1, 1.4), T0 + 300)
    assert move is not None and move.explained_by == "" and _arm(b, p, T0 + 300, "c2") is move
