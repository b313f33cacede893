"""The demo's closing lines name the rank they point at (commands/demo.py)."""

from __future__ import annotations

from pathlib import Path

from profwatch.commands.demo import drill_down_line


def test_drill_down_names_the_rank() -> None:
    s = {"rank": 2, "rank_dir": "/tmp/x/vm_29084_20261206070000123_ascend_pt"}
    assert drill_down_line(s) == "drill down (rank 2): /tmp/x/vm_29084_20261206070000123_ascend_pt"
    assert drill_down_line({"rank": 0, "rank_dir": "/d"}) == "drill down (rank 0): /d"  # rank 0 is a rank
    assert drill_down_line({"rank_dir": "/d"}) == "drill down: /d"


def test_a_missed_scenario_says_the_load_and_how_to_rerun_it() -> None:
    """A demo whose alert named nobody ended "FAILED" with no reason or next step (a new user at a load of 3-7); the
    last line now names the scenario, the load average and the command to rerun it."""
    from profwatch.commands.demo import _missed_hint

    line = _missed_hint(["torch", "ascend"])
    assert line.startswith("scenario torch, ascend: the alert did not name the slow rank (load average ")
    assert line.endswith("profwatch demo --scenario torch")


def test_the_wait_line_is_told_which_captures_are_being_analysed() -> None:
    """The ``reference`` demo's wait line said "seen: nothing yet" while its capture was enriching."""
    from profwatch.commands.demo import _in_flight

    st = {"captures": [{"capture_id": "c-1", "state": "enriching"}, {"capture_id": "c-0", "state": "analysed"},
                       {"capture_id": "c-2", "state": "analysing"}]}
    assert _in_flight(st) == ["c-1 enriching", "c-2 analysing"]
    assert _in_flight({}) == []


def test_the_reference_wait_says_why_the_coordinator_waits_and_takes_a_reference_whose_event_was_missed() -> None:
    """A CI run's ``reference`` scenario waited 600 s printing only "seen: nothing yet": the wait line and the
    timed-out result now carry the coordinator's own account (its reference's ``waiting`` reason and the open
    episodes), and an analysed reference in the ``status`` reply marks the stage when its PUB event was missed."""
    from profwatch.commands.demo import _reference_from_status
    from profwatch.commands.demo_timeline import Timeline

    tl = Timeline("reference", "j")
    tl.after_slowdown_only = True
    noted: list[str] = []
    ep = {"episode_id": "ep-1", "job_id": "j", "kind": "step_regression", "ranks": [], "scope": "", "magnitude": 0.6,
          "peak_magnitude": 0.7, "opened_step": 40, "reports": 2, "captures": [], "closed_unix_s": None}
    closed = {**ep, "episode_id": "ep-0", "closed_unix_s": 5.0}
    other = {**ep, "episode_id": "ep-9", "job_id": "k"}
    st = {"references": [{"job_id": "j", "latest": None, "in_flight": None, "waiting": "episode_open"}],
          "episodes": [closed, ep, other],
          "captures": [{"capture_id": "c-5", "job_id": "j", "reason": "step_regression", "state": "acknowledged",
                        "in_state_s": 412.3, "acknowledged_ranks": 4, "completed_ranks": 3, "expected_ranks": 4,
                        "start_step": 148},
                       {"capture_id": "c-4", "job_id": "j", "reason": "rank_outlier", "state": "analysed"},
                       {"capture_id": "c-6", "job_id": "k", "reason": "drift", "state": "collecting"}]}
    _reference_from_status(tl, st, lambda stage, t, detail: noted.append(stage), 100.0)
    assert tl.coordinator_says[0] == ("j: none yet; waits: episode_open (for the job to be healthy: an anomaly "
                                      "episode is open)")
    assert len(tl.coordinator_says) == 3 and tl.coordinator_says[1].startswith("open episode ep-1 step_regression")
    assert tl.coordinator_says[2] == ("capture c-5 (step_regression) acknowledged for 412 s, ranks acknowledged 4, "
                                      "completed 3 of 4, window from step 148")
    line = tl.progress_line(100.0, 7, 160.0, "reference within 600 s of the job's start")
    assert line.endswith("60 s left of reference within 600 s of the job's start; the coordinator's reference: "
                         + tl.coordinator_says[0])
    assert noted == [] and tl.t("reference") is None

    latest = {"capture_id": "c-7", "generation": 0, "created_unix_s": 50.0, "age_s": 3.0, "step_time_s": 0.1}
    st["references"][0].update(latest=latest, waiting="fresh")
    _reference_from_status(tl, st, lambda stage, t, detail: noted.append(stage), 100.0)
    assert noted == ["reference"] and tl.t("reference") == 100.0  # seen then, not at its arm (50)
    assert "reference capture c-7" in tl.marks["reference"][2] and tl.waiting_for() == "slowdown"
    assert "the coordinator's reference" not in tl.progress_line(100.0, 7, 160.0, "slowdown")


def test_a_timed_out_scenario_is_not_said_to_have_missed_the_slow_rank() -> None:
    from profwatch.commands.demo import _missed_hint

    line = _missed_hint(["reference"], timed_out=["reference"])
    assert line.startswith("scenario reference: timed out (the result line above says waiting for what) (load ")
    assert "did not name" not in line


def test_no_episode_holds_the_demo_reference_for_the_scenario_s_whole_wait(tmp_path: Path) -> None:
    """An episode of a kind that stays open until its job ends (a periodic spike, a drift) held the reference for the
    default ``episode_yield_s`` (900 s), longer than the scenario's default ``--start-timeout-s`` (600 s): the demo's
    config lets an episode hold its reference a small part of that wait, steady time and a retry included, and an
    episode's capture that never completes holds the config slot (so the reference) a third of it at most."""
    from profwatch.commands.demo import demo
    from profwatch.commands.demo_stack import Stack
    from profwatch.config import load_settings

    wait = next(p.default for p in demo.params if p.name == "start_timeout_s")
    settings = load_settings(Stack(tmp_path, tmp_path, 2, reference=True).cfg)
    ref = settings.reference
    assert ref.episode_yield_s + ref.steady_s + ref.retry_after_s <= wait / 10, (ref, wait)
    # nor does a capture whose rank dirs never all arrive (it holds the slot until its window's end plus this)
    assert settings.watch.parse_allowance_s <= wait / 3
    (tmp_path / "b").mkdir()
    assert load_settings(Stack(tmp_path / "b", tmp_path / "b", 2).cfg).reference.episode_yield_s == 900.0


def test_a_reference_taken_from_status_says_what_the_status_knows_and_when_it_was_seen() -> None:
    """The ``status`` reply's reference (``ReferenceDesk.view``: ``ReferenceInfo.to_json``) carries no judged ranks
    nor captured steps, and its ``created_unix_s`` is when the reference capture was armed, not when it was
    analysed. The stage row says the reference's id, ranks and step time, never "steps none", and is placed when the
    reply showed it analysed (a reference_captured event's time is its analysis's end), not at its arm, before
    the capture even ran."""
    from profwatch.commands.demo import _reference_from_status
    from profwatch.commands.demo_timeline import Timeline
    from profwatch.core.changes.reference import ReferenceInfo

    tl = Timeline("reference", "j", after_slowdown_only=True)
    latest = ReferenceInfo("c-7", 0, 50.0, "/prof/c-7", "b-7", 0.1, 4).to_json(90.0)
    st = {"references": [{"job_id": "j", "latest": latest, "in_flight": None, "waiting": "fresh"}]}
    _reference_from_status(tl, st, lambda stage, t, detail: None, 90.0)
    detail = tl.marks["reference"][2]
    assert "steps none" not in detail and "c-7" in detail and "4 ranks" in detail and "0.1 s" in detail, detail
    assert tl.t("reference") == 90.0


def test_the_hint_says_which_scenario_timed_out_and_which_missed_the_slow_rank() -> None:
    """``--scenario both``: torch's alert did not name the slow rank, ascend timed out. Each is said for what it
    did; before, one timed-out scenario made the hint say every missed one had timed out."""
    from profwatch.commands.demo import _missed_hint

    line = _missed_hint(["torch", "ascend"], timed_out=["ascend"])
    assert line.startswith("scenario torch: the alert did not name the slow rank; scenario ascend: timed out "), line
    assert line.endswith("profwatch demo --scenario torch")


def test_a_scenario_that_timed_out_after_its_reference_does_not_repeat_the_account_of_the_reference_wait() -> None:
    """The coordinator's account is taken while the scenario waits for its reference; a scenario that got its
    reference (here by its event, so the last account still said "none yet") and then timed out waiting for the
    first alert does not print that account as the one "at the end of the wait": it says no reference came."""
    from profwatch.commands.demo import _reference_from_status, report
    from profwatch.commands.demo_timeline import Timeline

    tl = Timeline("reference", "j", after_slowdown_only=True)
    st = {"references": [{"job_id": "j", "latest": None, "in_flight": "c-7", "waiting": "in_flight"}]}
    _reference_from_status(tl, st, lambda stage, t, detail: None, 10.0)
    assert tl.coordinator_says
    tl.add("reference", 20.0, 60, "reference capture c-7: healthy baseline")
    tl.add("slowdown", 21.0, 62, "every rank x3")
    tl.timed_out = "no first alert within 240 s of the slowdown"
    out: list[str] = []
    assert not report(tl, 2, out.append)
    assert not any("the coordinator's account" in line for line in out), out
    tl2 = Timeline("reference", "j", after_slowdown_only=True)
    _reference_from_status(tl2, st, lambda stage, t, detail: None, 10.0)
    tl2.timed_out = "no reference within 600 s of the job's start (--start-timeout-s)"
    out = []
    assert not report(tl2, 2, out.append)
    assert any("the coordinator's account at the end of the wait: j: none yet; taking c-7" in line for line in out)
