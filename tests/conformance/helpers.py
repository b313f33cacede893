"""Assertions shared by the conformance tests (what the real monitor wrote vs what profwatch predicted/parsed)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from profwatch.adapters.fs.dp_log_tail import parse_line
from profwatch.core.capture.planner import CapturePlan, CaptureRequest, CaptureSettings, JobProgress, plan_capture
from rankhook import wire
from tests.conformance.conftest import NpuJob
from tests.conftest import wait_for

SETTINGS = CaptureSettings(warmup=1, active=2)
"""profwatch's defaults: warmup 1, active 2, analyse + async_mode, db export, the default lead margin."""

DP_LOG_KEYWORDS = ("Start step will be set to", "Start Dynamic Profiler at", "Stop Dynamic Profiler at",
                   "not in valid rank_list")
"""The real dp log messages that acknowledge an arm (docs/torch_npu-dynamic-profile.md#dp-logs)."""


def plan(job: NpuJob, *, settings: CaptureSettings = SETTINGS, **req: Any) -> CapturePlan:
    """Plan a capture with profwatch's planner from the ranks' current progress."""
    progress = JobProgress(job_id=job.job_id, world_size=job.world, furthest_step=max(job.progress()),
                           step_time_s=job.step_s, prof_root=str(job.prof), now_unix_s=time.time())
    return plan_capture(CaptureRequest(job_id=job.job_id, reason="conformance", **req), progress, settings)


def window_end(p: CapturePlan) -> int:
    return p.start_step + p.warmup + p.active


def wait_stopped(job: NpuJob, step: int, ranks: list[int], timeout_s: float = 120.0) -> None:
    """Wait until every rank in ``ranks`` logged "Stop Dynamic Profiler at ``step`` step." (or a rank died)."""
    line = f"Stop Dynamic Profiler at {step} step."
    wait_for(lambda: all(job.dp_lines_with(r, line) for r in ranks) or not job.alive(), timeout_s, 0.1, line)
    job.check_alive()


def hook_events(job: NpuJob, event: str, capture_id: str | None = None) -> dict[int, list[wire.CaptureEvent]]:
    """rank -> the backend's (``source="hook"``) events of one kind, as the coordinator received them."""
    out: dict[int, list[wire.CaptureEvent]] = {}
    for e in job.coord.captures("hook"):
        if e.event == event and (capture_id is None or e.capture_id == capture_id):
            out.setdefault(e.rank, []).append(e)
    return out


def wait_hook_events(job: NpuJob, event: str, capture_id: str | None, ranks: list[int],
                     timeout_s: float = 60.0) -> dict[int, list[wire.CaptureEvent]]:
    wait_for(lambda: set(ranks) <= set(hook_events(job, event, capture_id)), timeout_s, 0.1,
             f"{event} events of {capture_id} from ranks {ranks}")
    return hook_events(job, event, capture_id)


def dp_acks(job: NpuJob, event: str) -> dict[int, list[wire.CaptureEvent]]:
    """rank -> the node's dp-log acknowledgements (``source="dp_log"``) of one kind."""
    out: dict[int, list[wire.CaptureEvent]] = {}
    for e in job.coord.captures("dp_log"):
        if e.event == event:
            out.setdefault(e.rank, []).append(e)
    return out


def recorded_steps(rank_dir: Path, steps_log: list[dict[str, int]]) -> list[int]:
    """The ``ProfilerStep`` numbers the real profiler state machine recorded in ``rank_dir``.

    The native stand-in logs when the real ``profile`` object called ``_start_profiler`` and ``_stop_profiler``;
    iteration ``ProfilerStep#k`` runs between the end of the rank's ``step()`` call k and the start of call k+1 (torch_npu labels steps
    with the dp step counter via ``_set_step_num_offset_for_dynamic_prof``).
    """
    calls = [json.loads(x) for x in (rank_dir / "FRAMEWORK" / "profwatch_standin_calls.jsonl").read_text().splitlines()]
    t_start = next(c["t_ns"] for c in calls if c["call"] == "start")
    t_stop = next(c["t_ns"] for c in calls if c["call"] == "stop")
    before = {s["step"]: s["t_ns"] for s in steps_log}
    after = {s["step"]: s["t_after_ns"] for s in steps_log}
    return [k for k in sorted(after) if k + 1 in before and t_start <= after[k] and before[k + 1] <= t_stop]


def rank_dir_of(job: NpuJob, prof_dir: str, rank: int) -> Path:
    """The real rank dir of ``rank`` under ``prof_dir`` (the monitor names dirs by pid, not rank)."""
    pid = job.procs[rank].pid
    found = [d for d in job.rank_dirs(prof_dir) if f"_{pid}_" in d.name]
    assert len(found) == 1, f"rank {rank} (pid {pid}): expected one rank dir in {prof_dir}, got {found}"
    return found[0]


def assert_dp_log_parsed(job: NpuJob) -> None:
    """Every line of the real dp logs that acknowledges something is parsed by profwatch's tailer, into the
    event that line means; and no other line is parsed into an event."""
    for r in range(job.world):
        for line in job.dp_log(r):
            ev = parse_line(line, job.job_id, r, 0.0)
            if any(k in line for k in DP_LOG_KEYWORDS):
                assert ev is not None, f"profwatch's dp log tailer ignores the real line {line!r}"
                assert ev.ts_unix_s > 0, f"timestamp of {line!r} not parsed"
                if "Start step will be set to" in line:
                    n = int(line.rsplit(" ", 1)[1].rstrip("."))
                    assert ev.start_step == n and ev.event == ("arm_rejected" if n == 0 else "arm_seen"), line
                elif "Start Dynamic Profiler at" in line:
                    n = int(line.split(" at ")[1].split()[0])
                    assert ev.event == "started" and ev.step == n == ev.start_step, line
                elif "Stop Dynamic Profiler at" in line:
                    assert ev.event == "completed" and ev.step == int(line.split(" at ")[1].split()[0]), line
                else:
                    assert ev.event == "arm_rejected", line
            else:
                assert ev is None, f"profwatch's dp log tailer reads an event from the unrelated line {line!r}"
