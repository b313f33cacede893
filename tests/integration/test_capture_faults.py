"""Issue 10's capture faults with live sockets: a node that drops its write command, a node that is down, stale
torch_npu state on a node (real node daemon), `profwatch arm --wait` / `--dry-run` / `cancel` / `status` (real
CLI), exact-topic subscriptions, and a rank that restarted its step counter (real msprof-analyze)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest
import zmq

from profwatch.adapters.zmq.control import ControlError, ControlUnavailable, call
from profwatch.adapters.zmq.publish import EventPublisher, Subscription
from profwatch.config import load_settings
from profwatch.core.alerts.events import make_cloudevent
from profwatch.node import NodeDaemon
from profwatch.simulate.ascend_tree import generate_cluster
from rankhook import wire
from tests.conftest import PYTHON, python_env, wait_for
from tests.integration.capture_harness import Harness, of_type


def _cli(h: Harness, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = python_env({"PROFWATCH_COORDINATOR__CONTROL_BIND": h.settings.coordinator.control_bind,
                      "PROFWATCH_COORDINATOR__PUB_BIND": h.settings.coordinator.pub_bind})
    return subprocess.run([PYTHON, "-m", "profwatch.cli", *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


def _capture_event(h: Harness, job: str, cid: str) -> list[dict]:
    return [e for e in of_type(h.events(job), "io.profwatch.capture.v1") if e["data"].get("capture_id") == cid]


def _ready_job(h: Harness, short_tmp: Path, job: str, world: int = 2, backend: str = "torch") -> Path:
    cfg, prof = short_tmp / "cfg" / job, short_tmp / "prof"
    cfg.mkdir(parents=True, exist_ok=True)
    h.send(*[wire.RankHello(job_id=job, rank=r, local_rank=r, world_size=world, hostname="fake", pid=100 + r,
                            backend=backend, ts_unix_s=time.time() - 5, profiler_config_path=str(cfg),
                            prof_root=str(prof)) for r in range(world)])
    h.steps(job, world, 12)
    wait_for(lambda: h.furthest(job) == 12, 30)
    return cfg


def test_a_node_that_drops_its_write_command_fails_the_capture_at_the_write_deadline(harness, short_tmp) -> None:
    # the harness's node identity relays batches but never answers a write_config command
    h = harness(config_writer="node", allowed_config_roots=[], capture={"write_timeout_s": 2.0})
    _ready_job(h, short_tmp, "jobL")
    res = call(h.control, "arm", {"job_id": "jobL"})
    assert res["state"] == "planned" and res["nodes"] == ["fake-node"]
    with pytest.raises(ControlError) as ei:
        call(h.control, "arm", {"job_id": "jobL"})
    assert ei.value.code == "conflict" and res["capture_id"] in ei.value.message
    arm = wait_for(lambda: of_type(h.events("jobL"), "io.profwatch.arm.v1"), 30, what="the write deadline")[0]
    assert arm["data"]["status"] == "failed" and "node(s) ['fake-node'] did not confirm" in arm["data"]["error"]
    assert h.last_capture("jobL")["state"] == "failed"
    h.steps("jobL", 2, 2)  # the node is alive (it relays): the job can be armed again
    again = call(h.control, "arm", {"job_id": "jobL"})
    assert again["capture_id"] != res["capture_id"]


def test_an_arm_needing_a_node_that_is_down_is_refused(harness, short_tmp) -> None:
    h = harness(config_writer="node", allowed_config_roots=[], node_timeout_s=1.0)
    _ready_job(h, short_tmp, "jobD")

    def node_down() -> bool:  # the node goes silent for longer than node_timeout_s
        try:
            return any(n["down"] for n in call(h.control, "status", {}, timeout_s=10)["nodes"])
        except ControlUnavailable:
            return False

    wait_for(node_down, 30, 0.1, "the node marked down")
    with pytest.raises(ControlError) as ei:
        call(h.control, "arm", {"job_id": "jobD"})
    assert ei.value.code == "refused" and "node fake-node is down" in ei.value.message


def test_stale_torch_npu_state_on_a_node_is_named_as_the_cause(harness, short_tmp) -> None:
    h = harness(ack_timeout_s=5.0, capture={"deadline_factor": 1.0, "deadline_grace_s": 0.0})
    shm, proc = short_tmp / "shm", short_tmp / "proc" / "4242"
    shm.mkdir()
    proc.mkdir(parents=True)
    (shm / "DynamicProfileNpuShm2027011509").write_bytes(b"\0")
    (proc / "comm").write_text("DynMonitorProc\n")
    (proc / "stat").write_text("4242 (DynMonitorProc) S 1 1 1 0")  # parent pid 1: its job is gone
    cfg, prof = short_tmp / "cfg" / "jobT", short_tmp / "prof"
    cfg.mkdir(parents=True)
    ns = load_settings(None, node={"node_id": "fake-node", "bind": f"ipc://{short_tmp}/n.sock",
                                   "coordinator": h.settings.coordinator.ingest_bind, "heartbeat_interval_s": 0.2,
                                   "stale_check_interval_s": 0.5, "shm_dir": str(shm),
                                   "proc_dir": str(short_tmp / "proc")}).node
    h.dealer.close(0)  # the real node daemon takes over the identity
    node = NodeDaemon(ns)
    t = threading.Thread(target=node.run, name="test-node")
    t.start()
    ctx = zmq.Context()
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 1000)
    try:
        push.connect(ns.rank_endpoint())
        for r in range(2):
            push.send_multipart(wire.frames(wire.RankHello(
                job_id="jobT", rank=r, local_rank=r, world_size=2, hostname="fake", pid=10 + r, backend="torch_npu",
                ts_unix_s=time.time() - 5, profiler_config_path=str(cfg), prof_root=str(prof))))
        for s in range(1, 13):
            for r in range(2):
                push.send_multipart(wire.frames(wire.StepReport(job_id="jobT", rank=r, step=s, step_time_s=0.5,
                                                                ts_unix_s=time.time())))

        def stale() -> str:
            try:
                nodes = call(h.control, "status", {}, timeout_s=10)["nodes"]
            except ControlUnavailable:
                return ""
            return next((n.get("stale_state", "") for n in nodes if n["node_id"] == "fake-node"), "")

        assert "orphaned DynMonitorProc pid 4242" in wait_for(stale, 30, what="the node's stale-state report")
        wait_for(lambda: h.furthest("jobT") == 12, 30)
        res = call(h.control, "arm", {"job_id": "jobT"})
        wait_for(lambda: of_type(h.events("jobT"), "io.profwatch.arm.v1"), 30, what="config written")
        for r in range(2):  # the hooks read the file; torch_npu (its dp log) never confirms: the stale monitor has it
            push.send_multipart(wire.frames(wire.CaptureEvent(job_id="jobT", rank=r, event="arm_seen",
                                                              ts_unix_s=time.time(), capture_id=res["capture_id"])))
        ack = wait_for(lambda: [e for e in _capture_event(h, "jobT", res["capture_id"])
                                if e["data"].get("event") == "ack_missing"], 30, what="ack_missing")[0]["data"]
        assert ack["ranks"] == [0, 1]
        assert all("torch_npu never acknowledged" in c and "orphaned DynMonitorProc pid 4242" in c
                   for c in ack["causes"])
        inc = wait_for(lambda: of_type(h.events("jobT", alerts_only=True), "io.profwatch.batch_incomplete.v1"), 90,
                       0.2, "the incomplete verdict")[0]["data"]
        assert inc["missing_ranks"] == [0, 1] and "stale torch_npu state" in inc["causes"][0]
        assert "orphaned DynMonitorProc" in inc["detail"]
    finally:
        push.close()
        ctx.term()
        node.stop()
        t.join(20)


@pytest.mark.slow
def test_arm_wait_reports_the_write_and_every_acknowledgement(harness, short_tmp) -> None:
    h = harness()
    _ready_job(h, short_tmp, "jobW")
    cli = subprocess.Popen([PYTHON, "-m", "profwatch.cli", "arm", "--job", "jobW", "--wait", "--wait-s", "60"],
                           env=python_env({"PROFWATCH_COORDINATOR__CONTROL_BIND": h.settings.coordinator.control_bind}),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        arm = wait_for(lambda: of_type(h.events("jobW"), "io.profwatch.arm.v1"), 60, what="config written")[0]
        for r in range(2):  # torch backend: the hook drives torch.profiler, its word is the acknowledgement
            h.send(wire.CaptureEvent(job_id="jobW", rank=r, event="arm_seen", ts_unix_s=time.time(),
                                     capture_id=arm["data"]["capture_id"]))
        out, err = cli.communicate(timeout=120)
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait(10)
    assert cli.returncode == 0, out + err
    lines = out.splitlines()
    assert lines[0].startswith(f"planned capture {arm['data']['capture_id']} of job jobW")
    assert "config write asked of the coordinator, not confirmed yet" in lines[0]
    # no --in-steps: the window the planner chose, in steps and seconds (issue 35)
    assert lines[1].startswith(f"window (the planner chose): warm-up from step {arm['data']['start_step']}, "), lines
    assert "steps ahead of the furthest rank" in lines[1]
    assert lines[2].startswith("config written by the coordinator: ") and "(modified " in lines[2]
    stamp = datetime.fromtimestamp(arm["data"]["mtime_s"], tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    assert f"(modified {stamp} (" in lines[2] and " ago))" in lines[2], lines[2]  # not a raw epoch
    assert lines[3].startswith("acknowledged by all 2 ranks")


@pytest.mark.slow
def test_arm_wait_names_the_silent_rank_then_dry_run_refusal_cancel_and_status(harness, short_tmp) -> None:
    h = harness(ack_timeout_s=5.0)
    cfg = _ready_job(h, short_tmp, "jobM")
    res = call(h.control, "arm", {"job_id": "jobM"})
    cid = res["capture_id"]
    wait_for(lambda: of_type(h.events("jobM"), "io.profwatch.arm.v1"), 60, what="config written")
    h.send(wire.CaptureEvent(job_id="jobM", rank=0, event="arm_seen", ts_unix_s=time.time(), capture_id=cid))
    waited = _cli(h, "arm", "--job", "jobM", "--wait", "--wait-s", "30")
    # the job already has a capture in flight: the second arm is refused and names it
    assert waited.returncode == 1 and cid in waited.stderr and "profwatch cancel --job jobM" in waited.stderr
    dry = _cli(h, "arm", "--job", "jobM", "--dry-run")
    assert dry.returncode == 1 and dry.stdout.startswith("dry run: would be refused: capture " + cid)
    for text in (waited.stderr, dry.stdout):  # the same refusal (the state and time left may have moved on)
        assert f"capture {cid} of job jobM is " in text and "deadline is in " in text
        assert f"profwatch cancel --job jobM --capture {cid}" in text
    wait_for(lambda: any(e["data"].get("event") == "ack_missing" for e in _capture_event(h, "jobM", cid)), 30)
    status = _cli(h, "status", "--job", "jobM")
    assert status.returncode == 0
    line = next(x for x in status.stdout.splitlines() if cid in x)
    assert "collecting" in line and "deadline in" in line and "acked=1/2" in line
    cancelled = _cli(h, "cancel", "--job", "jobM")
    assert cancelled.returncode == 0 and cancelled.stdout.startswith(f"cancelled capture {cid} of job jobM")
    assert "the idle config (start_step 0) goes over the arm" in cancelled.stdout
    assert h.last_capture("jobM")["state"] == "cancelled"
    # rank 1 never took the arm: the idle config (start_step 0) now stands in the file, so it never will
    idled = wait_for(lambda: [e for e in _capture_event(h, "jobM", cid) if e["data"]["event"].startswith("idle_config")],
                     30, what="the idle config written")
    assert idled[0]["data"]["event"] == "idle_config_written", idled
    on_disk = json.loads((cfg / "profiler_config.json").read_text())
    assert on_disk["start_step"] == 0 and on_disk["metadata"] == {
        "profwatch_idle": f"capture {cid} cancelled by profwatch cancel while collecting"}
    again = _cli(h, "cancel", "--job", "jobM")
    assert again.returncode == 1 and "no capture in flight" in again.stderr
    # a fresh arm whose rank 1 never acknowledges: --wait says who and why, exit 1
    h.steps("jobM", 2, 2)
    second = subprocess.Popen([PYTHON, "-m", "profwatch.cli", "arm", "--job", "jobM", "--wait", "--wait-s", "60"],
                              env=python_env({"PROFWATCH_COORDINATOR__CONTROL_BIND": h.settings.coordinator.control_bind}),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        new_cid = wait_for(lambda: next((e["data"]["capture_id"] for e in of_type(h.events("jobM"), "io.profwatch.arm.v1")
                                         if e["data"]["capture_id"] != cid), None), 60, what="second arm written")
        h.send(wire.CaptureEvent(job_id="jobM", rank=0, event="arm_seen", ts_unix_s=time.time(), capture_id=new_cid))
        out, err = second.communicate(timeout=120)
    finally:
        if second.poll() is None:
            second.kill()
            second.wait(10)
    assert second.returncode == 1, out + err
    assert "acknowledged by 1/2 ranks; not by:" in out and "rank 1: never acknowledged the arm" in out


def test_a_job_subscription_gets_its_own_topics_only(short_tmp) -> None:
    ctx = zmq.Context()
    ep = f"ipc://{short_tmp}/pub.sock"
    pub = EventPublisher(ctx, ep)
    sub = Subscription(ctx, ep, ["alert"], "j1")
    got: list[dict] = []
    try:
        def mine() -> bool:  # publish a neighbour's alerts and then ours until ours arrive (slow joiner)
            for job in ("j10", "j1.x", "j1"):
                pub.publish(make_cloudevent("io.profwatch.path_refused.v1", job, {"n": len(got)}, source="//t",
                                            now_unix_s=time.time()), True)
            ev = sub.recv(100)
            while ev is not None:
                got.append(ev)
                ev = sub.recv(50)
            return bool(got)

        wait_for(mine, 20, 0.05, "j1's alerts")
        assert {e["subject"] for e in got} == {"j1"}
    finally:
        sub.close()
        pub.close()
        ctx.term()


@pytest.mark.slow
def test_a_rank_that_restarted_its_step_counter_is_awaited_on_its_own_deadline(harness, short_tmp) -> None:
    h = harness(capture={"deadline_factor": 1.0, "deadline_grace_s": 0.0}, arming={"mode": "off"})
    cfg, prof = short_tmp / "cfg" / "jobR", short_tmp / "prof"
    cfg.mkdir(parents=True)
    h.send(*[wire.RankHello(job_id="jobR", rank=r, local_rank=r, world_size=4, hostname="fake", pid=100 + r,
                            backend="torch", ts_unix_s=time.time() - 5, profiler_config_path=str(cfg),
                            prof_root=str(prof)) for r in range(4)])
    for s in range(1, 13):  # ranks 0-2 at step 1002, rank 3 restarted: at step 12
        h.send(*[wire.StepReport(job_id="jobR", rank=r, step=s + (990 if r < 3 else 0), step_time_s=0.01,
                                 ts_unix_s=time.time()) for r in range(4)])
    wait_for(lambda: h.furthest("jobR") == 1002, 30)
    t0 = time.time()
    res = call(h.control, "arm", {"job_id": "jobR"})
    assert res["base_step"] == 1002 and res["step_spread"] == 990
    # rank 3 needs ~1390 steps of 0.01 s to close its window, its peers ~400: the judgement waits for rank 3
    assert res["judge_unix_s"] - t0 > 17
    tmp = short_tmp / "gen"
    dirs = generate_cluster(tmp, world_size=4, capture_id=res["capture_id"],
                            metadata={"profwatch_capture_id": res["capture_id"]})
    dest = Path(res["prof_dir"])
    for d in dirs[:3]:
        shutil.move(str(d), dest / d.name)
    peers_judged = t0 + 2 + 2 + 405 * 0.01 + 5  # when a deadline from the peers' progress would have judged
    wait_for(lambda: time.time() > peers_judged + 1, 60, 0.2, "the peers' judgement time")
    assert h.last_capture("jobR")["state"] not in ("incomplete", "failed")  # late data is still awaited
    shutil.move(str(dirs[3]), dest / dirs[3].name)
    alert = wait_for(lambda: of_type(h.events("jobR", alerts_only=True), "io.profwatch.suspect_ranks.v1"), 180,
                     0.2, "the verdict with the late rank")[0]["data"]
    assert alert["capture_id"] == res["capture_id"] and alert["missing_ranks"] == []
    assert any("far apart" in n and "[3]" in n for n in alert["notes"])
    assert os.path.isdir(dest / dirs[3].name)


def test_alerts_follow_for_one_job_prints_that_job_only(harness, short_tmp) -> None:
    h = harness()
    env = python_env({"PROFWATCH_COORDINATOR__CONTROL_BIND": h.settings.coordinator.control_bind,
                      "PROFWATCH_COORDINATOR__PUB_BIND": h.settings.coordinator.pub_bind})
    follow = subprocess.Popen([PYTHON, "-u", "-m", "profwatch.cli", "alerts", "--follow", "--json", "--job", "ja"],
                              env=env, stdout=subprocess.PIPE, text=True)
    lines: list[str] = []
    try:
        import select

        n = [0]

        def neighbour_round(ours: bool = False) -> None:
            n[0] += 1  # a refused hello alerts once per job: a new neighbour (ja1, ja2, ...) each round
            h.hellos("ja" if ours else f"ja{n[0]}", 1, short_tmp / "nope" / "cfg", Path("/etc"))
            while select.select([follow.stdout], [], [], 0.5)[0]:
                lines.append(follow.stdout.readline())

        def ours_printed() -> bool:
            neighbour_round(ours=n[0] >= 8)
            return any(json.loads(x)["subject"] == "ja" for x in lines if x.strip())

        wait_for(ours_printed, 60, 0.1, "ja's alert")
        for _ in range(4):  # the follower is subscribed now: its neighbours' alerts keep coming, never printed
            neighbour_round()
    finally:
        follow.terminate()
        follow.wait(10)
    assert [json.loads(x)["subject"] for x in lines if x.strip()] == ["ja"]
    # the same kind of filter everywhere: stored events, status and captures take the job id exactly
    assert {e["subject"] for e in h.events("ja", alerts_only=True)} == {"ja"}
    assert [j["job_id"] for j in call(h.control, "status", {"job_id": "ja"}, timeout_s=10)["jobs"]] == ["ja"]
    assert call(h.control, "captures", {"job_id": "j"}, timeout_s=10) == []
