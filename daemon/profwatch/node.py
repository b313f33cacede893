"""Node daemon (composition root): receives its ranks' messages, validates, batches and relays them to the
coordinator, sends heartbeats, re-registers its ranks after a coordinator restart, writes node-local
``profiler_config.json`` copies on the coordinator's command and tails torch_npu's dp logs for acknowledgements.

Sockets: PULL bound on ``node.rank_endpoint()`` (ranks PUSH, FC-19; an ``ipc://`` file of mode
``node.socket_mode`` and group ``node.socket_group``), DEALER connected to the coordinator's ingest ROUTER
(CURVE-authenticated beyond loopback; the coordinator knows this node by its key, FC-21). File system work
(config writes, log tailing) runs on a worker thread, never on the socket loop (FC-15).

What ranks send is decoded as strict UTF-8 JSON, validated, pinned to the uid of the first process that spoke
for its job on this node (``SO_PEERCRED`` through ZeroMQ's ``Peer-Address``), and relayed *re-encoded*: raw
rank bytes never reach the coordinator. The fs worker hands its results back through two typed queues
(node acknowledgements, dp-log capture events).
"""

from __future__ import annotations

import json
import os
import queue
import threading
import time
from functools import lru_cache
from pathlib import Path
from typing import Any

import structlog
import zmq

from profwatch.adapters.host_load import HostLoadSampler
from profwatch.adapters.outputs.metrics import DaemonMetrics
from profwatch.adapters.outputs.sd_notify import SdNotifier
from profwatch.adapters.zmq.curve import HandshakeMonitor, make_client, peer_address
from profwatch.adapters.zmq.keyfiles import CurveSetupError, KeyPair, client_keys
from profwatch.adapters.zmq.server_sockets import peer_of_fd
from profwatch.config import NodeSettings
from profwatch.core.access import SecuritySettings, insecure_endpoints, parse_peer_address
from profwatch.core.fleet.job_pins import Collision, JobIdCollision
from profwatch.core.fleet.limits import LimitSettings
from profwatch.core.fleet.rank_intake import RankIntake
from profwatch.core.messages import MessageRejected, check_rank_message, parse_node_command
from profwatch.logsetup import OncePerKind
from rankhook import wire

log = structlog.get_logger("profwatch.node")

UNANSWERED_MIN_S = 10.0
"""A node warns (``coordinator_unanswered``) when nothing came from the coordinator for this long, or for three
heartbeat intervals when that is longer, and again every minute of silence; ``coordinator_answering`` ends it."""

RANK_MAXMSGSIZE = 2 * wire.MAX_MESSAGE_BYTES
"""ZeroMQ drops (and disconnects) a rank message above this; between the wire limit and this it is counted."""

CLOSE_JUDGED_AFTER_S = 1.0
"""A closed rank connection is judged this long after its disconnect event: a rank process that exits closes its
connection before the kernel marks it a zombie, so a process still running a moment later had its connection
closed by the node (a message over ``RANK_MAXMSGSIZE``, or a protocol error), not by its own end."""
BYE_GRACE_S = 30.0
"""A close within this long of the process's bye (with nothing sent after it) is its own end: the hook says bye,
then closes its backend (bounded) and its socket."""
UNKNOWN_CLOSE_JUDGED_AFTER_S = 5.0
"""A rank connection closed before its peer could be read (its fd gone within one loop turn of its accept) is
judged this long after its close: a process that sent a message within ``UNKNOWN_SENDER_WINDOW_S`` before the close
and has exited by then explains it (a short-lived process, e.g. one that sends its hello and ends);
otherwise it is a drop (an oversize first message after a reconnect)."""
UNKNOWN_SENDER_WINDOW_S = 2.0
"""How long before an unknown close a message from an exited process counts as that close's explanation."""
HOST_LOAD_SAMPLE_S = 1.0
"""The node daemon samples its host's CPU load this often (``daemon/profwatch/adapters/host_load.py``)."""
MAX_TRACKED_RANK_PEERS = 10_000


def process_running(proc_dir: Path, pid: int) -> bool:
    """Whether ``pid`` is a running process (``<proc_dir>/<pid>/stat`` exists and its state is not zombie or
    dead, ``proc(5)``). Reads at most 4 KiB."""
    try:
        with open(proc_dir / str(pid) / "stat", "rb") as f:
            stat = f.read(4096)
    except OSError:
        return False
    state = stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3]
    return bool(state) and state not in (b"Z", b"X", b"x")


@lru_cache(maxsize=4096)
def _creds_of(peer: str | None) -> tuple[int | None, int | None]:
    """``(uid, pid)`` of an ipc peer from ZeroMQ's ``Peer-Address`` (``(None, None)`` when not given)."""
    creds = parse_peer_address(peer)
    return (creds[0], creds[2]) if creds is not None else (None, None)


class NodeDaemon:
    """One node daemon. ``run()`` blocks until ``stop()`` (or SIGTERM via the CLI) and then closes everything.

    Args:
        settings: the ``[node]`` section.
        metrics: Prometheus metrics (a fresh registry is made when omitted).
        security: the ``[security]`` section (CURVE keys for the coordinator connection).
        limits: the ``[limits]`` section (queued bytes per rank, cached hellos).
        notifier: systemd notifications (READY/WATCHDOG/STOPPING); none when omitted.
    Raises:
        zmq.ZMQError: the rank endpoint cannot be bound (e.g. another node daemon holds it).
        CurveSetupError: CURVE is required and this node's key is missing, unreadable or not its node id's.
        ValueError: ``socket_group`` does not exist or cannot be applied.
    """

    def __init__(self, settings: NodeSettings, metrics: DaemonMetrics | None = None,
                 security: SecuritySettings | None = None, limits: LimitSettings | None = None,
                 notifier: SdNotifier | None = None, host_load: HostLoadSampler | None = None) -> None:
        self.s = settings
        # the host's CPU load, sampled once a second and sent with each heartbeat (a test gives its own /proc)
        self.host_load = host_load or HostLoadSampler()
        self.security = security or SecuritySettings.model_validate({})
        self.limits = limits or LimitSettings.model_validate({})
        self.metrics = metrics or DaemonMetrics("node")
        self.notifier = notifier or SdNotifier({})
        self.node_id = settings.node_id
        self.hostname = os.uname().nodename
        self.started_unix_s = time.time()
        self._stop = threading.Event()
        self._curve = self._client_keys()
        self._ctx = zmq.Context()
        self.intake = RankIntake(self.limits)  # validation, uid pins, cached hellos
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._pending_since = 0.0
        self._seq = 0
        self._once = OncePerKind()
        self._logged: dict[tuple[str, str], float] = {}
        self._unsent_collisions: list[bytes] = []
        self.counters = {"received": 0, "rejected": 0, "relayed": 0, "dropped": 0, "batches": 0, "oversize": 0}
        self._fs_jobs: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=1000)
        # results of the fs worker, one typed queue per kind
        self._acks: queue.Queue[wire.NodeAck] = queue.Queue(maxsize=10_000)
        self._dp_events: queue.Queue[list[wire.CaptureEvent]] = queue.Queue(maxsize=1000)
        self._dp_jobs = self.intake.dp_jobs  # job_id -> profiler_config_path to tail (torch_npu backend)
        self._reconnect_at: float | None = None
        # the coordinator answers every heartbeat (heartbeat_ack): silence for this long is warned about
        self.unanswered_after_s = max(UNANSWERED_MIN_S, 3 * self.s.heartbeat_interval_s)
        self._answered_mono = time.monotonic()  # last message from the coordinator (start counts as one)
        self._answered_unix_s: float | None = None  # wall time of the last real answer (shown in the warning)
        self._unanswered_warned_mono: float | None = None
        self._link = "connecting"  # the coordinator connection as the socket monitor last saw it
        self._ipc = self.s.rank_endpoint().startswith("ipc://")
        self._npu_starts: dict[tuple[str, int], float] = {}  # local torch_npu ranks -> their start time
        self._stale_state = ""  # what the last stale torch_npu check found (sent with every heartbeat)
        self._check_stale_now = threading.Event()
        self._rank_peers: dict[int, str] = {}  # fd -> peer ("pid:N" over ipc) of an open rank connection
        self._byes: dict[int, float] = {}  # pids that said bye (a normal end), bounded
        self._closed: list[tuple[float, str]] = []  # (judge at, peer) of closed rank connections not judged yet
        self._unknown_closed: list[tuple[float, float, str]] = []  # (judge at, closed at, "fd:N") of unknown peers
        self._last_sent: dict[int, float] = {}  # pid -> monotonic time of its latest message over ipc, bounded
        self._bind_sockets()
        self._fs_thread = threading.Thread(target=self._fs_worker, name="profwatch-node-fs", daemon=True)

    def _client_keys(self) -> tuple[KeyPair, bytes] | None:
        keys = client_keys(self.security, self.s.coordinator)
        if keys is not None:
            name = keys[0].metadata.get("name")
            if name and name != self.node_id:
                raise CurveSetupError(f"node.node_id {self.node_id!r} is not the name of this node's key ({name!r}): "
                                      f"the coordinator knows a node by its key; set node.node_id = {name!r}")
        open_eps = insecure_endpoints({"node.coordinator": self.s.coordinator, "node.bind": self.s.rank_endpoint()},
                                      self.security)
        if open_eps:
            log.warning("insecure_sockets", endpoints=open_eps,
                        note="security.insecure = true: reachable beyond loopback without authentication")
        return keys

    # -- setup --------------------------------------------------------------------------------------------------
    def _bind_sockets(self) -> None:
        ep = self.s.rank_endpoint()
        if ep.startswith("ipc://"):
            path = Path(ep[len("ipc://") :])
            if len(str(path).encode()) > 107:
                raise ValueError(f"ipc path {path} is longer than 107 bytes; set node.runtime_dir to a shorter folder")
            path.parent.mkdir(parents=True, exist_ok=True)
        gid = self._socket_gid()
        self._lock_fd = self._lock_endpoint(ep)
        self.pull = self._ctx.socket(zmq.PULL)
        self.pull.setsockopt(zmq.LINGER, 0)
        self.pull.setsockopt(zmq.MAXMSGSIZE, RANK_MAXMSGSIZE)
        self.pull.setsockopt(zmq.RCVHWM, self.limits.hwm_for(self.limits.rank_queue_bytes_per_peer, RANK_MAXMSGSIZE))
        old_umask = os.umask(0o177)  # the socket file appears owner-only; mode and group are applied next
        try:
            self.pull.bind(ep)
        finally:
            os.umask(old_umask)
        self.rank_monitor = HandshakeMonitor(self.pull, side="server")
        if self._ipc:
            sock_path = ep[len("ipc://") :]
            if gid is not None:
                os.chown(sock_path, -1, gid)
            os.chmod(sock_path, self.s.socket_mode)
        self._connect_dealer()
        log.info("node_started", node_id=self.node_id, rank_endpoint=ep, coordinator=self.s.coordinator,
                 curve=self._curve is not None, socket_mode=oct(self.s.socket_mode), socket_group=self.s.socket_group)

    def _socket_gid(self) -> int | None:
        if not self.s.socket_group or not self._ipc:
            return None
        import grp

        try:
            gid = grp.getgrnam(self.s.socket_group).gr_gid
        except KeyError:
            raise ValueError(f"node.socket_group {self.s.socket_group!r} does not exist: create it (groupadd "
                             f"{self.s.socket_group}) and add the training users to it, or unset it") from None
        if os.getuid() != 0 and gid not in os.getgroups() and gid != os.getgid():
            raise ValueError(f"the node daemon is not a member of node.socket_group {self.s.socket_group!r}, so it "
                             "cannot give the socket that group: add it (systemd: SupplementaryGroups=)")
        return gid

    def _connect_dealer(self) -> None:
        self.dealer = self._ctx.socket(zmq.DEALER)
        self.dealer.setsockopt(zmq.LINGER, 0)
        self.dealer.setsockopt(zmq.SNDHWM, self.s.relay_hwm)
        self.dealer.setsockopt(zmq.RECONNECT_IVL, 200)
        self.dealer.setsockopt(zmq.RECONNECT_IVL_MAX, 2000)
        self.dealer.setsockopt(zmq.MAXMSGSIZE, wire.MAX_BATCH_BYTES)
        self.dealer.setsockopt(zmq.HEARTBEAT_IVL, 2000)
        self.dealer.setsockopt(zmq.HEARTBEAT_TIMEOUT, 10_000)
        if self._curve is not None:
            make_client(self.dealer, self._curve[0], self._curve[1])
        self.monitor = HandshakeMonitor(self.dealer)
        self.dealer.connect(self.s.coordinator)

    def _reconnect(self) -> None:
        """Replace the coordinator connection (the coordinator said another connection took this node's id)."""
        self._poller.unregister(self.dealer)
        self._poller.unregister(self.monitor.sock)
        self.monitor.close()
        self.dealer.close(0)
        self._connect_dealer()
        self._link = "connecting"
        self._poller.register(self.dealer, zmq.POLLIN)
        self._poller.register(self.monitor.sock, zmq.POLLIN)
        log.info("coordinator_reconnected", coordinator=self.s.coordinator)

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

    def ready_checks(self) -> dict[str, tuple[bool, str]]:
        """``/readyz`` (``profwatch.core.health``): the coordinator reachable, i.e. it answered within
        ``unanswered_after_s`` (the bound of the ``coordinator_unanswered`` warning). Attribute reads only."""
        silent = time.monotonic() - self._answered_mono
        last = self._answered_unix_s
        ok = last is not None and silent < self.unanswered_after_s
        return {"coordinator": (ok, f"{self.s.coordinator}: " + (
            f"answered {silent:.1f} s ago" if last is not None else "no answer since this node daemon started")
            + ("" if ok else f" (not reachable: link {self._link}; limit {self.unanswered_after_s:g} s)"))}

    # -- main loop ----------------------------------------------------------------------------------------------
    def run(self) -> None:
        """Serve until stopped; always closes sockets and the worker thread."""
        self._fs_thread.start()
        self._poller = poller = zmq.Poller()
        poller.register(self.pull, zmq.POLLIN)
        poller.register(self.dealer, zmq.POLLIN)
        poller.register(self.monitor.sock, zmq.POLLIN)
        poller.register(self.rank_monitor.sock, zmq.POLLIN)
        next_hb = next_load = 0.0
        self.notifier.ready("serving")
        try:
            while not self._stop.is_set():
                self.notifier.watchdog(time.monotonic())  # only while this loop turns (systemd WatchdogSec)
                self.metrics.health.tick(time.monotonic())  # /healthz: the same loop turning
                timeout_ms = max(1, int(self.s.batch_max_delay_s * 1000))
                events = dict(poller.poll(timeout_ms))
                if self.pull in events:
                    self._drain_ranks()
                if self.dealer in events:
                    self._drain_commands()
                if self.monitor.sock in events:
                    self._on_handshakes()
                now = time.monotonic()
                if self.rank_monitor.sock in events or self._closed or self._unknown_closed:
                    self._on_rank_connections(now)
                self._drain_outbox()
                if self._reconnect_at is not None and now >= self._reconnect_at:
                    self._reconnect_at = None
                    self._reconnect()
                if self._pending and (
                    len(self._pending) >= self.s.batch_max_messages or now - self._pending_since >= self.s.batch_max_delay_s
                ):
                    self._flush()
                if now >= next_load:
                    next_load = now + HOST_LOAD_SAMPLE_S
                    self.host_load.sample()
                if now >= next_hb:
                    next_hb = now + self.s.heartbeat_interval_s
                    self._heartbeat()
                    self._check_answered(now)
        finally:
            self.close()

    def _drain_ranks(self) -> None:
        for _ in range(10_000):
            try:
                frames = self.pull.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            self.counters["received"] += 1
            payload = frames[-1].bytes
            uid, pid = _creds_of(peer_address(frames[-1])) if self._ipc else (None, None)
            now = time.monotonic()  # one clock read per message: the intake, the bye and the last-sent times
            try:
                if len(frames) != 2:
                    raise MessageRejected("bad_framing", f"{len(frames)} frames")
                msg, data = self.intake.accept(payload, uid, now, pid)
            except JobIdCollision as exc:
                self.counters["job_id_collision"] = self.counters.get("job_id_collision", 0) + 1
                if exc.new:
                    self._report_collision(exc.collision)
                self._reject(exc)
                continue
            except MessageRejected as exc:
                if exc.reason == "oversize":
                    self.counters["oversize"] += 1
                    self._log_peer("rank_message_oversize", str(uid), bytes=len(payload), uid=uid,
                                   limit=wire.MAX_MESSAGE_BYTES)
                self._reject(exc)
                continue
            except Exception as exc:  # noqa: BLE001 - whatever a local process sends, the relay keeps serving
                self._reject(MessageRejected("bad_message", repr(exc)[:200]))
                continue
            self.metrics.messages_in.labels(msg.kind).inc()
            if pid is not None and msg.kind == "bye":
                if len(self._byes) >= MAX_TRACKED_RANK_PEERS:
                    self._byes.pop(next(iter(self._byes)))
                self._byes[pid] = now
            elif pid is not None and self._byes:
                self._byes.pop(pid, None)  # it spoke again after its bye: not ending
            if pid is not None:
                if pid not in self._last_sent and len(self._last_sent) >= MAX_TRACKED_RANK_PEERS:
                    self._last_sent.pop(next(iter(self._last_sent)))
                self._last_sent[pid] = now
            if msg.kind == "hello" and msg.backend == "torch_npu" and (msg.job_id, msg.rank) not in self._npu_starts:
                if len(self._npu_starts) >= 4096:  # bounded: forget the oldest half (ranks of ended jobs)
                    for key in sorted(self._npu_starts, key=self._npu_starts.__getitem__)[:2048]:
                        del self._npu_starts[key]
                self._npu_starts[(msg.job_id, msg.rank)] = msg.ts_unix_s
                self._check_stale_now.set()
            self._queue(data)  # what was validated, re-encoded: never the rank's raw bytes

    def _report_collision(self, c: Collision) -> None:
        """Log a new job id collision and tell the coordinator, which raises the ``job_id_collision`` alert."""
        log.warning("job_id_collision", job_id=c.job_id, reason=c.reason, owner_uid=c.owner_uid, uid=c.uid,
                    pid=c.pid, rank=c.rank, detail=c.detail())
        owner = c.owner_paths or (None, None)
        msg = wire.NodeJobIdCollision(
            node_id=self.node_id, hostname=self.hostname, job_id=c.job_id, reason=c.reason, owner_uid=c.owner_uid,
            uid=c.uid, rank=c.rank, ts_unix_s=time.time(), pid=c.pid, profiler_config_path=c.paths[0],
            prof_root=c.paths[1], owner_profiler_config_path=owner[0], owner_prof_root=owner[1],
            refused=c.refused, detail=c.detail()[:2000])
        self._unsent_collisions.append(wire.encode(msg))
        del self._unsent_collisions[:-64]  # bounded: a flood of colliding processes keeps the newest reports
        self._send_collisions()

    def _send_collisions(self) -> None:
        """Send the collision reports not sent yet (the relay queue was full); again at each heartbeat."""
        while self._unsent_collisions and self._send(self._unsent_collisions[0], "node_job_id_collision"):
            self._unsent_collisions.pop(0)

    def _queue(self, data: bytes) -> None:
        if not self._pending:
            self._pending_since = time.monotonic()
        self._pending.append(data)
        self._pending_bytes += len(data) + 1
        if len(self._pending) >= self.s.batch_max_messages or self._pending_bytes >= self.s.batch_max_bytes:
            self._flush()

    def _log_peer(self, event: str, tag: str, **fields: Any) -> None:
        now = time.monotonic()
        if now - self._logged.get((event, tag), -1e9) >= 60.0:
            if len(self._logged) > 10_000:
                self._logged.clear()
            self._logged[(event, tag)] = now
            log.warning(event, **fields, note="logged once a minute per peer")

    def _reject(self, exc: MessageRejected) -> None:
        self.counters["rejected"] += 1
        self.metrics.rejected.labels(exc.reason).inc()
        if self._once.first(exc.reason):
            log.warning("message_rejected", reason=exc.reason, detail=exc.detail, note="logged once per reason")

    def _check_answered(self, now: float) -> None:
        """Warn when the coordinator has not answered for ``unanswered_after_s`` (again every minute), naming the
        likely cause from what the socket monitor saw; say so once when answers come back."""
        silent_s = now - self._answered_mono
        if silent_s < self.unanswered_after_s:
            return
        if self._unanswered_warned_mono is not None and now - self._unanswered_warned_mono < 60.0:
            return
        self._unanswered_warned_mono = now
        ep = self.s.coordinator
        if self._link == "refused":
            cause = (f"nothing listens at {ep} (connection refused): is the coordinator running, and is "
                     "[node] coordinator its [coordinator] ingest_bind (host and port)?")
        elif self._link == "connected":
            cause = (f"no answer: wrong endpoint, or the coordinator is overloaded. Connected to {ep}, but nothing "
                     "came back: is it the coordinator's ingest_bind (not its control or pub port)? Is the "
                     "coordinator busy (its log, `profwatch status` timing out, CPU)? Does it log peer_refused for "
                     "this node?")
        else:
            cause = f"no connection to {ep} yet: is the host reachable (firewall, DNS) and the coordinator running?"
        last = self._answered_unix_s
        log.warning("coordinator_unanswered", coordinator=ep, silent_s=round(silent_s, 1), link=self._link,
                    likely_cause=cause, last_answer_unix_s=last,
                    last_answer=(time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(last)) if last is not None
                                 else "none since this node daemon started"),
                    note="heartbeats and telemetry are queued, then dropped (relay_hwm)")

    def _answered(self) -> None:
        now = time.monotonic()
        if self._unanswered_warned_mono is not None:
            log.info("coordinator_answering", coordinator=self.s.coordinator,
                     after_s=round(now - self._answered_mono, 1))
            self._unanswered_warned_mono = None
        self._answered_mono = now
        self._answered_unix_s = time.time()

    def _on_handshakes(self) -> None:
        """Log and count the coordinator connection's handshake failures (a wrong key is not a network outage);
        remember whether the connection is up, refused or lost (the likely cause of unanswered heartbeats)."""
        for _ev, _value, failure in self.monitor.poll():
            self._link = {"EVENT_CONNECTED": "connected", "EVENT_CONNECT_RETRIED": "refused",
                          "EVENT_DISCONNECTED": "disconnected"}.get(_ev, self._link)
            if failure is None:
                if _ev == "EVENT_HANDSHAKE_SUCCEEDED":
                    log.info("coordinator_connected", coordinator=self.s.coordinator, curve=self._curve is not None)
                continue
            reason, explanation = failure
            self.metrics.auth_refused.labels("coordinator", reason).inc()
            self._log_peer("coordinator_auth_failed", reason, coordinator=self.s.coordinator, reason=reason,
                           detail=explanation)

    def _on_rank_connections(self, now: float) -> None:
        """Count closed rank connections (``profwatch_connections_closed_total{socket="rank"}``) from the rank
        socket's monitor, and judge each ``CLOSE_JUDGED_AFTER_S`` later: over ipc, a connection whose process
        (its ``SO_PEERCRED`` pid) is still running and did not say bye just before (``BYE_GRACE_S``, nothing sent
        after it) was closed by the node, i.e. ZeroMQ dropped
        a message over ``RANK_MAXMSGSIZE`` (512 KiB) unread with it: ``peer="running"``. A connection closed
        before its accept was looked at (its fd already gone, within one loop turn) is judged
        ``UNKNOWN_CLOSE_JUDGED_AFTER_S`` later: a process that sent a message just before it and has ended since
        explains it (a short-lived process); otherwise it is an oversize first message after a reconnect,
        ``peer="unknown"``. Both are counted
        (``profwatch_rank_connections_dropped_total{peer}``) and logged once a minute per peer
        (``rank_connection_dropped``). Over tcp the peer's process cannot be told: closes are only counted."""
        for ev, fd, _failure in self.rank_monitor.poll():
            if ev == "EVENT_ACCEPTED":
                if len(self._rank_peers) >= MAX_TRACKED_RANK_PEERS:
                    self._rank_peers.pop(next(iter(self._rank_peers)))
                self._rank_peers[fd] = peer_of_fd(fd)
            elif ev == "EVENT_DISCONNECTED":
                self.metrics.connections_closed.labels("rank").inc()
                peer = self._rank_peers.pop(fd, f"fd:{fd}")
                if peer.startswith("pid:") and len(self._closed) < MAX_TRACKED_RANK_PEERS:
                    self._closed.append((now + CLOSE_JUDGED_AFTER_S, peer))
                elif peer.startswith("fd:") and self._ipc:
                    # closed before the node could read its peer (within one loop turn of its accept): an oversize
                    # first message after a (re)connect, unless a process that just spoke has ended since
                    if len(self._unknown_closed) < MAX_TRACKED_RANK_PEERS:
                        self._unknown_closed.append((now + UNKNOWN_CLOSE_JUDGED_AFTER_S, now, peer))
                    else:
                        self._dropped("unknown", peer, None)
        while self._closed and self._closed[0][0] <= now:
            _, peer = self._closed.pop(0)
            pid = int(peer[len("pid:") :])
            self._last_sent.pop(pid, None)  # its close is judged here: it explains no unknown close
            bye_at = self._byes.get(pid)
            if (bye_at is not None and now - bye_at <= BYE_GRACE_S + CLOSE_JUDGED_AFTER_S) or \
                    not process_running(self.s.proc_dir, pid):
                continue  # the process ended (or had just said it would): a normal close
            self._dropped("running", peer, pid)
        while self._unknown_closed and self._unknown_closed[0][0] <= now:
            _, closed_at, peer = self._unknown_closed.pop(0)
            if not self._ended_sender(closed_at, now):
                self._dropped("unknown", peer, None)

    def _ended_sender(self, closed_at: float, now: float) -> bool:
        """Whether a process that sent a message within ``UNKNOWN_SENDER_WINDOW_S`` before ``closed_at`` has ended
        since (a bye is not enough: the peer is unknown, so only an ended process explains it); that process is then
        forgotten, so it explains one close only."""
        for pid, sent_at in list(self._last_sent.items()):
            if sent_at < closed_at - UNKNOWN_SENDER_WINDOW_S:
                continue
            if not process_running(self.s.proc_dir, pid):  # ended: a bye alone would let a running process that
                del self._last_sent[pid]                        # says bye again and again excuse real drops
                return True
        return False

    def _dropped(self, peer_kind: str, peer: str, pid: int | None) -> None:
        self.counters["connections_dropped"] = self.counters.get("connections_dropped", 0) + 1
        self.metrics.rank_connections_dropped.labels(peer_kind).inc()
        self._log_peer("rank_connection_dropped", peer if pid is not None else "unknown", peer=peer, pid=pid,
                       limit_bytes=RANK_MAXMSGSIZE,
                       detail=(f"the connection of running process {pid}" if pid is not None else
                               "a rank connection closed before its peer could be read")
                       + f" was closed by the node: ZeroMQ drops a message over {RANK_MAXMSGSIZE} bytes unread with "
                       "its connection (the process reconnects by itself); see "
                       "profwatch_rank_connections_dropped_total")

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
        self._pending_bytes = 0
        if self._send(self._batch_bytes(payloads), "node_batch"):
            self.counters["relayed"] += len(payloads)
            self.counters["batches"] += 1

    def _heartbeat(self, stopping: bool = False) -> None:
        """Send a heartbeat (``stopping``: the last one, as the daemon stops: the coordinator then logs the close
        of this connection as routine)."""
        self.metrics.queue_depth.labels("pending_relay").set(len(self._pending))
        self.metrics.queue_depth.labels("fs_jobs").set(self._fs_jobs.qsize())
        if not self.host_load.pending:
            self.host_load.sample()
        runnable, psi = self.host_load.take()
        hb = wire.NodeHeartbeat(
            node_id=self.node_id, hostname=self.hostname, pid=os.getpid(), ts_unix_s=time.time(),
            started_unix_s=self.started_unix_s, counters=dict(self.counters), stale_state=self._stale_state,
            stopping=stopping, runnable_per_core=runnable, cpu_psi_some_pct=psi,
        )
        self._send(wire.encode(hb), "node_heartbeat")
        if not stopping:
            self._send_collisions()

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
            self._answered()
            if cmd.cmd == "register":
                log.info("reregistering", ranks=len(self.intake.hellos))
                self._flush_if_pending()
                for data in list(self.intake.hellos.values()):
                    self._queue(data)
                self._flush_if_pending()
            elif cmd.cmd == "reconnect":
                after = cmd.args.get("after_s", 1.0)
                after_s = min(60.0, max(0.0, float(after))) if isinstance(after, (int, float)) else 1.0
                log.warning("coordinator_asked_reconnect", after_s=after_s,
                            note="another connection for this node id replaced ours (a second daemon with this key?)")
                self._reconnect_at = time.monotonic() + after_s
            elif cmd.cmd == "write_config":
                try:
                    self._fs_jobs.put_nowait(("write_config", cmd))
                except queue.Full:
                    self._ack(cmd.command_id, False, wire.NODE_BUSY)

    def _flush_if_pending(self) -> None:
        if self._pending:
            self._flush()

    def _ack(self, command_id: str, ok: bool, detail: str = "", result: dict[str, Any] | None = None) -> None:
        try:
            self._acks.put_nowait(wire.NodeAck(node_id=self.node_id, command_id=command_id, ok=ok, detail=detail[:2000],
                                               result=result or {}))
        except queue.Full:
            self.counters["dropped"] += 1

    def _drain_outbox(self) -> None:
        """Send what the fs worker produced: acknowledgements as ``node_ack`` messages, dp-log capture events
        (validated like any rank message) inside a batch."""
        while True:
            try:
                ack = self._acks.get_nowait()
            except queue.Empty:
                break
            self._send(wire.encode(ack), "node_ack")
        while True:
            try:
                events = self._dp_events.get_nowait()
            except queue.Empty:
                return
            for ev in events:
                try:
                    self._queue(wire.encode(check_rank_message(ev)))
                except MessageRejected as exc:
                    self._reject(exc)

    # -- file system worker -------------------------------------------------------------------------------------
    def _fs_worker(self) -> None:
        from profwatch.adapters.fs.config_writer import ConfigWriter

        self._writer = ConfigWriter()
        tailers: dict[str, Any] = {}
        next_tail = next_check = 0.0
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
            if time.monotonic() >= next_check or self._check_stale_now.is_set():
                self._check_stale_now.clear()
                next_check = time.monotonic() + self.s.stale_check_interval_s
                self._check_stale_state()

    def _write_config(self, cmd: wire.NodeCommand) -> None:
        """Write an arm (or, with ``args["idle_for"]``, the idle config taking that capture's arm back) and answer."""
        from profwatch.adapters.fs.config_writer import ConfigIdleNotNeeded

        try:
            a = cmd.args
            idle_for = a.get("idle_for")
            res = self._writer.write(str(a["profiler_config_path"]), dict(a["config"]),
                                     not_before_unix_s=float(a.get("not_before_unix_s") or 0.0),
                                     allowed_roots=[str(r) for r in self.s.allowed_config_roots],
                                     idle_for=idle_for if isinstance(idle_for, str) else None)
            result = {"path": str(res.path), "mtime_s": res.mtime_s, "inode": res.inode, "created": res.created}
            self._ack(cmd.command_id, True, result=result)
            log.info("config_written", command_id=cmd.command_id, **result)
        except ConfigIdleNotNeeded as exc:  # the arm is gone already: nothing to take back
            self._ack(cmd.command_id, True, result={"skipped": str(exc)[:2000]})
            log.info("config_idle_skipped", command_id=cmd.command_id, detail=str(exc))
        except Exception as exc:  # noqa: BLE001 - refusals and I/O errors are reported, never fatal
            log.warning("config_write_failed", command_id=cmd.command_id, error=str(exc))
            self._ack(cmd.command_id, False, str(exc))

    def _check_stale_state(self) -> None:
        """Look for torch_npu leftovers (stale shm segment, orphaned monitor); log a change once, report it with
        every heartbeat (the coordinator names it as the cause of a capture's silent ranks). Never deletes."""
        from profwatch.adapters.fs.dp_log_tail import find_stale_dp_state
        from profwatch.core.fleet.node_checks import stale_dp_findings

        try:
            found = find_stale_dp_state(str(self.s.shm_dir), str(self.s.proc_dir))
            starts = list(self._npu_starts.values())
            text = stale_dp_findings(found, min(starts) if starts else None)[:2000]
        except Exception as exc:  # noqa: BLE001 - a failed check is logged, never fatal
            if self._once.first("stale_check"):
                log.warning("stale_check_failed", error=repr(exc))
            return
        if text != self._stale_state:
            (log.warning if text else log.info)("stale_torch_npu_state", found=text or "none")
        self._stale_state = text

    def _tail_dp_logs(self, tailers: dict[str, Any]) -> None:
        """Read new torch_npu dp log lines of every torch_npu job on this node; relay them as acknowledgements."""
        from profwatch.adapters.fs.dp_log_tail import DpLogTail

        acks: list[wire.CaptureEvent] = []
        for job_id, cfg_path in list(self._dp_jobs.items()):
            try:
                tail = tailers.get(job_id)
                if tail is None:
                    tail = tailers[job_id] = DpLogTail(cfg_path, job_id=job_id)
                acks.extend(tail.poll())
            except Exception as exc:  # noqa: BLE001
                if self._once.first(f"dp_log_tail:{job_id}"):
                    log.warning("dp_log_tail_failed", job_id=job_id, error=repr(exc))
        if acks:
            try:
                self._dp_events.put_nowait(acks)
            except queue.Full:
                self.counters["dropped"] += len(acks)

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
            self._heartbeat(stopping=True)  # last: the close that follows is routine (the dealer lingers 200 ms)
            self.rank_monitor.close()
            self.pull.close(0)
            self.monitor.close()
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
