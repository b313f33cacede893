"""A load burst, then a slow rank, live (issue 20 item 1): a coordinator and two node daemons in threads, a real
4-rank gloo PyTorch job (torch.profiler backend) whose every rank gets 1.6x slower for a while (a job-wide burst
that names no rank), then whose rank 1 gets 3x slower for good. The burst arms the first capture; the slow rank is
its own episode, not held by that capture's cooldown: the first arm after its onset captures it and the alert
names rank 1."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from profwatch.core.alerts.event_types import TYPE_ANOMALY, TYPE_ARM_DECISION, TYPE_EPISODE_OPENED, TYPE_SUSPECT_RANKS
from profwatch.simulate.launcher import JobSpec, launch_job
from tests.conftest import python_env, wait_for
from tests.integration.live_stack import Stack

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]
JOB = "episodes-live"
# The burst starts well after the baseline is complete (warm-up 10 + 30 learned + lag 16 = step 56). A job-wide
# change while the baseline is still learning can be learned as the normal level (docs/detection.md): with the first
# steps slowed to 2x until step 45 (a busy box at job start), replays found a burst at step 50 in 0 of 20 runs and
# one at step 120 in 20 of 20 (CI at 351bcef: no arm for a burst at step 50; the first arm was the slow rank's).
# The burst lasts 150 steps: on a starved box the job's first steps run >= 1.5x slower and the speedup after them is
# remembered as a level the job left (core/detection/interruptions.py `left`); an alike excursion is then held up to
# MAX_HOLD_STEPS (60) as a possible return to it, and a 60-step burst ended inside the hold: never reported (CI at
# 57f44b3, load ~20: the first arm was the slow rank's, no anomaly before it). 150 steps outlast the hold and keep
# the capture window inside the burst; the slow rank comes 130 steps after it ends.
BURST_AT, BURST_STEPS, SLOW_AT, SLOW_RANK = 120, 150, 400, 1


def _events(st: Stack, type_: str) -> list[dict[str, Any]]:
    rows = st.control("events", {"job_id": JOB, "alerts_only": False, "limit": 10_000})
    return [r["event"]["data"] for r in rows if r["event"]["type"] == type_]


def _slow_rank_alert(st: Stack) -> dict[str, Any] | None:
    for d in _events(st, TYPE_SUSPECT_RANKS):
        sus = d.get("suspects") or []
        if sus and sus[0]["rank"] == SLOW_RANK and min(d.get("armed_steps") or [0]) > SLOW_AT:
            return d
    return None


def test_a_load_burst_then_a_slow_rank_the_slow_rank_is_captured_and_alerted(short_tmp: Path) -> None:
    root = short_tmp
    (root / "cfg" / JOB).mkdir(parents=True)
    (root / "prof").mkdir()
    # the demo's settings for 4 CPU ranks on 2 shared cores: 6 captured steps, a rank named for an 8 % excess
    st = Stack(root, ack_timeout_s=600.0, sections={"arming": {"active": 6, "min_arm_gap_s": 5.0},
                                                    "analysis": {"ranking": {"min_effect_frac": 0.08}}})
    job = None
    try:
        st.start()
        for node in ("n0", "n1"):
            st.node(node)
        job = launch_job(JobSpec(
            job_id=JOB, world_size=4, node_endpoints=[f"ipc://{root}/n0.sock", f"ipc://{root}/n1.sock"],
            profiler_config_path=root / "cfg" / JOB, prof_root=root / "prof", mode="torch", slow_rank=SLOW_RANK,
            slowdown=3.0, slow_at_step=SLOW_AT, burst_at_step=BURST_AT, burst_steps=BURST_STEPS, burst_factor=1.6,
            max_steps=5000, max_seconds=1000, stop_file=root / "stop", log_dir=root / "logs",
            extra_env={"PYTHONPATH": python_env()["PYTHONPATH"]}))
        alert = wait_for(lambda: _slow_rank_alert(st), 900, 1.0, "a verdict naming the slow rank")
        arms = [d for d in _events(st, TYPE_ARM_DECISION) if d["action"] == "arm"]
        # the burst armed first: a job-wide regression, its window before the slow rank. Not pinned to the burst's
        # own steps: at 10 % noise a young baseline can fire a few steps early (docs/detection.md, known limits), and
        # what this test is about is the capture after it, which must not hold the slow rank back
        assert arms[0]["anomaly"] == "step_regression" and arms[0]["step"] < SLOW_AT, arms
        assert arms[0]["start_step"] < SLOW_AT
        # the first arm whose window follows the slow rank's onset is the capture that names it
        after = [a for a in arms if a["start_step"] > SLOW_AT]
        assert after and after[0]["capture_id"] == alert["capture_id"], (arms, alert["capture_id"])
        opened = {d["episode_id"]: d for d in _events(st, TYPE_EPISODE_OPENED)}
        # an episode of its own, opened after the burst's (job-wide or named): not an update held by the burst
        # capture's cooldown. Not pinned to the slow rank's onset: in CI (b631a51, 4 ranks on 2 starved cores) a
        # job-wide episode opened between the burst's end and that onset, and the slow rank's capture covered it
        covered = [opened[e] for e in after[0]["covers"]]
        assert covered and all(ep["opened_step"] > BURST_AT + BURST_STEPS and ep["episode_id"] not in arms[0]["covers"]
                               for ep in covered), (
            [(ep["episode_id"], ep["opened_step"], ep["kind"], ep["ranks"]) for ep in covered],
            [(a.get("step"), a.get("kind"), a.get("magnitude"), a.get("ranks"), a.get("detail")) for a in _events(st, TYPE_ANOMALY)],
            [(a["step"], a["start_step"], a["covers"]) for a in arms])
        # status shows that episode with that capture and its verdict
        eps = {e["episode_id"]: e for e in st.control("status", {"job_id": JOB})["episodes"]}
        caps = {c["capture_id"]: c for c in eps[covered[0]["episode_id"]]["captures"]}
        assert caps[alert["capture_id"]]["named"][0] == SLOW_RANK, eps
    finally:
        if job is not None:
            job.stop()
        st.close()
