"""The demo's daemons start whatever folder the demo is run from (a new user ran it from the parent of a clone named
``profwatch``: ``python -m profwatch.cli`` imported that folder instead of the installed package)."""

from __future__ import annotations

from pathlib import Path

import pytest

from profwatch.adapters.zmq.control import call
from profwatch.commands.demo_stack import Stack


def test_the_coordinator_starts_from_a_folder_holding_a_profwatch_folder(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    shadow = tmp_path / "here"
    (shadow / "profwatch" / "daemon").mkdir(parents=True)  # a clone of the repository, named profwatch
    monkeypatch.chdir(shadow)
    runtime = tmp_path / "rt"
    runtime.mkdir()
    (tmp_path / "root").mkdir()
    stack = Stack((tmp_path / "root").resolve(), runtime, nodes=1)
    try:
        stack.start_coordinator_only()  # raises ClickException when it does not answer
        assert call(stack.control, "ping", timeout_s=5.0)
    finally:
        stack.stop()
