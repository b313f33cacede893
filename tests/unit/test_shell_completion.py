"""Shell completion (issue 24 item 12): click's completion, as README documents it, completes subcommands and
options of the real `profwatch` entry point (the completion protocol env vars of click 8:
https://click.palletsprojects.com/en/stable/shell-completion/)."""

from __future__ import annotations

import subprocess

import pytest

from tests.conftest import PYTHON, REPO_ROOT, python_env

ENTRY = "import sys; sys.argv = ['profwatch']; from profwatch.console import main; main()"


def _complete(words: str, cword: int) -> list[str]:
    env = python_env({"_PROFWATCH_COMPLETE": "bash_complete", "COMP_WORDS": words, "COMP_CWORD": str(cword)})
    res = subprocess.run([PYTHON, "-c", ENTRY], env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return [line.split(",", 1)[1] for line in res.stdout.splitlines() if "," in line]


def test_subcommands_and_options_complete() -> None:
    assert "status" in _complete("profwatch sta", 1)
    assert {"init", "add", "install", "list"} <= set(_complete("profwatch keys ", 2))
    assert "--config" in _complete("profwatch status --con", 2)


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_the_documented_source_commands_print_a_script(shell: str) -> None:
    readme = (REPO_ROOT / "README.md").read_text()
    assert f"_PROFWATCH_COMPLETE={shell}_source profwatch" in readme
    res = subprocess.run([PYTHON, "-c", ENTRY], env=python_env({"_PROFWATCH_COMPLETE": f"{shell}_source"}),
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and "_PROFWATCH_COMPLETE" in res.stdout, res.stderr
