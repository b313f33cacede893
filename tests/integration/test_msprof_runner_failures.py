"""The msprof-analyze runner against misbehaving tools: an orphan that keeps the pipes open, timeouts, cancellation
per analysis and at shutdown, what each command is handed (absolute paths, fresh -o, --force, no stdin, UTF-8).
The tool is a small shell script standing in for msprof-analyze (the failure is what is under test)."""

from __future__ import annotations

import json
import os
import signal
import stat
import threading
from pathlib import Path
from typing import Any

import pytest

from profwatch.adapters.tools.msprof_analysis import run_msprof_analysis
from profwatch.adapters.tools.msprof_runner import MsprofRunner, MsprofSettings
from profwatch.core.verdict.evidence import ClusterEvidence
from profwatch.simulate.ascend_tree import generate_cluster
from tests.conftest import kill_group_in, wait_for

NO_ADVISOR = {"advisor": False, "advisor_html": False, "retries": 0}


def _tool(tmp: Path, body: str) -> str:
    p = tmp / "fake-msprof-analyze"
    p.write_text("#!/bin/sh\n" + body + "\n")
    p.chmod(p.stat().st_mode | stat.S_IXUSR)
    return str(p)


def _in_thread(fn: Any, name: str) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}
    t = threading.Thread(target=lambda: out.update(ev=fn()), name=name)
    t.start()
    return t, out


def test_descendant_holding_the_pipes_cannot_hang_an_analysis(tmp_path: Path) -> None:
    dirs = generate_cluster(tmp_path / "batch", world_size=4, slow_ranks={2: 1.5})
    pidfile = tmp_path / "orphan.pid"
    # exits at once but leaves a detached child (own session) holding stdout/stderr; it records its pid
    tool = _tool(tmp_path, f"setsid sh -c 'echo $$ > {pidfile}; exec sleep 300' & exit 0")
    try:
        with MsprofRunner(MsprofSettings(command=tool, timeout_s=2, **NO_ADVISOR)) as runner:
            ev = run_msprof_analysis(dirs[0].parent, tmp_path / "out", runner=runner, world_size=4)
        ran = {k: r for k, r in ev.recipes.items() if r.status != "skipped"}  # advisor is off in these settings
        assert set(ran) == {"cluster_time_summary", "slow_rank", "communication_matrix"}
        assert {r.status for r in ran.values()} <= {"timeout", "tool_error", "no_data"}, ev.recipes
    finally:
        kill_group_in(pidfile)  # the orphan this test's tool started, by its process group


def test_timeout_kills_the_process_group(tmp_path: Path) -> None:
    dirs = generate_cluster(tmp_path / "batch", world_size=4)
    pidfile = tmp_path / "child.pid"
    tool = _tool(tmp_path, f"sh -c 'echo $$ > {pidfile}; exec sleep 300' & wait")
    try:
        with MsprofRunner(MsprofSettings(command=tool, timeout_s=1, **NO_ADVISOR)) as runner:
            ev = run_msprof_analysis(dirs[0].parent, tmp_path / "out", runner=runner, world_size=4)
        for name in ("cluster_time_summary", "slow_rank"):
            assert ev.recipes[name].status == "timeout" and "killed after" in ev.recipes[name].detail
        pid = int(pidfile.read_text())
        wait_for(lambda: not Path(f"/proc/{pid}").exists() or "Z" in _proc_state(pid), 10,
                 what="the tool's child killed with its group")
    finally:
        kill_group_in(pidfile)


def _proc_state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "gone"


def test_close_stops_an_analysis_promptly_and_refuses_new_runs(tmp_path: Path) -> None:
    dirs = generate_cluster(tmp_path / "batch", world_size=4)
    runner = MsprofRunner(MsprofSettings(command=_tool(tmp_path, "exec sleep 300"), timeout_s=600, **NO_ADVISOR))
    t, result = _in_thread(lambda: run_msprof_analysis(dirs[0].parent, tmp_path / "out", runner=runner,
                                                       world_size=4, owner="b1"), "test-analysis")
    try:
        running = wait_for(runner.running, 20, what="the tool to start")
        # The alert phase runs its recipes side by side, so which one started first is up to the scheduler.
        assert all(r.owner == "b1" and r.elapsed_s >= 0 for r in running), running
        assert {r.name for r in running} <= {"cluster_time_summary", "slow_rank"}, running
        runner.close()
        t.join(30)
        assert not t.is_alive()
        ev: ClusterEvidence = result["ev"]
        assert all(r.status == "cancelled" for n, r in ev.recipes.items() if n != "advisor"), ev.recipes
        assert all("cancelled" in r.detail for n, r in ev.recipes.items() if n != "advisor"), ev.recipes
        later = runner.run("slow_rank", ["-m", "slow_rank"], tmp_path / "later")
        assert later.cancelled and later.returncode is None and "closed" in later.cancel_reason
        assert not later.timed_out  # cancelled, not timed out
    finally:
        runner.close()
        t.join(30)


def test_cancel_one_analysis_leaves_the_other_running(tmp_path: Path) -> None:
    dirs = generate_cluster(tmp_path / "batch", world_size=4)
    settings = MsprofSettings(command=_tool(tmp_path, "exec sleep 300"), timeout_s=600, max_concurrent_runs=4,
                              **NO_ADVISOR)
    runner = MsprofRunner(settings)
    threads = [_in_thread(lambda o=owner: run_msprof_analysis(dirs[0].parent, tmp_path / o, runner=runner,
                                                              world_size=4, owner=o), f"test-{owner}")
               for owner in ("A", "B")]
    try:
        wait_for(lambda: {r.owner for r in runner.running()} == {"A", "B"}, 20, what="both analyses running")
        assert runner.cancel("A") >= 1
        threads[0][0].join(30)
        assert not threads[0][0].is_alive()
        ev_a: ClusterEvidence = threads[0][1]["ev"]
        assert {r.status for r in ev_a.recipes.values()} == {"cancelled", "skipped"}
        assert "analysis of A was cancelled" in ev_a.recipes["cluster_time_summary"].detail
        assert threads[1][0].is_alive() and {r.owner for r in runner.running()} == {"B"}
        assert runner.cancel_all() >= 1  # everything started so far
        threads[1][0].join(30)
        assert not threads[1][0].is_alive()
    finally:
        runner.close()
        for t, _ in threads:
            t.join(30)


def test_no_drill_down_compare_starts_once_the_analysis_is_cancelled(tmp_path: Path) -> None:
    """Shutdown during the enrich phase: the drill-down's ``msprof-analyze compare`` runs on the analysis's
    ticket, so after ``cancel_all`` none starts (the tool would leave a file) and the recipe says ``cancelled``."""
    from profwatch.analysis.drilldown import compare_ascend_suspects
    from profwatch.core.verdict.evidence import RankStepSummary

    started = tmp_path / "started"
    runner = MsprofRunner(MsprofSettings(command=_tool(tmp_path, f"touch {started}; exec sleep 300"),
                                         timeout_s=600, **NO_ADVISOR))
    dirs = {r: str(tmp_path / f"rank{r}") for r in range(3)}
    rows = [RankStepSummary(r, 1, 1000.0 * (1 + r), 1000.0 * (1 + r), 0.0, 0.0, 0.0, 0.0) for r in range(3)]
    try:
        ticket = runner.ticket("b1")  # issued with the analysis, before the shutdown
        runner.cancel_all()
        ops, status = compare_ascend_suspects(runner, dirs, [2, 1], 0, rows, tmp_path / "out", batch_id="b1",
                                              ticket=ticket)
        assert ops == [] and status.status == "cancelled", status
        assert "cancelled" in status.detail and not started.exists()
    finally:
        runner.close()


def test_runs_after_cancel_all_proceed(tmp_path: Path) -> None:
    runner = MsprofRunner(MsprofSettings(command=_tool(tmp_path, "echo '{\"status\": \"success\"}'"), **NO_ADVISOR))
    try:
        runner.cancel_all()
        run = runner.run("cluster_time_summary", ["-m", "cluster_time_summary"], tmp_path / "out")
        assert not run.cancelled and run.returncode == 0 and run.agent.status == "success"
    finally:
        runner.close()


RECORDER = r"""
out="$(pwd)/../argv-$$.json"
TOOL_STDIN="$(readlink /proc/$$/fd/0)"
export TOOL_STDIN
python3 - "$@" > "$out" <<'EOF'
import json, os, sys
print(json.dumps({"argv": sys.argv[1:], "cwd": os.getcwd(), "stdin": os.environ["TOOL_STDIN"],
                  "lc_all": os.environ.get("LC_ALL"), "log": os.environ.get("MSPROF_ANALYZE_LOG_FILE")}))
EOF
"""


def test_every_path_handed_to_the_tool_is_absolute(tmp_path: Path, monkeypatch: Any) -> None:
    """``--out`` relative to the caller's cwd: the tool runs in its own -o folder, so relative paths would point
    nowhere (the issue's tool_error on every recipe). Also: fresh -o per command, --force, no stdin, UTF-8."""
    generate_cluster(tmp_path / "data" / "batch", world_size=4)
    monkeypatch.chdir(tmp_path)
    settings = MsprofSettings(command=_tool(tmp_path, RECORDER), advisor=True, advisor_html=True, retries=0)
    with MsprofRunner(settings) as runner:
        run_msprof_analysis(Path("data/batch"), Path("rel-out"), runner=runner, world_size=4)
    calls = [json.loads(p.read_text()) for p in (tmp_path / "rel-out").glob("argv-*.json")]
    assert len(calls) == 5, calls  # cluster_time_summary, communication_matrix, slow_rank, advisor (json, html)
    outs = []
    for c in calls:
        argv = c["argv"]
        d, o = argv[argv.index("-d") + 1], argv[argv.index("-o") + 1]
        assert d == str(tmp_path / "data" / "batch") and os.path.isabs(o) and c["cwd"] == o
        assert "--force" in argv and c["stdin"] == "/dev/null" and c["lc_all"] == "C.UTF-8"
        assert os.path.isabs(c["log"])
        outs.append(o)
    assert len(set(outs)) == len(calls)  # a fresh -o per command


def _sigint_as_at_a_terminal() -> None:
    """In the child before exec: SIGINT at its default, as in a shell at a terminal. An ignored SIGINT is inherited
    across exec (and Python then installs no KeyboardInterrupt handler); something earlier in a full test run leaves
    the test process's SIGINT ignored at the OS level, which made the Ctrl-C case hang in 3 of 3 full runs."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_or_sigterm_on_profwatch_analyze_leaves_no_tool_running(tmp_path: Path, sig: signal.Signals) -> None:
    """The tool runs in its own session (a kill must reach its descendants), so a Ctrl-C at the terminal, or the
    SIGTERM a scheduler or `timeout` sends, does not reach it: the CLI itself must end it, promptly (issue 24 item
    11: SIGTERM left the tools running)."""
    import subprocess
    import time

    from tests.conftest import PYTHON, finish_process, python_env

    generate_cluster(tmp_path / "batch", world_size=4)
    pidfile = tmp_path / "tool.pid"
    tool = _tool(tmp_path, f"echo $$ > {pidfile}; exec sleep 300")
    cfg = tmp_path / "profwatch.toml"
    cfg.write_text(f'[analysis.msprof]\ncommand = "{tool}"\nadvisor = false\nretries = 0\n')
    # -X faulthandler: a CLI that does not end is made to dump its threads (SIGABRT), so the failure says where
    cli = subprocess.Popen([PYTHON, "-X", "faulthandler", "-m", "profwatch.cli", "analyze", str(tmp_path / "batch"),
                            "--config", str(cfg),
                            "--out", str(tmp_path / "out")], env=python_env(), stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, preexec_fn=_sigint_as_at_a_terminal)
    try:
        wait_for(lambda: pidfile.exists() and pidfile.read_text().strip().isdigit(), 60, what="the tool started")
        pid = int(pidfile.read_text())
        t0 = time.monotonic()
        cli.send_signal(sig)
        try:
            rc = cli.wait(30)
        except subprocess.TimeoutExpired:
            cli.send_signal(signal.SIGABRT)
            dump = cli.communicate(timeout=20)[0]
            raise AssertionError(f"the CLI did not end within 30 s of {sig.name}; its threads:\n"
                                 f"{dump.decode(errors='replace')[-6000:]}") from None
        if sig == signal.SIGTERM:
            assert rc == 128 + signal.SIGTERM
        assert time.monotonic() - t0 < 30
        wait_for(lambda: not Path(f"/proc/{pid}").exists() or "Z" in _proc_state(pid), 10,
                 what="the tool killed with the CLI")
    finally:
        finish_process(cli, 10, terminate=True)
        kill_group_in(pidfile)


def test_a_ctrl_c_between_two_submits_still_cancels_the_tool_already_running(tmp_path: Path) -> None:
    """Ctrl-C can land while the phase still submits its commands (the first tool already runs): the runs of the
    session must be cancelled then too, or the pool's exit waits for that tool forever (a CI run once hung there:
    `profwatch analyze` did not end within 30 s of SIGINT)."""
    from profwatch.adapters.tools.msprof_analysis import prepare_msprof, run_phase
    from profwatch.core.verdict.msprof_plan import RecipeCommand

    dirs = generate_cluster(tmp_path / "batch", world_size=4)
    settings = MsprofSettings(command=_tool(tmp_path, "exec sleep 120"), timeout_s=600, max_concurrent_runs=4,
                              **NO_ADVISOR)
    runner = MsprofRunner(settings)

    class Interrupting:
        """A command whose arguments are read (in the submitting thread) once the first tool runs: Ctrl-C then."""

        name, ranks, phase = "slow_rank", None, "alert"

        @property
        def args(self) -> tuple[str, ...]:
            wait_for(lambda: bool(runner.running()), 20, what="the first tool running")
            raise KeyboardInterrupt

    def go() -> ClusterEvidence:
        ev, session = prepare_msprof(dirs[0].parent, tmp_path / "out", runner=runner, world_size=4)
        first = RecipeCommand("cluster_time_summary", ("-m", "cluster_time_summary", "-d", str(dirs[0].parent)))
        return run_phase(session, ev, "alert", runner=runner, commands=[first, Interrupting()])  # type: ignore[list-item]

    out: dict[str, Any] = {}

    def target() -> None:
        try:
            go()
        except BaseException as exc:  # noqa: BLE001 - the interrupt is what the test expects back
            out["exc"] = exc

    t = threading.Thread(target=target, name="test-interrupted-phase")
    try:
        t.start()
        t.join(30)
        assert not t.is_alive(), "the phase still waits for the tool it started"
        assert isinstance(out.get("exc"), KeyboardInterrupt)
        assert runner.running() == []
    finally:
        runner.close()
        t.join(150)
