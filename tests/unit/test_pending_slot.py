"""The single pending config slot on a rank: the idle config ``profwatch cancel`` writes takes it (so a cancelled
arm never starts), a config for other ranks leaves it (``rankhook/profconfig.py``: ``replaces_pending``,
``WindowGate``, ``ConfigWatcher``; ``daemon/profwatch/core/capture/profiler_config.py``: ``idle_config``). The same rules are checked
against the real torch_npu monitor in ``tests/conformance/test_monitor_protocol.py``."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from profwatch.adapters.fs.config_writer import ConfigIdleNotNeeded, ConfigWriter
from profwatch.core.capture.profiler_config import InvalidProfilerConfig, ProfilerConfig, check_idle_config, idle_config
from rankhook.profconfig import TEMPLATE, ArmedConfig, ConfigWatcher, WindowGate, make_armed, replaces_pending


def test_the_idle_config_is_the_template_with_a_note() -> None:
    idle = idle_config("capture c-1 cancelled " + "x" * 500)
    assert {k: v for k, v in idle.items() if k != "metadata"} == TEMPLATE
    assert idle["metadata"] == {"profwatch_idle": ("capture c-1 cancelled " + "x" * 500)[:200]}
    check_idle_config(idle)  # accepted as idle ...
    with pytest.raises(InvalidProfilerConfig, match="never fires"):
        ProfilerConfig.parse(idle)  # ... and never as an arm


@pytest.mark.parametrize(("change", "match"), [
    ({"start_step": 5}, "has start_step 0"), ({"start_step": False}, "has start_step 0"),
    ({"start_step": "0"}, "has start_step 0"), ({"start_step": 0.0}, "has start_step 0"),
    ({"active": 0}, "active"), ({"is_valid": True}, "is_valid"), ({"surprise": 1}, "surprise"),
    ({"is_rank": True, "rank_list": [7], "async_mode": True}, "for every rank"), ({"rank_list": [1]}, "every rank"),
])
def test_check_idle_config_refuses_anything_else(change: dict[str, Any], match: str) -> None:
    with pytest.raises(InvalidProfilerConfig, match=match):
        check_idle_config({**idle_config("n"), **change})
    with pytest.raises(InvalidProfilerConfig, match="JSON object"):
        check_idle_config([idle_config("n")])


def test_the_writer_writes_the_idle_config_only_when_asked_and_only_over_that_arm(tmp_path: Path) -> None:
    d = tmp_path / "cfg"
    d.mkdir()
    w, roots = ConfigWriter(), [str(tmp_path)]
    f = d / "profiler_config.json"
    with pytest.raises(ConfigIdleNotNeeded, match="holds no profwatch arm now"):  # only the template there
        w.write(str(d), idle_config("c-1 cancelled"), not_before_unix_s=0, allowed_roots=roots, idle_for="c-1")
    arm = ProfilerConfig(start_step=40, metadata={"profwatch_capture_id": "c-1"}).render()
    first = w.write(str(d), arm, not_before_unix_s=0, allowed_roots=roots)
    with pytest.raises(InvalidProfilerConfig, match="never fires"):
        w.write(str(d), idle_config("c-1 cancelled"), not_before_unix_s=0, allowed_roots=roots)
    with pytest.raises(InvalidProfilerConfig, match="has start_step 0"):
        w.write(str(d), arm, not_before_unix_s=0, allowed_roots=roots, idle_for="c-1")
    with pytest.raises(ConfigIdleNotNeeded, match="holds capture c-1 now, not capture c-0's"):
        w.write(str(d), idle_config("c-0 cancelled"), not_before_unix_s=0, allowed_roots=roots, idle_for="c-0")
    assert json.loads(f.read_text()) == arm  # a late idle of an older capture leaves a newer arm alone
    res = w.write(str(d), idle_config("c-1 cancelled"), not_before_unix_s=0, allowed_roots=roots, idle_for="c-1")
    assert res.mtime_s > first.mtime_s  # a newer whole second: every rank's monitor reads it
    assert json.loads(f.read_text()) == idle_config("c-1 cancelled")
    with pytest.raises(ConfigIdleNotNeeded, match="holds no profwatch arm now"):  # a repeat changes nothing
        w.write(str(d), idle_config("c-1 cancelled"), not_before_unix_s=0, allowed_roots=roots, idle_for="c-1")
    assert os.stat(f).st_mtime == res.mtime_s
    # a restarted writer finds the idle config in the file: an arm over it is no "hand edit" to warn about
    again = ConfigWriter().write(str(d), ProfilerConfig(start_step=90).render(), not_before_unix_s=0,
                                 allowed_roots=roots)
    assert again.replaced_problem is None
    f.write_text('{"start_step": 0, "is_valid": true, "metadata": {"x": 1}}')  # a real bad edit is still named
    assert "is_valid" in (ConfigWriter().write(str(d), ProfilerConfig(start_step=95).render(), not_before_unix_s=0,
                                               allowed_roots=roots).replaced_problem or "")


@pytest.mark.parametrize(("raw", "rank", "replaces"), [
    (idle_config("x"), 0, True),
    ({}, 3, True),  # an empty file reads as {}: every key at the template value
    ({"start_step": 0}, 0, True),
    ({"start_step": "5"}, 0, True),  # torch_npu resets a non-int start_step to 0
    ({"start_step": -3}, 0, True),
    ({"start_step": 2.5}, 0, True),
    ({"start_step": True}, 0, True),  # an int to torch_npu: 1 (refused by the strict validator)
    ({"start_step": 0, "is_rank": True, "rank_list": [1, 2]}, 2, True),
    ({"start_step": 0, "is_rank": True, "rank_list": [1, 2]}, 0, False),  # not for this rank: valid() is false
    ({"start_step": 0, "is_rank": True, "rank_list": "0,1"}, 0, False),  # torch_npu reads no rank at all
    ({"start_step": 0, "is_rank": "yes", "rank_list": [5]}, 0, True),  # a non-bool is_rank resets to false
    ({"start_step": 0, "activities": ["CPU", 1]}, 0, False),  # the parse raises inside dp.step(): old one kept
    ({"start_step": 0, "experimental_config": "Level1"}, 0, False),  # so does a truthy non-object ...
    ({"start_step": 0, "experimental_config": [1]}, 0, False),
    ({"start_step": 0, "experimental_config": {"profiler_level": 1}}, 0, False),  # ... and a getattr with a non-str
    ({"start_step": 0, "experimental_config": {"aic_metrics": None}}, 0, False),
    ({"start_step": 0, "experimental_config": {}}, 0, True), ({"start_step": 0, "experimental_config": ""}, 0, True),
    ({"start_step": 0, "is_rank": True, "rank_list": [True]}, 1, True),  # torch_npu's isinstance(r, int): True == 1
    ({"start_step": 0, "is_rank": True, "rank_list": [-1, 2.0]}, 2, False),  # negatives and floats are dropped
    ({"start_step": 0, "NPU_MONITOR_START": True}, 0, False),  # a dyno-monitor command, not a config
    ({"start_step": 7, "active": 0}, 0, True),  # torch_npu takes it (active reset to 1); the strict validator refuses
    ([1, 2], 0, False), ("text", 0, False), (None, 0, False),
])
def test_which_rejected_files_take_the_pending_slot(raw: Any, rank: int, replaces: bool) -> None:
    assert replaces_pending(raw, rank) is replaces


def _armed(start_step: int, *, generation: int = 1, rank_list: list[int] | None = None) -> ArmedConfig:
    cfg = {**TEMPLATE, "metadata": {"profwatch_capture_id": f"c-{generation}"}, "start_step": start_step,
           "is_rank": rank_list is not None, "rank_list": rank_list or []}
    return make_armed(generation, cfg, 0)


def test_the_gate_drops_a_waiting_arm_for_a_never_firing_config_and_keeps_it_for_other_ranks() -> None:
    gate = WindowGate()
    arm = _armed(40)
    gate.offer(arm)
    assert gate.on_step(20) == ("", None) and gate.pending is arm
    gate.offer(_armed(30, generation=2, rank_list=[3]))  # for rank 3 only: rank 0's pending arm stays
    assert gate.pending is arm
    gate.offer(ArmedConfig(generation=3, start_step=0, warmup=0, active=0, selected=True, config={}))
    assert gate.on_step(21) == ("", None) and gate.pending is None  # dropped without a second event
    assert all(gate.on_step(s) == ("", None) for s in range(22, 60))  # step 40 passes: nothing starts


def test_a_window_already_running_ends_as_armed() -> None:
    gate = WindowGate()
    gate.offer(_armed(-1))
    assert gate.on_step(5)[0] == "start"
    gate.offer(ArmedConfig(generation=2, start_step=0, warmup=0, active=0, selected=True, config={}))
    assert gate.on_step(6)[0] == "stop" and gate.on_step(7) == ("", None) and gate.pending is None


class _Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _put(path: Path, content: Any, mtime: int) -> None:
    path.write_text(json.dumps(content))
    os.utime(path, (mtime, mtime))


def test_the_watcher_reports_the_idle_config_as_rejected_and_the_gate_forgets_the_arm(tmp_path: Path) -> None:
    events: list[tuple[str, str | None, str]] = []
    clock = _Clock(1_000_000.0)
    w = ConfigWatcher(str(tmp_path), rank=0, init_unix_s=clock.t, clock=clock,
                      on_event=lambda ev, cfg, _gen, why: events.append((ev, cfg.capture_id if cfg else None, why)))
    f = tmp_path / "profiler_config.json"
    gate = WindowGate()
    _put(f, ProfilerConfig(start_step=40, metadata={"profwatch_capture_id": "c-9"}).render(), 1_000_002)
    clock.t += 3
    assert w.poll_once() is not None
    gate.offer(w.latest)
    assert gate.on_step(20) == ("", None) and gate.pending is not None and gate.pending.capture_id == "c-9"
    # a config for other ranks is rejected by nobody and leaves rank 0's arm waiting
    _put(f, ProfilerConfig(start_step=30, is_rank=True, rank_list=[2], analyse=False,
                           metadata={"profwatch_capture_id": "c-10"}).render(), 1_000_004)
    clock.t += 2
    w.poll_once()
    gate.offer(w.latest)
    assert gate.pending is not None and gate.pending.capture_id == "c-9"
    # the idle config: reported as rejected (it never fires), and the waiting arm is gone
    _put(f, idle_config("capture c-9 cancelled"), 1_000_006)
    clock.t += 2
    assert w.poll_once() is None
    gate.offer(w.latest)
    assert all(gate.on_step(s) == ("", None) for s in range(21, 60))
    assert [e[0] for e in events] == ["arm_seen", "arm_seen", "arm_rejected"]
    assert "start_step" in events[-1][2]
    # its mtime counts as read, as in torch_npu: a file copied in with an older mtime (cp -p) is not an arm
    _put(f, ProfilerConfig(start_step=50, metadata={"profwatch_capture_id": "c-old"}).render(), 1_000_005)
    clock.t += 2
    assert w.poll_once() is None and len(events) == 3
    # a torn read (not JSON) is retried and leaves the slot as it was
    _put(f, ProfilerConfig(start_step=70, metadata={"profwatch_capture_id": "c-11"}).render(), 1_000_008)
    clock.t += 2
    w.poll_once()
    gate.offer(w.latest)
    for torn in ('{"start_step": 0, "act', "  \n"):  # half a file, or blanks (not JSON to torch_npu either)
        f.write_text(torn)
        os.utime(f, (1_000_010, 1_000_010))
        clock.t += 2
        assert w.poll_once() is None
        gate.offer(w.latest)
        assert gate.pending is not None and gate.pending.capture_id == "c-11"


def test_an_idle_write_for_a_dir_that_cannot_hold_the_arm_is_not_needed(tmp_path: Path) -> None:
    roots = [str(tmp_path / "root")]
    (tmp_path / "root").mkdir()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "root" / "link").symlink_to(tmp_path / "elsewhere")
    for d in (tmp_path / "root" / "gone", tmp_path / "elsewhere", tmp_path / "root" / "link"):
        with pytest.raises(ConfigIdleNotNeeded, match="no arm of capture c-1 can be there"):
            ConfigWriter().write(str(d), idle_config("x"), not_before_unix_s=0, allowed_roots=roots, idle_for="c-1")


def test_an_arm_written_during_an_idle_writes_wait_is_never_lost(tmp_path: Path) -> None:
    """Two writers of one file (node daemons on shared storage) take turns: the second waits for the first."""
    d = tmp_path / "cfg"
    d.mkdir()
    roots = [str(tmp_path)]
    ConfigWriter().write(str(d), ProfilerConfig(start_step=40, metadata={"profwatch_capture_id": "c-A"}).render(),
                         not_before_unix_s=0, allowed_roots=roots)
    arm_b = ProfilerConfig(start_step=80, metadata={"profwatch_capture_id": "c-B"}).render()
    other: dict[str, Any] = {}

    def arm_meanwhile() -> None:
        other["result"] = ConfigWriter().write(str(d), arm_b, not_before_unix_s=0, allowed_roots=roots)

    started: list[threading.Thread] = []

    def sleep(s: float) -> None:  # the idle writer waits for a fresh second: another writer arms B just then
        if not started:
            started.append(threading.Thread(target=arm_meanwhile))
            started[0].start()
        time.sleep(s)

    idle = ConfigWriter(sleep=sleep).write(str(d), idle_config("c-A cancelled"), not_before_unix_s=0,
                                           allowed_roots=roots, idle_for="c-A")
    started[0].join(30)
    assert not started[0].is_alive() and other["result"].mtime_s > idle.mtime_s  # B went second, after the idle
    assert json.loads((d / "profiler_config.json").read_text()) == arm_b


def test_a_file_owned_by_the_rank_user_still_gets_a_fresh_mtime(tmp_path: Path, monkeypatch) -> None:
    """torch_npu creates the file as the rank's user: an explicit mtime needs ownership, "now" only write access."""
    d = tmp_path / "cfg"
    d.mkdir()
    real_utime = os.utime
    refused: list[Any] = []

    def utime(path: Any, times: Any = None, **kw: Any) -> None:
        if times is not None:  # as for a daemon user that does not own the file
            refused.append(times)
            raise PermissionError(1, "Operation not permitted")
        real_utime(path, times, **kw)

    w = ConfigWriter()
    first = w.write(str(d), ProfilerConfig(start_step=40).render(), not_before_unix_s=0, allowed_roots=[str(tmp_path)])
    monkeypatch.setattr(os, "utime", utime)
    res = w.write(str(d), ProfilerConfig(start_step=50).render(), not_before_unix_s=0, allowed_roots=[str(tmp_path)])
    monkeypatch.undo()
    assert refused and res.mtime_s > first.mtime_s and int(os.stat(d / "profiler_config.json").st_mtime) == res.mtime_s
    assert json.loads((d / "profiler_config.json").read_text())["start_step"] == 50


def test_a_coarse_file_system_clock_still_gives_a_newer_mtime(tmp_path: Path, monkeypatch) -> None:
    """The file system stamps "now" from a coarse clock that can lag time.time() by a tick: right after the second
    turned, the first "now" may land in the written second. The writer stamps again until the mtime moved."""
    d = tmp_path / "cfg"
    d.mkdir()
    real_utime = os.utime
    lagging: list[int] = []

    def utime(path: Any, times: Any = None, **kw: Any) -> None:
        if times is not None:  # not the file's owner: an explicit time is refused
            raise PermissionError(1, "Operation not permitted")
        if not lagging:  # the first "now" lags into the second just written
            written = int(os.stat(path, **{k: v for k, v in kw.items() if k == "dir_fd"}).st_mtime)
            lagging.append(written)
            real_utime(path, (written + 0.999, written + 0.999), **kw)
            return
        real_utime(path, None, **kw)

    w = ConfigWriter()
    first = w.write(str(d), ProfilerConfig(start_step=40).render(), not_before_unix_s=0, allowed_roots=[str(tmp_path)])
    monkeypatch.setattr(os, "utime", utime)
    res = w.write(str(d), ProfilerConfig(start_step=50).render(), not_before_unix_s=0, allowed_roots=[str(tmp_path)])
    monkeypatch.undo()
    assert lagging and res.mtime_s > lagging[0] and res.mtime_s > first.mtime_s
    assert int(os.stat(d / "profiler_config.json").st_mtime) == res.mtime_s


def test_a_bom_or_utf16_file_is_not_json_to_the_mirror_either(tmp_path: Path) -> None:
    clock = _Clock(1_000_000.0)
    w = ConfigWatcher(str(tmp_path), rank=0, init_unix_s=clock.t, clock=clock)
    f = tmp_path / "profiler_config.json"
    gate = WindowGate()
    _put(f, ProfilerConfig(start_step=40, metadata={"profwatch_capture_id": "c-1"}).render(), 1_000_002)
    clock.t += 3
    w.poll_once()
    gate.offer(w.latest)
    for i, data in enumerate((b"\xef\xbb\xbf" + json.dumps(idle_config("x")).encode(),
                              json.dumps(idle_config("x")).encode("utf-16"))):
        f.write_bytes(data)
        os.utime(f, (1_000_004 + i, 1_000_004 + i))
        clock.t += 2
        assert w.poll_once() is None
        gate.offer(w.latest)
        assert gate.pending is not None and gate.pending.capture_id == "c-1"  # torch_npu keeps the arm too


def test_the_same_arm_written_again_after_the_idle_config_is_a_new_arm(tmp_path: Path) -> None:
    clock = _Clock(1_000_000.0)
    w = ConfigWatcher(str(tmp_path), rank=0, init_unix_s=clock.t, clock=clock)
    f = tmp_path / "profiler_config.json"
    arm = ProfilerConfig(start_step=40, metadata={"profwatch_capture_id": "c-1"}).render()
    _put(f, arm, 1_000_002)
    clock.t += 3
    assert w.poll_once() is not None
    _put(f, idle_config("x"), 1_000_003)
    clock.t += 1
    assert w.poll_once() is None
    _put(f, arm, 1_000_004)  # within the re-delivery window of the first, but the idle config came between
    clock.t += 1
    again = w.poll_once()
    assert again is not None and again.capture_id == "c-1" and w.latest is again
