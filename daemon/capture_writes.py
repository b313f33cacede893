"""The config writes of the capture shell (``daemon/captures.py``): the arm's ``profiler_config.json`` by the
coordinator (its file system worker) or by each node daemon (``write_config`` commands and their answers), and the
idle config (start_step 0) over a cancelled arm (``daemon/core/profiler_config.py: idle_config``). I/O shell;
decisions in ``daemon/core/lifecycle.py``. A mixin: :class:`daemon.captures.CaptureShell` provides the attributes
below."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from daemon.core import lifecycle as lc
from daemon.core.profiler_config import idle_config
from rankhook import wire

if TYPE_CHECKING:
    from daemon.capture_ports import Clock, ConfigWriterPort, Emit, Post, SendNodeCommand
    from daemon.config import Settings
    from daemon.core.registry import JobState

MAX_IDLE_COMMANDS = 4096
"""Idle-config commands awaiting their node's answer (the oldest are forgotten beyond this: only their event is lost)."""


class ConfigWrites:
    """The config writes of the capture shell (see the module doc)."""

    s: Settings
    ls: lc.LifecycleSettings
    jobs: Mapping[str, JobState]
    writer: ConfigWriterPort
    send_node_command: SendNodeCommand
    emit: Emit
    post: Post
    clock: Clock
    fs_pool: ThreadPoolExecutor
    _commands: dict[str, tuple[str, str]]
    _idle_commands: dict[str, tuple[lc.Capture, str]]
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
        """After a cancel: the idle config (start_step 0) over the arm, by the writer(s) that wrote the arm (in order
        after it: one file system worker, one FIFO queue per node); each result is an ``idle_config_*`` event."""
        job = self.jobs.get(cap.job_id)
        not_before = job.started_unix_s if job is not None else 0.0
        content = idle_config(f"capture {cap.capture_id} cancelled")
        if cap.writer == "coordinator":
            self.fs_pool.submit(self._write_idle_shared, cap, content, not_before)
            return
        for n in cap.nodes.values():
            command_id = f"idle-{cap.capture_id}-{n.node_id}"
            self._idle_commands[command_id] = (cap, n.node_id)
            while len(self._idle_commands) > MAX_IDLE_COMMANDS:  # nodes that never answer do not grow it
                self._idle_commands.pop(next(iter(self._idle_commands)))
            self.send_node_command(n.node_id, wire.NodeCommand(cmd="write_config", command_id=command_id, args={
                "profiler_config_path": cap.profiler_config_path, "config": content, "not_before_unix_s": not_before,
                "idle": True}))

    def _write_idle_shared(self, cap: lc.Capture, content: dict[str, Any], not_before: float) -> None:
        """File system worker: the idle config into the shared config dir; the result goes to the main loop."""
        try:
            res = self.writer.write(cap.profiler_config_path, content, not_before_unix_s=not_before, idle=True,
                                    allowed_roots=[str(r) for r in self.s.coordinator.allowed_config_roots])
            ok, detail = True, f"{res.path} (mtime {res.mtime_s})"
        except Exception as exc:  # noqa: BLE001 - a failed idle write is reported, never a crash
            ok, detail = False, str(exc) or repr(exc)
        self.post(lambda: self._emit_event(lc.idle_config_result(cap, "coordinator", ok, detail, self.clock()),
                                           cap.job_id))

    def _emit_event(self, ev: lc.Event, job_id: str) -> None:
        self.emit(ev.type, job_id, dict(ev.data), event_id=ev.event_id)

    def on_node_ack(self, ack: wire.NodeAck, now: float) -> None:
        """A node daemon answered a ``write_config`` command."""
        idle, idle_node = self._idle_commands.get(ack.command_id, (None, ""))
        if idle is not None:
            if idle_node == ack.node_id:  # another node naming this command is ignored
                del self._idle_commands[ack.command_id]
                detail = ack.detail or f"{ack.result.get('path', '')} (mtime {ack.result.get('mtime_s')})"
                self._emit_event(lc.idle_config_result(idle, ack.node_id, ack.ok, detail, now), idle.job_id)
            return
        cid, node_id = self._commands.get(ack.command_id, ("", ""))
        cap = self._find(cid)
        if cap is None or node_id != ack.node_id:
            return
        self._apply(lc.node_write_result(cap, node_id, ack.ok, ack.detail, dict(ack.result), now, self.ls))
