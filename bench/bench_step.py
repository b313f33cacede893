"""Cost of ``rankhook.step()`` per call, beside a raw pyzmq non-blocking send of the same bytes, interleaved.

Scenarios: node daemon up at 1 kHz (the contract: a training or decode loop calls ``step()`` once per iteration),
node daemon up in a burst (a stress, not the contract: calls back to back, faster than the node daemon drains, so
the hook drops locally once its queue is full: the drops are counted and printed), node daemon down (nothing bound:
ZeroMQ queues up to SNDHWM), queue full (daemon down and the queue already at SNDHWM: every send drops).

Interleaved: each scenario runs ``--blocks`` alternating blocks of the hook and the raw send (the order reversed
every block), on sockets opened once, after a warm-up, so a side is never measured alone right after the node
daemon starts or while the other side's backlog drains. Prints median, p99 and p99.9 in microseconds per side,
the ratios, the load average and the hook's counters. Targets: median <= 5 us, p99 <= 30 us, <= 3x the raw send.

Usage: python bench/bench_step.py [--calls 200000] [--blocks 10]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import zmq
from procs import stop_popen

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "daemon"))

from rankhook.backends.base import NoneBackend  # noqa: E402
from rankhook.hook import Hook  # noqa: E402
from rankhook.identity import resolve_identity  # noqa: E402
from rankhook.publisher import Publisher  # noqa: E402

TOPIC = b"profwatch.step.bench.3"
PAYLOAD = (b'{"job_id":"bench","rank":3,"step":123456,"step_time_s":0.123456789,"ts_unix_s":1764500000.123456,'
           b'"kind":"step","v":1}')


def pcts(samples_ns: list[int]) -> tuple[float, float, float]:
    """Median, p99 and p99.9 of ``samples_ns`` in microseconds."""
    s = sorted(samples_ns)
    at = lambda q: s[int(q * (len(s) - 1))] / 1e3  # noqa: E731
    return at(0.5), at(0.99), at(0.999)


def paced(fn: Callable[[], object], n: int, pace_us: float) -> list[int]:
    """Time ``n`` calls of ``fn()`` (ns each), one every ``pace_us`` microseconds (0: back to back)."""
    out = []
    pc = time.perf_counter_ns
    gap = int(pace_us * 1000)
    nxt = pc()
    for _ in range(n):
        if gap:
            nxt += gap
            while pc() < nxt:
                pass
        t0 = pc()
        fn()
        out.append(pc() - t0)
    return out


class HookSide:
    """``rankhook.step()`` through a real Publisher to ``endpoint``."""

    def __init__(self, endpoint: str, prefill: int) -> None:
        self.pub = Publisher(endpoint)
        self.hook = Hook(resolve_identity("bench", rank=3, world_size=8), self.pub, NoneBackend())
        for _ in range(prefill):
            self.hook.step()

    def run(self, n: int, pace_us: float) -> list[int]:
        return paced(self.hook.step, n, pace_us)

    def close(self) -> dict[str, int]:
        counters = vars(self.pub.counters).copy()
        self.hook.close()
        return counters


class RawSide:
    """A bare pyzmq PUSH ``send_multipart(..., NOBLOCK)`` of the same bytes (``zmq.Again`` swallowed)."""

    def __init__(self, endpoint: str, prefill: int) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.PUSH)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.SNDHWM, 10_000)
        self.sock.connect(endpoint)
        for _ in range(prefill):
            self.send()

    def send(self) -> None:
        try:
            self.sock.send_multipart([TOPIC, PAYLOAD], zmq.NOBLOCK)
        except zmq.Again:
            pass

    def run(self, n: int, pace_us: float) -> list[int]:
        return paced(self.send, n, pace_us)

    def close(self) -> None:
        self.sock.close(0)
        self.ctx.term()


def interleaved(endpoint: str, calls: int, blocks: int, prefill: int, pace_us: float
                ) -> tuple[list[int], list[int], dict[str, int]]:
    """Alternate blocks of both sides (order reversed each block) after a warm-up block of each."""
    hook, raw = HookSide(endpoint, prefill), RawSide(endpoint, prefill)
    per = max(1, calls // blocks)
    hook.run(min(per, 2000), pace_us)
    raw.run(min(per, 2000), pace_us)
    h: list[int] = []
    r: list[int] = []
    try:
        for b in range(blocks):
            sides = ((hook, h), (raw, r)) if b % 2 == 0 else ((raw, r), (hook, h))
            for side, out in sides:
                out.extend(side.run(per, pace_us))
    finally:
        counters = hook.close()
        raw.close()
    return h, r, counters


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=200_000)
    ap.add_argument("--blocks", type=int, default=10)
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
        time.sleep(1.0)  # let the freshly started node daemon settle before the first block
        rows = []
        for name, endpoint, prefill, pace in (
            ("up, 1 kHz", ep, 0, 1000.0),
            ("up, burst", ep, 0, 0.0),
            ("daemon down", f"ipc://{tmp}/absent.sock", 0, 0.0),
            ("queue full", f"ipc://{tmp}/absent2.sock", 20_000, 0.0),
        ):
            n = min(a.calls, 20_000) if pace else a.calls
            h, r, counters = interleaved(endpoint, n, a.blocks, prefill, pace)
            rows.append((name, pcts(h), pcts(r), counters, os.getloadavg()[0]))
    finally:  # end only the node daemon this script started, by pid
        stop_popen(node, 10)
    print(f"rankhook.step() vs raw pyzmq NOBLOCK send, {a.calls} calls each side (20k at 1 kHz), "
          f"{a.blocks} interleaved blocks (microseconds)")
    print(f"{'scenario':<12} {'step med':>8} {'p99':>7} {'p99.9':>7} {'raw med':>8} {'p99':>7} {'p99.9':>7} "
          f"{'x med':>6} {'x p99':>6} {'load1':>5}  hook counters")
    for name, (med, p99, p999), (rmed, rp99, rp999), c, load in rows:
        print(f"{name:<12} {med:>8.2f} {p99:>7.2f} {p999:>7.2f} {rmed:>8.2f} {rp99:>7.2f} {rp999:>7.2f} "
              f"{med / rmed:>6.2f} {p99 / rp99:>6.2f} {load:>5.2f}  "
              f"sent={c['sent']} dropped={c['dropped']} errors={c['errors']}")
    print("burst: a stress, not the contract; 'dropped' counts what the hook dropped locally while the node daemon "
          "could not keep up")


if __name__ == "__main__":
    main()
