"""The msprof-analyze runner against misbehaving tools: an orphan that keeps the pipes open, cancellation at
daemon shutdown. The tool is a small script standing in for msprof-analyze (the failure is what is under test)."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

from daemon.adapters import msprof_runner
from daemon.adapters.msprof_runner import MsprofSettings, cancel_running, resume_runs, run_msprof_analysis
from daemon.simulate.ascend_tree import generate_cluster
from tests.conftest import wait_for


def _tool(tmp: Path, body: str) -> str:
    p = tmp / "fake-msprof-analyze"
    p.write_text("#!/bin/sh\n" + body + "\n")
    p.chmod(p.stat().st_mode | stat.S_IXUSR)
    return str(p)


def test_descendant_holding_the_pipes_cannot_hang_an_analysis(tmp_path: Path) -> None:
    dirs = generate_cluster(tmp_path / "batch", world_size=4, slow_ranks={2: 1.5})
    # exits at once but leaves a detached child holding stdout/stderr
    tool = _tool(tmp_path, "setsid sleep 300 & exit 0")
    settings = MsprofSettings(command=tool, timeout_s=2, advisor=False, advisor_html=False, retries=0)
    ev = run_msprof_analysis(dirs[0].parent, tmp_path / "out", settings=settings, world_size=4)
    ran = {k: r for k, r in ev.recipes.items() if r.status != "skipped"}  # advisor is off in these settings
    assert set(ran) == {"cluster_time_summary", "slow_rank", "communication_matrix"}
    assert {r.status for r in ran.values()} <= {"timeout", "tool_error", "no_data"}, ev.recipes
    os.system("pkill -f 'sleep 300' >/dev/null 2>&1")  # the orphan belongs to this test


def test_cancel_running_stops_an_analysis_promptly(tmp_path: Path) -> None:
    dirs = generate_cluster(tmp_path / "batch", world_size=4)
    tool = _tool(tmp_path, "sleep 300")
    settings = MsprofSettings(command=tool, timeout_s=600, advisor=False, advisor_html=False, retries=0)
    result: dict = {}
    t = threading.Thread(target=lambda: result.update(ev=run_msprof_analysis(
        dirs[0].parent, tmp_path / "out", settings=settings, world_size=4)), name="test-analysis")
    t.start()
    try:
        wait_for(lambda: msprof_runner._running, 20, what="the tool to start")
        cancel_running()
        t.join(30)
        assert not t.is_alive()
        ev = result["ev"]
        assert all(r.status != "ok" for r in ev.recipes.values())
        assert any("cancelled" in (r.log_tail + r.detail) for r in ev.recipes.values()), ev.recipes
    finally:
        resume_runs()
        t.join(30)
