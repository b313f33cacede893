"""``profwatch arm`` says the window it planned, in steps and in time (issue 35: without --in-steps a real
capture was armed with no line saying when)."""

from __future__ import annotations

from profwatch.commands.arm_wait import wait_for_arm, window_line


def test_the_planner_chosen_window_is_said_in_steps_and_seconds() -> None:
    res = {"start_step": 130, "warmup": 1, "active": 4, "furthest_step": 120, "step_time_s": 0.5}
    assert window_line(res, chosen=True) == (
        "window (the planner chose): warm-up from step 130, recording steps 131-134 (warmup 1, active 4), 10 steps "
        "ahead of the furthest rank (step 120): recording starts in about 6 s and lasts about 2 s at 0.5 s/step")
    assert window_line(res, chosen=False).startswith("window (asked for): ")


def test_without_a_step_time_the_window_is_said_in_steps_only() -> None:
    line = window_line({"start_step": 10, "warmup": 0, "active": 2, "furthest_step": 8, "step_time_s": None}, True)
    assert line.endswith("2 steps ahead of the furthest rank (step 8)") and "None" not in line


def test_arm_wait_shows_the_config_mtime_in_utc_and_its_age() -> None:
    """A new user's trial: ``arm --wait`` printed ``(mtime 1796657676)``, a raw epoch."""
    view = {"written_unix_s": 1796657676.5, "config_mtime_s": 1796657676, "node_writes": {"n1": "ok"},
            "profiler_config_path": "/p", "arm_settled": True, "acknowledged_ranks": 2, "expected_ranks": 2,
            "capture_id": "c-1", "state": "acknowledged", "start_step": 30}
    said: list[str] = []
    assert wait_for_arm(lambda: view, 1.0, said.append, sleep=lambda _s: None, clock=lambda: 0.0,
                        wall=lambda: 1796657676 + 125)
    assert said[0] == ("config written by node daemon(s) n1: /p/profiler_config.json "
                       "(modified 2026-12-07 15:34:36 UTC (2m05s ago))")
