"""STAND-IN package initialiser of ``torch_npu`` for profwatch's conformance tests (NOT torch_npu's code).

The real ``torch_npu/__init__.py`` loads the native extension (``torch_npu._C``, CANN libraries) and patches
torch; none of the dynamic-profile monitor's logic lives there. This stand-in only does what the monitor's
pure-Python files need from it: ``torch_npu.__version__`` (written into ``profiler_info_{rank}.json``) and
``torch.npu`` (``profiler_interface.stop_trace`` calls ``torch.npu.synchronize()``).
"""

import os

import torch

from torch_npu import npu

__version__ = os.environ.get("PROFWATCH_TORCH_NPU_STANDIN_VERSION", "unknown")
torch.npu = npu  # type: ignore[attr-defined]  # the real package registers its device module under this name
