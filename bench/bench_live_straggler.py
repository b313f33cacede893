"""Issue 31's live target: a straggler on a host whose load rises for good, found and alerted.

Each run: a coordinator and two node daemons (threads, as ``tests/e2e/test_episodes_live.py``), a real 4-rank gloo
PyTorch job (torch.profiler backend, ``profwatch.simulate.launcher``); at step ``--load-at`` ``--hogs`` busy-loop
processes start and stay for the rest of the run (the host gets busy and stays busy: every rank slows, the job
stays slower); at step ``--slow-at`` rank 1 gets ``--slowdown`` x slower for good. The run succeeds when an alert
(``suspect_ranks``) names rank 1 first from a capture armed after its onset, within ``--timeout-s``. Prints per run:
the arms (anomaly, step, the capture's verdict status), whether rank 1 was alerted, the delay after its onset
(seconds from when the bench saw step ``--slow-at``, and the first step of the capture that named it), the
``level_learned`` events (a job-wide change that became the job's new normal), and the false alerts (a rank named other than rank 1, or named by a capture
armed before its onset); then the total. With ``--out DIR``: each run's events (``runN_events.jsonl``) and step
records (``runN_telemetry.jsonl``, ``profwatch replay`` input). A SIGTERM ends the job, daemons and busy loops it
started (by handle); a busy loop whose bench is gone ends itself. Nothing is asserted.

Usage: python bench/bench_live_straggler.py [--runs 3] [--hogs 2] [--load-at 120] [--slow-at 300] [--slowdown 3]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "daemon"), str(REPO), str(REPO / "bench")]

from procs import TelemetryLog, exit_on_sigterm, hog, stop_process  # noqa: E402 (after the path set-up)

JOB = "straggler-live"
SLOW_RANK = 1


def _events(st: Any, type_: str) -> list[dict[str, Any]]:
    rows = st.control("events", {"job_id": JOB, "alerts_only": False, "limit": 10_000})
    return [dict(r["event"]["data"], _ts=r["event"].get("ts")) for r in rows if r["event"]["type"] == type_]


def _false_alerts(st: Any, slow_at: int) -> list[str]:
    """Alerts that name a rank other than the slow one, or that name any rank from a capture armed before its onset
    (the job-wide host-load change has no culprit rank)."""
    out = []
    for r in st.control("events", {"job_id": JOB, "alerts_only": True, "limit": 10_000}):
        ev = r["event"]
        d = ev.get("data") or {}
        sus = [s.get("rank") for s in d.get("suspects") or []]
        armed = d.get("armed_steps") or []
        if sus and (sus[0] != SLOW_RANK or (armed and min(armed) <= slow_at)):
            out.append(f"{ev['type']} suspects {sus} armed {armed}")
    return out


def _save(st: Any, out: Path | None, i: int) -> None:
    """Every event of the run as JSON lines (``--out``), for replay and diagnosis."""
    if out is None:
        return
    out.mkdir(parents=True, exist_ok=True)
    rows = st.control("events", {"job_id": JOB, "alerts_only": False, "limit": 10_000})
    with open(out / f"run{i}_events.jsonl", "w") as f:
        for r in rows:
            f.write(json.dumps(r, default=str) + "\n")


def _max_step(st: Any) -> int:
    from tests.integration.live_stack import rank_view

    ranks = rank_view(st.control("status", {"job_id": JOB}), JOB)
    return max((int(r.get("step") or r.get("last_step") or 0) for r in ranks.values()), default=0)


def one_run(args: argparse.Namespace, i: int) -> bool:
    from profwatch.core.alerts.event_types import TYPE_ARM_DECISION, TYPE_LEVEL_LEARNED, TYPE_SUSPECT_RANKS
    from profwatch.simulate.launcher import JobSpec, launch_job
    from tests.conftest import python_env
    from tests.integration.live_stack import Stack

    hogs: list[multiprocessing.Process] = []
    with tempfile.TemporaryDirectory(prefix="pwls", dir="/tmp") as tmp:
        root = Path(tmp)
        (root / "cfg" / JOB).mkdir(parents=True)
        (root / "prof").mkdir()
        st = Stack(root, ack_timeout_s=600.0, sections={"arming": {"active": 6, "min_arm_gap_s": 5.0},
                                                        "analysis": {"ranking": {"min_effect_frac": 0.08}}})
        job = None
        t0 = time.monotonic()
        found: dict[str, Any] | None = None
        slow_seen_at: float | None = None
        found_at = 0.0
        telemetry = TelemetryLog(JOB)
        next_dump = time.monotonic() + 30.0
        try:
            st.start()
            for node in ("n0", "n1"):
                st.node(node)
            job = launch_job(JobSpec(
                job_id=JOB, world_size=4, node_endpoints=[f"ipc://{root}/n0.sock", f"ipc://{root}/n1.sock"],
                profiler_config_path=root / "cfg" / JOB, prof_root=root / "prof", mode="torch",
                slow_rank=SLOW_RANK, slowdown=args.slowdown, slow_at_step=args.slow_at, max_steps=100_000,
                max_seconds=args.timeout_s + 600, stop_file=root / "stop", log_dir=root / "logs",
                extra_env={"PYTHONPATH": python_env()["PYTHONPATH"]}))
            deadline = time.monotonic() + args.timeout_s
            while time.monotonic() < deadline and found is None:
                step = _max_step(st)
                if not hogs and step >= args.load_at:
                    hogs = [multiprocessing.Process(target=hog, args=(os.getpid(),), daemon=True)
                            for _ in range(args.hogs)]
                    for h in hogs:
                        h.start()
                    print(f"  run {i}: host load started at step {step} ({time.monotonic() - t0:.0f} s)", flush=True)
                if args.out is not None and time.monotonic() >= next_dump:  # the window holds 1000 steps
                    telemetry.poll(st.control)
                    next_dump = time.monotonic() + 30.0
                if slow_seen_at is None and step >= args.slow_at:
                    slow_seen_at = time.monotonic()
                for d in _events(st, TYPE_SUSPECT_RANKS):
                    sus = d.get("suspects") or []
                    if sus and sus[0]["rank"] == SLOW_RANK and min(d.get("armed_steps") or [0]) > args.slow_at:
                        found, found_at = d, time.monotonic()
                        break
                else:
                    time.sleep(1.0)
            verdicts = {d.get("capture_id"): d.get("status") for d in _events(st, TYPE_SUSPECT_RANKS)}
            arms = [(d["anomaly"], d["step"], verdicts.get(d.get("capture_id"), "-"))
                    for d in _events(st, TYPE_ARM_DECISION) if d["action"] == "arm"]
            learned = len(_events(st, TYPE_LEVEL_LEARNED))
            false = _false_alerts(st, args.slow_at)
            last = _max_step(st)
            _save(st, args.out, i)
            if args.out is not None:
                telemetry.poll(st.control)
                telemetry.write(args.out / f"run{i}_telemetry.jsonl")
            delay = (f"{found_at - slow_seen_at:.0f} s after step {args.slow_at} was seen, capture armed from step "
                     f"{min(found.get('armed_steps') or [0])}"
                     if found is not None and slow_seen_at is not None else "-")
            print(f"  run {i}: rank {SLOW_RANK} alerted: {found is not None} ({delay}); arms {arms}; "
                  f"level_learned {learned}; false alerts {len(false)} {false}; last step {last}; "
                  f"{time.monotonic() - t0:.0f} s; "
                  f"load {os.getloadavg()[0]:.1f}", flush=True)
            return found is not None
        finally:
            for h in hogs:
                stop_process(h)
            if job is not None:
                job.stop()
            st.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--hogs", type=int, default=2)
    ap.add_argument("--load-at", type=int, default=120)
    ap.add_argument("--slow-at", type=int, default=300)
    ap.add_argument("--slowdown", type=float, default=3.0)
    ap.add_argument("--timeout-s", type=float, default=900.0)
    ap.add_argument("--out", type=Path, default=None,
                    help="directory for each run's events and step telemetry (JSON lines, replayable)")
    args = ap.parse_args()
    exit_on_sigterm()
    cpu0 = os.times()
    ok = sum(one_run(args, i) for i in range(args.runs))
    cpu = os.times()
    print(f"straggler under persistent host load alerted in {ok} of {args.runs} runs "
          f"(hogs {args.hogs} from step {args.load_at}, rank {SLOW_RANK} x{args.slowdown} from step {args.slow_at}); "
          f"CPU s {cpu.user - cpu0.user + cpu.children_user - cpu0.children_user:.0f}")


if __name__ == "__main__":
    main()
