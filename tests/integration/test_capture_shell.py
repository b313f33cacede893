"""The capture shell with fake collaborators and a fake clock (real registry, real SQLite store, real worker
threads): the faults of issue 10 around arming, writing, cancelling, restarting and mapping results to events."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from profwatch.adapters.fs.config_writer import ConfigIdleNotNeeded
from profwatch.adapters.store.state import StateStore
from profwatch.adapters.zmq.control import ControlError
from profwatch.arming.port import ArmResult, arm_reply
from profwatch.captures.shell import CaptureShell
from profwatch.config import load_settings
from profwatch.core.batches.completeness import BatchState, RankDirState
from profwatch.core.capture import lifecycle as lc
from profwatch.core.capture.lifecycle import CaptureState
from profwatch.core.capture.planner import CaptureRequest
from profwatch.core.capture.profiler_config import idle_config
from profwatch.core.detection.job_detector import Anomaly
from profwatch.core.fleet.registry import Registry
from rankhook import wire
from tests.conftest import wait_for

T0 = 1_800_000_000.0


class World:
    """A registry with one job, fake collaborators, a fake clock and a shell over a real store."""

    def __init__(self, tmp: Path, *, writer: str = "coordinator", arming: dict | None = None,
                 store: StateStore | None = None, nodes: tuple[str, ...] = ("n1",), world: int = 2,
                 file_writes: list[tuple[str, dict]] | None = None, now: float = T0,
                 reference: dict | None = None) -> None:
        self.now = now
        self.tmp = tmp
        self.settings = load_settings(
            None, coordinator={"config_writer": writer, "allowed_config_roots": [str(tmp)], "ack_timeout_s": 60,
                               "node_timeout_s": 10, "work_dir": str(tmp / "work")},
            capture={"write_timeout_s": 30}, watch={"parse_allowance_s": 100, "reconcile_interval_s": 5},
            arming=arming or {}, reference=reference or {})
        self.store = store or StateStore(tmp / "state.db")
        self.registry = Registry()
        self.events: list[tuple[str, str, dict, str | None]] = []
        self.sent: list[tuple[str, wire.NodeCommand]] = []
        self.writes: list[tuple[str, dict]] = list(file_writes or [])  # arm writes (the last one is in the file)
        self.idle_writes: list[tuple[str, dict]] = []
        self.idle_error = ""  # the idle write raises this when set
        self.results: queue.Queue[Callable[[], None]] = queue.Queue()
        self.verdict: tuple[str, dict] = ("ok", {"status": "ok", "detail": "1 suspect"})
        self.batches: list[BatchState] = []
        self.stopped: list[str] = []
        self.excluded: list[tuple[str, int, int, str]] = []
        self.parse_marks: list[tuple[str, ...]] = []  # ("open", job, first, reason) / ("close", job, reason)
        self.release = threading.Event()  # the fake analysis returns once this is set
        self.release.set()
        self.enrich_release = threading.Event()  # the fake enrichment returns once this is set
        self.enrich_release.set()
        self.enrich_error = ""
        self.returned: dict[str, Any] | None = None  # the detector's evidence that an excursion came back
        self.enrich_recipes: dict = {"advisor": {"status": "ok", "phase": "enrich", "duration_s": 1.0}}
        for r in range(world):
            node = nodes[r % len(nodes)]
            self.registry.heartbeat(wire.NodeHeartbeat(node_id=node, hostname=node, pid=1, ts_unix_s=T0,
                                                       started_unix_s=T0), T0)
            self.registry.hello(wire.RankHello(job_id="j1", rank=r, local_rank=r, world_size=world, hostname=node,
                                               pid=100 + r, backend="torch_npu", ts_unix_s=T0 - 50,
                                               profiler_config_path=str(tmp / "cfg"), prof_root=str(tmp / "prof")),
                                node, T0)
            for s in range(1, 21):
                self.registry.step(wire.StepReport(job_id="j1", rank=r, step=s, step_time_s=0.5, ts_unix_s=T0), T0)
        outer = self

        class Writer:
            def write(self, config_dir: str, content: dict, *, not_before_unix_s: float, allowed_roots: Any,
                      idle_for: str | None = None) -> Any:
                if idle_for is not None:  # as the real writer: only over that capture's arm
                    if outer.idle_error:
                        raise PermissionError(outer.idle_error)
                    held = outer.writes[-1][1]["metadata"].get("profwatch_capture_id") if outer.writes else None
                    if held != idle_for:
                        raise ConfigIdleNotNeeded(f"holds capture {held} now, not {idle_for}'s")
                    outer.idle_writes.append((config_dir, content))
                else:
                    outer.writes.append((config_dir, content))
                return SimpleNamespace(path=f"{config_dir}/profiler_config.json", mtime_s=int(outer.now))

        class Scanner:
            def scan(self, prof_dir: str, **kw: Any) -> list[BatchState]:
                return list(outer.batches)

            def reconciling(self, prof_dir: str) -> bool:
                return False

            def retain(self, analysed: Any, now_unix_s: float) -> list[Any]:
                return []

        class Analyser:
            def analyse(self, batch: BatchState, **kw: Any) -> tuple[str, dict]:
                outer.release.wait(30)
                return outer.verdict[0], {**outer.verdict[1], **kw["context"]}

            def enrich(self, capture_id: str) -> tuple[str, dict]:
                outer.enrich_release.wait(30)
                if outer.enrich_error:
                    raise RuntimeError(outer.enrich_error)
                return outer.verdict[0], {**outer.verdict[1], "pending_recipes": [], "follow_up": True,
                                          "recipes": outer.enrich_recipes}

            def prefetch(self, capture_id: str, batch: BatchState) -> None:
                pass

            def running(self, capture_id: str | None = None) -> list[str]:
                return ["slow_rank"]

            def cancel(self, capture_id: str) -> None:
                outer.stopped.append(capture_id)

            def cancel_all(self) -> None:
                return None

            def close(self) -> None:
                return None

        class Detectors:
            def exclude_steps(self, job_id: str, first: int, last: int, reason: str) -> None:
                outer.excluded.append((job_id, first, last, reason))

            def exclude_until_closed(self, job_id: str, first: int, reason: str) -> None:
                outer.parse_marks.append(("open", job_id, str(first), reason))

            def close_exclusion(self, job_id: str, reason: str) -> None:
                outer.parse_marks.append(("close", job_id, reason))

            def stalled_ranks(self, job_id: str) -> frozenset[int]:
                return frozenset()

            def baseline_step_time_s(self, job_id: str) -> float | None:
                return None

            def ongoing(self, job_id: str) -> dict[str, frozenset[int]]:
                return {}

            def unit_steps(self, job_id: str) -> dict[int, int] | None:
                return None

            def excursion_returned(self, job_id: str, first_step: int) -> dict[str, Any] | None:
                return outer.returned if outer.returned and outer.returned["first_step"] == first_step else None

        self.shell = CaptureShell(
            settings=self.settings, store=self.store, jobs=self.registry.jobs, nodes=self.registry.nodes,
            writer=Writer(), send_node_command=lambda n, c: self.sent.append((n, c)), scanner=Scanner(),
            analyser=Analyser(), detectors=Detectors(), emit=self.emit, post=self.results.put, clock=lambda: self.now)
        self.shell.start()

    def emit(self, type_: str, job_id: str | None, data: dict, event_id: str | None = None) -> None:
        self.events.append((type_, job_id or "", data, event_id))

    def drain(self, until: Callable[[], bool] | None = None, timeout_s: float = 20.0) -> None:
        """Run what the worker threads handed back, until ``until()`` holds (or once when None)."""
        def step() -> bool:
            while True:
                try:
                    self.results.get_nowait()()
                except queue.Empty:
                    break
            return until() if until is not None else True

        wait_for(step, timeout_s, what="worker results")

    def of(self, type_: str) -> list[dict]:
        return [d for t, _j, d, _i in self.events if t == type_]

    def state(self, cid: str) -> CaptureState | None:
        cap = self.store.get_capture(cid)
        return cap.state if cap is not None else None

    def arm(self, **kw: Any) -> dict:
        """The ``arm`` control command's reply (``arm_reply`` of the shell's typed result)."""
        return arm_reply(self.shell.arm("j1", CaptureRequest(job_id="j1", reason="test", **kw), self.now))

    def close(self) -> None:
        self.shell.close()
        self.store.close()


@pytest.fixture
def world(tmp_path: Path):
    made: list[World] = []

    def make(**kw: Any) -> World:
        w = World(tmp_path, **kw)
        made.append(w)
        return w

    yield make
    for w in made:
        w.close()


def _complete_batch(cid: str, world: int = 2) -> BatchState:
    ranks = {r: RankDirState(path=f"/prof/{r}", kind="ascend_pt", rank=r, state="parsed") for r in range(world)}
    return BatchState(batch_id=f"b-{cid}", status="complete", kind="ascend_pt", expected_ranks=list(range(world)),
                      ranks=ranks, missing_ranks=[], problems=[], steps=[1, 2], capture_id=cid)


def _arm_and_land(w: World, until: CaptureState) -> str:
    """Arm, let the config be written, land a complete batch and tick past the window: returns the capture id
    once the capture reached ``until``."""
    cid = w.arm()["capture_id"]
    w.drain(lambda: w.state(cid) is CaptureState.WRITTEN)
    w.batches = [_complete_batch(cid)]
    w.now += 6
    w.shell.tick(w.now)
    w.drain(lambda: w.state(cid) is until)
    return str(cid)


def test_a_returned_failed_analysis_is_published_as_analysis_failed_not_suspect_ranks(world) -> None:
    w = world()
    w.verdict = ("failed", {"status": "failed", "detail": "no usable result; failed recipes: slow_rank"})
    cid = _arm_and_land(w, CaptureState.FAILED)
    assert not w.of("io.profwatch.suspect_ranks.v1")
    (failed,) = w.of("io.profwatch.analysis_failed.v1")
    assert failed["capture_id"] == cid and failed["detail"].startswith("no usable result")
    assert w.store.get_capture(cid).analysis_status == "failed"


@pytest.mark.parametrize(("status", "detail"), [
    ("not_applicable", "this capture cannot answer: one rank with a time breakdown (4 of 4 armed steps captured): "
                       "no peer to compare it with"),
    ("weak", "rank 1; evidence is weak: 2 of 4 armed steps captured"),
])
def test_a_one_rank_or_weak_verdict_is_published_as_the_report_says(world, status: str, detail: str) -> None:
    """A one-rank job's capture (report.json: not_applicable) and a weak verdict were published as analysis_failed
    and stored as failed: they are verdicts, published as suspect_ranks with their status and detail."""
    w = world()
    w.verdict = (status, {"status": status, "detail": detail,
                          "suspects": [{"rank": 1}] if status == "weak" else []})
    cid = _arm_and_land(w, CaptureState.ANALYSED)
    assert not w.of("io.profwatch.analysis_failed.v1")
    (verdict,) = w.of("io.profwatch.suspect_ranks.v1")
    assert verdict["capture_id"] == cid and verdict["status"] == status and verdict["detail"] == detail
    assert w.store.get_capture(cid).analysis_status == status


def test_node_writer_with_a_lost_command_fails_at_the_write_deadline_and_frees_the_job(world) -> None:
    w = world(writer="node")
    res = w.arm()
    cid = res["capture_id"]
    assert res["state"] == "planned" and res["nodes"] == ["n1"] and res["deadline_in_s"] == 30
    assert [(n, c.cmd) for n, c in w.sent] == [("n1", "write_config")]  # sent; never acknowledged
    with pytest.raises(ControlError) as ei:
        w.arm()
    assert ei.value.code == "conflict" and cid in ei.value.message and "its config write deadline is in 30s" in ei.value.message
    w.now += 29
    w.shell.tick(w.now)
    assert w.state(cid) is CaptureState.PLANNED
    w.now += 1
    w.shell.tick(w.now)
    assert w.state(cid) is CaptureState.FAILED
    (arm,) = w.of("io.profwatch.arm.v1")
    assert arm["status"] == "failed" and "node(s) ['n1'] did not confirm" in arm["error"]
    for n in ("n1",):  # the node is still heartbeating: the next arm is accepted
        w.registry.heartbeat(wire.NodeHeartbeat(node_id=n, hostname=n, pid=1, ts_unix_s=w.now,
                                                started_unix_s=T0), w.now)
    assert w.arm()["capture_id"] != cid


def test_node_writer_refuses_an_arm_while_the_node_is_down(world) -> None:
    w = world(writer="node")
    w.now += 60  # no heartbeat for 60 s > node_timeout_s 10
    with pytest.raises(ControlError) as ei:
        w.arm()
    assert ei.value.code == "refused" and "node n1 is down (last heard 60 s ago)" in ei.value.message


def test_cancel_frees_the_job_and_keeps_the_record(world) -> None:
    w = world()
    cid = w.arm()["capture_id"]
    w.drain(lambda: w.state(cid) is CaptureState.WRITTEN)
    with pytest.raises(ControlError) as ei:
        w.shell.cancel("j1", "c-nope", w.now)
    assert ei.value.code == "not_found"
    (view,) = w.shell.cancel("j1", None, w.now)
    assert view["state"] == "cancelled" and "while written" in view["outcome"] and view["idle_config"] is True
    assert w.state(cid) is CaptureState.CANCELLED
    with pytest.raises(ControlError) as ei:
        w.shell.cancel("j1", None, w.now)
    assert ei.value.code == "not_found"
    with pytest.raises(ControlError) as ei:
        w.shell.cancel("j1", cid, w.now)
    assert ei.value.code == "conflict"
    # the idle config (start_step 0) went over the arm, after it, by the same writer; its result is an event
    w.drain(lambda: bool(_capture_events(w, "idle_config_written")))
    ((cfg_dir, idle),) = w.idle_writes
    note = f"capture {cid} cancelled by profwatch cancel while written"
    assert cfg_dir == w.writes[0][0] and idle == idle_config(note)
    assert idle["start_step"] == 0 and idle["metadata"] == {"profwatch_idle": note}
    (ev,) = _capture_events(w, "idle_config_written")
    assert ev["capture_id"] == cid and ev["writer"] == "coordinator" and "profiler_config.json" in ev["detail"]
    assert w.arm()["capture_id"] != cid


def _capture_events(w: World, event: str) -> list[dict]:
    return [d for d in w.of("io.profwatch.capture.v1") if d.get("event") == event]


def test_a_failed_idle_write_is_reported_and_the_cancel_stands(world) -> None:
    w = world()
    w.idle_error = "read-only file system"
    cid = w.arm()["capture_id"]
    w.drain(lambda: w.state(cid) is CaptureState.WRITTEN)
    w.shell.cancel("j1", cid, w.now)
    w.drain(lambda: bool(_capture_events(w, "idle_config_failed")))
    (ev,) = _capture_events(w, "idle_config_failed")
    assert ev["writer"] == "coordinator" and "read-only file system" in ev["detail"]
    assert w.state(cid) is CaptureState.CANCELLED and w.arm()["capture_id"] != cid


def _written_by_nodes_then_cancelled(w: World) -> str:
    """Arm a node-writer world, let every node confirm the write, cancel: returns the capture id."""
    cid = w.arm()["capture_id"]
    for node, cmd in list(w.sent):
        w.shell.on_node_ack(wire.NodeAck(node_id=node, command_id=cmd.command_id, ok=True,
                                         result={"path": "/cfg/profiler_config.json", "mtime_s": 5}), w.now)
    assert w.state(cid) is CaptureState.WRITTEN
    w.shell.cancel("j1", cid, w.now)
    return str(cid)


def _idle_sent(w: World, node: str | None = None) -> list[tuple[str, wire.NodeCommand]]:
    """The idle write commands sent so far (to ``node`` only when given), in order."""
    return [(n, c) for n, c in w.sent if "idle_for" in c.args and node in (None, n)]


def test_node_writer_cancel_sends_the_idle_config_to_each_node_and_reports_each_answer(world) -> None:
    w = world(writer="node", nodes=("n1", "n2"))
    cid = _written_by_nodes_then_cancelled(w)
    idle = _idle_sent(w)
    assert sorted(n for n, _c in idle) == ["n1", "n2"]
    assert all(c.cmd == "write_config" and c.args["config"]["start_step"] == 0 and c.args["idle_for"] == cid
               for _n, c in idle)
    by_node = {n: c for n, c in idle}
    # an answer naming another node's command is ignored; each node's own answer is one event
    w.shell.on_node_ack(wire.NodeAck(node_id="n2", command_id=by_node["n1"].command_id, ok=True), w.now)
    assert not _capture_events(w, "idle_config_written")
    w.shell.on_node_ack(wire.NodeAck(node_id="n1", command_id=by_node["n1"].command_id, ok=True,
                                     result={"path": "/cfg/profiler_config.json", "mtime_s": 6}), w.now)
    w.shell.on_node_ack(wire.NodeAck(node_id="n2", command_id=by_node["n2"].command_id, ok=False,
                                     detail="config dir is a symlink"), w.now)
    w.shell.on_node_ack(wire.NodeAck(node_id="n1", command_id=by_node["n1"].command_id, ok=True), w.now)  # again
    (ok,) = _capture_events(w, "idle_config_written")
    (bad,) = _capture_events(w, "idle_config_failed")
    assert ok["writer"] == "n1" and "(mtime 6)" in ok["detail"]
    assert bad["writer"] == "n2" and bad["detail"] == "config dir is a symlink"
    assert w.state(cid) is CaptureState.CANCELLED
    n_sent = len(w.sent)
    w.now += 600
    w.shell.tick(w.now)  # both answered: nothing is sent again
    assert len(w.sent) == n_sent


def test_a_node_that_does_not_answer_is_asked_again_until_the_window_ends_then_reported(world) -> None:
    w = world(writer="node", nodes=("n1", "n2"))
    cid = _written_by_nodes_then_cancelled(w)
    judge = w.store.get_capture(cid).judge_unix_s
    assert len(_idle_sent(w, "n1")) == len(_idle_sent(w, "n2")) == 1
    ((_n, n1_cmd),) = _idle_sent(w, "n1")
    w.shell.on_node_ack(wire.NodeAck(node_id="n1", command_id=n1_cmd.command_id, ok=True,
                                     result={"skipped": "holds capture c-9 now"}), w.now)
    (skipped,) = _capture_events(w, "idle_config_skipped")
    assert skipped["writer"] == "n1" and skipped["detail"] == "holds capture c-9 now"
    while w.now + 10 < judge:  # n2's command is lost (or n2 reconnects): asked again every 10 s, same command id
        w.now += 10
        w.shell.tick(w.now)
    assert len(_idle_sent(w, "n1")) == 1 and len(_idle_sent(w, "n2")) >= 2
    assert len({c.command_id for _n, c in _idle_sent(w, "n2")}) == 1
    assert not _capture_events(w, "idle_config_failed")
    w.now = judge
    w.shell.tick(w.now)
    (failed,) = _capture_events(w, "idle_config_failed")
    assert failed["writer"] == "n2" and "did not answer before the window's end" in failed["detail"]
    sent = len(w.sent)
    w.now += 100
    w.shell.tick(w.now)
    assert len(w.sent) == sent and len(_capture_events(w, "idle_config_failed")) == 1


def test_a_failed_node_write_takes_the_arm_back_from_the_nodes_that_wrote_it(world) -> None:
    w = world(writer="node", nodes=("n1", "n2"))
    cid = w.arm()["capture_id"]
    cmds = {n: c for n, c in w.sent}
    w.shell.on_node_ack(wire.NodeAck(node_id="n1", command_id=cmds["n1"].command_id, ok=True), w.now)
    w.shell.on_node_ack(wire.NodeAck(node_id="n2", command_id=cmds["n2"].command_id, ok=False,
                                     detail="read-only file system"), w.now)
    assert w.state(cid) is CaptureState.FAILED
    # n1 holds a live arm nobody watches: the idle config goes there; n2 said no, but a write can fail after its
    # content landed (an mtime it may not set), so n2 is asked too (it skips when the file does not hold the arm)
    assert sorted(n for n, _c in _idle_sent(w)) == ["n1", "n2"]


def test_a_busy_node_is_asked_again_and_a_silent_one_is_not_sent_to_until_heard(world) -> None:
    w = world(writer="node", nodes=("n1", "n2"))
    _written_by_nodes_then_cancelled(w)
    cmds = dict(_idle_sent(w))
    w.shell.on_node_ack(wire.NodeAck(node_id="n1", command_id=cmds["n1"].command_id, ok=False,
                                     detail=wire.NODE_BUSY), w.now)
    assert not _capture_events(w, "idle_config_failed")  # a full queue is no answer: asked again
    w.now += 11  # n2 falls silent (no heartbeat for 11 s > node_timeout_s 10); n1 keeps beating
    w.registry.heartbeat(wire.NodeHeartbeat(node_id="n1", hostname="n1", pid=1, ts_unix_s=w.now,
                                            started_unix_s=T0), w.now)
    before = len(w.sent)
    w.shell.tick(w.now)
    assert [n for n, c in w.sent[before:]] == ["n1"]  # n2 is not sent to while silent (no route, no warnings)
    w.registry.heartbeat(wire.NodeHeartbeat(node_id="n2", hostname="n2", pid=1, ts_unix_s=w.now + 10,
                                            started_unix_s=T0), w.now + 10)
    w.now += 10
    before = len(w.sent)
    w.shell.tick(w.now)
    assert sorted(n for n, c in w.sent[before:]) == ["n1", "n2"]  # back: asked again


def test_a_restart_writes_the_idle_config_again_while_the_window_is_ahead(world, tmp_path: Path) -> None:
    w = world()
    cid = w.arm()["capture_id"]
    w.drain(lambda: w.state(cid) is CaptureState.WRITTEN)
    # the coordinator stopped after the cancel was stored, before its idle write ran (it waited on the fs worker)
    w.store.save_capture(lc.cancel(w.store.get_capture(cid), w.now, w.shell.ls, by="test").capture)
    assert not w.idle_writes
    w2 = world(store=StateStore(tmp_path / "state.db"), file_writes=w.writes)  # the file still holds the arm
    w2.drain(lambda: bool(_capture_events(w2, "idle_config_written")))
    assert w2.idle_writes[0][1]["metadata"]["profwatch_idle"].startswith(f"capture {cid} cancelled")
    # past the window's judgement time there is nothing left to take back: no write
    late = world(store=StateStore(tmp_path / "state.db"), file_writes=w.writes,
                 now=w.store.get_capture(cid).judge_unix_s)
    late.shell.fs_pool.submit(lambda: None).result(10)  # the fs worker ran whatever start() queued
    late.drain()
    assert not late.idle_writes and not _capture_events(late, "idle_config_written")


def test_a_restart_finds_an_old_capture_whose_long_window_is_still_ahead(world, tmp_path: Path) -> None:
    w = world()
    cid = w.arm(in_steps=7000)["capture_id"]  # ~1 h ahead at 0.5 s a step (the furthest an arm may go); judged later
    w.drain(lambda: w.state(cid) is CaptureState.WRITTEN)
    w.store.save_capture(lc.cancel(w.store.get_capture(cid), w.now, w.shell.ls, by="test").capture)
    assert w.store.get_capture(cid).judge_unix_s > T0 + 7200
    w2 = world(store=StateStore(tmp_path / "state.db"), file_writes=w.writes, now=T0 + 3700)  # over an hour later
    w2.drain(lambda: bool(_capture_events(w2, "idle_config_written")))
    assert len(w2.idle_writes) == 1



def test_a_capture_resumed_from_analysing_then_cancelled_owes_the_idle_config_now_and_after_a_restart(
        world, tmp_path: Path) -> None:
    w = world()
    w.release.clear()  # the analysis runs until the coordinator stops
    try:
        cid = _arm_and_land(w, CaptureState.ANALYSING)
        # restarted: the interrupted analysis is redone (analysing -> collecting, its batch id kept)
        w2 = world(store=StateStore(tmp_path / "state.db"), file_writes=w.writes, now=w.now + 1)
        assert w2.state(cid) is CaptureState.COLLECTING and w2.store.get_capture(cid).batch_id
        (view,) = w2.shell.cancel("j1", cid, w2.now)
        assert view["idle_config"] is True  # the window may still be pending on the ranks
        w2.drain(lambda: bool(_capture_events(w2, "idle_config_written")))
        stored = w2.store.get_capture(cid)
        assert stored.state is CaptureState.CANCELLED and stored.idle_owed and stored.judge_unix_s > w2.now
        # a restart after the cancel writes it again, as for any cancel that asked for it
        w3 = world(store=StateStore(tmp_path / "state.db"), file_writes=w.writes, now=w2.now + 1)
        w3.drain(lambda: bool(_capture_events(w3, "idle_config_written")))
        assert w3.idle_writes[0][1]["metadata"]["profwatch_idle"].startswith(f"capture {cid} cancelled")
    finally:
        w.release.set()


def test_an_arm_before_any_step_time_is_measured_is_refused_not_planned_on_a_guess(world) -> None:
    w = world()
    for r in range(2):  # a second job: every rank said hello, none has reported a step yet
        w.registry.hello(wire.RankHello(job_id="j2", rank=r, local_rank=r, world_size=2, hostname="n1", pid=200 + r,
                                        backend="torch_npu", ts_unix_s=w.now, profiler_config_path=str(w.tmp / "cfg2"),
                                        prof_root=str(w.tmp / "prof")), "n1", w.now)
    for dry_run in (True, False):
        with pytest.raises(ControlError) as ei:
            w.shell.arm("j2", CaptureRequest(job_id="j2", reason="test"), w.now, dry_run=dry_run)  # raised, not typed
        assert ei.value.code == "bad_request" and "step time not measured" in ei.value.message
    assert not w.store.captures("j2") and not w.writes
    w.registry.step(wire.StepReport(job_id="j2", rank=0, step=1, step_time_s=0.5, ts_unix_s=w.now), w.now)
    assert w.shell.arm("j2", CaptureRequest(job_id="j2", reason="test"), w.now).step_time_s == 0.5


def test_an_arm_of_an_unknown_job_lists_the_jobs_it_knows(world) -> None:
    """A new user's trial: ``arm --job nosuch`` said only "unknown job 'nosuch' (no rank has said hello)"."""
    from profwatch.captures.shell import unknown_job_text

    w = world()
    with pytest.raises(ControlError) as ei:
        w.shell.arm("nosuch", CaptureRequest(job_id="nosuch", reason="test"), w.now)
    assert ei.value.code == "not_found" and ei.value.message == (
        "unknown job 'nosuch' (no rank of it has said hello); jobs it knows: j1")
    many = {f"job{i:02d}": None for i in range(13)}
    assert unknown_job_text("x", many).endswith("jobs it knows: " + ", ".join(f"job{i:02d}" for i in range(10))
                                                + " and 3 more")
    assert unknown_job_text("x", {}).endswith("it knows no job yet: start the job with the rank hook")


def test_dry_run_agrees_with_the_refusal_and_names_the_blocker(world) -> None:
    w = world()
    first = w.arm()
    dry = arm_reply(w.shell.arm("j1", CaptureRequest(job_id="j1", reason="x"), w.now, dry_run=True))
    assert dry["refused"]["blocking_capture"] == first["capture_id"] and dry["refused"]["code"] == "conflict"
    with pytest.raises(ControlError) as ei:
        w.arm()
    assert ei.value.message == dry["refused"]["message"]
    # the typed result the desks read: a refused real arm opens nothing and says why, without raising
    before = len(w.store.captures("j1"))
    res = w.shell.arm("j1", CaptureRequest(job_id="j1", reason="x"), w.now)
    assert isinstance(res, ArmResult) and res.capture is None and not res.dry_run
    assert res.refused is not None and res.refused.code == "conflict" and res.refused.message == dry["refused"]["message"]
    assert res.refused.blocking_capture == first["capture_id"] and len(w.store.captures("j1")) == before


def test_observe_mode_counts_would_arms_so_the_cooldown_applies_as_in_act_mode(world) -> None:
    w = world(arming={"mode": "observe", "cooldown_s": 900})
    # a slow rank (a job-wide change point on top of a captured level is a new episode: docs/detection.md)
    an = Anomaly(kind="rank_outlier", job_id="j1", step=20, ranks=(1,), magnitude=0.4, detail={"stage": "forward"})
    w.shell.on_anomaly(an, w.now)
    w.now += 10
    w.shell.on_anomaly(an, w.now)
    w.now += 10
    grown = Anomaly(kind="rank_outlier", job_id="j1", step=40, ranks=(1,), magnitude=0.6, detail={"stage": "forward"})
    w.shell.on_anomaly(grown, w.now)
    w.now += 900
    w.shell.on_anomaly(grown, w.now)
    decisions = [(d["action"], d["reason"]) for d in w.of("io.profwatch.arm_decision.v1")]
    assert decisions == [("would_arm", "observe_mode"), ("suppress", "captured_unchanged"), ("suppress", "cooldown"),
                         ("would_arm", "observe_mode")]
    assert w.store.captures("j1") == []


def test_a_restarted_shell_resumes_its_capture_and_its_arm_history(world, tmp_path: Path) -> None:
    w = world(arming={"cooldown_s": 900})
    cid = w.arm()["capture_id"]
    w.drain(lambda: w.state(cid) is CaptureState.WRITTEN)
    w.shell.close()
    w2 = world(store=StateStore(tmp_path / "state.db"), arming={"cooldown_s": 900})
    w2.now = w.now + 5
    assert w2.shell.summary("j1", w2.now)[0]["state"] == "written"
    w2.shell.on_anomaly(Anomaly(kind="step_regression", job_id="j1", step=20, ranks=(), magnitude=0.4), w2.now)
    assert w2.of("io.profwatch.arm_decision.v1")[0]["reason"] == "capture_in_flight"
    w2.drain(lambda: w2.shell.scans_in_flight == 0)  # the scan a resumed capture starts with (nothing there yet)
    w2.batches = [_complete_batch(cid)]
    w2.now += 6
    w2.shell.tick(w2.now)
    w2.drain(lambda: w2.state(cid) is CaptureState.ANALYSED)
    (alert,) = w2.of("io.profwatch.suspect_ranks.v1")
    assert alert["capture_id"] == cid and alert["armed_steps"]
    w2.shell.on_anomaly(Anomaly(kind="step_regression", job_id="j1", step=30, ranks=(), magnitude=0.4), w2.now)
    last = w2.of("io.profwatch.arm_decision.v1")[-1]  # the arm history survived the restart: the job's gap holds
    assert (last["reason"], last["until_unix_s"]) == ("min_arm_gap", w.now + 60.0)
    # the episode the report opened waits in the queue, is stored, and survives another restart
    w2.shell.close()
    w3 = world(store=StateStore(tmp_path / "state.db"))
    (ep,) = [e for e in w3.shell.episodes.view("j1", w2.now) if e["closed_unix_s"] is None]
    assert (ep["episode_id"], ep["kind"], ep["captures"]) == (last["episode_id"], "step_regression", [])
    w3.now = w.now + 61
    w3.shell.tick(w3.now)
    (armed,) = [d for d in w3.of("io.profwatch.arm_decision.v1") if d["action"] == "arm"]
    assert armed["episode_id"] == ep["episode_id"] and armed["capture_id"]  # captured once the gap passed


def test_unacknowledged_ranks_are_explained_by_the_nodes_stale_torch_npu_state(world) -> None:
    w = world(nodes=("n1", "n2"))
    stale = "shm /dev/shm/DynamicProfileNpuShm2026113009 (age 3700s); orphan DynMonitorProc pid 4242"
    w.registry.heartbeat(wire.NodeHeartbeat(node_id="n2", hostname="n2", pid=1, ts_unix_s=T0, started_unix_s=T0,
                                            stale_state=stale), T0)
    cid = w.arm()["capture_id"]
    w.drain(lambda: w.state(cid) is CaptureState.WRITTEN)
    cap = w.store.get_capture(cid)
    for r in (0, 1):  # both hooks read the file; only rank 0's torch_npu logged it
        w.shell.on_capture_event(wire.CaptureEvent(job_id="j1", rank=r, event="arm_seen", ts_unix_s=w.now,
                                                   capture_id=cid, source="hook"), "n1", w.now)
    w.shell.on_capture_event(wire.CaptureEvent(job_id="j1", rank=0, event="arm_seen", ts_unix_s=w.now,
                                               start_step=cap.start_step, source="dp_log"), "n1", w.now)
    view = w.shell.capture_view(cid, w.now)
    assert view["acknowledged_ranks"] == 1 and "never acknowledged" in view["unacknowledged"][0]
    w.now += 61
    w.shell.tick(w.now)
    (ack,) = [d for d in w.of("io.profwatch.capture.v1") if d.get("event") == "ack_missing"]
    assert ack["ranks"] == [1]
    assert "torch_npu never acknowledged" in ack["causes"][0] and "orphan DynMonitorProc pid 4242" in ack["causes"][0]


def test_cancelling_an_analysing_capture_stops_its_runs_and_drops_its_late_result(world) -> None:
    w = world()
    w.release.clear()  # the analysis will run until released
    cid = _arm_and_land(w, CaptureState.ANALYSING)
    (view,) = w.shell.cancel("j1", cid, w.now)
    assert view["state"] == "cancelled" and w.stopped == [cid] and view["idle_config"] is False
    assert not w.idle_writes  # the window is long over: nothing to take back
    w.release.set()
    w.shell.steps.analysis_pool.shutdown(wait=True)  # the analysis returned ...
    w.drain()  # ... and its result, handed back, is dropped
    assert w.state(cid) is CaptureState.CANCELLED and not w.of("io.profwatch.suspect_ranks.v1")


# -- alert first, enrich after (issue 13) ----------------------------------------------------------------------------
def _analysed_then_enriching(w: World) -> str:
    """Arm, complete the batch; the verdict names a follow-up (``pending_recipes``): returns the capture id once
    the verdict is published and the follow-up runs (held by ``w.enrich_release``)."""
    w.verdict = ("ok", {"status": "ok", "detail": "1 suspect", "suspects": [{"rank": 1}],
                        "pending_recipes": ["advisor", "report_html"]})
    w.enrich_release.clear()
    return _arm_and_land(w, CaptureState.ENRICHING)


def test_the_enriched_update_follows_the_alert_with_the_same_ids(world) -> None:
    w = world()
    cid = _analysed_then_enriching(w)
    # the verdict is out while the advisor still runs; nothing enriched yet; status names what runs for it
    (alert,) = w.of("io.profwatch.suspect_ranks.v1")
    assert alert["pending_recipes"] == ["advisor", "report_html"] and not w.of("io.profwatch.analysis_enriched.v1")
    (view,) = [v for v in w.shell.summary("j1", w.now) if v["capture_id"] == cid]
    assert view["state"] == "enriching" and view["running"] == ["slow_rank"]
    w.enrich_release.set()
    w.drain(lambda: w.state(cid) is CaptureState.ENRICHED)
    types = [t for t, *_ in w.events]
    assert types.index("io.profwatch.suspect_ranks.v1") < types.index("io.profwatch.analysis_enriched.v1")
    (enriched,) = w.of("io.profwatch.analysis_enriched.v1")
    assert (enriched["capture_id"], enriched["batch_id"], enriched["job_id"]) == (cid, f"b-{cid}", "j1")
    assert enriched["recipes"]["advisor"]["duration_s"] == 1.0
    steps = [d["event"] for t, _j, d, _i in w.events if t == "io.profwatch.capture.v1"]
    assert steps[-3:] == ["analysed", "enriching", "enriched"]
    # the job may arm again while a capture is only enriching (it holds no torch_npu config slot)
    w.now += 10_000
    assert w.arm()["capture_id"] != cid


def test_cancel_without_a_capture_id_cancels_the_pending_arm_and_lets_an_enriching_capture_finish(world) -> None:
    """Tried by hand: a detection capture was enriching (advisor running), ``profwatch arm`` armed a second one
    (allowed: enriching holds no config slot), then ``profwatch cancel --job J`` answered "[conflict] capture C is
    enriching: nothing to cancel" and left the new arm pending. Now the in-flight one is cancelled, the enriching
    one goes on; with only an enriching capture the answer says so."""
    w = world()
    first = _analysed_then_enriching(w)
    w.now += 10_000
    second = w.arm()["capture_id"]
    w.drain(lambda: w.state(second) is CaptureState.WRITTEN)
    (view,) = w.shell.cancel("j1", None, w.now)
    assert view["capture_id"] == second and view["state"] == "cancelled" and view["idle_config"] is True
    assert w.state(first) is CaptureState.ENRICHING
    with pytest.raises(ControlError) as ei:
        w.shell.cancel("j1", None, w.now)
    assert ei.value.code == "not_found" and f"{first} is enriching (its verdict is out)" in ei.value.message
    w.enrich_release.set()
    w.drain(lambda: w.state(first) is CaptureState.ENRICHED)


def test_two_captures_enriched_at_once_each_say_where_they_are(world) -> None:
    """Tried by a new user: two captures enriching at once; status showed the queued one as plainly "enriching"
    and asked the analyser what ran for it. Now the one on the enrich worker says so, the other that it is
    queued behind it (and the analyser is not asked for a queued capture's commands)."""
    w = world()
    first = _analysed_then_enriching(w)
    w.now += 600  # within the first's follow-up deadline
    second = _arm_and_land(w, CaptureState.ENRICHING)
    views = {v["capture_id"]: v for v in w.shell.summary("j1", w.now)}
    assert views[first]["stage"] == "enriching" and views[first]["ahead"] == []
    assert views[first]["running"] == ["slow_rank"]
    assert views[second]["stage"] == "enrich_queued" and views[second]["ahead"] == [first]
    assert views[second]["running"] == []
    from profwatch.core.status_text import render_capture

    assert f"behind {first}" in render_capture(views[second])[1]
    w.enrich_release.set()
    w.drain(lambda: w.state(first) is CaptureState.ENRICHED and w.state(second) is CaptureState.ENRICHED)
    assert "stage" not in w.shell.summary("j1", w.now)[0]


def test_an_advisor_killed_for_memory_leaves_the_alert_standing_with_its_status(world) -> None:
    w = world()
    w.enrich_recipes = {"advisor": {"status": "oom", "phase": "enrich", "duration_s": 80.0,
                                    "detail": "killed after 80 s: resident memory ... over the cap"}}
    cid = _analysed_then_enriching(w)
    w.enrich_release.set()
    w.drain(lambda: w.state(cid) is CaptureState.ENRICHED)
    (alert,) = w.of("io.profwatch.suspect_ranks.v1")
    (enriched,) = w.of("io.profwatch.analysis_enriched.v1")
    assert enriched["suspects"] == alert["suspects"] and enriched["recipes"]["advisor"]["status"] == "oom"
    (done,) = [d for t, _j, d, _i in w.events if t == "io.profwatch.capture.v1" and d["event"] == "enriched"]
    assert done["recipes"] == {"advisor": "oom"}


def test_a_crashed_follow_up_publishes_nothing_new_and_the_verdict_stands(world) -> None:
    w = world()
    cid = _analysed_then_enriching(w)
    w.enrich_error = "advisor staging vanished"
    w.enrich_release.set()
    w.drain(lambda: w.state(cid) is CaptureState.ANALYSED)
    assert len(w.of("io.profwatch.suspect_ranks.v1")) == 1 and not w.of("io.profwatch.analysis_enriched.v1")
    cap = w.store.get_capture(cid)
    assert cap.analysis_status == "ok" and "advisor staging vanished" in cap.outcome


def test_an_armed_window_is_hidden_from_the_detector_in_step_report_numbering(world) -> None:
    """The detector hides the step reports whose time includes the profiler: start inside call S (report S+1
    measures the first profiled iteration, ``ProfilerStep#S``), stop's flush inside call S+warmup+active (report
    S+warmup+active+1). Off by one before: the reports S .. S+warmup+active-1 were hidden, the flush was judged."""
    w = world()
    out = w.arm(warmup=1, active=3)
    cid, s = out["capture_id"], out["start_step"]
    cap = w.store.get_capture(cid)
    assert cap is not None and cap.armed_steps == [s + 1, s + 2, s + 3]  # trace labels, as the traces say
    assert w.excluded == [("j1", s + 1, s + 1 + 3 + 1, f"capture {cid}")]


def test_the_steps_after_the_window_stay_hidden_until_the_batch_is_complete(world) -> None:
    """The ranks write and parse their dirs after the window (torch_npu's parse competes with the job for the
    host): those steps stay out of detection from the window's end until the batch is complete, then only the
    steps reported so far (and parse_steps after them) stay excluded."""
    w = world()
    w.verdict = ("ok", {"status": "ok", "detail": "1 suspect", "suspects": [{"rank": 1}]})
    cid = _arm_and_land(w, CaptureState.ANALYSED)
    ((_, _, last, _),) = w.excluded
    assert w.parse_marks == [("open", "j1", str(last + 1), f"parse {cid}"), ("close", "j1", f"parse {cid}")]


def test_a_capture_that_ends_before_its_batch_is_complete_ends_its_hidden_steps_too(world) -> None:
    w = world()
    cid = w.arm()["capture_id"]
    w.drain(lambda: w.state(cid) is CaptureState.WRITTEN)
    assert [m[0] for m in w.parse_marks] == ["open"]
    w.shell.cancel("j1", cid, w.now)
    assert w.parse_marks[-1] == ("close", "j1", f"parse {cid}") and len(w.parse_marks) == 2


def test_rank_dirs_named_while_a_scan_runs_are_read_after_it_and_none_is_dropped(world) -> None:
    w = world()
    calls: list[frozenset[str] | None] = []
    gate = threading.Event()

    class Recording:  # the scanner port: records what each scan was asked to read; the first one blocks
        def scan(self, prof_dir: str, **kw: Any) -> list[BatchState] | None:
            calls.append(kw.get("rank_dirs"))
            if len(calls) == 1:
                gate.wait(10)
            return None

        def reconciling(self, prof_dir: str) -> bool:
            return False

        def retain(self, analysed: Any, now_unix_s: float) -> list[Any]:
            return []

    w.shell.scanner = Recording()
    cid = w.arm()["capture_id"]
    w.drain(lambda: w.state(cid) is CaptureState.WRITTEN)
    prof = w.store.get_capture(cid).prof_dir
    w.shell.on_wake(prof)
    wait_for(lambda: calls, 10, what="a scan running")
    a, b = f"{prof}/n1_1_20260101120000000_ascend_pt", f"{prof}/n1_2_20260101120000000_ascend_pt"
    w.shell.on_rank_dirs(prof, frozenset({a}))
    w.shell.on_rank_dirs(prof, frozenset({b, "/elsewhere/n1_3_20260101120000000_ascend_pt"}))
    assert len(calls) == 1  # one scan per capture at a time: the names wait
    gate.set()
    w.drain(lambda: frozenset({a, b}) in calls[1:])
    assert calls[1] == frozenset({a, b})  # the waiting names first, together, only those under its prof_dir
    assert sum(1 for c in calls if c) == 1


def test_successive_captures_naming_other_ranks_say_the_culprit_rotates_and_stop_capturing_it(world) -> None:
    """Issue 20 item 6: a rank-outlier episode whose slow rank moves (0, then 3, then 6, as a hot MoE expert does)
    is captured again for each new rank without waiting for its cooldown; once three verdicts named three ranks,
    culprit_rotates is published (an alert) and the episode is not captured again."""
    w = world(world=8, arming={"min_arm_gap_s": 0, "rotation_captures": 3})  # the default is 2: three shown here
    cids: list[str] = []
    for i, rank in enumerate((0, 3, 6)):
        w.shell.on_anomaly(Anomaly("rank_outlier", "j1", 21 + i, (rank,), 0.5,
                                   {"stage": {rank: "forward"}, "excess": {rank: 0.5}}), w.now)
        arm = [d for d in w.of("io.profwatch.arm_decision.v1") if d["action"] == "arm"][-1]
        cid = arm["capture_id"]
        assert cid not in cids
        cids.append(cid)
        w.drain(lambda c=cid: w.state(c) is CaptureState.WRITTEN)
        w.verdict = ("ok", {"status": "ok", "detail": "1 suspect", "suspects": [{"rank": rank}]})
        w.batches = [_complete_batch(cid, 8)]
        w.now += 6
        w.shell.tick(w.now)
        w.drain(lambda c=cid: w.state(c) is CaptureState.ANALYSED)
    (rot,) = w.of("io.profwatch.culprit_rotates.v1")
    assert rot["rotation"] == [0, 3, 6] and "culprit rotates: ranks 0, 3, 6 in the last 3 captures" in rot["detail"]
    episodes = {e["episode_id"] for e in w.of("io.profwatch.episode_opened.v1")}
    assert episodes == {rot["episode_id"]}  # one episode, updated with each new rank
    w.shell.on_anomaly(Anomaly("rank_outlier", "j1", 40, (1,), 0.5, {"stage": {1: "forward"}}), w.now + 1)
    last = w.of("io.profwatch.arm_decision.v1")[-1]
    assert (last["action"], last["reason"], last["queued"]) == ("suppress", "culprit_rotates", False)


def test_a_targeted_capture_whose_ranks_wait_outside_it_gets_a_follow_up_of_those_ranks(world) -> None:
    """Issue 22 item 3: a sample capture of a job-wide regression whose verdict is ``partial`` (its ranks wait for
    ranks it did not hold) queues one follow-up of the uncaptured ranks, armed through the job's budget at the next
    tick (no cooldown), as a targeted capture of those ranks plus references; the rank the verdict names (when one alone is outside) is the one followed, with
    references (a name outside the job or inside the capture is not believed)."""
    w = world(world=8, arming={"min_arm_gap_s": 0, "targeting": {"min_world_size": 4, "sample_ranks": 4,
                                                                 "reference_ranks": 4, "node_peers": 0,
                                                                 "group_peers": 0}})
    w.shell.on_anomaly(Anomaly("step_regression", "j1", 21, (), 0.4, {"baseline_s": 0.5}), w.now)
    (first,) = [d for d in w.of("io.profwatch.arm_decision.v1") if d["action"] == "arm"]
    held = first["targeting"]["rank_list"]
    assert first["targeting"]["mode"] == "sample" and len(held) == 4
    cid = first["capture_id"]
    w.drain(lambda: w.state(cid) is CaptureState.WRITTEN)
    outside = [r for r in range(8) if r not in held]
    late = outside[-1]  # the verdict named it (e.g. the only rank outside), plus a rank it never held: ignored
    w.verdict = ("partial", {"status": "partial", "detail": "the captured ranks wait outside",
                             "waited_for": {"named": [late, held[0], 99], "uncaptured_count": len(outside)}})
    ranks = {r: RankDirState(path=f"/prof/{r}", kind="ascend_pt", rank=r, state="parsed") for r in held}
    w.batches = [BatchState(batch_id=f"b-{cid}", status="complete", kind="ascend_pt", expected_ranks=list(held),
                            ranks=ranks, missing_ranks=[], problems=[], steps=[1, 2], capture_id=cid)]
    w.now += 6
    w.shell.tick(w.now)
    w.drain(lambda: w.state(cid) is CaptureState.ANALYSED)
    (follow,) = [d for d in w.of("io.profwatch.episode_updated.v1") if d.get("reason") == "follow_up"]
    assert follow["follow_ranks"] == [late] and follow["capture_id"] == cid
    w.now += 1
    w.shell.tick(w.now)
    arms = [d for d in w.of("io.profwatch.arm_decision.v1") if d["action"] == "arm"]
    assert len(arms) == 2, w.of("io.profwatch.arm_decision.v1")[-3:]
    second = arms[1]
    assert second["targeting"]["mode"] == "follow_up" and second["episode_id"] == first["episode_id"]
    cap = w.store.get_capture(second["capture_id"])
    assert cap is not None and cap.rank_list is not None and late in cap.rank_list and len(cap.rank_list) == 5
    assert f"follow-up of ranks {late} its last capture waited for" in cap.reason


def test_a_level_capture_whose_excursion_came_back_before_its_window_is_withdrawn_live(world) -> None:
    """The coordinator's arming path (episode desk + capture shell): a job-wide ``pattern "level"`` report is armed;
    the detector then says the excursion came back before start_step: the capture is cancelled with the idle config
    over its arm (outcome ``withdrawn: ...``), its episode closes with reason ``returned``, and its arm leaves the
    budget (the next episode is armed at once, not held by the gap)."""
    w = world(arming={"min_arm_gap_s": 600})
    an = Anomaly("step_regression", "j1", 20, (), 6.0, {"pattern": "level", "first_step": 16, "baseline_s": 0.5,
                                                       "step_time_s": 3.5})
    w.shell.on_anomaly(an, w.now)
    (arm,) = [d for d in w.of("io.profwatch.arm_decision.v1") if d["action"] == "arm"]
    cid = arm["capture_id"]
    w.drain(lambda: w.state(cid) is CaptureState.WRITTEN)
    w.now += 2
    w.shell.tick(w.now)
    assert w.state(cid) is CaptureState.WRITTEN  # the detector has not said it came back: kept
    w.returned = {"first_step": 16, "last_elevated_step": 20, "steps_back": 2, "level_back": 0.01, "before_s": 0.5}
    w.now += 2
    w.shell.tick(w.now)
    cap = w.store.get_capture(cid)
    assert cap is not None and cap.state is CaptureState.CANCELLED and cap.outcome.startswith("withdrawn: ")
    w.drain(lambda: bool(w.idle_writes))
    (closed,) = [d for d in w.of("io.profwatch.episode_closed.v1") if d.get("reason") == "returned"]
    assert closed["withdrawn"] == cid and closed["relabelled"] == "step_spike" and closed["evidence"]["steps_back"] == 2
    assert w.shell.episodes.book("j1").withdrawn == 1
    w.shell.on_anomaly(Anomaly("rank_outlier", "j1", 21, (1,), 0.5, {"stage": {1: "forward"}}), w.now)
    last = w.of("io.profwatch.arm_decision.v1")[-1]
    assert last["action"] == "arm", last


@pytest.mark.parametrize("restart", [False, True])
def test_a_live_repeat_arm_leaves_the_named_rank_reserve_free_also_after_a_restart(world, tmp_path: Path,
                                                                                    restart: bool) -> None:
    """The live arm path (the shell's arm, act mode) recorded every arm as a new one: a repeat (here a job-wide
    change of the same key armed again within the hour) then held a new slow rank behind the hourly cap
    (``hourly_cap``), though the NAMED_RESERVE rule lets it arm (it did in observe mode and in the replay only).
    The episodes mark the repeat in the history, and a restart marks it again from the stored episodes."""
    arming = {"max_captures_per_hour": 2, "min_arm_gap_s": 0, "cooldown_s": 60}
    w = world(arming=arming)

    def reg(step: int, mag: float) -> Anomaly:
        return Anomaly(kind="step_regression", job_id="j1", step=step, ranks=(), magnitude=mag,
                       detail={"baseline_s": 0.5, "step_time_s": 0.5 * (1 + mag)})

    def land_last(wd: World) -> None:
        (cid,) = [d["capture_id"] for d in wd.of("io.profwatch.arm_decision.v1") if d["action"] == "arm"][-1:]
        wd.drain(lambda: wd.state(cid) is CaptureState.WRITTEN)
        wd.batches = [_complete_batch(cid)]
        wd.now += 6
        wd.shell.tick(wd.now)
        wd.drain(lambda: wd.state(cid) is CaptureState.ANALYSED)

    w.shell.on_anomaly(reg(20, 0.4), w.now)
    land_last(w)
    w.now += 120
    w.shell.on_anomaly(reg(200, 1.2), w.now)  # a new job-wide change of the same key: a repeat of the hour
    w.shell.tick(w.now)
    land_last(w)
    assert [(d["action"], d["reason"]) for d in w.of("io.profwatch.arm_decision.v1")] == [("arm", "armed")] * 2
    if restart:  # the hour's arms are counted again from the store
        w.shell.close()
        w = world(store=StateStore(tmp_path / "state.db"), arming=arming, now=w.now)
    w.now += 10
    w.shell.on_anomaly(Anomaly(kind="rank_outlier", job_id="j1", step=230, ranks=(1,), magnitude=0.4,
                               detail={"stage": "forward"}), w.now)
    w.shell.tick(w.now)
    last = w.of("io.profwatch.arm_decision.v1")[-1]
    assert (last["anomaly"], last["action"], last["reason"]) == ("rank_outlier", "arm", "armed")  # was hourly_cap
    assert w.shell.summary("j1", w.now) and len(w.store.captures("j1")) == 3  # cap 2 + the reserve of 1


def _load(w: World, node: str, t: float, runnable: float) -> None:
    w.registry.heartbeat(wire.NodeHeartbeat(node_id=node, hostname=node, pid=1, ts_unix_s=t, started_unix_s=T0,
                                            runnable_per_core=runnable, cpu_psi_some_pct=95.0), t)


def test_a_job_wide_move_its_nodes_load_explains_is_told_once_not_captured_and_captured_when_the_load_goes(
        world) -> None:
    w = world(arming={"cooldown_s": 900, "min_arm_gap_s": 5, "host_load_explains": True})
    for t in range(0, 1200, 2):  # 20 minutes at one runnable task per core, then two (heartbeats every 2 s)
        _load(w, "n1", T0 + t, 1.0 if t < 1000 else 2.0)
    w.now = T0 + 1200
    job_wide = Anomaly(kind="step_regression", job_id="j1", step=20, ranks=(), magnitude=0.8,
                       detail={"pattern": "cusum", "baseline_s": 0.5, "step_time_s": 0.9})
    w.shell.on_anomaly(job_wide, w.now)
    w.now += 2
    w.shell.tick(w.now)
    decisions = w.of("io.profwatch.arm_decision.v1")
    told = [d for d in decisions if d["reason"] == "explained_by_host_load"]
    assert [d["action"] for d in decisions] == ["suppress", "suppress"] and len(told) == 2
    evidence = told[-1]["host_load"]
    assert evidence["node_id"] == "n1" and evidence["predicted_ratio"] == 2.0 and evidence["observed_ratio"] == 1.8
    assert evidence["runnable_per_core_before"] == 1.0 and evidence["cpu_psi_some_pct_after"] == 95.0
    assert [d.get("explained_count") for d in told] == [1, None]  # told once (with the count), then the report's own
    assert w.store.captures("j1") == []
    for t in range(1200, 1320, 2):  # the load goes back; the job stays slow: its own change, captured
        _load(w, "n1", T0 + t, 1.0)
    w.now = T0 + 1320
    w.shell.tick(w.now)
    assert [d["action"] for d in w.of("io.profwatch.arm_decision.v1")][-1] == "arm"
    assert len(w.store.captures("j1")) == 1


def test_by_default_host_load_only_adds_its_evidence_to_a_job_wide_arm(world) -> None:
    w = world(arming={"cooldown_s": 900, "min_arm_gap_s": 5})  # host_load_explains off (the default)
    for t in range(0, 1200, 2):
        _load(w, "n1", T0 + t, 1.0 if t < 1000 else 2.0)
    w.now = T0 + 1200
    w.shell.on_anomaly(Anomaly(kind="step_regression", job_id="j1", step=20, ranks=(), magnitude=0.8,
                               detail={"pattern": "cusum", "baseline_s": 0.5, "step_time_s": 0.9}), w.now)
    (d,) = w.of("io.profwatch.arm_decision.v1")
    assert d["action"] == "arm" and d["host_load"]["predicted_ratio"] == 2.0 and d["host_load"]["explained"] is True
    assert len(w.store.captures("j1")) == 1
