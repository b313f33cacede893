"""Capture backends of rankhook: the :class:`~rankhook.backends.base.CaptureBackend` protocol and its selector.

``torch_npu`` wraps ``torch_npu.profiler.dynamic_profile``, ``torch`` drives ``torch.profiler`` from the same
``profiler_config.json``, ``none`` captures nothing. torch / torch_npu are imported lazily inside the backends.
"""

from rankhook.backends.base import CaptureBackend, NoneBackend, select_backend

__all__ = ["CaptureBackend", "NoneBackend", "select_backend"]
