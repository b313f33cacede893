"""The coordinator's two ingest paths (issue 26) keep and refuse the same messages, with the same reasons.

``parse_node_message`` tries the fast path (one typed pydantic pass over the whole batch, then the value checks) and
falls back to the general path (envelope, then the batch split message by message). Each hostile message below is
put between honest ones and the batch goes through both paths: the same envelope, the same messages kept, the same
``(reason, detail)`` refusals, and the honest messages always kept.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from profwatch.core.messages import (
    MAX_CAPTURED_STEPS,
    MAX_STEP,
    MAX_STEP_TIME_S,
    MAX_TS_UNIX_S,
    MAX_WORLD_SIZE,
    MessageRejected,
    PlainStepReport,
    _parse_general,
    _parse_plain_batch,
    _parse_step_batch,
    _parse_typed_batch,
    parse_node_message,
)
from rankhook import wire


def _step(**kw: Any) -> dict[str, Any]:
    d = wire.to_dict(wire.StepReport(job_id="j1", rank=1, step=7, step_time_s=0.25, ts_unix_s=1.0))
    d.update(kw)
    return d


def _hello(**kw: Any) -> dict[str, Any]:
    d = wire.to_dict(wire.RankHello(job_id="j1", rank=1, local_rank=1, world_size=4, hostname="h", pid=10,
                                    backend="torch", ts_unix_s=1.0))
    d.update(kw)
    return d


def _capture(**kw: Any) -> dict[str, Any]:
    d = wire.to_dict(wire.CaptureEvent(job_id="j1", rank=1, event="completed", ts_unix_s=1.0, capture_id="c1"))
    d.update(kw)
    return d


def _bye(**kw: Any) -> dict[str, Any]:
    d = wire.to_dict(wire.RankBye(job_id="j1", rank=1, step=9, ts_unix_s=1.0))
    d.update(kw)
    return d


HONEST = [json.dumps(_step(rank=r, step=s, stages={"fwd": 0.1} if r % 2 else None, mode="serving" if s % 2 else None,
                           role="pp1", work=float(s), flags=["eval"] if r == 0 else []),
                     separators=(",", ":")).encode() for r, s in [(0, 1), (1, 2), (2, 3), (3, 4), (0, 5), (1, 6)]]


def _batch(element: bytes | None, node_id: str = "n1", **envelope: Any) -> bytes:
    head = {"kind": "node_batch", "v": 1, "node_id": node_id, "hostname": "h", "seq": 3, "ts_unix_s": 1.0} | envelope
    elements = HONEST[:3] + ([element] if element is not None else []) + HONEST[3:]
    return json.dumps(head)[:-1].encode() + b',"messages":[' + b",".join(elements) + b"]}"


PLAIN = [json.dumps(_step(rank=r, step=s, peer_pid=100 + r), separators=(",", ":")).encode()
         for r, s in [(0, 1), (1, 2), (2, 3), (3, 4)]]
"""Honest step reports in the common form (no stages, flags, work, mode or role): the plain path's."""


def _plain_batch(element: bytes | None, **envelope: Any) -> bytes:
    """:func:`_batch` with :data:`PLAIN` reports around ``element``."""
    head = {"kind": "node_batch", "v": 2, "node_id": "n1", "hostname": "h", "seq": 3, "ts_unix_s": 1.0} | envelope
    elements = PLAIN[:2] + ([element] if element is not None else []) + PLAIN[2:]
    return json.dumps(head)[:-1].encode() + b',"messages":[' + b",".join(elements) + b"]}"


def _outcome(result: tuple[Any, list[Any], list[MessageRejected]]) -> tuple[Any, list[Any], list[tuple[str, str]]]:
    """The envelope, each kept message as (its wire class, its fields) and each refusal as (reason, detail). The
    msgspec path's step reports are ``_StepIn``, a :class:`wire.StepReport` with ``kind`` required, and the plain
    path's are :data:`PlainStepReport` (a struct of the same fields): the same wire class here."""
    env, good, bad = result
    kept = [(wire.StepReport, msgspec.structs.asdict(m)) if isinstance(m, PlainStepReport) else
            (wire.StepReport if isinstance(m, wire.StepReport) else type(m), wire.to_dict(m)) for m in good]
    return env, kept, [(b.reason, b.detail) for b in bad]


def _paths(data: bytes) -> list[Any]:
    """The outcome (a result, or the refusal raised) of: parse_node_message, the plain msgspec path then the general
    one, the msgspec path then the general one, the pydantic typed path then the general one, and the general path
    alone."""
    out = []
    for fn in (parse_node_message,
               lambda d: _parse_plain_batch(d, 20_000) or _parse_general(d, 20_000),
               lambda d: _parse_step_batch(d, 20_000) or _parse_general(d, 20_000),
               lambda d: _parse_typed_batch(d, 20_000) or _parse_general(d, 20_000),
               lambda d: _parse_general(d, 20_000)):
        try:
            out.append(_outcome(fn(data)))
        except MessageRejected as exc:
            out.append(("raised", exc.reason, exc.detail))
    return out


def _both(data: bytes) -> tuple[Any, Any]:
    """The outcome of parse_node_message and of the general path alone, after checking that each fast path on its
    own gives the general path's outcome too."""
    fast, plain_path, step_path, typed_path, general = _paths(data)
    assert plain_path == general and step_path == general and typed_path == general
    return fast, general


# Messages the types accept and the value rules refuse: the fast path types the whole batch and refuses them itself.
VALUE_REFUSED = [
    (_step(rank=-1), "bad_rank"), (_step(rank=1 << 20), "bad_rank"), (_step(rank=2**70), "bad_rank"),
    (_step(step=-1), "bad_value"), (_step(step=2**62), "bad_value"), (_step(step_time_s=-0.1), "bad_value"),
    (_step(step_time_s=1e308), "bad_value"), (_step(step_time_s=8 * 86400.0), "bad_value"),
    (_step(ts_unix_s=1e12), "bad_value"), (_step(ts_unix_s=-1.0), "bad_value"),
    (_step(stages={"x" * 65: 0.1}), "bad_value"), (_step(stages={"a b": 0.1}), "bad_value"),
    (_step(stages={"fwd\n": 0.1}), "bad_value"), (_step(stages={"": 0.1}), "bad_value"),
    (_step(stages={"fwd": -1.0}), "bad_value"), (_step(stages={"fwd": 1e300}), "bad_value"),
    (_step(stages={f"s{i}": 0.1 for i in range(33)}), "bad_value"), (_step(flags=["x" * 65]), "bad_value"),
    (_step(flags=["a"] * 65), "bad_value"), (_step(flags=["a\x00"]), "bad_value"), (_step(work=-1.0), "bad_value"),
    (_step(work=1e16), "bad_value"), (_step(mode=""), "bad_value"), (_step(mode="a b"), "bad_value"),
    (_step(mode="training\n"), "bad_value"), (_step(role="a" * 65), "bad_value"), (_step(role="\u00e9"), "bad_value"),
    (_step(job_id="../etc"), "bad_job_id"), (_step(job_id="j1\n"), "bad_job_id"), (_step(job_id=""), "bad_job_id"),
    (_step(job_id="x" * 129), "bad_job_id"), (_step(v=3), "bad_version"),
    (_hello(rank=4), "bad_rank"), (_hello(world_size=0, rank=0), "bad_rank"), (_hello(world_size=2**21), "bad_rank"),
    (_hello(pid=0), "bad_value"), (_hello(pid=2**70), "bad_value"), (_hello(hostname="h\x1b[2J"), "bad_value"),
    (_hello(hostname="h" * 300), "bad_value"), (_hello(versions={f"k{i}": "v" for i in range(100)}), "bad_value"),
    (_hello(counters={"sent": -1}), "bad_value"), (_hello(peer_uid=-1), "bad_value"), (_hello(role="a b"), "bad_value"),
    (_hello(profiler_config_path="/" * 5000), "bad_value"),
    (_capture(capture_id="c" * 300), "bad_value"), (_capture(detail="d" * 3000), "bad_value"),
    (_capture(generation=-2), "bad_value"), (_capture(steps=list(range(MAX_CAPTURED_STEPS + 1))), "bad_value"),
    (_bye(step=-2), "bad_value"), (_bye(ts_unix_s=-5.0), "bad_value"),
]


@pytest.mark.parametrize(("msg", "reason"), VALUE_REFUSED, ids=[f"{m['kind']}-{r}-{i}" for i, (m, r) in
                                                                 enumerate(VALUE_REFUSED)])
def test_value_refusals_are_the_same_on_both_paths(msg: dict[str, Any], reason: str) -> None:
    data = _batch(json.dumps(msg).encode())
    assert _parse_typed_batch(data) is not None  # the fast path took this batch and refused the message itself
    fast, general = _both(data)
    assert fast == general
    _env, good, bad = fast
    assert len(good) == len(HONEST) and [r for r, _ in bad] == [reason]


# Messages (or raw elements) the types refuse: the fast path declines the batch, the general path refuses them.
TYPE_REFUSED = [json.dumps(m).encode() for m in (
    _step(rank="1"), _step(rank=True), _step(rank=1.0), _step(step="7"), _step(step_time_s="0.1"),
    _step(capturing=1), _step(flags="checkpoint"), _step(stages={"fwd": "0.1"}), _step(work=True), _step(work="5"),
    _step(mode=5), {k: v for k, v in _step().items() if k != "job_id"}, {k: v for k, v in _step().items() if k != "kind"},
    _step(kind="teleport"), _hello(backend="cuda-magic"), _capture(event="exploded"), _bye(step=None),
)] + [
    b"5", b"[]", b'"x"', b"null",
    json.dumps(_step()).encode("utf-16"),  # what an old node relayed raw
    b'{"kind":"step","v":1,"job_id":"j\xff","rank":1,"step":7,"step_time_s":0.1,"ts_unix_s":1}',  # not UTF-8
    json.dumps(_step(job_id="j\ud800")).encode(),  # a lone surrogate escape
    json.dumps(_hello(hostname="x\udfff")).encode(),
    b'{"kind":"step","v":1,"job_id":"j1","rank":1,"step":',  # cut short
    b'{"kind":"step","v":1,"job_id":"j1","rank":1,"step":7,"step_time_s":0.1,"ts_unix_s":1,"stages":' + b"[" * 5000,
]


@pytest.mark.parametrize("element", TYPE_REFUSED, ids=range(len(TYPE_REFUSED)))
def test_type_refusals_fall_back_to_the_general_path(element: bytes) -> None:
    data = _batch(element)
    assert _parse_typed_batch(data) is None
    fast, general = _both(data)
    assert fast == general
    _env, good, bad = fast
    assert good == _outcome(parse_node_message(_batch(None)))[1] and bad  # every honest one kept, the hostile refused
    assert {r for r, _ in bad} <= {"bad_json", "bad_schema", "bad_encoding", "unknown_kind"}


# Elements both paths keep: JSON tokens and spellings the types and value rules accept.
KEPT_BOTH = [
    b'{"job_id":"j1","rank":1,"rank":2,"step":7,"step_time_s":0.1,"ts_unix_s":1,"kind":"step","v":1}',  # last wins
    b'{"job_id":"j1","rank":1,"step":7,"step_time_s":1,"ts_unix_s":1,"kind":"step","v":1,"unknown":[1,{"a":2}]}',
    b'{ "kind" : "step" , "job_id" : "j1" , "rank" : 1 , "step" : 7 , "step_time_s" : 1e-400 , "ts_unix_s" : 0 }',
    json.dumps(_hello(hostname="h\u00f4te")).encode(), json.dumps(_hello(hostname="h\u00f4te"), ensure_ascii=False).encode(),
    json.dumps(_capture(steps=[1, 2, 3])).encode(), json.dumps(_bye()).encode(),
]
NON_FINITE = [b"NaN", b"Infinity", b"-Infinity", b"1e309"]


@pytest.mark.parametrize("element", KEPT_BOTH + [
    json.dumps(_step()).encode().replace(b'"work": null', b'"work": ' + t) for t in NON_FINITE] + [
    json.dumps(_step()).encode().replace(b'"step_time_s": 0.25', b'"step_time_s": ' + t) for t in NON_FINITE], ids=range(len(KEPT_BOTH) + 2 * len(NON_FINITE)))
def test_unusual_spellings_get_the_same_answer(element: bytes) -> None:
    plain_fast, plain_general = _both(_plain_batch(element))  # between plain reports: the plain path's batch
    assert plain_fast == plain_general
    fast, general = _both(_batch(element))
    assert fast == general
    _env, good, bad = fast
    if element in KEPT_BOTH:
        assert len(good) == len(HONEST) + 1 and not bad
    else:  # NaN, infinities and overflowing numbers are never kept
        assert len(good) == len(HONEST) and [r for r, _ in bad] in (["bad_value"], ["bad_json"], ["bad_schema"])


@pytest.mark.parametrize("envelope", [
    {"node_id": "../x"}, {"node_id": ""}, {"node_id": "n1\n"}, {"hostname": "h\x1b]0;x\x07"}, {"hostname": "h" * 300},
    {"seq": -1}, {"seq": "1"}, {"seq": 2**70}, {"ts_unix_s": 1e12}, {"ts_unix_s": "1"}, {"v": 3}, {"kind": "node_heartbeat"},
    {"extra": {"a": [1, 2]}}, {"hostname": None},
], ids=range(14))
def test_hostile_envelopes_get_the_same_answer(envelope: dict[str, Any]) -> None:
    data = _batch(None, **envelope)
    fast, general = _both(data)
    assert fast == general
    if "extra" not in envelope:
        assert fast[0] == "raised"


@pytest.mark.parametrize("v", [3, 0, -1, 2**70, None, "1", 1.0, "missing"], ids=range(8))
def test_a_batch_of_another_protocol_version_is_refused_as_a_message_is(v: Any) -> None:
    """The envelope's ``v`` is checked as each message's: another version, or none, refuses the whole batch (its
    messages would be read with the wrong schema); a value of the wrong type is a schema error."""
    data = _batch(None) if v == "missing" else _batch(None, v=v)
    if v == "missing":
        data = data.replace(b'"v": 1, ', b"")
        assert b'"v"' not in data.split(b'"messages"')[0]
    fast, general = _both(data)
    assert fast == general and fast[0] == "raised"
    assert fast[1] == ("bad_version" if isinstance(v, int) and not isinstance(v, bool) or v == "missing"
                       else "bad_schema")
    for accepted in (1, 2):  # version 1 (a node not upgraded yet) and 2 (wire.ACCEPTED_VERSIONS)
        ok_fast, ok_general = _both(_batch(None, v=accepted))
        assert ok_fast == ok_general and ok_fast[0] != "raised"


@pytest.mark.parametrize("raw", [b"", b"{}", b"[]", b"garbage", b"[" * 200_000, b'{"kind":"node_batch"}',
                                 b'{"kind":"node_batch","v":1,"node_id":"n1","hostname":"h","seq":1,"ts_unix_s":1,'
                                 b'"messages":{"a":1}}', json.dumps({"kind": "node_batch", "v": 1}).encode("utf-16"),
                                 b"\xef\xbb\xbf" + _batch(None)], ids=range(9))
def test_unusable_batches_are_refused_alike(raw: bytes) -> None:
    fast, general = _both(raw)
    assert fast == general and fast[0] == "raised"


def test_a_batch_of_step_reports_takes_the_msgspec_path_and_matches_the_general_one() -> None:
    """What a node relays between hellos (step reports only) is decoded by msgspec into wire.StepReport objects; a
    batch with any other kind of message is not (the pydantic typed path takes it)."""
    data = _batch(None)
    step_path = _parse_step_batch(data)
    assert step_path is not None and _outcome(step_path) == _outcome(_parse_general(data, 20_000))
    assert all(isinstance(m, wire.StepReport) for m in step_path[1]) and len(step_path[1]) == len(HONEST)
    assert _parse_step_batch(_batch(json.dumps(_hello(rank=0)).encode())) is None
    assert _parse_step_batch(_batch(json.dumps({k: v for k, v in _step().items() if k != "kind"}).encode())) is None


def test_a_batch_of_plain_step_reports_takes_the_plain_path_and_matches_the_general_one() -> None:
    """The common batch (step reports without stages, flags, work, mode or role) is decoded into PlainStepReport
    structs with the value rules checked as msgspec decodes; one report that is not plain (HONEST's have stages,
    labels, work) makes the plain path decline the batch, and the next path takes it."""
    data = _plain_batch(None)
    plain = _parse_plain_batch(data)
    assert plain is not None and _outcome(plain) == _outcome(_parse_general(data, 20_000))
    assert all(type(m) is PlainStepReport for m in plain[1]) and len(plain[1]) == len(PLAIN) and plain[2] == []
    assert [m.rank for m in plain[1]] == [0, 1, 2, 3] and plain[1][0].stages is None and plain[1][0].flags == ()
    assert all(type(m) is PlainStepReport for m in parse_node_message(data)[1])
    for element in (HONEST[1], json.dumps(_hello(rank=0)).encode(), json.dumps(_step(stages={})).encode(),
                    json.dumps(_step(flags=["eval"])).encode(), json.dumps(_step(work=1.0)).encode(),
                    json.dumps(_step(mode="training")).encode(), json.dumps(_step(role="pp1")).encode(),
                    json.dumps({k: v for k, v in _step().items() if k != "kind"}).encode()):
        assert _parse_plain_batch(_plain_batch(element)) is None
        fast, plain_path, step_path, typed_path, general = _paths(_plain_batch(element))
        assert fast == plain_path == step_path == typed_path == general


@pytest.mark.parametrize("fields", [
    {"rank": 0, "step": 0, "step_time_s": 0.0, "ts_unix_s": 0.0, "peer_pid": 1},
    {"rank": MAX_WORLD_SIZE - 1, "step": MAX_STEP - 1, "step_time_s": MAX_STEP_TIME_S, "ts_unix_s": MAX_TS_UNIX_S,
     "peer_pid": 2**32 - 1},
    {"step_time_s": 1, "ts_unix_s": 2, "peer_pid": None, "capturing": True, "v": 1}, {"job_id": "j" * 128},
    {"rank": MAX_WORLD_SIZE}, {"step": MAX_STEP}, {"step_time_s": MAX_STEP_TIME_S * (1 + 1e-15)},
    {"ts_unix_s": MAX_TS_UNIX_S * (1 + 1e-15)}, {"peer_pid": 2**32}, {"peer_pid": 0}, {"job_id": "j" * 129},
    {"job_id": ""}, {"job_id": "-j"}, {"v": 0}, {"capturing": None}, {"flags": None},
], ids=range(16))
def test_the_plain_path_keeps_and_declines_at_the_bounds_of_the_value_rules(fields: dict[str, Any]) -> None:
    """At each bound of a value rule of the common step report (inclusive or not), the plain path keeps what
    check_rank_message keeps and declines the batch where it refuses (the next path then refuses it)."""
    element = json.dumps(_step(**fields)).encode()
    data = _plain_batch(element)
    fast, plain_path, step_path, typed_path, general = _paths(data)
    assert fast == plain_path == step_path == typed_path == general
    kept = len(general[1]) == len(PLAIN) + 1
    assert (_parse_plain_batch(data) is not None) == kept


def test_the_plain_path_cuts_a_batch_past_max_messages_as_the_others() -> None:
    head = b'{"kind":"node_batch","v":2,"node_id":"n1","hostname":"h","seq":3,"ts_unix_s":1.0,"messages":['
    data = head + b",".join(PLAIN * 6) + b"]}"
    plain = _parse_plain_batch(data, 10)
    assert plain is not None and _outcome(plain) == _outcome(_parse_general(data, 10))
    assert len(plain[1]) == 10 and [b.reason for b in plain[2]] == ["bad_value"]


def test_the_common_batch_takes_the_fast_path_and_matches_the_general_one() -> None:
    msgs = [json.dumps(m).encode() for m in (_hello(rank=0), _step(rank=0), _capture(rank=0, steps=[5]), _bye(rank=0))]
    for data in (_batch(None), _batch(b",".join(msgs))):
        fast = _parse_typed_batch(data)
        assert fast is not None
        assert _outcome(fast) == _outcome(_parse_general(data, 20_000))
        env, good, bad = fast
        assert isinstance(env, wire.NodeBatch) and env.messages == [] and not bad
        assert all(type(m) in (wire.StepReport, wire.RankHello, wire.CaptureEvent, wire.RankBye) for m in good)


def test_a_batch_past_max_messages_is_cut_the_same_way_on_both_paths() -> None:
    """More messages than ``max_messages``: both paths keep the first ones and count one refusal for the rest
    (the general path used to drop them silently, and the typed path kept them all)."""
    honest = HONEST * 4  # 24 messages
    head = b'{"kind":"node_batch","v":1,"node_id":"n1","hostname":"h","seq":3,"ts_unix_s":1.0,"messages":['
    clean = head + b",".join(honest) + b"]}"
    spoiled = head + b",".join(honest[:-1] + [b'{"kind":"step"}']) + b"]}"
    for data in (clean, spoiled):
        env, good, bad = parse_node_message(data, max_messages=10)
        assert len(good) == 10 and [b.reason for b in bad] == ["bad_value"] and "more than 10" in bad[0].detail
    env, good, bad = parse_node_message(head + b",".join(honest[:10]) + b"]}", max_messages=10)
    assert len(good) == 10 and bad == []


@pytest.mark.parametrize("envelope", [{"hostname": "messages"}, {"hostname": "a \"messages\" b"}],
                         ids=["hostname", "quoted"])
def test_a_batch_split_for_one_bad_message_keeps_the_rest_whatever_its_envelope_says(envelope: dict[str, Any]) -> None:
    """The split path found the messages array by the first '"messages"' in the text: a node whose hostname is
    "messages" had every message of a batch with one bad message refused (bad_schema), the fast path none."""
    clean = parse_node_message(_batch(None, **envelope))
    env, good, bad = parse_node_message(_batch(json.dumps(_step(rank="x")).encode(), **envelope))
    assert env.hostname == envelope["hostname"] and len(good) == len(clean[1]) > 0 and len(bad) == 1


# -- every ingest path against the general one: the adversarial bench's hostile kinds and random batches ----------
def _adversarial_kinds() -> list[bytes]:
    """The rank messages bench/bench_adversarial.py sends each round (other encodings, lone surrogates, invalid
    UTF-8, lax types, absurd values, a hello's hostile hostname and paths), as elements of a node batch."""
    base = _step(job_id="honest", rank=0, step=5)
    text = json.dumps(base)
    return [text.encode("utf-16"), text.encode("utf-16-le"), text.encode("utf-32"), b"\xef\xbb\xbf" + text.encode(),
            text.replace('"honest"', '"hon\\ud800est"').encode(),
            text.replace('"honest"', '"hon\xffest"').encode("latin-1"),
            json.dumps(base | {"rank": "0"}).encode(), json.dumps(base | {"rank": True}).encode(),
            json.dumps(base | {"step_time_s": 1e308}).encode(),
            json.dumps(base | {"step": 10**9, "stages": {"x": 1e300}}).encode(),
            json.dumps(_hello(job_id="honest", hostname="\ud800")).encode(),
            json.dumps(_hello(job_id="honest", profiler_config_path="/etc", prof_root="/")).encode(),
            json.dumps(_step(job_id="bjob1", rank=12345, step=1)).encode(),
            json.dumps(base)[:-1].encode() + b',"rank":7}',  # a duplicate key
            json.dumps(base).replace('"step_time_s": 0.25', '"step_time_s": NaN').encode(),
            json.dumps(base).replace('"step_time_s": 0.25', '"step_time_s": -Infinity').encode(),
            json.dumps(base).replace('"job_id": "honest"', '"job_id": "hon\x01est"').encode()]  # raw control char


@pytest.mark.parametrize("element", _adversarial_kinds(), ids=range(17))
def test_the_adversarial_kinds_get_the_same_answer_on_every_path(element: bytes) -> None:
    for v in (1, 2):
        for data in (_batch(element, v=v), _batch(element, v=v).replace(b"".join(HONEST[3:4]), b""),
                     _plain_batch(element, v=v)):
            fast, plain_path, step_path, typed_path, general = _paths(data)
            assert fast == plain_path == step_path == typed_path == general


_MISSING = object()
_ANY = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.text(max_size=3),
                 st.floats(allow_nan=False, allow_infinity=False))
_FIELDS: dict[str, Any] = {
    "job_id": st.one_of(st.just("j1"), st.text(max_size=12), st.just("a" * 129), _ANY),
    "rank": st.one_of(st.integers(-2, 5), st.integers(2**20 - 1, 2**20 + 1), st.integers(2**62, 2**80), _ANY),
    "step": st.one_of(st.integers(-2, 10**6), st.integers(2**62 - 1, 2**70), _ANY),
    "step_time_s": st.one_of(st.floats(0, 1e6), st.floats(), st.integers(-1, 10**25), _ANY),
    "ts_unix_s": st.one_of(st.floats(0, 2e10), st.integers(0, 10**11), _ANY),
    "stages": st.one_of(st.none(), st.dictionaries(st.one_of(st.sampled_from(["fwd", "bwd", "x" * 65]),
                                                             st.text(max_size=4)),
                                                   st.one_of(st.floats(-1, 1e7), st.integers(-1, 10**7), _ANY),
                                                   max_size=3), _ANY),
    "flags": st.one_of(st.lists(st.one_of(st.sampled_from(["eval", "x" * 70]), st.text(max_size=3)), max_size=3),
                       _ANY),
    "capturing": _ANY,
    "work": st.one_of(st.none(), st.floats(), st.integers(-1, 10**16), _ANY),
    "mode": st.one_of(st.none(), st.sampled_from(["training", "serving", "pp 1", "x" * 65, ""]), _ANY),
    "role": st.one_of(st.none(), st.sampled_from(["pp1", "tp0\n", "r" * 64]), _ANY),
    "peer_pid": st.one_of(st.none(), st.integers(-1, 2**33), _ANY),
    "kind": st.one_of(st.just("step"), st.sampled_from(["hello", "bye", "capture", "teleport"]), _ANY),
    "v": st.one_of(st.sampled_from([1, 2]), st.integers(-1, 4), _ANY),
}


@st.composite
def _random_message(draw: Any) -> bytes:
    """A step report with up to three fields dropped or replaced by a value of any type, an extra key or a duplicate
    key at times, rendered by json.dumps (NaN and Infinity included) or with a lone surrogate escape."""
    d = _step(rank=draw(st.integers(0, 3)), step=draw(st.integers(1, 100)))
    for name in draw(st.lists(st.sampled_from(sorted(_FIELDS)), max_size=3, unique=True)):  # most stay honest
        if draw(st.integers(0, 3)) == 0:
            del d[name]
        else:
            d[name] = draw(_FIELDS[name])
    if draw(st.booleans()):
        d[draw(st.sampled_from(["zz", "extra", "Rank"]))] = draw(_ANY)
    text = json.dumps(d, ensure_ascii=draw(st.booleans()))
    if draw(st.integers(0, 9)) == 0 and len(d) > 1:
        text = text[:-1] + ', "rank": ' + json.dumps(draw(_ANY)) + "}"  # a duplicate key: the last one counts
    if draw(st.integers(0, 19)) == 0:
        text = text.replace('"j1"', '"j\\udc80"')
    return text.encode("utf-8", "surrogatepass")


@settings(max_examples=300, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(st.lists(_random_message(), min_size=1, max_size=4), st.sampled_from([1, 2]))
def test_random_batches_get_the_same_answer_on_every_path(elements: list[bytes], v: int) -> None:
    """Property-based (deterministic examples): whatever the messages, every fast path gives the general path's
    outcome: the same messages kept, as the same values, and the same refusals with the same reasons."""
    fast, plain_path, step_path, typed_path, general = _paths(_batch(b",".join(elements), v=v))
    assert fast == plain_path == step_path == typed_path == general
    plain = _plain_batch(b",".join(elements), v=v)  # between plain reports: the plain path's own batch
    fast, plain_path, step_path, typed_path, general = _paths(plain)
    assert fast == plain_path == step_path == typed_path == general


# The common report (no stages, flags, work or labels) of a job already checked in the batch is checked inline
# (``_checked``): each value it must refuse, after plain reports of the same job, gets check_rank_message's answer.
PLAIN_REFUSED = [
    (_step(rank=-1), "bad_rank"), (_step(rank=1 << 20), "bad_rank"), (_step(step=-1), "bad_value"),
    (_step(step=2**62), "bad_value"), (_step(step_time_s=-0.1), "bad_value"),
    (_step(step_time_s=8 * 86400.0), "bad_value"), (_step(ts_unix_s=1e12), "bad_value"),
    (_step(ts_unix_s=-1.0), "bad_value"), (_step(peer_pid=0), "bad_value"), (_step(peer_pid=2**32), "bad_value"),
    (_step(v=3), "bad_version"), (_step(job_id="j1\n"), "bad_job_id"), (_step(stages={"a b": 0.1}), "bad_value"),
    (_step(role="a b"), "bad_value"), (_step(work=-1.0), "bad_value"), (_step(flags=["a\x00"]), "bad_value"),
]


@pytest.mark.parametrize(("msg", "reason"), PLAIN_REFUSED, ids=[f"{r}-{i}" for i, (_m, r) in enumerate(PLAIN_REFUSED)])
def test_the_inline_check_of_plain_step_reports_refuses_what_check_rank_message_refuses(msg: dict[str, Any],
                                                                                       reason: str) -> None:
    plain = [json.dumps(_step(rank=r, step=9, peer_pid=100 + r), separators=(",", ":")).encode() for r in range(3)]
    head = {"kind": "node_batch", "v": 2, "node_id": "n1", "hostname": "h", "seq": 3, "ts_unix_s": 1.0}
    data = (json.dumps(head)[:-1].encode() + b',"messages":['
            + b",".join([*plain[:2], json.dumps(msg).encode(), plain[2]]) + b"]}")
    fast, plain_path, step_path, typed_path, general = _paths(data)
    assert fast == plain_path == step_path == typed_path == general
    _env, good, bad = fast
    assert len(good) == 3 and [r for r, _ in bad] == [reason]
    assert _parse_plain_batch(data) is None  # the plain path declines the batch: the next one refuses the report


def test_the_memoised_name_checks_hold_short_names_only() -> None:
    """Job ids, node ids and hostnames are checked through caches of 4096 entries: an id that cannot pass (over 128
    characters, or a hostname over MAX_TEXT) is refused with the same reason and never enters a cache, so a peer
    cannot fill them with megabyte strings; a good one is cached once."""
    from profwatch.core.messages import _job_id_spelled, _names_ok

    _job_id_spelled.cache_clear()
    _names_ok.cache_clear()
    long_job = _step(job_id="j" * 20_000)
    long_node = {"node_id": "n" * 20_000}
    long_host = {"hostname": "h" * 20_000}
    for envelope, element, reason in ((long_node, None, "bad_node_id"), (long_host, None, "bad_value"),
                                      ({}, json.dumps(long_job).encode(), "bad_job_id")):
        data = _batch(element, **envelope)
        fast, *_ = _paths(data)
        assert fast[0] == "raised" and fast[1] == reason if envelope else [r for r, _ in fast[2]] == [reason]
    assert _job_id_spelled.cache_info().currsize == 1  # "j1" of the honest messages only
    assert _names_ok.cache_info().currsize == 1  # ("n1", "h") of the one good envelope


@pytest.mark.parametrize("first", [True, False], ids=["first", "only"])
def test_an_empty_job_id_leading_a_plain_batch_is_refused_as_on_the_general_path(first: bool) -> None:
    """The plain path checks each distinct job id once: an empty one at the head of the batch (or alone) is checked
    too, not taken for the id already seen (it is refused as ``bad_job_id``, never kept)."""
    empty = json.dumps(_step(job_id="", peer_pid=100), separators=(",", ":")).encode()
    head = b'{"kind":"node_batch","v":2,"node_id":"n1","hostname":"h","seq":3,"ts_unix_s":1.0,"messages":['
    data = head + b",".join([empty, *PLAIN] if first else [empty]) + b"]}"
    assert _parse_plain_batch(data) is None
    fast, plain_path, step_path, typed_path, general = _paths(data)
    assert fast == plain_path == step_path == typed_path == general
    assert [r for r, _ in fast[2]] == ["bad_job_id"] and len(fast[1]) == (len(PLAIN) if first else 0)
