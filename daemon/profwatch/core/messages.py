"""Validation of wire messages (pure): pydantic ``TypeAdapter`` over the dataclasses of ``rankhook/wire.py``.

The schema lives only in ``rankhook/wire.py``; this module adds what the types cannot say and turns every failure
into a :class:`MessageRejected` with a short ``reason`` code used for counters and one log line per kind:

- **Encoding**: payloads are parsed as strict UTF-8 JSON (pydantic-core's parser, RFC 8259 section 8.1): UTF-16,
  UTF-32, a byte-order mark, invalid byte sequences and lone surrogates (``"\\ud800"``, which Python's ``json``
  accepts) are refused with reason ``bad_encoding``, so every string that gets in encodes to UTF-8 again.
- **Strict types** (pydantic strict mode): ``rank: "1"``, ``rank: true`` or ``rank: 1.0`` are refused; JSON
  numbers are accepted for float fields.
- **Physical bounds**: finite, non-negative times; a step shorter than :data:`MAX_STEP_TIME_S`; timestamps before
  :data:`MAX_TS_UNIX_S`; ``0 <= rank < world_size <= MAX_WORLD_SIZE``; bounded string lengths and dict sizes
  (:data:`MAX_TEXT`, :data:`MAX_PATH`, :data:`MAX_ENTRIES`), no NUL characters; safe ``job_id`` and ``node_id``.
- **Protocol version**: a rank message's ``v``, and a node message's envelope's, is one of
  ``wire.ACCEPTED_VERSIONS`` (a node batch must name it: its messages are read with that schema), else reason
  ``bad_version``: a batch whole. A version-2 step report in the hook's form (integer microseconds,
  :class:`rankhook.wire.StepReportUs`) is read into a :class:`rankhook.wire.StepReport` (:func:`parse_rank_message`).
- **Batches** are split, never dropped whole: a batch that fails as a whole is decoded element by element
  (:func:`parse_node_message`), each bad message is counted, every good one is kept.

The common message, a node batch whose messages all type-check, takes a fast path (:func:`parse_node_message`):
a batch of plain step reports (no stages, flags, work, mode or role: what a node relays between hellos for most
jobs) is decoded by msgspec into :data:`PlainStepReport` structs with the value rules checked in the same C pass
(:func:`_parse_plain_batch`); a batch of step reports only, straight into :class:`rankhook.wire.StepReport` objects
(:func:`_parse_step_batch`); any other batch by one pydantic pass that types the envelope and every message
(:func:`_parse_typed_batch`); then the same value checks (:func:`check_rank_message`). Whatever the types or a rule
refuse on a fast path takes the next one and at last the general path, so every refusal and its reason are the
general path's: a fast path only ever takes what the general path takes, as the same values (a plain report is a
:data:`PlainStepReport`, read field by field as the :class:`rankhook.wire.StepReport` it stands for;
``tests/unit/test_ingest_paths.py`` feeds all four the hostile cases, the bounds of each rule and property-based
random batches).
Costs per report on the bytes a node relays (``bench/bench_parse.py``, one bench run at load average ~11 on 2
cores): the plain path 0.52 us at 256 reports per batch, 0.70 at 16 (decode, rules, job id; load 7: 1.19 and
1.46 before it; a batch of rich reports, which it declines at the first one, 2.78 against 2.66), msgspec decode +
checks 1.2 us, the pydantic typed pass + checks 3.0 us (1.1-1.4 us for the pass alone at
load 8), ``json.loads`` alone 2.6 us (no types, no objects); a hand-checked path (``json.loads``, an allow-list of
keys and types, ``StepReport(**d)``, the same checks) was measured at 3.7-5.4 us (load 8): slower than pydantic, so
the library decoder, not our own code.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import MISSING, dataclass, field, fields, make_dataclass, replace
from functools import lru_cache
from typing import Annotated, Any, Literal, Union

import msgspec
from pydantic import Field, TypeAdapter, ValidationError

from profwatch.core.fleet.host_load import MAX_RUNNABLE_PER_CORE
from rankhook import wire

JOB_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}\Z")
"""job_id becomes part of topics, file names and paths: letters, digits, ``_ . : -``; 1..128 chars. It ends with
an end-of-string anchor, not a dollar sign, which also matches before a final newline (a second job ``j1`` + LF)."""
NODE_ID_RE = JOB_ID_RE
"""node_id (and CURVE key names) follow the job_id spelling: they appear in logs, metrics and file names."""
STAGE_NAME_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,64}\Z")
LABEL_RE = STAGE_NAME_RE
"""A ``mode`` or ``role`` label (``rankhook/wire.py``): the spelling of stage names."""
MAX_STAGES = 32
MAX_STEP = 2**62
MAX_WORLD_SIZE = 1 << 20
"""Ranks per job accepted (1,048,576). Per-rank state is allocated lazily, when a rank reports."""
MAX_INT = 2**62
"""Bound for ids and counters that reach SQLite (signed 64-bit) and per-rank tables."""
MAX_STEP_TIME_S = 7 * 86400.0
"""A step (or stage) longer than a week is not a measurement (``step_time_s: 1e308`` is refused)."""
MAX_CPU_S = wire.MAX_CPU_S
"""Largest ``cpu_s`` (the process's CPU time over one step) a step report may carry."""
_MAX_CPU_US = int(MAX_CPU_S * 1_000_000)


def cpu_time_ok(cpu_s: float, step_time_s: float) -> bool:
    """Whether a step report's ``cpu_s`` is a measurement of its step: finite, ``0 <= cpu_s <= MAX_CPU_S`` and at
    most ``wire.MAX_CPU_CORES`` cores busy for the step (``step_time_s``, at least 1 ms: the hook's shortest
    measured step). Without the second bound a rank saying 6e8 s of CPU for a 10 ms step was accepted and named as
    a ``rank_outlier`` with a magnitude of 1e11."""
    return 0.0 <= cpu_s <= MAX_CPU_S and cpu_s <= wire.MAX_CPU_CORES * max(step_time_s, 0.001)


MAX_CPU_TOTAL_S = wire.MAX_CPU_TOTAL_S
"""Largest ``cpu_total_s`` (a CPU sample: the process's CPU time since it started) a step report may carry."""
_MAX_CPU_TOTAL_US = int(MAX_CPU_TOTAL_S * 1_000_000)


def cpu_sample_ok(cpu_at_step: int | None, cpu_total_s: float | None, step: int) -> bool:
    """Whether a step report's CPU sample (``cpu_at_step``, ``cpu_total_s``) is one: both absent, or both present
    with ``0 <= cpu_at_step <= step`` (the hook reads the count, then the clock, before the report that carries
    them is formatted) and ``0 <= cpu_total_s <= MAX_CPU_TOTAL_S`` (finite). The rate bound (at most
    ``wire.MAX_CPU_CORES`` cores busy between two samples) is the aggregator's, which sees both samples."""
    if cpu_at_step is None:
        return cpu_total_s is None
    return cpu_total_s is not None and 0 <= cpu_at_step <= step and 0.0 <= cpu_total_s <= MAX_CPU_TOTAL_S
MAX_TS_UNIX_S = 1e10
"""Timestamps are Unix seconds before the year 2286."""
MAX_TEXT = 256
"""Characters in a short text field (hostname, backend version strings, flags, capture ids)."""
MAX_PATH = 4096
"""Characters in a path field (``PATH_MAX`` on Linux)."""
MAX_DETAIL = 2048
"""Characters in a free-text detail."""
MAX_ENTRIES = 64
"""Entries in a small dict or list field (versions, counters, flags)."""
CONTROL_RE = re.compile("[\x00-\x1f\x7f-\x9f]")
"""C0 and C1 control characters and DEL (ESC and CSI start terminal escape sequences)."""
MAX_CAPTURED_STEPS = 10_000
UTF8_BOM = b"\xef\xbb\xbf"
_MAX_STEP_TIME_US = int(MAX_STEP_TIME_S * 1_000_000)
_MAX_TS_UNIX_US = int(MAX_TS_UNIX_S * 1_000_000)
MAX_RESYNC = 100
"""Unreadable messages skipped inside one batch before the rest of it is given up (and counted)."""


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
    Union[wire.NodeHeartbeat, wire.NodeBatch, wire.NodeAck, wire.NodeJobIdCollision],  # noqa: UP007
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
        ("v", int),  # its value is checked by _check_envelope (a Literal would take 1.0, which strict int refuses)
    ],
)
_typed_batch_adapter: TypeAdapter[Any] = TypeAdapter(_TypedBatch)
_command_adapter: TypeAdapter[wire.NodeCommand] = TypeAdapter(wire.NodeCommand)


@dataclass(frozen=True, slots=True)
class _StepIn(wire.StepReport):
    """A :class:`rankhook.wire.StepReport` as the msgspec path decodes it: the same fields and values, with ``kind``
    required (the discriminated union of the other paths requires it; the wire dataclass gives it a default)."""

    kind: Literal["step"] = field(kw_only=True)


class _StepBatch(msgspec.Struct):
    """A ``node_batch`` of step reports only, the envelope typed as :data:`_TypedBatch` types it."""

    node_id: str
    hostname: str
    seq: int
    ts_unix_s: float
    messages: list[_StepIn]
    kind: Literal["node_batch"]
    v: int


_ACCEPTED = wire.ACCEPTED_VERSIONS
_step_batch_decoder = msgspec.json.Decoder(_StepBatch)  # strict: no str -> int, no bool -> int, no float -> int


def _plain_types() -> dict[str, Any]:
    """The type of each :class:`rankhook.wire.StepReport` field in a *plain* step report: the value rules of
    :func:`check_rank_message` for the common report as msgspec constraints (checked in C while decoding), and the
    optional fields narrowed to their absent value (no stages, flags, work, mode or role). The job id's spelling is
    checked apart, once per distinct id (:func:`_parse_plain_batch`)."""
    meta = msgspec.Meta
    return {
        "job_id": Annotated[str, meta(max_length=128)],
        "rank": Annotated[int, meta(ge=0, lt=MAX_WORLD_SIZE)],
        "step": Annotated[int, meta(ge=0, lt=MAX_STEP)],
        "step_time_s": Annotated[float, meta(ge=0.0, le=MAX_STEP_TIME_S)],
        "ts_unix_s": Annotated[float, meta(ge=0.0, le=MAX_TS_UNIX_S)],
        "stages": None,
        "flags": Annotated[tuple[str, ...], meta(max_length=0)],
        "capturing": bool,
        "work": None,
        "cpu_s": Union[Annotated[float, meta(ge=0.0, le=wire.MAX_CPU_S)], None],  # noqa: UP007
        "cpu_at_step": Union[Annotated[int, meta(ge=0, lt=MAX_STEP)], None],  # noqa: UP007
        "cpu_total_s": Union[Annotated[float, meta(ge=0.0, le=wire.MAX_CPU_TOTAL_S)], None],  # noqa: UP007
        "mode": None,
        "role": None,
        "peer_pid": Union[Annotated[int, meta(gt=0, lt=2**32)], None],  # noqa: UP007
        "kind": Literal["step"],
        "v": Literal.__getitem__(tuple(sorted(_ACCEPTED))),
    }


def _plain_struct() -> type[msgspec.Struct]:
    """:data:`PlainStepReport`: one msgspec field per :class:`rankhook.wire.StepReport` field, in its order and
    with its default (``kind`` required, as on every other path), typed by :func:`_plain_types`. Raises
    ``KeyError`` at import when the wire dataclass gained a field this module does not type yet."""
    types = _plain_types()
    spec: list[Any] = []
    for f in fields(wire.StepReport):
        if f.name == "kind" or f.default is MISSING:
            spec.append((f.name, types[f.name]))
        else:
            spec.append((f.name, types[f.name], f.default))
    return msgspec.defstruct("PlainStepReport", spec, kw_only=True, frozen=True, gc=False, module=__name__)


PlainStepReport = _plain_struct()
"""A step report in its common form, as the plain path (:func:`_parse_plain_batch`) decodes it: the fields of
:class:`rankhook.wire.StepReport`, read the same way (``report.rank``, ``report.stages``...), its value rules already
checked, its optional fields absent (``stages`` and the others None, ``flags`` empty). A frozen msgspec struct, not
tracked by the cyclic garbage collector (it holds no container)."""


class _PlainBatch(msgspec.Struct, gc=False):
    """A ``node_batch`` of plain step reports only, the envelope typed as :data:`_TypedBatch` types it."""

    node_id: str
    hostname: str
    seq: int
    ts_unix_s: float
    messages: list[PlainStepReport]  # type: ignore[valid-type]
    kind: Literal["node_batch"]
    v: int


_plain_batch_decoder = msgspec.json.Decoder(_PlainBatch)
_step_us_adapter: TypeAdapter[wire.StepReportUs] = TypeAdapter(wire.StepReportUs)

_KNOWN_RANK_KINDS = {"hello", "step", "capture", "bye"}
_KNOWN_NODE_KINDS = {"node_heartbeat", "node_batch", "node_ack", "node_job_id_collision"}
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
_INF = math.inf


# -- small checks -------------------------------------------------------------------------------------------------
def _time_ok(x: float, limit: float) -> bool:
    return 0.0 <= x <= limit  # also false for NaN and inf


def _check_time(x: float, name: str, limit: float) -> None:
    if not _time_ok(x, limit):
        raise MessageRejected("bad_value", f"{name}={x!r} must be finite, >= 0 and <= {limit:g}")


def _check_text(s: str | None, name: str, limit: int = MAX_TEXT) -> None:
    if s is not None and (len(s) > limit or "\x00" in s):
        raise MessageRejected("bad_value", f"{name}: longer than {limit} characters or contains NUL")


def _name_ok(s: str) -> bool:
    """The rule of :func:`_check_name` as a predicate (at most ``MAX_TEXT`` characters, no NUL, no control
    character)."""
    return len(s) <= MAX_TEXT and "\x00" not in s and CONTROL_RE.search(s) is None


def _check_name(s: str | None, name: str) -> None:
    """A short text shown as it is by ``profwatch status``/``alerts`` (hostname, version strings): no C0/C1 control
    characters, so a peer cannot write terminal escape sequences onto an operator's screen."""
    if s is None or _name_ok(s):
        return
    _check_text(s, name)
    raise MessageRejected("bad_value", f"{name}: contains a control character")


def _check_str_dict(d: dict[str, Any], name: str) -> None:
    if len(d) > MAX_ENTRIES:
        raise MessageRejected("bad_value", f"{name}: {len(d)} entries > {MAX_ENTRIES}")
    for k, v in d.items():
        _check_text(k, f"{name} key")
        if isinstance(v, str):
            _check_text(v, f"{name}[{k[:40]}]")


@lru_cache(maxsize=4096)
def _label_ok(label: str) -> bool:
    """True for a :data:`LABEL_RE` label (also the spelling of stage names). Memoised: callers check the length
    (<= 64) first, so the cache holds short keys only."""
    return LABEL_RE.match(label) is not None


def _check_labels(msg: Any) -> None:
    """``mode`` and ``role`` of a hello or step report: ``None`` or a :data:`LABEL_RE` label (memoised)."""
    for name in ("mode", "role"):
        v = getattr(msg, name)
        if v is not None and (len(v) > 64 or not _label_ok(v)):  # the length first: the cache holds short keys
            raise MessageRejected("bad_value", f"{name}={v[:40]!r}: letters, digits, _ . : - (1..64)")


@lru_cache(maxsize=4096)
def _job_id_spelled(job_id: str) -> bool:
    return JOB_ID_RE.match(job_id) is not None


def _job_id_ok(job_id: str) -> bool:
    """True for a :data:`JOB_ID_RE` job id. Memoised for the ids that can pass (at most 128 characters): a longer
    one, which fails anyway, never enters the cache (4096 ids of a batch's size would be gigabytes)."""
    return len(job_id) <= 128 and _job_id_spelled(job_id)


def node_id_ok(node_id: str) -> bool:
    """True when ``node_id`` is safe to use as an identity, a log field and a metric label."""
    return NODE_ID_RE.match(node_id) is not None


@lru_cache(maxsize=4096)
def _names_ok(node_id: str, hostname: str) -> bool:
    """Whether an envelope's ``node_id`` and ``hostname`` pass :func:`node_id_ok` and :func:`_check_name`, memoised
    (each batch names them; callers pass short strings only, so the cache holds short keys)."""
    return node_id_ok(node_id) and _name_ok(hostname)


def utf8_clean(obj: Any, depth: int = 0) -> bool:
    """True when every string (and dict key) inside ``obj`` encodes to UTF-8 (no lone surrogates) and the
    structure is at most 64 levels deep. For objects decoded with Python's ``json`` (control requests)."""
    if depth > 64:
        return False
    if isinstance(obj, str):
        try:
            obj.encode("utf-8")
        except UnicodeEncodeError:
            return False
        return True
    if isinstance(obj, dict):
        return all(utf8_clean(k, depth + 1) and utf8_clean(v, depth + 1) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return all(utf8_clean(v, depth + 1) for v in obj)
    return True


def _encoding_problem(data: bytes | str) -> str | None:
    """Why ``data`` is not strict UTF-8 JSON text, or None when its encoding is fine."""
    if isinstance(data, str):
        try:
            data = data.encode("utf-8")
        except UnicodeEncodeError:
            return "text contains lone surrogates"
    if data.startswith(UTF8_BOM):
        return "byte-order mark (JSON text must be UTF-8 without a BOM)"
    if data[:2] in (b"\xff\xfe", b"\xfe\xff") or (len(data) > 1 and (data[0] == 0 or data[1] == 0)):
        return "UTF-16 or UTF-32 (JSON text must be UTF-8)"
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"invalid UTF-8 at byte {exc.start}"
    if _SURROGATE_ESCAPE.search(data) is not None:
        return "\\u escape of a lone surrogate"
    return None


# -- rank messages ------------------------------------------------------------------------------------------------
def check_rank_message(msg: Any) -> Any:
    """Apply the value rules to a typed rank message; return it or raise :class:`MessageRejected`.

    Hot path of the coordinator (called once per step report): plain comparisons, job ids memoised.
    """
    if msg.v not in _ACCEPTED:
        raise MessageRejected("bad_version", f"v={msg.v}, expected one of {sorted(_ACCEPTED)}")
    if not _job_id_ok(msg.job_id):
        raise MessageRejected("bad_job_id", repr(msg.job_id[:80]))
    if not 0 <= msg.rank < MAX_WORLD_SIZE:
        raise MessageRejected("bad_rank", f"rank={msg.rank}")
    kind = msg.kind
    if kind == "step":
        if not (0.0 <= msg.step_time_s <= MAX_STEP_TIME_S and 0.0 <= msg.ts_unix_s <= MAX_TS_UNIX_S
                and 0 <= msg.step < MAX_STEP):
            _check_time(msg.step_time_s, "step_time_s", MAX_STEP_TIME_S)
            _check_time(msg.ts_unix_s, "ts_unix_s", MAX_TS_UNIX_S)
            raise MessageRejected("bad_value", f"step={msg.step}")
        stages = msg.stages
        if stages:
            if len(stages) > MAX_STAGES:
                raise MessageRejected("bad_value", f"{len(stages)} stages > {MAX_STAGES}")
            for name, dur in stages.items():
                # a stage name is spelled as a label (STAGE_NAME_RE is LABEL_RE): the same memoised check
                if len(name) > 64 or not _label_ok(name):
                    raise MessageRejected("bad_value", f"stage name {name[:40]!r}")
                if not 0.0 <= dur <= MAX_STEP_TIME_S:
                    _check_time(dur, f"stages[{name}]", MAX_STEP_TIME_S)
        if msg.flags:
            if len(msg.flags) > MAX_ENTRIES:
                raise MessageRejected("bad_value", f"{len(msg.flags)} flags > {MAX_ENTRIES}")
            for f in msg.flags:
                _check_text(f, "flags", 64)
        if msg.work is not None and not 0.0 <= msg.work <= wire.MAX_WORK:
            raise MessageRejected("bad_value", f"work={msg.work!r} must be finite, >= 0 and <= {wire.MAX_WORK:g}")
        if msg.cpu_s is not None and not cpu_time_ok(msg.cpu_s, msg.step_time_s):
            raise MessageRejected("bad_value", f"cpu_s={msg.cpu_s!r} must be finite, >= 0, <= {wire.MAX_CPU_S:g} "
                                               f"and <= {wire.MAX_CPU_CORES} x max(step_time_s, 0.001)")
        if (msg.cpu_at_step is not None or msg.cpu_total_s is not None) and not cpu_sample_ok(
                msg.cpu_at_step, msg.cpu_total_s, msg.step):
            raise MessageRejected("bad_value", f"cpu_at_step={msg.cpu_at_step!r} cpu_total_s={msg.cpu_total_s!r}: "
                                               f"both or neither, 0 <= cpu_at_step <= step ({msg.step}), "
                                               f"0 <= cpu_total_s <= {wire.MAX_CPU_TOTAL_S:g}")
        if msg.mode is not None or msg.role is not None:
            _check_labels(msg)
        if msg.peer_pid is not None and not 0 < msg.peer_pid < 2**32:
            raise MessageRejected("bad_value", f"peer_pid={msg.peer_pid}")
    elif kind == "hello":
        _check_hello(msg)
    else:
        _check_capture_or_bye(msg)
    return msg


def _check_hello(msg: Any) -> None:
    """The value rules of a :class:`rankhook.wire.RankHello` beyond the common ones (:func:`check_rank_message`);
    raises :class:`MessageRejected`."""
    if not 1 <= msg.world_size <= MAX_WORLD_SIZE or msg.rank >= msg.world_size:
        raise MessageRejected("bad_rank", f"rank={msg.rank} world_size={msg.world_size} (max {MAX_WORLD_SIZE})")
    if not 0 <= msg.local_rank < MAX_WORLD_SIZE or not 0 < msg.pid < MAX_INT:
        raise MessageRejected("bad_value", f"local_rank={msg.local_rank} pid={msg.pid}")
    if len(msg.counters) > MAX_ENTRIES or any(not 0 <= v < MAX_INT for v in msg.counters.values()):
        raise MessageRejected("bad_value", "counters out of range")
    _check_time(msg.ts_unix_s, "ts_unix_s", MAX_TS_UNIX_S)
    _check_name(msg.hostname, "hostname")
    _check_str_dict(msg.versions, "versions")
    for v in msg.versions.values():
        _check_name(v, "versions")
    _check_str_dict(msg.counters, "counters")
    _check_text(msg.profiler_config_path, "profiler_config_path", MAX_PATH)
    _check_text(msg.prof_root, "prof_root", MAX_PATH)
    if msg.peer_uid is not None and not 0 <= msg.peer_uid < 2**32:
        raise MessageRejected("bad_value", f"peer_uid={msg.peer_uid}")
    if msg.peer_pid is not None and not 0 < msg.peer_pid < 2**32:
        raise MessageRejected("bad_value", f"peer_pid={msg.peer_pid}")
    if msg.restart_count is not None and not 0 <= msg.restart_count < MAX_INT:
        raise MessageRejected("bad_value", f"restart_count={msg.restart_count}")
    _check_labels(msg)


def _check_capture_or_bye(msg: Any) -> None:
    """The value rules of a :class:`rankhook.wire.CaptureEvent` or :class:`rankhook.wire.RankBye` beyond the common
    ones (:func:`check_rank_message`); raises :class:`MessageRejected`."""
    _check_time(msg.ts_unix_s, "ts_unix_s", MAX_TS_UNIX_S)
    for name in ("step", "generation", "start_step", "total_bytes"):
        v = getattr(msg, name, None)
        if v is not None and not -1 <= v < MAX_INT:
            raise MessageRejected("bad_value", f"{name}={v}")
    if msg.kind == "capture":
        if len(msg.steps) > MAX_CAPTURED_STEPS or any(not 0 <= s < MAX_STEP for s in msg.steps):
            raise MessageRejected("bad_value", f"{len(msg.steps)} captured steps (max {MAX_CAPTURED_STEPS})")
        _check_text(msg.capture_id, "capture_id")
        _check_text(msg.rank_dir, "rank_dir", MAX_PATH)
        _check_text(msg.detail, "detail", MAX_DETAIL)


def _rejected_from(exc: ValidationError, known: set[str], data: bytes | str) -> MessageRejected:
    """Turn a pydantic failure into a reason: encoding first, then JSON syntax, then kind/schema."""
    problem = _encoding_problem(data)
    if problem is not None:
        return MessageRejected("bad_encoding", problem)
    errors: list[Any] = list(exc.errors())
    first: dict[str, Any] = dict(errors[0]) if errors else {}
    if first.get("type") == "json_invalid":
        return MessageRejected("bad_json", str(first.get("msg", ""))[:120])
    try:
        raw = json.loads(data)
    except (ValueError, RecursionError):
        raw = None
    if not isinstance(raw, dict):
        return MessageRejected("bad_schema", "not a JSON object")
    kind = raw.get("kind")
    if "kind" not in raw:
        return MessageRejected("bad_schema", f"kind: missing (one of {', '.join(sorted(known))})")
    if kind not in known:
        return MessageRejected("unknown_kind", repr(kind)[:60])
    if raw.get("v", wire.SCHEMA_VERSION) not in _ACCEPTED:
        return MessageRejected("bad_version", f"v={raw.get('v')!r}")
    loc = ".".join(str(p) for p in first.get("loc", ()))
    return MessageRejected("bad_schema", f"{loc}: {first.get('msg', '')}"[:200])


_US_FIELDS = ("step_time_us", "ts_unix_us", "cpu_us", "cpu_at_step", "cpu_total_us")


def _us_field_error(exc: ValidationError) -> MessageRejected | None:
    """A ``bad_schema`` naming the hook form's own field (``step_time_us``, ``ts_unix_us``: integer microseconds)
    when that field is present with a wrong value (a float, a string); None when the failure is elsewhere (the
    general rules then decide) or the field is absent (the text was inside a string)."""
    for err in exc.errors():
        loc = err.get("loc") or ()
        if loc and loc[0] in _US_FIELDS and err.get("type") != "missing":
            return MessageRejected("bad_schema", f"{loc[0]}: {err.get('msg', '')} (integer microseconds, got "
                                                 f"{err.get('input')!r:.40})")
    return None


def parse_rank_message(raw: bytes | str | dict[str, Any], peer_pid: int | None = None) -> Any:
    """Validate one rank message given as UTF-8 JSON bytes (or str, or an already decoded dict); return the wire
    dataclass instance.

    A dict is re-serialised first, so the same strict JSON rules apply to it (its lone surrogates are refused).
    A version-2 step report in the hook's form (``step_time_us``, ``ts_unix_us``: integers) is returned as the
    :class:`rankhook.wire.StepReport` it stands for, stamped with ``peer_pid`` (the node's attested pid of the
    sender; None where the transport gives none); a step report in the relayed form keeps the ``peer_pid`` it
    carries (the caller, a node daemon, overwrites it).

    Raises:
        MessageRejected: reason ``bad_encoding``, ``bad_json``, ``bad_schema``, ``unknown_kind``, ``bad_version``,
            ``bad_job_id``, ``bad_rank`` or ``bad_value``.
    """
    if isinstance(raw, dict):
        try:
            raw = json.dumps(raw)
        except (ValueError, TypeError, RecursionError) as exc:
            raise MessageRejected("bad_schema", str(exc)[:120]) from None
    if (b'"step_time_us"' if isinstance(raw, bytes) else '"step_time_us"') in raw:  # type: ignore[operator]
        try:
            us = _step_us_adapter.validate_json(raw, strict=True)
        except ValidationError as exc:
            own = _us_field_error(exc)
            if own is not None:  # the hook's form with a bad microsecond field: name that field
                raise own from None
            # else not the hook's form after all (the text was inside a string): the general rules decide
        except (ValueError, RecursionError):
            pass  # the general rules decide (and say why)
        else:
            if not (0 <= us.step_time_us <= _MAX_STEP_TIME_US and 0 <= us.ts_unix_us <= _MAX_TS_UNIX_US):
                raise MessageRejected("bad_value", f"step_time_us={us.step_time_us} ts_unix_us={us.ts_unix_us} must "
                                      f"be >= 0 and <= {_MAX_STEP_TIME_US} / {_MAX_TS_UNIX_US}")
            if us.cpu_us is not None and not 0 <= us.cpu_us <= _MAX_CPU_US:
                raise MessageRejected("bad_value", f"cpu_us={us.cpu_us} must be >= 0 and <= {_MAX_CPU_US}")
            if us.cpu_total_us is not None and not 0 <= us.cpu_total_us <= _MAX_CPU_TOTAL_US:
                raise MessageRejected("bad_value", f"cpu_total_us={us.cpu_total_us} must be >= 0 and <= "
                                                   f"{_MAX_CPU_TOTAL_US}")
            return check_rank_message(us.report(peer_pid))
    try:
        msg = _rank_adapter.validate_json(raw, strict=True)
    except ValidationError as exc:
        raise _rejected_from(exc, _KNOWN_RANK_KINDS, raw) from None
    except (ValueError, RecursionError) as exc:
        raise MessageRejected("bad_json", str(exc)[:120]) from None
    return check_rank_message(msg)


# -- node messages ------------------------------------------------------------------------------------------------
def _check_envelope(env: Any) -> None:
    """The value rules of a node message's envelope (a batch's messages are checked one by one apart). Its protocol
    version first, as a rank message's (:func:`check_rank_message`). Raises :class:`MessageRejected`."""
    if env.v not in _ACCEPTED:
        raise MessageRejected("bad_version", f"v={env.v}, expected one of {sorted(_ACCEPTED)}")
    host = getattr(env, "hostname", None)
    if not (len(env.node_id) <= 128 and host is not None and len(host) <= MAX_TEXT and _names_ok(env.node_id, host)):
        if not node_id_ok(env.node_id):
            raise MessageRejected("bad_node_id", repr(env.node_id[:80]))
        _check_name(host, "hostname")
    if env.kind == "node_batch":
        if not 0 <= env.seq < MAX_INT or not _time_ok(env.ts_unix_s, MAX_TS_UNIX_S):
            raise MessageRejected("bad_value", f"seq={env.seq} ts_unix_s={env.ts_unix_s}")
    elif env.kind == "node_heartbeat":
        if not (0 < env.pid < MAX_INT and _time_ok(env.ts_unix_s, MAX_TS_UNIX_S)
                and _time_ok(env.started_unix_s, MAX_TS_UNIX_S) and len(env.counters) <= MAX_ENTRIES
                and all(0 <= v < MAX_INT for v in env.counters.values())):
            raise MessageRejected("bad_value", "heartbeat pid/times/counters out of range")
        _check_str_dict(env.counters, "counters")


def _host_load_ok(x: Any, limit: float) -> bool:
    """A heartbeat's host-load figure: exactly -1 (not measured) or a finite number in ``[0, limit]``."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and (x == -1.0 or (math.isfinite(x) and 0.0 <= x <= limit))


def _checked_host_load(env: Any) -> tuple[Any, list[MessageRejected]]:
    """The host-load fields of a heartbeat (``rankhook/wire.py`` ``NodeHeartbeat``; absent from an older node
    daemon's: their defaults, -1). A figure out of range is dropped (set to -1, not measured) and its refusal
    returned (``bad_value``, counted by the caller): the heartbeat itself, the node's liveness, counters and
    ``stopping``, is kept. Before, one absurd figure refused the whole heartbeat, every heartbeat of that node."""
    r, p = getattr(env, "runnable_per_core", -1.0), getattr(env, "cpu_psi_some_pct", -1.0)
    r_ok, p_ok = _host_load_ok(r, MAX_RUNNABLE_PER_CORE), _host_load_ok(p, 100.0)
    if r_ok and p_ok:
        return env, []
    bad = MessageRejected("bad_value", f"heartbeat host load out of range, dropped: runnable_per_core={str(r)[:24]} "
                                       f"cpu_psi_some_pct={str(p)[:24]}")
    return replace(env, runnable_per_core=r if r_ok else -1.0, cpu_psi_some_pct=p if p_ok else -1.0), [bad]


def _check_collision(env: wire.NodeJobIdCollision) -> None:
    if not _job_id_ok(env.job_id):
        raise MessageRejected("bad_job_id", repr(env.job_id[:80]))
    if not (0 <= env.owner_uid < MAX_INT and 0 <= env.uid < MAX_INT and 0 <= env.rank < MAX_INT
            and 0 < env.refused < MAX_INT and (env.pid is None or 0 < env.pid < MAX_INT)
            and _time_ok(env.ts_unix_s, MAX_TS_UNIX_S)):
        raise MessageRejected("bad_value", "collision uids/rank/pid/count/time out of range")
    for name in ("profiler_config_path", "prof_root", "owner_profiler_config_path", "owner_prof_root"):
        _check_text(getattr(env, name), name, MAX_PATH)
    _check_text(env.detail, "detail", MAX_DETAIL)


def _names_version(envelope: str) -> bool:
    """True when a batch's envelope (its JSON text without the messages) has a ``v`` key: the typed batch
    (:func:`_parse_typed_batch`) requires one, and the general path must not take a batch without it either."""
    try:
        head = json.loads(envelope)
    except (ValueError, RecursionError):
        return False
    return isinstance(head, dict) and "v" in head


def _messages_key(text: str) -> int:
    """Where the top-level ``"messages"`` key of a batch's JSON text starts, or -1: the envelope's members before it
    are read as JSON one by one (a value such as ``"hostname": "messages"`` is not the key); the first occurrence
    of the text when that read fails."""
    decoder = json.JSONDecoder()
    ws = " \t\r\n"
    pos = len(text) - len(text.lstrip(ws))
    if not text.startswith("{", pos):
        return text.find('"messages"')
    pos += 1
    try:
        while True:
            while pos < len(text) and text[pos] in ws + ",":
                pos += 1
            at = pos
            name, pos = decoder.raw_decode(text, pos)
            while pos < len(text) and text[pos] in ws:
                pos += 1
            if not isinstance(name, str) or not text.startswith(":", pos):
                break
            if name == "messages":
                return at
            while pos + 1 < len(text) and text[pos + 1] in ws:
                pos += 1
            _, pos = decoder.raw_decode(text, pos + 1)
    except (ValueError, RecursionError):
        pass
    return text.find('"messages"')


def _split_batch(data: bytes, max_messages: int) -> tuple[Any, list[Any], list[MessageRejected]]:
    """Slow path: decode a batch that failed as a whole, element by element, keeping every good message.

    Invalid UTF-8 inside one message is kept apart (``surrogateescape``), so it spoils only that message; a
    message that is not valid JSON is skipped by resynchronising on the next ``{`` at the top level of the
    ``messages`` array. At most ``max_messages`` elements are examined, and the split stops after
    :data:`MAX_RESYNC` unreadable ones (the work stays linear in the batch size).
    """
    text = data.decode("utf-8", errors="surrogateescape")
    key = _messages_key(text)
    start = text.find("[", key) if key >= 0 else -1
    if start < 0:
        raise MessageRejected("bad_schema", "no messages array")
    # the envelope: everything except the messages array
    end = text.rfind("]")
    head = text[:key] + '"messages":[]' + text[end + 1 :] if end > start else ""
    try:
        env = _node_adapter.validate_json(head.encode("utf-8", errors="surrogateescape"), strict=True)
    except (ValidationError, ValueError, RecursionError) as exc:
        raise MessageRejected("bad_schema", f"batch envelope unreadable: {str(exc)[:120]}") from None
    if env.kind != "node_batch":
        raise MessageRejected("bad_schema", "a messages array outside a node_batch")
    if not _names_version(head):
        raise MessageRejected("bad_version", f"a node_batch without v (expected {wire.SCHEMA_VERSION})")
    _check_envelope(env)
    decoder = json.JSONDecoder()
    good: list[Any] = []
    bad: list[MessageRejected] = []
    pos, failures = start + 1, 0
    while pos < end and len(good) + len(bad) < max_messages:
        while pos < end and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= end:
            break
        try:
            obj, nxt = decoder.raw_decode(text, pos)
        except (ValueError, RecursionError):
            bad.append(MessageRejected("bad_json", f"unreadable message at character {pos}"))
            failures += 1
            nxt = text.find(",{", pos + 1)
            if nxt < 0 or failures >= MAX_RESYNC:
                if nxt >= 0:
                    bad.append(MessageRejected("bad_json", f"split abandoned after {failures} unreadable messages"))
                break
            pos = nxt + 1
            continue
        pos = nxt
        if not isinstance(obj, dict):
            bad.append(MessageRejected("bad_schema", "not a JSON object"))
            continue
        if not utf8_clean(obj):
            bad.append(MessageRejected("bad_encoding", "a string that is not UTF-8"))
            continue
        try:
            good.append(parse_rank_message(obj))
        except MessageRejected as exc:
            bad.append(exc)
    if len(good) + len(bad) >= max_messages and text[pos:end].strip(" \t\r\n,"):
        bad.append(_too_many(max_messages))
    return env, good, bad


def _parse_plain_batch(data: bytes, max_messages: int = 20_000
                       ) -> tuple[wire.NodeBatch, list[Any], list[MessageRejected]] | None:
    """Fastest path of :func:`parse_node_message`: a ``node_batch`` of plain step reports only (what a node relays
    between hellos from a job that reports no stages, flags, work, mode or role), decoded by msgspec into
    :data:`PlainStepReport` with the value rules of :func:`check_rank_message` checked as it decodes; the job id's
    spelling once per distinct id. Returns as :func:`_parse_typed_batch`, or None when anything is not plainly
    within those rules (a hello, one report with stages, a value out of range, a badly spelled job id...): the next
    path decides, with its reasons. Raises :class:`MessageRejected` for an unusable envelope, as the general path."""
    try:
        tb = _plain_batch_decoder.decode(data)
    except (msgspec.MsgspecError, ValueError, RecursionError):
        return None
    env = wire.NodeBatch(node_id=tb.node_id, hostname=tb.hostname, seq=tb.seq, ts_unix_s=tb.ts_unix_s, v=tb.v)
    _check_envelope(env)
    msgs: list[Any] = tb.messages
    bad: list[MessageRejected] = []
    if len(msgs) > max_messages:
        msgs = msgs[:max_messages]
        bad.append(_too_many(max_messages))
    job_ok: str | None = None  # not "": an empty job id is checked (and refused) like any other
    for m in msgs:
        if m.job_id != job_ok:
            if not _job_id_ok(m.job_id):
                return None  # refused by the next paths, with check_rank_message's reason
            job_ok = m.job_id
        if m.cpu_s is not None and m.cpu_s > wire.MAX_CPU_CORES * max(m.step_time_s, 0.001):
            return None  # more CPU than every core for the step (cpu_time_ok): refused by the next paths
        if (m.cpu_at_step is not None or m.cpu_total_s is not None) and not cpu_sample_ok(
                m.cpu_at_step, m.cpu_total_s, m.step):
            return None  # half a CPU sample, or one read after its report's step: refused by the next paths
    return env, msgs, bad


def _parse_step_batch(data: bytes, max_messages: int = 20_000
                      ) -> tuple[wire.NodeBatch, list[Any], list[MessageRejected]] | None:
    """Fastest path of :func:`parse_node_message`: a ``node_batch`` of step reports only, decoded by msgspec
    (strict JSON, strict types) into :class:`_StepIn` (a :class:`rankhook.wire.StepReport`), then the value checks
    of :func:`check_rank_message`. Returns as :func:`_parse_typed_batch`, or None when msgspec refuses anything (a
    hello in the batch, another encoding, a lone surrogate, ``NaN``, a wrong type...): the next path decides.
    Raises :class:`MessageRejected` for an unusable envelope, as the general path."""
    try:
        tb = _step_batch_decoder.decode(data)
    except (msgspec.MsgspecError, ValueError, RecursionError):
        return None
    return _checked(wire.NodeBatch(node_id=tb.node_id, hostname=tb.hostname, seq=tb.seq, ts_unix_s=tb.ts_unix_s,
                                   v=tb.v), tb.messages, max_messages)


def _checked(env: wire.NodeBatch, messages: list[Any], max_messages: int
             ) -> tuple[wire.NodeBatch, list[Any], list[MessageRejected]]:
    """The envelope's and each message's value checks of a typed batch (both fast paths).

    The common step report (no stages, flags, work or labels; a job id seen in this batch already) is checked
    inline: the rules of :func:`check_rank_message` for it, in one expression; any report that is not plainly
    within them goes through :func:`check_rank_message` itself, so every refusal and its reason are that
    function's (``tests/unit/test_ingest_paths.py``)."""
    _check_envelope(env)
    good: list[Any] = []
    bad: list[MessageRejected] = []
    keep = good.append
    accepted = _ACCEPTED
    job_ok: str | None = None  # the last job id that passed its check in this batch (None: not "", never valid)
    for m in messages[:max_messages]:
        if (m.kind == "step" and m.job_id == job_ok and m.v in accepted and 0 <= m.rank < MAX_WORLD_SIZE
                and 0.0 <= m.step_time_s <= MAX_STEP_TIME_S and 0.0 <= m.ts_unix_s <= MAX_TS_UNIX_S
                and 0 <= m.step < MAX_STEP and not m.stages and not m.flags and m.work is None and m.mode is None
                and m.role is None and (m.peer_pid is None or 0 < m.peer_pid < 4294967296)
                and (m.cpu_s is None or cpu_time_ok(m.cpu_s, m.step_time_s))
                and (m.cpu_at_step is None and m.cpu_total_s is None
                     or cpu_sample_ok(m.cpu_at_step, m.cpu_total_s, m.step))):
            keep(m)
            continue
        try:
            keep(check_rank_message(m))
        except MessageRejected as exc:
            bad.append(exc)
        else:
            job_ok = m.job_id
    if len(messages) > max_messages:
        bad.append(_too_many(max_messages))
    return env, good, bad


def _parse_typed_batch(data: bytes, max_messages: int = 20_000
                       ) -> tuple[wire.NodeBatch, list[Any], list[MessageRejected]] | None:
    """Fast path of :func:`parse_node_message`: a ``node_batch`` whose every message the types accept, typed in one
    pydantic pass (envelope and messages), then the value checks of :func:`check_rank_message` on each message.

    Returns ``(envelope, good, rejected)`` as :func:`parse_node_message` does, or None when the types refuse anything
    (not a batch, another encoding, one message of a wrong type...): the general path then decides, with its
    reasons. What this path keeps or refuses is what the general path would (``tests/unit/test_ingest_paths.py``).
    Raises :class:`MessageRejected` for an unusable envelope (``bad_node_id``, ``bad_value``), as the general path.
    """
    try:
        tb = _typed_batch_adapter.validate_json(data, strict=True)
    except (ValidationError, ValueError, RecursionError):
        return None  # not a batch, or one bad message inside: the general path isolates it
    env = wire.NodeBatch(node_id=tb.node_id, hostname=tb.hostname, seq=tb.seq, ts_unix_s=tb.ts_unix_s, v=tb.v)
    return _checked(env, tb.messages, max_messages)


def _too_many(max_messages: int) -> MessageRejected:
    """The refusal of the messages of a batch past its first ``max_messages`` (both paths: counted, not lost)."""
    return MessageRejected("bad_value", f"batch holds more than {max_messages} messages: the rest is not read")


def parse_node_message(data: bytes, max_messages: int = 20_000) -> tuple[Any, list[Any], list[MessageRejected]]:
    """Validate one node->coordinator message (UTF-8 JSON bytes).

    Returns:
        ``(envelope, rank_messages, rejected)``: for a ``node_batch`` the valid rank messages (typed: the wire
        dataclasses, a plain step report as a :data:`PlainStepReport` of the same fields) and one
        :class:`MessageRejected` per bad one (the rest of the batch is kept, see :func:`_split_batch`); for a
        ``node_heartbeat`` no messages and one refusal per host-load figure out of range (dropped, the heartbeat
        kept: :func:`_checked_host_load`); for other kinds the lists are empty.
    Raises:
        MessageRejected: the envelope itself is unusable (reasons as :func:`parse_rank_message`, plus
            ``bad_node_id``).
    """
    fast = _parse_plain_batch(data, max_messages)
    if fast is None:
        fast = _parse_step_batch(data, max_messages)
    if fast is None:
        fast = _parse_typed_batch(data, max_messages)
    return fast if fast is not None else _parse_general(data, max_messages)


def _parse_general(data: bytes, max_messages: int) -> tuple[Any, list[Any], list[MessageRejected]]:
    """General path of :func:`parse_node_message` (every node message kind; a batch split message by message by
    :func:`_split_batch`). Same returns and errors as :func:`parse_node_message`."""
    try:
        env = _node_adapter.validate_json(data, strict=True)
    except ValidationError as exc:
        if b'"node_batch"' in data and b'"messages"' in data:
            return _split_batch(data, max_messages)
        raise _rejected_from(exc, _KNOWN_NODE_KINDS, data) from None
    except (ValueError, RecursionError) as exc:
        raise MessageRejected("bad_json", str(exc)[:120]) from None
    _check_envelope(env)
    if env.kind == "node_ack":
        _check_text(env.command_id, "command_id")
        _check_text(env.detail, "detail", MAX_DETAIL)
    if env.kind == "node_job_id_collision":
        _check_collision(env)
    if env.kind == "node_heartbeat":
        env, bad = _checked_host_load(env)
        return env, [], bad
    if env.kind != "node_batch":
        return env, [], []
    return _split_batch(data, max_messages)  # typed-batch failure but envelope fine: isolate the bad messages


def parse_node_command(data: bytes) -> wire.NodeCommand:
    """Validate a coordinator->node command (strict UTF-8 JSON). Raises :class:`MessageRejected`."""
    try:
        cmd = _command_adapter.validate_json(data, strict=True)
    except ValidationError as exc:
        if _encoding_problem(data) is not None:
            raise MessageRejected("bad_encoding", str(_encoding_problem(data))) from None
        raise MessageRejected("bad_schema", str(exc.errors()[0].get("msg", ""))[:200]) from None
    except (ValueError, RecursionError) as exc:
        raise MessageRejected("bad_json", str(exc)[:120]) from None
    if cmd.v not in _ACCEPTED:
        raise MessageRejected("bad_version", f"v={cmd.v}")
    return cmd
