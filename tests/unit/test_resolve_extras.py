""".ci/resolve_extras.py checks every extra on every Python the metadata declares (issue 35: it skipped [daemon] and
tried every pyenv version instead), and its cache is keyed by pyproject.toml and the constraints."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from tests.conftest import REPO_ROOT
from tests.integration.test_packaging import PYPROJECT

_spec = importlib.util.spec_from_file_location("resolve_extras", REPO_ROOT / ".ci" / "resolve_extras.py")
assert _spec is not None and _spec.loader is not None
resolve_extras = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(resolve_extras)


def test_every_extra_but_npu_is_checked_on_the_declared_pythons() -> None:
    project = PYPROJECT["project"]
    assert set(resolve_extras.checked_extras(project)) == set(project["optional-dependencies"]) - {"npu"}
    assert "daemon" in resolve_extras.checked_extras(project)
    assert resolve_extras.declared_pythons(project) == [(3, 10), (3, 11), (3, 12), (3, 13)]
    assert resolve_extras.declared_pythons({**project, "requires-python": ">=3.11"})[0] == (3, 11)


def test_the_cache_key_follows_the_inputs_the_interpreter_and_the_extra(tmp_path: Path) -> None:
    py = Path("/usr/bin/python3")
    key = resolve_extras.cache_key(b"pyproject\0constraints", py, "node")
    assert key == resolve_extras.cache_key(b"pyproject\0constraints", py, "node")
    assert key != resolve_extras.cache_key(b"pyproject2\0constraints", py, "node")
    assert key != resolve_extras.cache_key(b"pyproject\0constraints", py, "daemon")


def test_ci_run_waits_for_the_dpkg_lock_and_forwards_signals_to_pytest() -> None:
    """Every apt-get of .ci/run waits (bounded) for another apt's lock; pytest runs in the background with CI's
    TERM/INT forwarded to it (a foreground child keeps running when bash dies of an untrapped SIGTERM)."""
    import re

    text = (REPO_ROOT / ".ci" / "run").read_text(encoding="utf-8")
    commands = [ln.split("#")[0] for ln in text.splitlines() if "echo" not in ln]
    calls = [m for ln in commands for m in re.findall(r"apt-get \S+", ln)]
    assert len(calls) == 2 and all(c == 'apt-get "${lock[@]}"' for c in calls), calls
    assert 'DPkg::Lock::Timeout=${APT_LOCK_WAIT_S:-600}' in text
    assert re.search(r"python -m pytest [^\n]*tests &\n", text)
    assert "trap 'kill -TERM \"$pytest_pid\"" in text and "trap 'kill -INT \"$pytest_pid\"" in text
