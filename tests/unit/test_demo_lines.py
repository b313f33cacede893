"""The demo's closing lines name the rank they point at (commands/demo.py)."""

from __future__ import annotations

from profwatch.commands.demo import drill_down_line


def test_drill_down_names_the_rank() -> None:
    s = {"rank": 2, "rank_dir": "/tmp/x/vm_29084_20261206070000123_ascend_pt"}
    assert drill_down_line(s) == "drill down (rank 2): /tmp/x/vm_29084_20261206070000123_ascend_pt"
    assert drill_down_line({"rank": 0, "rank_dir": "/d"}) == "drill down (rank 0): /d"  # rank 0 is a rank
    assert drill_down_line({"rank_dir": "/d"}) == "drill down: /d"
