"""The man pages (.ci/manpages.py, click-man) cover every command, the lazily loaded ones included, and say what
--help says."""

from __future__ import annotations

import subprocess
from pathlib import Path

import click
import pytest

from profwatch.cli import cli
from tests.conftest import PYTHON, REPO_ROOT, python_env


def test_every_command_gets_a_man_page_with_its_options(tmp_path: Path) -> None:
    pytest.importorskip("click_man")
    res = subprocess.run([PYTHON, str(REPO_ROOT / ".ci" / "manpages.py"), str(tmp_path)], env=python_env(),
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    names = {p.name for p in tmp_path.glob("*.1")}
    for command in cli.list_commands(click.Context(cli)):
        assert f"profwatch-{command}.1" in names, command
    assert {"profwatch.1", "profwatch-config-check.1", "profwatch-config-show.1", "profwatch-keys-init.1"} <= names
    page = (tmp_path / "profwatch-demo.1").read_text()
    assert ".TH" in page and "start\\-timeout\\-s" in page and "counted from the slowdown" in " ".join(page.split())
