"""Revocation delay (issue 24 item 13): how long a key removed from ``clients/`` (or edited in place) keeps working
on a connection that is already open, for each role, against a live coordinator over CURVE on loopback.

For each round: a raw node DEALER sends a heartbeat every 10 ms, a ``read`` key's REQ sends ``ping`` every 10 ms,
a ``read`` key's SUB is subscribed; then the three public keys are removed (round 1 and odd rounds) or overwritten
in place by another key of the same name (even rounds) and the time to the first refused heartbeat
(``profwatch_auth_refused_total{socket="ingest",reason="revoked"}``), the first denied ping and the SUB's
disconnect is printed. Goal: under 1 s for every role. Also the cost of the per-message check
(``ServerSockets.admitted``) on a received frame.

Run from the repo root: ``python bench/bench_revocation.py [--rounds 5]``.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import zmq

from profwatch.adapters.zmq.curve import HandshakeMonitor, make_client
from profwatch.adapters.zmq.keyfiles import create_certificate, load_keypair, load_public_key
from profwatch.config import load_settings
from profwatch.coordinator import Coordinator
from profwatch.simulate.launcher import free_port
from rankhook import wire


def one_round(root: Path, in_place: bool) -> dict[str, float]:
    keys, issued = root / "keys", root / "issued"
    create_certificate(keys, "server", None)
    (keys / "clients").mkdir()
    secrets = {}
    for name, role in (("nodeA", "node"), ("alice", "read"), ("sub", "read")):
        pub, secrets[name] = create_certificate(issued, name, role)  # type: ignore[arg-type]
        shutil.copy(pub, keys / "clients" / pub.name)
    binds = {k: f"tcp://127.0.0.1:{free_port()}" for k in ("ingest", "control", "pub")}
    settings = load_settings(None, coordinator={
        "ingest_bind": binds["ingest"], "control_bind": binds["control"], "pub_bind": binds["pub"],
        "state_db": str(root / "state.db"), "work_dir": str(root / "work"), "allowed_prof_roots": [str(root)],
        "allowed_config_roots": [str(root)]}, security={"curve": "on", "keys_dir": str(keys)})
    coord = Coordinator(settings)
    thread = threading.Thread(target=coord.run)
    thread.start()
    ctx = zmq.Context()
    server = load_public_key(keys / "server.key", "", "")

    def client(kind: int, name: str, ep: str) -> zmq.Socket:
        s = ctx.socket(kind)
        s.linger = 0
        make_client(s, load_keypair(secrets[name], "", ""), server)
        if kind == zmq.SUB:
            s.subscribe(b"profwatch.")
        s.connect(ep)
        return s

    node, req, sub = (client(zmq.DEALER, "nodeA", binds["ingest"]), client(zmq.REQ, "alice", binds["control"]),
                      client(zmq.SUB, "sub", binds["pub"]))
    mon = HandshakeMonitor(sub)
    reg = coord.metrics.registry

    def refused() -> float:
        return reg.get_sample_value("profwatch_auth_refused_total", {"socket": "ingest", "reason": "revoked"}) or 0.0

    def ping() -> bool:
        req.send_json({"cmd": "ping", "args": {}})
        if not req.poll(5000):
            raise RuntimeError("no reply")
        reply: dict[str, Any] = req.recv_json()  # type: ignore[assignment]
        return bool(reply["ok"])

    def heartbeat() -> None:
        node.send(wire.encode(wire.NodeHeartbeat(node_id="nodeA", hostname="h", pid=1, ts_unix_s=time.time(),
                                                    started_unix_s=time.time())),
                  zmq.NOBLOCK)

    out: dict[str, float] = {}
    try:
        deadline = time.monotonic() + 20
        while not (ping() and mon.succeeded) and time.monotonic() < deadline:
            mon.poll()
            heartbeat()
            time.sleep(0.01)
        for _ in range(20):  # the subscriber must have subscribed (the XPUB learns its key)
            heartbeat()
            time.sleep(0.01)
        for name in ("nodeA", "alice", "sub"):
            target = keys / "clients" / f"{name}.key"
            if in_place:
                other, _ = create_certificate(root / "rekey", name, "read" if name != "nodeA" else "node")
                with open(target, "r+b") as f:
                    body = other.read_bytes()
                    f.write(body)
                    f.truncate(len(body))
            else:
                target.unlink()
        t0 = time.monotonic()
        base = refused()
        pending = {"node", "control", "pub"}
        while pending and time.monotonic() - t0 < 10:
            heartbeat()
            if "node" in pending and refused() > base:
                out["node"] = time.monotonic() - t0
                pending.discard("node")
            if "control" in pending and not ping():
                out["control"] = time.monotonic() - t0
                pending.discard("control")
            if "pub" in pending and any(ev == "EVENT_DISCONNECTED" for ev, _v, _f in mon.poll()):
                out["pub"] = time.monotonic() - t0
                pending.discard("pub")
            time.sleep(0.01)
        for p in pending:
            out[p] = float("nan")
    finally:
        mon.close()
        for s in (node, req, sub):
            s.close(0)
        ctx.term()
        coord.stop()
        thread.join(30)
    return out


def check_cost(n: int = 100_000) -> float:
    """Microseconds per ``ServerSockets.admitted`` call on a received CURVE frame (key ring of 1000 keys)."""
    with tempfile.TemporaryDirectory(prefix="pwrev") as tmp:
        root = Path(tmp)
        keys = root / "keys"
        create_certificate(keys, "server", None)
        (keys / "clients").mkdir()
        for i in range(999):
            pub, _ = create_certificate(root / "many", f"n{i}", "node")
            shutil.copy(pub, keys / "clients" / pub.name)
        pub, sec = create_certificate(root / "many", "nodeA", "node")
        shutil.copy(pub, keys / "clients" / pub.name)
        ep = f"tcp://127.0.0.1:{free_port()}"
        settings = load_settings(None, coordinator={"ingest_bind": ep, "control_bind": f"tcp://127.0.0.1:{free_port()}",
                                                    "pub_bind": f"tcp://127.0.0.1:{free_port()}",
                                                    "state_db": str(root / "s.db"), "work_dir": str(root / "w")},
                                 security={"curve": "on", "keys_dir": str(keys)})
        coord = Coordinator(settings)
        ctx = zmq.Context()
        d = ctx.socket(zmq.DEALER)
        d.linger = 0
        make_client(d, load_keypair(sec, "", ""), load_public_key(keys / "server.key", "", ""))
        d.connect(ep)
        d.send(b"x")
        if not coord.ingest.poll(10_000):
            raise RuntimeError("nothing received")
        frame: Any = coord.ingest.recv_multipart(copy=False)[-1]
        t = time.perf_counter()
        for _ in range(n):
            coord.sockets.admitted(frame, "ingest")
        per = (time.perf_counter() - t) / n * 1e6
        t = time.perf_counter()
        coord.sockets.keyring.refresh(force=True)  # type: ignore[union-attr]
        rescan_ms = (time.perf_counter() - t) * 1e3
        print(f"re-check of a 1000-key ring (stat of every file): {rescan_ms:.2f} ms, every 0.5 s at most")
        d.close(0)
        ctx.term()
        coord.close()
        return per


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    rows = []
    for i in range(args.rounds):
        with tempfile.TemporaryDirectory(prefix="pwrev") as tmp:
            r = one_round(Path(tmp), in_place=bool(i % 2))
        rows.append(r)
        print(f"round {i + 1} ({'edited in place' if i % 2 else 'removed'}): " +
              ", ".join(f"{k} {v:.3f} s" for k, v in sorted(r.items())))
    for role in ("node", "control", "pub"):
        vals = [r[role] for r in rows]
        print(f"{role:8s} revocation delay: median {statistics.median(vals):.3f} s, max {max(vals):.3f} s (goal < 1 s)")
    print(f"per-message check: {check_cost():.2f} us per message (ServerSockets.admitted)")


if __name__ == "__main__":
    main()
