"""The demo itself, both scenarios, checked on its result (the README's first command runs the same code)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from tests.conftest import PYTHON, python_env

DEMO_TIMEOUT_S = 900
# the demo may take minutes on a loaded machine: give pytest-timeout more than the subprocess's own limit
pytestmark = [pytest.mark.slow, pytest.mark.timeout(DEMO_TIMEOUT_S + 60)]

ORDER = ["slowdown", "detection", "arm", "capture", "batch_complete", "analysis", "first_alert"]


def _run_demo(args: list[str]) -> subprocess.CompletedProcess[str]:
    """Run the demo in its own process group; whatever happens (timeout, test interrupted), end that group: the
    demo's daemons and rank processes are in it, and only they are (never killed by name)."""
    proc = subprocess.Popen([PYTHON, "-m", "profwatch.cli", "demo", *args], env=python_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=DEMO_TIMEOUT_S)
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # leftovers of a failed or interrupted demo; no-op when all ended
        except (ProcessLookupError, PermissionError):
            pass
        if proc.poll() is None:
            proc.wait(30)


def test_demo_both_scenarios_name_the_slow_rank(tmp_path: Path) -> None:
    res = _run_demo(["--workdir", str(tmp_path), "--ranks", "4", "--nodes", "2", "--slow-rank", "1",
                     "--slowdown", "3.0", "--at-step", "40", "--timeout-s", "300"])
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    (result_file,) = list(tmp_path.glob("run-*/demo_result.json"))
    result = json.loads(result_file.read_text())
    assert result["ok"] is True
    assert [s["scenario"] for s in result["scenarios"]] == ["torch", "ascend"]
    for sc in result["scenarios"]:
        alert = sc["alert"]
        assert alert["type"] == "io.profwatch.suspect_ranks.v1"
        assert alert["subject"] == sc["job_id"] and alert["specversion"] == "1.0"
        data = alert["data"]
        assert data["suspects"][0]["rank"] == 1
        assert Path(data["suspects"][0]["rank_dir"]).is_dir()
        assert Path(data["report"]).is_file()
        assert Path(data["report"]).with_suffix(".json").is_file()
        names = [m[0] for m in sc["marks"]]
        assert names[: len(ORDER)] == ORDER, (sc["scenario"], sc["marks"])  # pipeline order, every stage
        assert data["captured_steps"] and data["captured_steps"] == data["armed_steps"], data
        if data.get("pending_recipes"):  # the first alert announced a follow-up: the enriched update came after it
            assert names[-1] == "enriched_update", sc["marks"]
            enriched = sc["enriched_update"]["data"]  # the same capture and batch, nothing left pending
            assert (enriched["capture_id"], enriched["batch_id"]) == (data["capture_id"], data["batch_id"])
            assert not enriched.get("pending_recipes"), enriched
    # Ascend: the first alert is judged on the ranks' own tables, msprof-analyze confirms it in the enriched update
    ascend = result["scenarios"][1]
    assert ascend["alert"]["data"]["verdict_source"] == "own_tables", ascend["alert"]["data"]["recipes"]
    enriched = ascend["enriched_update"]["data"]
    recipes = enriched["recipes"]
    status = {k: (v["status"] if isinstance(v, dict) else v) for k, v in recipes.items()}
    assert status["cluster_time_summary"] == "ok" and status["slow_rank"] == "ok", recipes  # real msprof-analyze ran
    assert enriched["agreement"] and enriched["agreement"]["sentence"] in enriched["notes"], enriched["agreement"]
    assert res.stdout.count("(expected 1) -> OK") == 2, res.stdout
    for stage in ("detection", "batch_complete", "first_alert"):  # progress reached stderr while it happened
        assert re.search(rf"\[(torch|ascend)\] \+[\d.]+s {stage}: ", res.stderr), res.stderr[-4000:]


def test_demo_reference_scenario_says_what_changed_since_the_healthy_reference(tmp_path: Path) -> None:
    """`profwatch demo --scenario reference`: the coordinator takes its reference capture while the job is healthy;
    every rank then gets 3x slower (nobody stands out) and the verdict's changes are led by compute."""
    res = _run_demo(["--workdir", str(tmp_path), "--scenario", "reference", "--timeout-s", "300"])
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    (result_file,) = list(tmp_path.glob("run-*/demo_result.json"))
    (sc,) = json.loads(result_file.read_text())["scenarios"]
    names = [m[0] for m in sc["marks"]]
    assert names[: len(ORDER) + 1] == ["reference", *ORDER], sc["marks"]  # the reference came before the slowdown
    data = sc["alert"]["data"]
    assert data["status"] == "no_suspect" and data["changes"][0]["component"] == "compute", data["changes"]
    cmp = data["comparison"]
    assert cmp["reference"]["capture_id"] != data["capture_id"] and cmp["step_time_changed"], cmp
    # 3x compute: 2.8x the step on an idle box, 1.40x with two CPU hogs and a test suite beside it (load 11): the
    # comparison must say the step got markedly slower, not how much a starved box lets it
    assert cmp["step_time_now_s"] > 1.2 * cmp["step_time_baseline_s"]
    assert "what changed: +" in res.stdout and "-> OK" in res.stdout, res.stdout[-3000:]
