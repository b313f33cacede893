"""The real-monitor tree is what the suite claims: upstream files byte for byte, stand-ins only where declared,
and nothing of it importable outside the rank processes (the wheel is never installed)."""

from __future__ import annotations

import importlib.util
import zipfile

from tests.conformance.real_torch_npu import MONITOR_FILES, STANDIN_ROOT, STANDINS, MonitorTree


def test_tree_holds_upstream_files_unmodified_and_only_the_declared_stand_ins(monitor_tree: MonitorTree) -> None:
    on_disk = {str(p.relative_to(monitor_tree.site)) for p in monitor_tree.site.rglob("*.py")}
    assert on_disk == set(monitor_tree.real_files) | set(STANDINS)
    assert set(MONITOR_FILES) <= set(monitor_tree.real_files)
    with zipfile.ZipFile(monitor_tree.wheel) as z:
        for rel in monitor_tree.real_files:
            assert (monitor_tree.site / rel).read_bytes() == z.read(rel), rel
        for rel in STANDINS:  # a stand-in replaces a package initialiser or a native module, never monitor logic
            assert rel not in MONITOR_FILES
            assert (monitor_tree.site / rel).read_bytes() == (STANDIN_ROOT / rel).read_bytes()
            assert b"NOT torch_npu's code" in (STANDIN_ROOT / rel).read_bytes()
    assert {str(p.relative_to(STANDIN_ROOT)) for p in STANDIN_ROOT.rglob("*.py")} == set(STANDINS)
    assert monitor_tree.wheel.name.startswith(f"torch_npu-{monitor_tree.version}-")


def test_torch_npu_is_not_installed_here() -> None:
    assert importlib.util.find_spec("torch_npu") is None, "torch-npu must never be installed into the test env"
