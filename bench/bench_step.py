"""Cost of ``rankhook.step()`` per call, beside a raw pyzmq non-blocking send of the same bytes (same run).

Scenarios: node daemon up (a real ``profwatch node`` process bound on the endpoint), node daemon down (nothing
bound: ZeroMQ queues up to SNDHWM), queue full (daemon down and the queue already at SNDHWM: every send drops).
Prints median and p99 in microseconds. Targets (issue 2): median <= 5 us, p99 <= 30 us, <= 3x the raw send.

Usage: python bench/bench_step.py [--calls 200000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import zmq

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "daemon"))

from rankhook.backends.base import NoneBackend  # noqa: E402
from rankhook.hook import Hook  # noqa: E402
from rankhook.identity import resolve_identity  # noqa: E402
from rankhook.publisher import Publisher  # noqa: E402


def _pcts(samples_ns: list[int]) -> tuple[float, float]:
    s = sorted(samples_ns)
    return s[len(s) // 2] / 1e3, s[int(0.99 * (len(s) - 1))] / 1e3


def time_hook(endpoint: str, calls: int, prefill: int = 0, pace_us: float = 0.0) -> tuple[float, float, dict]:
    pub = Publisher(endpoint)
    hook = Hook(resolve_identity("bench", rank=3, world_size=8), pub, NoneBackend())
    for _ in range(prefill):
        hook.step()
    out = []
    pc = time.perf_counter_ns
    gap = int(pace_us * 1000)
    nxt = pc()
    for _ in range(calls):
        if gap:  # a training loop calls step() once per iteration, not back to back
            nxt += gap
            while pc() < nxt:
                pass
        t0 = pc()
        hook.step()
        out.append(pc() - t0)
    med, p99 = _pcts(out)
    counters = vars(pub.counters).copy()
    hook.close()
    return med, p99, counters


def time_raw(endpoint: str, calls: int, prefill: int = 0, pace_us: float = 0.0) -> tuple[float, float]:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PUSH)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 10_000)
    sock.connect(endpoint)
    topic = b"profwatch.step.bench.3"
    payload = (b'{"job_id":"bench","rank":3,"step":123456,"step_time_s":0.123456789,"ts_unix_s":1764500000.123456,'
               b'"kind":"step","v":1}')
    for _ in range(prefill):
        try:
            sock.send_multipart([topic, payload], zmq.NOBLOCK)
        except zmq.Again:
            pass
    out = []
    pc = time.perf_counter_ns
    gap = int(pace_us * 1000)
    nxt = pc()
    for _ in range(calls):
        if gap:
            nxt += gap
            while pc() < nxt:
                pass
        t0 = pc()
        try:
            sock.send_multipart([topic, payload], zmq.NOBLOCK)
        except zmq.Again:
            pass
        out.append(pc() - t0)
    sock.close(0)
    ctx.term()
    return _pcts(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=200_000)
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="pwb", dir="/tmp"))
    ep = f"ipc://{tmp}/node.sock"
    env = dict(os.environ, PROFWATCH_NODE__BIND=ep, PROFWATCH_NODE__COORDINATOR="tcp://127.0.0.1:1",
               PYTHONPATH=os.pathsep.join([str(Path(__file__).resolve().parent.parent / "daemon"),
                                         str(Path(__file__).resolve().parent.parent)]))
    node = subprocess.Popen([sys.executable, "-m", "profwatch.cli", "node"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not (tmp / "node.sock").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        rows = []
        for name, endpoint, prefill, pace in (
            ("up, 1 kHz", ep, 0, 1000.0),
            ("up, burst", ep, 0, 0.0),
            ("daemon down", f"ipc://{tmp}/absent.sock", 0, 0.0),
            ("queue full", f"ipc://{tmp}/absent2.sock", 20_000, 0.0),
        ):
            n = min(a.calls, 20_000) if pace else a.calls
            med, p99, counters = time_hook(endpoint, n, prefill, pace)
            rmed, rp99 = time_raw(endpoint, n, prefill, pace)
            rows.append((name, med, p99, rmed, rp99, counters))
    finally:  # end only the node daemon this script started, by pid
        node.terminate()
        try:
            node.wait(10)
        except subprocess.TimeoutExpired:
            node.kill()
            node.wait(10)
    print(f"rankhook.step() vs raw pyzmq NOBLOCK send, {a.calls} calls each (20k at 1 kHz) (microseconds)")
    print(f"{'scenario':<12} {'step med':>9} {'step p99':>9} {'raw med':>8} {'raw p99':>8} {'ratio med':>9}  counters")
    for name, med, p99, rmed, rp99, c in rows:
        print(f"{name:<12} {med:>9.2f} {p99:>9.2f} {rmed:>8.2f} {rp99:>8.2f} {med / rmed:>9.2f}  "
              f"sent={c['sent']} dropped={c['dropped']} errors={c['errors']}")
    _ = statistics  # kept for readers extending the script


if __name__ == "__main__":
    main()
