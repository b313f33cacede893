"""Four rank processes -> two node daemons -> coordinator, over real ZeroMQ sockets and real processes."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
from contextlib import closing
from pathlib import Path

import pytest
import zmq

from profwatch.adapters.zmq.control import ControlError, ControlUnavailable, call
from profwatch.simulate.launcher import free_port
from tests.conftest import PYTHON, REPO_ROOT, finish_process, python_env, wait_for

WORKER = str(REPO_ROOT / "tests" / "fakes" / "rank_worker.py")




class Cluster:
    """Coordinator + node daemons + rank processes as real subprocesses."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.ports = {k: free_port() for k in ("ingest", "control", "pub", "metrics", "node_metrics")}
        self.cfg = root / "profwatch.toml"
        self.cfg.write_text(
            f"""
[coordinator]
ingest_bind = "tcp://127.0.0.1:{self.ports['ingest']}"
control_bind = "tcp://127.0.0.1:{self.ports['control']}"
pub_bind = "tcp://127.0.0.1:{self.ports['pub']}"
state_db = "{root / 'state.db'}"
work_dir = "{root / 'work'}"
registry_flush_s = 0.5
registry_full_flush_s = 0.5
metrics_port = {self.ports['metrics']}
[node]
coordinator = "tcp://127.0.0.1:{self.ports['ingest']}"
heartbeat_interval_s = 0.5
[logging]
format = "console"
"""
        )
        self.procs: dict[str, subprocess.Popen] = {}

    @property
    def control(self) -> str:
        return f"tcp://127.0.0.1:{self.ports['control']}"

    def start(self, name: str, args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
        log = open(self.root / f"{name}.log", "ab")
        p = subprocess.Popen(args, env=python_env(env), stdout=log, stderr=subprocess.STDOUT, cwd=self.root)
        self.procs[name] = p
        return p

    def start_coordinator(self) -> None:
        self.start("coordinator", [PYTHON, "-m", "profwatch.cli", "coordinator", "--config", str(self.cfg)])
        wait_for(lambda: self._ping(), 20, what="coordinator control socket")

    def node_endpoint(self, node: str) -> str:
        return f"ipc://{self.root}/{node}.sock"

    def start_node(self, node: str, metrics_port: int | None = None) -> None:
        env = {"PROFWATCH_NODE__NODE_ID": node, "PROFWATCH_NODE__BIND": self.node_endpoint(node)}
        if metrics_port:
            env["PROFWATCH_NODE__METRICS_PORT"] = str(metrics_port)
        self.start(node, [PYTHON, "-m", "profwatch.cli", "node", "--config", str(self.cfg)], env)

    def start_rank(self, rank: int, node: str, steps: int = 0, step_s: float = 0.02, world: int = 4,
                   extra_env: dict[str, str] | None = None) -> None:
        env = {"RANK": str(rank), "LOCAL_RANK": str(rank % 2), "WORLD_SIZE": str(world), "PROFWATCH_JOB_ID": "jobA",
               "PROFWATCH_NODE_ENDPOINT": self.node_endpoint(node), **(extra_env or {})}
        self.start(f"rank{rank}", [PYTHON, WORKER, str(self.root / f"rank{rank}.json"), str(steps), str(step_s)], env)

    def _ping(self) -> bool:
        try:
            return bool(call(self.control, "ping", timeout_s=0.5))
        except ControlUnavailable:
            return False

    def status(self) -> dict:
        return call(self.control, "status", timeout_s=8)

    def try_status(self) -> dict | None:
        """``status``, or None while the coordinator does not answer (for wait predicates: total, never raise)."""
        try:
            return self.status()
        except (ControlUnavailable, ControlError):
            return None

    def worker_steps(self, rank: int) -> int:
        """Steps the rank worker has recorded in its stats file; -1 while the file is missing or half-written."""
        try:
            return int(json.loads((self.root / f"rank{rank}.json").read_text())["steps"])
        except (OSError, ValueError, KeyError, TypeError):
            return -1

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        p = self.procs.pop(name)
        p.send_signal(sig)
        p.wait(timeout=20)

    def stop_all(self) -> None:
        """SIGTERM every process this cluster started, bounded wait for clean exits, then SIGKILL what is left."""
        procs = [self.procs.pop(name) for name in list(self.procs)]
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            finish_process(p, 15)


def _rank_steps(st: dict | None, job: str = "jobA") -> dict[int, int]:
    """rank -> last step of ``job`` in a status snapshot; {} when there is none (yet)."""
    for j in (st or {}).get("jobs", []):
        if j["job_id"] == job:
            return {r["rank"]: r["last_step"] for r in j["ranks"]}
    return {}


@pytest.fixture
def cluster(short_tmp: Path):
    c = Cluster(short_tmp)
    yield c
    c.stop_all()


def test_four_ranks_two_nodes_status_shows_every_rank(cluster: Cluster) -> None:
    cluster.start_coordinator()
    cluster.start_node("nodeA", metrics_port=cluster.ports["node_metrics"])
    cluster.start_node("nodeB")
    for r in range(4):  # the ranks say their mode and role (pipeline stage) through the environment
        cluster.start_rank(r, "nodeA" if r < 2 else "nodeB",
                           extra_env={"PROFWATCH_MODE": "training", "PROFWATCH_ROLE": f"pp{r // 2}"})
    def all_at_20():
        s = cluster.try_status()
        steps = _rank_steps(s)
        return s if len(steps) == 4 and min(steps.values()) >= 20 else None

    st = wait_for(all_at_20, 30, what="all 4 ranks at step >= 20")
    job = st["jobs"][0]
    assert job["world_size"] == 4
    hosts = {r["rank"]: r["node_id"] for r in job["ranks"]}
    assert hosts == {0: "nodeA", 1: "nodeA", 2: "nodeB", 3: "nodeB"}
    assert {r["rank"]: (r["mode"], r["role"]) for r in job["ranks"]} == {
        0: ("training", "pp0"), 1: ("training", "pp0"), 2: ("training", "pp1"), 3: ("training", "pp1")}
    assert {n["node_id"] for n in st["nodes"]} == {"nodeA", "nodeB"}
    assert job["median_step_time_s"] == pytest.approx(0.02, abs=0.03)  # the workers sleep 20 ms a step
    # the CLI shows the same
    out = subprocess.run([PYTHON, "-m", "profwatch.cli", "status", "--config", str(cluster.cfg), "--json"],
                         env=python_env(), capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert len(json.loads(out.stdout)["jobs"][0]["ranks"]) == 4
    # the coordinator's windows dump as replayable JSONL, and replay accepts every line
    dump = subprocess.run([PYTHON, "-m", "profwatch.cli", "telemetry", "--job", "jobA", "--config", str(cluster.cfg)],
                          env=python_env(), capture_output=True, text=True, timeout=30)
    assert dump.returncode == 0, dump.stderr
    rows = [json.loads(line) for line in dump.stdout.splitlines()]
    assert {r["rank"] for r in rows} == {0, 1, 2, 3} and all(r["world_size"] == 4 for r in rows)
    pids = {r["rank"]: r["pid"] for r in job["ranks"]}
    assert all((r["node"], r["pid"], r["mode"], r["role"]) == (hosts[r["rank"]], pids[r["rank"]], "training",
                                                               f"pp{r['rank'] // 2}") for r in rows)
    r0 = [r for r in rows if r["rank"] == 0]
    assert all(a["ts_unix_s"] < b["ts_unix_s"] for a, b in zip(r0, r0[1:], strict=False))
    f = cluster.root / "dump.jsonl"
    f.write_text(dump.stdout)
    rep = subprocess.run([PYTHON, "-m", "profwatch.cli", "replay", str(f), "--json"], env=python_env(),
                         capture_output=True, text=True, timeout=60)
    assert rep.returncode == 0, rep.stderr
    result = json.loads(rep.stdout)
    assert result["bad_lines"]["count"] == 0 and result["records"] == len(rows)
    # Prometheus metrics on both daemons
    import urllib.request

    def scrape(port: int) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            return resp.read().decode()

    coord_metrics = scrape(cluster.ports["metrics"])
    assert 'profwatch_messages_in_total{kind="rank_message"}' in coord_metrics
    def node_scrape() -> str | None:
        try:
            m = scrape(cluster.ports["node_metrics"])
        except OSError:  # the node's metrics server is not listening yet
            return None
        return m if "pending_relay" in m else None

    node_metrics = wait_for(node_scrape, 10, what="node queue gauge")
    assert 'profwatch_messages_in_total{kind="step"}' in node_metrics


def test_rank_keeps_full_speed_while_node_daemon_is_down_and_telemetry_resumes(cluster: Cluster) -> None:
    cluster.start_coordinator()
    cluster.start_node("nodeA")
    cluster.start_rank(0, "nodeA", world=1)
    wait_for(lambda: _rank_steps(cluster.try_status()).get(0, -1) >= 10, 30, what="rank 0 reporting")
    cluster.kill("nodeA")
    before = cluster.worker_steps(0)
    # the rank keeps stepping while its node daemon is gone
    wait_for(lambda: cluster.worker_steps(0) >= before + 50, 30, what="rank progress with node daemon down")
    seen_before = _rank_steps(cluster.status())[0]
    cluster.start_node("nodeA")
    wait_for(lambda: _rank_steps(cluster.try_status()).get(0, -1) > seen_before + 20, 30,
             what="telemetry resumed after node restart")
    stats = json.loads((cluster.root / "rank0.json").read_text())
    # never blocked on the missing daemon: the typical call is fast, and no call waited on a reconnect (a blocked
    # send would take seconds); the max alone is one scheduler hiccup away from any tight bound on 2 cores
    assert stats["p99_step_call_s"] < 0.05 and stats["max_step_call_s"] < 1.0, stats


def test_coordinator_restart_recovers_registry(cluster: Cluster) -> None:
    cluster.start_coordinator()
    cluster.start_node("nodeA")
    for r in range(2):
        cluster.start_rank(r, "nodeA", world=2)
    wait_for(lambda: len(_rank_steps(cluster.try_status())) == 2, 30, what="2 ranks registered")
    wait_for(lambda: min(_rank_steps(cluster.try_status()).values(), default=-1) >= 10, 30, what="steps flowing")

    def stored() -> bool:  # the registry flush (every 0.5 s) has written both ranks with their progress
        try:
            with closing(sqlite3.connect(f"file:{cluster.root / 'state.db'}?mode=ro", uri=True, timeout=1)) as db:
                rows = db.execute("SELECT rank, last_step FROM ranks").fetchall()
        except sqlite3.Error:
            return False
        return {r for r, step in rows if (step or 0) >= 10} == {0, 1}

    wait_for(stored, 30, 0.1, "both ranks in the state store")
    cluster.kill("coordinator")
    cluster.start_coordinator()
    st = cluster.status()  # straight from the store, before any rank message arrives
    assert set(_rank_steps(st)) == {0, 1}
    last = _rank_steps(st)
    def advanced() -> bool:
        now = _rank_steps(cluster.try_status())
        return set(now) >= set(last) and all(now[k] > last[k] + 10 for k in last)

    wait_for(advanced, 30, what="steps advancing after coordinator restart")


def test_bad_messages_are_rejected_and_service_continues(cluster: Cluster) -> None:
    cluster.start_coordinator()
    cluster.start_node("nodeA")
    cluster.start_rank(0, "nodeA", world=2)
    wait_for(lambda: _rank_steps(cluster.try_status()).get(0, -1) >= 5, 30, what="rank 0 reporting")
    ctx = zmq.Context()
    try:
        push = ctx.socket(zmq.PUSH)
        push.setsockopt(zmq.LINGER, 1000)
        push.connect(cluster.node_endpoint("nodeA"))
        bad = [
            [b"x", b"not json"],
            [b"x", b"[]"],
            [b"x", json.dumps({"kind": "nope", "v": 1}).encode()],
            [b"x", json.dumps({"kind": "step", "v": 99, "job_id": "jobA", "rank": 0, "step": 1, "step_time_s": 1, "ts_unix_s": 1}).encode()],
            [b"x", b'{"kind":"step","v":1,"job_id":"jobA","rank":0,"step":1,"step_time_s":NaN,"ts_unix_s":1}'],
            [b"x", json.dumps({"kind": "step", "v": 1, "job_id": "jobA", "rank": 0, "step": 1, "step_time_s": -1, "ts_unix_s": 1}).encode()],
            [b"x", json.dumps({"kind": "hello", "v": 1, "job_id": "jobA", "rank": 5, "local_rank": 0, "world_size": 2,
                               "hostname": "h", "pid": 1, "backend": "none", "ts_unix_s": 1}).encode()],
            [b"x", json.dumps({"kind": "hello", "v": 1, "job_id": "jobA", "rank": 1, "local_rank": 0, "world_size": 8,
                               "hostname": "h", "pid": 1, "backend": "none", "ts_unix_s": 1}).encode()],
            [b"x", json.dumps({"kind": "step", "v": 1, "job_id": "../../etc", "rank": 0, "step": 1, "step_time_s": 1, "ts_unix_s": 1}).encode()],
            [b"only-one-frame"],
            [b"x", b"[" * 200_000],  # deep nesting: RecursionError inside json must not kill the node
            [b"x", json.dumps({"kind": "hello", "v": 1, "job_id": "jBig", "rank": 0, "local_rank": 0, "world_size": 1,
                               "hostname": "h", "pid": 2**70, "backend": "none", "ts_unix_s": 1}).encode()],
            [b"x", b"y" * (300 * 1024)],  # over MAXMSGSIZE: the connection is dropped by ZeroMQ
        ]
        for frames in bad:
            push.send_multipart(frames)
        dealer = ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 1000)
        dealer.setsockopt(zmq.IDENTITY, b"evil")
        dealer.connect(f"tcp://127.0.0.1:{cluster.ports['ingest']}")
        for data in [b"garbage", b"{}", json.dumps({"kind": "node_batch", "v": 1, "node_id": "other", "hostname": "h",
                                                     "seq": 1, "ts_unix_s": 1, "messages": []}).encode(),
                     b"[" * 200_000,
                     json.dumps({"kind": "node_heartbeat", "v": 1, "node_id": "evil", "hostname": "h", "pid": 2**70,
                                 "ts_unix_s": 1, "started_unix_s": 1}).encode()]:
            dealer.send(data)
        req = ctx.socket(zmq.REQ)
        req.setsockopt(zmq.LINGER, 0)
        req.setsockopt(zmq.RCVTIMEO, 8000)
        req.connect(cluster.control)
        req.send(b"[" * 200_000)
        assert json.loads(req.recv())["error"]["code"] == "bad_request"
        for bad_req in ({"cmd": "events", "args": {"since_seq": "abc"}}, {"cmd": "captures", "args": {"job_id": [1]}},
                        {"cmd": "arm", "args": {"job_id": 5}}, {"cmd": "status", "args": []}, {"cmd": "nope"},
                        # a string is not a flag: "false" must not read as true (adversarial finding)
                        {"cmd": "events", "args": {"alerts_only": "false"}},
                        {"cmd": "arm", "args": {"job_id": "j", "dry_run": "no"}}):
            req.send(json.dumps(bad_req).encode())
            reply = json.loads(req.recv())
            assert reply["ok"] is False and reply["error"]["code"] in ("bad_request", "unknown_command"), reply
        req.close()
        push.close()
        dealer.close()
    finally:
        ctx.term()
    def rejected():
        s = cluster.try_status()
        return s if s and s.get("counters", {}).get("rejected", 0) >= 4 else None

    st = wait_for(rejected, 20, what="rejections counted")
    assert cluster.procs["coordinator"].poll() is None and cluster.procs["nodeA"].poll() is None
    assert st["jobs"][0]["world_size"] == 2  # the conflicting hello did not change the job
    node = wait_for(lambda: next((n for n in (cluster.try_status() or {}).get("nodes", [])
                                  if n.get("counters", {}).get("rejected", 0) >= 8), None), 20,
                    what="node rejection counter")
    assert node["node_id"] == "nodeA"
    last = _rank_steps(cluster.status())[0]
    wait_for(lambda: _rank_steps(cluster.try_status()).get(0, -1) > last + 5, 20, what="still serving the good rank")


def test_second_node_daemon_on_the_same_socket_is_refused(cluster: Cluster) -> None:
    cluster.start_coordinator()
    cluster.start_node("nodeA")
    cluster.start_rank(0, "nodeA", world=1)
    wait_for(lambda: _rank_steps(cluster.try_status()).get(0, -1) >= 5, 30, what="rank 0 reporting")
    second = subprocess.run([PYTHON, "-m", "profwatch.cli", "node", "--config", str(cluster.cfg)], env=python_env(
        {"PROFWATCH_NODE__NODE_ID": "intruder", "PROFWATCH_NODE__BIND": cluster.node_endpoint("nodeA")}),
        capture_output=True, text=True, timeout=60)
    assert second.returncode == 2 and "another node daemon" in second.stderr, second.stderr
    last = _rank_steps(cluster.status())[0]
    wait_for(lambda: _rank_steps(cluster.try_status()).get(0, -1) > last + 5, 20, what="the first node still relays")


def test_daemon_import_name_is_ours() -> None:
    import profwatch

    assert Path(profwatch.__file__).resolve().parent == (REPO_ROOT / "daemon" / "profwatch").resolve()
    assert hasattr(profwatch, "__version__")
