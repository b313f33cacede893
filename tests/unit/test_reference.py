"""The reference capture's policy (core/changes/reference.py) on a fake clock."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from profwatch.core.changes.reference import (
    JobReference,
    ReferenceInfo,
    ReferenceSettings,
    decide_reference,
    yield_start_after,
)

T0 = 1_800_000_000.0
S = ReferenceSettings(steady_s=300, max_age_s=3600, retry_after_s=600)


def _decide(ref: JobReference, now: float, *, s: ReferenceSettings = S, generation: int = 0, act: bool = True,
            busy: bool = False, held: int = 0, estimate: int = 100, cap: int | None = 10_000) -> tuple[bool, str]:
    d = decide_reference(s, ref, now, generation=generation, act_mode=act, slot_busy=busy, bytes_last_hour=held,
                         estimated_bytes=estimate, byte_cap=cap)
    return d.take, d.reason


def _steady(ref: JobReference, now: float, **kw: float | int | None) -> str | None:
    args: dict = {"open_episodes": 0, "baseline_step_s": 0.5, "recent_step_s": 0.51, "tolerance": 0.1, **kw}
    return ref.observe(now, **args)


def test_a_job_steady_for_steady_s_takes_its_reference_and_not_before() -> None:
    ref = JobReference()
    assert _decide(ref, T0) == (False, "no_baseline")  # warm-up: the detector has no baseline yet
    assert _steady(ref, T0) is None
    assert _decide(ref, T0 + 299) == (False, "settling")
    d = decide_reference(S, ref, T0 + 10, generation=0, act_mode=True, slot_busy=False, bytes_last_hour=0,
                         estimated_bytes=1, byte_cap=None)
    assert d.until_unix_s == T0 + 300
    assert _decide(ref, T0 + 300) == (True, "take")


@pytest.mark.parametrize(("kw", "why"), [({"open_episodes": 1}, "episode_open"),
                                         ({"baseline_step_s": None}, "no_baseline"),
                                         ({"recent_step_s": None}, "no_baseline"),
                                         ({"recent_step_s": 0.6}, "off_baseline"),
                                         ({"recent_step_s": 0.4}, "off_baseline")])
def test_any_unsteady_moment_restarts_the_clock(kw: dict, why: str) -> None:
    ref = JobReference()
    _steady(ref, T0)
    assert _steady(ref, T0 + 200, **kw) == why
    assert _decide(ref, T0 + 301) == (False, why)
    _steady(ref, T0 + 302)  # steady again: steady_s counts from here
    assert _decide(ref, T0 + 601) == (False, "settling")
    assert _decide(ref, T0 + 602) == (True, "take")


def test_a_step_time_within_the_tolerance_is_steady() -> None:
    ref = JobReference()
    assert _steady(ref, T0, recent_step_s=0.549) is None
    assert _steady(ref, T0 + 1, recent_step_s=0.451) is None
    assert ref.steady_since_unix_s == T0


def test_off_disabled_observe_mode_a_busy_slot_and_the_byte_cap_hold_it() -> None:
    ref = JobReference()
    _steady(ref, T0)
    now = T0 + 400
    assert _decide(ref, now, s=S.model_copy(update={"enabled": False})) == (False, "disabled")
    assert _decide(ref, now, act=False) == (False, "not_act_mode")
    assert _decide(ref, now, busy=True) == (False, "capture_in_flight")
    assert _decide(ref, now, held=9_950, estimate=100) == (False, "byte_cap")  # it counts toward bytes
    assert _decide(ref, now, held=9_900, estimate=100) == (True, "take")
    assert _decide(ref, now, cap=None, held=10**15) == (True, "take")


def test_one_reference_per_generation_until_max_age_and_a_retry_wait_after_a_failure() -> None:
    ref = JobReference()
    _steady(ref, T0)
    now = T0 + 400
    ref.armed("c1", now)
    assert _decide(ref, now + 1) == (False, "in_flight")
    ref.ended("c1", "failed", None)  # not analysed: tried again after retry_after_s
    assert _decide(ref, now + 599) == (False, "retry_wait")
    assert _decide(ref, now + 600) == (True, "take")
    ref.armed("c2", now + 600)
    ref.ended("c2", "analysed", ReferenceInfo("c2", 0, now + 600, "/p/c2/", "b2", 0.5, 2))
    assert ref.latest is not None and ref.latest.capture_id == "c2"
    assert _decide(ref, now + 700) == (False, "fresh")
    assert _decide(ref, now + 600 + 3599) == (False, "fresh")
    assert _decide(ref, now + 600 + 3600) == (True, "take")  # max_age_s: refreshed
    short = S.model_copy(update={"max_age_s": 60.0})  # shorter than retry_after_s: no retry wait after a success
    assert _decide(ref, now + 600 + 60, s=short) == (True, "take")
    # a new generation asks for its own, after it has been steady again
    ref.new_generation()
    assert _decide(ref, now + 800, generation=1) == (False, "no_baseline")
    _steady(ref, now + 800)
    assert _decide(ref, now + 1100, generation=1) == (True, "take")
    assert ref.latest.capture_id == "c2"  # the old one stays the baseline until a new one lands


def test_an_older_result_never_replaces_a_newer_reference() -> None:
    ref = JobReference()
    ref.ended("b", "analysed", ReferenceInfo("b", 0, T0 + 10, "/p/b/", "bb"))
    ref.ended("a", "analysed", ReferenceInfo("a", 0, T0, "/p/a/", "ba"))
    assert ref.latest is not None and ref.latest.capture_id == "b"
    assert ref.latest.to_json(T0 + 70)["age_s"] == 60.0


def test_an_episode_over_a_cancelled_reference_starts_after_its_window() -> None:
    assert yield_start_after(120, 1, 4, 118) == 7  # the reference records steps 121..124: the episode starts at 125
    assert yield_start_after(120, 1, 4, 125) == 0
    assert yield_start_after(120, 1, 4, 300) == 0


def test_settings_are_checked() -> None:
    with pytest.raises(ValidationError):
        ReferenceSettings(active_steps=0)
    with pytest.raises(ValidationError):
        ReferenceSettings(max_age_s=0)
    with pytest.raises(ValidationError):  # under an hour: references would outrun the hourly capture cap
        ReferenceSettings(max_age_s=60)
    assert ReferenceSettings(max_age_s=3600).max_age_s == 3600
    with pytest.raises(ValidationError):
        ReferenceSettings(unknown=1)  # type: ignore[call-arg]
    assert ReferenceSettings().enabled is True  # on by default


def test_status_text_shows_each_jobs_reference_or_what_it_waits_for() -> None:
    from profwatch.core.status_text import render_status

    ref = JobReference()
    ref.ended("c2", "analysed", ReferenceInfo("c2", 1, T0, "/p/c2/", "b2", 0.5, 2))
    views = [{"job_id": "j1", "latest": ref.latest.to_json(T0 + 90) if ref.latest else None, "in_flight": None,
              "waiting": "fresh"},
             {"job_id": "j2", "latest": None, "in_flight": None, "waiting": "settling"}]
    text = "\n".join(render_status({"jobs": [], "nodes": [], "references": views}))
    assert "j1: c2 (generation 1, 90 s old, step time 0.5 s)" in text
    assert "j2: none yet; waits: settling (for the job to stay steady for [reference] steady_s)" in text


def test_every_reason_a_reference_waits_for_is_said_in_words() -> None:
    """status said only the reason word (``sim-job: none yet; waits: off_baseline``), which a new user cannot
    read without docs/reference.md; every reason ``decide_reference`` and ``JobReference.observe`` give now has
    its words (``take``, ``fresh`` and ``in_flight`` render as the reference itself or ``taking C``)."""
    import inspect
    import re

    from profwatch.core.changes import reference
    from profwatch.core.status_text import REFERENCE_WAITS, render_reference

    src = inspect.getsource(reference)
    reasons = set(re.findall(r'ReferenceDecision\((?:False|True), "(\w+)"', src)) | set(re.findall(r'why = "(\w+)"', src))
    assert {"no_baseline", "off_baseline", "episode_open", "settling", "byte_cap"} <= reasons, reasons
    assert reasons - {"take", "fresh", "in_flight", "job_ended"} == set(REFERENCE_WAITS), reasons
    for why in REFERENCE_WAITS:  # the words sit in "(for ...)": no parentheses of their own
        [line] = render_reference({"job_id": "j", "latest": None, "in_flight": None, "waiting": why})
        assert line.count("(") == 1 and line.endswith(")"), line
    [line] = render_reference({"job_id": "j", "latest": None, "in_flight": None, "waiting": "off_baseline"})
    assert line == ("  j: none yet; waits: off_baseline (for the step time to be within [reference] "
                    "step_time_tolerance of the baseline)")
    assert "come back" not in line  # the job may never have been slower: the words claim nothing


def test_an_ended_job_says_no_reference_will_come_not_what_it_waits_for() -> None:
    """A user report: ``gloo-job: none yet; waits: no_baseline (for the detector to know ...)`` for a job whose
    ranks all left: nothing will come, the line says so and names no wait."""
    from profwatch.core.status_text import render_reference

    ref = JobReference()
    assert _steady(ref, T0, recent_step_s=None) == "no_baseline"  # its ranks are silent: no recent step time
    d = decide_reference(S, ref, T0, generation=0, act_mode=True, slot_busy=False, bytes_last_hour=0,
                         estimated_bytes=1, byte_cap=None, job_ended=True)
    assert (d.take, d.reason, d.until_unix_s) == (False, "job_ended", None)
    [line] = render_reference({"job_id": "gloo-job", "latest": None, "in_flight": None, "waiting": d.reason})
    assert line.startswith("  gloo-job: none yet; job_ended: none will come, the job ended"), line
    assert "waits" not in line and "no_baseline" not in line, line


def test_an_episode_holds_the_reference_for_a_bounded_time_only() -> None:
    """Issue 31, finding 10: load episodes that never close kept a busy job without a reference for 25 minutes."""
    from profwatch.core.changes.reference import episodes_holding

    s = ReferenceSettings()
    assert s.episode_yield_s == 900
    opened = [T0, T0 + 600]
    assert episodes_holding(opened, T0 + 899, s.episode_yield_s) == 2
    assert episodes_holding(opened, T0 + 900, s.episode_yield_s) == 1
    assert episodes_holding(opened, T0 + 1500, s.episode_yield_s) == 0
    ref = JobReference()
    assert _steady(ref, T0 + 1500, open_episodes=episodes_holding(opened, T0 + 1500, s.episode_yield_s)) is None
