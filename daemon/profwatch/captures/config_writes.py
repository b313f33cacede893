"""The config writes of the capture shell (``daemon/profwatch/captures/shell.py``): the arm's ``profiler_config.json``
by the coordinator (its file system worker) or by each node daemon (``write_config`` commands and their answers),
and the idle config (start_step 0) over an arm that ended unused (``core/capture/profiler_config.py:
idle_config``). I/O shell; decisions in ``core/capture/lifecycle.py`` (what is written when) and
``core/capture/idle_writes.py`` (when a node is asked again, when it is given up)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from profwatch.core.capture import lifecycle as lc
from profwatch.core.capture.idle_writes import IdleWrites
from profwatch.core.capture.profiler_config import idle_config
from rankhook import wire

if TYPE_CHECKING:
    from profwatch.captures.ports import Clock, ConfigWriterPort, Emit, Post, SendNodeCommand
    from profwatch.core.fleet.registry import JobState, NodeState


class ConfigWrites:
    """Writes the arm and the idle config for the capture shell (see the module doc). Runs on the main loop;
    file writes go to ``fs_pool`` and come back through ``post``.

    Args:
        jobs, nodes: the registry's job and node maps (read only: a job's start time, a node's last heartbeat).
        writer: the shared-storage config writer (``config_writer = "coordinator"``).
        send_node_command: sends one ``write_config`` command to a node daemon.
        allowed_config_roots: where the coordinator may write (``[coordinator] allowed_config_roots``).
        node_timeout_s: a node not heard from for longer is not sent idle writes until it is back.
        settings: the lifecycle deadlines (``write_timeout_s`` bounds an idle write's life).
        fs_pool: the shell's one file system worker (writes keep their order with the scans).
        find, apply: the shell's capture in flight by id (None when it is no longer in flight) and how a
            transition is applied (persist, publish, act).
        emit, post, clock: publish an event; hand work to the main loop; wall clock (unix s).
    """

    def __init__(self, *, jobs: Mapping[str, JobState], nodes: Mapping[str, NodeState], writer: ConfigWriterPort,
                 send_node_command: SendNodeCommand, allowed_config_roots: list[str], node_timeout_s: float,
                 settings: lc.LifecycleSettings, fs_pool: ThreadPoolExecutor,
                 find: Callable[[str], lc.Capture | None], apply: Callable[[lc.Transition], lc.Capture],
                 emit: Emit, post: Post, clock: Clock) -> None:
        self.jobs, self.nodes, self.writer, self.send_node_command = jobs, nodes, writer, send_node_command
        self.allowed_config_roots, self.node_timeout_s, self.ls = allowed_config_roots, node_timeout_s, settings
        self.fs_pool, self.find, self.apply = fs_pool, find, apply
        self.emit, self.post, self.clock = emit, post, clock
        self.idle = IdleWrites()
        self._commands: dict[str, tuple[str, str]] = {}  # arm write_config command_id -> (capture_id, node_id)

    # -- the arm -----------------------------------------------------------------------------------------------------
    def index(self, cap: lc.Capture) -> None:
        """Remember ``cap``'s arm commands, so a node's answer finds its capture (also after a restart)."""
        for n in cap.nodes.values():
            self._commands[n.command_id] = (cap.capture_id, n.node_id)

    def forget(self, capture_id: str) -> None:
        """The capture left flight: answers to its arm commands are ignored from now on."""
        for cmd in [k for k, v in self._commands.items() if v[0] == capture_id]:
            del self._commands[cmd]

    def _not_before(self, cap: lc.Capture) -> float:
        job = self.jobs.get(cap.job_id)
        return job.started_unix_s if job is not None else 0.0

    def write_config(self, cap: lc.Capture) -> None:
        """(Re)send the arm: to the file system worker, or a ``write_config`` command to each node that has not
        confirmed yet."""
        not_before = self._not_before(cap)
        if cap.writer == "coordinator":
            self.fs_pool.submit(self._write_shared, cap.capture_id, cap.profiler_config_path, dict(cap.config),
                                not_before)
            return
        self.index(cap)
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
                                    allowed_roots=self.allowed_config_roots)
            result = {"path": str(res.path), "mtime_s": res.mtime_s}
            self.post(lambda: self._on_written(capture_id, result, None))
        except Exception as exc:  # noqa: BLE001 - a refusal is the capture's outcome, never a crash
            err = str(exc) or repr(exc)
            self.post(lambda: self._on_written(capture_id, {}, err))

    def _on_written(self, capture_id: str, result: dict[str, Any], error: str | None) -> None:
        cap = self.find(capture_id)
        if cap is None:
            return
        now = self.clock()
        self.apply(lc.config_write_failed(cap, error, now, self.ls) if error is not None
                   else lc.config_written(cap, result, now, self.ls))

    # -- the idle config ---------------------------------------------------------------------------------------------
    def write_idle(self, cap: lc.Capture) -> None:
        """The idle config (start_step 0) over an arm that ended unused (cancelled, failed, superseded), by the
        writer(s) of the arm and after it (one file system worker; one FIFO queue per node). Written only while the
        file still holds this capture's arm, so a repeat is harmless; a node that does not answer is asked again
        (``core/capture/idle_writes.py``). Each writer's outcome is one ``idle_config_{written,skipped,failed}``
        event."""
        not_before = self._not_before(cap)
        state, why = cap.state.value, cap.outcome or cap.state.value
        content = idle_config(f"capture {cap.capture_id} " + (why if why.startswith(state) else f"{state}: {why}"))
        if cap.writer == "coordinator":
            self.fs_pool.submit(self._write_idle_shared, cap, content, not_before)
            return
        now = self.clock()
        args = {"profiler_config_path": cap.profiler_config_path, "config": content, "not_before_unix_s": not_before,
                "idle_for": cap.capture_id}
        for job_id, ev in self.idle.owe(cap, args, now, self.ls.write_timeout_s):
            self._emit_event(job_id, ev)
        self.tick(now)

    def tick(self, now: float) -> None:
        """Send the node idle writes that are due; publish those given up at their deadline."""
        def heard(node_id: str) -> bool:
            node = self.nodes.get(node_id)
            return node is not None and now - node.last_seen_unix_s <= self.node_timeout_s

        due = self.idle.due(now, heard)
        for job_id, ev in due.events:
            self._emit_event(job_id, ev)
        for send in due.sends:
            self.send_node_command(send.node_id, wire.NodeCommand(cmd="write_config", command_id=send.command_id,
                                                                  args=dict(send.args)))

    def _write_idle_shared(self, cap: lc.Capture, content: dict[str, Any], not_before: float) -> None:
        """File system worker: the idle config into the shared config dir; the result goes to the main loop."""
        from profwatch.adapters.fs.config_writer import ConfigIdleNotNeeded

        try:
            res = self.writer.write(cap.profiler_config_path, content, not_before_unix_s=not_before,
                                    idle_for=cap.capture_id, allowed_roots=self.allowed_config_roots)
            outcome, detail = lc.IdleOutcome.WRITTEN, f"{res.path} (mtime {res.mtime_s})"
        except ConfigIdleNotNeeded as exc:
            outcome, detail = lc.IdleOutcome.SKIPPED, str(exc)
        except Exception as exc:  # noqa: BLE001 - a failed idle write is reported, never a crash
            outcome, detail = lc.IdleOutcome.FAILED, str(exc) or repr(exc)
        self.post(lambda: self._emit_event(cap.job_id, lc.idle_config_result(cap, "coordinator", outcome, detail,
                                                                              self.clock())))

    def _emit_event(self, job_id: str, ev: lc.Event) -> None:
        self.emit(ev.type, job_id, dict(ev.data), event_id=ev.event_id)

    # -- node answers --------------------------------------------------------------------------------------------------
    def on_node_ack(self, ack: wire.NodeAck, now: float) -> None:
        """A node daemon answered a ``write_config`` command (an idle write, or an arm of a capture in flight)."""
        if ack.command_id in self.idle:
            said = self.idle.answered(ack.command_id, ack.node_id, ack.ok, ack.detail, ack.result, now)
            if said is not None:
                self._emit_event(*said)
            return
        cid, node_id = self._commands.get(ack.command_id, ("", ""))
        cap = self.find(cid)
        if cap is None or node_id != ack.node_id:
            return
        self.apply(lc.node_write_result(cap, node_id, ack.ok, ack.detail, dict(ack.result), now, self.ls))
