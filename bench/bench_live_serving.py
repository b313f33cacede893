"""Issue 31's live serving target: a healthy serving loop on a busy host with 0 arms, then its +30 % TP rank captured.

A coordinator and one node daemon (threads, ``tests/integration/live_stack.py``) and a real 2-rank tensor-parallel
"serving engine" (SIMULATED WORKLOAD, real torch + gloo, this file run with ``--rank-worker``):
``rankhook.init(mode="serving")``, requests arrive in bursts with idle gaps of 0.2-6 s, each engine iteration
serves a batch of 1-32 requests (``rankhook.step(work=batch)``), does compute proportional to its batch and one
all-reduce (the TP pair's). Both ranks draw the same gaps and batches (one seed). The host's load changes every
20-90 s between 0 and ``--max-hogs`` busy loops (a shared host). After ``--healthy-s`` seconds rank 1 does
``--slowdown`` x its compute for good. Prints: arms during the healthy part (each a false arm), and whether a
capture armed after the onset names rank 1 (``suspect_ranks``), with the delay, and every verdict of the
captures armed in each part. With ``--out DIR``: every event (``events.jsonl``) and the job's step records
(``telemetry.jsonl``, ``profwatch replay`` input) and the captures' work directory (reports) are saved there. ``--probe-after-s S``: S seconds after the
onset one manual capture is armed (``arm``; ``--probe-active N`` steps), and its verdict printed apart from the
detection's score: whether the analysis of a capture names the slow TP rank, whatever the detection did. With
``--out`` the node's host load (``status``, every 10 s) is saved too (``host_load.jsonl``). A SIGTERM ends the ranks and busy loops it
started (by handle); a busy loop whose bench is gone ends itself. Nothing is asserted.

Usage: python bench/bench_live_serving.py [--healthy-s 900] [--after-s 300] [--max-hogs 2] [--slowdown 1.3]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "daemon"), str(REPO), str(REPO / "bench")]

from procs import TelemetryLog, exit_on_sigterm, hog, stop_process  # noqa: E402 (after the path set-up)

JOB = "serving-live"
SLOW_RANK = 1


def rank_worker(a: argparse.Namespace) -> int:
    """One TP rank: serve until the stop file exists (agreed through the iteration's all-reduce)."""
    import torch
    import torch.distributed as dist

    import rankhook

    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", rank=rank, world_size=2)
    rankhook.init(mode="serving")
    rng = random.Random(a.seed)  # the same draws on both ranks: same gaps, same batches
    w = torch.randn(256, 256)
    x = torch.randn(64, 256)
    buf = torch.zeros(257)
    stop_file, slow_file = Path(a.stop_file), Path(a.slow_file)
    while True:
        burst = rng.randint(3, 40)  # iterations while requests wait
        for _ in range(burst):
            batch = rng.randint(1, 32)
            slow = rank == SLOW_RANK and slow_file.exists()
            n = int(round(batch * a.matmuls_per_request * (a.slowdown if slow else 1.0)))
            z = x
            for _ in range(n):
                z = torch.tanh(z @ w)
            buf[:256] = z[0]
            buf[256] = 1.0 if stop_file.exists() else 0.0
            dist.all_reduce(buf)
            if buf[256].item() > 0:
                rankhook.shutdown()
                dist.destroy_process_group()
                return 0
            rankhook.step(work=float(batch))
        time.sleep(rng.uniform(0.2, 6.0))  # no request waiting: the engine idles


def _events(st: Any, type_: str) -> list[dict[str, Any]]:
    rows = st.control("events", {"job_id": JOB, "alerts_only": False, "limit": 10_000})
    return [r["event"]["data"] for r in rows if r["event"]["type"] == type_]


def _verdicts(st: Any, ids: set[str]) -> list[str]:
    """Each verdict of the captures ``ids``: status and the ranks named (most suspect first)."""
    from profwatch.core.alerts.event_types import TYPE_SUSPECT_RANKS

    return [f"{d.get('capture_id')}: {d.get('status')} suspects {[s.get('rank') for s in d.get('suspects') or []]}"
            for d in _events(st, TYPE_SUSPECT_RANKS) if d.get("capture_id") in ids]


def _save(st: Any, out: Path | None) -> None:
    """Every event of the run as JSON lines (``--out``), for replay and diagnosis."""
    if out is None:
        return
    out.mkdir(parents=True, exist_ok=True)
    rows = st.control("events", {"job_id": JOB, "alerts_only": False, "limit": 10_000})
    with open(out / "events.jsonl", "w") as f:
        for r in rows:
            f.write(json.dumps(r, default=str) + "\n")


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rank-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--stop-file", default="")
    ap.add_argument("--slow-file", default="")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--healthy-s", type=float, default=900.0)
    ap.add_argument("--after-s", type=float, default=300.0)
    ap.add_argument("--max-hogs", type=int, default=2)
    ap.add_argument("--slowdown", type=float, default=1.3)
    ap.add_argument("--matmuls-per-request", type=float, default=2.0)
    ap.add_argument("--probe-after-s", type=float, default=None,
                    help="this long after the onset, arm one manual capture (not a detection: scored apart) and print "
                         "whether its analysis names the slow rank")
    ap.add_argument("--probe-active", type=int, default=None,
                    help="steps the manual probe capture records (default: the coordinator's [capture] manual_active)")
    ap.add_argument("--out", type=Path, default=None,
                    help="directory for the run's events and step telemetry (JSON lines, replayable)")
    return ap.parse_args()


def _start_ranks(a: argparse.Namespace, root: Path, port: int, stop_file: Path,
                 slow_file: Path, procs: list[subprocess.Popen]) -> None:
    """Start the job's two tensor-parallel rank processes (this file with ``--rank-worker``) into ``procs``."""
    from tests.conftest import python_env

    for rank in range(2):
        env = dict(python_env(), RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), PROFWATCH_JOB_ID=JOB,
                   PROFWATCH_NODE_ENDPOINT=f"ipc://{root}/n0.sock", PROFWATCH_BACKEND="torch",
                   PROFWATCH_PROFILER_CONFIG_PATH=str(root / "cfg"), PROFWATCH_PROF_ROOT=str(root / "prof"),
                   OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--rank-worker", "--stop-file", str(stop_file),
             "--slow-file", str(slow_file), "--seed", str(a.seed), "--slowdown", str(a.slowdown),
             "--matmuls-per-request", str(a.matmuls_per_request)],
            env=env, stdout=subprocess.DEVNULL, stderr=open(root / f"rank{rank}.log", "wb")))


def _set_load(rng: random.Random, hogs: list[multiprocessing.Process], max_hogs: int) -> int:
    """Move the host's load: start or stop busy loops until 0..max_hogs run; return how many."""
    want = rng.randint(0, max_hogs)
    while len(hogs) > want:
        stop_process(hogs.pop())
    while len(hogs) < want:
        h = multiprocessing.Process(target=hog, args=(os.getpid(),), daemon=True)
        h.start()
        hogs.append(h)
    return want


def _named_after_onset(st: Any, onset_arms: int) -> dict[str, Any] | None:
    """The verdict of a capture armed after the onset that names the slow rank first, if any."""
    from profwatch.core.alerts.event_types import TYPE_ARM_DECISION, TYPE_SUSPECT_RANKS

    arms = [d for d in _events(st, TYPE_ARM_DECISION) if d["action"] == "arm"][onset_arms:]
    ids = {d["capture_id"] for d in arms}
    found = None
    for d in _events(st, TYPE_SUSPECT_RANKS):
        sus = d.get("suspects") or []
        if d.get("capture_id") in ids and sus and sus[0]["rank"] == SLOW_RANK:
            found = d
    return found


def _final_report(a: argparse.Namespace, st: Any, root: Path, t0: float, onset: float | None,
                  found: dict[str, Any] | None, onset_arms: int, probe: str | None, probe_verdict: str | None,
                  telemetry: TelemetryLog) -> None:
    """Print the run's outcome (captured and named, delay, arms and verdicts) and save it under ``--out``."""
    from profwatch.core.alerts.event_types import TYPE_ARM_DECISION

    status = st.control("status", {"job_id": JOB})
    steps = [r.get("last_step") for j in status.get("jobs", []) for r in j.get("ranks", [])]
    delay = f"{time.monotonic() - onset:.0f} s" if found is not None and onset is not None else "-"
    after = [d for d in _events(st, TYPE_ARM_DECISION) if d["action"] == "arm"][onset_arms:]
    print(f"+{100 * (a.slowdown - 1):.0f} % TP rank {SLOW_RANK} captured and named: {found is not None} "
          f"(delay {delay}); arms after the onset {[(d['anomaly'], d['step']) for d in after]}; verdicts "
          f"{_verdicts(st, {d['capture_id'] for d in after if d.get('capture_id')})}; steps {steps}; "
          f"load average {os.getloadavg()[0]:.1f}", flush=True)
    told = [d for d in _events(st, TYPE_ARM_DECISION) if d.get("reason") == "explained_by_host_load"
            and d.get("explained_count") is not None]
    print(f"job-wide episodes explained by host load (not captured): {len(told)} "
          f"{[(d['step'], (d.get('host_load') or {}).get('predicted_ratio'), (d.get('host_load') or {}).get('observed_ratio')) for d in told]}; "
          f"node host load now {[n.get('host_load') for n in status.get('nodes', [])]}", flush=True)
    if probe is not None:
        print(f"manual probe capture {a.probe_after_s:.0f} s after the onset (not a detection): "
              f"{probe_verdict or 'no verdict yet'}", flush=True)
    _save(st, a.out)
    if a.out is not None:
        if (root / "work").is_dir():  # each capture's report.json and staged traces, for diagnosis
            shutil.copytree(root / "work", a.out / "work", dirs_exist_ok=True)
        telemetry.poll(st.control)
        n = telemetry.write(a.out / "telemetry.jsonl")
        print(f"events and {n} step records in {a.out} (slow file touched "
              f"{'-' if onset is None else f'{onset - t0:.0f} s'} after the start)", flush=True)


def main() -> int:
    a = _args()
    if a.rank_worker:
        return rank_worker(a)
    exit_on_sigterm()
    from profwatch.core.alerts.event_types import TYPE_ARM_DECISION
    from profwatch.core.capture.planner import CaptureSettings
    from profwatch.simulate.launcher import free_port
    from tests.integration.live_stack import Stack

    hogs: list[multiprocessing.Process] = []
    rng = random.Random(a.seed + 1)
    with tempfile.TemporaryDirectory(prefix="pwsv", dir="/tmp") as tmp:
        root = Path(tmp)
        (root / "cfg").mkdir()
        (root / "prof").mkdir()
        stop_file, slow_file = root / "stop", root / "slow"
        st = Stack(root, ack_timeout_s=600.0, sections={"arming": {"active": 6, "min_arm_gap_s": 5.0},
                                                        # the default cap (a small group's captures record
                                                        # [arming] small_group_active steps up to it), more for a
                                                        # longer probe
                                                        "capture": {"max_active": max(CaptureSettings().max_active,
                                                                                      a.probe_active or 0)},
                                                        "analysis": {"ranking": {"min_effect_frac": 0.08}}})
        procs: list[subprocess.Popen] = []
        t0 = time.monotonic()
        try:
            st.start()
            st.node("n0")
            port = free_port()
            _start_ranks(a, root, port, stop_file, slow_file, procs)
            next_load = time.monotonic() + rng.uniform(20, 90)
            onset: float | None = None
            found: dict[str, Any] | None = None
            loads: list[int] = []
            host_load: list[float] = []
            onset_arms = 0
            probe: str | None = None
            probe_verdict: str | None = None
            telemetry = TelemetryLog(JOB)
            next_dump = time.monotonic() + 30.0
            next_load_log = time.monotonic()
            host_log: list[dict[str, Any]] = []
            while time.monotonic() - t0 < a.healthy_s + a.after_s and found is None and probe_verdict is None:
                if any(p.poll() is not None for p in procs):
                    print("a rank exited early; see its log", flush=True)
                    break
                if time.monotonic() >= next_load:  # the host's load moves: 0..max_hogs busy loops
                    want = _set_load(rng, hogs, a.max_hogs)
                    loads.append(want)
                    next_load = time.monotonic() + rng.uniform(20, 90)
                    host_load.append(os.getloadavg()[0])
                if a.out is not None and time.monotonic() >= next_dump:  # the window holds 1000 steps
                    telemetry.poll(st.control)
                    next_dump = time.monotonic() + 30.0
                if a.out is not None and time.monotonic() >= next_load_log:  # the node's host load, for diagnosis
                    host_log.append({"t_s": round(time.monotonic() - t0, 1), "hogs": len(hogs), "nodes": [
                        n.get("host_load") for n in st.control("status", {"job_id": JOB}).get("nodes", [])]})
                    next_load_log = time.monotonic() + 10.0
                if onset is None and time.monotonic() - t0 >= a.healthy_s:
                    slow_file.touch()
                    onset = time.monotonic()
                    arms = [d for d in _events(st, TYPE_ARM_DECISION) if d["action"] == "arm"]
                    print(f"healthy {a.healthy_s:.0f} s on a host with load changes {loads} (host load average "
                          f"{min(host_load, default=0):.1f}-{max(host_load, default=0):.1f}): {len(arms)} arms "
                          f"{[(d['anomaly'], d['step']) for d in arms]}; verdicts "
                          f"{_verdicts(st, {d['capture_id'] for d in arms if d.get('capture_id')})}", flush=True)
                    onset_arms = len(arms)
                if (onset is not None and a.probe_after_s is not None and probe is None
                        and time.monotonic() - onset >= a.probe_after_s):
                    try:
                        probe_args: dict[str, Any] = {"job_id": JOB, "reason": "probe"}
                        if a.probe_active is not None:
                            probe_args["active"] = a.probe_active
                        probe = str(st.control("arm", probe_args)["capture_id"])
                    except Exception as exc:  # noqa: BLE001 - a capture in flight: try again next second
                        print(f"probe not armed yet: {exc}", flush=True)
                if probe is not None:
                    probe_verdict = next(iter(_verdicts(st, {probe})), None)
                if onset is not None:
                    found = _named_after_onset(st, onset_arms)
                time.sleep(1.0)
            _final_report(a, st, root, t0, onset, found, onset_arms, probe, probe_verdict, telemetry)
            if a.out is not None:
                (a.out / "host_load.jsonl").write_text("".join(json.dumps(r) + "\n" for r in host_log))
        finally:
            stop_file.touch()
            for p in procs:
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(10)
            for h in hogs:
                stop_process(h)
            st.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
