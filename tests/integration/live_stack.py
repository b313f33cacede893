"""A live coordinator and node daemons in threads, with real sockets, real CURVE keys and raw peers for the
adversary's side (helper for the security tests; not a test module)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import zmq

from profwatch.adapters.host_load import HostLoadSampler
from profwatch.adapters.zmq.control import call
from profwatch.adapters.zmq.curve import make_client
from profwatch.adapters.zmq.keyfiles import KeyPair, create_certificate, load_keypair, load_public_key
from profwatch.config import load_settings
from profwatch.coordinator import Coordinator
from profwatch.node import NodeDaemon
from profwatch.simulate.launcher import free_port
from rankhook import wire


def loopback_coordinator(root: Path, ports: dict[str, int]) -> dict[str, Any]:
    """The ``[coordinator]`` section of a test coordinator under ``root``: its ``ingest``/``control``/``pub`` sockets
    on those loopback ports, state db and work dir in ``root``, ``root/prof`` and ``root/cfg`` allowed, a 0.1 s
    tick (the harnesses add or override keys)."""
    return {"ingest_bind": f"tcp://127.0.0.1:{ports['ingest']}", "control_bind": f"tcp://127.0.0.1:{ports['control']}",
            "pub_bind": f"tcp://127.0.0.1:{ports['pub']}", "state_db": str(root / "state.db"),
            "work_dir": str(root / "work"), "allowed_prof_roots": [str(root / "prof")],
            "allowed_config_roots": [str(root / "cfg")], "tick_interval_s": 0.1}


class Keys:
    """A key directory laid out as ``profwatch keys init`` does, plus issued client certificates."""

    def __init__(self, root: Path) -> None:
        self.dir = root / "keys"
        self.clients = self.dir / "clients"
        self.issued = root / "issued"
        create_certificate(self.dir, "server", None)
        self.clients.mkdir()
        self.server_public = self.dir / "server.key"

    def issue(self, name: str, role: str, allowed: bool = True) -> Path:
        """Create a client certificate; with ``allowed`` its public key goes into ``clients/``. Returns the
        path of its secret certificate."""
        out = self.issued / ("ok" if allowed else "rogue")
        pub, sec = create_certificate(out, name, role)  # type: ignore[arg-type]
        if allowed:
            (self.clients / pub.name).write_bytes(pub.read_bytes())
        return sec

    def client(self, secret: Path, server_public: Path | None = None) -> tuple[KeyPair, bytes]:
        pair = load_keypair(secret, "client key", "")
        return pair, load_public_key(server_public or self.server_public, "server key", "")

    def security(self, secret: Path | None = None, **kw: Any) -> dict[str, Any]:
        """``[security]`` overrides for a daemon or CLI using these keys (CURVE on, even on loopback)."""
        d: dict[str, Any] = {"curve": "on", "keys_dir": str(self.dir), "selftest_timeout_s": 20.0}
        if secret is not None:
            d["client_secret_key"] = str(secret)
        d.update(kw)
        return d


class Stack:
    """Coordinator in a thread (``start``/``restart``), node daemons in threads, raw peers on demand."""

    def __init__(self, root: Path, security: dict[str, Any] | None = None, limits: dict[str, Any] | None = None,
                 sections: dict[str, Any] | None = None, **coordinator: Any) -> None:
        self.root = root
        self.ports = {k: free_port() for k in ("ingest", "control", "pub")}
        over = {**loopback_coordinator(root, self.ports), "registry_flush_s": 0.2}
        over.update(coordinator)
        self.security = security or {}
        self.limits = limits or {}
        self.settings = load_settings(None, coordinator=over, security=self.security, limits=self.limits,
                                      **(sections or {}))  # other config sections ([arming], [analysis]...)
        self.coord: Coordinator | None = None
        self.thread: threading.Thread | None = None
        self.nodes: dict[str, tuple[NodeDaemon, threading.Thread]] = {}
        self.ctx = zmq.Context()
        self._socks: list[zmq.Socket] = []

    # -- daemons -------------------------------------------------------------------------------------------------
    def start(self) -> Coordinator:
        self.coord = Coordinator(self.settings)
        self.thread = threading.Thread(target=self.coord.run, name="test-coordinator")
        self.thread.start()
        return self.coord

    def stop_coordinator(self) -> None:
        if self.coord is not None and self.thread is not None:
            self.coord.stop()
            self.thread.join(30)
            self.coord = None

    def node(self, node_id: str, security: dict[str, Any] | None = None, host_load: HostLoadSampler | None = None,
             **node: Any) -> NodeDaemon:
        over = {"node_id": node_id, "bind": f"ipc://{self.root}/{node_id}.sock",
                "coordinator": self.settings.coordinator.ingest_bind, "heartbeat_interval_s": 0.2,
                "allowed_config_roots": [str(self.root / "cfg")]}
        over.update(node)
        s = load_settings(None, node=over, security=security or {}, limits=self.limits)
        d = NodeDaemon(s.node, security=s.security, limits=s.limits, host_load=host_load)
        t = threading.Thread(target=d.run, name=f"test-node-{node_id}")
        t.start()
        self.nodes[node_id] = (d, t)
        return d

    def stop_node(self, node_id: str) -> None:
        d, t = self.nodes.pop(node_id)
        d.stop()
        t.join(30)

    # -- peers ---------------------------------------------------------------------------------------------------
    def push(self, node_id: str) -> zmq.Socket:
        """A rank-side PUSH to a node's socket."""
        s = self.ctx.socket(zmq.PUSH)
        s.setsockopt(zmq.LINGER, 1000)
        s.connect(f"ipc://{self.root}/{node_id}.sock")
        self._socks.append(s)
        return s

    def dealer(self, curve: tuple[KeyPair, bytes] | None = None) -> zmq.Socket:
        """A raw node-side DEALER to ingest (an adversary, or an old node daemon)."""
        s = self.ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 1000)
        if curve is not None:
            make_client(s, *curve)
        s.connect(self.settings.coordinator.ingest_bind)
        self._socks.append(s)
        return s

    def control(self, cmd: str, args: dict[str, Any] | None = None, curve: tuple[KeyPair, bytes] | None = None,
                timeout_s: float = 10.0) -> Any:
        return call(self.settings.coordinator.control_bind, cmd, args, timeout_s=timeout_s, curve=curve)

    def close(self) -> None:
        for node_id in list(self.nodes):
            self.stop_node(node_id)
        self.stop_coordinator()
        for s in self._socks:
            s.close(0)
        self.ctx.term()


def batch(node_id: str, *msgs: Any, seq: int = 1) -> bytes:
    return wire.encode(wire.NodeBatch(node_id=node_id, hostname="h", seq=seq, ts_unix_s=time.time(),
                                      messages=[wire.to_dict(m) for m in msgs]))


def hello(job: str, rank: int, world: int = 2, root: Path | None = None, **kw: Any) -> wire.RankHello:
    fields: dict[str, Any] = {"job_id": job, "rank": rank, "local_rank": rank, "world_size": world, "hostname": "h",
                              "pid": 100 + rank, "backend": "torch", "ts_unix_s": time.time() - 5}
    if root is not None:
        fields |= {"profiler_config_path": str(root / "cfg" / job), "prof_root": str(root / "prof")}
    fields.update(kw)
    return wire.RankHello(**fields)


def step(job: str, rank: int, s: int, t: float = 0.1) -> wire.StepReport:
    return wire.StepReport(job_id=job, rank=rank, step=s, step_time_s=t, ts_unix_s=time.time())


def rank_view(status: dict[str, Any], job: str) -> dict[int, dict[str, Any]]:
    """``{rank: rank row}`` of one job in a status snapshot ({} when the job is unknown)."""
    for j in status.get("jobs", []):
        if j["job_id"] == job:
            return {r["rank"]: r for r in j["ranks"]}
    return {}


def job_view(status: dict[str, Any], job: str) -> dict[str, Any] | None:
    return next((j for j in status.get("jobs", []) if j["job_id"] == job), None)


def raw(d: dict[str, Any]) -> bytes:
    return json.dumps(d).encode()
