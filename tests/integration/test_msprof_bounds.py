"""The msprof-analyze runner's bounds with real processes: the memory watchdog on a tool's whole process session
(children that each stay under the cap but together pass it), the enrich phase's own slot and lower CPU priority,
and a real two-phase analysis whose advisor is killed at its cap while the verdict stands (issue 13).

The memory-eating tool is a small Python script standing in for msprof-analyze's process pool (the fault is what is
under test); the last test runs the real msprof-analyze for every recipe but the advisor."""

from __future__ import annotations

import os
import stat
import sys
import threading
from pathlib import Path
from typing import Any

from profwatch.adapters.fs.proc_memory import session_members
from profwatch.adapters.tools.msprof_runner import MsprofRunner, MsprofSettings, resolve_command
from profwatch.analysis.facade import AnalysisSettings, analyze_batch, enrich_analysis
from profwatch.core.batches.completeness import BatchState
from profwatch.simulate.ascend_tree import generate_cluster
from tests.conftest import kill_group_in, wait_for

MiB = 2**20
EATER = """
import os, sys, time
open(sys.argv[1], "w").write(str(os.getpid()))
n, mib = int(sys.argv[2]), int(sys.argv[3])
kids = []
for _ in range(n):
    pid = os.fork()
    if pid == 0:
        block = bytearray(mib * 2**20)
        for i in range(0, len(block), 4096):
            block[i] = 1
        time.sleep(300)
        os._exit(0)
    kids.append(pid)
time.sleep(300)
"""


def _eater(tmp: Path) -> str:
    """A stand-in tool: ``tool <anything> -o DIR`` forks N children holding M MiB each (env EAT=N,M)."""
    script = tmp / "eater.py"
    script.write_text(EATER)
    tool = tmp / "eat-tool"
    tool.write_text(f'#!/bin/sh\nexec {sys.executable} {script} "{tmp}/eater.pid" ${{EAT_N:-3}} ${{EAT_MIB:-120}}\n')
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    return str(tool)


def test_the_whole_process_group_is_capped_and_killed_as_oom(tmp_path: Path) -> None:
    os.environ["EAT_N"], os.environ["EAT_MIB"] = "3", "120"  # 3 x 120 MiB: each under the cap, together over it
    settings = MsprofSettings(command=_eater(tmp_path), memory_limit_bytes=256 * MiB, memory_limit="watchdog",
                              memory_poll_interval_s=0.1, timeout_s=120, retries=1)
    try:
        with MsprofRunner(settings) as runner:
            run = runner.run("advisor", ["advisor", "all"], tmp_path / "out", phase="enrich")
        pid = int((tmp_path / "eater.pid").read_text())
        assert run.oom and not run.timed_out and run.returncode is None and run.attempts == 1  # never retried
        assert run.peak_rss_bytes > 256 * MiB and "over the cap of 256 MiB" in run.oom_detail
        wait_for(lambda: not session_members(pid), 10, what="the tool's whole session to be gone")
    finally:
        os.environ.pop("EAT_N"), os.environ.pop("EAT_MIB")
        kill_group_in(tmp_path / "eater.pid")


def test_a_tool_under_its_cap_runs_to_its_end_and_reports_its_peak(tmp_path: Path) -> None:
    tool = tmp_path / "small-tool"
    tool.write_text(f"#!/bin/sh\nexec {sys.executable} -c 'b = bytearray(40 * 2**20); import time; time.sleep(1.5)'\n")
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    settings = MsprofSettings(command=str(tool), memory_limit_bytes=512 * MiB, memory_poll_interval_s=0.1, retries=0)
    with MsprofRunner(settings) as runner:
        run = runner.run("slow_rank", ["-m", "slow_rank"], tmp_path / "out")
    assert run.returncode == 0 and not run.oom and 30 * MiB < run.peak_rss_bytes < 512 * MiB


def test_enrich_runs_have_their_own_slot_and_a_lower_priority(tmp_path: Path) -> None:
    """With one alert slot, an advisor running already does not delay a verdict's recipe; and it runs niced."""
    tool = tmp_path / "nice-tool"
    tool.write_text("#!/bin/sh\nps -o ni= -p $$ > nice.tmp && mv nice.tmp nice.txt\nexec sleep 30\n")
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    settings = MsprofSettings(command=str(tool), max_concurrent_runs=1, enrich_nice=7, timeout_s=60, retries=0)
    runs: dict[str, Any] = {}
    with MsprofRunner(settings) as runner:
        ticket = runner.ticket("b1")
        threads = [threading.Thread(target=lambda n=n, p=p: runs.update({n: runner.run(n, [], tmp_path / "o",
                                                                                       ticket=ticket, phase=p)}))
                   for n, p in (("advisor", "enrich"), ("cluster_time_summary", "alert"))]
        threads[0].start()
        wait_for(lambda: [r.name for r in runner.running()] == ["advisor"], 20, what="the advisor to start")
        threads[1].start()
        both = wait_for(lambda: r if len(r := runner.running()) == 2 else [], 20, what="both to run at once")
        assert {r.name: r.phase for r in both} == {"advisor": "enrich", "cluster_time_summary": "alert"}
        # each tool wrote its niceness (renamed into place when whole) before the cancel ends it
        wait_for(lambda: len(list(tmp_path.rglob("nice.txt"))) == 2, 30, what="both tools to record their nice value")
        runner.cancel("b1")
        for t in threads:
            t.join(30)
    nice = {n: int((Path(r.output_dir) / "nice.txt").read_text()) for n, r in runs.items()}
    base = os.nice(0)  # the suite may itself run niced (CI under `nice -n 19`): the kernel caps niceness at 19
    assert nice["cluster_time_summary"] == base, nice
    assert nice["advisor"] == min(19, base + 7), nice


def _batch(dirs: list[Path], world: int) -> BatchState:
    from profwatch.adapters.fs.rank_dir_fs import scan_tree

    (batch,) = scan_tree(dirs[0].parent, world_size=world)
    assert batch.status == "complete"
    return batch


def test_an_advisor_killed_at_its_cap_leaves_the_verdict_standing(tmp_path: Path) -> None:
    """Real cluster_time_summary and slow_rank; the "advisor" command eats memory: the alert phase names the slow
    rank, the enrich phase reports the advisor ``oom`` and the same verdict. The cap leaves the real recipes room:
    their pools' resident sets add up to about 300-400 MiB here (shared pages counted once per process)."""
    real = resolve_command("msprof-analyze")
    eater = _eater(tmp_path)
    wrapper = tmp_path / "msprof-or-eater"
    wrapper.write_text(f'#!/bin/sh\nif [ "$1" = advisor ]; then EAT_N=2 EAT_MIB=700 exec {eater}; fi\n'
                       f'exec {real} "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    dirs = generate_cluster(tmp_path / "batch", world_size=8, slow_ranks={5: 1.6}, steps=4)
    settings = AnalysisSettings()
    settings.msprof = MsprofSettings(command=str(wrapper), memory_limit_bytes=1024 * MiB, memory_limit="watchdog",
                                     memory_poll_interval_s=0.2, timeout_s=300, retries=0, communication_matrix=False)
    settings.own_tables = False  # the alert waits for msprof-analyze's recipes (the path when own tables cannot judge)
    settings.suspect_compare = False  # the advisor alone in the enrich phase: the drill-down has its own tests
    events: list[tuple[str, str]] = []
    try:
        with MsprofRunner(settings.msprof) as runner:
            result = analyze_batch(_batch(dirs, 8), work_dir=tmp_path / "work", settings=settings, runner=runner,
                                   enrich=False, progress=lambda e, n, s: events.append((e, n)))
            first = result.alert_data()
            assert result.status == "ok" and result.suspects[0].rank == 5
            assert first["pending_recipes"] == ["advisor"] and "advisor" not in first["recipes"]
            assert Path(first["report"]).name == "report.html"  # the report is written in both phases
            assert {n: r["phase"] for n, r in first["recipes"].items()} == {"cluster_time_summary": "alert",
                                                                             "slow_rank": "alert"}
            assert all(r["duration_s"] > 0 for r in first["recipes"].values())
            enrich_analysis(result, runner=runner, progress=lambda e, n, s: events.append((e, n)))
    finally:
        kill_group_in(tmp_path / "eater.pid")
    after = result.alert_data()
    adv = after["recipes"]["advisor"]
    assert adv["status"] == "oom" and adv["phase"] == "enrich" and adv["peak_rss_bytes"] > 1024 * MiB
    assert after["status"] == "ok" and after["suspects"][0]["rank"] == 5 and after["follow_up"] is True
    assert after["pending_recipes"] == [] and after["enrich_duration_s"] > 0
    assert Path(after["report"]).name == "report.html" and Path(after["report"]).is_file()
    order = [e for e, _ in events]
    assert order.index("verdict") < order.index("follow_up")
    assert ("started", "advisor") in events and order.index("verdict") < events.index(("started", "advisor"))
