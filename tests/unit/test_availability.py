"""Whether ranks can be captured, and the cause and fix in words (pure)."""

from __future__ import annotations

import pytest

from profwatch.core.arming.availability import explain, unavailable


@pytest.mark.parametrize(("error", "cause", "fix", "fatal"), [
    ("torch_npu failed to open: FileNotFoundError('profiler_config_path /c/x is not a directory')",
     "the capture folder /c/x does not exist on h1", "mkdir -p /c/x", True),
    ("torch failed to open: FileNotFoundError('profiler_config_path /c/x is not a directory')",
     "the capture folder /c/x does not exist on h1", "mkdir -p /c/x", True),
    ("torch_npu unavailable: ModuleNotFoundError(\"No module named 'torch_npu'\")",
     "cannot be imported on h1", "install torch_npu", True),
    ("torch_npu failed to open: RuntimeError('MSMONITOR_USE_DAEMON=1 selects msMonitor (dyno) mode; unset it')",
     "msMonitor (dyno) mode", "unset MSMONITOR_USE_DAEMON", True),
    ("torch_npu failed to open: RuntimeError('PROF_CONFIG_PATH is set: torch_npu already initialised ...')",
     "torch_npu runs its own dynamic_profile", "PROF_CONFIG_PATH", False),  # torch_npu itself polls the folder
    ("torch failed to open: OSError('disk quota exceeded')", "failed to open on h1", "stderr", True),
    ("", "telemetry-only", "PROFWATCH_PROFILER_CONFIG_PATH", False),
])
def test_each_backend_error_has_a_cause_and_a_fix(error: str, cause: str, fix: str, fatal: bool) -> None:
    c, f, is_fatal = explain(error, "/c/x", "h1")
    assert cause in c and fix in f and is_fatal is fatal


def test_the_ranks_without_a_backend_are_named_with_the_fatal_cause_first() -> None:
    missing = "torch_npu failed to open: FileNotFoundError('profiler_config_path /c/x is not a directory')"
    u = unavailable([(0, "h0", "torch_npu", "", "/c/x"), (3, "h1", "none", "", "/c/x"),
                     (2, "h1", "none", missing, "/c/x"), (1, "h0", "none", missing, "/c/x")])
    assert u is not None and u.fatal and u.ranks == (1, 2, 3) and u.hosts == ("h0", "h1")
    assert u.cause == "the capture folder /c/x does not exist on h0"
    assert u.detail().startswith("rank(s) 1, 2, 3 have no capture backend of their own")
    only_none = unavailable([(0, "h0", "none", "", "/c/x")])
    assert only_none is not None and not only_none.fatal
    assert unavailable([(0, "h0", "torch_npu", "", "/c/x"), (1, "h0", "torch", "", "/c/x")]) is None
