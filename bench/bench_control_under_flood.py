"""Control latency while ingest is flooded with costly batches (adversarial finding: ``profwatch status`` said the
coordinator was down during a flood of 1000-hello batches, because one ingest pass could run for seconds).

A real ``profwatch coordinator`` runs as a subprocess on loopback. A fake node (DEALER) registers a 64-rank job,
then sends ``--batches`` batches of ``--hellos`` hellos each, every hello claiming another (world size, restart
count): the generation-claim path, the costliest per message. Meanwhile a client times ``status`` requests (the
CLI gives the coordinator 3 s for its first ping). Prints the request latencies (median, p90, max) and how many
took longer than 3 s (goal 0), and the ingest rate.

Usage: python bench/bench_control_under_flood.py [--batches 150] [--hellos 1000]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import zmq

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "daemon"))

from profwatch.simulate.launcher import free_port  # noqa: E402
from rankhook import wire  # noqa: E402


def _request(endpoint: str, cmd: str, timeout_s: float) -> float | None:
    """Seconds until the reply (None: no reply within ``timeout_s``)."""
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.REQ)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, int(timeout_s * 1000))
    sock.connect(endpoint)
    t0 = time.monotonic()
    try:
        sock.send(json.dumps({"cmd": cmd, "args": {}}).encode())
        sock.recv()
        return time.monotonic() - t0
    except zmq.Again:
        return None
    finally:
        sock.close(0)


def _hello(job: str, rank: int, world: int, rc: int | None) -> wire.RankHello:
    return wire.RankHello(job_id=job, rank=rank, local_rank=rank % 8, world_size=world, hostname="fake",
                          pid=1000 + rank, backend="torch", ts_unix_s=time.time(), restart_count=rc)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, default=150)
    ap.add_argument("--hellos", type=int, default=1000)
    a = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="pwflood"))
    ports = {k: free_port() for k in ("ingest", "control", "pub", "metrics")}
    cfg = root / "pw.toml"
    cfg.write_text(f"""[coordinator]
ingest_bind = "tcp://127.0.0.1:{ports['ingest']}"
control_bind = "tcp://127.0.0.1:{ports['control']}"
pub_bind = "tcp://127.0.0.1:{ports['pub']}"
metrics_port = {ports['metrics']}
state_db = "{root}/state.db"
work_dir = "{root}/work"
allowed_prof_roots = ["{root}/prof"]
allowed_config_roots = ["{root}/cfg"]
""")
    control = f"tcp://127.0.0.1:{ports['control']}"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "daemon"), str(REPO)])}
    coord = subprocess.Popen([sys.executable, "-m", "profwatch.cli", "coordinator", "--config", str(cfg)],
                             stdout=subprocess.DEVNULL, stderr=open(root / "coordinator.log", "wb"), env=env,
                             start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while _request(control, "ping", 1.0) is None:
            if time.monotonic() > deadline or coord.poll() is not None:
                raise SystemExit("the coordinator did not start (see coordinator.log)")
        ctx = zmq.Context.instance()
        dealer = ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.IDENTITY, b"flood-node")
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.setsockopt(zmq.SNDHWM, 0)
        dealer.connect(f"tcp://127.0.0.1:{ports['ingest']}")
        seq = [0]

        def send(msgs: list[wire.RankHello]) -> None:
            seq[0] += 1
            dealer.send(wire.encode(wire.NodeBatch(node_id="flood-node", hostname="fake", seq=seq[0],
                                                   ts_unix_s=time.time(), messages=[wire.to_dict(m) for m in msgs])))

        send([_hello("j", r, 64, 0) for r in range(64)])
        while _request(control, "status", 5.0) is None:
            pass
        batches = [[_hello("j", i % 64, 64 + (b * a.hellos + i) % 4096, 1 + (b * a.hellos + i))
                    for i in range(a.hellos)] for b in range(a.batches)]
        latencies: list[float | None] = []
        done = threading.Event()

        def probe() -> None:
            while not done.is_set():
                latencies.append(_request(control, "status", 10.0))

        t = threading.Thread(target=probe)
        t0 = time.monotonic()
        t.start()
        for b in batches:
            send(b)
        # the flood is sent; wait until the coordinator has worked through it (its received counter)
        want = 64 + a.batches * a.hellos
        while True:
            ctl = zmq.Context.instance().socket(zmq.REQ)
            ctl.setsockopt(zmq.LINGER, 0)
            ctl.setsockopt(zmq.RCVTIMEO, 20_000)
            ctl.connect(control)
            ctl.send(json.dumps({"cmd": "status", "args": {}}).encode())
            got = json.loads(ctl.recv())["result"]["counters"]["received"]
            ctl.close(0)
            if got >= want or time.monotonic() - t0 > 600:
                break
            time.sleep(0.2)
        busy_s = time.monotonic() - t0
        done.set()
        t.join(30)
        ok = sorted(x for x in latencies if x is not None)
        slow = sum(1 for x in latencies if x is None or x > 3.0)
        print(f"flood: {a.batches} batches x {a.hellos} claiming hellos = {a.batches * a.hellos} messages, "
              f"worked through in {busy_s:.1f} s ({a.batches * a.hellos / busy_s:,.0f}/s)")
        if ok:
            print(f"status during the flood: {len(latencies)} requests, median {statistics.median(ok) * 1000:.0f} ms, "
                  f"p90 {ok[int(0.9 * (len(ok) - 1))] * 1000:.0f} ms, max {ok[-1] * 1000:.0f} ms; "
                  f"over 3 s or unanswered: {slow} (goal 0)")
        else:
            print(f"status during the flood: {len(latencies)} requests, none answered")
        print(f"coordinator log: {(root / 'coordinator.log').stat().st_size / 1e6:.2f} MB")
    finally:
        os.killpg(coord.pid, signal.SIGTERM)
        try:
            coord.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(coord.pid, signal.SIGKILL)


if __name__ == "__main__":
    main()
