"""STAND-IN for the native ``torch_npu._C._profiler`` (profwatch conformance tests; NOT torch_npu's code).

The real functions drive the NPU/CANN profiler. Here they record, per rank dir, which native calls the real
Python state machine (``profiler.py`` / ``profiler_interface.py``) made and when, in
``<rank dir>/FRAMEWORK/profwatch_standin_calls.jsonl`` (``{"call": name, "t_ns": unix ns}``), and create the
``FRAMEWORK/`` folder the native side would fill. ``_get_host_uid`` returns 0, ``_get_syscnt_enable`` False.
"""

import enum
import json
import os
import time

_prof_path = ""


class ProfilerActivity(enum.Enum):
    CPU = 0
    NPU = 1


class _ExperimentalConfig:
    def __init__(self, *args, **kwargs):
        self.args = args
        self.kwargs = kwargs


class NpuProfilerConfig:
    def __init__(self, *args):
        self.args = args


def _record(call):
    if not _prof_path:
        return
    fw = os.path.join(_prof_path, "FRAMEWORK")
    os.makedirs(fw, exist_ok=True)
    with open(os.path.join(fw, "profwatch_standin_calls.jsonl"), "a", encoding="utf-8") as f:
        f.write(json.dumps({"call": call, "t_ns": time.time_ns()}) + "\n")


def _supported_npu_activities():
    return {ProfilerActivity.CPU, ProfilerActivity.NPU}


def _init_profiler(path, activities):
    global _prof_path
    _prof_path = path
    _record("init")


def _warmup_profiler(config, activities):
    _record("warmup")


def _start_profiler(config, activities):
    _record("start")


def _stop_profiler():
    _record("stop")


def _finalize_profiler():
    _record("finalize")


def _get_freq():
    return 100


def _get_monotonic():
    return time.monotonic_ns()


def _get_syscnt():
    return 0


def _get_syscnt_enable():
    return False


def _get_host_uid():
    return 0


def _enable_profiler_in_child_thread(config):
    return None


def _disable_profiler_in_child_thread():
    return None
