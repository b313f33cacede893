"""Coordinator ingest: sustained step reports per second through the node protocol, CPU and RSS, for 1k and 16k
simulated ranks, beside a bare pyzmq receive-and-decode loop fed the same bytes in the same run.

A load process plays the node daemons of the job: ``--ranks-per-node`` ranks each (16 by default, so 16,384 ranks
are 1,024 nodes: within ``limits.max_ranks_per_node`` and ``limits.max_nodes``, so every report takes the accepted
path, none the refusal path), one DEALER per node (identity ``benchnode<k>``): hellos for every rank, then, step by
step, one batch per node with its ranks' step reports (~5% noise) as fast as the receiver takes them (blocking
send, HWM 50 per node). Each report is the bytes a node daemon relays (``wire.encode`` of a ``StepReport``: every
field, ``null`` where unset; checked at start), not a shorter spelling that would parse faster. The bare baseline receives the same bytes from the same load on a ROUTER and does only
``recv_multipart`` + ``json.loads`` of each batch and counts its messages: no validation, no registry, no
detection; it is the floor of a Python receiver, not a competitor.
The coordinator runs as a real ``profwatch coordinator`` subprocess (validation, registry, step windows, detectors).
Targets (issue 2): >= 100k reports/s on one core, >= 0.5x the bare loop, RSS <= 300 MB at 16k ranks with
1000-step windows (``--fill`` sends 1000 steps per rank first).

``--tree DIR`` runs the coordinator of another checkout (e.g. the main branch, for a before/after pair); it starts
in a temporary folder, so no checkout's ``rankhook/`` in the working folder shadows the tree's.

Usage: python bench/bench_ingest.py [--ranks 1024 16384] [--ranks-per-node 16] [--seconds 10] [--fill] [--tree DIR]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import zmq
from procs import stop_popen, stop_process

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "daemon"))


RANKS_PER_NODE = 16


def _nodes(ranks: int, per_node: int) -> list[range]:
    """The ranks of each simulated node."""
    return [range(lo, min(ranks, lo + per_node)) for lo in range(0, ranks, per_node)]


WIRE = {"v": 2}
"""The wire version the load speaks (``--wire-version``): 1 as a version-1 node relays (and a version-1 coordinator
takes: before/after pairs against an older checkout), 2 as this checkout's node relays (``peer_pid`` stamped)."""


def _step_bytes(job: str, rank: int, step: int, step_time_s: float, ts_unix_s: float) -> str:
    """A step report as a node daemon relays it (the bytes of ``wire.encode``), formatted without building one."""
    sender = f'"peer_pid":{1000 + rank},' if WIRE["v"] == 2 else ""
    return (f'{{"job_id":"{job}","rank":{rank},"step":{step},"step_time_s":{step_time_s!r},"ts_unix_s":{ts_unix_s!r},'
            f'"stages":null,"flags":[],"capturing":false,"work":null,"mode":null,"role":null,{sender}"kind":"step",'
            f'"v":{WIRE["v"]}}}')


def _check_step_bytes() -> None:
    from rankhook import wire

    if WIRE["v"] != wire.SCHEMA_VERSION:
        return  # an older version's bytes: checked when that version was current
    rep = wire.StepReport(job_id="bench", rank=3, step=7, step_time_s=0.1234, ts_unix_s=1764500000.25, peer_pid=1003)
    assert _step_bytes("bench", 3, 7, 0.1234, 1764500000.25).encode() == wire.encode(rep), "not the node's bytes"


def _batches(ranks: int, per_node: int, job: str, start_step: int) -> Iterator[tuple[int, bytes, int]]:
    """Yield ``(node index, node_batch bytes, reports)`` forever: every node's ranks report step s, then s+1, ..."""
    rng = random.Random(1)
    seq = 0
    step = start_step
    nodes = _nodes(ranks, per_node)
    while True:
        seq += 1
        for k, rs in enumerate(nodes):
            msgs = ",".join(_step_bytes(job, r, step, 0.1 * (1 + 0.05 * rng.gauss(0, 1)), time.time()) for r in rs)
            yield k, (f'{{"kind":"node_batch","v":{WIRE["v"]},"node_id":"benchnode{k}","hostname":"bench{k}","seq":{seq},'
                      f'"ts_unix_s":{time.time():.3f},"messages":[{msgs}]}}').encode(), len(rs)
        step += 1


def _hellos(ranks: int, per_node: int, job: str) -> list[tuple[int, bytes]]:
    out = []
    for k, rs in enumerate(_nodes(ranks, per_node)):
        msgs = ",".join(json.dumps({"kind": "hello", "v": WIRE["v"], "job_id": job, "rank": r, "local_rank": r - rs.start,
                                    "world_size": ranks, "hostname": f"bench{k}", "pid": 1000 + r,
                                    "backend": "none", "ts_unix_s": time.time()}) for r in rs)
        out.append((k, (f'{{"kind":"node_batch","v":{WIRE["v"]},"node_id":"benchnode{k}","hostname":"bench{k}","seq":0,'
                        f'"ts_unix_s":{time.time():.3f},"messages":[{msgs}]}}').encode()))
    return out


def load(endpoint: str, ranks: int, per_node: int, job: str, seconds: float, steps_first: int, q: mp.Queue,
         rate: float = 0.0, go: Any = None) -> None:
    """One DEALER per simulated node daemon, all in this process; ``rate`` > 0: every rank steps ``rate`` times a
    second (paced, below saturation), else as fast as the receiver takes them."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 65536)), hard))  # ~2 fds per node socket
    ctx = zmq.Context(io_threads=2)
    ctx.set(zmq.MAX_SOCKETS, 65536)
    socks = []
    for k in range(len(_nodes(ranks, per_node))):
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.IDENTITY, f"benchnode{k}".encode())
        s.setsockopt(zmq.SNDHWM, 50)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(endpoint)
        socks.append(s)
    for k, h in _hellos(ranks, per_node, job):
        socks[k].send(h)
    sent = 0
    gen = _batches(ranks, per_node, job, 1)
    nodes = len(socks)
    if steps_first:
        for _ in range(steps_first * nodes):
            k, data, n = next(gen)
            socks[k].send(data)
            sent += n
    q.put(("filled", sent, time.time()))
    if go is not None:
        go.wait(600)  # the receiver took the hellos and the fill: the window starts on a drained queue
    t0 = time.time()
    t_end = t0 + seconds
    rounds = 0
    while time.time() < t_end:
        k, data, n = next(gen)
        socks[k].send(data)
        sent += n
        if rate > 0 and k == nodes - 1:  # a round done: every rank reported one step
            rounds += 1
            pause = t0 + rounds / rate - time.time()
            if pause > 0:
                time.sleep(pause)
    q.put(("done", sent, time.time()))
    for s in socks:
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
        if not r.poll(2000 if t0 is not None else 120_000):  # the load connects its sockets first (1k at 16k ranks)
            break
        _ident, data = r.recv_multipart()
        msgs = json.loads(data)["messages"]
        if t0 is None:
            t0 = time.time()
            c0 = time.process_time()  # this process's CPU (both its Python thread and libzmq's I/O thread)
            continue  # the window starts after the first batch
        n += len(msgs)
        if time.time() - t0 > seconds:
            break
    q.put(("bare", n, time.time() - (t0 or time.time()), time.process_time() - c0 if t0 else 0.0))
    r.close(0)
    ctx.term()


def _port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bench_coordinator(ranks: int, per_node: int, seconds: float, fill: bool, tree: Path = REPO, rate: float = 0.0) -> dict:
    from profwatch.adapters.zmq.control import call

    tmp = Path(tempfile.mkdtemp(prefix="pwbi", dir="/tmp"))
    ports = [_port() for _ in range(3)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tree / "daemon"), str(tree)]), PROFWATCH_COORDINATOR__INGEST_BIND=f"tcp://127.0.0.1:{ports[0]}",
               PROFWATCH_COORDINATOR__CONTROL_BIND=f"tcp://127.0.0.1:{ports[1]}",
               PROFWATCH_COORDINATOR__PUB_BIND=f"tcp://127.0.0.1:{ports[2]}",
               PROFWATCH_COORDINATOR__STATE_DB=str(tmp / "state.db"), PROFWATCH_COORDINATOR__WORK_DIR=str(tmp / "w"),
               PROFWATCH_ARMING__MODE="off", PROFWATCH_LOGGING__LEVEL="WARNING")
    proc = subprocess.Popen([sys.executable, "-m", "profwatch.cli", "coordinator"], env=env, cwd=tmp, stdout=subprocess.DEVNULL,
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
        go = mp.Event()
        lp = mp.Process(target=load, args=(f"tcp://127.0.0.1:{ports[0]}", ranks, per_node, "bench", seconds,
                                            1000 if fill else 5, q, rate, go))
        lp.start()
        kind, n_fill, _t = q.get(timeout=1800)
        # measure the steady window only: after the hellos and the fill were taken (else their backlog is in it)
        deadline = time.time() + 600
        while (call(ctrl, "status", {"job_id": "none"}, timeout_s=60)["counters"]["received"] < n_fill + ranks
               and time.time() < deadline):
            time.sleep(0.2)
        c0 = call(ctrl, "status", {"job_id": "none"}, timeout_s=60)["counters"]["received"]
        cpu0 = sum(ps.cpu_times()[:2])
        t0 = time.time()
        go.set()
        kind, _n, _t = q.get(timeout=seconds + 600)
        c1 = call(ctrl, "status", {"job_id": "none"}, timeout_s=60)["counters"]["received"]
        cpu1 = sum(ps.cpu_times()[:2])
        t1 = time.time()
        lp.join(30)
        rss = ps.memory_info().rss
        return {"ranks": ranks, "reports_per_s": (c1 - c0) / (t1 - t0), "cpu_frac": (cpu1 - cpu0) / (t1 - t0),
                "per_cpu_s": (c1 - c0) / (cpu1 - cpu0) if cpu1 > cpu0 else 0.0,
                "rss_mb": rss / 2**20, "filled_1000_steps": fill}
    finally:  # end only what this benchmark started, by pid
        stop_process(lp)
        stop_popen(proc)


def bench_bare(ranks: int, per_node: int, seconds: float, rate: float = 0.0) -> tuple[float, float]:
    """``(reports/s, reports per CPU-second of the bare receiver)``."""
    port = _port()
    q: mp.Queue = mp.Queue()
    bp = mp.Process(target=bare, args=(f"tcp://127.0.0.1:{port}", seconds, q))
    lp: mp.Process | None = None
    bp.start()
    try:
        time.sleep(0.3)  # let the bare receiver bind (benchmark script, not a test)
        lq: mp.Queue = mp.Queue()
        lp = mp.Process(target=load, args=(f"tcp://127.0.0.1:{port}", ranks, per_node, "bench", seconds + 3, 0, lq,
                                           rate))
        lp.start()
        _, n, dt, cpu = q.get(timeout=seconds + 120)
    finally:
        stop_process(lp)
        bp.join(10)
        stop_process(bp)
    return (n / dt if dt else 0.0), (n / cpu if cpu else 0.0)


def _spread(xs: list[float]) -> str:
    xs = sorted(xs)
    return f"{statistics.median(xs):,.0f} ({xs[0]:,.0f}-{xs[-1]:,.0f})"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, nargs="+", default=[1024, 16384])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--fill", action="store_true", help="fill every rank's 1000-step window before measuring")
    ap.add_argument("--ranks-per-node", type=int, default=RANKS_PER_NODE)
    ap.add_argument("--tree", type=Path, nargs="+", default=[REPO],
                    help="checkouts whose coordinators run, interleaved (default: this one)")
    ap.add_argument("--rate", type=float, nargs="+", default=[0.0],
                    help="steps/s per rank, one per --ranks entry (0: saturation)")
    ap.add_argument("--repeat", type=int, default=1, help="rounds; each runs every tree and the bare loop once")
    ap.add_argument("--wire-version", type=int, choices=(1, 2), default=2,
                    help="1 for a before/after pair with a version-1 checkout (this one takes both)")
    a = ap.parse_args()
    WIRE["v"] = a.wire_version
    _check_step_bytes()
    rates = a.rate if len(a.rate) == len(a.ranks) else [a.rate[0]] * len(a.ranks)
    print("reports per CPU-second of the receiver (median (min-max) over rounds); ratio = coordinator / bare")
    for n, rate in zip(a.ranks, rates, strict=True):
        per_cpu: dict[str, list[float]] = {}
        rows: dict[str, list[dict]] = {}
        loads = []
        for _ in range(a.repeat):
            for tree in a.tree:
                r = bench_coordinator(n, a.ranks_per_node, a.seconds, a.fill, tree.resolve(), rate)
                per_cpu.setdefault(str(tree), []).append(r["per_cpu_s"])
                rows.setdefault(str(tree), []).append(r)
                loads.append(os.getloadavg()[0])
            rps, bpc = bench_bare(n, a.ranks_per_node, a.seconds, rate)
            per_cpu.setdefault("bare", []).append(bpc)
            loads.append(os.getloadavg()[0])
        bare_med = statistics.median(per_cpu["bare"])
        print(f"ranks {n} ({len(_nodes(n, a.ranks_per_node))} nodes), {'saturation' if not rate else f'{rate:g} steps/s per rank'}, "
              f"{a.seconds:g} s windows, load1 {min(loads):.1f}-{max(loads):.1f}")
        print(f"  bare recv+json.loads        {_spread(per_cpu['bare'])} rep/CPU-s")
        for tree in a.tree:
            k = str(tree)
            rs = rows[k]
            ratios = [x / b for x, b in zip(per_cpu[k], per_cpu["bare"], strict=True) if b] or [0.0]
            print(f"  {k:<28} {_spread(per_cpu[k])} rep/CPU-s, ratio {statistics.median(per_cpu[k]) / (bare_med or 1):.2f} "
                  f"(per round {min(ratios):.2f}-{max(ratios):.2f}), {statistics.median([x['reports_per_s'] for x in rs]):,.0f} rep/s, "
                  f"CPU {statistics.median([x['cpu_frac'] for x in rs]):.2f}, RSS {max(x['rss_mb'] for x in rs):.0f} MB")


if __name__ == "__main__":
    main()
