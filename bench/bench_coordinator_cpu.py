"""Coordinator CPU at a paced step rate: the share of one core a live ``profwatch coordinator`` spends on N ranks
stepping R times a second (prints a table; no assertions).

Unlike ``bench_ingest.py`` (as fast as the receiver takes), this is the steady contract: a load process plays the
node daemons (``--ranks-per-node`` ranks each, one DEALER per node, one batch per node per step, as a node daemon
batches), sends every rank's hello, then one step of every rank each ``1/R`` s for ``--seconds``, paced on the wall
clock. The coordinator's user+system CPU seconds over the paced window (after a warm-up of ``--warmup-s``) divided
by the window is the row's CPU share. Detection runs (arming off: nothing is captured).

``--trees A B ...`` runs the coordinator of each source tree (a checkout's root: its ``daemon/`` and root go on
``PYTHONPATH``) in interleaved order (A B B A ...) so a before/after pair shares the box's load; the default is
this checkout.

``--fill N`` first sends N steps of every rank as fast as the coordinator takes them (``--fill 1000``: every rank's
step window full, ``core/fleet/step_window.py``), then runs the paced window. ``--restart`` also prints each run's
resident set (end and peak) and stops the coordinator (SIGTERM) and starts it
again on the same state db: the seconds to stop, to answer ``ping`` and to answer ``status`` with the ranks restored.

Usage: ``python bench/bench_coordinator_cpu.py [--ranks 1024] [--rate 10] [--seconds 20] [--rounds 2]
[--trees /path/old /path/new] [--restart]``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
import zmq
from procs import stop_popen, stop_process

REPO = Path(__file__).resolve().parent.parent


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _batch(k: int, seq: int, msgs: list[str]) -> bytes:
    return (f'{{"kind":"node_batch","v":1,"node_id":"cpunode{k}","hostname":"cpu{k}","seq":{seq},'
            f'"ts_unix_s":{time.time():.3f},"messages":[{",".join(msgs)}]}}').encode()


def load(endpoint: str, ranks: int, per_node: int, rate: float, seconds: float, q: mp.Queue, fill: int = 0,
         go: Any = None) -> None:
    """The node daemons of one job: hellos, ``fill`` steps of every rank as fast as the coordinator takes them (its
    sockets' high-water marks pace them; then ``("filled", seconds)`` on ``q`` and a wait for ``go``, set once the
    coordinator has them all), then one step per rank every ``1/rate`` s for ``seconds``."""
    ctx = zmq.Context()
    nodes = [range(lo, min(ranks, lo + per_node)) for lo in range(0, ranks, per_node)]
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)  # one DEALER a node: 16,384 ranks / 16 = 1,024 sockets
    want = len(nodes) + 256
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard), hard))
    ctx.set(zmq.MAX_SOCKETS, want)  # the context's limit (1,023 by default); setsockopt would set a socket default
    socks = []
    for k in range(len(nodes)):
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.IDENTITY, f"cpunode{k}".encode())
        s.setsockopt(zmq.LINGER, 0)
        s.connect(endpoint)
        socks.append(s)
    for k, rs in enumerate(nodes):
        socks[k].send(_batch(k, 0, [json.dumps({"kind": "hello", "v": 1, "job_id": "cpu", "rank": r,
                                                "local_rank": r - rs.start, "world_size": ranks,
                                                "hostname": f"cpu{k}", "pid": 1000 + r, "backend": "none",
                                                "ts_unix_s": time.time()}) for r in rs]))
    rng = random.Random(1)
    period = 1.0 / rate
    t0 = time.monotonic()
    for step in range(1, fill + 1):
        for k, rs in enumerate(nodes):
            socks[k].send(_batch(k, step, [
                f'{{"job_id":"cpu","rank":{r},"step":{step},"step_time_s":{period * (1 + 0.03 * rng.gauss(0, 1)):.6f},'
                f'"ts_unix_s":{time.time():.3f},"kind":"step","v":1}}' for r in rs]))
    if fill:
        q.put(("filled", time.monotonic() - t0))
        go.wait(3600)
    t_next = time.monotonic()
    t_end = t_next + seconds
    step, late = fill, 0
    while t_next < t_end:
        step += 1
        for k, rs in enumerate(nodes):
            socks[k].send(_batch(k, step, [
                f'{{"job_id":"cpu","rank":{r},"step":{step},"step_time_s":{period * (1 + 0.03 * rng.gauss(0, 1)):.6f},'
                f'"ts_unix_s":{time.time():.3f},"kind":"step","v":1}}' for r in rs]))
        t_next += period
        wait = t_next - time.monotonic()
        if wait > 0:
            time.sleep(wait)  # pacing the load on the wall clock (a load generator, not a test)
        else:
            late += 1
    q.put((step, late))
    for s in socks:
        s.close(0)
    ctx.term()


def run_one(tree: Path, ranks: int, per_node: int, rate: float, seconds: float, warmup_s: float,
            restart: bool = False, fill: int = 0) -> dict:
    """One coordinator of ``tree`` under the paced load; its CPU share over the window after the warm-up, its
    resident set at the end and its peak; with ``restart`` it is then stopped (SIGTERM) and started again on the
    same state db: the seconds to stop, to answer ``ping`` and to answer ``status`` with the job's ranks restored."""
    tmp = Path(tempfile.mkdtemp(prefix="pwcpu", dir="/tmp"))
    ports = [_port() for _ in range(3)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tree / "daemon"), str(tree)]),
               PROFWATCH_COORDINATOR__INGEST_BIND=f"tcp://127.0.0.1:{ports[0]}",
               PROFWATCH_COORDINATOR__CONTROL_BIND=f"tcp://127.0.0.1:{ports[1]}",
               PROFWATCH_COORDINATOR__PUB_BIND=f"tcp://127.0.0.1:{ports[2]}",
               PROFWATCH_COORDINATOR__STATE_DB=str(tmp / "state.db"), PROFWATCH_COORDINATOR__WORK_DIR=str(tmp / "w"),
               PROFWATCH_ARMING__MODE="off", PROFWATCH_LOGGING__LEVEL="WARNING")
    proc = subprocess.Popen([sys.executable, "-m", "profwatch.cli", "coordinator"], env=env, cwd=tmp,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    lp: mp.Process | None = None
    try:
        ctrl = zmq.Context.instance().socket(zmq.REQ)
        ctrl.setsockopt(zmq.LINGER, 0)
        ctrl.connect(f"tcp://127.0.0.1:{ports[1]}")
        ctrl.send_json({"cmd": "ping"})
        if not ctrl.poll(30_000):
            raise RuntimeError(f"the coordinator of {tree} did not answer in 30 s")
        ctrl.recv()
        ctrl.close(0)
        ps = psutil.Process(proc.pid)
        q: mp.Queue = mp.Queue()
        go = mp.Event()
        lp = mp.Process(target=load, args=(f"tcp://127.0.0.1:{ports[0]}", ranks, per_node, rate,
                                           seconds + warmup_s, q, fill, go))
        lp.start()
        fill_s = 0.0
        if fill:  # every rank's window filled first (the coordinator's ingest paces it), then the paced window
            _, fill_s = q.get(timeout=3600)
            fill_s = _wait_steps(ports[1], fill, 3600) + fill_s
            go.set()
        time.sleep(warmup_s)  # the warm-up of the paced window (benchmark script, not a test)
        cpu0, t0 = sum(ps.cpu_times()[:2]), time.monotonic()
        steps, late = q.get(timeout=seconds + warmup_s + 120)
        cpu1, t1 = sum(ps.cpu_times()[:2]), time.monotonic()
        lp.join(30)
        out = {"tree": str(tree), "cpu_frac": (cpu1 - cpu0) / (t1 - t0), "steps": steps, "late_steps": late,
               "load": os.getloadavg()[0], "rss": ps.memory_info().rss, "hwm": _hwm(proc.pid),
               "last_steps": _last_steps(ports[1]), "fill_s": fill_s}
        if restart:
            t = time.monotonic()
            stop_popen(proc)  # SIGTERM: the coordinator persists its state and exits
            out["stop_s"] = time.monotonic() - t
            t = time.monotonic()
            proc = subprocess.Popen([sys.executable, "-m", "profwatch.cli", "coordinator"], env=env, cwd=tmp,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            out["restart_ping_s"] = _ping(ports[1], 120) and time.monotonic() - t
            status = _request(ports[1], {"cmd": "status", "args": {"job_id": "cpu"}}, 120)
            out["restart_status_s"] = time.monotonic() - t
            jobs = (status or {}).get("result", status or {}).get("jobs", []) if isinstance(status, dict) else []
            out["restored_ranks"] = sum(len(j.get("ranks", [])) for j in jobs)
            out["restored_last_steps"] = _last_steps(ports[1])
            out["rss_restored"] = psutil.Process(proc.pid).memory_info().rss
        return out
    finally:  # end only what this benchmark started, by pid
        stop_process(lp)
        stop_popen(proc)


def _last_steps(port: int) -> tuple[int, int]:
    """(lowest, highest) ``last_step`` over the job's ranks in ``status`` ((-1, -1) without an answer): the steps
    every rank's windows hold (``detection.outlier_window_steps``, 12 by default, full once it is >= 12)."""
    status = _request(port, {"cmd": "status", "args": {"job_id": "cpu"}}, 120)
    jobs = (status or {}).get("result", status or {}).get("jobs", []) if isinstance(status, dict) else []
    steps = [int(r.get("last_step", -1)) for j in jobs for r in j.get("ranks", [])]
    return (min(steps), max(steps)) if steps else (-1, -1)


def _wait_steps(port: int, step: int, limit_s: float) -> float:
    """Seconds until every rank of the job shows ``last_step`` >= ``step`` in ``status`` (bounded polling)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit_s and _last_steps(port)[0] < step:
        time.sleep(1.0)
    return time.monotonic() - t0


def _hwm(pid: int) -> int:
    """Peak resident bytes of ``pid`` (``VmHWM`` of ``/proc/<pid>/status``); 0 when unknown."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _request(port: int, req: dict, timeout_s: float) -> object:
    """One control request to the coordinator at ``port``, retried until ``timeout_s``; its reply or None."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        s = zmq.Context.instance().socket(zmq.REQ)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(f"tcp://127.0.0.1:{port}")
        s.send_json(req)
        try:
            if s.poll(2000):
                return s.recv_json()
        finally:
            s.close(0)
    return None


def _ping(port: int, timeout_s: float) -> bool:
    return _request(port, {"cmd": "ping"}, timeout_s) is not None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--ranks-per-node", type=int, default=16)
    ap.add_argument("--rate", type=float, default=10.0, help="steps per second of every rank")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--warmup-s", type=float, default=5.0)
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds (each runs every tree twice: A B B A)")
    ap.add_argument("--trees", type=Path, nargs="+", default=[REPO])
    ap.add_argument("--restart", action="store_true", help="after each window: RSS, then stop and restart on the "
                    "same state db and time the restore")
    ap.add_argument("--fill", type=int, default=0, help="first send this many steps of every rank as fast as the "
                    "coordinator takes them (1000: every rank's step window full), then the paced window")
    args = ap.parse_args()
    trees = [t.resolve() for t in args.trees]
    rows: dict[Path, list[dict]] = {t: [] for t in trees}
    for _ in range(args.rounds):
        for t in [*trees, *reversed(trees)]:
            rows[t].append(run_one(t, args.ranks, args.ranks_per_node, args.rate, args.seconds, args.warmup_s,
                                   args.restart, args.fill))
    print(f"{args.ranks} ranks x {args.rate:g} steps/s ({args.ranks * args.rate:,.0f} reports/s), "
          f"{args.seconds:g} s windows, {args.rounds} interleaved rounds")
    print(f"{'tree':<40} {'CPU % of a core (median, runs)':<45} {'late load steps':>15} {'load avg':>9}")
    for t, rs in rows.items():
        cpu = [100 * r["cpu_frac"] for r in rs]
        print(f"{str(t)[-40:]:<40} {statistics.median(cpu):6.1f}  ({', '.join(f'{c:.1f}' for c in cpu)})"
              f"{'':<10} {sum(r['late_steps'] for r in rs):>15} {statistics.median(r['load'] for r in rs):9.1f}")
        rss = ", ".join(f"{r['rss'] / 2**20:.0f}" for r in rs)
        hwm = ", ".join(f"{r['hwm'] / 2**20:.0f}" for r in rs)
        steps = ", ".join(f"{lo}..{hi}" for lo, hi in (r["last_steps"] for r in rs))
        print(f"  RSS at the end MiB: {rss}; peak (VmHWM) MiB: {hwm}; every rank's last step then: {steps}")
        if args.fill:
            fills = ", ".join(f"{r['fill_s']:.0f}" for r in rs)
            print(f"  fill of {args.fill} steps a rank: {fills} s")
        if args.restart:
            for r in rs:
                print(f"  restart: stop {r['stop_s']:.1f} s, ping after {r['restart_ping_s']:.1f} s, status with "
                      f"{r['restored_ranks']} ranks after {r['restart_status_s']:.1f} s, RSS then "
                      f"{r['rss_restored'] / 2**20:.0f} MiB, last steps restored "
                      f"{r['restored_last_steps'][0]}..{r['restored_last_steps'][1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
