"""The capture-backend interface rankhook's hook drives, the ``none`` backend, and the selector (stdlib only).

Contract (called by ``rankhook/hook.py``): ``open`` once at ``rankhook.init`` (may raise; the hook then falls
back to ``none``), ``after_step(step)`` at the end of every ``rankhook.step()`` (cheap, never raises),
``capturing()``, ``start_now(config_path)`` for ``rankhook.start()`` (one-shot ``dp.start``), ``set_step`` after a
resume (``dp.set_state({"cur_step": N})``) and ``close()`` at shutdown (bounded flush).
Backends emit :class:`~rankhook.wire.CaptureEvent` through ``emit`` from their own background thread, never from
the step path; ``emit`` must be thread-safe and non-blocking (the hook's publisher is).

A deliberate circle with ``rankhook/backends/torch_backend.py`` and ``torch_npu_backend.py``: they take the
interface (``Emit``, ``EventQueue``) from here, and :func:`select_backend` here imports the one asked for lazily,
inside the call, so that a rank never imports torch or torch_npu for a backend it does not use (``none`` imports
neither). Moving the selector elsewhere would only add a module the hook must know besides this one.
"""

from __future__ import annotations

import importlib.util
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from rankhook.wire import CaptureEvent

if TYPE_CHECKING:
    from rankhook.identity import Identity

Emit = Callable[[CaptureEvent], None]


class CaptureBackend(Protocol):
    """What ``rankhook/hook.py`` calls; see the module doc for the call order."""

    name: str  # "torch_npu" | "torch" | "none"

    def open(self, ident: Identity, emit: Emit) -> None:
        """Start the backend at ``rankhook.init``; may raise (the hook falls back to ``none``)."""
        ...

    def after_step(self, step: int) -> None:
        """End of every ``rankhook.step()`` with the step counter; MUST be cheap and never raise."""
        ...

    def capturing(self) -> bool:
        """True while a capture window is open on this rank."""
        ...

    def start_now(self, config_path: str) -> None:
        """One-shot capture starting now for ``warmup + active`` steps (torch_npu ``dp.start``)."""
        ...

    def set_step(self, step: int) -> None:
        """Align the step counter after a resume (torch_npu ``dp.set_state({"cur_step": step})``)."""
        ...

    def close(self) -> None:
        """Stop a running capture and flush it (bounded wait); stop background threads."""
        ...


class NoneBackend:
    """Captures nothing (telemetry only)."""

    name = "none"

    def open(self, ident: Identity, emit: Emit) -> None:
        return None

    def after_step(self, step: int) -> None:
        return None

    def capturing(self) -> bool:
        return False

    def start_now(self, config_path: str) -> None:
        return None

    def set_step(self, step: int) -> None:
        return None

    def close(self) -> None:
        return None


class EventQueue:
    """Events queued from the step path (``deque.append``: no syscall, no lock) and sent on a background thread."""

    __slots__ = ("_emit", "_q", "job_id", "rank")

    def __init__(self, emit: Emit, job_id: str, rank: int) -> None:
        self._q: deque[CaptureEvent] = deque(maxlen=1024)
        self._emit = emit
        self.job_id = job_id
        self.rank = rank

    def make(self, event: str, **kw: Any) -> CaptureEvent:
        """Build a ``CaptureEvent`` for this rank stamped now (``ts_unix_s``)."""
        return CaptureEvent(job_id=self.job_id, rank=self.rank, event=event, ts_unix_s=time.time(), **kw)  # type: ignore[arg-type]

    def put(self, event: str, **kw: Any) -> None:
        """Queue one event (called from the step path)."""
        self._q.append(self.make(event, **kw))

    def send(self, event: str, **kw: Any) -> None:
        """Emit one event now (background threads only)."""
        self._emit(self.make(event, **kw))

    def send_config_event(self, event: str, cfg: Any, generation: int | None, detail: str) -> None:
        """Forward a :class:`rankhook.profconfig.ConfigWatcher` event; an ``arm_seen`` of a config whose
        ``rank_list`` excludes this rank becomes ``arm_rejected`` (background threads only)."""
        if event == "arm_seen" and cfg is not None and not cfg.selected:
            event = "arm_rejected"
        self.send(event, capture_id=cfg.capture_id if cfg else None, generation=generation,
                  start_step=cfg.start_step if cfg else None, detail=detail)

    def drain(self) -> None:
        """Emit every queued event (background thread)."""
        q = self._q
        while True:
            try:
                ev = q.popleft()
            except IndexError:  # empty (or drained concurrently by close())
                return
            self._emit(ev)


def ts17(now_unix_s: float) -> str:
    """``YYYYmmddHHMMSSfff`` in local time, as torch_npu names rank dirs (docs/rank-dirs.md)."""
    lt = time.localtime(now_unix_s)
    return time.strftime("%Y%m%d%H%M%S", lt) + f"{int(now_unix_s * 1000) % 1000:03d}"


def select_backend(name: str, profiler_config_path: str | None, prof_root: str | None) -> CaptureBackend:
    """Return an unopened backend for ``name`` (``auto`` | ``torch_npu`` | ``torch`` | ``none``).

    ``auto`` = torch_npu if importable, else torch if importable, else none (checked with
    ``importlib.util.find_spec``, which does not import either). Without ``profiler_config_path`` the backend is
    ``none``. Raises ValueError for an unknown name.
    """
    name = (name or "auto").strip().lower()
    if name not in ("auto", "torch_npu", "torch", "none"):
        raise ValueError(f"unknown capture backend {name!r} (auto|torch_npu|torch|none)")
    if name == "none" or not profiler_config_path:
        return NoneBackend()
    if name == "auto":
        if importlib.util.find_spec("torch_npu") is not None:
            name = "torch_npu"
        elif importlib.util.find_spec("torch") is not None:
            name = "torch"
        else:
            return NoneBackend()
    if name == "torch_npu":
        from rankhook.backends.torch_npu_backend import TorchNpuBackend

        return TorchNpuBackend(profiler_config_path, prof_root)
    from rankhook.backends.torch_backend import TorchBackend

    return TorchBackend(profiler_config_path, prof_root)
