"""torch.profiler capture backend driven by torch_npu's ``profiler_config.json`` protocol (I/O; torch imported lazily).

For CPU/CUDA jobs. The same file, the same rules as torch_npu (via :mod:`rankhook.profconfig`): whole-second
mtime, strict-newer acceptance, start_step ``-1``/N/past, one pending slot, ``is_rank``/``rank_list``,
``warmup``/``active``, ``activities`` (``NPU`` maps to CUDA when available), ``record_shapes``/``with_stack``/
``profile_memory``/``with_flops``/``with_modules``.

Window (torch_npu semantics, docs/torch_npu-dynamic-profile.md#start-step): the capture starts inside
the ``start_step``-th ``step()`` call and stops inside the call ``warmup + active`` steps later. The profiler's
schedule is ``skip_first=S, wait=0, warmup, active, repeat=1`` with its step counter set to ``S``, so the trace's
``ProfilerStep#k`` labels are the dp step numbers; the recorded (active) steps are ``[S+warmup, S+warmup+active)``.

Output, one dir per rank per capture under the config's ``prof_dir`` (docs/rank-dirs.md#torch): ``{host}_{pid}_{YYYYmmddHHMMSSfff}_torch_pt/`` with ``profiler_info_{rank}.json``,
``profiler_metadata.json``, the Kineto trace ``{host}_{pid}.{ts_ms}.pt.trace.json`` (``distributedInfo.rank``
always present) and the empty ``trace.done`` written last. The trace export runs on the watcher thread, not
in ``step()``; ``close()`` stops a running capture and waits (bounded) for the export.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from rankhook.backends.base import Emit, EventQueue, ts17
from rankhook.profconfig import (
    CONFIG_FILE,
    TEMPLATE,
    ArmedConfig,
    ConfigWatcher,
    WindowGate,
    make_armed,
    validate_config,
)

if TYPE_CHECKING:
    from rankhook.identity import Identity

log = logging.getLogger("rankhook")

CLOSE_WAIT_S = 60.0
"""Longest ``close()`` waits for a pending trace export."""


def create_template(config_dir: str) -> bool:
    """Create ``<config_dir>/profiler_config.json`` from torch_npu's template if absent (mode 0640, indent 4).

    Exclusive create, so concurrent ranks race safely; returns True if this call created it. Source:
    docs/torch_npu-dynamic-profile.md#config-polling (item 2) and #config-keys.
    """
    path = os.path.join(config_dir, CONFIG_FILE)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o640)
    except FileExistsError:
        return False
    try:
        os.write(fd, json.dumps(TEMPLATE, indent=4).encode())
        os.fchmod(fd, 0o640)
    finally:
        os.close(fd)
    return True


class _Capture:
    """State of one running or finished capture on this rank."""

    __slots__ = ("cfg", "prof", "rank_dir", "start_step", "start_unix_s", "stop_step", "stop_unix_s")

    def __init__(self, cfg: ArmedConfig, prof: Any, rank_dir: str, start_step: int) -> None:
        self.cfg = cfg
        self.prof = prof
        self.rank_dir = rank_dir
        self.start_step = start_step
        self.start_unix_s = time.time()
        self.stop_step = start_step
        self.stop_unix_s = 0.0


class TorchBackend:
    """``torch`` capture backend (see the module doc). Construct with :func:`rankhook.backends.select_backend`."""

    name = "torch"

    def __init__(self, profiler_config_path: str, prof_root: str | None = None) -> None:
        self.config_dir = os.path.abspath(profiler_config_path)
        self.prof_root = prof_root
        self._gate = WindowGate()
        self._cur: _Capture | None = None
        self._exports: deque[_Capture] = deque()
        self._exporting = threading.Event()
        self._watcher: ConfigWatcher | None = None
        self._events: EventQueue | None = None
        self._ident: Identity | None = None
        self._t10 = 0.0
        self._step = 0
        self._broken = False

    # -- lifecycle ------------------------------------------------------------------------------------------
    def open(self, ident: Identity, emit: Emit) -> None:
        """Create the template if absent and start the watcher thread. Raises OSError if the dir is unusable."""
        if not os.path.isdir(self.config_dir):
            raise FileNotFoundError(f"profiler_config_path {self.config_dir} is not a directory")
        create_template(self.config_dir)
        self._ident = ident
        self._events = EventQueue(emit, ident.job_id, ident.rank)
        self._watcher = ConfigWatcher(self.config_dir, rank=ident.rank, on_event=self._on_config, tick=self._tick)
        self._watcher.start()

    def close(self) -> None:
        """Stop a running capture (flush partial data, like torch_npu's exit hook), export, stop the watcher."""
        cur = self._cur
        if cur is not None:
            log.warning("rankhook: capture stopped at shutdown before warmup+active steps completed")
            self._stop_capture(self._step)
        deadline = time.monotonic() + CLOSE_WAIT_S
        while (self._exports or self._exporting.is_set()) and time.monotonic() < deadline:
            time.sleep(0.05)
        if self._watcher is not None:
            self._watcher.close()
            self._watcher = None
        self._tick()  # export anything still queued (watcher gone or too slow) and flush events

    # -- hot path ---------------------------------------------------------------------------------------------
    def capturing(self) -> bool:
        return self._cur is not None

    def after_step(self, step: int) -> None:
        """Advance the window for step counter ``step`` (no syscalls unless a capture starts/stops now)."""
        self._step = step
        w = self._watcher
        if w is None or self._broken:
            return
        if step == 10:
            self._t10 = time.monotonic()
        elif step == 11 and self._t10:
            w.step_time_s = time.monotonic() - self._t10
        gate = self._gate
        if self._cur is None and (self._exports or self._exporting.is_set()):
            return  # previous capture still exporting: keep the pending config until it is done
        gate.offer(w.latest)
        try:
            if self._cur is not None:
                self._cur.prof.step()
            action, cfg = gate.on_step(step)
            if action == "start" and cfg is not None:
                self._start_capture(cfg, step)
            elif action == "stop":
                self._stop_capture(step)
            elif action == "discard" and cfg is not None and self._events is not None:
                self._events.put(
                    "arm_rejected",
                    capture_id=cfg.capture_id,
                    generation=cfg.generation,
                    start_step=cfg.start_step,
                    step=step,
                    detail=f"start_step {cfg.start_step} already passed (current step {step})",
                )
        except Exception as exc:  # noqa: BLE001 - profiling must never break training (docs/field-cases.md#fc-13)
            self._broken = True
            self._cur = None
            log.warning("rankhook: torch.profiler capture failed, capture disabled: %r", exc)
            if self._events is not None:
                self._events.put("failed", step=step, detail=f"torch.profiler: {exc!r}")

    def start_now(self, config_path: str) -> None:
        """One-shot capture from the current step for ``warmup + active`` steps (ignores start_step/rank_list)."""
        if self._cur is not None:
            log.warning("rankhook: profiler already started")
            return
        with open(config_path, "rb") as f:
            raw = json.loads(f.read() or b"{}")
        raw = {**raw, "start_step": -1}
        cfg, reason = validate_config(raw)
        if cfg is None:
            raise ValueError(f"invalid profiler config {config_path}: {reason}")
        cfg["is_rank"] = False
        armed = make_armed(int(time.time()), cfg, self._ident.rank if self._ident else 0)
        if self._gate.start_now(armed, self._step):
            self._start_capture(armed, self._step)

    def set_step(self, step: int) -> None:
        self._step = step

    # -- capture ------------------------------------------------------------------------------------------------
    def _prof_dir(self, cfg: ArmedConfig) -> str:
        d = cfg.config["prof_dir"] or (self.prof_root or ".")
        return os.path.abspath(d)

    def _start_capture(self, cfg: ArmedConfig, step: int) -> None:
        import torch
        from torch.profiler import ProfilerActivity, profile, schedule

        assert self._ident is not None
        c = cfg.config
        acts = []
        names = {a.upper() for a in c["activities"]} or {"CPU", "NPU"}
        if "CPU" in names:
            acts.append(ProfilerActivity.CPU)
        if "NPU" in names and torch.cuda.is_available():
            acts.append(ProfilerActivity.CUDA)
        if not acts:
            acts = [ProfilerActivity.CPU]
        host, pid = self._ident.hostname, os.getpid()
        rank_dir = os.path.join(self._prof_dir(cfg), f"{host}_{pid}_{ts17(time.time())}_torch_pt")
        os.makedirs(rank_dir, mode=0o750, exist_ok=True)
        sched = schedule(skip_first=max(step, 0), wait=0, warmup=cfg.warmup, active=cfg.active, repeat=1)
        prof = profile(
            activities=acts,
            schedule=sched,
            record_shapes=c["record_shapes"],
            with_stack=c["with_stack"],
            profile_memory=c["profile_memory"],
            with_flops=c["with_flops"],
            with_modules=c["with_modules"],
        )
        # Label ProfilerStep#k with dp step numbers: the schedule starts at step S (torch_npu does the same
        # with _set_step_num_offset_for_dynamic_prof).
        prof.step_num = max(step, 0)
        prof.current_action = sched(prof.step_num)
        if hasattr(prof, "_prev_schedule_action"):
            prof._prev_schedule_action = prof.current_action
        prof.start()
        dist_ready = False
        try:
            dist = torch.distributed
            dist_ready = dist.is_available() and dist.is_initialized()
        except Exception:  # noqa: BLE001
            dist_ready = False
        if not dist_ready:
            info = {"backend": "none", "rank": self._ident.rank, "world_size": self._ident.world_size}
            prof.add_metadata_json("distributedInfo", json.dumps(info))
        self._cur = _Capture(cfg, prof, rank_dir, step)
        if self._events is not None:
            self._events.put(
                "started", capture_id=cfg.capture_id, generation=cfg.generation, start_step=cfg.start_step,
                step=step, rank_dir=rank_dir,
            )

    def _stop_capture(self, step: int) -> None:
        cur = self._cur
        if cur is None:
            return
        self._cur = None
        self._gate.active = None
        cur.stop_step = step
        cur.stop_unix_s = time.time()
        try:
            cur.prof.stop()
        except Exception as exc:  # noqa: BLE001
            log.warning("rankhook: torch.profiler stop failed: %r", exc)
        self._exports.append(cur)

    def _tick(self) -> None:
        """Watcher thread: send queued events, export finished captures (their events follow), send again."""
        if self._events is not None:
            self._events.drain()
        while self._exports:
            self._exporting.set()
            cur = self._exports.popleft()
            try:
                self._export(cur)
            finally:
                self._exporting.clear()
        if self._events is not None:
            self._events.drain()

    def _export(self, cur: _Capture) -> None:
        assert self._ident is not None and self._events is not None
        ident, cfg = self._ident, cur.cfg
        first = cur.start_step + cfg.warmup
        steps = tuple(range(first, min(cur.stop_step, cur.start_step + cfg.warmup + cfg.active)))
        try:
            info = {
                "rank_id": ident.rank,
                "world_size": ident.world_size,
                "config": cfg.config,
                "start_info": {"start_step": cur.start_step, "collectionTimeBegin_unix_s": cur.start_unix_s},
                "end_info": {"stop_step": cur.stop_step, "collectionTimeEnd_unix_s": cur.stop_unix_s},
                "steps": list(steps),
                "torch_version": _torch_version(),
            }
            _write_json(os.path.join(cur.rank_dir, f"profiler_info_{ident.rank}.json"), info)
            _write_json(os.path.join(cur.rank_dir, "profiler_metadata.json"), cfg.config.get("metadata") or {})
            trace = os.path.join(cur.rank_dir, f"{ident.hostname}_{os.getpid()}.{int(time.time() * 1000)}.pt.trace.json")
            cur.prof.export_chrome_trace(trace)
            with open(os.path.join(cur.rank_dir, "trace.done"), "wb"):
                pass
            total = sum(e.stat().st_size for e in os.scandir(cur.rank_dir) if e.is_file())
            self._events.send(
                "completed", capture_id=cfg.capture_id, generation=cfg.generation, start_step=cfg.start_step,
                step=cur.stop_step, rank_dir=cur.rank_dir, steps=steps, total_bytes=total,
            )
        except Exception as exc:  # noqa: BLE001
            log.warning("rankhook: writing the torch.profiler capture failed: %r", exc)
            self._events.send(
                "failed", capture_id=cfg.capture_id, generation=cfg.generation, start_step=cfg.start_step,
                step=cur.stop_step, rank_dir=cur.rank_dir, detail=f"export: {exc!r}",
            )

    def _on_config(self, event: str, cfg: ArmedConfig | None, gen: int | None, detail: str) -> None:
        if self._events is not None:
            self._events.send_config_event(event, cfg, gen, detail)


def _write_json(path: str, obj: Any) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o640)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2)


def _torch_version() -> str:
    import sys

    t = sys.modules.get("torch")
    return str(getattr(t, "__version__", "")) if t is not None else ""
