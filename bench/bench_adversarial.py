"""Adversarial run against live daemons: floods, other encodings, identity claims and control misuse, five rounds.

A real ``profwatch coordinator`` and a real ``profwatch node`` run as subprocesses with CURVE on (loopback, keys
made for the run). One honest rank reports steps through the node the whole time. Each round sends, as a local
process on the node socket and as a second authenticated node ("nodeB") and as unauthenticated clients:

- hello floods for new jobs claiming 2**20 ranks each, with one step each;
- rank messages in UTF-16, UTF-32, with a BOM, with invalid UTF-8, with lone surrogates, with lax types
  (``rank: "1"``, ``rank: true``) and absurd values (``step_time_s: 1e308``), and 300 KiB (over the limit);
- 24 batches of ~3.7 MB from nodeB (rank records for up to 2**20 ranks) and 24 batches of 15 MB (over the limit);
- identity claims: nodeB's key speaking for nodeA, nodeB speaking for nodeA's ranks, an unknown key, a client
  without CURVE; control: a read key trying ``set_thresholds`` and ``arm``, unknown commands.

After each round it checks for harm (each item that got through counts one): honest steps lost, the honest
job's paths, node binding or step times changed, jobs beyond the caps, node ids other than nodeA/nodeB, arming
switched off, a daemon gone, a failed registry flush. Prints inputs tried, handled (refused or dropped by a
daemon, by their own counters), harmful (goal 0), the records the coordinator holds after each round (jobs, ranks,
nodes: the caps stop their growth in round 1), its RSS after each round and its peak (goal: no growth trend; CPython
rarely returns freed memory to the OS, so RSS wanders).

Then the kinds of issue 33, each tried against real processes and counted by kind as harmful (it did damage or
was accepted) or silent (nothing counted, logged or answered; a hang): a batch over the ingest cap (counted from
the disconnect), a control request over the cap and one naming a key twice, a state_db that is not profwatch's (a
text file, a FIFO, a directory, a device, another program's SQLite db, a profwatch db with its header destroyed),
two sockets on one endpoint and an endpoint held by another process, replay of a line without end and of more jobs
than the cap, a rank that may not write the node socket (as root), rank messages over the node's 512 KiB cap
(counted from the node socket's disconnects), a replay --config that is a device or a FIFO (refused unread). Goal:
0 harmful, 0 silent.

Usage: python bench/bench_adversarial.py [--rounds 5] [--hellos 2000] [--kinds-only]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import zmq

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "daemon"))

from profwatch.adapters.zmq.control import ControlError, call  # noqa: E402
from profwatch.adapters.zmq.curve import make_client  # noqa: E402
from profwatch.adapters.zmq.keyfiles import create_certificate, load_keypair, load_public_key  # noqa: E402
from profwatch.simulate.launcher import free_port  # noqa: E402
from rankhook import wire  # noqa: E402

PER_BATCH = 22_000
"""Rank messages in one of nodeB's big batches (~3.7 MB: under the 4 MiB MAXMSGSIZE, which would drop it unread)."""




def _rss_mib(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of a process in MiB."""
    vals = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(("VmRSS:", "VmHWM:")):
            k, v = line.split(":", 1)
            vals[k] = int(v.split()[0]) / 1024
    return vals.get("VmRSS", 0.0), vals.get("VmHWM", 0.0)


def _metric_sum(text: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


def _scrape(port: int) -> str:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return str(r.read().decode())


class Run:
    def __init__(self, root: Path) -> None:
        self.root = root
        kd = root / "keys"
        create_certificate(kd, "server", None)
        (kd / "clients").mkdir()
        self.secrets: dict[str, Path] = {}
        for name, role, allowed in (("nodeA", "node", True), ("nodeB", "node", True), ("ops", "read", True),
                                    ("admin", "act", True), ("mallory", "act", False)):
            pub, sec = create_certificate(root / ("issued" if allowed else "rogue"), name, role)  # type: ignore[arg-type]
            if allowed:
                (kd / "clients" / pub.name).write_bytes(pub.read_bytes())
            self.secrets[name] = sec
        self.server_pub = load_public_key(kd / "server.key", "", "")
        self.ports = {k: free_port() for k in ("ingest", "control", "pub", "cm", "nm")}
        self.control_ep = f"tcp://127.0.0.1:{self.ports['control']}"
        cfg = root / "pw.toml"
        cfg.write_text(f"""
[coordinator]
ingest_bind = "tcp://127.0.0.1:{self.ports['ingest']}"
control_bind = "{self.control_ep}"
pub_bind = "tcp://127.0.0.1:{self.ports['pub']}"
state_db = "{root}/state.db"
work_dir = "{root}/work"
allowed_prof_roots = ["{root}/prof"]
allowed_config_roots = ["{root}/cfg"]
metrics_port = {self.ports['cm']}
[node]
node_id = "nodeA"
bind = "ipc://{root}/node.sock"
coordinator = "tcp://127.0.0.1:{self.ports['ingest']}"
metrics_port = {self.ports['nm']}
[security]
curve = "on"
keys_dir = "{kd}"
client_secret_key = "{self.secrets['nodeA']}"
[logging]
format = "console"
""")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "daemon"), str(REPO)]), TORCH_DEVICE_BACKEND_AUTOLOAD="0")
        self.logs = {n: open(root / f"{n}.log", "wb") for n in ("coordinator", "node")}  # noqa: SIM115
        self.coord = subprocess.Popen([sys.executable, "-m", "profwatch.cli", "coordinator", "--config", str(cfg)],
                                      env=env, stdout=self.logs["coordinator"], stderr=subprocess.STDOUT,
                                      start_new_session=True)
        self._wait(lambda: self.control("ping"), "coordinator")
        self.node = subprocess.Popen([sys.executable, "-m", "profwatch.cli", "node", "--config", str(cfg)], env=env,
                                     stdout=self.logs["node"], stderr=subprocess.STDOUT, start_new_session=True)
        self.ctx = zmq.Context()
        self.honest = self._push()
        self.evil = self._push()
        self.node_b = self._dealer("nodeB")
        self.node_b_oversize = self._dealer("nodeB")  # its own connection: ZeroMQ closes it at each oversize message
        self.honest_sent: list[int] = []
        self.tried = 0
        self.dropped_by_transport = 0
        self.control_refused = 0
        self.paths = {"profiler_config_path": f"{root}/cfg/honest", "prof_root": f"{root}/prof"}
        self.honest.send_multipart(wire.frames(self._hello("honest", 0, 1, **self.paths)))
        self._wait(lambda: self._job("honest"), "honest job registered")

    # -- plumbing ------------------------------------------------------------------------------------------------
    def control(self, cmd: str, args: dict[str, Any] | None = None, key: str = "ops") -> Any:
        try:
            return call(self.control_ep, cmd, args, timeout_s=10,
                        curve=(load_keypair(self.secrets[key], "", ""), self.server_pub))
        except ControlError:
            return None

    @staticmethod
    def _wait(pred: Any, what: str, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not pred():
            if time.monotonic() > deadline:
                raise SystemExit(f"bench: timed out waiting for {what}")
            time.sleep(0.1)

    def _push(self) -> zmq.Socket:
        s = self.ctx.socket(zmq.PUSH)
        s.setsockopt(zmq.LINGER, 2000)
        s.setsockopt(zmq.SNDHWM, 1_000_000)
        s.connect(f"ipc://{self.root}/node.sock")
        return s

    def _dealer(self, key: str | None) -> zmq.Socket:
        s = self.ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.SNDHWM, 1000)
        if key is not None:
            make_client(s, load_keypair(self.secrets[key], "", ""), self.server_pub)
        s.connect(f"tcp://127.0.0.1:{self.ports['ingest']}")
        return s

    @staticmethod
    def _hello(job: str, rank: int, world: int, **kw: Any) -> wire.RankHello:
        fields: dict[str, Any] = {"job_id": job, "rank": rank, "local_rank": 0, "world_size": world,
                                  "hostname": "bench", "pid": 4242, "backend": "none", "ts_unix_s": time.time()}
        return wire.RankHello(**(fields | kw))

    def _job(self, job: str) -> dict[str, Any] | None:
        st = self.control("status", {"job_id": job})
        return st["jobs"][0] if st and st["jobs"] else None

    def _honest_step(self) -> None:
        s = len(self.honest_sent) + 1
        self.honest.send_multipart(wire.frames(wire.StepReport(job_id="honest", rank=0, step=s, step_time_s=0.1,
                                                               ts_unix_s=time.time())))
        self.honest_sent.append(s)

    def _evil(self, payload: bytes) -> None:
        self.evil.send_multipart([b"profwatch.x", payload])
        self.tried += 1

    # -- one round -----------------------------------------------------------------------------------------------
    def round(self, r: int, hellos: int) -> None:
        base = wire.to_dict(wire.StepReport(job_id="honest", rank=0, step=1, step_time_s=0.1, ts_unix_s=time.time()))
        text = json.dumps(base)
        for i in range(hellos):  # hello flood: new jobs claiming 2**20 ranks, one step each
            job = f"flood{r}x{i}"
            self._evil(wire.encode(self._hello(job, 0, 1 << 20)))
            self._evil(wire.encode(wire.StepReport(job_id=job, rank=12345, step=1, step_time_s=0.1,
                                                   ts_unix_s=time.time())))
            if i % 20 == 0:
                self._honest_step()
        bad = [text.encode("utf-16"), text.encode("utf-16-le"), text.encode("utf-32"), b"\xef\xbb\xbf" + text.encode(),
               text.replace('"honest"', '"hon\\ud800est"').encode(), text.replace('"honest"', '"hon\xffest"').encode("latin-1"),
               json.dumps(base | {"rank": "0"}).encode(), json.dumps(base | {"rank": True}).encode(),
               json.dumps(base | {"step_time_s": 1e308}).encode(), json.dumps(base | {"step": 10**9, "stages": {"x": 1e300}}).encode(),
               json.dumps(wire.to_dict(self._hello("honest", 0, 1, hostname="\ud800", **self.paths))).encode(),
               json.dumps(wire.to_dict(self._hello("honest", 0, 1, profiler_config_path="/etc",
                                                   prof_root="/"))).encode(),
               b"[" * 100_000, b"x" * (300 * 1024)]
        for _ in range(20):
            for payload in bad:
                self._evil(payload)
            self._honest_step()
        # nodeB: valid key, floods of big batches (rank records) and oversize ones, and lies about identity
        for b in range(24):
            msgs = ",".join(json.dumps({"kind": "step", "v": 1, "job_id": f"bjob{r}", "rank": b * PER_BATCH + k, "step": 1,
                                        "step_time_s": 0.1, "ts_unix_s": time.time()}) for k in range(PER_BATCH))
            head = {"kind": "node_batch", "v": 1, "node_id": "nodeB", "hostname": "b", "seq": r * 100 + b, "ts_unix_s": 1}
            if b == 0:
                self.node_b.send(wire.encode(wire.NodeBatch(node_id="nodeB", hostname="b", seq=r * 100, ts_unix_s=1.0,
                                                            messages=[wire.to_dict(self._hello(f"bjob{r}", 0, 1 << 20))])))
                self.tried += 1
            self.node_b.send(json.dumps(head)[:-1].encode() + b',"messages":[' + msgs.encode() + b"]}")
            self.node_b_oversize.send(b" " * (15 * 1024 * 1024))  # over MAXMSGSIZE: ZeroMQ drops it
            self.tried += PER_BATCH + 1  # every rank message counts as one input
            self.dropped_by_transport += 1
            self._honest_step()
        for env in (wire.NodeHeartbeat(node_id="nodeA", hostname="x", pid=1, ts_unix_s=1.0, started_unix_s=1.0),
                    wire.NodeBatch(node_id="nodeA", hostname="x", seq=1, ts_unix_s=1.0,
                                   messages=[wire.to_dict(self._hello("honest", 0, 1, prof_root="/tmp"))]),
                    wire.NodeBatch(node_id="nodeB", hostname="b", seq=r * 100 + 99, ts_unix_s=1.0,
                                   messages=[wire.to_dict(wire.StepReport(job_id="honest", rank=0, step=10**6,
                                                                          step_time_s=999.0, ts_unix_s=1.0))])):
            self.node_b.send(wire.encode(env))
            self.tried += 1
        for key in ("mallory", None):  # unknown key, no CURVE: the handshake never completes
            d = self._dealer(key)
            d.send(wire.encode(wire.NodeHeartbeat(node_id="nodeA", hostname="x", pid=1, ts_unix_s=1.0,
                                                  started_unix_s=1.0)))
            self.tried += 1
            time.sleep(0.2)
            d.close(0)
        for cmd, args in (("set_thresholds", {"arming": {"mode": "off"}}), ("arm", {"job_id": "honest"}),
                          ("close", {}), ("_flush_registry", {})):
            self.tried += 1
            try:
                call(self.control_ep, cmd, args, timeout_s=10,
                     curve=(load_keypair(self.secrets["ops"], "", ""), self.server_pub))
            except ControlError as exc:
                self.control_refused += exc.code in ("denied", "unknown_command")
        for _ in range(50):
            self._honest_step()

    def harm(self) -> dict[str, int]:
        """Count what got through (0 everywhere is the goal)."""
        harm: dict[str, int] = {}
        last = self.honest_sent[-1]
        self._wait(lambda: (j := self._job("honest")) is not None and j["furthest_step"] >= last or self.coord.poll() is not None,
                   "honest steps", 120)
        jsonl = self.control("dump_telemetry", {"job_id": "honest"}) or ""
        got = {json.loads(x)["step"] for x in jsonl.splitlines() if '"step"' in x}
        harm["honest_steps_lost"] = len(set(self.honest_sent[-1000:]) - got)
        if os.environ.get("BENCH_DEBUG") and harm["honest_steps_lost"]:
            print("missing", sorted(set(self.honest_sent[-1000:]) - got)[:50], "got", sorted(got)[:30])
            for port in ("nm", "cm"):
                print(port, [x for x in _scrape(self.ports[port]).splitlines() if x.startswith(("profwatch_dropped", "profwatch_rejected"))])
        job = self._job("honest") or {}
        harm["honest_paths_changed"] = int(any(job.get(k) != v for k, v in self.paths.items()))
        harm["honest_rank_hijacked"] = sum(1 for r in job.get("ranks", []) if r["node_id"] != "nodeA"
                                           or r["step_time_s"] > 1.0 or r["hostname"] != "bench")
        st = self.control("status") or {"jobs": [], "nodes": []}
        harm["jobs_over_cap"] = max(0, len(st["jobs"]) - 1024)
        per_node: dict[str, int] = {}
        for j in st["jobs"]:
            for n in {r["node_id"] for r in j["ranks"]}:
                per_node[n] = per_node.get(n, 0) + 1
        harm["jobs_over_node_cap"] = sum(max(0, v - 64) for v in per_node.values())
        harm["unknown_node_ids"] = len({n["node_id"] for n in st["nodes"]} - {"nodeA", "nodeB"})
        settings = self.control("set_thresholds", {}, key="admin") or {}  # an act key reads the current values
        harm["arming_switched"] = int(settings.get("arming", {}).get("mode") != "act")
        harm["daemon_exited"] = int(self.coord.poll() is not None) + int(self.node.poll() is not None)
        harm["registry_flush_failed"] = (self.root / "coordinator.log").read_text(errors="replace").count(
            "registry_flush_failed")
        return harm

    def handled(self) -> dict[str, int]:
        """Inputs the daemons refused or dropped, by their own counters (a refused handshake counts once per
        connection attempt, so a client that retries is counted more than once)."""
        coord, node = _scrape(self.ports["cm"]), _scrape(self.ports["nm"])
        parts = {"coordinator_rejected": int(_metric_sum(coord, "profwatch_rejected_total")),
                 "node_rejected": int(_metric_sum(node, "profwatch_rejected_total")),
                 "auth_refused": int(_metric_sum(coord, "profwatch_auth_refused_total")),
                 "dropped_by_transport": self.dropped_by_transport, "control_refused": self.control_refused}
        parts["total"] = sum(parts.values())
        return parts

    def close(self) -> None:
        for s in (self.honest, self.evil, self.node_b, self.node_b_oversize):
            s.close(0)
        self.ctx.term()
        for p in (self.node, self.coord):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in (self.node, self.coord):
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=30)
        for f in self.logs.values():
            f.close()


def _cli(args: list[str], timeout_s: float = 60.0, **kw: Any) -> tuple[int | None, str]:
    """Run ``profwatch ARGS``: (exit code, or None when it ran past ``timeout_s``; its output)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "daemon"), str(REPO)]))
    try:
        res = subprocess.run([sys.executable, "-m", "profwatch.cli", *args], env=env, capture_output=True, text=True,
                             timeout=timeout_s, **kw)
    except subprocess.TimeoutExpired:
        return None, ""
    return res.returncode, res.stdout + res.stderr


def _coord_cfg(root: Path, **over: str) -> Path:
    ports = [free_port() for _ in range(4)]
    keys = {"ingest_bind": f"tcp://127.0.0.1:{ports[0]}", "control_bind": f"tcp://127.0.0.1:{ports[1]}",
            "pub_bind": f"tcp://127.0.0.1:{ports[2]}", "state_db": str(root / "state.db"), "work_dir": str(root / "w")}
    cfg = root / "c.toml"
    cfg.write_text("[coordinator]\n" + "".join(f'{k} = "{v}"\n' for k, v in (keys | over).items())
                   + f"metrics_port = {ports[3]}\n")
    return cfg


def issue33_kinds(run: Run | None, root: Path) -> dict[str, dict[str, int]]:
    """Try each kind of issue 33 (module doc); returns {kind: {"tried", "harmful", "silent"}}."""
    import sqlite3

    out: dict[str, dict[str, int]] = {}

    def note(kind: str, harmful: bool, silent: bool) -> None:
        k = out.setdefault(kind, {"tried": 0, "harmful": 0, "silent": 0})
        k["tried"] += 1
        k["harmful"] += int(harmful)
        k["silent"] += int(silent)

    if run is not None:  # the rounds' oversize batches: each one closed its connection, which is counted
        closed = _metric_sum(_scrape(run.ports["cm"]), "profwatch_connections_closed_total")
        for i in range(run.dropped_by_transport):
            note("oversize_batch", False, i >= closed)
        try:  # over the control cap: the client refuses it at once
            call(run.control_ep, "status", {"job_id": "x" * (2 << 20)}, timeout_s=10,
                 curve=(load_keypair(run.secrets["ops"], "", ""), run.server_pub))
            note("control_oversize", True, False)
        except ControlError as exc:
            note("control_oversize", False, exc.code != "request_too_large")
        req = zmq.Context.instance().socket(zmq.REQ)  # a key named twice: refused, not last-wins
        req.setsockopt(zmq.LINGER, 0)
        req.setsockopt(zmq.RCVTIMEO, 10_000)
        make_client(req, load_keypair(run.secrets["admin"], "", ""), run.server_pub)
        req.connect(run.control_ep)
        req.send(b'{"cmd": "set_thresholds", "args": {"arming": {"mode": "act"}, "arming": {"mode": "off"}}}')
        try:
            reply = json.loads(req.recv())
            note("control_duplicate_keys", reply.get("ok") is True, "duplicate key" not in str(reply))
        except zmq.Again:
            note("control_duplicate_keys", False, True)
        req.close(0)
        # rank messages over the node's 512 KiB MAXMSGSIZE: libzmq drops each with its connection; the node counts
        # them from its socket monitor (profwatch_rank_connections_dropped_total) and the PUSH reconnects
        from profwatch.node import RANK_MAXMSGSIZE

        push = run._push()
        for _ in range(3):
            run._honest_step()  # a live rank keeps stepping (a bye the rounds sent from this process is void)
            last = run.honest_sent[-1]
            run._wait(lambda: (run._job("honest") or {}).get("furthest_step", 0) >= last, "honest step")  # noqa: B023
            before = _metric_sum(_scrape(run.ports["nm"]), "profwatch_rank_connections_dropped_total")
            push.send_multipart([b"t", b" " * (RANK_MAXMSGSIZE + 1)])
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and \
                    _metric_sum(_scrape(run.ports["nm"]), "profwatch_rank_connections_dropped_total") <= before:
                time.sleep(0.1)
            after = _metric_sum(_scrape(run.ports["nm"]), "profwatch_rank_connections_dropped_total")
            note("rank_oversize", False, after <= before)
        push.close(0)
    for kind in ("device", "fifo"):  # bounded readers: a --config that is not a regular file is refused unread
        cfg = root / f"config-{kind}.toml"
        if kind == "device":
            cfg.symlink_to("/dev/zero")
        else:
            os.mkfifo(cfg)
        tele = root / f"tele-{kind}.jsonl"
        tele.write_text(json.dumps({"job_id": "j", "rank": 0, "world_size": 1, "step": 1, "step_time_s": 0.5,
                                    "ts_unix_s": 1.7e9}) + "\n")
        code, text = _cli(["replay", "--config", str(cfg), str(tele)], timeout_s=60)
        note(f"replay_config_{kind}", code is None, code != 2 or "not a regular file" not in text)
    for kind in ("toml", "fifo", "directory", "device", "foreign_db", "profwatch_header_destroyed"):
        d = root / f"db-{kind}"
        d.mkdir()
        p = d / "state.db"
        if kind == "toml":
            p.write_text('[coordinator]\nstate_db = "x"\n')
        elif kind == "fifo":
            os.mkfifo(p)
        elif kind == "directory":
            p.mkdir()
        elif kind == "device":
            p.symlink_to("/dev/null")
        else:
            con = sqlite3.connect(p)
            con.execute("CREATE TABLE captures (x)" if kind.startswith("profwatch") else "CREATE TABLE notes (x)")
            con.execute("CREATE TABLE events (x)" if kind.startswith("profwatch") else "CREATE TABLE other (x)")
            con.execute(f"PRAGMA application_id={0x50465743 if kind.startswith('profwatch') else 7}")
            con.commit()
            con.close()
            if kind.startswith("profwatch"):
                with open(p, "r+b") as f:
                    f.write(b"\0" * 16)
        before = sorted(x.name for x in d.iterdir())
        code, text = _cli(["coordinator", "--config", str(_coord_cfg(d))])
        moved = sorted(x.name for x in d.iterdir() if x.name not in ("c.toml", "w")) != before
        note(f"state_db_{kind}", moved or code == 0, code is None or str(p) not in text)
    for kind in ("same_endpoint", "endpoint_held"):
        d = root / kind
        d.mkdir()
        held = socket.socket()
        held.bind(("127.0.0.1", 0))
        held.listen()
        ep = f"tcp://127.0.0.1:{held.getsockname()[1]}"
        cfg = _coord_cfg(d, control_bind=ep, **({"ingest_bind": ep} if kind == "same_endpoint" else {}))
        if kind == "same_endpoint":
            held.close()
        code, text = _cli(["coordinator", "--config", str(cfg)])
        held.close()
        note(f"start_{kind}", code == 0, code != 2 or "coordinator.control_bind" not in text)
    zero = root / "zero.jsonl"
    zero.symlink_to("/dev/zero")
    code, text = _cli(["replay", str(zero)], timeout_s=120)
    note("replay_line_without_end", code is None, code != 2)
    many = root / "jobs.jsonl"
    many.write_text("\n".join(json.dumps({"job_id": f"j{i}", "rank": 0, "world_size": 1, "step": 1, "step_time_s": 0.5,
                                          "ts_unix_s": 1.7e9}) for i in range(3000)) + "\n")
    code, text = _cli(["replay", "--json", str(many)], timeout_s=300)
    res = json.loads(text[text.index("{"):]) if code == 0 else {}
    note("replay_job_cap", len(res.get("jobs", {})) > 1024, res.get("bad_lines", {}).get("count") != 3000 - 1024)
    if os.getuid() == 0:  # a rank process that may not write the node socket (run as nobody) says so on stderr
        ctx = zmq.Context()
        pull = ctx.socket(zmq.PULL)
        pull.setsockopt(zmq.LINGER, 0)
        root.chmod(0o755)
        pull.bind(f"ipc://{root}/n.sock")
        os.chmod(root / "n.sock", 0o660)
        script = ("import os,sys,zmq,grp,pwd\nfrom rankhook.publisher import Publisher\nos.setgid(65534)\n"
                  "os.setgroups([])\nos.setuid(65534)\np=Publisher(sys.argv[1])\np.send(b't', b'{}')\np.close()\n")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "daemon"), str(REPO)]))
        r = subprocess.run([sys.executable, "-c", script, f"ipc://{root}/n.sock"], env=env, capture_output=True,
                           text=True, timeout=60)
        note("hook_permission", False, "permission denied" not in r.stderr)
        pull.close(0)
        ctx.term()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--hellos", type=int, default=2000, help="new-job hellos per round")
    ap.add_argument("--kinds-only", action="store_true", help="only the issue 33 kinds (no rounds)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="pwadv", dir="/tmp") as tmp:
        if args.kinds_only:
            _report_kinds(issue33_kinds(None, Path(tmp)))
            return
        run = Run(Path(tmp))
        try:
            rss0, _ = _rss_mib(run.coord.pid)
            print(f"coordinator RSS at start: {rss0:.1f} MiB")
            total_harm: dict[str, int] = {}
            for r in range(args.rounds):
                t0 = time.monotonic()
                run.round(r, args.hellos)
                harm = run.harm()
                for k, v in harm.items():
                    total_harm[k] = total_harm.get(k, 0) + v
                rss, hwm = _rss_mib(run.coord.pid)
                nrss, _ = _rss_mib(run.node.pid)
                b = (run.control("status") or {}).get("bounds", {})
                held = f"jobs={b.get('jobs')} ranks={b.get('ranks')} nodes={b.get('nodes')}"
                print(f"round {r + 1}: {time.monotonic() - t0:5.1f}s  tried={run.tried}  held {held}  coordinator "
                      f"RSS={rss:.1f} MiB (peak {hwm:.1f})  node RSS={nrss:.1f} MiB  harmful={sum(harm.values())} "
                      f"{harm if any(harm.values()) else ''}")
            _, hwm = _rss_mib(run.coord.pid)
            print(f"inputs tried: {run.tried}")
            handled = run.handled()
            print(f"handled (refused or dropped, by the daemons' counters): {handled.pop('total')}  {handled}")
            print(f"harmful: {sum(total_harm.values())}  {total_harm}")
            print(f"coordinator peak RSS: {hwm:.1f} MiB")
            kinds_dir = Path(tmp) / "kinds"
            kinds_dir.mkdir()
            _report_kinds(issue33_kinds(run, kinds_dir))
        finally:
            run.close()


def _report_kinds(kinds: dict[str, dict[str, int]]) -> None:
    print("issue 33 kinds (tried / harmful / silent):")
    for kind, c in kinds.items():
        print(f"  {kind:32s} {c['tried']:4d} {c['harmful']:4d} {c['silent']:4d}")
    print(f"kinds: harmful {sum(c['harmful'] for c in kinds.values())}, silent {sum(c['silent'] for c in kinds.values())}")


if __name__ == "__main__":
    main()
