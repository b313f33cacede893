"""Every profwatch wire message, defined once (stdlib dataclasses; pure, no I/O).

Transport framing: each message travels as a two-frame ZeroMQ multipart ``[topic, json_payload]``.
Topics follow ``profwatch.<kind>.<job_id>[.<rank>]`` (general part first, so subscribers filter by
prefix). The payload is the dataclass serialised with :func:`encode`; it always carries ``kind`` and
``v`` (the schema version). The daemon validates payloads with pydantic (``TypeAdapter`` over these
dataclasses, see ``daemon/profwatch/core/messages.py``), so the schema exists only here.

Units are in the field names: ``_s`` seconds, ``_bytes`` bytes; ``ts_unix_s`` is wall-clock Unix time.
``step`` is the count of ``rankhook.step()`` calls (the same counter torch_npu's ``dp.step()`` advances).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal

SCHEMA_VERSION = 2
"""Bumped on any incompatible change; what this version sends. Receivers take :data:`ACCEPTED_VERSIONS` and reject
other versions with a counted error. Version 2 (``docs/wire.md``): the hook's step report carries integer
microseconds (``step_time_us``, ``ts_unix_us``: no float formatting on ``rankhook.step()``'s path), and the node
daemon stamps each relayed step report with the sending process's attested ``peer_pid`` (one process, one vote for
a new generation)."""
ACCEPTED_VERSIONS = frozenset({1, 2})
"""Versions the node daemon and the coordinator take (a rolling upgrade: coordinator first, then the node daemons,
then the hooks; a version-1 hook or node keeps working against newer daemons)."""

TOPIC_PREFIX = "profwatch"
MAX_MESSAGE_BYTES = 256 * 1024
"""Largest rank->node message. The rank's publisher counts a larger one as dropped (``oversize``) and never
sends it; the node daemon counts and logs one it receives (its ZeroMQ ``MAXMSGSIZE`` is 4x this)."""
KEEPALIVE_S = 10.0
"""In ``serving`` mode, a rank with no step for this long re-sends its hello (a keepalive), then again every this
long while idle (the pace of the hello re-send while stepping): well under the coordinator's ``job_end_after_s``
(600 s by default) and its ``rank_rebind_after_s`` (30 s), so an idle server is neither an ended job nor gone."""
MAX_BATCH_BYTES = 4 * 1024 * 1024
"""Hard cap for one node->coordinator message (``MAXMSGSIZE`` on the coordinator's ingest socket); the node
daemon flushes a batch before its bytes reach ``node.batch_max_bytes`` (1 MiB by default)."""

Backend = Literal["torch_npu", "torch", "none"]
MODES = ("training", "serving")
"""Values of the optional ``mode`` field the hook sends (``rankhook.init(mode=...)``, ``PROFWATCH_MODE``): ``training``
(a steady loop, one step per iteration) or ``serving`` (engine iterations: steps only while requests are queued,
idle gaps of seconds to minutes). Receivers treat another value as not said (a newer hook's mode)."""
MAX_WORK = 1e15
"""Largest ``work`` value accepted (units of work per step: tokens, samples)."""
MAX_CPU_CORES = 1024
"""Most cores one rank process can keep busy: a step report's ``cpu_s`` is at most this many times its
``step_time_s`` (the hook reads both clocks at the same step boundaries; a larger one is not a measurement)."""
MAX_CPU_S = MAX_CPU_CORES * 7 * 86400.0
"""Largest ``cpu_s`` of a step report: :data:`MAX_CPU_CORES` cores busy for the longest step (``MAX_STEP_TIME_S``,
7 days)."""
MAX_CPU_TOTAL_S = MAX_CPU_CORES * 3650 * 86400.0
"""Largest ``cpu_total_s`` (a CPU sample: the process's CPU time since it started) a step report may carry:
:data:`MAX_CPU_CORES` cores busy for ten years (3.2e11 s; in microseconds well within a signed 64-bit integer)."""
CaptureEventKind = Literal["arm_seen", "arm_rejected", "started", "completed", "failed"]


@dataclass(frozen=True, slots=True)
class RankHello:
    """Sent by a rank once at ``rankhook.init()`` (and re-sent by the node after a coordinator restart).

    Example::

        {"kind": "hello", "v": 2, "job_id": "j1", "rank": 3, "local_rank": 1, "world_size": 8,
         "hostname": "node1", "pid": 4242, "backend": "torch_npu", "ts_unix_s": 1764500000.25,
         "versions": {"torch": "2.13.0", "torch_npu": "2.13.0", "rankhook": "0.1.0"},
         "profiler_config_path": "/shared/pw/j1/cfg", "prof_root": "/shared/prof"}

    ``profiler_config_path`` is the folder holding ``profiler_config.json`` (the ``dp.init`` path);
    ``prof_root`` is where the job's captures may land. Both are checked against the daemon's own
    allowed roots before anything is written or read there. ``counters`` are the rank publisher's
    ``sent``/``dropped``/``errors`` totals (the hello is re-sent every 10 s, so the daemons see rank-side drops).
    ``backend`` is the capture backend in use (``none`` when the requested one failed to open);
    ``backend_error`` says which was requested and why it is not in use (empty otherwise; added without a
    schema bump: older receivers ignore it, older senders omit it).
    ``peer_uid`` and ``peer_pid`` are set by the node daemon from the ipc connection's peer credentials
    (``SO_PEERCRED``); values sent by the rank itself are overwritten (or cleared where the transport gives no
    credentials). ``peer_pid`` was added without a schema bump (older receivers ignore it).
    ``restart_count`` is torchrun's ``TORCHELASTIC_RESTART_COUNT`` (``None`` outside torchrun elastic): it grows by
    one each time the elastic agent restarts the job's workers, possibly with another ``world_size``; the
    coordinator opens a new generation of the job from it (``docs/generations.md``). Added without a schema bump:
    older receivers ignore it, older senders omit it.
    ``mode`` (``training`` | ``serving``, :data:`MODES`) and ``role`` (a label of the ranks that do the same work:
    a pipeline stage, a parallel group, a replica, e.g. ``pp1``; letters, digits, ``_ . : -``, at most 64
    characters) are what the rank says about itself (``rankhook.init(mode=..., role=...)``, ``PROFWATCH_MODE``,
    ``PROFWATCH_ROLE``); ``None`` when not said. Added without a schema bump: older receivers ignore them.
    In ``serving`` mode the hook re-sends the hello as a keepalive while the rank is idle (no step for
    :data:`KEEPALIVE_S`), so an idle server is not taken for an ended job.
    """

    job_id: str
    rank: int
    local_rank: int
    world_size: int
    hostname: str
    pid: int
    backend: Backend
    ts_unix_s: float
    versions: dict[str, str] = field(default_factory=dict)
    profiler_config_path: str | None = None
    prof_root: str | None = None
    counters: dict[str, int] = field(default_factory=dict)
    backend_error: str = ""
    peer_uid: int | None = None
    restart_count: int | None = None
    peer_pid: int | None = None
    mode: str | None = None
    role: str | None = None
    kind: Literal["hello"] = "hello"
    v: int = SCHEMA_VERSION


@dataclass(frozen=True, slots=True)
class StepReport:
    """One finished step on one rank, sent from ``rankhook.step()``.

    Example::

        {"kind": "step", "v": 2, "job_id": "j1", "rank": 3, "step": 120, "step_time_s": 0.412,
         "ts_unix_s": 1764500042.5, "stages": {"forward": 0.1, "backward": 0.25}, "flags": ["checkpoint"],
         "capturing": false}

    ``step_time_s`` is the wall time between the previous ``step()`` call and this one (monotonic clock).
    ``stages`` holds per-stage durations measured with ``rankhook.stage(name)``; ``flags`` marks steps the
    job declared special (``checkpoint``, ``eval``); ``capturing`` is true while a capture window is open.
    ``work`` is the work the rank did in this step as it reports it (``rankhook.step(work=...)``: tokens, batch
    size; finite, ``0 <= work <= MAX_WORK``; ``None`` when not reported), so a serving rank's step time can be
    normalised by its load. ``mode`` and ``role`` repeat the hello's (``None`` when not said), so every report says
    which peers it is to be compared with. The three were added without a schema bump: older receivers ignore
    them, older senders omit them. ``cpu_s`` (also added without a bump) is the sending process's CPU time over
    the step, all its threads (``time.process_time_ns()`` at each ``step()``; ``0 <= cpu_s <= MAX_CPU_S`` and
    ``cpu_s <= MAX_CPU_CORES * max(step_time_s, 0.001)``; ``None``
    from older hooks), compared across lockstep ranks (``docs/detection.md``, CPU time per step); the current hook
    no longer sends it. ``cpu_at_step`` and ``cpu_total_s`` (added without a bump) are a CPU sample: the sending
    process's CPU time since it started (``time.process_time_ns()``, all its threads, read at the end of a step
    every 0.25 s, ``rankhook.hook.CPU_SAMPLE_S``) and its step count then; both or neither, ``0 <= cpu_at_step <=
    step`` and ``0 <= cpu_total_s <= MAX_CPU_TOTAL_S``. The report after that step carries it; the
    coordinator divides the CPU time between two samples by the steps between them (``cpu/step``).

    Version 2: the hook sends :class:`StepReportUs` (integer microseconds); the node daemon reads it into this
    form (exact to the microsecond) and relays this form with ``peer_pid``: the pid of the process that sent the
    report, from the ipc connection's ``SO_PEERCRED`` (``None`` where the transport gives no credentials, and from
    version-1 nodes); whatever a rank writes there is overwritten. The coordinator credits a step counter going
    back to that process (``docs/generations.md``: one process is one vote).
    """

    job_id: str
    rank: int
    step: int
    step_time_s: float
    ts_unix_s: float
    stages: dict[str, float] | None = None
    flags: tuple[str, ...] = ()
    capturing: bool = False
    work: float | None = None
    mode: str | None = None
    role: str | None = None
    peer_pid: int | None = None
    cpu_s: float | None = None
    cpu_at_step: int | None = None
    cpu_total_s: float | None = None
    kind: Literal["step"] = "step"
    v: int = SCHEMA_VERSION


@dataclass(frozen=True, slots=True)
class StepReportUs:
    """A step report as the version-2 hook sends it: :class:`StepReport` with the step time and the timestamp in
    integer microseconds (``step_time_us``: the monotonic clock's interval since the previous ``step()``;
    ``ts_unix_us``: wall-clock Unix time), formatted with ``str(int)`` instead of a float ``repr``; ``cpu_us`` the
    process's CPU time over the step (integer microseconds, read as :class:`StepReport`'s ``cpu_s``; older hooks);
    ``cpu_total_us`` with ``cpu_at_step`` a CPU sample (integer microseconds, read as ``cpu_total_s``).

    Example::

        {"job_id": "j1", "rank": 3, "step": 120, "step_time_us": 412000, "ts_unix_us": 1764500042500000,
         "kind": "step", "v": 2}

    The node daemon turns it into a :class:`StepReport` (:meth:`report`); nothing else receives this form.
    """

    job_id: str
    rank: int
    step: int
    step_time_us: int
    ts_unix_us: int
    kind: Literal["step"]  # required: a report without its kind is refused, never taken for a step
    stages: dict[str, float] | None = None
    flags: tuple[str, ...] = ()
    capturing: bool = False
    work: float | None = None
    mode: str | None = None
    role: str | None = None
    cpu_us: int | None = None
    cpu_at_step: int | None = None
    cpu_total_us: int | None = None
    v: int = SCHEMA_VERSION

    def report(self, peer_pid: int | None = None) -> StepReport:
        """The :class:`StepReport` of this report (seconds = microseconds / 1e6), stamped with ``peer_pid``."""
        return StepReport(job_id=self.job_id, rank=self.rank, step=self.step, step_time_s=self.step_time_us / 1e6,
                          ts_unix_s=self.ts_unix_us / 1e6, stages=self.stages, flags=self.flags,
                          capturing=self.capturing, work=self.work, mode=self.mode, role=self.role,
                          peer_pid=peer_pid, v=self.v,
                          cpu_s=None if self.cpu_us is None else self.cpu_us / 1e6, cpu_at_step=self.cpu_at_step,
                          cpu_total_s=None if self.cpu_total_us is None else self.cpu_total_us / 1e6)


@dataclass(frozen=True, slots=True)
class CaptureEvent:
    """Progress of a capture window on one rank.

    ``event`` is one of ``arm_seen`` (a new ``profiler_config.json`` generation was read; ``generation`` is its
    whole-second mtime, ``start_step`` its start_step), ``arm_rejected`` (the config was invalid or its start_step
    already passed; ``detail`` says why), ``started``, ``completed`` (``rank_dir`` written, ``steps`` captured,
    ``total_bytes``) or ``failed``. ``source`` is ``hook`` for events sent by the rank, ``dp_log`` for
    acknowledgements the node daemon read from torch_npu's ``log/dp_*.log``.

    Example::

        {"kind": "capture", "v": 2, "job_id": "j1", "rank": 0, "event": "completed", "ts_unix_s": 1764500100.0,
         "capture_id": "c-20261130-0001", "generation": 1764500090, "start_step": 130, "step": 133,
         "rank_dir": "/shared/prof/j1/c-20261130-0001/node0_4242_20261130103000123_torch_pt",
         "steps": [130, 131, 132], "total_bytes": 123456, "source": "hook", "detail": ""}
    """

    job_id: str
    rank: int
    event: CaptureEventKind
    ts_unix_s: float
    capture_id: str | None = None
    generation: int | None = None
    start_step: int | None = None
    step: int | None = None
    rank_dir: str | None = None
    steps: tuple[int, ...] = ()
    total_bytes: int | None = None
    source: Literal["hook", "dp_log"] = "hook"
    detail: str = ""
    kind: Literal["capture"] = "capture"
    v: int = SCHEMA_VERSION


@dataclass(frozen=True, slots=True)
class RankBye:
    """Sent by ``rankhook.shutdown()``: the rank left on purpose (not stalled).

    Example: ``{"kind": "bye", "v": 2, "job_id": "j1", "rank": 3, "step": 500, "ts_unix_s": 1764500900.0}``
    """

    job_id: str
    rank: int
    step: int
    ts_unix_s: float
    kind: Literal["bye"] = "bye"
    v: int = SCHEMA_VERSION


RankMessage = RankHello | StepReport | CaptureEvent | RankBye


@dataclass(frozen=True, slots=True)
class NodeHeartbeat:
    """Periodic liveness and counters of one node daemon.

    Example::

        {"kind": "node_heartbeat", "v": 2, "node_id": "node1", "hostname": "node1", "pid": 900,
         "ts_unix_s": 1764500000.0, "started_unix_s": 1764400000.0,
         "counters": {"received": 1000, "rejected": 2, "relayed": 998, "dropped": 0}}

    ``stale_state`` describes torch_npu leftovers on the node that break dynamic profiling (a
    ``DynamicProfileNpuShm*`` segment older than the node's torch_npu ranks, an orphaned ``DynMonitorProc``);
    empty when the node is clean (added without a schema bump; older receivers ignore it). ``stopping``: the node
    daemon's last heartbeat, sent as it stops (its connection closes next: a routine close, not a dropped
    message; added without a schema bump).

    ``runnable_per_core``: the host's runnable tasks per online CPU, averaged over the heartbeat interval
    (``/proc/stat`` ``procs_running``); ``cpu_psi_some_pct``: the kernel's CPU pressure, PSI ``some avg10`` (%),
    averaged likewise. Each ``-1.0`` when not measured (no PSI on the kernel; an older node daemon never sends
    them). Added without a schema bump; older receivers ignore them (``daemon/profwatch/core/fleet/host_load.py``).
    """

    node_id: str
    hostname: str
    pid: int
    ts_unix_s: float
    started_unix_s: float
    counters: dict[str, int] = field(default_factory=dict)
    stale_state: str = ""
    stopping: bool = False
    runnable_per_core: float = -1.0
    cpu_psi_some_pct: float = -1.0
    kind: Literal["node_heartbeat"] = "node_heartbeat"
    v: int = SCHEMA_VERSION


@dataclass(frozen=True, slots=True)
class NodeBatch:
    """Rank messages relayed by a node daemon to the coordinator, in arrival order.

    ``seq`` increases by one per batch from one node process (gaps mean lost batches).
    ``messages`` are rank messages as plain dicts (validated again by the coordinator).

    Example::

        {"kind": "node_batch", "v": 2, "node_id": "node1", "hostname": "node1", "seq": 17,
         "ts_unix_s": 1764500000.1, "messages": [{"kind": "step", "v": 2, "job_id": "j1", ...}]}
    """

    node_id: str
    hostname: str
    seq: int
    ts_unix_s: float
    messages: list[dict[str, Any]] = field(default_factory=list)
    kind: Literal["node_batch"] = "node_batch"
    v: int = SCHEMA_VERSION


NODE_BUSY = "node busy"
"""``NodeAck.detail`` when the node daemon's file system queue was full: the command was not run (ask again)."""


@dataclass(frozen=True, slots=True)
class NodeCommand:
    """Coordinator -> node command, sent over the node's DEALER connection.

    ``cmd`` is ``register`` (resend every cached ``RankHello``: the coordinator does not know this node, e.g.
    after its restart), ``write_config`` (write ``args["config"]`` into ``args["profiler_config_path"]`` on
    this node and acknowledge with a :class:`NodeAck`; with ``args["idle_for"] = "<capture id>"`` the config is the
    idle one taking that capture's arm back, written only while the file still holds it, else acknowledged with
    ``result["skipped"]``), ``reconnect`` (another connection of this node's
    identity replaced this one: close it and connect again after ``args["after_s"]`` seconds) or
    ``heartbeat_ack`` (the answer to each :class:`NodeHeartbeat`: a node whose heartbeats go unanswered warns).

    Example: ``{"kind": "node_command", "v": 1, "cmd": "register", "command_id": "r-1", "args": {}}``
    """

    cmd: Literal["register", "write_config", "reconnect", "heartbeat_ack"]
    command_id: str
    args: dict[str, Any] = field(default_factory=dict)
    kind: Literal["node_command"] = "node_command"
    v: int = 1  # unchanged in version 2 and still sent as 1, so a version-1 node obeys a newer coordinator


@dataclass(frozen=True, slots=True)
class NodeAck:
    """Node -> coordinator result of a :class:`NodeCommand`.

    Example: ``{"kind": "node_ack", "v": 2, "node_id": "node1", "command_id": "w-3", "ok": true,
    "detail": "", "result": {"mtime_s": 1764500001}}``
    """

    node_id: str
    command_id: str
    ok: bool
    detail: str = ""
    result: dict[str, Any] = field(default_factory=dict)
    kind: Literal["node_ack"] = "node_ack"
    v: int = SCHEMA_VERSION


@dataclass(frozen=True, slots=True)
class NodeJobIdCollision:
    """Node -> coordinator: a local process claims a job id another job owns on this node, and its messages are
    refused there (``daemon/profwatch/core/fleet/job_pins.py``). Sent once per colliding process.

    ``reason``: ``paths_changed`` (its hello names other paths while the first job's processes are alive) or
    ``uid_mismatch`` (another uid: a squatted job id). ``owner_uid`` and ``owner_*`` paths are the first job's;
    ``uid``, ``pid``, ``rank`` and the paths the claimant's (from the ipc peer credentials and its hello).

    Example: ``{"kind": "node_job_id_collision", "v": 2, "node_id": "node1", "hostname": "node1", "job_id": "j1",
    "reason": "paths_changed", "owner_uid": 1000, "uid": 1000, "pid": 4242, "rank": 0, "refused": 1, ...}``
    """

    node_id: str
    hostname: str
    job_id: str
    reason: Literal["paths_changed", "uid_mismatch"]
    owner_uid: int
    uid: int
    rank: int
    ts_unix_s: float
    pid: int | None = None
    profiler_config_path: str | None = None
    prof_root: str | None = None
    owner_profiler_config_path: str | None = None
    owner_prof_root: str | None = None
    refused: int = 1
    detail: str = ""
    kind: Literal["node_job_id_collision"] = "node_job_id_collision"
    v: int = SCHEMA_VERSION


NodeMessage = NodeHeartbeat | NodeBatch | NodeAck | NodeJobIdCollision


def topic_for(kind: str, job_id: str | None = None, rank: int | None = None) -> str:
    """Return the ZeroMQ topic ``profwatch.<kind>[.<job_id>[.<rank>]]`` for a message."""
    parts = [TOPIC_PREFIX, kind]
    if job_id is not None:
        parts.append(job_id)
        if rank is not None:
            parts.append(str(rank))
    return ".".join(parts)


def to_dict(msg: Any) -> dict[str, Any]:
    """Return the message as a JSON-ready dict (tuples become lists)."""
    return asdict(msg)


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}
"""Field names of each message class, in definition order (filled on first use)."""
_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)
"""``json.dumps(obj, separators=(",", ":"), allow_nan=False)`` without building an encoder per call."""


def encode(msg: Any) -> bytes:
    """Serialise one message to compact UTF-8 JSON bytes, keys in field order (the bytes of
    ``json.dumps(asdict(msg))``). Raises ``ValueError`` for NaN or infinities.

    The node daemon re-encodes every rank message it relays: a shallow dict of the fields, not ``asdict`` (which
    deep-copies every value: 14 us of a step report's 18 us in the node's intake, now 3.3 of 6.5; node CPU per
    relayed report 45 -> 29 us, ``bench/bench_node.py``), and one encoder for all calls. The messages hold only JSON values (str, numbers, bools, None, and dicts, lists or tuples of them), so
    the bytes are the same.
    """
    cls = type(msg)
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = tuple(f.name for f in fields(msg))
    return _ENCODER.encode({n: getattr(msg, n) for n in names}).encode()


def frames(msg: Any) -> list[bytes]:
    """Return ``[topic, payload]`` frames for a rank or node message."""
    job_id = getattr(msg, "job_id", None)
    rank = getattr(msg, "rank", None)
    return [topic_for(msg.kind, job_id, rank).encode(), encode(msg)]
