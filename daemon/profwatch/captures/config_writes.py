"""The config writes of the capture shell (``daemon/profwatch/captures/shell.py``): the arm's ``profiler_config.json`` by the
coordinator (its file system worker) or by each node daemon (``write_config`` commands and their answers), and the
idle config (start_step 0) over an arm that ended unused (``daemon/profwatch/core/capture/profiler_config.py: idle_config``). I/O shell;
decisions in ``daemon/profwatch/core/capture/lifecycle.py``. A mixin: :class:`profwatch.captures.shell.CaptureShell` provides the attributes
below."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from profwatch.core.capture import lifecycle as lc
from profwatch.core.capture.profiler_config import idle_config
from rankhook import wire

if TYPE_CHECKING:
    from profwatch.captures.ports import Clock, ConfigWriterPort, Emit, Post, SendNodeCommand
    from profwatch.config import Settings
    from profwatch.core.fleet.registry import JobState, NodeState

MAX_IDLE_SENDS = 1 << 14
"""Idle writes waiting for their node's answer (one per node of an ended capture; each ends at its deadline)."""
IDLE_RESEND_S = 10.0
"""A node that has not answered an idle write is asked again this often while it is heard from (a lost command, a
reconnected node, a full queue)."""


@dataclass(slots=True)
class IdleSend:
    """One node's idle write owed for an ended capture: its command ``args``, when to (re)send, when to give up
    (the window's judgement time, at least the write timeout ahead)."""

    cap: lc.Capture
    node_id: str
    args: dict[str, Any]
    next_unix_s: float
    until: float


class ConfigWrites:
    """The config writes of the capture shell (see the module doc)."""

    s: Settings
    ls: lc.LifecycleSettings
    jobs: Mapping[str, JobState]
    nodes: Mapping[str, NodeState]
    writer: ConfigWriterPort
    send_node_command: SendNodeCommand
    emit: Emit
    post: Post
    clock: Clock
    fs_pool: ThreadPoolExecutor
    _commands: dict[str, tuple[str, str]]
    _idle_sends: dict[str, IdleSend]
    _find: Callable[[str], lc.Capture | None]
    _apply: Callable[..., lc.Capture]

    def _index_commands(self, cap: lc.Capture) -> None:
        for n in cap.nodes.values():
            self._commands[n.command_id] = (cap.capture_id, n.node_id)

    def _write_config(self, cap: lc.Capture) -> None:
        job = self.jobs.get(cap.job_id)
        not_before = job.started_unix_s if job is not None else 0.0
        if cap.writer == "coordinator":
            self.fs_pool.submit(self._write_shared, cap.capture_id, cap.profiler_config_path, dict(cap.config),
                                not_before)
            return
        self._index_commands(cap)
        for n in cap.nodes.values():
            if n.ok is None:
                self.send_node_command(n.node_id, wire.NodeCommand(
                    cmd="write_config", command_id=n.command_id,
                    args={"profiler_config_path": cap.profiler_config_path, "config": dict(cap.config),
                          "not_before_unix_s": not_before}))

    def _write_shared(self, capture_id: str, config_dir: str, config: dict[str, Any], not_before: float) -> None:
        """File system worker: write the shared config, report back to the main loop."""
        try:
            res = self.writer.write(config_dir, config, not_before_unix_s=not_before,
                                    allowed_roots=[str(r) for r in self.s.coordinator.allowed_config_roots])
            result = {"path": str(res.path), "mtime_s": res.mtime_s}
            self.post(lambda: self._on_written(capture_id, result, None))
        except Exception as exc:  # noqa: BLE001 - a refusal is the capture's outcome, never a crash
            err = str(exc) or repr(exc)
            self.post(lambda: self._on_written(capture_id, {}, err))

    def _on_written(self, capture_id: str, result: dict[str, Any], error: str | None) -> None:
        cap = self._find(capture_id)
        if cap is None:
            return
        now = self.clock()
        self._apply(lc.config_write_failed(cap, error, now, self.ls) if error is not None
                    else lc.config_written(cap, result, now, self.ls))

    def _write_idle(self, cap: lc.Capture) -> None:
        """The idle config (start_step 0) over an arm that ended unused (cancelled, failed, superseded), by the
        writer(s) of the arm and after it (one file system worker; one FIFO queue per node). Written only while the
        file still holds this capture's arm, so a repeat is harmless: a node that does not answer is asked again
        every :data:`IDLE_RESEND_S` until the window's judgement time. Each writer's outcome is one
        ``idle_config_{written,skipped,failed}`` event."""
        job = self.jobs.get(cap.job_id)
        not_before = job.started_unix_s if job is not None else 0.0
        state, why = cap.state.value, cap.outcome or cap.state.value
        content = idle_config(f"capture {cap.capture_id} " + (why if why.startswith(state) else f"{state}: {why}"))
        if cap.writer == "coordinator":
            self.fs_pool.submit(self._write_idle_shared, cap, content, not_before)
            return
        now = self.clock()
        args = {"profiler_config_path": cap.profiler_config_path, "config": content, "not_before_unix_s": not_before,
                "idle_for": cap.capture_id}
        for n in cap.nodes.values():  # a node that answered "no" may still have written (an mtime it could not set)
            command_id = f"idle-{cap.capture_id}-{n.node_id}"
            self._idle_sends[command_id] = IdleSend(cap, n.node_id, args, 0.0,
                                                    max(cap.judge_unix_s, now + self.ls.write_timeout_s))
            while len(self._idle_sends) > MAX_IDLE_SENDS:  # bounded: the oldest is given up, and said so
                old_id = next(iter(self._idle_sends))
                old = self._idle_sends.pop(old_id)
                self._emit_event(lc.idle_config_result(old.cap, old.node_id, lc.IdleOutcome.FAILED,
                                                       "given up: too many idle writes waiting", now), old.cap.job_id)
        self._send_idle_due(now)

    def _send_idle_due(self, now: float) -> None:
        """Send the idle writes that are due; give up on those past their deadline (tick and after a cancel)."""
        for command_id, send in list(self._idle_sends.items()):
            if now >= send.until:
                del self._idle_sends[command_id]
                why = f"node {send.node_id} did not answer before the window's end (not connected, or it restarted)"
                self._emit_event(lc.idle_config_result(send.cap, send.node_id, lc.IdleOutcome.FAILED, why, now),
                                 send.cap.job_id)
            elif now >= send.next_unix_s:
                send.next_unix_s = now + IDLE_RESEND_S
                node = self.nodes.get(send.node_id)
                if node is not None and now - node.last_seen_unix_s <= self.s.coordinator.node_timeout_s:
                    self.send_node_command(send.node_id, wire.NodeCommand(cmd="write_config", command_id=command_id,
                                                                          args=dict(send.args)))
                # a node not heard from lately is not sent to (no route, no warning per try): asked when it is back

    def _write_idle_shared(self, cap: lc.Capture, content: dict[str, Any], not_before: float) -> None:
        """File system worker: the idle config into the shared config dir; the result goes to the main loop."""
        from profwatch.adapters.fs.config_writer import ConfigIdleNotNeeded

        try:
            res = self.writer.write(cap.profiler_config_path, content, not_before_unix_s=not_before,
                                    idle_for=cap.capture_id,
                                    allowed_roots=[str(r) for r in self.s.coordinator.allowed_config_roots])
            outcome, detail = lc.IdleOutcome.WRITTEN, f"{res.path} (mtime {res.mtime_s})"
        except ConfigIdleNotNeeded as exc:
            outcome, detail = lc.IdleOutcome.SKIPPED, str(exc)
        except Exception as exc:  # noqa: BLE001 - a failed idle write is reported, never a crash
            outcome, detail = lc.IdleOutcome.FAILED, str(exc) or repr(exc)
        self.post(lambda: self._emit_event(lc.idle_config_result(cap, "coordinator", outcome, detail, self.clock()),
                                           cap.job_id))

    def _emit_event(self, ev: lc.Event, job_id: str) -> None:
        self.emit(ev.type, job_id, dict(ev.data), event_id=ev.event_id)

    def on_node_ack(self, ack: wire.NodeAck, now: float) -> None:
        """A node daemon answered a ``write_config`` command."""
        send = self._idle_sends.get(ack.command_id)
        if send is not None:
            if send.node_id == ack.node_id:  # another node naming this command is ignored
                if not ack.ok and ack.detail == wire.NODE_BUSY:
                    return  # its queue was full: asked again at the next resend
                del self._idle_sends[ack.command_id]
                skipped = ack.result.get("skipped")
                if not ack.ok:
                    outcome, detail = lc.IdleOutcome.FAILED, ack.detail
                elif skipped:
                    outcome, detail = lc.IdleOutcome.SKIPPED, str(skipped)
                else:
                    outcome = lc.IdleOutcome.WRITTEN
                    detail = f"{ack.result.get('path', '')} (mtime {ack.result.get('mtime_s')})"
                self._emit_event(lc.idle_config_result(send.cap, ack.node_id, outcome, detail, now), send.cap.job_id)
            return
        cid, node_id = self._commands.get(ack.command_id, ("", ""))
        cap = self._find(cid)
        if cap is None or node_id != ack.node_id:
            return
        self._apply(lc.node_write_result(cap, node_id, ack.ok, ack.detail, dict(ack.result), now, self.ls))
