"""Coordinator ingest: sustained step reports per second through the node protocol, CPU and RSS, for 1k and 16k
simulated ranks, beside a bare pyzmq receive-and-decode loop fed the same bytes in the same run.

A load process plays one node daemon (DEALER, identity ``benchnode``): hellos for every rank, then batches of
1000 step reports (steps advancing, ~5% noise) as fast as the receiver takes them (blocking send, HWM 50).
The coordinator runs as a real ``profwatch coordinator`` subprocess (validation, registry, step windows, detectors).
Targets (issue 2): >= 100k reports/s on one core, >= 0.5x the bare loop, RSS <= 300 MB at 16k ranks with
1000-step windows (``--fill`` sends 1000 steps per rank first).

Usage: python bench/bench_ingest.py [--ranks 1024 16384] [--seconds 10] [--fill]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import zmq

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "daemon"))


def _batches(ranks: int, job: str, start_step: int):
    """Yield node_batch bytes forever: every rank reports step s, then s+1, ..."""
    rng = random.Random(1)
    seq = 0
    step = start_step
    while True:
        for lo in range(0, ranks, 1000):
            seq += 1
            msgs = ",".join(
                f'{{"job_id":"{job}","rank":{r},"step":{step},"step_time_s":{0.1 * (1 + 0.05 * rng.gauss(0, 1)):.6f},'
                f'"ts_unix_s":{time.time():.3f},"kind":"step","v":1}}'
                for r in range(lo, min(ranks, lo + 1000))
            )
            yield (f'{{"kind":"node_batch","v":1,"node_id":"benchnode","hostname":"bench","seq":{seq},'
                   f'"ts_unix_s":{time.time():.3f},"messages":[{msgs}]}}').encode(), min(1000, ranks - lo)
        step += 1


def _hellos(ranks: int, job: str) -> list[bytes]:
    out = []
    for lo in range(0, ranks, 1000):
        msgs = ",".join(json.dumps({"kind": "hello", "v": 1, "job_id": job, "rank": r, "local_rank": r % 8,
                                    "world_size": ranks, "hostname": f"h{r // 8}", "pid": 1000 + r,
                                    "backend": "none", "ts_unix_s": time.time()}) for r in range(lo, min(ranks, lo + 1000)))
        out.append((f'{{"kind":"node_batch","v":1,"node_id":"benchnode","hostname":"bench","seq":0,'
                    f'"ts_unix_s":{time.time():.3f},"messages":[{msgs}]}}').encode())
    return out


def load(endpoint: str, ranks: int, job: str, seconds: float, steps_first: int, q: mp.Queue) -> None:
    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.IDENTITY, b"benchnode")
    s.setsockopt(zmq.SNDHWM, 50)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(endpoint)
    for h in _hellos(ranks, job):
        s.send(h)
    sent = 0
    gen = _batches(ranks, job, 1)
    if steps_first:
        for _ in range(steps_first * -(-ranks // 1000)):
            data, n = next(gen)
            s.send(data)
            sent += n
    q.put(("filled", sent, time.time()))
    t_end = time.time() + seconds
    while time.time() < t_end:
        data, n = next(gen)
        s.send(data)
        sent += n
    q.put(("done", sent, time.time()))
    s.close(0)
    ctx.term()


def bare(endpoint: str, seconds: float, q: mp.Queue) -> None:
    """Receive and json-decode node batches as fast as possible (the reference loop)."""
    ctx = zmq.Context()
    r = ctx.socket(zmq.ROUTER)
    r.setsockopt(zmq.LINGER, 0)
    r.bind(endpoint)
    n = 0
    t0 = None
    while True:
        if not r.poll(2000):
            break
        _ident, data = r.recv_multipart()
        msgs = json.loads(data)["messages"]
        if t0 is None:
            t0 = time.time()
        n += len(msgs)
        if time.time() - t0 > seconds:
            break
    q.put(("bare", n, time.time() - (t0 or time.time())))
    r.close(0)
    ctx.term()


def _port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bench_coordinator(ranks: int, seconds: float, fill: bool) -> dict:
    from profwatch.adapters.zmq.control import call

    tmp = Path(tempfile.mkdtemp(prefix="pwbi", dir="/tmp"))
    ports = [_port() for _ in range(3)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "daemon"), str(REPO)]), PROFWATCH_COORDINATOR__INGEST_BIND=f"tcp://127.0.0.1:{ports[0]}",
               PROFWATCH_COORDINATOR__CONTROL_BIND=f"tcp://127.0.0.1:{ports[1]}",
               PROFWATCH_COORDINATOR__PUB_BIND=f"tcp://127.0.0.1:{ports[2]}",
               PROFWATCH_COORDINATOR__STATE_DB=str(tmp / "state.db"), PROFWATCH_COORDINATOR__WORK_DIR=str(tmp / "w"),
               PROFWATCH_ARMING__MODE="off", PROFWATCH_LOGGING__LEVEL="WARNING")
    proc = subprocess.Popen([sys.executable, "-m", "profwatch.cli", "coordinator"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    ctrl = f"tcp://127.0.0.1:{ports[1]}"
    lp: mp.Process | None = None
    try:
        for _ in range(200):
            try:
                call(ctrl, "ping", timeout_s=0.5)
                break
            except Exception:  # noqa: BLE001
                time.sleep(0.1)
        ps = psutil.Process(proc.pid)
        q: mp.Queue = mp.Queue()
        lp = mp.Process(target=load, args=(f"tcp://127.0.0.1:{ports[0]}", ranks, "bench", seconds,
                                            1000 if fill else 5, q))
        lp.start()
        kind, _n, _t = q.get(timeout=1800)
        # measure the steady window only
        c0 = call(ctrl, "status", {"job_id": "none"}, timeout_s=60)["counters"]["received"]
        cpu0 = sum(ps.cpu_times()[:2])
        t0 = time.time()
        kind, _n, _t = q.get(timeout=seconds + 600)
        c1 = call(ctrl, "status", {"job_id": "none"}, timeout_s=60)["counters"]["received"]
        cpu1 = sum(ps.cpu_times()[:2])
        t1 = time.time()
        lp.join(30)
        rss = ps.memory_info().rss
        return {"ranks": ranks, "reports_per_s": (c1 - c0) / (t1 - t0), "cpu_frac": (cpu1 - cpu0) / (t1 - t0),
                "rss_mb": rss / 2**20, "filled_1000_steps": fill}
    finally:  # end only what this benchmark started, by pid
        _end(lp)
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)


def _end(p: mp.Process | None) -> None:
    if p is not None and p.is_alive():
        p.terminate()
        p.join(10)
        if p.is_alive():
            p.kill()
            p.join(10)


def bench_bare(ranks: int, seconds: float) -> float:
    port = _port()
    q: mp.Queue = mp.Queue()
    bp = mp.Process(target=bare, args=(f"tcp://127.0.0.1:{port}", seconds, q))
    lp: mp.Process | None = None
    bp.start()
    try:
        time.sleep(0.3)  # let the bare receiver bind (benchmark script, not a test)
        lq: mp.Queue = mp.Queue()
        lp = mp.Process(target=load, args=(f"tcp://127.0.0.1:{port}", ranks, "bench", seconds + 3, 0, lq))
        lp.start()
        _, n, dt = q.get(timeout=seconds + 120)
    finally:
        _end(lp)
        bp.join(10)
        _end(bp)
    return n / dt if dt else 0.0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, nargs="+", default=[1024, 16384])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--fill", action="store_true", help="fill every rank's 1000-step window before measuring")
    a = ap.parse_args()
    print(f"{'ranks':>6} {'coord rep/s':>12} {'bare rep/s':>11} {'ratio':>6} {'coord CPU':>9} {'RSS MB':>7} filled")
    for n in a.ranks:
        r = bench_coordinator(n, a.seconds, a.fill)
        b = bench_bare(n, a.seconds)
        print(f"{n:>6} {r['reports_per_s']:>12,.0f} {b:>11,.0f} {r['reports_per_s'] / b:>6.2f} "
              f"{r['cpu_frac']:>9.2f} {r['rss_mb']:>7.0f} {r['filled_1000_steps']}")


if __name__ == "__main__":
    main()
