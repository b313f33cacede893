"""SIMULATOR: torch_npu's reading of ``profiler_config.json`` for the fake (pure; NOT torch_npu).

Plays torch-npu 2.13.0's ``ConfigContext`` (``_dynamic_profiler_config_context.py``) and ``print_warn_msg``, with
their log lines verbatim; compared with the real files by ``tests/conformance/test_fake_matches_real.py``
(``docs/conformance.md``). Used by :mod:`profwatch.simulate.dynamic_profile_sim`.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

TEMPLATE: dict[str, Any] = {
    "activities": ["CPU", "NPU"], "prof_dir": "./", "analyse": False, "async_mode": False, "record_shapes": False,
    "profile_memory": False, "with_stack": False, "with_flops": False, "with_modules": False, "active": 1,
    "warmup": 0, "start_step": 0, "is_rank": False, "rank_list": [],
    "experimental_config": {
        "profiler_level": "Level0", "aic_metrics": "AiCoreNone", "l2_cache": False, "op_attr": False,
        "gc_detect_threshold": None, "data_simplification": True, "record_op_args": False, "export_type": ["text"],
        "msprof_tx": False, "mstx": False, "host_sys": [], "mstx_domain_include": [], "mstx_domain_exclude": [],
        "sys_io": False, "sys_interconnection": False,
    },
}
"""torch_npu's template (config keys), kept separate from rankhook's on purpose: this file plays torch_npu."""

_BOOLS = ("analyse", "async_mode", "record_shapes", "profile_memory", "with_stack", "with_flops", "with_modules")


class ConfigContext:
    """torch_npu's ``ConfigContext`` (2.13.0): parse with resets and its log lines, verbatim (docs/conformance.md)."""

    def __init__(self, raw: dict[str, Any], rank: int, log: logging.Logger) -> None:
        self.raw = raw
        self._rank = rank
        self._log = log
        self.is_valid = raw.get("is_valid", False) is True
        acts = raw.get("activities")
        if acts and isinstance(acts, list):
            for a in acts:
                if a.upper() not in ("CPU", "NPU"):  # a non-string entry raises, as in torch_npu
                    log.warning("Set activity failed, activity must be CPU OR NPU!")
        pd = raw.get("prof_dir", "./")
        self.prof_dir = pd if isinstance(pd, str) else ""
        md = raw.get("metadata", {})
        self.metadata = md if isinstance(md, dict) else {}
        a, am = raw.get("analyse", False), raw.get("async_mode", False)
        self.analyse = a if isinstance(a, bool) else False
        self.async_mode = am if isinstance(am, bool) else False
        if not a and am:
            log.warning("When analyse is False, async_mode will not take effect!")
        self.flags = {k: (raw.get(k) if isinstance(raw.get(k), bool) else False) for k in _BOOLS}
        self._active = raw.get("active", 1)
        self._warmup = raw.get("warmup", 0)
        s = raw.get("start_step", 0)
        if not isinstance(s, int) or s < -1:
            log.info("Start step is not valid, will be reset to 0.")
            s = 0
        self.start_step = int(s)
        log.info("Start step will be set to %d.", self.start_step)
        ec = raw.get("experimental_config") or {}
        et = ec.get("export_type", "text") if isinstance(ec, dict) else "text"
        self.export_type = [et] if isinstance(et, str) else (list(et) if isinstance(et, list) and et else ["text"])
        lvl = ec.get("profiler_level", "Level0") if isinstance(ec, dict) else "Level0"
        self.level = lvl if lvl in ("Level_none", "Level0", "Level1", "Level2") else "Level0"
        self.is_rank = raw.get("is_rank", False)
        self.rank_set: set[int] = set()
        if not isinstance(self.is_rank, bool):
            self.is_rank = False
            log.warning("Set is_rank failed, is_rank must be bool!")
        elif self.is_rank:
            log.info("Set is_rank success!")
            rl = raw.get("rank_list", False)
            if not isinstance(rl, list):
                log.warning("Set rank_list failed, rank_list must be list!")
            else:
                self.rank_set = {r for r in rl if isinstance(r, int) and r >= 0}

    def active(self) -> int:
        """torch_npu logs the reset each time it reads an invalid value."""
        if not isinstance(self._active, int) or self._active <= 0:
            self._log.warning("Invalid parameter active, reset it to 1.")
            return 1
        return int(self._active)

    def warmup(self) -> int:
        if not isinstance(self._warmup, int) or self._warmup < 0:
            self._log.warning("Invalid parameter warmup, reset it to 0.")
            return 0
        return int(self._warmup)

    def valid(self) -> bool:
        """Rank filter (torch_npu ``valid()``); forces analyse off for listed ranks without async_mode."""
        if not self.is_valid:
            return False
        if not self.is_rank:
            return True
        if self._rank in self.rank_set:
            if not self.async_mode:
                self.analyse = False
                self._log.info("Rank %d is in rank_list %s and async_mode is false, profiler data analyse will be "
                               "closed !", self._rank, self.rank_set)
            return True
        self._log.warning("Rank %d not in valid rank_list %s!", self._rank, self.rank_set)
        return False


def print_warn(msg: str, level: str = "WARNING") -> None:
    """torch_npu's ``print_warn_msg``: stdout, only when RANK is unset or 0 and warnings are not disabled."""
    rank = os.environ.get("RANK")
    off = os.environ.get("TORCH_NPU_WARNING_DISABLE", os.environ.get("TORCH_NPU_DISABLED_WARNING")) == "1"
    if level == "WARNING" and (off or rank not in (None, "0")):
        return
    print(f"{time.strftime('[%Y-%m-%d %H:%M:%S]')} [{level}] [{os.getpid()}] profiler.py: {msg}", flush=True)
