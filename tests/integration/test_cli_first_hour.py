"""The first hour with profwatch, through the real CLI against real daemons (issue 14, items 1, 3, 5, 6).

Exit codes agree across commands; a missing coordinator is reported at once with the hint; ``status`` with no
node names the likely cause; a node whose heartbeats go unanswered warns, and says so when answers resume;
``alerts --follow`` says where it listens; ``alerts`` reads the state db offline, within its file permissions.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import zmq
from click.testing import CliRunner

from profwatch.adapters.store.state import StateStore
from profwatch.cli import cli
from profwatch.commands.common import PING_TIMEOUT_S
from profwatch.core.alerts.events import make_cloudevent
from profwatch.simulate.launcher import free_port
from tests.conftest import PYTHON, finish_process, python_env, wait_for


def _config(root: Path, ports: dict[str, int], **node: object) -> Path:
    cfg = root / "profwatch.toml"
    extra = "".join(f"{k} = {json.dumps(v)}\n" for k, v in node.items())
    cfg.write_text(f"""
[coordinator]
ingest_bind = "tcp://127.0.0.1:{ports['ingest']}"
control_bind = "tcp://127.0.0.1:{ports['control']}"
pub_bind = "tcp://127.0.0.1:{ports['pub']}"
state_db = "{root / 'state' / 'state.db'}"
work_dir = "{root / 'work'}"
[node]
coordinator = "tcp://127.0.0.1:{ports['ingest']}"
bind = "ipc://{root}/node.sock"
heartbeat_interval_s = 0.5
{extra}[logging]
format = "json"
""")
    return cfg


@pytest.fixture
def ports() -> dict[str, int]:
    return {k: free_port() for k in ("ingest", "control", "pub")}


def _daemon(kind: str, cfg: Path, log: Path) -> subprocess.Popen:
    with open(log, "ab") as out:
        return subprocess.Popen([PYTHON, "-m", "profwatch.cli", kind, "--config", str(cfg)], env=python_env(),
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def _log_events(log: Path) -> list[dict]:
    """JSON log lines of a daemon ([] while none is complete: wait predicates stay total)."""
    out = []
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return []
    for line in text.splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def _answers(control: str) -> bool:
    from profwatch.adapters.zmq.control import ControlError, call

    try:
        return bool(call(control, "ping", timeout_s=1.0))
    except ControlError:
        return False


# -- 6: exit codes agree, a missing coordinator fails fast with the hint -------------------------------------------
@pytest.mark.parametrize("args", [["status"], ["alerts"], ["arm", "--job", "j1"], ["cancel", "--job", "j1"],
                                  ["telemetry", "--job", "j1"], ["alerts", "--follow"]])
def test_every_coordinator_command_reports_nothing_listening_at_once(tmp_path: Path, ports: dict[str, int],
                                                                    args: list[str]) -> None:
    cfg = _config(tmp_path, ports)
    res = CliRunner().invoke(cli, [*args, "--config", str(cfg)])
    assert res.exit_code == 3, res.output
    # refused at once, not after a timeout: the message says why, and the hint says where the CLI looked
    assert f"tcp://127.0.0.1:{ports['control']}" in res.output
    assert "connection refused" in res.output or "no state db" in res.output, res.output
    assert "control_bind" in res.output


def test_a_silent_endpoint_is_reported_after_the_short_ping(tmp_path: Path, ports: dict[str, int]) -> None:
    """Something accepts the connection but never answers: the command ends after the ping's bound."""
    ctx = zmq.Context()
    mute = ctx.socket(zmq.ROUTER)
    mute.bind(f"tcp://127.0.0.1:{ports['control']}")
    try:
        res = CliRunner().invoke(cli, ["status", "--config", str(_config(tmp_path, ports))])
    finally:
        mute.close(0)
        ctx.term()
    assert res.exit_code == 3
    assert f"no reply within {PING_TIMEOUT_S:g}s" in res.output, res.output


def test_scan_and_analyze_agree_on_folders_without_a_batch(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    for cmd in (["scan"], ["analyze", "--no-html", "--out", str(tmp_path / "work")]):
        assert CliRunner().invoke(cli, [*cmd, str(empty)]).exit_code == 2, cmd
        assert CliRunner().invoke(cli, [*cmd, str(tmp_path / "nope")]).exit_code == 2, cmd
    # a new user's trial: "no rank dirs found under X" said neither what one looks like nor where captures are
    said = CliRunner().invoke(cli, ["scan", str(empty)]).output
    assert f"no rank dirs found under {empty}" in said and "_ascend_pt" in said and "_torch_pt" in said, said
    assert "Kineto" in said and "prof_dir" in said, said


# -- 5: alerts read the state db offline ------------------------------------------------------------------------------
def _stored(db: Path, close: bool = True) -> StateStore:
    store = StateStore(db)
    for i, (job, typ, alert) in enumerate([("j1", "io.profwatch.suspect_ranks.v1", True),
                                           ("j1", "io.profwatch.anomaly.v1", False),
                                           ("j2", "io.profwatch.batch_incomplete.v1", True)]):
        data = {"status": "ok", "suspects": [{"rank": 3, "kind": "compute", "score": 0.9, "hostname": "h3"}]} \
            if alert and job == "j1" else {"kind": "step_regression", "step": 40, "missing_ranks": [1]}
        store.add_event(make_cloudevent(typ, job, data, source="//profwatch/test", now_unix_s=1.0e9 + i), alert)
    if close:
        store.close()
    return store


def test_alerts_after_the_coordinator_stopped_come_from_the_state_db(tmp_path: Path, ports: dict[str, int]) -> None:
    cfg = _config(tmp_path, ports)
    _stored(tmp_path / "state" / "state.db")
    res = CliRunner().invoke(cli, ["alerts", "--config", str(cfg)])
    assert res.exit_code == 0, res.output
    assert "reading its state db" in res.stderr and "offline" in res.stderr
    lines = res.stdout.splitlines()
    assert len(lines) == 2 and "suspect_ranks.v1 job=j1" in lines[0] and "rank 3 (compute" in lines[0]
    assert "batch_incomplete.v1 job=j2" in lines[1]
    res = CliRunner().invoke(cli, ["alerts", "--config", str(cfg), "--job", "j1", "--all-events", "--json"])
    assert [json.loads(x)["type"] for x in res.stdout.splitlines()] == ["io.profwatch.suspect_ranks.v1",
                                                                        "io.profwatch.anomaly.v1"]
    follow = CliRunner().invoke(cli, ["alerts", "--config", str(cfg), "--follow"])
    assert follow.exit_code == 3 and "cannot --follow" in follow.stderr and len(follow.stdout.splitlines()) == 2


def test_offline_alerts_of_a_killed_coordinator_include_its_wal(tmp_path: Path, ports: dict[str, int]) -> None:
    """A coordinator killed outright leaves its newest events in the -wal file: they are read too."""
    store = _stored(tmp_path / "state" / "state.db", close=False)
    try:
        assert Path(f"{tmp_path / 'state' / 'state.db'}-wal").stat().st_size > 0
        res = CliRunner().invoke(cli, ["alerts", "--config", str(_config(tmp_path, ports))])
    finally:
        store.close()
    assert res.exit_code == 0 and len(res.stdout.splitlines()) == 2, res.output


def test_status_after_the_coordinator_stopped_shows_its_last_recorded_state(tmp_path: Path,
                                                                           ports: dict[str, int]) -> None:
    """Tried by a new user after the demo: ``status --config`` only asked "is the coordinator running there?"
    where ``alerts`` read the state db. Now it says the coordinator is not running and shows the jobs, nodes and
    captures it recorded, with the time of that record; exit 3 all the same (it is unavailable)."""
    from profwatch.core.capture import lifecycle as lc
    from profwatch.core.capture.planner import CaptureRequest, JobProgress, plan_capture

    t0 = 1.7e9  # 2023-11-14 22:13:20 UTC
    store = StateStore(tmp_path / "state" / "state.db")
    store.save_registry([{"job_id": "j1", "world_size": 2, "backend": "torch_npu", "profiler_config_path": "/cfg",
                          "prof_root": "/prof", "first_seen_unix_s": t0, "started_unix_s": t0, "versions": "{}",
                          "generation": 0, "restart_count": 0}],
                        [("j1", r, "h1", "n1", 100 + r, r, "torch_npu", 120 + r, 0.5, t0 + 60 + r, 0) for r in (0, 1)],
                        [("n1", "h1", 1, t0 + 30, "{}")])
    job = JobProgress(job_id="j1", world_size=2, furthest_step=50, step_time_s=0.5, prof_root="/prof",
                      now_unix_s=t0, rank_steps={0: 50, 1: 50})
    cap = lc.open_capture(plan_capture(CaptureRequest(job_id="j1", reason="step_regression"), job), world_size=2,
                          profiler_config_path="/cfg", writer="node", rank_steps=job.rank_steps,
                          rank_step_time_s={}, rank_backends={0: "torch_npu", 1: "torch_npu"}, nodes=["n1"],
                          now=t0 + 10, settings=lc.LifecycleSettings(), step_time_s=0.5).capture
    store.save_capture(cap)
    store.close()
    res = CliRunner().invoke(cli, ["status", "--config", str(_config(tmp_path, ports))])
    assert res.exit_code == 3, res.output
    first, *rest = res.stdout.splitlines()
    assert first.startswith("the coordinator is not running (no coordinator at tcp://127.0.0.1:")
    assert "what follows is its last recorded state, as of 2023-11-14 22:14:21 UTC (" in first  # ranks' last heard
    assert any(line.startswith("  j1 world_size=2 generation=0: 2 ranks, last step 121") for line in rest), rest
    assert any(line.startswith(f"  {cap.capture_id}") and f" {cap.state.value} since 2023-11-14 22:13:30 UTC (" in line
               and "reason=step_regression" in line for line in rest), rest
    assert "is the coordinator running there?" not in res.output
    as_json = CliRunner().invoke(cli, ["status", "--config", str(_config(tmp_path, ports)), "--json"])
    doc = json.loads(as_json.stdout)
    assert as_json.exit_code == 3 and doc["offline"] is True and doc["recorded_unix_s"] == t0 + 61
    assert [c["capture_id"] for c in doc["captures"]] == [cap.capture_id]


def _alerts_without_override(cfg: Path) -> subprocess.CompletedProcess[str]:
    """``profwatch alerts`` bound by file permissions. Under root the child drops CAP_DAC_OVERRIDE and
    CAP_DAC_READ_SEARCH from its bounding set before exec (prctl PR_CAPBSET_DROP), so it is refused what its uid
    is refused, like any other user."""
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl

    def drop() -> None:
        for cap in (1, 2):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH (linux/capability.h)
            if prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
                raise OSError(ctypes.get_errno(), "PR_CAPBSET_DROP")

    return subprocess.run([PYTHON, "-m", "profwatch.cli", "alerts", "--config", str(cfg)], env=python_env(),
                          capture_output=True, text=True, timeout=120,
                          preexec_fn=drop if os.geteuid() == 0 else None)


def test_offline_alerts_honour_the_state_db_permissions(tmp_path: Path, ports: dict[str, int]) -> None:
    """A db this user may not read: refused, naming who may. A readable db in a folder this user cannot write
    (no -shm index can be created there): read, and nothing is created or written."""
    cfg = _config(tmp_path, ports)
    state = tmp_path / "state"
    db = state / "state.db"
    _stored(db)
    other = 65534 if os.geteuid() == 0 else None  # under root: files owned by nobody, so the uid's bits are not ours
    if other is not None:
        os.chown(db, other, other)
    db.chmod(0o600 if other is not None else 0o000)
    try:
        res = _alerts_without_override(cfg)
        assert res.returncode == 3, res.stderr
        assert "may not read the state db" in res.stderr and "mode 0o" in res.stderr and res.stdout == ""
        db.chmod(0o644)
        if other is not None:
            os.chown(state, other, other)
        state.chmod(0o555)
        before = sorted(p.name for p in state.iterdir())
        res = _alerts_without_override(cfg)
        assert res.returncode == 0, res.stderr
        assert len(res.stdout.splitlines()) == 2 and "offline" in res.stderr
        assert sorted(p.name for p in state.iterdir()) == before  # nothing created or written
    finally:
        state.chmod(0o755)
        db.chmod(0o644)


# -- 1 and 3: real daemons ------------------------------------------------------------------------------------------
def test_node_hearing_nothing_from_a_busy_coordinator_says_so_with_the_last_answer(tmp_path: Path,
                                                                                   ports: dict[str, int]) -> None:
    """Issue 24 item 17: a coordinator that stops answering while connected (here: a real one, stopped with
    SIGSTOP, its socket still open) is not only "a wrong port": the node says wrong endpoint or overloaded, and
    when it last heard an answer."""
    cfg = _config(tmp_path, ports)
    node_log = tmp_path / "node.log"
    coord = _daemon("coordinator", cfg, tmp_path / "coordinator.log")
    node = None
    try:
        wait_for(lambda: _answers(f"tcp://127.0.0.1:{ports['control']}"), 60, 0.2, "coordinator control socket")
        node = _daemon("node", cfg, node_log)
        wait_for(lambda: "nodes:" in CliRunner().invoke(cli, ["status", "--config", str(cfg)]).output, 60, 0.5,
                 "the node registered")
        wait_for(lambda: any(e.get("event") == "coordinator_connected" for e in _log_events(node_log)), 60, 0.2,
                 "the node heard the coordinator")
        seen = len(_log_events(node_log))  # a loaded machine may have warned before the first answer already
        before = time.time()
        coord.send_signal(signal.SIGSTOP)  # busy: connected, never answering
        warned = wait_for(lambda: [e for e in _log_events(node_log)[seen:]
                                   if e.get("event") == "coordinator_unanswered"],
                          90, 0.2, "coordinator_unanswered in the node's log")
        w = warned[0]
        assert w["link"] == "connected", w
        assert w["likely_cause"].startswith("no answer: wrong endpoint, or the coordinator is overloaded"), w
        assert before - 30 < w["last_answer_unix_s"] <= before + 1 and w["last_answer"].endswith("Z"), w
    finally:
        coord.send_signal(signal.SIGCONT)
        if node is not None:
            finish_process(node, 20, terminate=True)
        finish_process(coord, 20, terminate=True)


def test_node_warns_when_unanswered_and_status_names_the_cause(tmp_path: Path, ports: dict[str, int]) -> None:
    """The node dials an ingest port nothing listens on: it warns with the likely cause; a coordinator on that
    port answers and the node says so; a coordinator that no node reaches says "no node connected"."""
    cfg = _config(tmp_path, ports)
    node_log, coord_log = tmp_path / "node.log", tmp_path / "coordinator.log"
    node = _daemon("node", cfg, node_log)
    coord = None
    try:
        warned = wait_for(lambda: [e for e in _log_events(node_log) if e.get("event") == "coordinator_unanswered"],
                          60, 0.2, "coordinator_unanswered in the node's log")
        assert warned[0]["link"] == "refused" and "nothing listens" in warned[0]["likely_cause"]
        assert warned[0]["coordinator"] == f"tcp://127.0.0.1:{ports['ingest']}"
        coord = _daemon("coordinator", cfg, coord_log)
        wait_for(lambda: any(e.get("event") == "coordinator_answering" for e in _log_events(node_log)), 60, 0.2,
                 "coordinator_answering in the node's log")
        wait_for(lambda: _answers(f"tcp://127.0.0.1:{ports['control']}"), 30, 0.2, "coordinator control socket")
        res = CliRunner().invoke(cli, ["status", "--config", str(cfg)])
        assert res.exit_code == 0 and "no node connected" not in res.output and "nodes:" in res.output
        finish_process(node, 20, terminate=True)
        finish_process(coord, 20, terminate=True)
        (tmp_path / "state" / "state.db").unlink()  # a fresh coordinator, on an ingest port no node dials
        other = _config(tmp_path, {**ports, "ingest": free_port()})
        coord = _daemon("coordinator", other, tmp_path / "other.log")
        wait_for(lambda: _answers(f"tcp://127.0.0.1:{ports['control']}"), 30, 0.2, "second coordinator")
        res = CliRunner().invoke(cli, ["status", "--config", str(other)])
        assert res.exit_code == 0, res.output
        assert "nodes: no node connected" in res.output and "[node] coordinator" in res.output
        assert "jobs: none" in res.output
    finally:
        for p in (node, coord):
            if p is not None:
                finish_process(p, 20, terminate=True)


def test_alerts_follow_says_where_it_listens(tmp_path: Path, ports: dict[str, int]) -> None:
    cfg = _config(tmp_path, ports)
    coord = _daemon("coordinator", cfg, tmp_path / "coordinator.log")
    follow = None
    try:
        wait_for(lambda: _answers(f"tcp://127.0.0.1:{ports['control']}"), 30, 0.2, "coordinator control socket")
        follow = subprocess.Popen([PYTHON, "-m", "profwatch.cli", "alerts", "--follow", "--job", "j7", "--config",
                                   str(cfg)], env=python_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True)
        assert follow.stderr is not None
        line = ""
        deadline = time.monotonic() + 60
        while "listening" not in line and time.monotonic() < deadline:
            line = follow.stderr.readline()
        assert line.strip() == (f"profwatch: listening on tcp://127.0.0.1:{ports['pub']} for alerts of job j7 "
                                "(Ctrl-C stops)"), line
        follow.send_signal(signal.SIGINT)
        assert follow.wait(30) == 0
    finally:
        if follow is not None:
            finish_process(follow, 10, terminate=True)
        finish_process(coord, 20, terminate=True)


def test_alerts_follow_notices_the_coordinator_stopping_and_coming_back(tmp_path: Path, ports: dict[str, int]) -> None:
    """Fresh-user finding: with the coordinator stopped, ``alerts --follow`` stayed silent (a quiet job and a dead
    coordinator looked alike). After ``--check-s`` of quiet it pings and says so, once each way."""
    import queue
    import threading

    cfg = _config(tmp_path, ports)
    coord = _daemon("coordinator", cfg, tmp_path / "coordinator.log")
    follow = coord2 = None
    lines: queue.Queue[str] = queue.Queue()

    def until(text: str, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                line = lines.get(timeout=0.2)
            except queue.Empty:
                continue
            if text in line:
                return line
        raise AssertionError(f"no stderr line with {text!r} within {timeout_s} s")

    try:
        wait_for(lambda: _answers(f"tcp://127.0.0.1:{ports['control']}"), 30, 0.2, "coordinator control socket")
        follow = subprocess.Popen([PYTHON, "-m", "profwatch.cli", "alerts", "--follow", "--check-s", "1", "--config",
                                   str(cfg)], env=python_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True)
        stream = follow.stderr
        assert stream is not None
        threading.Thread(target=lambda: [lines.put(x) for x in stream], daemon=True).start()
        until("listening on", 60)
        finish_process(coord, 20, terminate=True)
        line = until("stopped answering", 60)
        assert f"tcp://127.0.0.1:{ports['control']}" in line and "still listening" in line, line
        coord2 = _daemon("coordinator", cfg, tmp_path / "coordinator2.log")
        until("answers again", 90)
        assert follow.poll() is None  # it kept following throughout
        follow.send_signal(signal.SIGINT)
        assert follow.wait(30) == 0
    finally:
        if follow is not None:
            finish_process(follow, 10, terminate=True)
        for p in (coord, coord2):
            if p is not None:
                finish_process(p, 20, terminate=True)
