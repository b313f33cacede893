"""SIMULATOR: a FAKE ``torch_npu`` package (profwatch tests and ``profwatch simulate`` only; NOT torch_npu).

Only importable when ``daemon/profwatch/simulate/fake_torch_npu`` is put on ``sys.path`` on purpose. It provides just
``torch_npu.profiler.dynamic_profile`` (see :mod:`profwatch.simulate.dynamic_profile_sim`); no NPU, no CANN, and it
does not import torch.
"""

__version__ = "2.14.0+profwatch.sim"
PROFWATCH_FAKE = True
