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
])
def test_cli_and_config_do_not_import_the_analysis_stack(code: str) -> None:
    assert _loaded(code) == {"heavy": [], "ours": []}


def test_a_lazy_command_still_loads_when_used() -> None:
    got = _loaded("import sys; sys.argv = ['profwatch', 'analyze', '--help']\nimport profwatch.cli\ntry:\n"
                  "    profwatch.cli.main()\nexcept SystemExit:\n    pass")
    assert "profwatch.analysis.facade" in got["ours"]
