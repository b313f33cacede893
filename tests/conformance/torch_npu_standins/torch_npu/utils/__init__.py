"""STAND-IN package initialiser of ``torch_npu.utils`` (NOT torch_npu's code): the real one imports
native-backed helpers at import time; the monitor only needs its submodules, which are the real files."""
