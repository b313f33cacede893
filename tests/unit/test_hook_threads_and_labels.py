"""rankhook's thread owner, the optional wire fields ``mode``/``role``/``work`` and the serving keepalive, against a
real ZeroMQ PULL socket standing in for the node daemon (issue 20, items 3 and 8)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import zmq

from profwatch.core.messages import MessageRejected, parse_rank_message
from rankhook import wire
from rankhook.backends.base import NoneBackend
from rankhook.hook import Hook
from rankhook.identity import resolve_identity
from rankhook.publisher import Publisher
from tests.conftest import wait_for


class _Node:
    """A PULL socket bound where the hook connects; collects every message as (topic, dict)."""

    def __init__(self, path: Path) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.PULL)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.endpoint = f"ipc://{path}/node.sock"
        self.sock.bind(self.endpoint)
        self.got: list[dict[str, Any]] = []

    def drain(self) -> list[dict[str, Any]]:
        while self.sock.poll(0):
            _topic, payload = self.sock.recv_multipart()
            self.got.append(json.loads(payload))
        return self.got

    def kinds(self, kind: str) -> list[dict[str, Any]]:
        return [m for m in self.drain() if m["kind"] == kind]

    def close(self) -> None:
        self.sock.close(0)
        self.ctx.term()


@pytest.fixture
def node(short_tmp: Path) -> Any:
    n = _Node(short_tmp)
    yield n
    n.close()


def _hook(node: _Node, **kw: Any) -> Hook:
    return Hook(resolve_identity("thr-job", rank=1, world_size=2), Publisher(node.endpoint), NoneBackend(), **kw)


class _CountingBackend(NoneBackend):
    """Records the thread of every ``after_step`` (what a profiler backend would be driven from)."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []

    def after_step(self, step: int) -> None:
        self.calls.append((threading.get_ident(), step))


def test_owner_thread_keeps_the_counter_and_the_backend(node: _Node, caplog: pytest.LogCaptureFixture) -> None:
    backend = _CountingBackend()
    hook = Hook(resolve_identity("thr-job", rank=0, world_size=1), Publisher(node.endpoint), backend)
    try:
        main = threading.get_ident()
        hook.step()  # the main thread calls step() first: it owns the counter
        start = threading.Barrier(3)

        def side() -> None:
            start.wait()
            for _ in range(200):
                hook.step()

        threads = [threading.Thread(target=side) for _ in range(2)]
        for t in threads:
            t.start()
        start.wait()
        for _ in range(50):
            hook.step()
        for t in threads:
            t.join(10)
        assert hook.step_count == 51
        assert hook.foreign_steps == 400
        assert {tid for tid, _ in backend.calls} == {main}
        assert [s for _, s in backend.calls] == list(range(1, 52))
        steps = [m["step"] for m in wait_for(lambda: len(node.kinds("step")) >= 51 and node.kinds("step"))]
        assert steps == list(range(1, 52))  # never back, never a jump
        warnings = [r for r in caplog.records if "owns the step counter" in r.getMessage()]
        assert len(warnings) == 1
        hook.set_step(0)  # not from another thread either
        t = threading.Thread(target=hook.set_step, args=(5,))
        t.start()
        t.join(10)
        assert hook.step_count == 0
    finally:
        hook.close()


def test_set_step_before_the_first_step_does_not_take_the_counter(node: _Node) -> None:
    """``set_step`` after a resume may come from the main thread before the training thread's first step."""
    hook = _hook(node)
    try:
        hook.set_step(100)
        t = threading.Thread(target=lambda: [hook.step() for _ in range(3)])
        t.start()
        t.join(10)
        assert hook.step_count == 103 and hook.foreign_steps == 0
        hook.step()  # now the main thread is a foreign thread
        assert hook.step_count == 103 and hook.foreign_steps == 1
    finally:
        hook.close()


def test_mode_role_work_are_on_the_wire_and_validate(node: _Node, caplog: pytest.LogCaptureFixture) -> None:
    hook = _hook(node, mode="serving", role="pp1")
    try:
        hook.step(work=2048)
        hook.step()
        hook.step(work=float("nan"))  # left out, one warning
        hook.step(work=-1.0)
        steps = wait_for(lambda: len(node.kinds("step")) >= 4 and node.kinds("step"))
        hello = node.kinds("hello")[0]
    finally:
        hook.close()
    assert (hello["mode"], hello["role"]) == ("serving", "pp1")
    assert [s.get("work") for s in steps] == [2048.0, None, None, None]
    assert all((s["mode"], s["role"]) == ("serving", "pp1") for s in steps)
    for s in steps:
        msg = parse_rank_message(json.dumps(s))
        assert (msg.mode, msg.role) == ("serving", "pp1")
    assert parse_rank_message(json.dumps(steps[0])).work == 2048.0
    assert len([r for r in caplog.records if "step(work=" in r.getMessage()]) == 1


def test_step_times_travel_as_integer_microseconds(node: _Node) -> None:
    """Wire version 2: ``rankhook.step()`` formats no float (``step_time_us``, ``ts_unix_us`` are integers); the
    node's reading gives the seconds back to the microsecond."""
    hook = _hook(node)
    try:
        t0 = time.time()
        time.sleep(0.02)
        hook.step()
        raw = wait_for(lambda: node.kinds("step"))[0]
    finally:
        hook.close()
    assert raw["v"] == wire.SCHEMA_VERSION == 2 and "step_time_s" not in raw and "ts_unix_s" not in raw
    assert type(raw["step_time_us"]) is int and type(raw["ts_unix_us"]) is int
    msg = parse_rank_message(json.dumps(raw))
    assert isinstance(msg, wire.StepReport) and msg.step_time_s == raw["step_time_us"] / 1e6 >= 0.015
    assert t0 <= msg.ts_unix_s <= time.time()


class _CapturingBackend(_CountingBackend):
    """A backend with a capture window open: every report must say so."""

    def capturing(self) -> bool:
        return True


def test_the_step_path_follows_the_backend_in_use_and_stops_at_close(node: _Node) -> None:
    """``step()``'s fast path (issue 34: one owner comparison, no backend calls for ``none``) keeps the rules: a
    capturing backend marks every report and is stepped; after the backend fails over to ``none`` the old one is
    no longer driven and reports carry no ``capturing``; a closed hook neither sends nor counts."""
    backend = _CapturingBackend()
    hook = Hook(resolve_identity("thr-job", rank=0, world_size=1), Publisher(node.endpoint), backend)
    hook.stage("fwd").__exit__(None, None, None)
    hook.step()
    hook.step(work=3)
    hook.backend_failed("profiler would not start")
    hook.step()
    hook.close()
    hook.step()
    assert hook.step_count == 3 and hook.foreign_steps == 0
    assert [step for _tid, step in backend.calls] == [1, 2]
    steps = wait_for(lambda: (s := node.kinds("step")) and len(s) >= 3 and s)
    assert [m["step"] for m in steps] == [1, 2, 3]
    assert [m.get("capturing", False) for m in steps] == [True, True, False]
    assert "fwd" in steps[0]["stages"] and steps[1]["work"] == 3.0 and "stages" not in steps[1]
    assert all(type(m["step_time_us"]) is int and m["step_time_us"] >= 0 for m in steps)
    assert all(isinstance(parse_rank_message(json.dumps(m)), wire.StepReport) for m in steps)
    assert len(wait_for(lambda: node.kinds("bye"))) == 1


def test_default_hook_sends_no_labels(node: _Node) -> None:
    hook = _hook(node)
    try:
        hook.step()
        step = wait_for(lambda: node.kinds("step"))[0]
    finally:
        hook.close()
    assert "mode" not in step and "role" not in step and "work" not in step
    assert parse_rank_message(json.dumps(step)).mode is None


@pytest.mark.parametrize(("field", "value"), [("work", -0.5), ("work", 1e16), ("role", "a b"), ("role", "x" * 65),
                                              ("mode", ""), ("mode", "serving\x00")])
def test_bad_labels_and_work_are_refused(field: str, value: Any) -> None:
    step = {"kind": "step", "v": 1, "job_id": "j", "rank": 0, "step": 1, "step_time_s": 0.1, "ts_unix_s": 1.0,
            field: value}
    with pytest.raises(MessageRejected) as exc:
        parse_rank_message(json.dumps(step))
    assert exc.value.reason == "bad_value"


def test_receivers_ignore_fields_they_do_not_know() -> None:
    """What an older node or coordinator does with ``mode``/``role``/``work``: the same as this one with a field of
    a newer hook (pydantic ignores unknown keys of the wire dataclasses)."""
    step = {"kind": "step", "v": 1, "job_id": "j", "rank": 0, "step": 1, "step_time_s": 0.1, "ts_unix_s": 1.0,
            "work": 3.0, "a_newer_field": {"x": [1]}}
    msg = parse_rank_message(json.dumps(step))
    assert msg.step == 1 and msg.work == 3.0 and not hasattr(msg, "a_newer_field")
    old = {k: v for k, v in step.items() if k not in ("work", "a_newer_field")}
    assert parse_rank_message(json.dumps(old)).work is None  # an older hook's report


def test_init_reads_mode_and_role_from_env(node: _Node, monkeypatch: pytest.MonkeyPatch) -> None:
    import rankhook

    monkeypatch.setenv("PROFWATCH_MODE", "Training")
    monkeypatch.setenv("PROFWATCH_ROLE", "stage 2")
    hook = rankhook.init("env-job", backend="none", endpoint=node.endpoint, rank=0, world_size=1)
    try:
        assert hook is not None and (hook.mode, hook.role) == ("training", "stage_2")
    finally:
        rankhook.shutdown()
    hook = rankhook.init("env-job", backend="none", endpoint=node.endpoint, rank=0, world_size=1, mode="batch")
    try:
        assert hook is not None and hook.mode is None  # unknown mode: ignored with a warning
    finally:
        rankhook.shutdown()


def test_serving_keepalive_while_idle_and_none_in_training(node: _Node, monkeypatch: pytest.MonkeyPatch) -> None:
    """The hook's thread (CPU samples) runs in both modes; only a serving rank re-sends its hello while idle."""
    monkeypatch.setattr(wire, "KEEPALIVE_S", 0.2)
    training = _hook(node)
    serving = _hook(node, mode="serving")
    try:
        training.step()
        serving.step()
        hellos = wait_for(lambda: len([h for h in node.kinds("hello") if h.get("mode") == "serving"]) >= 3
                          and node.kinds("hello"), timeout_s=20)
        assert serving._sampler is not None and serving._sampler.is_alive()
        assert training._sampler is not None and training._sampler.is_alive()  # CPU samples in training too
        assert len([h for h in hellos if h.get("mode") is None]) == 1  # its first hello only: no keepalive
    finally:
        serving.close()
        training.close()
    assert not serving._sampler.is_alive() and not training._sampler.is_alive()


def test_a_side_thread_that_steps_first_never_takes_the_counter_from_the_named_owner(
        node: _Node, caplog: pytest.LogCaptureFixture) -> None:
    """A side thread calling step() at its own 13 ms cadence before the training loop starts: the training thread
    (named at construction, as rankhook.init names the thread that called it) keeps the counter and the backend."""
    backend = _CountingBackend()
    hook = Hook(resolve_identity("thr-job", rank=0, world_size=1), Publisher(node.endpoint), backend,
                step_thread=threading.current_thread())
    try:
        side = threading.Thread(target=lambda: [hook.step() for _ in range(30)], name="side")
        side.start()
        side.join(10)
        assert hook.step_count == 0 and hook.foreign_steps == 30 and backend.calls == []
        for _ in range(5):
            hook.step()
        assert hook.step_count == 5 and {tid for tid, _ in backend.calls} == {threading.get_ident()}
        warnings = [r.getMessage() for r in caplog.records if "owns the step counter" in r.getMessage()]
        assert len(warnings) == 1 and "side" in warnings[0] and "rankhook.init()" in warnings[0]
    finally:
        hook.close()


def test_a_named_step_thread_not_started_yet_owns_the_counter_once_it_runs(node: _Node) -> None:
    backend = _CountingBackend()
    worker = threading.Thread(target=lambda: [hook.step() for _ in range(4)], name="train")
    hook = Hook(resolve_identity("thr-job", rank=0, world_size=1), Publisher(node.endpoint), backend,
                step_thread=worker)
    try:
        hook.step()  # the main thread is not the named one: ignored
        assert hook.step_count == 0 and hook.foreign_steps == 1
        worker.start()
        worker.join(10)
        assert hook.step_count == 4 and {tid for tid, _ in backend.calls} == {worker.ident}
    finally:
        hook.close()


def test_init_names_the_thread_that_called_it_or_step_thread(node: _Node, monkeypatch: pytest.MonkeyPatch) -> None:
    """rankhook.init() from a worker thread (the zero-code hook's first optimizer step in a training thread): that
    thread owns step(); the main thread's calls are ignored."""
    import rankhook

    monkeypatch.setenv("PROFWATCH_JOB_ID", "thr-init")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    rankhook.shutdown()
    got: list[Any] = []
    go, done = threading.Event(), threading.Event()

    def train() -> None:  # the training thread: init, then its steps once told (it stays alive meanwhile)
        got.append(rankhook.init(endpoint=node.endpoint, backend="none"))
        go.wait(10)
        for _ in range(2):
            rankhook.step()
        done.set()

    worker = threading.Thread(target=train)
    worker.start()
    try:
        wait_for(lambda: got)
        hook = got[0]
        assert hook is not None
        rankhook.step()  # main thread: not the owner
        t = threading.Thread(target=lambda: [rankhook.step() for _ in range(3)])
        t.start()
        t.join(10)
        assert hook.step_count == 0 and hook.foreign_steps == 4  # nor another side thread
        go.set()
        assert done.wait(10) and hook.step_count == 2
    finally:
        go.set()
        worker.join(10)
        rankhook.shutdown()
    main = threading.current_thread()
    other = threading.Thread(target=lambda: got.append(
        rankhook.init(endpoint=node.endpoint, backend="none", step_thread=main)))
    other.start()
    other.join(10)
    try:
        hook = got[1]
        rankhook.step()
        rankhook.step()
        assert hook.step_count == 2 and hook.foreign_steps == 0
    finally:
        rankhook.shutdown()


def test_a_job_without_a_profiler_config_path_is_told_once_that_it_cannot_be_captured(
        node: _Node, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """``PROFWATCH=1`` without ``PROFWATCH_PROFILER_CONFIG_PATH`` ran as telemetry only without a word (a new user's
    trial); ``backend="none"`` asks for telemetry only and is not warned."""
    import rankhook

    monkeypatch.delenv("PROFWATCH_PROFILER_CONFIG_PATH", raising=False)
    monkeypatch.delenv("PROFWATCH_BACKEND", raising=False)

    def said() -> list[str]:
        return [r.getMessage() for r in caplog.records if "no profiler_config_path" in r.getMessage()]

    for backend, expected in (("auto", 1), ("none", 0)):
        caplog.clear()
        hook = rankhook.init("nocfg-job", backend=backend, endpoint=node.endpoint, rank=0, world_size=1)
        try:
            assert hook is not None and len(said()) == expected, (backend, said())
        finally:
            rankhook.shutdown()
    caplog.clear()
    hook = rankhook.init("nocfg-job", endpoint=node.endpoint, rank=0, world_size=1)
    try:
        assert said() and "cannot arm a capture" in said()[0] and "PROFWATCH_BACKEND=none" in said()[0]
    finally:
        rankhook.shutdown()


def test_the_zero_code_hook_sends_no_time_for_its_first_interval(node: _Node, monkeypatch: pytest.MonkeyPatch) -> None:
    """A user's zero-code telemetry had step 1 at ~0.0008 s on every rank against ~0.065 s steps: the hook is made
    at the end of the first optimizer step, so that interval is its own set-up. Step 1 sends no report; the counter
    and the backend still advance; a hook the user made before is left as it is."""
    import rankhook
    from rankhook.autoinstall import _Installer

    backend = _CountingBackend()
    hook = Hook(resolve_identity("thr-job", rank=0, world_size=1), Publisher(node.endpoint), backend)
    made: list[Hook] = []
    monkeypatch.setattr(rankhook, "current", lambda: made[0] if made else None)
    monkeypatch.setattr(rankhook, "init", lambda *a, **k: made.append(hook) or hook)
    monkeypatch.setattr(rankhook, "step", lambda: hook.step())
    class _Opt:  # an optimizer stand-in (the counter keeps it in a weak dict)
        pass

    inst, opt = _Installer(), _Opt()
    try:
        for _ in range(3):
            inst.hook(opt, (), {})
        steps = wait_for(lambda: [m["step"] for m in node.kinds("step")] if len(node.kinds("step")) >= 2 else None)
    finally:
        hook.close()
    assert steps == [2, 3] and hook.step_count == 3 and [s for _, s in backend.calls] == [1, 2, 3]
    hook.untimed_first_step()  # too late: a step was taken, nothing changes
    assert not hook._untimed_step
