"""The demo's closing lines name the rank they point at (commands/demo.py)."""

from __future__ import annotations

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
