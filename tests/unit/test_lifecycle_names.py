"""No capture state name and no state decision outside ``daemon/profwatch/core/capture/lifecycle.py`` and the record it
re-exports, ``daemon/profwatch/core/capture/record.py`` (a static check of the package).

The lifecycle owns the states: other modules use ``CaptureState`` members and the lifecycle's functions. This walks
the syntax tree of every module of ``daemon`` and ``rankhook`` (docstrings excluded) and fails on
* a string literal that spells a lifecycle-only state name (``"analysing"``, ``"superseded"``, ...), and
* a comparison or membership test of a capture's state (``cap.state``, ``capture["state"]``) or a
  ``{"state": ...}`` entry against any state name (``"failed"``, ``"incomplete"`` and ``"cancelled"`` are also rank
  dir, batch and recipe words elsewhere, so they count only there).
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

from profwatch.core.capture.lifecycle import CaptureState
from tests.conftest import REPO_ROOT

ALL_NAMES = {s.value for s in CaptureState}
SHARED_WORDS = {"failed", "incomplete", "cancelled"}  # also batch statuses, recipe statuses (a tool run cancelled at
# shutdown is "cancelled") and capture event kinds
UNIQUE_NAMES = ALL_NAMES - SHARED_WORDS
OWNERS = {REPO_ROOT / "daemon" / "profwatch" / "core" / "capture" / n for n in ("lifecycle.py", "record.py")}
"""The lifecycle (the decisions) and the capture record it re-exports (the states)."""
ALLOWED = {"daemon/profwatch/adapters/store/state_migrate.py": {"acknowledged", "written"}}
"""Keys of the version-1 capture JSON that happen to spell state names (read once by the migration)."""


def _docstring_nodes(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = getattr(node, "body", [])
            for stmt in body:  # the docstring and attribute docstrings (a bare string statement)
                if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str):
                    out.add(id(stmt.value))
    return out


def _names_in(node: ast.AST) -> set[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value} & ALL_NAMES
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return set().union(*(_names_in(e) for e in node.elts)) if node.elts else set()
    return set()


_CAPTURE_STATE = re.compile(r"\bcap(ture)?s?\b.*state", re.IGNORECASE)


def _mentions_state(node: ast.AST) -> bool:
    """``cap.state``, ``capture["state"]``... (``s.state`` of a rank dir or a recipe is another vocabulary)."""
    return _CAPTURE_STATE.search(ast.unparse(node)) is not None


def violations(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    docs = _docstring_nodes(tree)
    rel = path.relative_to(REPO_ROOT)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            if node.value in UNIQUE_NAMES and node.value not in ALLOWED.get(str(rel), set()):
                found.append(f"{rel}:{node.lineno}: state name {node.value!r}")
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            names = set().union(*(_names_in(s) for s in sides))
            if names & SHARED_WORDS and any(_mentions_state(s) for s in sides if not _names_in(s)):
                found.append(f"{rel}:{node.lineno}: state decision {ast.unparse(node)!r}")
        elif isinstance(node, ast.Dict):
            for k, v in zip(node.keys, node.values, strict=True):
                if isinstance(k, ast.Constant) and k.value == "state" and _names_in(v):
                    found.append(f"{rel}:{node.lineno}: state value {ast.unparse(v)}")
    return found


def test_the_checker_catches_what_it_should(tmp_path: Path) -> None:
    bad = REPO_ROOT / "tests" / "unit" / "_lifecycle_names_probe.py"
    bad.write_text('x = {"state": "failed"}\nif cap["state"] in ("failed", "x"):\n    y = "analysing"\n'
                   'z = batch.status == "incomplete"\nw = rank_dir.state == "failed"\n', encoding="utf-8")
    try:
        found = violations(bad)
    finally:
        bad.unlink()
    assert len(found) == 3, found  # batch statuses and rank dir states are other vocabularies


def test_no_state_names_outside_the_lifecycle() -> None:
    files = [p for root in ("daemon", "rankhook") for p in sorted((REPO_ROOT / root).rglob("*.py")) if p not in OWNERS]
    assert len(files) > 40
    found = [v for p in files for v in violations(p)]
    assert not found, "\n".join(found)


def test_the_capture_code_does_not_import_the_coordinator() -> None:
    """No cycle: the shell, its ports and the lifecycle load without the coordinator (it composes them)."""
    code = ("import sys, profwatch.captures.shell, profwatch.captures.ports, profwatch.core.capture.lifecycle; "
            "sys.exit(1 if 'profwatch.coordinator' in sys.modules else 0)")
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert res.returncode == 0, res.stderr[-2000:]
