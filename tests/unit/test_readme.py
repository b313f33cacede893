"""The README stays true of the code: its exit-code table is daemon/profwatch/exitcodes.py's, every command it runs exists,
and every docs page it links exists (tests/unit/test_repo_stands_alone.py checks that it stands alone)."""

from __future__ import annotations

import re

from click.testing import CliRunner

from profwatch import exitcodes
from profwatch.cli import cli
from tests.conftest import REPO_ROOT

README = (REPO_ROOT / "README.md").read_text()


def test_exit_code_table_is_the_one_table() -> None:
    section = README[README.index("## Exit codes"):README.index("## What the verdict says")]
    rows = re.findall(r"^\| (\d) \| ", section, flags=re.M)
    assert [int(r) for r in rows] == [exitcodes.EXIT_OK, exitcodes.EXIT_NOT_OK, exitcodes.EXIT_USAGE,
                                      exitcodes.EXIT_UNAVAILABLE]


def test_every_profwatch_command_in_the_readme_exists() -> None:
    code = "\n".join(line.split("#")[0] for block in re.findall(r"```bash\n(.*?)```", README, flags=re.S)
                     for line in block.splitlines())  # commands, not their comments
    commands = set(re.findall(r"`profwatch ([a-z]+)", README)) | set(re.findall(r"\bprofwatch ([a-z]+)", code))
    assert {"demo", "coordinator", "node", "status", "alerts", "simulate", "keys"} <= commands
    known = set(cli.list_commands(None))  # type: ignore[arg-type]
    assert commands <= known, commands - known
    for sub in ("tree", "job"):
        assert CliRunner().invoke(cli, ["simulate", sub, "--help"]).exit_code == 0
    for option in ("--duration-s", "--config-dir", "--prof-root", "--slow-rank"):
        assert option in CliRunner().invoke(cli, ["simulate", "job", "--help"]).output


def test_linked_docs_exist() -> None:
    links = re.findall(r"\]\((docs/[^)#]+)", README)
    assert len(links) >= 10
    for link in links:
        assert (REPO_ROOT / link).is_file(), link
