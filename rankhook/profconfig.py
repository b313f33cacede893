"""Rank-side reader of ``profiler_config.json`` for the torch backends (stdlib only; I/O on a background thread).

It mirrors what torch_npu's dynamic_profile does on a rank (``docs/torch_npu-dynamic-profile.md``, sections config polling, mtime rules,
start_step, config keys; checked against torch-npu 2.13.0 in ``docs/conformance.md``), so the torch.profiler backend and the torch_npu wrapper react to the same file the same way:

* :class:`ConfigWatcher` polls ``<dir>/profiler_config.json`` on a daemon thread by **whole-second mtime**
  (config polling) and accepts a generation only if its mtime is **strictly newer** than the rank's init time
  and the last accepted mtime (mtime rules). Poll interval: 2 s until step 11, then the step time
  truncated to whole seconds and clamped to [1, 50] s (config polling); ``PROFWATCH_POLL_INTERVAL_S``
  overrides it (tests). It validates minimally (the rules of ``daemon/profwatch/core/capture/profiler_config.py``) and publishes the
  result in one attribute, :attr:`ConfigWatcher.latest`, which the step path reads without syscalls or locks.
* :class:`WindowGate` is the step-path state machine with torch_npu's start_step rules (start_step): ``-1`` =
  start now, ``cur_step == start_step`` starts, a passed start_step is discarded, a future one waits; one pending
  slot that newer configs replace; configs arriving during a capture are evaluated on the first step after it.

An mtime ahead of the clock is accepted, as torch_npu accepts it (verified against torch-npu 2.13.0,
``docs/conformance.md``); profwatch's config writer then writes beyond it. The torch_npu backend passes
``validate=`` :func:`rankhook.backends.torch_npu_config.torch_npu_reading` so that its mirror applies
torch_npu's resets instead of this module's strict :func:`validate_config`.

A complete file the watcher rejects but torch_npu would still take (:func:`replaces_pending`; mostly a start step
that reads as 0, e.g. the idle config ``profwatch cancel`` writes) replaces the pending config, as it replaces
torch_npu's single pending slot: the arm it replaced never starts (checked against torch-npu 2.13.0 in
``tests/conformance/test_monitor_protocol.py``); its mtime counts as read.

Deliberate differences from torch_npu (documented): an invalid or torn read does **not** consume the mtime (it
is retried when the file's size or mtime changes, and reported once); byte-identical content re-accepted within
``REDELIVERY_WINDOW_S`` (the config writer's mtime bump) is not a new arm.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("rankhook")

CONFIG_FILE = "profiler_config.json"
MAX_CONFIG_BYTES = 1048576
"""torch_npu skips configs over 1 MiB (config polling)."""
POLL_ENV = "PROFWATCH_POLL_INTERVAL_S"
FIRST_POLL_INTERVAL_S = 2.0
POLL_STEP = 11
REDELIVERY_WINDOW_S = 2
"""Identical bytes accepted again within this many seconds of the previous generation are the config writer's
mtime bump (``daemon/profwatch/adapters/fs/config_writer.py``), not a new arm: no event, the pending config is kept."""
"""torch_npu measures the duration of step 10 -> 11 and derives the poll interval from it (config polling)."""

TEMPLATE: dict[str, Any] = {
    "activities": ["CPU", "NPU"],
    "prof_dir": "./",
    "analyse": False,
    "async_mode": False,
    "record_shapes": False,
    "profile_memory": False,
    "with_stack": False,
    "with_flops": False,
    "with_modules": False,
    "active": 1,
    "warmup": 0,
    "start_step": 0,
    "is_rank": False,
    "rank_list": [],
    "experimental_config": {
        "profiler_level": "Level0",
        "aic_metrics": "AiCoreNone",
        "l2_cache": False,
        "op_attr": False,
        "gc_detect_threshold": None,
        "data_simplification": True,
        "record_op_args": False,
        "export_type": ["text"],
        "msprof_tx": False,
        "mstx": False,
        "host_sys": [],
        "mstx_domain_include": [],
        "mstx_domain_exclude": [],
        "sys_io": False,
        "sys_interconnection": False,
    },
}
"""The template torch_npu writes (mode 0640, indent 4) when the file is absent (config keys)."""

_BOOL_KEYS = ("analyse", "async_mode", "record_shapes", "profile_memory", "with_stack", "with_flops", "with_modules")


def poll_interval_s(step_time_s: float | None) -> float:
    """Return the monitor poll interval in seconds for a measured step time (None = not yet measured).

    Source: torch_npu ``_dynamic_profiler_monitor`` (config polling): 2 s until step 11, then
    ``int(step_time_s)`` clamped to [1, 50] s.
    """
    if step_time_s is None:
        return FIRST_POLL_INTERVAL_S
    return float(min(50, max(1, int(step_time_s))))


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def validate_config(raw: object) -> tuple[dict[str, Any] | None, str]:
    """Check a parsed ``profiler_config.json`` object; return ``(config, "")`` or ``(None, reason)``.

    The rules are those where torch_npu would silently reset a value (``docs/conformance.md``, config keys):
    start_step must be an int -1 or >= 1 (0 never fires), active an int > 0, warmup an int >= 0, flags bools,
    is_rank a bool with integer rank ids; ``is_valid``/``NPU_MONITOR_START`` are refused. Missing keys take the
    template defaults (so an empty file, read as ``{}``, is rejected for its start_step 0).
    """
    if not isinstance(raw, dict):
        return None, f"config must be a JSON object, got {type(raw).__name__}"
    if "NPU_MONITOR_START" in raw:
        return None, "NPU_MONITOR_START turns the config into a dyno-monitor command"
    if "is_valid" in raw:
        return None, "is_valid is torch_npu-internal (a torn read); not a config"
    cfg = {k: v for k, v in TEMPLATE.items() if k != "experimental_config"}
    cfg["metadata"] = {}
    cfg.update(raw)
    s = cfg["start_step"]
    if not _is_int(s) or s == 0 or s < -1:
        return None, f"start_step must be an int -1 or >= 1 (0 never fires), got {s!r}"
    if not _is_int(cfg["active"]) or cfg["active"] <= 0:
        return None, f"active must be an int > 0, got {cfg['active']!r}"
    if not _is_int(cfg["warmup"]) or cfg["warmup"] < 0:
        return None, f"warmup must be an int >= 0, got {cfg['warmup']!r}"
    for key in (*_BOOL_KEYS, "is_rank"):
        if not isinstance(cfg[key], bool):
            return None, f"{key} must be a bool, got {cfg[key]!r}"
    rl = cfg["rank_list"]
    if not isinstance(rl, list) or not all(_is_int(r) and r >= 0 for r in rl):
        return None, f"rank_list must be a list of ints >= 0, got {rl!r}"
    acts = cfg["activities"]
    if not isinstance(acts, list) or not all(isinstance(a, str) and a.upper() in ("CPU", "NPU") for a in acts):
        return None, f"activities must be a list of 'CPU'/'NPU', got {acts!r}"
    if not isinstance(cfg["prof_dir"], str):
        return None, f"prof_dir must be a string, got {cfg['prof_dir']!r}"
    if not isinstance(cfg["metadata"], dict):
        return None, f"metadata must be an object, got {cfg['metadata']!r}"
    return cfg, ""


def parse_raises(raw: dict[str, Any]) -> str:
    """Why torch_npu's own parse of ``raw`` raises inside ``dp.step()`` ("" when it does not): a non-string
    activity, an ``experimental_config`` that is truthy but not an object, a non-string ``profiler_level`` or
    ``aic_metrics`` (looked up with ``getattr``). ``dp.step()`` swallows the error and keeps its old config; the
    new one is lost. Source: torch-npu 2.13.0 ``ConfigContext._parse_activity`` / ``_parse_cfg_json_exp_cfg``."""
    acts = raw.get("activities")
    if isinstance(acts, list) and acts and not all(isinstance(a, str) for a in acts):
        return f"activities {acts!r}: a non-string entry makes torch_npu's dp.step() fail ('Call step failed')"
    exp = raw.get("experimental_config")
    if exp and not isinstance(exp, dict):
        return f"experimental_config {exp!r} is not an object: torch_npu's dp.step() fails ('Call step failed')"
    if isinstance(exp, dict):
        for key in ("profiler_level", "aic_metrics"):
            if key in exp and not isinstance(exp[key], str):
                return f"{key} {exp[key]!r} is not a string: torch_npu's dp.step() fails ('Call step failed')"
    return ""


def replaces_pending(raw: object, rank: int) -> bool:
    """True when torch_npu takes ``raw`` into ``rank``'s single pending slot, replacing a waiting arm: a JSON
    object, not a dyno-monitor command (``NPU_MONITOR_START``), whose parse does not raise (:func:`parse_raises`:
    then the old config stays) and that selects ``rank`` (``is_rank`` not true, or ``rank`` in ``rank_list``,
    whose ints >= 0 count, bools included as 0/1). The watcher asks it for a file it rejects: that file does not
    fire here, and the arm it replaced is gone, as in torch_npu. The common case is a start_step that reads as 0
    (the idle config ``profwatch cancel`` writes), which torch_npu drops as "not effective" at the next step.
    Source: torch-npu 2.13.0 ``_dynamic_profiler_monitor.shm_to_prof_conf_context`` (a context only when
    ``ConfigContext.valid()``), ``ConfigContext._parse_ranks`` and ``dynamic_profile.step`` (a returned context
    replaces the pending one); the idle config is checked against those files in
    ``tests/conformance/test_monitor_protocol.py``."""
    if not isinstance(raw, dict) or "NPU_MONITOR_START" in raw or parse_raises(raw):
        return False
    if raw.get("is_rank") is True:
        rl = raw.get("rank_list")
        return isinstance(rl, list) and any(isinstance(r, int) and r >= 0 and r == rank for r in rl)
    return True


@dataclass(frozen=True, slots=True)
class ArmedConfig:
    """One accepted ``profiler_config.json`` generation.

    ``generation`` is its whole-second mtime; ``selected`` is False when ``is_rank`` excludes this rank;
    ``config`` the validated dict (template defaults filled in); ``capture_id`` the ``profwatch_capture_id``
    from ``metadata`` (None for a hand-written config).
    """

    generation: int
    start_step: int
    warmup: int
    active: int
    selected: bool
    config: dict[str, Any] = field(hash=False, compare=False)
    capture_id: str | None = None


def make_armed(generation: int, cfg: dict[str, Any], rank: int) -> ArmedConfig:
    """Build an :class:`ArmedConfig` from a validated config for ``rank``."""
    selected = (not cfg["is_rank"]) or rank in cfg["rank_list"]
    cid = cfg["metadata"].get("profwatch_capture_id")
    return ArmedConfig(
        generation=generation,
        start_step=cfg["start_step"],
        warmup=cfg["warmup"],
        active=cfg["active"],
        selected=selected,
        config=cfg,
        capture_id=cid if isinstance(cid, str) else None,
    )


class WindowGate:
    """Step-path state machine of one rank's capture window (no I/O, no locks, no syscalls).

    :meth:`on_step` is called with the step counter after each ``step()`` and returns one of
    ``""`` (nothing), ``"start"`` (a capture starts inside this step), ``"stop"`` (the running capture ends inside
    this step: ``warmup + active`` steps after its start) or ``"discard"`` (the pending start_step passed), with the
    config concerned. Source: torch_npu ``dynamic_profile.step`` (start_step; verified in ``docs/conformance.md``).
    """

    __slots__ = ("_seen", "active", "pending", "remaining", "started_at")

    def __init__(self) -> None:
        self.pending: ArmedConfig | None = None
        self.active: ArmedConfig | None = None
        self.remaining = 0
        self.started_at = 0
        self._seen: ArmedConfig | None = None

    def offer(self, cfg: ArmedConfig | None) -> None:
        """Put ``cfg`` in the single pending slot if it is new and selects this rank (a newer config replaces a
        waiting one; one for other ranks leaves it: torch_npu's ``ConfigContext.valid()`` is false for it)."""
        if cfg is not None and cfg is not self._seen:
            self._seen = cfg
            if cfg.selected:
                self.pending = cfg

    def start_now(self, cfg: ArmedConfig, cur_step: int) -> bool:
        """Start ``cfg`` immediately (``dp.start``); False if a capture is running."""
        if self.active is not None:
            return False
        self.active, self.remaining, self.started_at = cfg, cfg.warmup + cfg.active, cur_step
        return True

    def on_step(self, cur_step: int) -> tuple[str, ArmedConfig | None]:
        """Advance the window for the step counter ``cur_step``; see the class doc for the result."""
        act = self.active
        if act is not None:
            self.remaining -= 1
            if self.remaining <= 0:
                self.active = None
                return "stop", act
            return "", None
        p = self.pending
        if p is None:
            return "", None
        s = p.start_step
        if s == 0:  # never fires (torch_npu: "not effective"); the watcher already reported it as arm_rejected
            self.pending = None
            return "", None
        if s == -1 or cur_step == s:
            self.pending = None
            self.start_now(p, cur_step)
            return "start", p
        if cur_step > s:
            self.pending = None
            return "discard", p
        return "", None


EventFn = Callable[[str, "ArmedConfig | None", int | None, str], None]
"""``on_event(event, cfg, generation, detail)`` with event ``arm_seen`` or ``arm_rejected``."""


class ConfigWatcher:
    """Background poller of ``<config_dir>/profiler_config.json`` (one daemon thread; see the module doc).

    Args:
        config_dir: the folder (the ``dp.init`` path).
        rank: this rank's global rank (for ``is_rank``/``rank_list``).
        init_unix_s: the rank's init wall time; a file whose whole-second mtime is not strictly newer is ignored.
        on_event: called on the watcher thread for ``arm_seen``/``arm_rejected`` (must not block).
        tick: called on the watcher thread at least every ``tick_s`` seconds (backends drain deferred work there).
        poll_interval_s: fixed poll interval; default from ``PROFWATCH_POLL_INTERVAL_S`` or the torch_npu rule.
        clock: wall clock (``time.time``).
        validate: ``raw -> (config, detail)``; ``config`` None rejects with ``detail`` as the reason, otherwise
            ``detail`` (e.g. the resets applied) goes into the ``arm_seen`` event. Default :func:`validate_config`.
    The step path reads :attr:`latest` (a plain attribute, replaced atomically) and may set
    :attr:`step_time_s` once (step 11). ``close()`` stops and joins the thread.
    """

    def __init__(
        self,
        config_dir: str,
        *,
        rank: int,
        init_unix_s: float | None = None,
        on_event: EventFn | None = None,
        tick: Callable[[], None] | None = None,
        tick_s: float = 0.5,
        poll_interval_s: float | None = None,
        clock: Callable[[], float] = time.time,
        validate: Callable[[object], tuple[dict[str, Any] | None, str]] = validate_config,
    ) -> None:
        self.path = os.path.join(os.path.abspath(config_dir), CONFIG_FILE)
        self._validate = validate
        self.rank = rank
        self._clock = clock
        self._accepted = int(clock() if init_unix_s is None else init_unix_s)
        self._rejected_key: tuple[int, int] | None = None
        self._accepted_data: bytes | None = None
        self._on_event = on_event
        self._tick = tick
        self._tick_s = tick_s
        if poll_interval_s is None:
            env = os.environ.get(POLL_ENV, "").strip()
            try:
                poll_interval_s = float(env) if env else None
            except ValueError:
                poll_interval_s = None
            if poll_interval_s is not None and poll_interval_s <= 0:
                poll_interval_s = None
        self._fixed_interval = poll_interval_s
        self.step_time_s: float | None = None
        self.latest: ArmedConfig | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def interval_s(self) -> float:
        """Current poll interval in seconds."""
        return self._fixed_interval if self._fixed_interval is not None else poll_interval_s(self.step_time_s)

    def start(self) -> None:
        """Start the daemon thread (idempotent)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="profwatch-profconfig", daemon=True)
            self._thread.start()

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the thread; run ``tick`` once more; wait at most ``timeout_s``."""
        self._stop.set()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout_s)

    def poll_once(self) -> ArmedConfig | None:
        """Stat and, if newer, read and validate the file once; return the newly accepted config or None."""
        now = self._clock()
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        m = int(st.st_mtime)
        if m <= self._accepted or (m, st.st_size) == self._rejected_key:
            return None
        if st.st_size > MAX_CONFIG_BYTES:
            self._reject(m, st.st_size, f"config is {st.st_size} bytes, over {MAX_CONFIG_BYTES}")
            return None
        try:
            with open(self.path, "rb") as f:
                data = f.read(MAX_CONFIG_BYTES + 1)
            # torch_npu reads UTF-8 text: an empty file is {}; blanks, a BOM or UTF-16 are not JSON to it
            raw = json.loads(data.decode("utf-8")) if data else {}
        except (OSError, ValueError) as exc:
            self._reject(m, st.st_size, f"cannot read/parse config: {exc}")
            return None
        cfg, detail = self._validate(raw)
        if cfg is None:
            if replaces_pending(raw, self.rank):  # it never fires, but the arm it replaced is gone too
                self.latest = ArmedConfig(generation=m, start_step=0, warmup=0, active=0, selected=True, config={})
                self._accepted = m  # and, as in torch_npu, an older mtime no longer counts
                self._accepted_data = None  # the arm written again after it is a new arm, not a re-delivery
            self._reject(m, st.st_size, detail)
            return None
        prev, self._accepted = self._accepted, m
        if data == self._accepted_data and m - prev <= REDELIVERY_WINDOW_S:
            return None  # the config writer's mtime bump re-delivering the same content: not a new arm
        self._accepted_data = data
        armed = make_armed(m, cfg, self.rank)
        self.latest = armed
        notes = [detail] if detail else []
        if m > now + 1:
            notes.append(f"mtime {m} is {m - int(now)} s ahead of the clock: edits must be newer to count")
        if not armed.selected:
            notes.insert(0, f"rank {self.rank} not in rank_list")
        self._emit("arm_seen", armed, m, "; ".join(notes))
        return armed

    def _reject(self, m: int, size: int, reason: str) -> None:
        self._rejected_key = (m, size)
        log.warning("rankhook: profiler_config.json (mtime %d) rejected: %s", m, reason)
        self._emit("arm_rejected", None, m, reason)

    def _emit(self, event: str, cfg: ArmedConfig | None, gen: int | None, detail: str) -> None:
        if self._on_event is not None:
            try:
                self._on_event(event, cfg, gen, detail)
            except Exception as exc:  # noqa: BLE001 - a broken sink must not kill the watcher
                log.warning("rankhook: capture event sink failed: %r", exc)

    def _run_tick(self) -> None:
        if self._tick is not None:
            try:
                self._tick()
            except Exception as exc:  # noqa: BLE001
                log.warning("rankhook: capture backend tick failed: %r", exc)

    def _run(self) -> None:
        next_poll = 0.0
        while True:
            now = time.monotonic()
            if now >= next_poll:
                try:
                    self.poll_once()
                except Exception as exc:  # noqa: BLE001 - never let the watcher die silently
                    log.warning("rankhook: profiler_config poll failed: %r", exc)
                next_poll = time.monotonic() + self.interval_s
            self._run_tick()
            if self._stop.is_set():
                return
            self._stop.wait(max(0.01, min(self._tick_s, next_poll - time.monotonic())))
