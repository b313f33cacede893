"""Every ``profwatch`` command pays for what ``profwatch.cli`` and ``profwatch.config`` import: keep the analysis stack out.

Checked in a fresh interpreter (``sys.modules`` after the import), because this test process has imported
everything already. ``bench/bench_cli_startup.py`` prints the times.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.conftest import PYTHON, python_env

HEAVY = ("numpy", "pandas", "msprof_analyze", "ijson", "torch")
HEAVY_OURS = ("profwatch.analysis.facade", "profwatch.core.detection.job_detector", "profwatch.adapters.tools.msprof_runner", "profwatch.adapters.fs.rank_dir_fs")


def _loaded(code: str) -> dict[str, list[str]]:
    probe = (f"{code}\nimport json, sys\n"
             f"print(json.dumps({{'heavy': sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r})),"
             f"'ours': sorted(set(sys.modules) & set({HEAVY_OURS!r}))}}))")
    out = subprocess.run([PYTHON, "-c", probe], env=python_env(), capture_output=True, text=True, timeout=120,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("code", [
    "import profwatch.config",
    "import profwatch.cli",
    "import profwatch.config; profwatch.config.load_settings()",
    "import sys; sys.argv = ['profwatch', 'status', '--help']\nimport profwatch.cli\ntry:\n    profwatch.cli.main()\n"
    "except SystemExit:\n    pass",
    # `profwatch --help`: the command list comes from cli._LAZY_HELP, no command module is imported
    "import sys; sys.argv = ['profwatch', '--help']\nimport profwatch.console\ntry:\n    profwatch.console.main()\n"
    "except SystemExit:\n    pass",
    # a TAB after `profwatch ` (click's completion entry point: the _PROFWATCH_COMPLETE environment variable)
    "import os, sys; sys.argv = ['profwatch']\nos.environ.update(_PROFWATCH_COMPLETE='zsh_complete', "
    "COMP_WORDS='profwatch ', COMP_CWORD='1')\nimport profwatch.console\ntry:\n    profwatch.console.main()\n"
    "except SystemExit:\n    pass",
])
def test_cli_and_config_do_not_import_the_analysis_stack(code: str) -> None:
    assert _loaded(code) == {"heavy": [], "ours": []}


def test_top_level_help_lists_each_lazy_command_with_its_own_short_help() -> None:
    """cli._LAZY_HELP (what `profwatch --help` and completion show without importing) is each command's own."""
    import click

    from profwatch.cli import _LAZY_COMMANDS, _LAZY_HELP, cli

    assert set(_LAZY_HELP) == set(_LAZY_COMMANDS)
    ctx = click.Context(cli)
    for name in _LAZY_COMMANDS:
        cmd = cli.get_command(ctx, name)
        assert cmd is not None and cmd.get_short_help_str(1000) == _LAZY_HELP[name], name


def test_a_lazy_command_still_loads_when_used() -> None:
    got = _loaded("import sys; sys.argv = ['profwatch', 'analyze', '--help']\nimport profwatch.cli\ntry:\n"
                  "    profwatch.cli.main()\nexcept SystemExit:\n    pass")
    assert "profwatch.analysis.facade" in got["ours"]


NODE_EXTRA_MODULES = {"zmq", "msgspec", "pydantic", "pydantic_core", "pydantic_settings", "annotated_types", "typing_extensions",
                      "typing_inspection", "dotenv", "structlog", "prometheus_client", "click", "tomli"}
"""What the ``node`` extra installs (pyproject.toml), by import name, with their own dependencies."""

OPTIONAL_WHEN_INSTALLED = {"colorama"}
"""Imported by a node-extra package only when present, never installed by the node extra: structlog's console
colours (``structlog.dev`` tries ``import colorama``); the test extra brings it in with radon."""


def test_profwatch_node_imports_only_the_node_extra() -> None:
    """`profwatch node` (the CLI, the daemon and the modules it loads while running) imports nothing outside the
    node extra: no numpy, pandas, plotly, jinja2, watchdog, tenacity, ijson or msprof-analyze (issue 24 item 3)."""
    code = ("import sys\nsys.argv = ['profwatch', 'node', '--help']\nimport profwatch.cli\ntry:\n"
            "    profwatch.cli.main()\nexcept SystemExit:\n    pass\n"
            "import profwatch.node, profwatch.adapters.fs.config_writer, profwatch.adapters.fs.dp_log_tail\n"
            "import profwatch.core.fleet.node_checks, profwatch.commands.status, profwatch.commands.alerts\n"
            "import profwatch.commands.keys, json\n"
            "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules} - set(sys.stdlib_module_names))))")
    out = subprocess.run([PYTHON, "-c", code], env=python_env(), capture_output=True, text=True, timeout=120,
                         check=True)
    third = set(json.loads(out.stdout.strip().splitlines()[-1])) - {"profwatch", "rankhook", "cython_runtime"}
    third = {m for m in third if not m.startswith("_")}
    assert third <= NODE_EXTRA_MODULES | OPTIONAL_WHEN_INSTALLED, third - NODE_EXTRA_MODULES
