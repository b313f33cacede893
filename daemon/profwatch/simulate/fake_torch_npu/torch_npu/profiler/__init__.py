"""SIMULATOR: fake ``torch_npu.profiler`` (only ``dynamic_profile``); see ``daemon/profwatch/simulate/dynamic_profile_sim.py``."""

from torch_npu.profiler import dynamic_profile

__all__ = ["dynamic_profile"]
