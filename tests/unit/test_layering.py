"""The layering the tree names: detection knows nothing of capture planning or arming (it receives the planner's
spike hold from the composition root), and the planner's hold is the planner's lead."""

from __future__ import annotations

import ast
from pathlib import Path

from profwatch.core.capture.planner import CaptureSettings, lead_steps, spike_hold
from profwatch.core.detection.job_detector import JobDetector
from profwatch.core.detection.regression import DEFAULT_HOLD_STEPS

PKG = Path(__file__).resolve().parents[2] / "daemon" / "profwatch"


def _imports(path: Path) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def test_detection_imports_no_capture_arming_or_changes_module() -> None:
    files = sorted((PKG / "core" / "detection").glob("*.py"))
    assert len(files) > 5
    bad = {f"{f.name}: {m}" for f in files for m in _imports(f)
           if m.startswith(("profwatch.core.capture", "profwatch.core.arming", "profwatch.core.changes",
                            "profwatch.captures", "profwatch.arming", "profwatch.changes"))}
    assert not bad, bad


def test_the_planners_hold_is_its_lead_and_the_default_is_fixed() -> None:
    cap = CaptureSettings(margin_steps=3, margin_s=4.0)
    hold = spike_hold(cap)
    for step, st in [(5, 0.5), (500, 0.01), (500, 2.5), (10_000, 80.0)]:
        assert hold(step, st) == lead_steps(step, st, cap)
    assert hold(500, 0.01) > DEFAULT_HOLD_STEPS  # fast steps: the lead is hundreds of steps, not the fixed default
    assert JobDetector("j", 2, hold=hold)._hold is hold
    assert JobDetector("j", 2)._hold(500, 0.01) == DEFAULT_HOLD_STEPS
