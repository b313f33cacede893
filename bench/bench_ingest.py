"""Coordinator ingest through real node daemons: step reports per CPU-second of the coordinator beside a bare
ROUTER ``recv_multipart`` + ``json.loads`` loop fed by the same node daemons, interleaved (issues 2, 26, 34).

The load is the production path from the hook on:

- ``--nodes`` real ``profwatch node`` subprocesses (default: 8, or more so that none serves over
  ``limits.max_ranks_per_node`` = 1024 ranks), each on its own ipc rank socket (peer credentials read, uid pins kept,
  reports re-encoded and batched as in production: ``node.batch_max_delay_s``, ``node.batch_max_messages``), all
  relaying to one TCP endpoint;
- load processes playing the ranks (1024 each): one PUSH connection per rank (as the hook has), a hello each, then
  step reports in the hook's bytes (the common ``rankhook.step()`` report: ``wire.StepReportUs`` without optional
  fields, checked at start to read as the report it stands for), every rank at ``--rate`` steps/s on its own phase (paced: a late send is sent at once,
  never skipped), or as fast as the sockets take them (``--rate 0``: saturation; a full queue drops, as the hook
  does). ``RLIMIT_NOFILE`` bounds the sockets of one process (hard 20,000 here): 1024 ranks per load process is
  ~3,000 descriptors, so ranks are spread over load processes, and over node daemons (a node's rank socket holds a
  descriptor per rank). Fewer ranks per node mean smaller batches, so more cost per message on both receivers:
  the table names the node count and the messages per batch.

The receivers take turns on that endpoint, the node daemons and their load running throughout: a round is one
window of each receiver (the coordinator of each ``--tree``, then the bare loop; the order rotates per round). A
receiver starts, the node daemons reconnect (a coordinator tells each to re-register: the nodes re-send their cached
hellos), ``--warmup`` seconds pass and (paced) the receiver takes what the load offers within 10 % over two
consecutive seconds (its start's backlog drained: at most 30 s more), then its CPU (user + system of its whole process: Python and libzmq's I/O
thread) and the rank messages it took are read over ``--seconds``; then it is stopped. The node daemons' relay queue
is kept short (``relay_hwm`` 20 batches) so a receiver does not start on a long backlog of the last one's turn.

Printed per size: rank messages per CPU-second of each receiver (median (min-max) over rounds), the ratio to the
bare loop (of the medians, and the range of per-round ratios), messages/s taken, CPU share (of one core), the main
thread's share of the receiver's CPU (the rest is libzmq's I/O thread and helper threads), messages per node batch,
and the load average during the run. The bare loop is the floor of a Python receiver (no validation, registry or
detection), not a competitor.

Read with care on a busy box: a window's CPU is read from ``/proc`` in 10 ms ticks, so at 4k ranks x 1 step/s
(~0.04 of a core) a 4 s window holds ~15 ticks (use ``--seconds 10`` or more there); when the load processes and
node daemons are starved the receiver gets fewer messages than offered (printed msg/s below ``ranks x rate``) and
the nodes send larger batches, which lowers both receivers' cost per message and moves the ratio.

``--tree DIR`` runs the coordinator of another checkout too (e.g. the main branch: a before/after pair in one run);
the node daemons and the load are this checkout's. Daemons start in a temporary folder (a checkout's ``rankhook/``
in the working folder would shadow the tree's). ``--profile FILE`` runs this checkout's coordinator under cProfile
(one extra turn before the rounds, not in the table; the main thread's CPU time as the clock) and writes its stats
to FILE.

Usage: python bench/bench_ingest.py [--ranks 1024 4096 16384] [--rate 10 1 1] [--rounds 4] [--seconds 5]
       [--tree DIR ...] [--nodes N] [--profile FILE]
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import resource
import shutil
import signal
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
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "daemon"))

from rankhook import wire  # noqa: E402

JOB = "benchingest"
MAX_RANKS_PER_NODE = 1024  # limits.max_ranks_per_node's default: every report takes the accepted path
RELAY_HWM = 20


def _step_format(rank: int) -> bytes:
    """The hook's common step report for ``rank`` (``rankhook/hook.py``: ``%d`` for step, step_time_us, ts_unix_us)."""
    return ('{"job_id":' + json.dumps(JOB) + ',"rank":' + str(rank) + ',"step":%d,"step_time_us":%d,"ts_unix_us":%d'
            ',"kind":"step","v":' + str(wire.SCHEMA_VERSION) + "}").encode()


def _check_step_bytes() -> None:
    rep = wire.StepReportUs(job_id=JOB, rank=3, step=7, step_time_us=100_000, ts_unix_us=1_764_500_000_250_000,
                            kind="step")
    from profwatch.core.messages import parse_rank_message

    got = parse_rank_message(_step_format(3) % (7, 100_000, 1_764_500_000_250_000), peer_pid=9)
    assert got == rep.report(9), "not the hook's report"


def ranks_load(endpoints: list[str], ranks: range, per_node: int, world: int, rate: float, stop: Any,
               sent: Any) -> None:
    """Play ``ranks`` (rank r on node ``r // per_node``, whose rank socket is ``endpoints[r // per_node]``): a hello
    each, then step reports until ``stop`` is set (``rate`` steps/s per rank, 0: as fast as the sockets take them).
    ``sent`` (a shared counter) counts the reports sent."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 3 * len(ranks) + 256)), hard))
    os.nice(5)  # the load yields to the receivers it feeds
    ctx = zmq.Context()
    ctx.set(zmq.MAX_SOCKETS, len(ranks) + 64)
    socks = []
    for r in ranks:
        s = ctx.socket(zmq.PUSH)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.SNDHWM, 1000)
        node = r // per_node
        s.connect(endpoints[node])
        socks.append(s)
        s.send_multipart(wire.frames(wire.RankHello(job_id=JOB, rank=r, local_rank=r % per_node, world_size=world,
                                                    hostname=f"bench{node}", pid=os.getpid(), backend="none",
                                                    ts_unix_s=time.time())))
    topics = [wire.topic_for("step", JOB, r).encode() for r in ranks]
    formats = [_step_format(r) for r in ranks]
    n = len(socks)
    period = 1.0 / rate if rate > 0 else 0.0
    period_us = int(period * 1e6) or 1000
    phases = [(r / world) * period for r in ranks]  # the sends of all ranks spread over the period
    t0 = time.time() + 0.5
    k = 0
    count = 0
    while not stop.is_set():
        k += 1
        base = t0 + k * period
        for i in range(n):
            if period:
                due = base + phases[i]
                wait = due - time.time()
                if wait > 0.001:
                    time.sleep(wait)
            try:
                socks[i].send_multipart([topics[i], formats[i] % (k, period_us, time.time_ns() // 1000)], zmq.NOBLOCK)
                count += 1
            except zmq.Again:
                pass
        sent.value = count
    for s in socks:
        s.close(0)
    ctx.term()


def bare(endpoint: str, stop: Any, got: Any, batches: Any) -> None:
    """The reference receiver: ROUTER ``recv_multipart`` + ``json.loads`` of each node message, counting the rank
    messages of the batches (``got``) and the batches (``batches``) in shared counters."""
    ctx = zmq.Context()
    r = ctx.socket(zmq.ROUTER)
    r.setsockopt(zmq.LINGER, 0)
    r.setsockopt(zmq.RCVTIMEO, 200)
    r.bind(endpoint)
    n = b = 0
    while not stop.is_set():
        try:
            _ident, data = r.recv_multipart()
        except zmq.Again:
            continue
        msgs = json.loads(data).get("messages")
        if msgs is not None:
            n += len(msgs)
            b += 1
            got.value = n
            batches.value = b
    r.close(0)
    ctx.term()


def _port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cpu(ps: psutil.Process) -> float:
    t = ps.cpu_times()
    return float(t.user + t.system)


def _main_cpu(ps: psutil.Process) -> float:
    """CPU seconds of the process's main thread (the Python loop; the rest: libzmq's I/O thread, helper threads)."""
    return float(sum(t.user_time + t.system_time for t in ps.threads() if t.id == ps.pid))


PROFILED = """
import cProfile, sys, time
out = sys.argv[1]
sys.argv = ["profwatch", "coordinator"]
from profwatch import cli
pr = cProfile.Profile(time.thread_time)
pr.enable()
try:
    cli.main()
finally:
    pr.disable()
    pr.dump_stats(out)
"""
"""The coordinator under cProfile with the main thread's CPU time as its clock (the default is wall time, which
counts waits for the GIL and in ``poll`` as cost); its imports before the profile starts."""


class Receiver:
    """One turn of a receiver on the ingest endpoint: ``start()``, ``sample()`` -> (messages, batches, CPU s),
    ``stop()``."""

    def __init__(self, name: str, endpoint: str, tree: Path | None, profile: Path | None = None) -> None:
        self.name, self.endpoint, self.tree, self.profile = name, endpoint, tree, profile
        self.proc: subprocess.Popen | None = None
        self.bp: mp.Process | None = None
        self.ctrl = ""
        self.log: Path | None = None

    def start(self) -> None:
        if self.tree is None:
            self.stop_ev = mp.Event()
            self.got = mp.Value("q", 0, lock=False)
            self.batches = mp.Value("q", 0, lock=False)
            self.bp = mp.Process(target=bare, args=(self.endpoint, self.stop_ev, self.got, self.batches))
            self.bp.start()
            self.ps = psutil.Process(self.bp.pid)
            return
        tmp = Path(tempfile.mkdtemp(prefix="pwbi", dir="/tmp"))
        ports = [_port() for _ in range(2)]
        self.ctrl = f"tcp://127.0.0.1:{ports[0]}"
        tree = self.tree
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tree / "daemon"), str(tree)]),
                   PROFWATCH_COORDINATOR__INGEST_BIND=self.endpoint, PROFWATCH_COORDINATOR__CONTROL_BIND=self.ctrl,
                   PROFWATCH_COORDINATOR__PUB_BIND=f"tcp://127.0.0.1:{ports[1]}",
                   PROFWATCH_COORDINATOR__STATE_DB=str(tmp / "state.db"), PROFWATCH_COORDINATOR__WORK_DIR=str(tmp / "w"),
                   PROFWATCH_ARMING__MODE="off", PROFWATCH_LOGGING__LEVEL="WARNING")
        cmd = [sys.executable, "-m", "profwatch.cli", "coordinator"]
        if self.profile is not None:
            cmd = [sys.executable, "-c", PROFILED, str(self.profile)]
        self.log = tmp / "coordinator.log"  # its warnings and errors: the tail is printed when a turn fails
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(cmd, env=env, cwd=tmp, stdout=subprocess.DEVNULL, stderr=out)
        self.ps = psutil.Process(self.proc.pid)
        from profwatch.adapters.zmq.control import call

        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                call(self.ctrl, "ping", timeout_s=0.5)
                return
            except Exception:  # noqa: BLE001
                time.sleep(0.1)
        raise RuntimeError(f"coordinator of {tree} did not answer within 120 s")

    def sample(self, cpu_first: bool = False) -> tuple[int, int, float]:
        """``(rank messages taken, batches, CPU seconds)`` so far. A coordinator is asked for its counters over its
        control socket (``status``, which costs it CPU: ~25 ms at 4k ranks): at a window's start the CPU is read
        after the answer, at its end (``cpu_first``) before the question, so that cost is outside the window (the
        messages taken while it answers, a few milliseconds' worth, are inside)."""
        if self.tree is None:
            return int(self.got.value), int(self.batches.value), _cpu(self.ps)
        from profwatch.adapters.zmq.control import call

        cpu = _cpu(self.ps) if cpu_first else 0.0
        c = call(self.ctrl, "status", {"job_id": "none"}, timeout_s=60)["counters"]
        return int(c["received"]), int(c.get("batches", 0)), cpu if cpu_first else _cpu(self.ps)

    def stop(self) -> None:
        if self.bp is not None:
            self.stop_ev.set()
            self.bp.join(10)
            stop_process(self.bp)
            self.bp = None
        if self.proc is not None:
            if self.profile is not None:  # SIGINT: the CLI stops the daemon, cProfile writes its stats on the way out
                self.proc.send_signal(signal.SIGINT)
                try:
                    self.proc.wait(60)
                except subprocess.TimeoutExpired:
                    pass
            stop_popen(self.proc)
            self.proc = None
            if self.log is not None:
                shutil.rmtree(self.log.parent, ignore_errors=True)  # the folder this turn made (state db, log)


def _settle(r: Receiver, sent: list[Any], warmup: float, paced: bool, limit_s: float = 30.0) -> None:
    """Wait until the receiver is in its steady state: ``warmup`` seconds, then (paced) until two consecutive
    1-second intervals took what the load offered within 10 % (the nodes reconnected and re-registered, and the
    backlog of the receiver's start is drained), at most ``limit_s``."""
    time.sleep(warmup)  # bench script: the nodes reconnect and re-register
    if not paced:
        return
    ok = 0
    end = time.monotonic() + limit_s
    m0, o0 = r.sample()[0], sum(s.value for s in sent)
    while ok < 2 and time.monotonic() < end:
        time.sleep(1.0)
        m1, o1 = r.sample()[0], sum(s.value for s in sent)
        ok = ok + 1 if o1 > o0 and abs((m1 - m0) / (o1 - o0) - 1.0) <= 0.1 else 0
        m0, o0 = m1, o1


def _nodes(ranks: int, nodes: int) -> list[range]:
    """The ranks of each node daemon: ``nodes`` of them, more where one would serve over 1024 ranks."""
    n = max(nodes, math.ceil(ranks / MAX_RANKS_PER_NODE))
    per = math.ceil(ranks / n)
    return [range(lo, min(ranks, lo + per)) for lo in range(0, ranks, per)]


RANKS_PER_LOADER = 1024
"""Ranks one load process plays (~3 descriptors per PUSH socket: within ``RLIMIT_NOFILE``'s hard 20,000)."""


def bench(ranks: int, rate: float, nodes: int, trees: list[Path], rounds: int, seconds: float, warmup: float,
          profile: Path | None) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="pwbn", dir="/tmp"))
    port = _port()
    endpoint = f"tcp://127.0.0.1:{port}"
    groups = _nodes(ranks, nodes)
    node_procs: list[subprocess.Popen] = []
    loaders: list[mp.Process] = []
    stop = mp.Event()
    sent = [mp.Value("q", 0, lock=False) for _ in range(0, ranks, RANKS_PER_LOADER)]
    out: dict[str, Any] = {"ranks": ranks, "rate": rate, "nodes": len(groups), "per_cpu": {}, "rate_in": {},
                           "cpu": {}, "per_batch": {}, "main": {}, "loads": []}
    try:
        for k, _rs in enumerate(groups):
            env = dict(os.environ, PROFWATCH_NODE__BIND=f"ipc://{tmp}/n{k}.sock", PROFWATCH_NODE__COORDINATOR=endpoint,
                       PROFWATCH_NODE__RUNTIME_DIR=str(tmp), PROFWATCH_NODE__NODE_ID=f"benchnode{k}",
                       PROFWATCH_NODE__RELAY_HWM=str(RELAY_HWM), PROFWATCH_LOGGING__LEVEL="ERROR",
                       PYTHONPATH=os.pathsep.join([str(REPO / "daemon"), str(REPO)]))
            node_procs.append(subprocess.Popen(["nice", "-n", "5", sys.executable, "-m", "profwatch.cli", "node"],
                                               env=env, cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        deadline = time.monotonic() + 120
        while not all((tmp / f"n{k}.sock").exists() for k in range(len(groups))) and time.monotonic() < deadline:
            time.sleep(0.1)
        eps = [f"ipc://{tmp}/n{k}.sock" for k in range(len(groups))]
        for k, lo in enumerate(range(0, ranks, RANKS_PER_LOADER)):
            rs = range(lo, min(ranks, lo + RANKS_PER_LOADER))
            p = mp.Process(target=ranks_load, args=(eps, rs, len(groups[0]), ranks, rate, stop, sent[k]))
            p.start()
            loaders.append(p)
        sides: list[tuple[str, Path | None]] = [(str(t), t) for t in trees] + [("bare", None)]
        if profile is not None:
            r = Receiver("profile", endpoint, REPO, profile)
            r.start()
            time.sleep(warmup + seconds)
            r.stop()
        for rnd in range(rounds):
            order = sides[rnd % len(sides):] + sides[: rnd % len(sides)]
            for name, tree in order:
                for attempt in range(3):  # a turn whose receiver failed (a port taken meanwhile on a shared box)
                    r = Receiver(name, endpoint, tree)
                    try:
                        r.start()
                        _settle(r, sent, warmup, paced=rate > 0)
                        m0, b0, c0 = r.sample()
                        p0 = _main_cpu(r.ps)
                        t0 = time.monotonic()
                        time.sleep(seconds)
                        p1 = _main_cpu(r.ps)
                        m1, b1, c1 = r.sample(cpu_first=True)
                        t1 = time.monotonic()
                        break
                    except Exception as exc:  # noqa: BLE001 - said, and the turn is run again
                        log_tail = ""
                        if getattr(r, "log", None) is not None and r.log.exists():
                            log_tail = " | ".join(r.log.read_text(errors="replace").splitlines()[-3:])[-600:]
                        print(f"  (turn of {name} failed, attempt {attempt + 1}: {exc!r:.200}; rc "
                              f"{r.proc.poll() if r.proc is not None else '-'}; log: {log_tail})", flush=True)
                        if attempt == 2:
                            raise
                    finally:
                        r.stop()
                out["per_cpu"].setdefault(name, []).append((m1 - m0) / (c1 - c0) if c1 > c0 else 0.0)
                out["rate_in"].setdefault(name, []).append((m1 - m0) / (t1 - t0))
                out["cpu"].setdefault(name, []).append((c1 - c0) / (t1 - t0))
                out["per_batch"].setdefault(name, []).append((m1 - m0) / max(1, b1 - b0))
                out["main"].setdefault(name, []).append((p1 - p0) / (c1 - c0) if c1 > c0 else 0.0)
                out["loads"].append(os.getloadavg()[0])
        out["offered"] = sum(s.value for s in sent)
    finally:  # end only what this benchmark started, by pid
        stop.set()
        for p in loaders:
            p.join(10)
            stop_process(p)
        for np_ in node_procs:
            stop_popen(np_, 10)
        shutil.rmtree(tmp, ignore_errors=True)  # the node daemons' sockets and locks
    return out


def _spread(xs: list[float]) -> str:
    xs = sorted(xs)
    return f"{statistics.median(xs):,.0f} ({xs[0]:,.0f}-{xs[-1]:,.0f})"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, nargs="+", default=[1024, 4096, 16384])
    ap.add_argument("--rate", type=float, nargs="+", default=[10.0, 1.0, 1.0],
                    help="steps/s per rank, one per --ranks entry (or one for all); 0: saturation")
    ap.add_argument("--nodes", type=int, default=8, help="node daemons (more where a node would exceed 1024 ranks)")
    ap.add_argument("--rounds", type=int, default=4, help="windows of each receiver, interleaved")
    ap.add_argument("--seconds", type=float, default=5.0, help="length of one measured window")
    ap.add_argument("--warmup", type=float, default=3.0, help="seconds after a receiver starts before its window")
    ap.add_argument("--tree", type=Path, nargs="+", default=[REPO],
                    help="checkouts whose coordinators take turns with the bare loop (default: this one)")
    ap.add_argument("--profile", type=Path, help="also run this checkout's coordinator under cProfile, stats here")
    a = ap.parse_args()
    _check_step_bytes()
    rates = a.rate if len(a.rate) == len(a.ranks) else [a.rate[0]] * len(a.ranks)
    trees = [t.resolve() for t in a.tree]
    print("rank messages per CPU-second of the receiver, median (min-max) over rounds; ratio = coordinator / bare")
    for n, rate in zip(a.ranks, rates, strict=True):
        r = bench(n, rate, a.nodes, trees, a.rounds, a.seconds, a.warmup, a.profile)
        bare_med = statistics.median(r["per_cpu"]["bare"])
        print(f"ranks {n} on {r['nodes']} node daemons, {f'{rate:g} steps/s per rank' if rate else 'saturation'}, "
              f"{a.rounds} x {a.seconds:g} s windows, load1 {min(r['loads']):.1f}-{max(r['loads']):.1f}")
        for name in [str(t) for t in trees] + ["bare"]:
            pc = r["per_cpu"][name]
            ratios = [x / b for x, b in zip(pc, r["per_cpu"]["bare"], strict=True) if b] or [0.0]
            ratio = "" if name == "bare" else (f", ratio {statistics.median(pc) / (bare_med or 1):.2f} "
                                               f"(rounds {min(ratios):.2f}-{max(ratios):.2f})")
            print(f"  {'bare recv+json.loads' if name == 'bare' else name:<28} {_spread(pc)} msg/CPU-s{ratio}, "
                  f"{statistics.median(r['rate_in'][name]):,.0f} msg/s, CPU {statistics.median(r['cpu'][name]):.2f}, "
                  f"main thread {statistics.median(r['main'][name]):.0%}, "
                  f"{statistics.median(r['per_batch'][name]):.0f} msg/batch")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
