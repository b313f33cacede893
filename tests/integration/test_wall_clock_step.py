"""Issue 33 #3: a wall-clock step (NTP, a VM resumed) must not end a running job or mark its node DOWN, and a step
back must not delay a real job end by the step. A real ``profwatch coordinator`` runs under libfaketime (Debian
package ``faketime``) with ``DONT_FAKE_MONOTONIC=1``: its wall clock is stepped +1 h then -1 h through
``FAKETIME_TIMESTAMP_FILE`` while a fake node (a real ZeroMQ DEALER) keeps reporting steps; ``CLOCK_BOOTTIME`` runs
on (libfaketime leaves it alone with that setting)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from profwatch.adapters.zmq.control import ControlError, call
from rankhook import wire
from tests.conftest import wait_for
from tests.integration.live_stack import free_port

LIBFAKETIME = next((p for p in ("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
                                "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
                                "/usr/lib/faketime/libfaketime.so.1") if Path(p).exists()), None)
pytestmark = pytest.mark.skipif(LIBFAKETIME is None, reason="libfaketime (Debian package faketime) not installed")
REPO = Path(__file__).resolve().parents[2]
JOB_END_S = 6.0


class Stepped:
    """A coordinator subprocess whose wall clock the test steps, and a fake node feeding it."""

    def __init__(self, root: Path) -> None:
        self.ports = {k: free_port() for k in ("ingest", "control", "pub", "metrics")}
        self.control = f"tcp://127.0.0.1:{self.ports['control']}"
        self.offset = root / "faketime"
        self.offset.write_text("+0\n")
        cfg = root / "c.toml"
        cfg.write_text(f"""
[coordinator]
ingest_bind = "tcp://127.0.0.1:{self.ports['ingest']}"
control_bind = "{self.control}"
pub_bind = "tcp://127.0.0.1:{self.ports['pub']}"
state_db = "{root}/state.db"
work_dir = "{root}/work"
metrics_port = {self.ports['metrics']}
tick_interval_s = 0.1
job_end_after_s = {JOB_END_S}
node_timeout_s = 5.0
""")
        env = dict(os.environ, LD_PRELOAD=str(LIBFAKETIME), FAKETIME_TIMESTAMP_FILE=str(self.offset),
                   FAKETIME_NO_CACHE="1", DONT_FAKE_MONOTONIC="1",
                   PYTHONPATH=os.pathsep.join([str(REPO / "daemon"), str(REPO)]))
        self.log_path = root / "coordinator.log"
        self.log = open(self.log_path, "wb")  # noqa: SIM115
        self.proc = subprocess.Popen([sys.executable, "-m", "profwatch.cli", "coordinator", "--config", str(cfg)],
                                     env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        self.ctx = zmq.Context()
        self.dealer = self.ctx.socket(zmq.DEALER)
        self.dealer.setsockopt(zmq.LINGER, 0)
        self.dealer.connect(f"tcp://127.0.0.1:{self.ports['ingest']}")
        self.seq = 0
        self.step = 0
        wait_for(lambda: self.ask("ping"), 60, 0.2, "coordinator answers")

    def ask(self, cmd: str, args: dict[str, Any] | None = None) -> Any:
        try:
            return call(self.control, cmd, args, timeout_s=5)
        except ControlError:
            return None

    def send(self, *msgs: object) -> None:
        self.seq += 1
        self.dealer.send(wire.encode(wire.NodeBatch(node_id="nodeW", hostname="w", seq=self.seq, ts_unix_s=time.time(),
                                                    messages=[wire.to_dict(m) for m in msgs])))

    def steps(self, n: int = 1) -> None:
        for _ in range(n):
            self.step += 1
            self.send(*[wire.StepReport(job_id="jobW", rank=r, step=self.step, step_time_s=0.1,
                                        ts_unix_s=time.time()) for r in range(2)])

    def ended(self) -> list[dict[str, Any]]:
        rows = self.ask("events", {"job_id": "jobW", "limit": 1000, "alerts_only": False})
        assert rows is not None, "events unanswered"
        return [r["event"] for r in rows if r["event"]["type"] == "io.profwatch.job_ended.v1"]

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, 15)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait(10)
        self.dealer.close(0)
        self.ctx.term()
        self.log.close()


@pytest.fixture
def stepped(short_tmp: Path) -> Iterator[Stepped]:
    s = Stepped(short_tmp)
    yield s
    s.close()


def _keep_reporting(s: Stepped, for_s: float) -> None:
    """Report a step every 0.2 s for ``for_s`` s (the coordinator's job-end and node checks run every second),
    checking after each that no job end was published and the node is not DOWN."""
    until = time.monotonic() + for_s
    while time.monotonic() < until:
        s.steps()
        time.sleep(0.2)
    st = s.ask("status", {"job_id": "jobW"})
    assert st and not [n for n in st["nodes"] if n["down"]], st["nodes"]
    assert s.ended() == [], "a wall-clock step ended a running job"


def test_a_wall_clock_step_either_way_neither_ends_a_running_job_nor_delays_its_end(stepped: Stepped) -> None:
    s = stepped
    s.send(*[wire.RankHello(job_id="jobW", rank=r, local_rank=r, world_size=2, hostname="w", pid=500 + r,
                            backend="none", ts_unix_s=time.time()) for r in range(2)])
    s.steps(5)
    wait_for(lambda: (st := s.ask("status", {"job_id": "jobW"})) and st["jobs"] and st["jobs"][0]["furthest_step"] >= 5,
             30, 0.1, "job registered")
    wall = s.ask("ping")["ts_unix_s"]
    s.offset.write_text("+3600\n")  # NTP steps the clock forward an hour
    wait_for(lambda: s.ask("ping")["ts_unix_s"] > wall + 3000, 20, 0.2, "the coordinator's wall clock stepped")
    _keep_reporting(s, JOB_END_S / 2 + 3)
    s.offset.write_text("-3600\n")  # and back, two hours
    wait_for(lambda: s.ask("ping")["ts_unix_s"] < wall, 20, 0.2, "the coordinator's wall clock stepped back")
    _keep_reporting(s, 3)
    # the job stops: it ends after job_end_after_s of silence, not an hour later
    stopped = time.monotonic()
    try:
        wait_for(lambda: s.ended() or None, JOB_END_S + 30, 0.25, "job_ended after the step back")
    except AssertionError:
        raise AssertionError(s.log_path.read_text()[-3000:]) from None
    assert time.monotonic() - stopped >= JOB_END_S - 1
    (ev,) = s.ended()
    assert JOB_END_S <= ev["data"]["silent_s"] < JOB_END_S + 30
