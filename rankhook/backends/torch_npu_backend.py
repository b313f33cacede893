"""torch_npu capture backend: wraps ``torch_npu.profiler.dynamic_profile`` (I/O; torch_npu imported lazily in open).

What it does (``docs/torch_npu-dynamic-profile.md#hook-rules``; checked against torch-npu 2.13.0 in ``docs/conformance.md``):

* exactly one integration mode: refuses to start when ``PROF_CONFIG_PATH`` (or ``MSMONITOR_USE_DAEMON=1``) is
  set, because torch_npu then already called ``dp.init`` at import and steps on the optimizer hook, so our
  ``dp.step()`` would double-count and our ``dp.init`` would be ignored (``#modes``);
* sets ``RANK`` in ``os.environ`` before ``dp.init`` (log names, ``rank_list``; ``#shared-memory``, ``#output-layout``);
* warns about a leftover ``/dev/shm/DynamicProfileNpuShm*`` or an orphan ``DynMonitorProc`` (``#shared-memory``, ``docs/field-cases.md#fc-09``);
* calls ``dp.step()`` once per ``after_step``, ``dp.start`` for ``start_now``, ``dp.set_state`` for ``set_step``.

dynamic_profile exposes no events, so the backend *observes*: a :class:`~rankhook.profconfig.ConfigWatcher`
reads the same file torch_npu reads (``arm_seen``/``arm_rejected``), a :class:`~rankhook.profconfig.WindowGate`
mirrors torch_npu's window in the step path (``capturing()``, passed start_steps), and the watcher thread looks
for this process's new ``{host}_{pid}_{ts}_ascend_pt`` dir under ``prof_dir`` (``started``) and its completion
marker (``completed``: ``ASCEND_PROFILER_OUTPUT/analyse.done`` when online parse is effective, else
``profiler_metadata.json``; ``#output-layout``). Nothing of this runs in the step path.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from typing import TYPE_CHECKING, Any

from rankhook.backends.base import Emit, EventQueue
from rankhook.backends.dp_state import scan_dp_state
from rankhook.backends.torch_npu_config import torch_npu_prof_dir, torch_npu_reading
from rankhook.profconfig import ArmedConfig, ConfigWatcher, WindowGate, make_armed

if TYPE_CHECKING:
    from rankhook.identity import Identity

log = logging.getLogger("rankhook")

STALE_SHM_AGE_S = 120.0
"""A dynamic-profile shm block older than this at init is not from this job's start (heuristic, FC-09)."""
COMPLETION_TIMEOUT_S = 1800.0
"""After the window closed, how long to look for the completion marker before reporting ``failed``."""


class _Expect:
    """A window the mirror gate predicts: started at ``start_step``; ``stop_step`` once it closed."""

    __slots__ = ("cfg", "rank_dir", "start_step", "start_unix_s", "stop_step", "stop_unix_s")

    def __init__(self, cfg: ArmedConfig, start_step: int) -> None:
        self.cfg = cfg
        self.start_step = start_step
        self.start_unix_s = time.time()
        self.stop_step: int | None = None
        self.stop_unix_s = 0.0
        self.rank_dir: str | None = None


def analyse_effective(cfg: dict[str, Any]) -> bool:
    """True if torch_npu parses online: ``analyse`` and not forced off by ``is_rank`` without ``async_mode``.

    Source: ``docs/torch_npu-dynamic-profile.md#config-keys`` (rank_list) and ``#output-layout``; verified in ``docs/conformance.md``.
    """
    return bool(cfg.get("analyse")) and not (cfg.get("is_rank") and not cfg.get("async_mode"))


class TorchNpuBackend:
    """``torch_npu`` capture backend (see the module doc). Construct with :func:`rankhook.backends.select_backend`."""

    name = "torch_npu"

    def __init__(self, profiler_config_path: str, prof_root: str | None = None) -> None:
        self.config_dir = os.path.abspath(profiler_config_path)
        self.prof_root = prof_root
        self._dp: Any = None
        self._gate = WindowGate()
        self._watcher: ConfigWatcher | None = None
        self._events: EventQueue | None = None
        self._ident: Identity | None = None
        self._expects: list[_Expect] = []
        self._new_expects: list[_Expect] = []
        self._reported: set[str] = set()
        self._t10 = 0.0
        self._step = 0

    def open(self, ident: Identity, emit: Emit) -> None:
        """Check the mode, set RANK, warn about stale node state, ``dp.init``, start the observer thread.

        Raises RuntimeError when another dynamic-profile mode is active, ImportError without torch_npu.
        """
        env = os.environ
        if env.get("PROF_CONFIG_PATH", "").strip():
            raise RuntimeError(
                "PROF_CONFIG_PATH is set: torch_npu already initialised dynamic_profile at import and steps it from "
                "the optimizer hook; a second mode would double-count steps and our dp.init would be ignored. "
                "Unset PROF_CONFIG_PATH to use profwatch's torch_npu backend."
            )
        if "1" in (env.get("MSMONITOR_USE_DAEMON"), env.get("KINETO_USE_DAEMON")):
            raise RuntimeError("MSMONITOR_USE_DAEMON=1 selects msMonitor (dyno) mode; unset it for file mode")
        if not os.path.isdir(self.config_dir):
            raise FileNotFoundError(f"profiler_config_path {self.config_dir} is not a directory")
        have = env.get("RANK")
        if have is None:
            env["RANK"] = str(ident.rank)
        elif have.strip() != str(ident.rank):
            log.warning("rankhook: RANK=%s in the environment but rank %d resolved; torch_npu uses RANK", have, ident.rank)
        state = scan_dp_state()
        old = [b for b in state.shm_blocks if b.age_s > STALE_SHM_AGE_S]
        if old or state.orphans:
            log.warning(
                "rankhook: leftover torch_npu dynamic-profile state on this node (another job or a killed one may "
                "own the config channel; remove it when provably dead): %s",
                "; ".join([f"shm {b.path} age {b.age_s:.0f}s" for b in old] + [f"orphan DynMonitorProc pid {m.pid}" for m in state.orphans]),
            )
        import torch_npu.profiler.dynamic_profile as dp

        self._ident = ident
        self._events = EventQueue(emit, ident.job_id, ident.rank)
        init_unix_s = time.time()
        dp.init(self.config_dir)
        self._dp = dp
        self._watcher = ConfigWatcher(
            self.config_dir, rank=ident.rank, init_unix_s=init_unix_s, on_event=self._on_config, tick=self._tick,
            validate=torch_npu_reading,
        )
        self._watcher.start()

    # -- hot path -----------------------------------------------------------------------------------------------
    def after_step(self, step: int) -> None:
        """``dp.step()`` then mirror the window (list appends only; no syscalls)."""
        self._step = step
        dp = self._dp
        if dp is None:
            return
        try:
            dp.step()  # dp swallows its own errors; guard anyway (FC-13)
        except Exception as exc:  # noqa: BLE001
            log.warning("rankhook: dp.step() raised: %r", exc)
        w = self._watcher
        if w is None:
            return
        if step == 10:
            self._t10 = time.monotonic()
        elif step == 11 and self._t10:
            w.step_time_s = time.monotonic() - self._t10
        gate = self._gate
        gate.offer(w.latest)
        action, cfg = gate.on_step(step)
        if action == "start" and cfg is not None:
            self._new_expects.append(_Expect(cfg, step))
        elif action == "stop" and cfg is not None:
            for e in (*self._new_expects, *self._expects):
                if e.cfg is cfg and e.stop_step is None:
                    e.stop_unix_s = time.time()
                    e.stop_step = step
        elif action == "discard" and cfg is not None and self._events is not None:
            self._events.put(
                "arm_rejected", capture_id=cfg.capture_id, generation=cfg.generation, start_step=cfg.start_step,
                step=step, detail=f"start_step {cfg.start_step} already passed (current step {step})",
            )

    def capturing(self) -> bool:
        return self._gate.active is not None

    def start_now(self, config_path: str) -> None:
        """``dp.start(config_path)``: capture from now for warmup + active steps (start_step/rank_list ignored)."""
        if self._dp is None:
            raise RuntimeError("torch_npu backend not opened")
        self._dp.start(config_path)
        try:
            with open(config_path, "rb") as f:
                raw = json.loads(f.read() or b"{}")
            cfg, _ = torch_npu_reading({**raw, "start_step": -1, "is_rank": False})
        except (OSError, ValueError):
            cfg = None
        if cfg is not None:
            armed = make_armed(int(time.time()), cfg, self._ident.rank if self._ident else 0)
            if self._gate.start_now(armed, self._step):
                self._new_expects.append(_Expect(armed, self._step))

    def set_step(self, step: int) -> None:
        """``dp.set_state({"cur_step": step})`` (torch_npu >= 2.7; older versions lack it)."""
        self._step = step
        if self._dp is not None and hasattr(self._dp, "set_state"):
            self._dp.set_state({"cur_step": int(step)})

    def close(self) -> None:
        """Stop the observer (torch_npu's own exit hook stops a running capture at process exit)."""
        if self._watcher is not None:
            self._watcher.close()
            self._watcher = None
        self._tick()

    # -- observer (watcher thread) --------------------------------------------------------------------------------
    def _on_config(self, event: str, cfg: ArmedConfig | None, gen: int | None, detail: str) -> None:
        if self._events is not None:
            self._events.send_config_event(event, cfg, gen, detail)

    def _prof_dir(self, cfg: ArmedConfig) -> str:
        return torch_npu_prof_dir(cfg.config["prof_dir"])

    def _find_rank_dir(self, e: _Expect) -> str | None:
        assert self._ident is not None
        prefix = f"{socket.gethostname()}_{os.getpid()}_"  # torch_npu names dirs by gethostname(), not ident
        floor = time.strftime("%Y%m%d%H%M%S", time.localtime(e.start_unix_s - 2))
        try:
            names = sorted(os.listdir(self._prof_dir(e.cfg)))
        except OSError:
            return None
        for n in names:
            if n.startswith(prefix) and n.endswith("_ascend_pt") and n not in self._reported:
                ts = n[len(prefix) : -len("_ascend_pt")]
                if len(ts) == 17 and ts.isdigit() and ts[:14] >= floor:
                    self._reported.add(n)
                    return os.path.join(self._prof_dir(e.cfg), n)
        return None

    def _tick(self) -> None:
        ev = self._events
        if ev is None:
            return
        while self._new_expects:
            self._expects.append(self._new_expects.pop(0))
        now = time.time()
        for e in list(self._expects):
            cfg = e.cfg
            common = {"capture_id": cfg.capture_id, "generation": cfg.generation, "start_step": cfg.start_step}
            if e.rank_dir is None:
                e.rank_dir = self._find_rank_dir(e)
                if e.rank_dir is not None:
                    ev.send("started", step=e.start_step, rank_dir=e.rank_dir, **common)
            if e.stop_step is None or e.rank_dir is None:
                if e.stop_step is not None and now - e.stop_unix_s > COMPLETION_TIMEOUT_S:
                    self._expects.remove(e)
                    ev.send("failed", step=e.stop_step, detail="no *_ascend_pt dir appeared for this window", **common)
                continue
            marker = (
                os.path.join(e.rank_dir, "ASCEND_PROFILER_OUTPUT", "analyse.done")
                if analyse_effective(cfg.config)
                else os.path.join(e.rank_dir, "profiler_metadata.json")
            )
            if os.path.exists(marker):
                self._expects.remove(e)
                first = e.start_step + cfg.warmup
                steps = tuple(range(first, e.start_step + cfg.warmup + cfg.active))
                ev.send("completed", step=e.stop_step, rank_dir=e.rank_dir, steps=steps,
                        total_bytes=_tree_bytes(e.rank_dir), **common)
            elif now - e.stop_unix_s > COMPLETION_TIMEOUT_S:
                self._expects.remove(e)
                ev.send("failed", step=e.stop_step, rank_dir=e.rank_dir, detail=f"no {os.path.basename(marker)}", **common)
        ev.drain()


def _tree_bytes(path: str) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total
