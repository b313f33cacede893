"""Node daemon (composition root): receives its ranks' messages, validates, batches and relays them to the
coordinator, sends heartbeats, re-registers its ranks after a coordinator restart, writes node-local
``profiler_config.json`` copies on the coordinator's command and tails torch_npu's dp logs for acknowledgements.

Sockets: PULL bound on ``node.rank_endpoint()`` (ranks PUSH, FC-19), DEALER connected to the coordinator's
ingest ROUTER with identity ``node_id`` (FC-21). File system work (config writes, log tailing) runs on a worker
thread, never on the socket loop (FC-15).
"""

from __future__ import annotations

import json
import os
import queue
import threading
import time
from pathlib import Path
from typing import Any

import structlog
import zmq

from daemon.adapters.metrics import DaemonMetrics
from daemon.adapters.sd_notify import SdNotifier
from daemon.config import NodeSettings
from daemon.core.messages import MessageRejected, parse_node_command, parse_rank_message
from daemon.logsetup import OncePerKind
from rankhook import wire

log = structlog.get_logger("profwatch.node")


class NodeDaemon:
    """One node daemon. ``run()`` blocks until ``stop()`` (or SIGTERM via the CLI) and then closes everything.

    Args:
        settings: the ``[node]`` section.
        metrics: Prometheus metrics (a fresh registry is made when omitted).
        notifier: systemd notifications (READY/WATCHDOG/STOPPING); none when omitted.
    Raises:
        zmq.ZMQError: the rank endpoint cannot be bound (e.g. another node daemon holds it).
    """

    def __init__(self, settings: NodeSettings, metrics: DaemonMetrics | None = None,
                 notifier: SdNotifier | None = None) -> None:
        self.s = settings
        self.metrics = metrics or DaemonMetrics("node")
        self.notifier = notifier or SdNotifier({})
        self.node_id = settings.node_id
        self.hostname = os.uname().nodename
        self.started_unix_s = time.time()
        self._stop = threading.Event()
        self._ctx = zmq.Context()
        self._hellos: dict[tuple[str, int], bytes] = {}  # (job_id, rank) -> raw hello payload
        self._pending: list[bytes] = []
        self._pending_since = 0.0
        self._seq = 0
        self._once = OncePerKind()
        self.counters = {"received": 0, "rejected": 0, "relayed": 0, "dropped": 0, "batches": 0}
        self._fs_jobs: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=1000)
        self._outbox: queue.Queue[bytes] = queue.Queue()  # node messages produced by the fs worker
        self._dp_jobs: dict[str, str] = {}  # job_id -> profiler_config_path to tail (torch_npu backend)
        self._bind_sockets()
        self._fs_thread = threading.Thread(target=self._fs_worker, name="profwatch-node-fs", daemon=True)

    # -- setup --------------------------------------------------------------------------------------------------
    def _bind_sockets(self) -> None:
        ep = self.s.rank_endpoint()
        if ep.startswith("ipc://"):
            path = Path(ep[len("ipc://") :])
            if len(str(path).encode()) > 107:
                raise ValueError(f"ipc path {path} is longer than 107 bytes; set node.runtime_dir to a shorter folder")
            path.parent.mkdir(parents=True, exist_ok=True)
        self._lock_fd = self._lock_endpoint(ep)
        self.pull = self._ctx.socket(zmq.PULL)
        self.pull.setsockopt(zmq.LINGER, 0)
        self.pull.setsockopt(zmq.MAXMSGSIZE, wire.MAX_MESSAGE_BYTES)
        self.pull.setsockopt(zmq.RCVHWM, 100_000)
        self.pull.bind(ep)
        if ep.startswith("ipc://"):
            os.chmod(ep[len("ipc://") :], self.s.socket_mode)
        self.dealer = self._ctx.socket(zmq.DEALER)
        self.dealer.setsockopt(zmq.LINGER, 0)
        self.dealer.setsockopt(zmq.IDENTITY, self.node_id.encode())
        self.dealer.setsockopt(zmq.SNDHWM, self.s.relay_hwm)
        self.dealer.setsockopt(zmq.RECONNECT_IVL, 200)
        self.dealer.setsockopt(zmq.RECONNECT_IVL_MAX, 2000)
        self.dealer.setsockopt(zmq.MAXMSGSIZE, wire.MAX_BATCH_BYTES)
        self.dealer.connect(self.s.coordinator)
        log.info("node_started", node_id=self.node_id, rank_endpoint=ep, coordinator=self.s.coordinator)

    @staticmethod
    def _lock_endpoint(ep: str) -> int | None:
        """Hold ``<socket>.lock`` (flock) for an ``ipc://`` endpoint: ZeroMQ would silently unlink and rebind the
        socket file of a running node daemon, stranding its ranks. Raises ``RuntimeError`` if another holds it."""
        if not ep.startswith("ipc://"):
            return None
        import fcntl

        lock_path = ep[len("ipc://") :] + ".lock"
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise RuntimeError(f"another node daemon is serving {ep} (lock {lock_path} is held)") from None
        return fd

    def stop(self) -> None:
        """Ask ``run()`` to return (thread- and signal-safe)."""
        self._stop.set()

    # -- main loop ----------------------------------------------------------------------------------------------
    def run(self) -> None:
        """Serve until stopped; always closes sockets and the worker thread."""
        self._fs_thread.start()
        poller = zmq.Poller()
        poller.register(self.pull, zmq.POLLIN)
        poller.register(self.dealer, zmq.POLLIN)
        next_hb = 0.0
        self.notifier.ready("serving")
        try:
            while not self._stop.is_set():
                self.notifier.watchdog(time.monotonic())  # only while this loop turns (systemd WatchdogSec)
                timeout_ms = max(1, int(self.s.batch_max_delay_s * 1000))
                events = dict(poller.poll(timeout_ms))
                if self.pull in events:
                    self._drain_ranks()
                if self.dealer in events:
                    self._drain_commands()
                self._drain_outbox()
                now = time.monotonic()
                if self._pending and (
                    len(self._pending) >= self.s.batch_max_messages or now - self._pending_since >= self.s.batch_max_delay_s
                ):
                    self._flush()
                if now >= next_hb:
                    next_hb = now + self.s.heartbeat_interval_s
                    self._heartbeat()
        finally:
            self.close()

    def _drain_ranks(self) -> None:
        for _ in range(10_000):
            try:
                frames = self.pull.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            self.counters["received"] += 1
            payload = frames[-1]
            try:
                if len(frames) != 2:
                    raise MessageRejected("bad_framing", f"{len(frames)} frames")
                msg = parse_rank_message(payload)
            except MessageRejected as exc:
                self._reject(exc)
                continue
            except Exception as exc:  # noqa: BLE001 - whatever a local process sends, the relay keeps serving
                self._reject(MessageRejected("bad_message", repr(exc)[:200]))
                continue
            self.metrics.messages_in.labels(msg.kind).inc()
            if msg.kind == "hello":
                self._hellos[(msg.job_id, msg.rank)] = payload
                if msg.backend == "torch_npu" and msg.profiler_config_path:
                    self._dp_jobs[msg.job_id] = msg.profiler_config_path
            if not self._pending:
                self._pending_since = time.monotonic()
            self._pending.append(payload)
            if len(self._pending) >= self.s.batch_max_messages:
                self._flush()

    def _reject(self, exc: MessageRejected) -> None:
        self.counters["rejected"] += 1
        self.metrics.rejected.labels(exc.reason).inc()
        if self._once.first(exc.reason):
            log.warning("message_rejected", reason=exc.reason, detail=exc.detail, note="logged once per reason")

    def _batch_bytes(self, payloads: list[bytes]) -> bytes:
        self._seq += 1
        head = json.dumps(
            {"kind": "node_batch", "v": wire.SCHEMA_VERSION, "node_id": self.node_id, "hostname": self.hostname,
             "seq": self._seq, "ts_unix_s": time.time()},
            separators=(",", ":"),
        )
        return head[:-1].encode() + b',"messages":[' + b",".join(payloads) + b"]}"

    def _send(self, data: bytes, what: str) -> bool:
        try:
            self.dealer.send(data, zmq.NOBLOCK)
            self.metrics.messages_out.labels(what).inc()
            return True
        except zmq.Again:
            self.counters["dropped"] += 1
            self.metrics.dropped.labels("relay").inc()
            if self._once.first("relay_full"):
                log.warning("relay_queue_full", coordinator=self.s.coordinator, note="coordinator down or slow; dropping")
            return False

    def _flush(self) -> None:
        payloads, self._pending = self._pending, []
        if self._send(self._batch_bytes(payloads), "node_batch"):
            self.counters["relayed"] += len(payloads)
            self.counters["batches"] += 1

    def _heartbeat(self) -> None:
        self.metrics.queue_depth.labels("pending_relay").set(len(self._pending))
        self.metrics.queue_depth.labels("fs_jobs").set(self._fs_jobs.qsize())
        hb = wire.NodeHeartbeat(
            node_id=self.node_id, hostname=self.hostname, pid=os.getpid(), ts_unix_s=time.time(),
            started_unix_s=self.started_unix_s, counters=dict(self.counters),
        )
        self._send(wire.encode(hb), "node_heartbeat")

    def _drain_commands(self) -> None:
        while True:
            try:
                data = self.dealer.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                cmd = parse_node_command(data)
            except MessageRejected as exc:
                self._reject(exc)
                continue
            if cmd.cmd == "register":
                log.info("reregistering", ranks=len(self._hellos))
                hellos = list(self._hellos.values())
                for i in range(0, len(hellos), self.s.batch_max_messages):
                    self._send(self._batch_bytes(hellos[i : i + self.s.batch_max_messages]), "node_batch")
            elif cmd.cmd == "write_config":
                try:
                    self._fs_jobs.put_nowait(("write_config", cmd))
                except queue.Full:
                    self._ack(cmd.command_id, False, "node busy")

    def _ack(self, command_id: str, ok: bool, detail: str = "", result: dict[str, Any] | None = None) -> None:
        self._outbox.put(wire.encode(wire.NodeAck(node_id=self.node_id, command_id=command_id, ok=ok, detail=detail,
                                                  result=result or {})))

    def _drain_outbox(self) -> None:
        while True:
            try:
                data = self._outbox.get_nowait()
            except queue.Empty:
                return
            if data.startswith(b"["):  # a list of rank message payloads (dp log acknowledgements)
                payloads = json.loads(data)
                self._send(self._batch_bytes([json.dumps(p).encode() for p in payloads]), "node_batch")
            else:
                self._send(data, "node_ack")

    # -- file system worker -------------------------------------------------------------------------------------
    def _fs_worker(self) -> None:
        from daemon.adapters.config_writer import ConfigWriter

        self._writer = ConfigWriter()
        tailers: dict[str, Any] = {}
        next_tail = 0.0
        while not self._stop.is_set():
            try:
                kind, item = self._fs_jobs.get(timeout=0.2)
            except queue.Empty:
                kind, item = "", None
            if kind == "write_config":
                self._write_config(item)
            if self._dp_jobs and time.monotonic() >= next_tail:
                next_tail = time.monotonic() + self.s.dp_log_poll_s
                self._tail_dp_logs(tailers)

    def _write_config(self, cmd: wire.NodeCommand) -> None:
        try:
            a = cmd.args
            res = self._writer.write(str(a["profiler_config_path"]), dict(a["config"]),
                                     not_before_unix_s=float(a.get("not_before_unix_s") or 0.0),
                                     allowed_roots=[str(r) for r in self.s.allowed_config_roots])
            result = {"path": str(res.path), "mtime_s": res.mtime_s, "inode": res.inode, "created": res.created}
            self._ack(cmd.command_id, True, result=result)
            log.info("config_written", command_id=cmd.command_id, **result)
        except Exception as exc:  # noqa: BLE001 - refusals and I/O errors are reported, never fatal
            log.warning("config_write_failed", command_id=cmd.command_id, error=str(exc))
            self._ack(cmd.command_id, False, str(exc))

    def _tail_dp_logs(self, tailers: dict[str, Any]) -> None:
        """Read new torch_npu dp log lines of every torch_npu job on this node; relay them as acknowledgements."""
        from daemon.adapters.dp_log_tail import DpLogTail

        acks: list[dict[str, Any]] = []
        for job_id, cfg_path in list(self._dp_jobs.items()):
            try:
                tail = tailers.get(job_id)
                if tail is None:
                    tail = tailers[job_id] = DpLogTail(cfg_path, job_id=job_id)
                acks.extend(wire.to_dict(ev) for ev in tail.poll())
            except Exception as exc:  # noqa: BLE001
                if self._once.first(f"dp_log_tail:{job_id}"):
                    log.warning("dp_log_tail_failed", job_id=job_id, error=repr(exc))
        if acks:
            self._outbox.put(json.dumps(acks).encode())

    def close(self) -> None:
        """Close sockets and the worker (idempotent)."""
        if not self._ctx.closed:
            self.notifier.stopping()
        self._stop.set()
        if self._fs_thread.is_alive():
            self._fs_thread.join(timeout=2)
        if not self._ctx.closed:
            if self._pending:  # relay what arrived before SIGTERM (non-blocking; dropped and counted if full)
                self._flush()
            self.pull.close(0)
            self.dealer.close(200)
            self._ctx.term()
            ep = self.s.rank_endpoint()
            if ep.startswith("ipc://"):
                try:
                    os.unlink(ep[len("ipc://") :])  # we hold the lock: the socket file is ours
                except OSError:
                    pass
            if self._lock_fd is not None:
                os.close(self._lock_fd)
                self._lock_fd = None
            log.info("node_stopped", node_id=self.node_id, **self.counters)
