"""Recovery: the coordinator killed in the middle of a capture and restarted still tracks it, analyses the batch
and publishes its alert exactly once (real daemons, a real gloo job)."""

from __future__ import annotations

import json
import signal
import tempfile
from pathlib import Path

import pytest

from profwatch.adapters.zmq.control import ControlUnavailable, call
from profwatch.commands.demo import Stack
from profwatch.simulate.launcher import JobSpec, launch_job
from tests.conftest import wait_for

pytestmark = pytest.mark.slow


def _events(stack: Stack, job: str, alerts_only: bool) -> list[dict]:
    try:
        return [r["event"] for r in call(stack.control, "events", {"job_id": job, "alerts_only": alerts_only,
                                                                     "limit": 500}, timeout_s=5)]
    except ControlUnavailable:
        return []


def _captures(stack: Stack, job: str) -> list[dict]:
    try:
        return call(stack.control, "captures", {"job_id": job}, timeout_s=5)
    except ControlUnavailable:
        return []


def _diagnosis(stack: Stack, tmp_path: Path) -> str:
    """What the coordinator saw, for a wait that timed out: its job status, the events so far and its log's tail."""
    try:
        status = json.dumps(call(stack.control, "status", {"job_id": "rec"}, timeout_s=5), default=str)[:3000]
    except (ControlUnavailable, TypeError, ValueError) as exc:
        status = f"status unavailable: {exc!r}"
    events = [e.get("type") for e in _events(stack, "rec", False)]
    log = tmp_path / "logs" / "coordinator.log"
    tail = log.read_text(errors="replace").splitlines()[-15:] if log.exists() else []
    return f"\nstatus: {status}\nevents: {events}\ncoordinator.log tail:\n" + "\n".join(tail)


def test_coordinator_killed_mid_capture_still_analyses_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.conftest import SOURCE_PATHS

    monkeypatch.setenv("PYTHONPATH", SOURCE_PATHS)
    runtime = Path(tempfile.mkdtemp(prefix="pwrec", dir="/tmp"))
    stack = Stack(tmp_path, runtime, nodes=1)
    stack.start()
    job = None
    try:
        spec = JobSpec(job_id="rec", world_size=4, node_endpoints=[stack.endpoint(0)],
                       profiler_config_path=tmp_path / "cfg" / "rec", prof_root=tmp_path / "prof", mode="torch",
                       slow_rank=1, slowdown=3.0, slow_at_step=60, stop_file=tmp_path / "stop", max_seconds=400,
                       log_dir=tmp_path / "logs")
        # 4 ranks: the slow rank is found by the rank-outlier detector (it needs 4 ranks to compare, and no job
        # baseline). With 2 ranks only the job's step-time regression could find it, and when the job's first steps
        # ran at another level the baseline was still being learned at the slowdown, which it then learned as
        # normal: no finding at all (2 fresh-clone runs). This test is about the restart.
        job = launch_job(spec)
        try:
            arm = wait_for(lambda: next((e for e in _events(stack, "rec", False) if e["type"] == "io.profwatch.arm.v1"
                                         and e["data"].get("status") == "written"), None), 180, 0.5, "capture armed")
        except AssertionError as exc:
            raise AssertionError(f"{exc}{_diagnosis(stack, tmp_path)}") from None
        capture_id = arm["data"]["capture_id"]
        # kill -9 the coordinator while the capture is pending, then start a fresh one on the same state
        coord = stack.procs.pop("coordinator")
        coord.send_signal(signal.SIGKILL)
        coord.wait(timeout=20)
        stack.start_coordinator_only()
        caps = call(stack.control, "captures", {"job_id": "rec"}, timeout_s=5)
        assert any(c["capture_id"] == capture_id for c in caps), caps  # still tracked after the restart

        def suspects() -> list[dict]:
            return [e for e in _events(stack, "rec", True) if e["type"] == "io.profwatch.suspect_ranks.v1"]

        got = wait_for(suspects, 240, 0.5, "suspect alert after restart")
        assert got[0]["data"]["capture_id"] == capture_id
        assert got[0]["data"]["suspects"][0]["rank"] == 1
        # torch.profiler captures carry the steps they hold (read from the traces), and they are the armed ones
        armed, captured = got[0]["data"]["armed_steps"], got[0]["data"]["captured_steps"]
        assert armed and captured and set(armed) <= set(captured), (armed, captured)
        # no duplicate: wait for the capture's life to end (its follow-up, the suspects' op comparison), count again
        wait_for(lambda: any(c["capture_id"] == capture_id and c["state"] in ("analysed", "enriched")
                             and not c.get("running") for c in _captures(stack, "rec")), 60, 0.5, "capture analysed")
        assert len([e for e in suspects() if e["data"]["capture_id"] == capture_id]) == 1
    finally:
        if job is not None:
            job.request_stop()
            job.wait(60)
        stack.stop()
