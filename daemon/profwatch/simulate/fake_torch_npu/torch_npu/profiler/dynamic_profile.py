"""SIMULATOR: fake ``torch_npu.profiler.dynamic_profile`` (``init``/``step``/``start``/``set_state``).

Implemented in :mod:`profwatch.simulate.dynamic_profile_sim` (needs the profwatch repo on ``sys.path``).
``record_segment`` is NOT a torch_npu function: simulated jobs feed measured compute/collective timings with it.
"""

from profwatch.simulate.dynamic_profile_sim import init, record_segment, set_state, start, step

__all__ = ["init", "record_segment", "set_state", "start", "step"]
