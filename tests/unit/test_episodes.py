"""Tests of daemon/profwatch/core/arming/episodes.py (pure; fake clock: times are plain numbers)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from profwatch.core.arming.episodes import Episode, JobEpisodes, episode_key, value_key
from profwatch.core.arming.policy import ArmingPolicy, ArmingSettings
from profwatch.core.arming.targeting import JobTopology
from profwatch.core.detection.types import Anomaly

T0 = 100_000.0


def reg(step: int, mag: float = 0.25, base: float = 1.0) -> Anomaly:
    return Anomaly("step_regression", "j", step, (), mag, {"pattern": "cusum", "baseline_s": base})


def out(step: int, ranks: tuple[int, ...], mag: float = 0.5, stage: str = "forward") -> Anomaly:
    return Anomaly("rank_outlier", "j", step, ranks, mag, {"stage": {r: stage for r in ranks},
                                                            "excess": {r: mag for r in ranks}})


def book(**s: Any) -> tuple[JobEpisodes, ArmingPolicy]:
    settings = ArmingSettings(**{"cooldown_s": 900, "min_arm_gap_s": 60, **s})
    return JobEpisodes("j", settings), ArmingPolicy(settings)


def arm_next(b: JobEpisodes, p: ArmingPolicy, now: float, cid: str, *, in_flight: bool = False,
             covered: tuple[int, ...] | None = None) -> Episode | None:
    """The arm path as the shell and replay run it: pick, record in the history, attach the capture."""
    picked = b.next_arm(p, now, capture_in_flight=in_flight)
    if picked is None:
        return None
    ep, d = picked
    b.history.record(d, now, cid)
    b.armed(ep.episode_id, cid, now, covered=covered)
    return ep


def test_one_key_one_episode_opened_updated_and_closed_after_quiet_steps() -> None:
    b, _ = book(episode_quiet_steps=20)
    ep, evs = b.observe(out(100, (3,)), T0)
    assert ep is not None and [e.type for e in evs] == ["io.profwatch.episode_opened.v1"]
    ep2, evs = b.observe(out(130, (3,), mag=0.7), T0 + 5)
    assert ep2 is ep and ep.reports == 2 and ep.magnitude == 0.7 and ep.peak_magnitude == 0.7
    assert [e.type for e in evs] == ["io.profwatch.episode_updated.v1"]
    assert b.advance(T0 + 6, furthest_step=149) == []  # 19 quiet steps
    (closed,) = b.advance(T0 + 7, furthest_step=150, ongoing={"rank_outlier": frozenset()})
    assert closed.type == "io.profwatch.episode_closed.v1" and closed.data["reason"] == "quiet"
    assert closed.data["captured"] is False and not b.open and list(b.closed) == [ep]


def test_episode_holds_while_its_detector_still_names_the_rank_or_the_job_stays_slow() -> None:
    b, _ = book(episode_quiet_steps=20)
    b.observe(out(100, (3, 5)), T0)
    b.observe(reg(100, mag=0.3, base=1.0), T0)
    for step in range(110, 400, 10):  # rank 3 still outlying, the job still at +30 %
        assert b.advance(T0, furthest_step=step, step_time_s=1.3, ongoing={"rank_outlier": frozenset({3})}) == [] \
            or step == 110
    assert {e.kind for e in b.open.values()} == {"rank_outlier", "step_regression"}
    assert b.open["rank_outlier/forward"].ranks == (3,)  # rank 5 cleared
    evs = b.advance(T0, furthest_step=420, step_time_s=1.0, ongoing={"rank_outlier": frozenset()})
    evs += b.advance(T0, furthest_step=441, step_time_s=1.0, ongoing={"rank_outlier": frozenset()})
    assert sorted(e.data["kind"] for e in evs if e.type.endswith("closed.v1")) == ["rank_outlier", "step_regression"]


def test_queue_order_new_before_repeat_then_named_then_magnitude_then_older() -> None:
    b, _ = book()
    small, _ = b.observe(reg(10, mag=0.12), T0)
    big, _ = b.observe(Anomaly("drift", "j", 11, (), 0.4, {}), T0 + 1)
    named, _ = b.observe(out(12, (2,), mag=0.2), T0 + 2)
    older, _ = b.observe(out(13, (7,), mag=0.2, stage="backward"), T0 + 3)
    assert small and big and named and older
    assert b.queue() == [named, older, big, small]
    b.armed(named.episode_id, "c1", T0 + 4, covered=(2,), status="ok")  # captured: now a repeat
    assert b.queue() == [older, big, small, named]
    assert value_key(older) < value_key(named)


def test_a_waiting_episode_is_never_dropped_and_goes_first_when_the_budget_allows() -> None:
    b, p = book(max_captures_per_hour=1)
    job, _ = b.observe(reg(10, mag=0.25), T0)
    assert arm_next(b, p, T0, "c1", covered=(0, 1)) is job  # targeted: does not cover a later straggler
    b.capture_ended("c1", T0 + 100, "ok", named=(0,))
    straggler, _ = b.observe(out(40, (3,), mag=3.0), T0 + 120)
    assert straggler is not None
    assert b.next_arm(p, T0 + 120, capture_in_flight=False) is None
    assert (straggler.waiting, straggler.waiting_until_unix_s) == ("hourly_cap", T0 + 3600)
    for t in (T0 + 600, T0 + 1800, T0 + 3599):  # it waits; nothing else goes before it, nothing drops it
        b.advance(t, furthest_step=45, ongoing={"rank_outlier": frozenset({3})})
        assert b.next_arm(p, t, capture_in_flight=False) is None and straggler in b.queue()
    assert arm_next(b, p, T0 + 3600, "c2") is straggler


def test_no_suspect_releases_the_hourly_slot_it_held() -> None:
    b, p = book(max_captures_per_hour=1)
    load, _ = b.observe(reg(10, mag=0.25), T0)
    assert arm_next(b, p, T0, "c1", covered=(0, 1)) is load
    straggler, _ = b.observe(out(80, (3,), mag=3.0), T0 + 90)
    assert b.next_arm(p, T0 + 90, capture_in_flight=False) is None and straggler is not None
    assert straggler.waiting == "hourly_cap"
    b.capture_ended("c1", T0 + 95, "no_suspect")
    assert arm_next(b, p, T0 + 96, "c2") is straggler  # not held for an hour, nor for a cooldown


def test_cooldown_holds_only_the_same_episode_and_the_min_gap_holds_the_job() -> None:
    b, p = book()
    a, _ = b.observe(out(10, (1,)), T0)
    assert arm_next(b, p, T0, "c1", covered=(1,)) is a
    b.capture_ended("c1", T0 + 30, "ok", named=(1,))
    other, _ = b.observe(out(20, (6,), stage="backward"), T0 + 31)
    assert other is not None
    assert b.next_arm(p, T0 + 31, capture_in_flight=False) is None
    assert (other.waiting, other.waiting_until_unix_s) == ("min_arm_gap", T0 + 60)
    assert arm_next(b, p, T0 + 60, "c2", covered=(6,)) is other  # a different episode: no cooldown
    b.capture_ended("c2", T0 + 90, "ok", named=(6,))
    b.observe(out(150, (1,), mag=0.7), T0 + 150)  # rank 1 got slower: the episode changed
    assert b.next_arm(p, T0 + 200, capture_in_flight=False) is None  # both are repeats within their cooldown
    assert (a.waiting, a.waiting_until_unix_s) == ("cooldown", T0 + 900)
    assert other.waiting == "captured_unchanged"
    assert arm_next(b, p, T0 + 900, "c3", covered=(1,)) is a  # the same episode again after its cooldown


def test_a_job_hold_queues_the_others_behind_the_most_valuable() -> None:
    b, p = book()
    job, _ = b.observe(reg(10, mag=0.5), T0)
    named, _ = b.observe(out(11, (4,), mag=0.2), T0)
    assert job and named
    assert b.next_arm(p, T0, capture_in_flight=True) is None
    assert (named.waiting, named.waiting_behind) == ("capture_in_flight", "")
    assert (job.waiting, job.waiting_behind) == ("capture_in_flight", named.episode_id)


def test_one_capture_of_every_rank_covers_the_job_wide_finding_behind_the_slow_rank() -> None:
    b, p = book()
    job, _ = b.observe(reg(50, mag=3.0), T0)
    named, _ = b.observe(out(52, (3,), mag=3.1), T0 + 1)
    assert arm_next(b, p, T0 + 1, "c1", covered=None) is named
    assert job is not None and job.in_flight == "c1" and not job.captures[0].own
    b.capture_ended("c1", T0 + 50, "ok", named=(3,))
    assert b.next_arm(p, T0 + 120, capture_in_flight=False) is None  # both captured: cooldown


def test_new_ranks_in_an_open_episode_are_captured_without_its_cooldown_until_the_culprit_rotates() -> None:
    b, p = book(rotation_captures=3)
    ep, _ = b.observe(out(10, (0,)), T0)
    t = T0
    events = []
    for i, rank in enumerate((0, 3, 6)):
        if i:
            b.observe(out(10 + 150 * i, (rank,)), t)
            assert ep is not None and ep.new_ranks
        assert arm_next(b, p, t, f"c{i}", covered=(rank,)) is ep
        events += b.capture_ended(f"c{i}", t + 30, "ok", named=(rank,))
        t += 100
    assert ep is not None and ep.rotation == (0, 3, 6)
    (rot,) = events
    assert rot.type == "io.profwatch.culprit_rotates.v1"
    assert "culprit rotates: ranks 0, 3, 6 in the last 3 captures" in rot.data["detail"]
    b.observe(out(700, (9,)), t)  # another new rank: still not captured as a slow rank
    assert b.next_arm(p, t + 5000, capture_in_flight=False) is None and ep.waiting == "culprit_rotates"


def test_the_same_rank_named_again_is_not_a_rotation() -> None:
    b, p = book(rotation_captures=3, cooldown_s=0, min_arm_gap_s=0)
    ep, _ = b.observe(out(10, (0,)), T0)
    events = []
    for i, named in enumerate((0, 3, 3)):
        b.observe(out(10 + i, (0,), mag=0.5 + 0.2 * i), T0 + i)  # grown each time: captured again
        assert arm_next(b, p, T0 + i, f"c{i}") is ep
        events += b.capture_ended(f"c{i}", T0 + i, "ok", named=(named,))
    assert events == [] and ep is not None and ep.rotation == ()


def test_two_ranks_each_verdict_names_together_are_no_rotation() -> None:
    """Ranks 2 and 5 slow at once: each capture's verdict names both, most suspect first by chance (2, 5), then
    (5, 2). The tops 2 -> 5 read as a rotation before; rank 2, named again beside 5, was never left behind."""
    b, p = book(rotation_captures=2, cooldown_s=0, min_arm_gap_s=0)
    ep, _ = b.observe(out(10, (2,)), T0)
    assert arm_next(b, p, T0, "c0") is ep
    events = b.capture_ended("c0", T0 + 30, "ok", named=(2, 5))
    b.observe(out(200, (2, 5), mag=0.8), T0 + 100)  # grown: captured again
    assert arm_next(b, p, T0 + 100, "c1") is ep
    events += b.capture_ended("c1", T0 + 130, "ok", named=(5, 2))
    assert events == [] and ep is not None and ep.rotation == ()
    # the culprit that did move is still a rotation: the next verdict names 7 alone, 5 left behind
    b.observe(out(400, (7,), mag=1.0), T0 + 300)
    assert arm_next(b, p, T0 + 300, "c2") is ep
    (rot,) = b.capture_ended("c2", T0 + 330, "ok", named=(7,))
    assert rot.type == "io.profwatch.culprit_rotates.v1" and ep.rotation == (5, 7)


def test_a_failed_capture_leaves_the_episode_wanting_one_and_a_failed_plan_is_retried_later() -> None:
    b, p = book()
    ep, _ = b.observe(out(10, (2,)), T0)
    assert ep is not None and arm_next(b, p, T0, "c1") is ep
    b.capture_ended("c1", T0 + 40, "failed")
    assert not ep.is_repeat
    b.arm_failed(ep.episode_id, T0 + 60, "refused: only 3/4 ranks are live")
    assert b.next_arm(p, T0 + 61, capture_in_flight=False) is None
    assert ep.waiting.startswith("refused") and ep.waiting_until_unix_s == T0 + 120
    assert arm_next(b, p, T0 + 120, "c2") is ep


def test_the_capture_reason_shows_the_largest_magnitude_of_the_episode_and_labels_the_latest() -> None:
    """A 2x rank reported +100 %, then +13 % once the detector re-learned its level: the capture reason says +100 %
    (the latest labelled), not the re-learned +13 %."""
    b, p = book()
    ep, _ = b.observe(out(10, (3,), mag=1.0), T0)
    b.observe(out(40, (3,), mag=0.13), T0 + 5)
    picked = b.next_arm(p, T0 + 10, capture_in_flight=False)
    assert picked is not None and picked[0] is ep
    assert picked[1].capture_reason == "rank_outlier +100% (largest; latest +13%) at step 40 ranks [3]"
    b2, _ = book()
    b2.observe(out(10, (3,), mag=0.5), T0)
    picked = b2.next_arm(p, T0 + 10, capture_in_flight=False)
    assert picked is not None and picked[1].capture_reason == "rank_outlier +50% at step 10 ranks [3]"


def test_a_capture_that_cannot_answer_counts_as_captured() -> None:
    """A one-rank job's capture is ``not_applicable`` (no peer): the episode is captured, not re-armed at once."""
    b, p = book()
    ep, _ = b.observe(out(10, (2,)), T0)
    assert ep is not None and arm_next(b, p, T0, "c1") is ep
    b.capture_ended("c1", T0 + 40, "not_applicable")
    assert ep.captured_unix_s == T0 and ep.captures[0].status == "not_applicable"


def test_step_spikes_are_not_episodes_and_keys_follow_kind_and_scope() -> None:
    b, _ = book()
    assert b.observe(Anomaly("step_spike", "j", 5, (), 2.0, {}), T0) == (None, [])
    assert episode_key(out(1, (3,))) == "rank_outlier/forward"
    assert episode_key(reg(1)) == "step_regression/"
    assert episode_key(Anomaly("structural_imbalance", "j", 1, (7,), 0.15, {"role": "pp3"})) == \
        "structural_imbalance/role:pp3"
    assert episode_key(Anomaly("stalled_rank", "j", 1, (4, 2), 1.0, {})) == "stalled_rank/ranks:2,4"


def test_standing_kinds_close_only_with_the_job() -> None:
    b, _ = book(episode_quiet_steps=5)
    b.observe(Anomaly("structural_imbalance", "j", 1, (7,), 0.15, {}), T0)
    assert b.advance(T0, furthest_step=10_000) == []
    (ev,) = b.close_all(T0 + 1, "new_generation")
    assert ev.data["reason"] == "new_generation" and not b.open


def test_episodes_round_trip_through_json_and_restore() -> None:
    b, p = book()
    ep, _ = b.observe(out(10, (2,)), T0)
    assert ep is not None and arm_next(b, p, T0, "c1") is ep
    row = ep.to_json()
    back = Episode.from_json(row)
    assert back.to_json() == row
    b2, _ = book()
    b2.restore([back])
    assert b2.open[back.key].in_flight == "c1"
    assert [e.episode_id for e in b.take_dirty()] == [ep.episode_id] and b.take_dirty() == []


def test_observe_mode_would_arm_counts_as_captured_for_the_cooldown() -> None:
    b, p = book(mode="observe")
    ep, _ = b.observe(out(10, (2,)), T0)
    picked = b.next_arm(p, T0, capture_in_flight=False)
    assert picked is not None and picked[1].action == "would_arm"
    b.history.record(picked[1], T0, "would-1")
    b.armed(picked[0].episode_id, "would-1", T0, covered=None, status="would_arm")
    assert ep is not None and ep.in_flight is None and ep.is_repeat
    b.observe(out(20, (2,), mag=0.8), T0 + 50)
    assert b.next_arm(p, T0 + 100, capture_in_flight=False) is None and ep.waiting == "cooldown"


def test_an_episode_opening_while_a_capture_of_every_rank_waits_for_its_window_is_covered_by_it() -> None:
    b, p = book()
    named, _ = b.observe(out(297, (5,), mag=3.4), T0)
    assert named is not None
    picked = b.next_arm(p, T0, capture_in_flight=False)
    assert picked is not None
    b.history.record(picked[1], T0, "c1")
    b.armed(named.episode_id, "c1", T0, covered=None, start_step=305)
    job, _ = b.observe(Anomaly("step_regression", "j", 298, (), 3.0, {"first_step": 291}), T0 + 2)
    late, _ = b.observe(Anomaly("drift", "j", 400, (), 0.2, {"first_step": 390}), T0 + 3)  # after the window
    assert job is not None and job.in_flight == "c1" and not job.captures[0].own
    assert late is not None and late.captures == []
    b.capture_ended("c1", T0 + 60, "ok", named=(5,))
    assert job.is_repeat and not late.is_repeat


def test_a_new_run_closes_the_episodes_and_starts_a_fresh_budget() -> None:
    b, p = book(max_captures_per_hour=1)
    ep, _ = b.observe(out(10, (2,)), T0)
    assert ep is not None and arm_next(b, p, T0, "c1") is ep
    b.history.bytes_per_rank_step = 1000.0
    events = b.new_run(T0 + 10, "new_generation")
    assert [e.data["reason"] for e in events] == ["new_generation"] and not b.open
    assert b.history.last_arm_unix_s is None and b.history.bytes_per_rank_step == 1000.0
    again, _ = b.observe(out(5, (2,)), T0 + 20)  # the new run's slow rank: not held by the old run's arm
    assert arm_next(b, p, T0 + 20, "c2") is again


def test_a_captured_episode_that_persists_unchanged_is_not_captured_again_until_it_grows() -> None:
    """A job-wide regression held open (the job stays slow, e.g. under a drift) was re-captured once per cooldown
    for as long as it lasted; captured once, it waits until its level grows by recapture_growth."""
    b, p = book(episode_quiet_steps=20, recapture_growth=0.1)
    ep, _ = b.observe(Anomaly("step_regression", "j", 100, (), 0.12,
                              {"pattern": "cusum", "baseline_s": 1.0, "step_time_s": 1.12}), T0)
    assert ep is not None and arm_next(b, p, T0, "c1") is ep
    b.capture_ended("c1", T0 + 60, "ok")
    assert ep.captures[0].level == pytest.approx(0.12)
    for i, t in enumerate(range(int(T0) + 100, int(T0) + 4 * 3600, 300)):  # four hours, still slow
        assert b.advance(t, furthest_step=110 + 10 * i, step_time_s=1.2) == []
        assert b.next_arm(p, t, capture_in_flight=False) is None
    assert ep.waiting == "captured_unchanged" and ep.waiting_until_unix_s is None
    t = T0 + 4 * 3600
    b.observe(Anomaly("step_regression", "j", 700, (), 0.05,  # +5 % more: not grown by 10 % of the reference
                      {"pattern": "cusum", "baseline_s": 1.12, "step_time_s": 1.18}), t)
    assert b.next_arm(p, t, capture_in_flight=False) is None and ep.waiting == "captured_unchanged"
    assert ep.level == pytest.approx(0.18)  # updated: +18 % in all, not grown by 10 % since its capture
    new, evs = b.observe(Anomaly("step_regression", "j", 800, (), 0.11,  # another +11 % on top: a change of its own
                                 {"pattern": "cusum", "baseline_s": 1.18, "step_time_s": 1.32}), t + 10)
    assert [(e.type, e.data.get("reason")) for e in evs] == [("io.profwatch.episode_closed.v1", "new_change"),
                                                             ("io.profwatch.episode_opened.v1", None)]
    assert new is not None and new is not ep and new.reference_s == 1.18
    assert new.level == pytest.approx(1.32 / 1.18 - 1) and arm_next(b, p, t + 10, "c2") is new
    assert Episode.from_json(new.to_json()).captures[-1].level == pytest.approx(1.32 / 1.18 - 1)


def test_a_change_on_top_of_a_captured_job_wide_level_is_captured_at_once_not_after_its_cooldown() -> None:
    """A +16 % host-load level captured (a suspect named, or no verdict yet in replay), the job stays there; a 3x
    straggler 5 minutes later (zero-code: seen as job-wide) was an update held by the 900 s cooldown."""
    b, p = book(episode_quiet_steps=20)
    load, _ = b.observe(reg(100, mag=0.16, base=1.0), T0)
    assert load is not None and arm_next(b, p, T0, "c1") is load
    b.capture_ended("c1", T0 + 60, "ok", named=(0,))
    b.advance(T0 + 300, furthest_step=700, step_time_s=1.16)
    straggler, _ = b.observe(reg(700, mag=2.0, base=1.16), T0 + 300)
    assert straggler is not None and straggler is not load and load.close_reason == "new_change"
    assert arm_next(b, p, T0 + 300, "c2") is straggler


def test_a_partial_targeted_capture_that_waited_outside_asks_one_follow_up_through_the_budget() -> None:
    b, p = book(cooldown_s=900, min_arm_gap_s=60)
    ep, _ = b.observe(reg(50, mag=0.4), T0)
    assert ep is not None and arm_next(b, p, T0, "c1", covered=(0, 1, 2, 3)) is ep
    evs = b.capture_ended("c1", T0 + 30, "partial", waited=(6, 4, 5, 7))
    (ev,) = evs
    assert ev.type == "io.profwatch.episode_updated.v1" and ev.data["reason"] == "follow_up"
    assert ev.data["follow_ranks"] == [4, 5, 6, 7] and ev.data["follow_count"] == 4 and "ranks 4, 5, 6, 7" in ev.data[
        "text"]
    assert ep.follow_ranks == (4, 5, 6, 7) and not ep.is_repeat  # wanted again: the cooldown does not hold it
    assert b.next_arm(p, T0 + 31, capture_in_flight=False) is None and ep.waiting == "min_arm_gap"  # the job's gap
    picked = b.next_arm(p, T0 + 61, capture_in_flight=False)
    assert picked is not None and picked[0] is ep and picked[1].action == "arm"
    assert "follow-up of ranks 4-7" in picked[1].capture_reason
    b.history.record(picked[1], T0 + 61, "c2")
    b.armed(ep.episode_id, "c2", T0 + 61, covered=(4, 5, 6, 7))
    assert ep.follow_ranks == () and ep.captures[-1].follow_up and ep.captures[-1].capture_id == "c2"
    assert b.capture_ended("c2", T0 + 90, "partial", waited=(0,)) == []  # a follow-up's partial asks no other
    assert ep.follow_ranks == () and ep.is_repeat
    assert b.next_arm(p, T0 + 200, capture_in_flight=False) is None and ep.waiting == "captured_unchanged"


def test_no_follow_up_without_an_outside_wait_for_a_covered_episode_a_closed_one_or_a_fixed_rank_list() -> None:
    b, p = book()
    ep, _ = b.observe(reg(50), T0)
    assert ep is not None and arm_next(b, p, T0, "c1", covered=(0, 1)) is ep
    assert b.capture_ended("c1", T0 + 30, "partial") == [] and ep.follow_ranks == ()  # no wait outside shown
    assert b.capture_ended("c1", T0 + 30, "ok", waited=(5,)) == [] and ep.follow_ranks == ()  # not partial
    b2, p2 = book()
    named, _ = b2.observe(out(52, (3,), mag=0.9), T0)
    other, _ = b2.observe(out(52, (2,), mag=0.5, stage="backward"), T0)
    assert named is not None and other is not None
    assert arm_next(b2, p2, T0, "c1", covered=(2, 3)) is named and other.in_flight == "c1"  # covered by it
    evs = b2.capture_ended("c1", T0 + 30, "partial", waited=(9,))
    assert [e.data["episode_id"] for e in evs] == [named.episode_id]  # the owner asks, not the covered one
    assert named.follow_ranks == (9,) and other.follow_ranks == ()
    b3, p3 = book(episode_quiet_steps=5)
    ep3, _ = b3.observe(out(10, (1,)), T0)
    assert ep3 is not None and arm_next(b3, p3, T0, "c1", covered=(0, 1)) is ep3
    b3.capture_ended("c1", T0 + 5, "ok")  # the capture is done: the quiet episode may close
    b3.advance(T0 + 6, furthest_step=100, ongoing={"rank_outlier": frozenset()})
    assert ep3.closed_unix_s is not None
    assert b3.capture_ended("c1", T0 + 7, "partial", waited=(5,)) == [] and ep3.follow_ranks == ()
    b4, p4 = book(rank_list=(0, 1))
    ep4, _ = b4.observe(reg(50), T0)
    assert ep4 is not None and arm_next(b4, p4, T0, "c1", covered=(0, 1)) is ep4
    assert b4.capture_ended("c1", T0 + 30, "partial", waited=(5,)) == [] and ep4.follow_ranks == ()


def test_follow_ranks_survive_a_restart() -> None:
    b, p = book()
    ep, _ = b.observe(reg(50), T0)
    assert ep is not None and arm_next(b, p, T0, "c1", covered=(0, 1)) is ep
    b.capture_ended("c1", T0 + 30, "partial", waited=(2, 3))
    back = Episode.from_json(ep.to_json())
    assert back.follow_ranks == (2, 3) and back.new_ranks and not back.captures[0].follow_up
    b2, _ = book()
    b2.restore([back])
    picked = b2.next_arm(p, T0 + 100, capture_in_flight=False)
    assert picked is not None and "follow-up of ranks 2-3" in picked[1].capture_reason


def test_the_waited_for_ranks_are_checked_against_the_capture() -> None:
    from types import SimpleNamespace

    from profwatch.arming.episode_desk import waited_ranks
    cap: Any = SimpleNamespace(rank_list=(0, 1, 2, 3), world_size=8)
    assert waited_ranks(cap, {"named": [], "uncaptured_count": 4}) == (4, 5, 6, 7)  # not named: every rank outside
    assert waited_ranks(cap, {"named": [6]}) == (6,)
    assert waited_ranks(cap, {"named": [2, 8, -1, True, "5"]}) == (4, 5, 6, 7)  # nothing believable named
    assert waited_ranks(cap, None) == () and waited_ranks(cap, "text") == ()
    assert waited_ranks(SimpleNamespace(rank_list=None, world_size=8), {"named": [6]}) == ()  # held every rank


def test_a_follow_up_of_every_uncaptured_rank_of_a_large_job_fits_the_byte_cap() -> None:
    # 1,024 ranks on 128 nodes; a targeted capture of rank 3's neighbourhood ends partial, its ranks waiting outside
    # and the data naming no rank: the follow-up was all ~1,005 uncaptured ranks (63 GiB at the default 16 MiB per
    # rank and step, 4 steps), larger than the 50 GiB hourly cap: never armed, and the episode never captured again
    b, p = book()
    topo = JobTopology(1024, {r: f"h{r // 8}" for r in range(1024)})
    ep, _ = b.observe(out(100, (3,)), T0)
    picked = b.next_arm(p, T0, capture_in_flight=False, topology=topo)
    assert ep is not None and picked is not None and picked[1].rank_list is not None
    b.history.record(picked[1], T0, "c1")
    b.armed(ep.episode_id, "c1", T0, covered=picked[1].rank_list)
    held = set(picked[1].rank_list)
    b.capture_ended("c1", T0 + 30, "partial", waited=tuple(r for r in range(1024) if r not in held))
    follow = b.next_arm(p, T0 + 100, capture_in_flight=False, topology=topo)
    assert follow is not None and follow[1].action == "arm" and follow[1].target is not None, ep.waiting
    assert follow[1].target.mode == "follow_up" and len(follow[1].rank_list or ()) <= 64 + 16


def test_a_follow_up_larger_than_the_byte_cap_is_dropped_not_waited_for_forever() -> None:
    b, p = book(max_capture_bytes_per_hour=40 * 4 * 16 * 2**20)  # 40 ranks' worth: a targeted capture (19) fits
    topo = JobTopology(1024, {r: f"h{r // 8}" for r in range(1024)})
    ep, _ = b.observe(out(100, (3,)), T0)
    assert ep is not None and arm_next(b, p, T0, "c1", covered=(3,)) is ep
    b.capture_ended("c1", T0 + 30, "partial", waited=tuple(range(100, 1024)))  # a sample of 64 + 16: 80 ranks
    assert ep.follow_ranks
    assert b.next_arm(p, T0 + 100, capture_in_flight=False, topology=topo) is None
    assert ep.follow_ranks == () and ep.waiting != "larger_than_byte_cap"  # back to its own rules
    b.observe(out(400, (3, 700), mag=0.9), T0 + 200)  # it grows to a new rank: captured again, a plain target
    again = b.next_arm(p, T0 + 200, capture_in_flight=False, topology=topo)
    assert again is not None and again[0] is ep and again[1].target is not None
    assert again[1].target.mode == "targeted"


def test_a_partial_capture_that_shows_the_culprit_rotating_asks_no_follow_up() -> None:
    # the third own capture names a third different top rank and its ranks waited outside: the culprit rotates, so
    # the episode is not captured again; a follow-up asked then was shown by status as queued for good
    b, p = book(rotation_captures=3, min_arm_gap_s=0)
    ep, _ = b.observe(out(10, (0,)), T0)
    assert ep is not None
    for i, top in enumerate((0, 3)):
        assert arm_next(b, p, T0 + 1000 * i, f"c{i}", covered=(top,)) is ep
        b.capture_ended(f"c{i}", T0 + 1000 * i + 30, "ok", named=(top,))
        b.observe(out(20 + i, (top + 3,)), T0 + 1000 * i + 40)  # a new rank: captured again without the cooldown
    assert arm_next(b, p, T0 + 3000, "c2", covered=(6,)) is ep
    evs = b.capture_ended("c2", T0 + 3030, "partial", named=(6,), waited=(100, 101))
    assert [e.type for e in evs] == ["io.profwatch.culprit_rotates.v1"] and ep.rotation == (0, 3, 6)
    assert ep.follow_ranks == ()


def test_the_follow_ranks_of_a_huge_job_are_stored_as_runs_and_read_back_bounded() -> None:
    # every uncaptured rank of a 100,000-rank job: a list of them was ~690 KB in every save of the episode
    b, p = book()
    ep, _ = b.observe(reg(50), T0)
    assert ep is not None and arm_next(b, p, T0, "c1", covered=(0, 1)) is ep
    held = {0, 1, 500, 70_000}
    b.capture_ended("c1", T0 + 30, "partial", waited=tuple(r for r in range(100_000) if r not in held))
    row = ep.to_json()
    assert len(json.dumps(row)) < 4_000 and row["follow_count"] == 100_000 - 4 and len(row["follow_ranks"]) == 64
    assert Episode.from_json(json.loads(json.dumps(row))).follow_ranks == ep.follow_ranks
    hostile = row | {"follow_spans": [[0, 10**12], [9, 3], ["a", 4], [True, 2], 7]}
    back = Episode.from_json(hostile).follow_ranks
    assert len(back) == 1 << 21 and back[0] == 0  # clipped, the malformed runs left out
    assert Episode.from_json(row | {"follow_spans": "0-5"}).follow_ranks == ()


def test_a_job_wide_level_its_capture_found_nobody_behind_becomes_the_new_normal_and_frees_the_job() -> None:
    """Issue 31, finding 4: host load made the job +16 % slower for good; its capture found no suspect; the job
    stays there. Once it held its level for episode_quiet_steps after the verdict, one level_learned (old and new
    level, the capture) closes it, and a 3x straggler later is a new episode captured at once (no cooldown)."""
    b, p = book(episode_quiet_steps=20)
    load, _ = b.observe(reg(100, mag=0.16, base=1.0), T0)
    assert load is not None and arm_next(b, p, T0, "c1") is load
    b.capture_ended("c1", T0 + 60, "no_suspect")
    events = []
    for i, step in enumerate(range(120, 200, 5)):
        events += b.advance(T0 + 70 + i, furthest_step=step, step_time_s=1.16)
    types = [e.type for e in events]
    assert types == ["io.profwatch.level_learned.v1", "io.profwatch.episode_closed.v1"], types
    learned, closed = events
    assert learned.data["old_level_s"] == 1.0 and learned.data["new_level_s"] == 1.16
    assert learned.data["capture_id"] == "c1" and learned.data["change"] == pytest.approx(0.16)
    assert "new normal" in learned.data["text"] and "+16%" in learned.data["text"]
    assert closed.data["reason"] == "level_learned" and not b.open
    straggler, evs = b.observe(reg(300, mag=2.0, base=1.16), T0 + 200)  # judged against the new level
    assert straggler is not None and straggler is not load and straggler.reference_s == 1.16
    assert [e.type for e in evs] == ["io.profwatch.episode_opened.v1"]
    assert arm_next(b, p, T0 + 200, "c2") is straggler  # not held by the load episode's 900 s cooldown


def test_a_new_change_on_a_level_found_normal_is_its_own_episode_even_before_the_level_settled() -> None:
    b, p = book(episode_quiet_steps=50)
    load, _ = b.observe(reg(100, mag=0.16, base=1.0), T0)
    assert load is not None and arm_next(b, p, T0, "c1") is load
    b.capture_ended("c1", T0 + 60, "no_suspect")
    b.advance(T0 + 61, furthest_step=120, step_time_s=1.16)
    straggler, evs = b.observe(reg(130, mag=2.0, base=1.16), T0 + 70)
    assert [e.type for e in evs] == ["io.profwatch.level_learned.v1", "io.profwatch.episode_closed.v1",
                                     "io.profwatch.episode_opened.v1"]
    assert evs[0].data["new_level_s"] == 1.16 and straggler is not None and straggler is not load
    assert arm_next(b, p, T0 + 70, "c2") is straggler


def test_a_level_whose_capture_named_a_rank_or_that_fell_back_is_not_learned() -> None:
    b, p = book(episode_quiet_steps=20)
    named, _ = b.observe(reg(100, mag=0.3, base=1.0), T0)
    assert named is not None and arm_next(b, p, T0, "c1") is named
    b.capture_ended("c1", T0 + 60, "ok", named=(2,))  # a suspect was found: the episode stays a finding
    for step in range(120, 300, 10):
        assert all(e.type != "io.profwatch.level_learned.v1"
                   for e in b.advance(T0 + step, furthest_step=step, step_time_s=1.3))
    b2, p2 = book(episode_quiet_steps=20)
    gone, _ = b2.observe(reg(100, mag=0.3, base=1.0), T0)
    assert gone is not None and arm_next(b2, p2, T0, "c1") is gone
    b2.capture_ended("c1", T0 + 60, "no_suspect")
    events = []
    for step in range(120, 300, 10):  # back at the old level: it ends as quiet, nothing is learned
        events += b2.advance(T0 + step, furthest_step=step, step_time_s=1.0)
    assert [e.data["reason"] for e in events] == ["quiet"]


def test_a_culprit_rotating_across_episodes_takes_two_captures_and_never_holds_a_slow_rank() -> None:
    """Issue 31, finding 6: an MoE hot expert moves every 150 steps (each hot period an episode of its own); a real
    rank is slow from the middle of the job. The rotation is recognised at its second capture, its captures leave
    the hourly cap, later hot periods are not captured, the persistent rank is."""
    b, p = book(max_captures_per_hour=4, episode_quiet_steps=20, min_arm_gap_s=60)
    t, step = T0, 100
    arms, events = [], []
    for rank in (1, 5, 2, 6, 3):  # hot periods of 75 s (150 steps at 0.5 s)
        ep, _ = b.observe(out(step, (rank,), stage="moe"), t)
        assert ep is not None
        got = arm_next(b, p, t + 1, f"c{rank}", covered=(rank,))
        if got is not None:
            arms.append(rank)
            events += b.capture_ended(f"c{rank}", t + 30, "ok", named=(rank,))
        else:
            assert ep.waiting == "culprit_rotates" and ep.rotating_member
        t, step = t + 75, step + 150
        events += b.advance(t, furthest_step=step, ongoing={"rank_outlier": frozenset()})
    assert arms == [1, 5]
    rot = [e for e in events if e.type == "io.profwatch.culprit_rotates.v1"]
    assert len(rot) == 1 and rot[0].data["rotation"] == [1, 5] and rot[0].data["across_episodes"]
    assert b.history.state(t, capture_in_flight=False).captures_last_hour == 0  # the rotation's slots given back
    slow, _ = b.observe(out(step, (7,), stage="moe", mag=0.25), t)
    assert slow is not None and slow.rotating_member
    assert b.next_arm(p, t + 1, capture_in_flight=False) is None
    done = None
    for k in range(1, 40):  # it persists: reported and still named while the hot expert goes on moving
        now, at = t + 10 * k, step + 20 * k
        b.observe(out(at, (7,), stage="moe", mag=0.25), now)
        b.advance(now, furthest_step=at, ongoing={"rank_outlier": frozenset({7})})
        done = arm_next(b, p, now, "c-slow", covered=(7,))
        if done is not None:
            assert now - slow.opened_unix_s >= 300 and at - slow.opened_step >= 60
            break
    assert done is slow and not slow.rotation


def test_a_replicas_episode_is_quiet_only_on_its_own_step_counter() -> None:
    """Serving replicas have unrelated step counters: replica 2 at its step 1,200 while replica 0 is at 90,000.
    Its episode (ranks of the unit) holds while reports come on its own counter; it closes after
    episode_quiet_steps of *its* steps, never at once because another replica is far ahead."""
    b, p = book(episode_quiet_steps=50)
    rep = Anomaly("step_regression", "j", 1_200, (2,), 0.3, {"unit": [2], "baseline_s": 0.05})
    ep, _ = b.observe(rep, T0)
    assert ep is not None
    units = {0: 90_000, 1: 40_000, 2: 1_210, 3: 7}
    assert b.advance(T0 + 1, furthest_step=90_000, unit_steps=units) == []
    assert ep.closed_unix_s is None and arm_next(b, p, T0 + 1, "c1", covered=(2,)) is ep
    b.capture_ended("c1", T0 + 30, "ok", named=(2,))
    assert b.advance(T0 + 40, furthest_step=90_400, unit_steps={**units, 0: 90_400, 2: 1_249}) == []
    (closed,) = b.advance(T0 + 41, furthest_step=90_401, unit_steps={**units, 0: 90_401, 2: 1_250})
    assert closed.data["reason"] == "quiet"


def test_slow_from_start_arms_one_capture_by_default_and_stays_open_until_the_job_ends() -> None:
    settings = ArmingSettings()
    b, p = JobEpisodes("j", settings), ArmingPolicy(settings)
    slow = Anomaly("slow_from_start", "j", 60, (2,), 0.3, {"stage": {2: "compute"}, "excess": {2: 0.3},
                                                            "text": "rank 2 has been 30 % slower ..."})
    ep, _ = b.observe(slow, T0)
    assert ep is not None and arm_next(b, p, T0, "c1", covered=None) is ep
    b.capture_ended("c1", T0 + 60, "ok", named=(2,))
    for k in range(1, 20):  # never quiet-closed, never captured again
        assert b.advance(T0 + 100 * k, furthest_step=60 + 100 * k) == []
        assert b.next_arm(p, T0 + 100 * k, capture_in_flight=False) is None
    assert ep.waiting == "captured_unchanged" and [c.capture_id for c in ep.captures] == ["c1"]


def test_a_rank_that_stays_slow_inside_a_rotating_episode_is_captured_as_an_episode_of_its_own() -> None:
    """A hot expert moving within one open episode (each new rank captured again, no verdict names: replay) is a
    rotation at its second capture; those two captures leave the hourly cap; rank 7, slow for good from the middle
    of the job, is named by the detector without a break: once it persists it opens its own episode, captured."""
    b, p = book(max_captures_per_hour=2, episode_quiet_steps=50, min_arm_gap_s=0)
    ep, _ = b.observe(out(800, (0,), stage="moe"), T0)
    assert ep is not None and arm_next(b, p, T0, "c0", covered=(0,)) is ep
    b.capture_ended("c0", T0 + 20, "simulated")
    b.observe(out(950, (1,), stage="moe"), T0 + 75)
    assert arm_next(b, p, T0 + 75, "c1", covered=(0, 1)) is ep
    evs = b.capture_ended("c1", T0 + 95, "simulated")
    assert [e.type for e in evs] == ["io.profwatch.culprit_rotates.v1"] and ep.rotation == (0, 1)
    assert b.history.state(T0 + 95, capture_in_flight=False).captures_last_hour == 0
    t, step, opened = T0 + 150, 1100, []
    for k in range(100):  # the expert moves on every 150 steps (75 s); rank 7 is slow from step 1,100 on
        hot = 2 + (k // 15) % 4
        now, at = t + 5 * k, step + 10 * k
        if k % 15 == 0:
            b.observe(out(at, (hot, 7), stage="moe"), now)
        opened += [e for e in b.advance(now, furthest_step=at, ongoing={"rank_outlier": frozenset({hot, 7})})
                   if e.type.endswith("episode_opened.v1")]
        got = arm_next(b, p, now, f"c-{k}", covered=(7,))
        if got is not None:
            assert got.ranks == (7,) and got.scope == "moe+ranks:7" and now - t >= 300
            break
        assert k < 99, "rank 7 never captured"
    (ev,) = opened
    assert ev.data["reason"] == "persistent" and ev.data["ranks"] == [7] and "rank 7 has stayed slow" in ev.data["text"]


def test_a_job_wide_capture_that_covered_the_hot_rank_is_the_first_capture_of_its_rotation() -> None:
    """Issue 31's corpus, class moe: a hot expert's first appearance raises the job step time (the slowest rank sets
    it); that job-wide episode is captured and its capture covers the rank outlier episode opened a few steps later.
    When the expert moves, the rank's episode is captured again for the new rank: that is the rotation's second
    capture (rotation_captures=2), so the culprit rotates and the third rank is not captured (before: the covering
    capture did not count and the rotation took a third)."""
    b, p = book(min_arm_gap_s=0)
    job, _ = b.observe(reg(429, mag=0.26), T0)
    picked = b.next_arm(p, T0, capture_in_flight=False)
    assert picked is not None and picked[0] is job
    b.history.record(picked[1], T0, "c-job")
    b.armed(job.episode_id, "c-job", T0, covered=None, start_step=440)  # its window starts at step 440
    hot, _ = b.observe(out(434, (0,), stage="moe"), T0 + 3)
    assert hot is not None and [c.capture_id for c in hot.captures] == ["c-job"] and not hot.captures[0].own
    assert b.capture_ended("c-job", T0 + 40, "simulated") == []
    b.observe(out(540, (1,), stage="moe"), T0 + 80)  # the expert moved: a new rank, captured again at once
    assert hot.new_ranks and arm_next(b, p, T0 + 80, "c-1", covered=(0, 1)) is hot
    (rot,) = b.capture_ended("c-1", T0 + 120, "simulated")
    assert rot.type == "io.profwatch.culprit_rotates.v1" and hot.rotation == (0, 1)
    b.observe(out(646, (2,), stage="moe"), T0 + 160)
    assert b.next_arm(p, T0 + 160, capture_in_flight=False) is None and hot.waiting == "culprit_rotates"


def test_a_hot_rank_stays_named_as_long_as_the_rotation_did_and_is_not_taken_for_a_persistent_one() -> None:
    """Issue 31's corpus, class moe with 5 s steps: the hot expert stays on each rank about 6 minutes. The rotation
    is recognised at its second capture (rank 0 at T0, rank 1 six minutes later); rank 1 then stays named another
    6 minutes: not a slow rank of its own, which must outlast twice the 6 minutes rank 0 stayed (before: it opened a
    `persistent` episode and was captured once 5 minutes had passed)."""
    b, p = book(min_arm_gap_s=0, episode_quiet_steps=50)
    hot, _ = b.observe(out(107, (0,), stage="moe"), T0)
    assert hot is not None and arm_next(b, p, T0, "c0", covered=(0,)) is hot
    b.capture_ended("c0", T0 + 40, "simulated")
    b.observe(out(182, (1,), stage="moe"), T0 + 360)
    assert arm_next(b, p, T0 + 360, "c1", covered=(0, 1)) is hot
    b.capture_ended("c1", T0 + 400, "simulated")
    assert hot.rotation == (0, 1)
    opened = []
    for k in range(1, 73):  # rank 1 named for 6 more minutes (72 steps of 5 s)
        now, at = T0 + 360 + 5 * k, 182 + k
        opened += [e for e in b.advance(now, furthest_step=at, ongoing={"rank_outlier": frozenset({1})})
                   if e.type.endswith("episode_opened.v1")]
    assert opened == [] and b.next_arm(p, T0 + 720, capture_in_flight=False) is None
    for k in range(73, 200):  # rank 1 stays: a slow rank of its own once it outlasted twice the rotation's 6 min
        now, at = T0 + 360 + 5 * k, 182 + k
        opened += [e for e in b.advance(now, furthest_step=at, ongoing={"rank_outlier": frozenset({1})})
                   if e.type.endswith("episode_opened.v1")]
        if opened:
            assert now - (T0 + 360) >= 720
            break
    assert [e.data["reason"] for e in opened] == ["persistent"]


def window_out(step: int, ranks: tuple[int, ...], mag: float = 0.4) -> Anomaly:
    """A rank outlier report as the detector gives it: it fired once the ranks outlied in 8 of its last 12 steps."""
    return Anomaly("rank_outlier", "j", step, ranks, mag, {"stage": {r: "compute" for r in ranks},
                                                            "excess": {r: mag for r in ranks}, "window_steps": 12,
                                                            "outlying_steps": {r: 8 for r in ranks}})


def test_a_job_wide_capture_that_ended_before_the_hot_rank_was_named_is_the_rotations_first_capture() -> None:
    """Issue 31's corpus, class moe (seeds 19, 26, 30 of --seed 31): the hot expert's first appearance raises the job
    step time at step 103; that job-wide episode is captured (window from step 107) and the capture ends before the
    rank outlier detector, whose window the capture paused, names rank 0 at step 117. Its evidence (steps 106-117)
    holds the capture's window: that capture saw the rank and is the rotation's first. When the expert moves, one
    more capture (rank 1) shows the rotation; the third rank is not captured (before: rank 0 got a capture of its
    own and the rotation took three)."""
    b, p = book(min_arm_gap_s=0, episode_quiet_steps=50)
    job, _ = b.observe(reg(103, mag=0.22), T0)
    picked = b.next_arm(p, T0, capture_in_flight=False)
    assert picked is not None and picked[0] is job
    b.history.record(picked[1], T0, "c-job")
    b.armed(job.episode_id, "c-job", T0, covered=None, start_step=107)
    assert b.capture_ended("c-job", T0 + 30, "simulated") == []
    hot, _ = b.observe(window_out(117, (0,)), T0 + 50)
    assert hot is not None and [(c.capture_id, c.own) for c in hot.captures] == [("c-job", False)]
    assert b.next_arm(p, T0 + 50, capture_in_flight=False) is None and hot.waiting == "captured_unchanged"
    b.observe(window_out(219, (1,)), T0 + 400)  # the expert moved: a new rank, captured once
    assert arm_next(b, p, T0 + 400, "c-1", covered=(0, 1)) is hot
    (rot,) = b.capture_ended("c-1", T0 + 430, "simulated")
    assert rot.type == "io.profwatch.culprit_rotates.v1" and hot.rotation == (0, 1)
    assert rot.data["capture_ids"] == ["c-job", "c-1"]
    b.observe(window_out(329, (2,)), T0 + 800)
    assert b.next_arm(p, T0 + 800, capture_in_flight=False) is None and hot.waiting == "culprit_rotates"


def test_a_capture_that_ended_before_a_ranks_evidence_began_does_not_cover_it() -> None:
    """The covering rule reads the capture's window against the report's evidence: a job-wide capture whose window
    (from step 60) ended before rank 3's evidence began (steps 106-117) did not see it, so rank 3 is captured."""
    b, p = book(min_arm_gap_s=0)
    job, _ = b.observe(reg(55, mag=0.3), T0)
    picked = b.next_arm(p, T0, capture_in_flight=False)
    assert picked is not None
    b.history.record(picked[1], T0, "c-job")
    b.armed(job.episode_id, "c-job", T0, covered=None, start_step=60)
    b.capture_ended("c-job", T0 + 30, "ok")
    slow, _ = b.observe(window_out(117, (3,)), T0 + 100)
    assert slow is not None and slow.captures == []
    assert arm_next(b, p, T0 + 100, "c-3", covered=(3,)) is slow


def _rotation_without_tops(b: JobEpisodes, p: ArmingPolicy) -> tuple[list[str], list[Any], float, int]:
    """A hot spot that moves among pairs of ranks every 150 steps (0.5 s steps), each hot period an episode of its
    own naming two ranks at once, captures whose verdicts name nobody (so no capture has a top rank). Returns the
    captures armed, the events, the time and step reached."""
    t, step, armed, events = T0, 100, [], []
    for k, pair in enumerate(((0, 1), (2, 3), (4, 5), (6, 7), (0, 1), (2, 3))):
        ep, evs = b.observe(window_out(step, pair), t)
        events += evs
        assert ep is not None
        got = arm_next(b, p, t + 1, f"c{k}", covered=pair)
        if got is not None:
            armed.append(f"c{k}")
            events += b.capture_ended(f"c{k}", t + 20, "simulated")
        t, step = t + 75, step + 150
        events += b.advance(t, furthest_step=step, ongoing={"rank_outlier": frozenset()})
    return armed, events, t, step


def test_a_rotation_is_recognised_from_the_ranks_named_across_episodes_and_takes_two_captures() -> None:
    """No capture names a top rank (two ranks named together, no verdict names: before, the rotation was never
    recognised and every hot period was captured, 6 of 6). The ranks named by successive episodes move among ranks:
    once the key took rotation_captures (2) captures, the move is a rotation: culprit_rotates once (evidence
    named_ranks), no third capture, the rotation's hourly slots given back."""
    b, p = book(max_captures_per_hour=4, episode_quiet_steps=20, min_arm_gap_s=60)
    armed, events, t, _ = _rotation_without_tops(b, p)
    assert armed == ["c0", "c1"]
    rot = [e for e in events if e.type == "io.profwatch.culprit_rotates.v1"]
    assert len(rot) == 1 and rot[0].data["evidence"] == "named_ranks" and rot[0].data["across_episodes"]
    assert rot[0].data["rotation"] == [0, 1, 2, 3, 4, 5] and rot[0].data["capture_ids"] == ["c0", "c1"]
    assert "not captured or paged again" in rot[0].data["detail"]
    assert b.history.state(t, capture_in_flight=False).captures_last_hour == 0


def test_a_real_straggler_after_a_rotation_recognised_from_names_is_captured_once_it_persists() -> None:
    """After the rotation above, rank 7 slows down for good (+25 %) while the hot spot goes on moving: its episode
    on the rotating key waits as culprit_rotates, then is captured as a slow rank of its own once it persists (5
    minutes and 60 steps, twice the longest hot period), never behind the hourly cap (max 2 per hour: the rotation's
    captures gave their slots back)."""
    b, p = book(max_captures_per_hour=2, episode_quiet_steps=20, min_arm_gap_s=60)
    armed, _, t, step = _rotation_without_tops(b, p)
    assert armed == ["c0", "c1"]
    slow, _ = b.observe(window_out(step, (7,), mag=0.25), t)
    assert slow is not None and slow.rotating_member
    assert b.next_arm(p, t + 1, capture_in_flight=False) is None and slow.waiting == "culprit_rotates"
    done = None
    for k in range(1, 60):
        now, at = t + 10 * k, step + 20 * k
        b.observe(window_out(at, (7,), mag=0.25), now)
        b.advance(now, furthest_step=at, ongoing={"rank_outlier": frozenset({7})})
        done = arm_next(b, p, now, "c-slow", covered=(7,))
        if done is not None:
            assert 300 <= now - slow.opened_unix_s <= 320 and at - slow.opened_step >= 60
            break
    assert done is slow and not slow.rotation


def test_two_slow_ranks_hours_apart_are_no_rotation_a_third_straggler_is_captured_at_once() -> None:
    """Rank 3 is slow for a while (captured), 3 hours later rank 7 for 20 minutes (captured), and 30 minutes after
    rank 7 healed rank 9 slows down for good. Two faults hours apart and a third are no hot spot that moves: rank 9
    is captured at its first report (before: the key's two captures counted over the whole generation and the move
    7 -> 9 made culprit_rotates evidence named_ranks at once; rank 9 waited 2390 s, twice rank 7's 20 minutes)."""
    b, p = book(min_arm_gap_s=0, episode_quiet_steps=20, max_captures_per_hour=6)
    t, step = T0, 100
    first, _ = b.observe(out(step, (3,)), t)
    assert arm_next(b, p, t + 1, "c3", covered=(3,)) is first
    b.capture_ended("c3", t + 30, "ok", named=(3,))
    for k in range(1, 10):
        b.advance(t + 10 * k, furthest_step=step + 10 * k, ongoing={"rank_outlier": frozenset({3} if k < 3 else ())})
    t, step = T0 + 3 * 3600, 20_000
    second, _ = b.observe(out(step, (7,)), t)
    assert arm_next(b, p, t + 1, "c7", covered=(7,)) is second
    b.capture_ended("c7", t + 30, "ok", named=(7,))
    for k in range(1, 130):
        b.advance(t + 10 * k, furthest_step=step + 5 * k, ongoing={"rank_outlier": frozenset({7} if k < 120 else ())})
    assert not b.open and not b.rotating
    t, step = T0 + 3 * 3600 + 3000, 21_000
    straggler, events = b.observe(out(step, (9,)), t)
    assert [e.type for e in events] == ["io.profwatch.episode_opened.v1"]
    assert straggler is not None and not straggler.rotation and not b.rotating
    assert arm_next(b, p, t + 1, "c9", covered=(9,)) is straggler


def _job_wide_capture_armed() -> tuple[JobEpisodes, ArmingPolicy]:
    """A job-wide regression reported at step 103 and its capture ``c-job`` armed (window from step 107)."""
    b, p = book(min_arm_gap_s=0, episode_quiet_steps=50)
    job, _ = b.observe(reg(103, mag=0.22), T0)
    picked = b.next_arm(p, T0, capture_in_flight=False)
    assert picked is not None
    b.history.record(picked[1], T0, "c-job")
    b.armed(job.episode_id, "c-job", T0, covered=None, start_step=107)
    return b, p


@pytest.mark.parametrize(("status", "named"), [("cancelled", ()), ("ok", (2,)), ("partial", ())])
@pytest.mark.parametrize("ended_before_report", [True, False])
def test_a_covering_capture_that_did_not_show_the_rank_leaves_a_straggler_wanting_its_capture(
        status: str, named: tuple[int, ...], ended_before_report: bool) -> None:
    """A job-wide capture (window from step 107) was cancelled, or its verdict named rank 2 or nobody; rank 5's
    outlier evidence (steps 106-117) holds its window. That capture did not show rank 5, so rank 5, slow for good,
    gets a capture of its own, whether the capture ended before the report or while it was in flight (before: it
    counted as rank 5's capture and rank 5 waited as captured_unchanged for good). A verdict that names rank 5 still
    counts (the rotation's first capture, test above)."""
    b, p = _job_wide_capture_armed()
    if ended_before_report:
        b.capture_ended("c-job", T0 + 30, status, named=named)
    slow, _ = b.observe(window_out(117, (5,)), T0 + 40)
    assert slow is not None
    if not ended_before_report:
        assert [c.capture_id for c in slow.captures] == ["c-job"]
        b.capture_ended("c-job", T0 + 45, status, named=named)
    assert slow.captures == []
    assert arm_next(b, p, T0 + 50, "c-5", covered=(5,)) is slow


def test_a_covering_capture_whose_verdict_names_the_rank_counts_for_it() -> None:
    b, p = _job_wide_capture_armed()
    b.capture_ended("c-job", T0 + 30, "ok", named=(5, 2))
    slow, _ = b.observe(window_out(117, (5,)), T0 + 40)
    assert slow is not None and [(c.capture_id, c.own) for c in slow.captures] == [("c-job", False)]
    assert b.next_arm(p, T0 + 50, capture_in_flight=False) is None and slow.waiting == "captured_unchanged"


def test_two_slow_ranks_one_flapping_out_of_the_names_are_no_rotation() -> None:
    """Ranks 3 and 6 are both slow (captured, the verdict names both); the detector drops rank 3 for one check. A
    hot spot that moves leaves a rank before the next is named; these two were named together, so no
    culprit_rotates (before: the move 3 -> 6, counted from rank 6's first naming, called it load imbalance and held
    the key's later episodes until they persist). The moe corpus is unchanged (--classes moe --runs 24 --seed 31:
    33 rotation captures, 1 false arm, 0/10 lost, before and after)."""
    b, p = book(min_arm_gap_s=0, episode_quiet_steps=50, cooldown_s=0)
    ep, _ = b.observe(out(100, (3,)), T0)
    assert arm_next(b, p, T0 + 1, "c1") is ep
    events = b.capture_ended("c1", T0 + 30, "ok", named=(3,))
    same, more = b.observe(out(160, (3, 6)), T0 + 60)
    assert same is ep and arm_next(b, p, T0 + 61, "c2") is ep
    events += more + b.capture_ended("c2", T0 + 90, "ok", named=(3, 6))
    events += b.advance(T0 + 100, furthest_step=200, ongoing={"rank_outlier": frozenset({6})})
    events += b.advance(T0 + 110, furthest_step=210, ongoing={"rank_outlier": frozenset({3, 6})})
    assert [e for e in events if e.type == "io.profwatch.culprit_rotates.v1"] == []
    assert not ep.rotation and not b.rotating


def test_a_rotations_hold_is_its_longest_unbroken_hot_period_not_first_to_last_naming() -> None:
    """Ranks 2 and 3 are hot for a minute (captured), again for a minute 50 minutes later (captured), then the hot
    spot moves to 4 and 5: a rotation whose hot periods last about a minute. Its hold (twice the longest) is taken
    from unbroken stretches of naming: the healthy 50 minutes in between are no hot period (before: 3060 s, so a
    real straggler on that key had to persist 6120 s)."""
    b, p = book(min_arm_gap_s=0, episode_quiet_steps=20, max_captures_per_hour=6)
    t, step = T0, 100
    for k, pair in enumerate(((2, 3), (2, 3))):
        ep, _ = b.observe(window_out(step, pair), t)
        assert ep is not None and arm_next(b, p, t + 1, f"c{k}", covered=pair) is ep
        b.capture_ended(f"c{k}", t + 20, "simulated")
        for i in range(1, 8):  # named for ~60 s, then healthy
            b.advance(t + 10 * i, furthest_step=step + 20 * i,
                      ongoing={"rank_outlier": frozenset(pair) if i < 7 else frozenset()})
        assert not b.open
        t, step = t + 3000, step + 6000
    t, step = t - 3000 + 300, step - 6000 + 600
    b.observe(window_out(step, (4, 5)), t)
    key = next(iter(b.rotating))
    assert b.rotating[key][1] <= 120.0, b.rotating


def test_the_tops_of_keys_of_closed_episodes_are_bounded() -> None:
    """Each ranked key keeps the top ranks of its captures (for rotations across episodes); keys whose episodes
    closed are forgotten first once more than MAX_OPEN are kept (before: one entry per key ever seen, unbounded)."""
    from collections import deque

    from profwatch.core.arming.episodes import MAX_OPEN

    b, p = book(min_arm_gap_s=0)
    for k in range(3 * MAX_OPEN):  # keys of episodes long closed
        b._tops[f"rank_outlier/old{k}"] = deque([(k, f"e{k}", f"c{k}", T0, ())])
    ep, _ = b.observe(window_out(117, (3,)), T0)
    assert ep is not None
    arm_next(b, p, T0 + 1, "c-3", covered=(3,))
    b.capture_ended("c-3", T0 + 20, "simulated")
    assert ep.key in b._tops and len(b._tops) <= MAX_OPEN + 1


def _drift_spends_the_hour(b: JobEpisodes, p: ArmingPolicy) -> tuple[Episode, float, int]:
    """A job-wide drift: one episode whose level grows 12 % a report, captured again after each cooldown (its
    verdicts name nobody it can be pinned on): 4 arms of the hour's cap of 4 by T0 + 2,703 s."""
    t, step, mag = T0, 100, 0.15
    drift = None
    for k in range(4):
        drift, _ = b.observe(reg(step, mag=mag), t)
        assert drift is not None
        assert arm_next(b, p, t, f"d{k}") is drift, (k, drift.waiting)
        b.capture_ended(f"d{k}", t + 60, "ok", named=(0,))
        t, step, mag = t + 901, step + 1800, mag * 1.3
    assert drift is not None
    return drift, t - 901 + 100, step - 1800 + 200


def test_repeats_of_a_drifting_job_wide_episode_never_hold_a_new_slow_node() -> None:
    """A drift's own captures (one job-wide episode captured again as it grew) spent the hourly cap; a node 1.3x
    slower found 5 steps after its onset then waited for the hour to pass (the corpus' drift class: lost while it
    lasted). A repeat never holds a new named-rank episode: it arms at once, on the NAMED_RESERVE (one more arm
    than the cap); a second new node in the same hour waits, so the hour's arms stay bounded at cap + 1."""
    b, p = book(max_captures_per_hour=4)
    drift, t, step = _drift_spends_the_hour(b, p)
    assert b.history.state(t, capture_in_flight=False).captures_last_hour == 4
    node, _ = b.observe(out(step, (4, 5, 6, 7), mag=0.3), t)
    assert node is not None and not node.is_repeat
    assert arm_next(b, p, t, "n1", covered=(4, 5, 6, 7)) is node
    b.capture_ended("n1", t + 60, "ok", named=(4, 5, 6, 7))
    other, _ = b.observe(out(step + 100, (9,), mag=0.5), t + 120)
    assert other is not None
    assert b.next_arm(p, t + 120, capture_in_flight=False) is None
    assert other.waiting == "hourly_cap"
    assert other.waiting_until_unix_s == T0 + 3600  # the drift's first arm leaves the hour: 5 -> 4 arms
    assert b.history.state(t + 120, capture_in_flight=False).captures_last_hour == 5


def test_new_episodes_still_share_the_hourly_cap_when_no_repeat_holds_it() -> None:
    """The reserve is only for what repeats took: 4 new named episodes fill the cap of 4, a fifth waits the hour
    (a new job-wide episode after a job-wide episode of another key is no repeat either)."""
    b, p = book(max_captures_per_hour=4, min_arm_gap_s=0)
    for k in range(4):
        ep, _ = b.observe(out(100 + k, (k,), mag=0.5, stage=f"stage{k}"), T0 + k)
        assert arm_next(b, p, T0 + k, f"c{k}", covered=(k,)) is ep
        b.capture_ended(f"c{k}", T0 + k + 0.5, "ok", named=(k,))
    fifth, _ = b.observe(out(200, (9,), mag=0.5, stage="stage9"), T0 + 10)
    assert fifth is not None and b.next_arm(p, T0 + 10, capture_in_flight=False) is None
    assert (fifth.waiting, fifth.waiting_until_unix_s) == ("hourly_cap", T0 + 3600)


def test_a_slow_rank_reported_as_many_short_episodes_on_a_rotating_key_is_captured_once_its_naming_persists() -> None:
    """The live serving pair (bench_live_serving, load 4-19): two healthy ranks named on cpu/step 35 s apart, both
    captures found nobody, the key read as a rotating culprit (0, 1) (by the names' move, at rank 1's next naming:
    a capture that found nobody names no top rank for the verdicts' rule). Then rank 1 got 30 % slower for good: named 14
    s after its onset, but as 9 short episodes in 5 minutes (each closed quiet between reports, the next opened 10-20 s
    later), none lasting 300 s: every one waited as a rotation member and nothing was captured. Its naming persisted:
    counted from the start of its stretch in the key's trail (the only rank named on the key meanwhile), it is a slow
    rank of its own after 5 minutes and 60 steps."""
    b, p = book(max_captures_per_hour=4, episode_quiet_steps=50, min_arm_gap_s=30)
    t, step = T0, 2_000
    for rank, cid in ((0, "c0"), (1, "c1")):
        ep, _ = b.observe(out(step, (rank,), mag=0.13, stage="cpu/step"), t)
        assert ep is not None and arm_next(b, p, t + 1, cid, covered=(0, 1)) is ep
        b.capture_ended(cid, t + 20, "no_suspect")
        b.advance(t + 34, furthest_step=step + 60, ongoing={"rank_outlier": frozenset()})
        t, step = t + 35, step + 160
    assert b.rotating == {}  # found nobody twice: no verdict named a top rank (the names rotate: below)
    t, step = T0 + 600, 5_000  # 9 minutes later the real change
    captured_at = None
    for k in range(60):  # a report every 30 s for 30 min, each episode closing quiet before the next
        now, at = t + 30 * k, step + 900 * k
        ep, _ = b.observe(out(at, (1,), mag=0.14, stage="cpu/step"), now)
        assert ep is not None and "rank_outlier/cpu/step" in b.rotating  # the names moved 0 -> 1: rotation
        b.advance(now + 5, furthest_step=at + 20, ongoing={"rank_outlier": frozenset({1})})
        if arm_next(b, p, now + 5, f"c-slow-{k}", covered=(0, 1)) is not None:
            captured_at = now + 5 - t
            break
        b.advance(now + 25, furthest_step=at + 800, ongoing={"rank_outlier": frozenset()})  # quiet: it closes
    assert captured_at is not None and 300 <= captured_at <= 340, captured_at


def test_a_capture_that_found_no_suspect_names_no_rank_for_the_rotation_rule() -> None:
    """Live serving pair: a false arm on healthy rank 0 found nobody (``no_suspect``); then rank 1 got 30 % slower,
    was named, captured, and its verdict named rank 1. The found-nobody capture counted the detector's rank 0 as
    its top, so the verdicts read 0 -> 1 across episodes (``culprit_rotates`` at rank 1's verdict), and the names'
    move 0 -> 1 was a rotation too at rank 1's next report. A verdict that named nobody names no top, and a rank a
    verdict named is no move's destination: rank 1's episode is a slow rank, not a rotation. Within one episode the
    same: rank 0 found nobody, the new rank 1 captured and named. Before: ``culprit_rotates`` in both."""
    b, p = book(max_captures_per_hour=4, episode_quiet_steps=50, min_arm_gap_s=30)
    ep0, _ = b.observe(out(2_000, (0,), mag=0.13, stage="cpu/step"), T0)
    assert ep0 is not None and arm_next(b, p, T0 + 1, "c0", covered=(0, 1)) is ep0
    events = b.capture_ended("c0", T0 + 20, "no_suspect")
    events += b.advance(T0 + 34, furthest_step=2_060, ongoing={"rank_outlier": frozenset()})
    assert ep0.closed_unix_s is not None
    ep1, evs = b.observe(out(2_200, (1,), mag=0.3, stage="cpu/step"), T0 + 60)
    events += evs
    assert ep1 is not None and arm_next(b, p, T0 + 61, "c1", covered=(0, 1)) is ep1
    events += b.capture_ended("c1", T0 + 90, "ok", named=(1,))
    for k in range(1, 6):  # still named: reported again
        _, evs = b.observe(out(2_200 + 20 * k, (1,), mag=0.3, stage="cpu/step"), T0 + 90 + 10 * k)
        events += evs
    assert [e for e in events if e.type == "io.profwatch.culprit_rotates.v1"] == []
    assert ep1.rotation == () and not ep1.rotating_member and b.rotating == {}

    b, p = book(max_captures_per_hour=4, cooldown_s=0, min_arm_gap_s=0)
    ep, _ = b.observe(out(10, (0,)), T0)
    assert ep is not None and arm_next(b, p, T0, "c0", covered=(0, 1)) is ep
    events = b.capture_ended("c0", T0 + 20, "no_suspect")
    b.observe(out(60, (1,)), T0 + 30)  # a new rank: captured again
    assert arm_next(b, p, T0 + 30, "c1", covered=(0, 1)) is ep
    events += b.capture_ended("c1", T0 + 50, "ok", named=(1,))
    assert [e for e in events if e.type == "io.profwatch.culprit_rotates.v1"] == [] and ep.rotation == ()


def test_a_rank_found_after_a_job_wide_arm_is_armed_before_the_gap_ends_and_a_restart_keeps_that() -> None:
    """Issue 31 (bench_corpus seed 36, class levels, run 4): a job-wide episode armed at T0; rank 1 went slower and
    was reported 6 s later: it is armed at once, not after min_arm_gap_s (before: held 60 s, past the run's end).
    A second named episode then waits the gap. A restart rebuilds the history from the store and the episodes
    (``arm_marks``): the job-wide arm is known as one naming no ranks, the named one as naming ranks."""
    b, p = book(min_arm_gap_s=60)
    job, _ = b.observe(reg(400, mag=0.3), T0)
    assert arm_next(b, p, T0, "c-job") is job
    assert b.capture_ended("c-job", T0 + 5, "simulated") == []
    slow, _ = b.observe(out(540, (1,), mag=0.3), T0 + 6)
    assert slow is not None and arm_next(b, p, T0 + 6, "c-1", covered=(0, 1)) is slow
    assert b.capture_ended("c-1", T0 + 10, "simulated") == []
    other, _ = b.observe(out(600, (5,), mag=0.4), T0 + 12)
    assert other is not None and b.next_arm(p, T0 + 12, capture_in_flight=False) is None
    assert other.waiting == "min_arm_gap" and other.waiting_until_unix_s == T0 + 66
    assert b.arm_marks("c-job") == (False, False) and b.arm_marks("c-1") == (False, True)
    assert b.arm_marks("manual") == (False, False)
    # a restart (as CoordinatorShell.start does): episodes from the store, the hour's arms again, marked from them
    b2, _ = book(min_arm_gap_s=60)
    b2.restore([Episode.from_json(json.loads(json.dumps(e.to_json()))) for e in (*b.closed, *b.open.values())])
    for cid, at in (("c-job", T0), ("c-1", T0 + 6)):
        b2.history.record_arm(at, cid)
        repeat, named = b2.arm_marks(cid)
        b2.history.mark_arm(cid, repeat=repeat, named=named)
    assert b2.history.state(T0 + 12, capture_in_flight=False).last_arm_named
    b2.history.withdraw("c-1")
    assert not b2.history.state(T0 + 12, capture_in_flight=False).last_arm_named


@pytest.mark.parametrize("status", ["simulated", "failed"])
def test_a_culprit_that_rotates_back_before_a_verdictless_capture_ends_still_rotates(status: str) -> None:
    """Rank 0 hot, captured; rank 3 hot 400 s later (0 healthy), captured; rank 0 hot again before that second
    capture ends without a verdict (replay's ``simulated``, a ``failed`` one): the culprit moved 0 -> 3, as with
    ``ok`` verdicts naming 0 then 3. At 57f44b3 ``_moved`` read the trail's latest naming of 0 (after the second
    arm) as "0 still slow then", and no rotation was recognised (8a68eca: recognised)."""
    b, p = book(rotation_captures=2, cooldown_s=0, min_arm_gap_s=0)
    ep, _ = b.observe(out(10, (0,)), T0)
    for k in range(1, 9):
        b.observe(out(10 + k, (0,)), T0 + 10 * k)  # rank 0 hot T0 .. T0 + 80
    assert arm_next(b, p, T0 + 1, "c0", covered=(0,)) is ep
    events = b.capture_ended("c0", T0 + 30, status)
    for k in range(9):
        b.observe(out(300 + k, (3,)), T0 + 400 + 10 * k)  # rank 3 hot T0 + 400 .. T0 + 480
    assert arm_next(b, p, T0 + 401, "c1", covered=(3,)) is ep
    b.observe(out(900, (0,)), T0 + 900)  # rank 0 hot again, 820 s after it was last named
    events += b.capture_ended("c1", T0 + 910, status)
    assert ep is not None and ep.rotation == (0, 3)
    assert [e.type for e in events] == ["io.profwatch.culprit_rotates.v1"]
