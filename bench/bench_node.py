"""Node daemon under its ranks' load: CPU and relay latency at 200 steps/s per rank for N local ranks (issue 26).

A real ``profwatch node`` runs as a subprocess, its rank socket on ipc (peer credentials read, uid pins kept, as in
production), its coordinator a stand-in ROUTER in this script that answers each heartbeat (``heartbeat_ack``), so
the node is in its normal, answered state. Load processes play the ranks: one PUSH connection per rank (as the hook
has), a hello each, then step reports as the hook sends them (``wire.frames`` of a ``StepReport`` with two stages),
each rank at ``--rate`` steps/s on its own phase (ranks are spread over at most 32 per load process; a late send
is sent at once, never skipped, so the achieved rate is printed). Each report's ``ts_unix_s`` is its send time.

Measured over the steady window (after a warm-up second), per size:

- offered and relayed reports per second (relayed: counted in the batches the stand-in receives);
- node CPU (user + system of the node process, as a fraction of one core), the share of it in the Python loop
  (the main thread; the rest is ZeroMQ's I/O threads and the file system worker) and CPU microseconds per report;
- relay latency, rank send -> batch received by the stand-in coordinator (median, p99, max in ms): it includes the
  node's batching delay (``node.batch_max_delay_s``, 50 ms by default), so ~25 ms median is the design, not a cost;
- batches per second and reports per batch; the node's own counters from its last heartbeat (``dropped`` and
  ``rejected`` should be 0).

The node keeps up when relayed ~= offered, no drops, and the latency p99 stays near the batching delay (a node
that falls behind shows a growing latency). Nothing is asserted. Load processes share the CPUs with the node: the
load average is printed with each row.

``--tree DIR`` runs the node daemon of another checkout (e.g. the main branch, for a before/after pair); the load
and the stand-in are this one's. The daemon starts in a temporary folder: ``python -m`` puts its working folder
first on ``sys.path``, and a checkout's ``rankhook/`` there would shadow the tree's.

Usage: python bench/bench_node.py [--ranks 8 64] [--rate 200] [--seconds 10] [--tree DIR]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import zmq
from procs import stop_popen, stop_process

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "daemon"))

from rankhook import wire  # noqa: E402

JOB = "benchnode"
RANKS_PER_LOADER = 32


def ranks_load(endpoint: str, ranks: list[int], world: int, rate: float, t_start: float, t_end: float,
               q: mp.Queue) -> None:
    """Play ``ranks``: a hello each, then ``rate`` step reports per second each from ``t_start`` to ``t_end``."""
    ctx = zmq.Context()
    socks = {}
    for r in ranks:
        s = ctx.socket(zmq.PUSH)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.SNDHWM, 10_000)
        s.connect(endpoint)
        socks[r] = s
        s.send_multipart(wire.frames(wire.RankHello(job_id=JOB, rank=r, local_rank=r, world_size=world,
                                                    hostname="bench", pid=os.getpid(), backend="none",
                                                    ts_unix_s=time.time())))
    period = 1.0 / rate
    # rank i of this loader sends at t_start + k * period + phase_i: the sends of all ranks spread over the period
    phases = [r / world * period for r in ranks]
    order = sorted(range(len(ranks)), key=lambda i: phases[i])
    sent = 0
    k = 0
    now = time.time()
    while now < t_end:
        base = t_start + k * period
        for i in order:
            due = base + phases[i]
            now = time.time()
            if due - now > 0.0002:
                time.sleep(due - now)
            r = ranks[i]
            rep = wire.StepReport(job_id=JOB, rank=r, step=k + 1, step_time_s=period, ts_unix_s=time.time(),
                                  stages={"forward": period * 0.3, "backward": period * 0.6})
            try:
                socks[r].send_multipart(wire.frames(rep), zmq.NOBLOCK)
                sent += 1
            except zmq.Again:
                pass
        k += 1
        now = time.time()
    q.put(sent)
    for s in socks.values():
        s.close(0)
    ctx.term()


def _port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cpu(ps: psutil.Process) -> tuple[float, float]:
    """CPU seconds (user + system) of the whole node process and of its main thread (the Python loop; the rest is
    ZeroMQ's I/O threads and the node's file system worker)."""
    main = sum(t.user_time + t.system_time for t in ps.threads() if t.id == ps.pid)
    return sum(ps.cpu_times()[:2]), main


def bench(n_ranks: int, rate: float, seconds: float, tree: Path = REPO, warmup_s: float = 2.0) -> dict[str, float]:
    tmp = Path(tempfile.mkdtemp(prefix="pwbn", dir="/tmp"))
    port = _port()
    ctx = zmq.Context()
    coord = ctx.socket(zmq.ROUTER)
    coord.setsockopt(zmq.LINGER, 0)
    coord.bind(f"tcp://127.0.0.1:{port}")
    ep = f"ipc://{tmp}/node.sock"
    env = dict(os.environ, PROFWATCH_NODE__BIND=ep, PROFWATCH_NODE__COORDINATOR=f"tcp://127.0.0.1:{port}",
               PROFWATCH_NODE__RUNTIME_DIR=str(tmp), PROFWATCH_NODE__NODE_ID="benchnode1",
               PROFWATCH_LOGGING__LEVEL="WARNING",
               PYTHONPATH=os.pathsep.join([str(tree / "daemon"), str(tree)]))
    node = subprocess.Popen([sys.executable, "-m", "profwatch.cli", "node"], env=env, cwd=tmp, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    loaders: list[mp.Process] = []
    try:
        deadline = time.monotonic() + 60
        while not (tmp / "node.sock").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        ps = psutil.Process(node.pid)
        q: mp.Queue = mp.Queue()
        t_start = time.time() + 1.0
        t_end = t_start + warmup_s + seconds
        for lo in range(0, n_ranks, RANKS_PER_LOADER):
            p = mp.Process(target=ranks_load, args=(ep, list(range(lo, min(n_ranks, lo + RANKS_PER_LOADER))), n_ranks,
                                                    rate, t_start, t_end, q))
            p.start()
            loaders.append(p)
        lat: list[float] = []
        relayed = batches = 0
        counters: dict[str, int] = {}
        cpu0 = cpu1 = None
        t0 = t1 = 0.0
        t_measure = t_start + warmup_s
        while time.time() < t_end + 0.5:
            if not coord.poll(100):
                continue
            route, data = coord.recv_multipart()
            now = time.time()
            doc = json.loads(data)
            if doc.get("kind") == "node_heartbeat":
                counters = doc.get("counters", {})
                coord.send_multipart([route, wire.encode(wire.NodeCommand(cmd="heartbeat_ack", command_id="hb"))])
                continue
            if doc.get("kind") != "node_batch":
                continue
            if cpu0 is None and now >= t_measure:
                cpu0, t0 = _cpu(ps), now
            if cpu0 is not None and cpu1 is None and now > t_end:
                cpu1, t1 = _cpu(ps), now  # the first batch after the load stopped: the window ends here
            if cpu0 is None or cpu1 is not None:
                continue
            steps = [m for m in doc["messages"] if m.get("kind") == "step"]
            batches += 1
            relayed += len(steps)
            lat.extend(now - m["ts_unix_s"] for m in steps)
        if cpu0 is None:
            cpu0, t0 = _cpu(ps), time.time()
        if cpu1 is None:
            cpu1, t1 = _cpu(ps), time.time()
        sent = sum(q.get(timeout=30) for _ in loaders)
        for p in loaders:
            p.join(10)
        window = max(1e-9, t1 - t0)
        lat.sort()
        cpu_frac = (cpu1[0] - cpu0[0]) / window
        return {"ranks": n_ranks, "offered_per_s": sent / (warmup_s + seconds), "relayed_per_s": relayed / window,
                "cpu_frac": cpu_frac, "cpu_us_per_report": cpu_frac * 1e6 / max(1.0, relayed / window),
                "py_frac": (cpu1[1] - cpu0[1]) / window,
                "lat_med_ms": 1e3 * statistics.median(lat) if lat else float("nan"),
                "lat_p99_ms": 1e3 * lat[int(0.99 * (len(lat) - 1))] if lat else float("nan"),
                "lat_max_ms": 1e3 * lat[-1] if lat else float("nan"),
                "batches_per_s": batches / window, "per_batch": relayed / max(1, batches),
                "dropped": counters.get("dropped", -1), "rejected": counters.get("rejected", -1),
                "load1": os.getloadavg()[0]}
    finally:  # end only what this benchmark started, by pid
        for p in loaders:
            stop_process(p)
        stop_popen(node, 10)
        coord.close(0)
        ctx.term()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, nargs="+", default=[8, 64])
    ap.add_argument("--rate", type=float, default=200.0, help="steps per second per rank")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--tree", type=Path, default=REPO, help="checkout whose node daemon runs (default: this one)")
    a = ap.parse_args()
    print(f"node daemon, {a.rate:g} steps/s per rank, {a.seconds:g} s measured after a warm-up; latency: rank send -> "
          f"batch at the coordinator (includes the 50 ms batching delay); node daemon of {a.tree.resolve()}")
    print(f"{'ranks':>5} {'offered/s':>9} {'relayed/s':>9} {'node CPU':>8} {'py loop':>7} {'us/rep':>7} {'lat med':>7} {'p99':>7} "
          f"{'max':>7} {'batch/s':>7} {'rep/bat':>7} {'dropped':>7} {'rejected':>8} {'load1':>5}")
    for n in a.ranks:
        r = bench(n, a.rate, a.seconds, a.tree.resolve())
        print(f"{n:>5} {r['offered_per_s']:>9,.0f} {r['relayed_per_s']:>9,.0f} {r['cpu_frac']:>8.2f} {r['py_frac']:>7.2f} "
              f"{r['cpu_us_per_report']:>7.1f} {r['lat_med_ms']:>7.1f} {r['lat_p99_ms']:>7.1f} {r['lat_max_ms']:>7.1f} "
              f"{r['batches_per_s']:>7.1f} {r['per_batch']:>7.1f} {r['dropped']:>7} {r['rejected']:>8} "
              f"{r['load1']:>5.2f}")


if __name__ == "__main__":
    main()
