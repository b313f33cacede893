"""The node daemons' idle writes owed for ended captures: when each node is asked (again), when it is given up,
and what its answer comes to (pure; time passed in).

A capture that ended owing the idle config (:attr:`~profwatch.core.capture.lifecycle.Capture.idle_owed`) and was
written by node daemons (``config_writer = "node"``) owes one idle ``write_config`` per node. A node that has not
answered is asked again every :data:`IDLE_RESEND_S` while it is heard from (a lost command, a reconnected node, a
full queue) until the window's judgement time (at least the write timeout ahead); then it is given up and said so.
At most :data:`MAX_IDLE_SENDS` wait at once (the oldest is given up). The shell sends what :meth:`IdleWrites.due`
returns and publishes the events; a restarted coordinator starts from the captures that still owe it
(:func:`~profwatch.core.capture.lifecycle.owes_idle`), since a repeat is harmless (the node writes the idle config
only where the file still holds that capture's arm).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from profwatch.core.capture import lifecycle as lc
from rankhook import wire

MAX_IDLE_SENDS = 1 << 14
"""Idle writes waiting for their node's answer (one per node of an ended capture; each ends at its deadline)."""
IDLE_RESEND_S = 10.0
"""A node that has not answered an idle write is asked again this often while it is heard from (seconds)."""


@dataclass(slots=True)
class IdleSend:
    """One node's idle write owed for an ended capture: its ``command_id`` and command ``args``, when to (re)send
    (``next_unix_s``), when to give up (``until_unix_s``)."""

    cap: lc.Capture
    node_id: str
    command_id: str
    args: Mapping[str, Any]
    next_unix_s: float
    until_unix_s: float


JobEvent = tuple[str, lc.Event]
"""An event to publish and the job it is about (``job_id``, event)."""


@dataclass(frozen=True, slots=True)
class IdleDue:
    """What :meth:`IdleWrites.due` decided at one time: the commands to send now and the events to publish."""

    sends: tuple[IdleSend, ...] = ()
    events: tuple[JobEvent, ...] = ()


@dataclass(slots=True)
class IdleWrites:
    """The idle writes owed by node daemons (see the module doc); insertion-ordered, bounded."""

    max_waiting: int = MAX_IDLE_SENDS
    resend_s: float = IDLE_RESEND_S
    _waiting: dict[str, IdleSend] = field(default_factory=dict, init=False, repr=False)

    def __len__(self) -> int:
        return len(self._waiting)

    def __contains__(self, command_id: object) -> bool:
        return command_id in self._waiting

    def owe(self, cap: lc.Capture, args: Mapping[str, Any], now: float, write_timeout_s: float) -> list[JobEvent]:
        """Owe ``cap``'s idle write (command ``args``) by each node of the arm (a node that answered "no" may still
        have written: an mtime it could not set), due at once, given up at ``max(judge_unix_s, now +
        write_timeout_s)``. Returns the ``idle_config_failed`` events of the oldest writes given up to stay within
        ``max_waiting``."""
        until = max(cap.judge_unix_s, now + write_timeout_s)
        for node_id in cap.nodes:
            command_id = f"idle-{cap.capture_id}-{node_id}"
            self._waiting[command_id] = IdleSend(cap, node_id, command_id, dict(args), now, until)
        events = []
        while len(self._waiting) > self.max_waiting:
            old = self._waiting.pop(next(iter(self._waiting)))
            events.append((old.cap.job_id, lc.idle_config_result(old.cap, old.node_id, lc.IdleOutcome.FAILED,
                                                                  "given up: too many idle writes waiting", now)))
        return events

    def due(self, now: float, heard: Callable[[str], bool]) -> IdleDue:
        """The writes to send at ``now`` (due, and their node ``heard`` from lately: a node not heard from is not
        sent to, and asked when it is back) and the ``idle_config_failed`` events of those past their deadline
        (given up). A write sent is due again ``resend_s`` later."""
        sends: list[IdleSend] = []
        events: list[JobEvent] = []
        for command_id, send in list(self._waiting.items()):
            if now >= send.until_unix_s:
                del self._waiting[command_id]
                why = f"node {send.node_id} did not answer before the window's end (not connected, or it restarted)"
                events.append((send.cap.job_id,
                               lc.idle_config_result(send.cap, send.node_id, lc.IdleOutcome.FAILED, why, now)))
            elif now >= send.next_unix_s:
                send.next_unix_s = now + self.resend_s
                if heard(send.node_id):
                    sends.append(send)
        return IdleDue(tuple(sends), tuple(events))

    def answered(self, command_id: str, node_id: str, ok: bool, detail: str, result: Mapping[str, Any],
                 now: float) -> JobEvent | None:
        """A node answered idle write ``command_id``: its outcome event (``written``, ``skipped``: the file held
        another arm, or ``failed``), or None when there is nothing to say: another node named this command (it
        is ignored), or the node's queue was full (``rankhook.wire.NODE_BUSY``: asked again at the next resend)."""
        send = self._waiting.get(command_id)
        if send is None or send.node_id != node_id or (not ok and detail == wire.NODE_BUSY):
            return None
        del self._waiting[command_id]
        skipped = result.get("skipped")
        if not ok:
            outcome, said = lc.IdleOutcome.FAILED, detail
        elif skipped:
            outcome, said = lc.IdleOutcome.SKIPPED, str(skipped)
        else:
            outcome, said = lc.IdleOutcome.WRITTEN, f"{result.get('path', '')} (mtime {result.get('mtime_s')})"
        return send.cap.job_id, lc.idle_config_result(send.cap, node_id, outcome, said, now)
