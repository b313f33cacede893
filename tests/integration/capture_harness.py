"""The capture tests' coordinator harness: a real coordinator in a thread, fed through a real DEALER socket as a
node daemon would (shared by test_coordinator_captures, test_capture_faults and test_capture_edges; the
``harness`` fixture is in tests/integration/conftest.py)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import zmq

from profwatch.adapters.zmq.control import ControlError, ControlUnavailable, call
from profwatch.config import load_settings
from profwatch.coordinator import Coordinator
from rankhook import wire
from tests.integration.live_stack import free_port, loopback_coordinator


class Harness:
    """A coordinator in a thread on free loopback ports, fed by a fake node (one DEALER socket); ``close()`` ends both."""

    def __init__(self, root: Path, capture: dict | None = None, arming: dict | None = None, **coord: object) -> None:
        self.root = root
        self.ports = {k: free_port() for k in ("ingest", "control", "pub")}
        over: dict[str, object] = loopback_coordinator(root, self.ports)
        over.update(coord)
        self.settings = load_settings(None, coordinator=over,
                                      watch={"reconcile_interval_s": 0.5, "parse_allowance_s": 5.0},
                                      analysis={"msprof": {"advisor": False, "advisor_html": False}},
                                      capture=capture or {}, arming=arming or {})
        self.coord = Coordinator(self.settings)
        self.thread = threading.Thread(target=self.coord.run, name="test-coordinator")
        self.thread.start()
        self.ctx = zmq.Context()
        self.dealer = self.ctx.socket(zmq.DEALER)
        self.dealer.setsockopt(zmq.IDENTITY, b"fake-node")
        self.dealer.setsockopt(zmq.LINGER, 0)
        self.dealer.connect(self.settings.coordinator.ingest_bind)
        self.seq = 0

    @property
    def control(self) -> str:
        return self.settings.coordinator.control_bind

    def send(self, *msgs: object) -> None:
        self.seq += 1
        b = wire.NodeBatch(node_id="fake-node", hostname="fake", seq=self.seq, ts_unix_s=time.time(),
                           messages=[wire.to_dict(m) for m in msgs])
        self.dealer.send(wire.encode(b))

    def hellos(self, job: str, world: int, cfg: Path, prof: Path) -> None:
        self.send(*[wire.RankHello(job_id=job, rank=r, local_rank=r, world_size=world, hostname="fake", pid=100 + r,
                                   backend="torch_npu", ts_unix_s=time.time() - 5, profiler_config_path=str(cfg),
                                   prof_root=str(prof)) for r in range(world)])

    def steps(self, job: str, world: int, upto: int) -> None:
        for s in range(1, upto + 1):
            self.send(*[wire.StepReport(job_id=job, rank=r, step=s, step_time_s=0.5, ts_unix_s=time.time())
                        for r in range(world)])

    def events(self, job: str, alerts_only: bool = False) -> list[dict]:
        """Stored events of ``job`` ([] while the coordinator does not answer: wait predicates stay total)."""
        try:
            return [r["event"] for r in call(self.control, "events", {"job_id": job, "alerts_only": alerts_only,
                                                                       "limit": 500}, timeout_s=10)]
        except (ControlUnavailable, ControlError):
            return []

    def furthest(self, job: str) -> int:
        """The job's furthest step in ``status`` (-1 while the job is unknown or the coordinator is busy)."""
        try:
            jobs = call(self.control, "status", {"job_id": job}, timeout_s=10)["jobs"]
        except (ControlUnavailable, ControlError):
            return -1
        return jobs[0]["furthest_step"] if jobs else -1

    def last_capture(self, job: str) -> dict:
        """The job's newest capture as ``captures`` lists it ({} while there is none)."""
        try:
            caps = call(self.control, "captures", {"job_id": job}, timeout_s=10)
        except (ControlUnavailable, ControlError):
            return {}
        return caps[-1] if caps else {}

    def close(self) -> None:
        self.dealer.close(0)
        self.ctx.term()
        self.coord.stop()
        self.thread.join(30)


def of_type(evs: list[dict], type_: str) -> list[dict]:
    return [e for e in evs if e["type"] == type_]
