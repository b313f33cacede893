"""The node daemons' idle writes owed for ended captures (pure, ``core/capture/idle_writes.py``) with a fake clock:
who is asked when, who is given up when, what an answer comes to."""

from __future__ import annotations

from profwatch.core.capture import lifecycle as lc
from profwatch.core.capture.idle_writes import IDLE_RESEND_S, IdleWrites
from rankhook import wire
from tests.unit.test_lifecycle import SET, T0, _open, _written

ARGS = {"profiler_config_path": "/cfg/j1", "config": {"start_step": 0}, "idle_for": "x"}


def _cancelled() -> lc.Capture:
    t = lc.cancel(_written(_open(nodes=("n1", "n2"))), T0 + 2, SET)
    assert lc.Action.IDLE_CONFIG in t.actions and t.capture.idle_owed
    return t.capture


def _sent(due: object) -> list[str]:
    return sorted(s.node_id for s in due.sends)  # type: ignore[attr-defined]


def test_each_node_is_asked_at_once_then_every_resend_period_while_heard_until_the_window_ends() -> None:
    cap = _cancelled()
    idle = IdleWrites()
    assert idle.owe(cap, ARGS, T0 + 2, SET.write_timeout_s) == []
    assert len(idle) == 2 and f"idle-{cap.capture_id}-n1" in idle
    heard = {"n1", "n2"}
    first = idle.due(T0 + 2, heard.__contains__)
    assert _sent(first) == ["n1", "n2"] and first.events == ()
    assert dict(first.sends[0].args) == ARGS and first.sends[0].command_id.startswith("idle-")
    assert _sent(idle.due(T0 + 2 + IDLE_RESEND_S - 0.1, heard.__contains__)) == []  # not due yet
    heard.discard("n2")  # a node not heard from is not sent to; it is asked when it is back
    assert _sent(idle.due(T0 + 2 + IDLE_RESEND_S, heard.__contains__)) == ["n1"]
    heard.add("n2")
    assert _sent(idle.due(T0 + 2 + 2 * IDLE_RESEND_S, heard.__contains__)) == ["n1", "n2"]
    end = idle.due(cap.judge_unix_s, heard.__contains__)
    assert end.sends == () and len(idle) == 0
    assert sorted(ev.data["writer"] for _j, ev in end.events) == ["n1", "n2"]
    for job_id, ev in end.events:
        assert job_id == "j1" and ev.data["event"] == "idle_config_failed" and "did not answer" in ev.data["detail"]


def test_a_short_window_still_gets_the_write_timeout_to_answer() -> None:
    cap = _cancelled()
    idle = IdleWrites()
    late = cap.judge_unix_s - 1  # owed just before the window's end
    idle.owe(cap, ARGS, late, SET.write_timeout_s)
    assert idle.due(late + SET.write_timeout_s - 0.1, lambda n: True).events == ()
    assert len(idle.due(late + SET.write_timeout_s, lambda n: True).events) == 2


def test_answers_written_skipped_failed_busy_and_from_another_node() -> None:
    cap = _cancelled()
    idle = IdleWrites()
    idle.owe(cap, ARGS, T0 + 2, SET.write_timeout_s)
    n1, n2 = f"idle-{cap.capture_id}-n1", f"idle-{cap.capture_id}-n2"
    assert idle.answered(n1, "n2", True, "", {}, T0 + 3) is None and n1 in idle  # another node: ignored
    assert idle.answered(n1, "n1", False, wire.NODE_BUSY, {}, T0 + 3) is None and n1 in idle  # asked again
    said = idle.answered(n1, "n1", True, "", {"path": "/cfg/j1/profiler_config.json", "mtime_s": 7}, T0 + 4)
    assert said is not None and said[0] == "j1"
    assert said[1].data["event"] == "idle_config_written" and said[1].data["detail"].endswith("(mtime 7)")
    assert n1 not in idle and idle.answered(n1, "n1", True, "", {}, T0 + 5) is None  # answered once
    skipped = idle.answered(n2, "n2", True, "", {"skipped": "holds capture c-other"}, T0 + 4)
    assert skipped is not None and skipped[1].data["event"] == "idle_config_skipped" and len(idle) == 0
    idle.owe(cap, ARGS, T0 + 6, SET.write_timeout_s)
    failed = idle.answered(n2, "n2", False, "read-only file system", {}, T0 + 7)
    assert failed is not None and failed[1].data["event"] == "idle_config_failed"
    assert failed[1].data["detail"] == "read-only file system"


def test_the_waiting_writes_are_bounded_and_the_oldest_given_up_is_said() -> None:
    idle = IdleWrites(max_waiting=3)
    first, second = _cancelled(), lc.cancel(_written(_open(nodes=("n1", "n2"), now=T0 + 1)), T0 + 3, SET).capture
    assert first.capture_id != second.capture_id
    assert idle.owe(first, ARGS, T0 + 2, SET.write_timeout_s) == []
    given_up = idle.owe(second, ARGS, T0 + 3, SET.write_timeout_s)
    assert len(idle) == 3 and len(given_up) == 1
    ((job_id, ev),) = given_up
    assert ev.data["capture_id"] == first.capture_id and ev.data["writer"] == "n1"
    assert ev.data["event"] == "idle_config_failed" and "too many" in ev.data["detail"]
