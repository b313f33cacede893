"""The reference capture in the capture shell (fake collaborators and clock, real registry, store and workers): it is
armed once the job is steady, never counted toward max_captures_per_hour, never alerted on, handed to the analysis of
later captures, and it yields the config slot to an episode's arm."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from profwatch.arming.port import arm_reply
from profwatch.core.capture.lifecycle import CaptureState
from profwatch.core.capture.planner import CaptureRequest
from tests.integration.test_capture_shell import T0, World, _complete_batch

REF = "io.profwatch.reference_captured.v1"


@pytest.fixture
def steady(tmp_path: Path):
    made: list[World] = []

    def make(**kw: Any) -> World:
        w = World(tmp_path, reference={"steady_s": 10}, **kw)
        w.shell.detectors.baseline_step_time_s = lambda job_id: 0.5  # type: ignore[method-assign]
        made.append(w)
        return w

    yield make
    for w in made:
        w.close()


def _reference_armed(w: World) -> str:
    w.shell.tick(T0)
    assert not w.writes  # steady since T0: settling
    assert w.shell.references.view("j1", T0)[0]["waiting"] == "settling"
    w.now = T0 + 10
    w.shell.tick(w.now)
    (ref,) = [c for c in w.store.captures("j1") if c.reason == "reference"]
    w.drain(lambda: w.state(ref.capture_id) is CaptureState.WRITTEN)
    return ref.capture_id


def test_a_steady_job_takes_one_reference_outside_the_hourly_cap_never_alerted_and_compared_later(steady) -> None:
    w = steady(arming={"max_captures_per_hour": 1})
    cid = _reference_armed(w)
    assert w.writes[-1][1]["metadata"]["profwatch_reason"] == "reference"
    assert w.writes[-1][1]["active"] == 4  # [reference] active_steps
    hist = w.shell._job("j1").history
    st = hist.state(w.now, capture_in_flight=False)
    assert st.captures_last_hour == 0 and st.bytes_last_hour > 0  # bytes count, the hourly cap does not
    w.batches = [_complete_batch(cid)]
    w.now += 6
    w.shell.tick(w.now)
    w.drain(lambda: w.state(cid) is CaptureState.ANALYSED)
    assert not w.of("io.profwatch.suspect_ranks.v1")  # never alerted on
    (done,) = w.of(REF)
    assert done["capture_id"] == cid and done["outcome"] == "suspect_ranks"
    w.now += 1
    w.shell.tick(w.now)
    (view,) = w.shell.references.view("j1", w.now)
    assert view["latest"]["capture_id"] == cid and view["latest"]["batch_id"] == f"b-{cid}"
    assert view["waiting"] == "fresh" and w.shell.references.protected() == {f"b-{cid}"}
    for _ in range(3):  # one per generation: no second reference while it is fresh
        w.now += 60
        w.shell.tick(w.now)
    assert [c.reason for c in w.store.captures("j1")] == ["reference"]
    # a later capture (the one the hourly cap allows) is analysed with the reference handed over; the job got 3x
    # slower by then (the detector re-learned): the reference is still checked against the step time it was
    # planned at, not the slowed one (every slowdown's verdict said "the reference may not show the healthy job")
    w.shell.detectors.baseline_step_time_s = lambda job_id: 1.5  # type: ignore[method-assign]
    w.now += 1
    later = w.arm()["capture_id"]
    assert hist.state(w.now, capture_in_flight=False).captures_last_hour == 1
    w.drain(lambda: w.state(later) is CaptureState.WRITTEN)
    w.batches = [_complete_batch(later)]
    w.now += 6
    w.shell.tick(w.now)
    w.drain(lambda: w.state(later) is CaptureState.ANALYSED)
    (verdict,) = w.of("io.profwatch.suspect_ranks.v1")
    assert verdict["capture_id"] == later
    assert verdict["reference"]["capture_id"] == cid and verdict["reference"]["telemetry_baseline_step_s"] == 0.5


def test_an_episode_arm_cancels_the_reference_and_starts_after_its_window(steady) -> None:
    w = steady()
    cid = _reference_armed(w)
    assert w.shell._slot_held_for_episodes("j1") is False  # an episode never waits for a reference
    ref = w.store.get_capture(cid)
    dry = arm_reply(w.shell.arm("j1", CaptureRequest(job_id="j1", reason="step_regression"), w.now, dry_run=True))
    assert "refused" not in dry and w.state(cid) is CaptureState.WRITTEN  # a dry run cancels nothing
    w.now += 1
    plan = w.arm()
    assert w.state(cid) is CaptureState.CANCELLED
    assert "an episode's arm" in w.store.get_capture(cid).outcome
    assert plan["start_step"] >= ref.start_step + ref.warmup + ref.active
    w.drain(lambda: w.state(plan["capture_id"]) is CaptureState.WRITTEN)
    assert w.writes[-1][1]["metadata"]["profwatch_capture_id"] == plan["capture_id"]
    assert cid in w.idle_writes[-1][1]["metadata"]["profwatch_idle"]  # the idle config went over it first
    assert not w.of("io.profwatch.suspect_ranks.v1") and not w.of("io.profwatch.batch_incomplete.v1")
    # the cancelled reference is tried again once the job is steady and the retry wait is over
    (view,) = w.shell.references.view("j1", w.now)
    assert view["last_outcome"] == "cancelled" and view["latest"] is None


def test_no_reference_in_observe_mode_or_when_turned_off(tmp_path: Path) -> None:
    for arming, reference in (({"mode": "observe"}, {"steady_s": 0}), ({}, {"steady_s": 0, "enabled": False})):
        w = World(tmp_path / str(len(arming)), arming=arming, reference=reference)
        try:
            w.shell.detectors.baseline_step_time_s = lambda job_id: 0.5  # type: ignore[method-assign]
            for k in range(3):
                w.shell.tick(T0 + k * 2)
            assert not w.store.captures("j1") and not w.writes
        finally:
            w.close()


def test_a_capture_analysed_while_the_reference_is_still_analysed_is_compared_with_it(steady) -> None:
    w = steady()
    cid = _reference_armed(w)
    w.release.clear()  # the reference's analysis runs until released
    w.batches = [_complete_batch(cid)]
    w.now += 6
    w.shell.tick(w.now)
    w.drain(lambda: w.state(cid) is CaptureState.ANALYSING)
    assert w.shell._slot_held_for_episodes("j1") is False
    later = w.arm()["capture_id"]  # its window follows: the reference's analysis holds no slot
    w.drain(lambda: w.state(later) is CaptureState.WRITTEN)
    w.batches = [_complete_batch(later)]
    w.now += 6
    w.shell.tick(w.now)
    w.drain(lambda: w.state(later) is CaptureState.ANALYSING)
    w.release.set()
    w.drain(lambda: w.state(later) is CaptureState.ANALYSED and w.state(cid) is CaptureState.ANALYSED)
    (verdict,) = w.of("io.profwatch.suspect_ranks.v1")
    assert verdict["capture_id"] == later and verdict["reference"]["capture_id"] == cid


def test_retention_never_offers_the_newest_reference_and_offers_an_older_one(steady) -> None:
    w = steady()
    offered: list[list[tuple[str, str, int]]] = []
    w.shell.steps.scanner.retain = lambda analysed, now: offered.append(list(analysed)) or []  # type: ignore[method-assign]
    w.shell.steps.watch = w.shell.steps.watch.model_copy(update={"retention_max_bytes": 1})
    first = _reference_armed(w)
    w.batches = [_complete_batch(first)]
    w.now += 6
    w.shell.tick(w.now)
    w.drain(lambda: w.state(first) is CaptureState.ANALYSED and bool(offered))
    assert all(b != f"b-{first}" for _p, b, _w in offered[-1])  # the job's only reference: kept
    # a newer reference (past max_age_s) makes the first an ordinary analysed capture for retention
    w.shell.references.s = w.settings.model_copy(update={"reference": w.settings.reference.model_copy(
        update={"max_age_s": 1.0})})
    w.now += 2
    w.shell.tick(w.now)
    (second,) = [c.capture_id for c in w.store.captures("j1") if c.reason == "reference" and c.capture_id != first]
    w.drain(lambda: w.state(second) is CaptureState.WRITTEN)
    w.batches = [_complete_batch(second)]
    w.now += 6
    w.shell.tick(w.now)
    n = len(offered)
    w.drain(lambda: w.state(second) is CaptureState.ANALYSED and len(offered) > n)
    ids = {b for _p, b, _w in offered[-1]}
    assert f"b-{first}" in ids and f"b-{second}" not in ids
    assert w.shell.references.protected() == {f"b-{second}"}


def test_a_restarted_shell_keeps_the_reference_out_of_the_hourly_cap_and_hands_it_over(tmp_path: Path) -> None:
    from profwatch.adapters.store.state import StateStore

    w = World(tmp_path, reference={"steady_s": 10}, arming={"max_captures_per_hour": 1})
    w.shell.detectors.baseline_step_time_s = lambda job_id: 0.5  # type: ignore[method-assign]
    cid = _reference_armed(w)
    w.batches = [_complete_batch(cid)]
    w.now += 6
    w.shell.tick(w.now)
    w.drain(lambda: w.state(cid) is CaptureState.ANALYSED)
    w.close()
    w2 = World(tmp_path, store=StateStore(tmp_path / "state.db"), reference={"steady_s": 10},
               arming={"max_captures_per_hour": 1}, now=w.now + 5)
    try:
        (view,) = w2.shell.references.view("j1", w2.now)  # rebuilt from the stored captures (reason reference)
        assert view["latest"]["capture_id"] == cid and w2.shell.references.protected() == {f"b-{cid}"}
        assert w2.shell._job("j1").history.state(w2.now, capture_in_flight=False).captures_last_hour == 0
        later = w2.arm()["capture_id"]  # a later capture is compared with the restored reference
        w2.drain(lambda: w2.state(later) is CaptureState.WRITTEN)
        w2.batches = [_complete_batch(later)]
        w2.now += 6
        w2.shell.tick(w2.now)
        w2.drain(lambda: w2.state(later) is CaptureState.ANALYSED)
        (verdict,) = w2.of("io.profwatch.suspect_ranks.v1")
        assert verdict["reference"]["capture_id"] == cid
    finally:
        w2.close()


def test_an_anomaly_during_the_reference_window_is_armed_at_once_through_the_episode_queue(steady) -> None:
    from profwatch.core.detection.job_detector import Anomaly

    w = steady()
    cid = _reference_armed(w)
    w.now += 1
    w.shell.on_anomaly(Anomaly(kind="step_regression", job_id="j1", step=22, ranks=(), magnitude=0.4), w.now)
    (armed,) = [d for d in w.of("io.profwatch.arm_decision.v1") if d["action"] == "arm"]  # no capture_in_flight
    assert w.state(cid) is CaptureState.CANCELLED and armed["capture_id"] != cid
    ref = w.store.get_capture(cid)
    assert armed["start_step"] >= ref.start_step + ref.warmup + ref.active
    # the job is no longer steady: no new reference while the episode is open
    w.now += 700
    w.shell.tick(w.now)
    assert [c.capture_id for c in w.store.captures("j1") if c.reason == "reference"] == [cid]
    assert w.shell.references.view("j1", w.now)[0]["waiting"] == "episode_open"


def test_a_named_rank_regression_is_compared_with_the_reference_on_the_ranks_it_named(steady) -> None:
    """The episode's ranks travel in the capture's metadata (``profwatch_named_ranks``) to the analysis, which
    compares the capture with the reference on them; a manual arm names none (every rank both hold)."""
    from profwatch.core.detection.job_detector import Anomaly

    w = steady(arming={"min_arm_gap_s": 0}, world=4)
    cid = _reference_armed(w)
    w.batches = [_complete_batch(cid, 4)]
    w.now += 6
    w.shell.tick(w.now)
    w.drain(lambda: w.state(cid) is CaptureState.ANALYSED)
    w.now += 1
    w.shell.on_anomaly(Anomaly("rank_outlier", "j1", 30, (2,), 0.5, {"stage": {2: "forward"}, "excess": {2: 0.5}}),
                       w.now)
    (arm,) = [d for d in w.of("io.profwatch.arm_decision.v1") if d["action"] == "arm"]
    later = arm["capture_id"]
    w.drain(lambda: w.state(later) is CaptureState.WRITTEN)
    assert w.writes[-1][1]["metadata"]["profwatch_named_ranks"] == "2"
    w.batches = [_complete_batch(later, 4)]
    w.now += 6
    w.shell.tick(w.now)
    w.drain(lambda: w.state(later) is CaptureState.ANALYSED)
    (verdict,) = w.of("io.profwatch.suspect_ranks.v1")
    assert verdict["capture_id"] == later and verdict["reference"]["named_ranks"] == [2]
    w.now += 1000  # the episode's cooldown and the gap are over: a manual arm names no rank
    manual = w.arm()["capture_id"]
    w.drain(lambda: w.state(manual) is CaptureState.WRITTEN)
    assert "profwatch_named_ranks" not in w.writes[-1][1]["metadata"]
    w.batches = [_complete_batch(manual, 4)]
    w.now += 6
    w.shell.tick(w.now)
    w.drain(lambda: w.state(manual) is CaptureState.ANALYSED)
    assert w.of("io.profwatch.suspect_ranks.v1")[-1]["reference"]["named_ranks"] is None


def test_an_ended_job_takes_no_reference_and_says_so(steady) -> None:
    """A user report: status said ``waits: no_baseline`` for a job whose ranks all left; the desk says
    ``job_ended`` (docs/reference.md) and arms nothing."""
    w = steady()
    w.shell.tick(T0)
    assert w.shell.references.view("j1", T0)[0]["waiting"] == "settling"
    w.shell.references.jobs["j1"].ended_unix_s = T0 + 1  # the coordinator found it ended (registry.note_ended)
    w.now = T0 + 10
    w.shell.tick(w.now)
    assert w.shell.references.view("j1", w.now)[0]["waiting"] == "job_ended"
    assert not [c for c in w.store.captures("j1") if c.reason == "reference"] and not w.writes
