"""STAND-IN for ``torch_npu.npu`` (NPU device module; profwatch conformance tests; NOT torch_npu's code).

Only what the profiler's Python files call: ``mstx`` range markers, ``current_stream``, ``synchronize``,
``_lazy_init``, ``is_available`` and ``Event`` (wrapped by ``profiler_interface`` during a capture). No device.
"""

from torch_npu.npu.mstx import mstx as mstx


def current_stream(device=None):
    return None


def synchronize(device=None):
    return None


def _lazy_init():
    return None


def is_available():
    return False


class Event:
    def record(self, stream=None):
        return None

    def wait(self, stream=None):
        return None

    def query(self):
        return True

    def elapsed_time(self, end_event):
        return 0.0

    def synchronize(self):
        return None
