"""``profwatch.simulate.launcher.exit_rank``: a rank's end that runs the atexit hooks and flushes its output but
skips the interpreter's finalization (where a gloo thread can abort the process)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.conftest import PYTHON, python_env


def test_exit_rank_runs_atexit_hooks_flushes_output_and_exits_with_the_code(tmp_path: Path) -> None:
    marker = tmp_path / "atexit-ran"
    script = (
        "import atexit, sys\n"
        f"atexit.register(lambda: open({str(marker)!r}, 'w').write('ok'))\n"
        "sys.stdout.write('unflushed-out')\n"  # no newline, no flush: exit_rank must flush it
        "sys.stderr.write('unflushed-err')\n"
        "from profwatch.simulate.launcher import exit_rank\n"
        "exit_rank(3)\n"
        "print('never reached')\n"
    )
    env = python_env()
    env.pop("PYTHONUNBUFFERED", None)
    proc = subprocess.run([PYTHON, "-c", script], env=env, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 3, proc.stderr
    assert proc.stdout == "unflushed-out"
    assert proc.stderr.endswith("unflushed-err")
    assert marker.read_text() == "ok"
