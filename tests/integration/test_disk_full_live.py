"""State disk full with a live coordinator (issue 12, "faults that lose data"): 300 alerts raised while the state
store refuses writes all reach every path (PUB subscribers, ``profwatch alerts --follow``, the webhook sink)
exactly once, a ``storage_failed`` alert and the ``profwatch_state_store_*`` metrics say so, the store takes them
all once the disk has room again, and the same alerts raised again are dropped by id on every path.

Two ways to fill the disk, same assertions:

* ``tmpfs``: a real full file system. The coordinator runs as a process in its own mount namespace
  (``unshare -Urm``) with its state directory on a 4 MiB tmpfs; ``dd`` fills it to ENOSPC and ``rm`` frees it.
  Skipped (with the reason) where user namespaces or tmpfs mounts are not allowed.
* ``pragma``: the coordinator in a thread, its SQLite file made to fail from inside its own loop thread: the file
  may not grow (``PRAGMA max_page_count``) and every page is full (``SQLITE_FULL``, the error a full disk gives).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import zmq

from profwatch.adapters.zmq.control import call
from profwatch.adapters.zmq.publish import Subscription
from profwatch.config import load_settings
from profwatch.coordinator import Coordinator
from rankhook import wire
from tests.conftest import PYTHON, finish_process, python_env, scrape_metrics, wait_for
from tests.integration.sink_support import Recorder, free_port

N = 300
ALERT = "io.profwatch.job_id_collision.v1"
"""What each hello that names other paths while the job's rank is alive raises: one alert per claimant and
claimed paths (docs/generations.md), so N hellos with N paths are N distinct alerts."""
SCRIPT = r"""
set -e
mount -t tmpfs -o size=4m tmpfs "$STATE_DIR"
"$PYTHON" -m profwatch.cli coordinator --config "$CONFIG" &
pid=$!
trap 'kill -TERM $pid 2>/dev/null; wait $pid; exit 0' TERM
while kill -0 $pid 2>/dev/null; do
  if [ -e "$ROOT/fill" ] && [ ! -e "$ROOT/filled" ]; then
    dd if=/dev/zero of="$STATE_DIR/filler" bs=64k 2>/dev/null || true; touch "$ROOT/filled"
  fi
  if [ -e "$ROOT/free" ] && [ ! -e "$ROOT/freed" ]; then rm -f "$STATE_DIR/filler"; touch "$ROOT/freed"; fi
  sleep 0.05
done
wait $pid
"""


def _tmpfs_possible(where: Path) -> bool:
    where.mkdir(exist_ok=True)
    try:
        res = subprocess.run(["unshare", "-Urm", "sh", "-c", f"mount -t tmpfs -o size=1m tmpfs '{where}'"],
                             capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return res.returncode == 0


def _fill_sqlite(state: Any) -> None:
    """Runs on the coordinator's loop thread: the file may not grow and its pages are full."""
    db = state.db
    db.execute("CREATE TABLE IF NOT EXISTS filler(x BLOB)")
    db.execute(f"PRAGMA max_page_count={db.execute('PRAGMA page_count').fetchone()[0]}")
    for size in (1000, 100, 10, 1):
        try:
            while True:
                db.execute("INSERT INTO filler VALUES(zeroblob(?))", (size,))
        except Exception:  # noqa: BLE001 - SQLITE_FULL: the page is full
            pass


class Harness:
    """One coordinator with its config file (for the CLI), started in the asked ``mode``; ``fill``/``free``."""

    def __init__(self, root: Path, mode: str, webhook_url: str) -> None:
        self.root, self.mode = root, mode
        self.ports = {k: free_port() for k in ("ingest", "control", "pub", "metrics")}
        state_dir = root / "state"
        state_dir.mkdir()
        for d in ("prof", "cfg/jf", "work"):
            (root / d).mkdir(parents=True, exist_ok=True)
        self.coordinator: dict[str, Any] = {
            "ingest_bind": f"tcp://127.0.0.1:{self.ports['ingest']}",
            "control_bind": f"tcp://127.0.0.1:{self.ports['control']}",
            "pub_bind": f"tcp://127.0.0.1:{self.ports['pub']}", "state_db": str(state_dir / "state.db"),
            "work_dir": str(root / "work"), "allowed_prof_roots": [str(root / "prof")],
            "allowed_config_roots": [str(root / "cfg")], "tick_interval_s": 0.1, "registry_flush_s": 3600.0,
            "metrics_port": self.ports["metrics"]}
        self.config = root / "pw.toml"
        lines = ["[coordinator]"] + [f"{k} = {json.dumps(v)}" for k, v in self.coordinator.items()]
        lines += ["[webhook]", f"url = {json.dumps(webhook_url)}", "[logging]", 'format = "console"']
        self.config.write_text("\n".join(lines) + "\n")
        self.proc: subprocess.Popen | None = None
        self.coord: Coordinator | None = None
        self.thread: threading.Thread | None = None
        if mode == "tmpfs":
            self.log = open(root / "coordinator.log", "wb")  # noqa: SIM115 - closed in close()
            env = python_env({"STATE_DIR": str(state_dir), "CONFIG": str(self.config), "ROOT": str(root),
                              "PYTHON": PYTHON})
            self.proc = subprocess.Popen(["unshare", "-Urm", "sh", "-c", SCRIPT], env=env, stdout=self.log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        else:
            settings = load_settings(None, coordinator=self.coordinator, webhook={"url": webhook_url})
            self.coord = Coordinator(settings)
            self.thread = threading.Thread(target=self.coord.run, name="test-coordinator")
            self.thread.start()

    def control(self, cmd: str, args: dict[str, Any] | None = None) -> Any:
        return call(self.coordinator["control_bind"], cmd, args, timeout_s=10.0)

    def metrics_text(self) -> str:
        """The Prometheus exposition: scraped from the process, or rendered from the in-process registry."""
        if self.coord is not None:
            from prometheus_client import generate_latest

            return generate_latest(self.coord.metrics.registry).decode()
        return scrape_metrics(self.ports["metrics"])

    def _on_loop(self, fn: Any) -> None:
        assert self.coord is not None
        done = threading.Event()

        def run() -> None:
            fn()
            done.set()

        self.coord.results.put(run)
        assert done.wait(30), "the coordinator loop did not run the fault"

    def fill(self) -> None:
        if self.mode == "tmpfs":
            (self.root / "fill").touch()
            wait_for(lambda: (self.root / "filled").exists(), 30, what="the tmpfs filled")
        else:
            self._on_loop(lambda: _fill_sqlite(self.coord.state))  # type: ignore[union-attr]

    def free(self) -> None:
        if self.mode == "tmpfs":
            (self.root / "free").touch()
            wait_for(lambda: (self.root / "freed").exists(), 30, what="the tmpfs freed")
        else:
            self._on_loop(lambda: self.coord.state.db.execute("PRAGMA max_page_count=1073741823"))  # type: ignore[union-attr]

    def close(self) -> None:
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)  # our own process group (start_new_session)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
            self.log.close()
        if self.coord is not None and self.thread is not None:
            self.coord.stop()
            self.thread.join(30)


def _hello(i: int | None, root: Path) -> dict[str, Any]:
    prof = str(root / "prof") if i is None else str(root / "prof" / f"moved-{i}")  # i: another path -> an alert
    return wire.to_dict(wire.RankHello(job_id="jf", rank=0, local_rank=0, world_size=1, hostname="h", pid=7,
                                       backend="torch", ts_unix_s=time.time(), prof_root=prof,
                                       profiler_config_path=str(root / "cfg" / "jf")))


class Feed:
    """A raw node connection to ingest (what a node daemon relays)."""

    def __init__(self, ctx: zmq.Context, endpoint: str) -> None:
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 1000)
        self.sock.connect(endpoint)
        self.seq = 0

    def send(self, hellos: list[dict[str, Any]]) -> None:
        for k in range(0, len(hellos), 100):
            self.seq += 1
            self.sock.send(wire.encode(wire.NodeBatch(node_id="nodeF", hostname="h", seq=self.seq,
                                                      ts_unix_s=time.time(), messages=hellos[k:k + 100])))


@pytest.mark.parametrize("mode", ["tmpfs", "pragma"])
def test_alerts_raised_while_the_store_fails_reach_every_path_once(short_tmp: Path, mode: str) -> None:
    if mode == "tmpfs" and not _tmpfs_possible(short_tmp / "probe"):
        pytest.skip("cannot mount a tmpfs in a user namespace here (unshare -Urm); the 'pragma' case covers the "
                    "same paths with a SQLite file made to fail")
    rec = Recorder()
    h = Harness(short_tmp, mode, rec.url)
    ctx = zmq.Context()
    sub: Subscription | None = None
    follow = None
    follow_out = open(short_tmp / "follow.jsonl", "wb")  # noqa: SIM115 - closed below
    published: list[dict[str, Any]] = []

    def drain() -> list[dict[str, Any]]:
        assert sub is not None
        while (ev := sub.recv(0)) is not None:
            published.append(ev)
        return published

    def alerts_of(evs: list[dict[str, Any]], type_: str = ALERT) -> Counter[str]:
        return Counter(e["id"] for e in evs if e.get("type") == type_)

    try:
        wait_for(lambda: _ping(h), 60, 0.2, "the coordinator answers")
        sub = Subscription(ctx, h.coordinator["pub_bind"], ["alert", "event"])
        feed = Feed(ctx, h.coordinator["ingest_bind"])
        feed.send([_hello(None, short_tmp)])  # pins the job's paths
        wait_for(lambda: any(j["job_id"] == "jf" for j in h.control("status")["jobs"]), 30, what="job jf")
        follow = subprocess.Popen([PYTHON, "-m", "profwatch.cli", "alerts", "--follow", "--json", "--config",
                                   str(h.config)], env=python_env(), stdout=follow_out, stderr=subprocess.STDOUT)
        feed.send([_hello(-1, short_tmp)])  # one alert before the fault: the subscribers are connected
        wait_for(lambda: (len(alerts_of(drain())), len(_follow_ids(short_tmp)), len(rec.requests)) == (1, 1, 1),
                 60, 0.1, "the first alert on every path")

        h.fill()
        feed.send([_hello(i, short_tmp) for i in range(N)])
        wait_for(lambda: len(alerts_of(drain())) == N + 1, 120, 0.1, "every alert published while the store fails")
        failed = [e for e in drain() if e["type"] == "io.profwatch.storage_failed.v1"]
        assert len(failed) == 1 and "full" in failed[0]["data"]["error"]
        st = h.control("status")["state_store"]
        assert st["pending"] > 0 and st["failures"].get("event", 0) > 0 and st["failing_since_unix_s"]
        pending_rows = [r for r in h.control("events", {"limit": 10_000}) if r.get("stored") is False]
        assert pending_rows and all(r["seq"] == 0 for r in pending_rows)  # `profwatch alerts` shows them too
        metrics = h.metrics_text()
        assert "profwatch_state_store_pending " in metrics and 'profwatch_state_store_failures_total{op="event"}' \
            in metrics and "profwatch_state_store_pending 0.0" not in metrics

        feed.send([_hello(i, short_tmp) for i in range(N)])  # the same alerts again, while it still fails
        feed.send([_hello(N, short_tmp)])  # then one new one: once it is out, the repeats were handled before it
        wait_for(lambda: len(alerts_of(drain())) == N + 2, 60, 0.1, "the sentinel alert")

        h.free()
        wait_for(lambda: h.control("status")["state_store"]["pending"] == 0, 120, 0.2, "the store took the queue")
        wait_for(lambda: any(e["type"] == "io.profwatch.storage_recovered.v1" for e in drain()), 30, 0.1,
                 "storage_recovered")
        feed.send([_hello(i, short_tmp) for i in range(-1, N + 1)])  # and again, now that the store works
        feed.send([_hello(N + 1, short_tmp)])
        wait_for(lambda: len(alerts_of(drain())) == N + 3, 60, 0.1, "the second sentinel")
        wait_for(lambda: len(_follow_ids(short_tmp)) >= N + 4 and len(rec.requests) >= N + 4, 60, 0.2,
                 "follow and webhook caught up")

        on_pub = alerts_of(drain())
        stored = [r["event"]["id"] for r in h.control("events", {"limit": 10_000})
                  if r["event"]["type"] == ALERT and r.get("stored") is not False]
        hooked = [json.loads(b)["id"] for _h, b, _p in rec.requests]
        followed = _follow_ids(short_tmp)
        assert len(on_pub) == N + 3 and set(on_pub.values()) == {1}  # every alert once on PUB
        assert sorted(stored) == sorted(on_pub) and len(stored) == len(set(stored))  # once in the store
        assert Counter(hooked) == Counter(followed)  # the webhook and --follow saw the same alerts
        assert set(on_pub) <= set(hooked) and max(Counter(hooked).values()) == 1  # each once
        assert failed[0]["id"] in hooked  # storage_failed itself reached the sink
    finally:
        if follow is not None:
            finish_process(follow, 20, terminate=True)
        follow_out.close()
        if sub is not None:
            sub.close()
        ctx.destroy(linger=0)  # closes the feed's socket too
        h.close()
        rec.close()


def _ping(h: Harness) -> bool:
    try:
        return bool(h.control("ping").get("pong"))
    except Exception:  # noqa: BLE001 - not up yet
        return False


def _follow_ids(root: Path) -> list[str]:
    out: list[str] = []
    try:
        lines = (root / "follow.jsonl").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        try:
            ev = json.loads(line)
        except ValueError:
            continue
        if isinstance(ev, dict) and "id" in ev:
            out.append(ev["id"])
    return out
