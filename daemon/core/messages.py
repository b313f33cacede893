"""Validation of wire messages (pure): pydantic ``TypeAdapter`` over the dataclasses of ``rankhook/wire.py``.

The schema lives only in ``rankhook/wire.py``; this module adds the value rules the types cannot say
(finite non-negative times, ``0 <= rank < world_size``, safe ``job_id`` spelling, schema version) and turns every
failure into a :class:`MessageRejected` with a short ``reason`` code used for counters and one log line per kind.
"""

from __future__ import annotations

import math
import re
from dataclasses import make_dataclass
from functools import lru_cache
from typing import Annotated, Any, Literal, Union

from pydantic import Field, TypeAdapter, ValidationError

from rankhook import wire

JOB_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")
"""job_id becomes part of topics, file names and paths: letters, digits, ``_ . : -``; 1..128 chars."""
STAGE_NAME_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")
MAX_STAGES = 32
MAX_STEP = 2**62
MAX_WORLD_SIZE = 1 << 20
"""Ranks per job accepted (1,048,576): detectors allocate per-rank state, so absurd sizes are refused."""
MAX_INT = 2**62
"""Bound for ids and counters that reach SQLite (signed 64-bit) and per-rank tables."""


class MessageRejected(ValueError):
    """A message failed validation. ``reason`` is a stable snake_case code (counter label)."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


_RankUnion = Annotated[
    Union[wire.RankHello, wire.StepReport, wire.CaptureEvent, wire.RankBye],  # noqa: UP007
    Field(discriminator="kind"),
]
_NodeUnion = Annotated[
    Union[wire.NodeHeartbeat, wire.NodeBatch, wire.NodeAck],  # noqa: UP007
    Field(discriminator="kind"),
]
_rank_adapter: TypeAdapter[Any] = TypeAdapter(_RankUnion)
_node_adapter: TypeAdapter[Any] = TypeAdapter(_NodeUnion)
# A batch whose messages are validated in the same (Rust) pass as the envelope: the fast path.
_TypedBatch = make_dataclass(
    "_TypedBatch",
    [
        ("node_id", str),
        ("hostname", str),
        ("seq", int),
        ("ts_unix_s", float),
        ("messages", list[_RankUnion]),
        ("kind", Literal["node_batch"]),
        ("v", Literal[wire.SCHEMA_VERSION]),  # type: ignore[valid-type]
    ],
)
_typed_batch_adapter: TypeAdapter[Any] = TypeAdapter(_TypedBatch)
_command_adapter: TypeAdapter[wire.NodeCommand] = TypeAdapter(wire.NodeCommand)

_KNOWN_RANK_KINDS = {"hello", "step", "capture", "bye"}
_KNOWN_NODE_KINDS = {"node_heartbeat", "node_batch", "node_ack"}


def _finite_nonneg(x: float, name: str) -> None:
    if not 0.0 <= x < _INF:  # also false for NaN
        raise MessageRejected("bad_value", f"{name}={x!r} must be finite and >= 0")


_INF = math.inf


@lru_cache(maxsize=4096)
def _job_id_ok(job_id: str) -> bool:
    return JOB_ID_RE.match(job_id) is not None


def check_rank_message(msg: Any) -> Any:
    """Apply the value rules to a typed rank message; return it or raise :class:`MessageRejected`.

    Hot path of the coordinator (called once per step report): plain comparisons, job ids memoised.
    """
    if msg.v != wire.SCHEMA_VERSION:
        raise MessageRejected("bad_version", f"v={msg.v}, expected {wire.SCHEMA_VERSION}")
    if not _job_id_ok(msg.job_id):
        raise MessageRejected("bad_job_id", repr(msg.job_id[:80]))
    if not 0 <= msg.rank < MAX_WORLD_SIZE:
        raise MessageRejected("bad_rank", f"rank={msg.rank}")
    kind = msg.kind
    if kind == "step":
        if not (0.0 <= msg.step_time_s < _INF and 0.0 <= msg.ts_unix_s < _INF and 0 <= msg.step < MAX_STEP):
            _finite_nonneg(msg.step_time_s, "step_time_s")
            _finite_nonneg(msg.ts_unix_s, "ts_unix_s")
            raise MessageRejected("bad_value", f"step={msg.step}")
        if msg.stages:
            if len(msg.stages) > MAX_STAGES:
                raise MessageRejected("bad_value", f"{len(msg.stages)} stages > {MAX_STAGES}")
            for name, dur in msg.stages.items():
                if not STAGE_NAME_RE.match(name):
                    raise MessageRejected("bad_value", f"stage name {name[:40]!r}")
                _finite_nonneg(dur, f"stages[{name}]")
    elif kind == "hello":
        if not 1 <= msg.world_size <= MAX_WORLD_SIZE or msg.rank >= msg.world_size:
            raise MessageRejected("bad_rank", f"rank={msg.rank} world_size={msg.world_size} (max {MAX_WORLD_SIZE})")
        if not 0 <= msg.local_rank < MAX_WORLD_SIZE or not 0 < msg.pid < MAX_INT:
            raise MessageRejected("bad_value", f"local_rank={msg.local_rank} pid={msg.pid}")
        if any(not isinstance(v, int) or not 0 <= v < MAX_INT for v in msg.counters.values()):
            raise MessageRejected("bad_value", "counters out of range")
        _finite_nonneg(msg.ts_unix_s, "ts_unix_s")
    else:
        _finite_nonneg(msg.ts_unix_s, "ts_unix_s")
        for name in ("step", "generation", "start_step", "total_bytes"):
            v = getattr(msg, name, None)
            if v is not None and not -1 <= v < MAX_INT:
                raise MessageRejected("bad_value", f"{name}={v}")
        if kind == "capture" and len(msg.steps) > 10_000:
            raise MessageRejected("bad_value", f"{len(msg.steps)} captured steps")
    return msg


def _rejected_from(exc: ValidationError, known: set[str], raw: Any) -> MessageRejected:
    kind = raw.get("kind") if isinstance(raw, dict) else None
    if not isinstance(raw, dict):
        return MessageRejected("bad_schema", "not a JSON object")
    if kind not in known:
        return MessageRejected("unknown_kind", repr(kind)[:60])
    first = exc.errors()[0] if exc.errors() else {}
    loc = ".".join(str(p) for p in first.get("loc", ()))
    return MessageRejected("bad_schema", f"{loc}: {first.get('msg', '')}"[:200])


def parse_rank_message(raw: Any) -> Any:
    """Validate one rank message given as a dict (or JSON bytes/str); return the wire dataclass instance.

    Raises:
        MessageRejected: reason ``bad_json``, ``bad_schema``, ``unknown_kind``, ``bad_version``, ``bad_job_id``,
            ``bad_rank`` or ``bad_value``.
    """
    if isinstance(raw, (bytes, str)):
        import json

        try:
            raw = json.loads(raw)
        except (ValueError, RecursionError) as exc:
            raise MessageRejected("bad_json", str(exc)[:120]) from None
    if isinstance(raw, dict) and raw.get("v", wire.SCHEMA_VERSION) != wire.SCHEMA_VERSION:
        raise MessageRejected("bad_version", f"v={raw.get('v')!r}")
    try:
        msg = _rank_adapter.validate_python(raw)
    except ValidationError as exc:
        raise _rejected_from(exc, _KNOWN_RANK_KINDS, raw) from None
    except (ValueError, RecursionError) as exc:
        raise MessageRejected("bad_schema", str(exc)[:120]) from None
    return check_rank_message(msg)


def parse_node_message(data: bytes) -> tuple[Any, list[Any], list[MessageRejected]]:
    """Validate one node->coordinator message.

    Returns:
        ``(envelope, rank_messages, rejected)``: for a ``node_batch`` the valid rank messages (typed) and one
        :class:`MessageRejected` per bad one (the rest of the batch is kept); for other kinds the lists are empty.
    Raises:
        MessageRejected: the envelope itself is unusable.
    """
    import json

    # Fast path: the whole batch validates in one pass.
    try:
        tb = _typed_batch_adapter.validate_json(data)
    except (ValidationError, ValueError, RecursionError):
        tb = None  # not a batch, or one bad message inside: take the slow path that isolates it
    if tb is not None:
        good: list[Any] = []
        bad: list[MessageRejected] = []
        for m in tb.messages:
            try:
                good.append(check_rank_message(m))
            except MessageRejected as exc:
                bad.append(exc)
        if not 0 <= tb.seq < MAX_INT:
            raise MessageRejected("bad_value", f"seq={tb.seq}")
        env = wire.NodeBatch(node_id=tb.node_id, hostname=tb.hostname, seq=tb.seq, ts_unix_s=tb.ts_unix_s)
        return env, good, bad
    try:
        raw = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise MessageRejected("bad_json", str(exc)[:120]) from None
    if not isinstance(raw, dict):
        raise MessageRejected("bad_schema", "not a JSON object")
    if raw.get("v") != wire.SCHEMA_VERSION:
        raise MessageRejected("bad_version", f"v={raw.get('v')!r}")
    try:
        env = _node_adapter.validate_python(raw)
    except ValidationError as exc:
        raise _rejected_from(exc, _KNOWN_NODE_KINDS, raw) from None
    except (ValueError, RecursionError) as exc:
        raise MessageRejected("bad_schema", str(exc)[:120]) from None
    if env.kind == "node_heartbeat" and not (0 < env.pid < MAX_INT and 0.0 <= env.ts_unix_s < _INF
                                              and 0.0 <= env.started_unix_s < _INF
                                              and all(isinstance(v, int) and 0 <= v < MAX_INT
                                                      for v in env.counters.values())):
        raise MessageRejected("bad_value", "heartbeat pid/times/counters out of range")
    if env.kind == "node_batch" and not 0 <= env.seq < MAX_INT:
        raise MessageRejected("bad_value", f"seq={env.seq}")
    if env.kind != "node_batch":
        return env, [], []
    good, bad = [], []
    for m in env.messages:
        try:
            good.append(parse_rank_message(m))
        except MessageRejected as exc:
            bad.append(exc)
    return env, good, bad


def parse_node_command(data: bytes) -> wire.NodeCommand:
    """Validate a coordinator->node command. Raises :class:`MessageRejected`."""
    try:
        cmd = _command_adapter.validate_json(data)
    except ValidationError as exc:
        raise MessageRejected("bad_schema", str(exc.errors()[0].get("msg", ""))[:200]) from None
    if cmd.v != wire.SCHEMA_VERSION:
        raise MessageRejected("bad_version", f"v={cmd.v}")
    return cmd
