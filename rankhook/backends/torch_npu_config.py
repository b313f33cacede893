"""How torch_npu itself reads a ``profiler_config.json``, for the torch_npu backend's mirror (pure; stdlib only).

Source: torch-npu 2.13.0 ``torch_npu/profiler/_dynamic_profiler/_dynamic_profiler_config_context.py``
(``ConfigContext.parse``, ``valid``, ``active``, ``warmup``, ``analyse``, ``async_mode``, ``meta_data``) and
``_profiler_path_creator.py`` / ``profiler.py`` (``tensorboard_trace_handler``: where rank dirs land), checked
against the real files by ``tests/conformance`` (``docs/conformance.md``).

torch_npu never refuses a JSON object: a bad value is *reset* (start_step -> 0, active -> 1, warmup -> 0,
non-bool analyse/async_mode -> False, non-bool is_rank -> False, a non-list rank_list -> no rank), and
``isinstance(x, int)`` lets ``true``/``false`` through as 1/0. The backend must predict what torch_npu really
does, so it applies the same resets (rankhook's strict :func:`rankhook.profconfig.validate_config` serves the
torch.profiler backend, where rankhook itself is the monitor). profwatch's writer never writes such configs
(``daemon/profwatch/core/capture/profiler_config.py`` refuses them); these rules matter for hand-written ones.
"""

from __future__ import annotations

import os
from typing import Any

from rankhook.profconfig import parse_raises

START_STEP_RESET = "Start step is not valid, will be reset to 0."
ACTIVE_RESET = "Invalid parameter active, reset it to 1."
WARMUP_RESET = "Invalid parameter warmup, reset it to 0."
IS_RANK_RESET = "Set is_rank failed, is_rank must be bool!"
RANK_LIST_RESET = "Set rank_list failed, rank_list must be list!"
"""torch_npu's log lines for these resets (verbatim, torch-npu 2.13.0)."""


def _int_like(v: object) -> bool:
    """torch_npu's ``isinstance(v, int)``: bools count (True == 1)."""
    return isinstance(v, int)


def torch_npu_reading(raw: object) -> tuple[dict[str, Any] | None, str]:
    """Return ``(config, notes)``: the values torch_npu would use, or ``(None, reason)`` when it never captures.

    ``config`` has the keys the backend needs: ``start_step``, ``warmup``, ``active``, ``is_rank``,
    ``rank_list``, ``analyse``, ``async_mode``, ``prof_dir`` ("" = torch_npu's default folder), ``metadata``.
    ``notes`` lists the resets torch_npu applies, with its own log line. ``None`` for: not an object (torch_npu:
    "load json failed"), ``NPU_MONITOR_START`` (a dyno-monitor command), a config whose parse raises inside
    ``dp.step()`` (:func:`rankhook.profconfig.parse_raises`: a non-string activity, a bad ``experimental_config``;
    torch_npu keeps its old config) and a start_step that ends up 0 (the template default: "not effective" at the
    next step).
    """
    if not isinstance(raw, dict):
        return None, f"not a JSON object ({type(raw).__name__}): torch_npu's monitor logs 'load json failed'"
    if "NPU_MONITOR_START" in raw:
        return None, "NPU_MONITOR_START makes it a dyno-monitor command, not a capture"
    raises = parse_raises(raw)
    if raises:
        return None, raises
    notes: list[str] = []
    s = raw.get("start_step", 0)
    if not _int_like(s) or s < -1:
        notes.append(f"start_step {s!r}: '{START_STEP_RESET}'")
        s = 0
    if s == 0:
        return None, f"start_step 0 never fires (torch_npu: not effective){'; ' + notes[0] if notes else ''}"
    a = raw.get("active", 1)
    if not _int_like(a) or a <= 0:
        notes.append(f"active {a!r}: '{ACTIVE_RESET}'")
        a = 1
    w = raw.get("warmup", 0)
    if not _int_like(w) or w < 0:
        notes.append(f"warmup {w!r}: '{WARMUP_RESET}'")
        w = 0
    is_rank = raw.get("is_rank", False)
    ranks: list[int] = []
    if not isinstance(is_rank, bool):
        notes.append(f"is_rank {is_rank!r}: '{IS_RANK_RESET}' (every rank captures)")
        is_rank = False
    elif is_rank:
        rl = raw.get("rank_list", False)
        if isinstance(rl, list):
            ranks = sorted({int(r) for r in rl if _int_like(r) and r >= 0})
        else:
            notes.append(f"rank_list {rl!r}: '{RANK_LIST_RESET}' (no rank captures)")
    analyse, async_mode = raw.get("analyse", False), raw.get("async_mode", False)
    prof_dir = raw.get("prof_dir", "./")
    meta = raw.get("metadata", {})
    cfg = {
        "start_step": int(s), "warmup": int(w), "active": int(a), "is_rank": is_rank, "rank_list": ranks,
        "analyse": analyse if isinstance(analyse, bool) else False,
        "async_mode": async_mode if isinstance(async_mode, bool) else False,
        "prof_dir": prof_dir if isinstance(prof_dir, str) else "",
        "metadata": meta if isinstance(meta, dict) else {},
    }
    return cfg, "; ".join(notes)


def torch_npu_prof_dir(prof_dir: str, *, env: dict[str, str] | None = None, cwd: str | None = None) -> str:
    """Where torch_npu creates rank dirs for a config's ``prof_dir`` (``ProfPathCreator.create_prof_dir``).

    A non-empty string is expanded (``~``) and resolved (``realpath``); otherwise ``$ASCEND_WORK_PATH/profiling_data``
    or the rank's working directory.
    """
    if prof_dir:
        return os.path.realpath(os.path.expanduser(prof_dir))
    e = os.environ if env is None else env
    work = e.get("ASCEND_WORK_PATH")
    if work:
        return os.path.join(os.path.abspath(work), "profiling_data")
    return cwd or os.getcwd()
