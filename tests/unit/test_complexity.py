"""No function over a cyclomatic complexity of 40 (radon's count), so that a change to one is a change to one step.

radon counts what ruff's C901 (mccabe) does not: boolean operators, comprehensions and conditional expressions
(``judge_batch`` was 105 by radon, under 40 by ruff), so the ceiling is checked here over radon rather than with
ruff (issue 30). Functions that other open issues rewrite may stay over it until then: :data:`DEFERRED`.
"""

from __future__ import annotations

from pathlib import Path

from radon.complexity import cc_visit
from radon.visitors import Class, Function

from tests.conftest import REPO_ROOT

CEILING = 40
ROOTS = ("daemon", "rankhook", "bench", "tests")

DEFERRED: dict[str, str] = {}
"""``path::qualified name`` -> why it may stay over the ceiling for now: the functions issue 30 leaves to the issues
that rewrite them. A module that moves keeps its entry by function name (see :func:`_deferred`)."""


def _functions(path: Path) -> list[tuple[str, int, int]]:
    """``(qualified name, line, complexity)`` of every function and method in ``path`` (closures included)."""
    out: list[tuple[str, int, int]] = []

    def walk(blocks: list, prefix: str) -> None:
        for b in blocks:
            if isinstance(b, Class):
                walk(b.methods, f"{prefix}{b.name}.")
            elif isinstance(b, Function):
                name = f"{prefix}{b.classname + '.' if b.classname and not prefix else ''}{b.name}"
                out.append((name, b.lineno, b.complexity))
                walk(b.closures, f"{name}.")

    walk(cc_visit(path.read_text(encoding="utf-8")), "")
    return out


def _over_ceiling() -> dict[str, int]:
    found: dict[str, int] = {}
    for root in ROOTS:
        for path in sorted((REPO_ROOT / root).rglob("*.py")):
            rel = path.relative_to(REPO_ROOT).as_posix()
            for name, _line, cc in _functions(path):
                if cc > CEILING:
                    found[f"{rel}::{name}"] = max(cc, found.get(f"{rel}::{name}", 0))
    return found


def _deferred(key: str) -> bool:
    name = key.split("::", 1)[1]
    return any(d.split("::", 1)[1] == name for d in DEFERRED)


def test_no_function_over_the_ceiling() -> None:
    over = {k: cc for k, cc in _over_ceiling().items() if not _deferred(k)}
    assert not over, (f"functions over cyclomatic complexity {CEILING} (radon cc): {over}; split them into named "
                      "steps")


def test_the_deferred_list_is_not_stale() -> None:
    """A deferred function that was split (or removed) leaves the list, so the ceiling then holds for it too."""
    names = {k.split("::", 1)[1] for k in _over_ceiling()}
    stale = [d for d in DEFERRED if d.split("::", 1)[1] not in names]
    assert not stale, f"no longer over {CEILING}: remove from DEFERRED: {stale}"


def test_the_count_sees_a_function_over_the_ceiling(tmp_path: Path) -> None:
    """The check can fail: a function with 41 branches is found, with its class."""
    body = "".join(f"        if x == {i}:\n            return {i}\n" for i in range(40))
    src = tmp_path / "m.py"
    src.write_text(f"class K:\n    def f(self, x):\n{body}        return -1\n")
    assert ("K.f", 2, 41) in _functions(src)
