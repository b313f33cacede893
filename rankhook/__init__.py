"""rankhook: step telemetry and capture control inside every training rank (stdlib + pyzmq only).

Public API::

    import rankhook
    rankhook.init()                      # identity from RANK/LOCAL_RANK/WORLD_SIZE/job env
    for batch in loader:
        with rankhook.stage("forward"):
            loss = model(batch)
        ...
        rankhook.step()                  # end of the training step (also advances the capture backend)
    rankhook.shutdown()

Every function is safe to call without ``init`` (it does nothing) and never raises into the training loop.
A forked child of a rank (``os.fork``, multiprocessing's ``fork`` start method, DataLoader workers) never speaks
as its parent: the hook it inherits is silent there, and ``init`` in the child returns that silent hook
(``rankhook/hook.py``).
Environment: ``PROFWATCH_NODE_ENDPOINT`` / ``PROFWATCH_RUNTIME_DIR`` (node daemon socket),
``PROFWATCH_JOB_ID``, ``PROFWATCH_BACKEND`` (auto|torch_npu|torch|none),
``PROFWATCH_PROFILER_CONFIG_PATH`` (folder of ``profiler_config.json``), ``PROFWATCH_PROF_ROOT``,
``PROFWATCH_MODE`` (``training`` | ``serving``), ``PROFWATCH_ROLE`` (a label of the ranks doing the same work).
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
from typing import Any

from rankhook.backends.base import NoneBackend
from rankhook.hook import Hook, _Stage
from rankhook.identity import Identity, resolve_identity
from rankhook.publisher import EndpointError, Publisher, default_endpoint
from rankhook.version import distribution_version

ENV_VARS = frozenset({
    "PROFWATCH_NODE_ENDPOINT", "PROFWATCH_RUNTIME_DIR", "PROFWATCH_JOB_ID", "PROFWATCH_BACKEND",
    "PROFWATCH_PROFILER_CONFIG_PATH", "PROFWATCH_PROF_ROOT", "PROFWATCH_MODE", "PROFWATCH_ROLE",
    "PROFWATCH_POLL_INTERVAL_S",
})
"""Every environment variable the hook reads (the module docstring; ``PROFWATCH_POLL_INTERVAL_S``:
``rankhook/profconfig.py``). They share the ``PROFWATCH_`` prefix with the daemons' config overrides, so
``profwatch.config.unknown_env_variables`` leaves them alone; a test checks each ``PROFWATCH_*`` name in
``rankhook/`` is here."""

__all__ = ["init", "step", "stage", "flag_step", "start", "set_step", "shutdown", "current", "Identity"]
__version__ = distribution_version(__file__, 1)

log = logging.getLogger("rankhook")
_hook: Hook | None = None


class _NullStage:
    __slots__ = ()

    def __enter__(self) -> _NullStage:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


_NULL_STAGE = _NullStage()


def _versions() -> dict[str, str]:
    import sys

    out = {"rankhook": __version__, "python": sys.version.split()[0]}
    for mod in ("torch", "torch_npu"):
        m = sys.modules.get(mod)
        if m is not None and getattr(m, "__version__", None):
            out[mod] = str(m.__version__)
    return out


def init(
    job_id: str | None = None,
    *,
    backend: str | None = None,
    profiler_config_path: str | None = None,
    prof_root: str | None = None,
    endpoint: str | None = None,
    rank: int | None = None,
    local_rank: int | None = None,
    world_size: int | None = None,
    mode: str | None = None,
    role: str | None = None,
    step_thread: threading.Thread | None = None,
) -> Hook | None:
    """Start rankhook in this process; return the hook, or None when it could not start (logged once).

    Args:
        job_id: defaults to ``PROFWATCH_JOB_ID`` / torchrun run id / ``SLURM_JOB_ID``.
        backend: ``auto`` (torch_npu if importable, else torch), ``torch_npu``, ``torch`` or ``none``.
        profiler_config_path: folder of ``profiler_config.json`` (the ``dp.init`` path); without it capture is
            off and only telemetry flows.
        prof_root: root under which captures land (announced to the daemons, checked against their roots).
        endpoint: node daemon endpoint (default :func:`rankhook.publisher.default_endpoint`).
        mode: ``training`` or ``serving`` (default ``PROFWATCH_MODE``, else not said). Serving: engine iterations
            with idle gaps; the hook sends a keepalive while idle. Another value is ignored with a warning.
        role: label of the ranks that do the same work, e.g. the pipeline stage ``pp1`` (default
            ``PROFWATCH_ROLE``); letters, digits, ``_ . : -``, at most 64 characters (others become ``_``).
        step_thread: the thread whose ``step()`` calls count (default: the thread calling ``init``; the zero-code
            hook calls ``init`` at the first optimizer step, i.e. from the training thread). ``step()`` from any
            other thread is ignored with one warning (``rankhook/hook.py``, Threads).
    A second call returns the existing hook; in a forked child of an initialised rank that is the parent's hook,
    silenced (``hook.forked_child`` is true): the child never reports as its parent's rank.
    """
    global _hook
    if _hook is not None:
        return _hook
    try:
        env = os.environ
        ident = resolve_identity(job_id, rank=rank, local_rank=local_rank, world_size=world_size)
        profiler_config_path = profiler_config_path or env.get("PROFWATCH_PROFILER_CONFIG_PATH") or None
        prof_root = prof_root or env.get("PROFWATCH_PROF_ROOT") or None
        backend_name = (backend or env.get("PROFWATCH_BACKEND") or "auto").strip()
        mode, role = _labels(mode, role)
        publisher = Publisher(endpoint or default_endpoint())
    except EndpointError as exc:
        log.error("rankhook disabled: %s", exc)
        return None
    except Exception as exc:  # noqa: BLE001
        log.error("rankhook disabled: %r", exc)
        return None

    capture: Any = NoneBackend()
    backend_error = ""
    if not profiler_config_path and backend_name != "none":
        log.warning("rankhook: no profiler_config_path (PROFWATCH_PROFILER_CONFIG_PATH unset): telemetry only, "
                    "profwatch cannot arm a capture of this job; PROFWATCH_BACKEND=none says that is on purpose")
    if profiler_config_path and backend_name != "none":
        os.environ.setdefault("RANK", str(ident.rank))  # torch_npu reads RANK for log names and rank_list
        try:
            from rankhook.backends import select_backend

            capture = select_backend(backend_name, profiler_config_path, prof_root)
        except Exception as exc:  # noqa: BLE001
            log.warning("rankhook: capture backend %r unavailable (%r); telemetry only", backend_name, exc)
            capture = NoneBackend()
            backend_error = f"{backend_name} unavailable: {exc!r}"
    if step_thread is not None and not isinstance(step_thread, threading.Thread):
        log.warning("rankhook: step_thread=%r is not a threading.Thread: the thread calling init() owns step()",
                    step_thread)
        step_thread = None
    hook = Hook(ident, publisher, capture, profiler_config_path, prof_root, _versions(), mode=mode, role=role,
                step_thread=step_thread or threading.current_thread())
    try:
        capture.open(ident, hook.emit)
    except Exception as exc:  # noqa: BLE001
        log.warning("rankhook: capture backend %s failed to open (%r); telemetry only", capture.name, exc)
        backend_error = f"{capture.name} failed to open: {exc!r}"
    if backend_error:
        hook.backend_failed(backend_error)  # the daemons see the backend in use and why
    _hook = hook
    atexit.register(shutdown)
    return hook


def _labels(mode: str | None, role: str | None) -> tuple[str | None, str | None]:
    """``(mode, role)`` from the arguments or ``PROFWATCH_MODE`` / ``PROFWATCH_ROLE``: a mode outside
    ``wire.MODES`` is dropped with a warning; a role is made safe like a stage name (empty: not said)."""
    from rankhook.hook import _safe_stage_name
    from rankhook.wire import MODES

    env = os.environ
    mode = (mode if mode is not None else env.get("PROFWATCH_MODE", "")).strip().lower() or None
    if mode is not None and mode not in MODES:
        log.warning("rankhook: mode %r ignored (one of %s)", mode, ", ".join(MODES))
        mode = None
    role = (role if role is not None else env.get("PROFWATCH_ROLE", "")).strip()
    return mode, (_safe_stage_name(role) if role else None)


def current() -> Hook | None:
    """Return the active hook, or None."""
    return _hook


def step(work: float | None = None) -> None:
    """End of one training step. Call exactly once per iteration (also when the optimizer skipped), from one thread:
    the thread that called :func:`init` (or its ``step_thread``) owns the step counter, calls from other threads are
    dropped with one warning.

    ``work``: optional work done in this step (tokens, samples): lets serving ranks be judged per unit of work.
    """
    h = _hook
    if h is not None:
        h.step(work)


def stage(name: str) -> _Stage | _NullStage:
    """``with rankhook.stage("forward"): ...`` times one stage of the current step (seconds, summed per step)."""
    h = _hook
    return h.stage(name) if h is not None else _NULL_STAGE


def flag_step(flag: str) -> None:
    """Mark the current step (``checkpoint``, ``eval``, ...) so the detectors ignore its duration."""
    h = _hook
    if h is not None:
        h.flag_step(flag)


def start(config_path: str) -> None:
    """One-shot capture starting now (wraps ``dp.start``; needs ``init`` with a capture backend)."""
    h = _hook
    if h is None:
        log.warning("rankhook.start() called before rankhook.init()")
        return
    if h.backend.name == "none":
        log.warning("rankhook.start(%s): no capture backend is active (no profiler_config_path?)", config_path)
        return
    if not h.owns_steps("rankhook.start()"):
        return  # the profiler is started only from the thread that calls step() (rankhook/hook.py)
    try:
        h.backend.start_now(config_path)
    except Exception as exc:  # noqa: BLE001
        log.warning("rankhook.start() failed: %r", exc)


def set_step(step_: int) -> None:
    """Set the step counter after a checkpoint resume (so step numbers match on every rank)."""
    h = _hook
    if h is not None:
        h.set_step(step_)


def shutdown() -> None:
    """Flush and stop (also registered with ``atexit``)."""
    global _hook
    h = _hook
    _hook = None
    if h is not None:
        h.close()
