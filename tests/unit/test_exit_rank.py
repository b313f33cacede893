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


def test_exit_rank_flushes_c_level_stdio_buffers(tmp_path: Path) -> None:
    """Output a C or C++ library wrote through libc's stdout (fully buffered into a file or pipe without
    PYTHONUNBUFFERED) is flushed as ``exit()`` would; ``_exit(2)`` alone drops it."""
    script = (
        "import ctypes\n"
        "ctypes.CDLL(None).printf(b'c-level-out')\n"  # libc's buffer, not Python's sys.stdout
        "from profwatch.simulate.launcher import exit_rank\n"
        "exit_rank(0)\n"
    )
    env = python_env()
    env.pop("PYTHONUNBUFFERED", None)
    proc = subprocess.run([PYTHON, "-c", script], env=env, capture_output=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == b"c-level-out"


def test_exit_rank_joins_non_daemon_threads_and_executors_first(tmp_path: Path) -> None:
    """As at a normal exit (threading's shutdown, then the atexit hooks): a non-daemon thread and a
    ThreadPoolExecutor's queued work finish before the process ends, and before the atexit hooks run."""
    order = tmp_path / "order"
    script = (
        "import atexit, threading, time\n"
        "from concurrent.futures import ThreadPoolExecutor\n"
        f"path = {str(order)!r}\n"
        "lock = threading.Lock()\n"
        "def note(what):\n"
        "    with lock, open(path, 'a') as f:\n"
        "        f.write(what + '\\n')\n"
        "atexit.register(note, 'atexit')\n"
        "threading.Thread(target=lambda: (time.sleep(0.5), note('thread'))).start()\n"
        "ThreadPoolExecutor(1).submit(lambda: (time.sleep(0.3), note('pool')))\n"
        "from profwatch.simulate.launcher import exit_rank\n"
        "exit_rank(0)\n"
    )
    proc = subprocess.run([PYTHON, "-c", script], env=python_env(), capture_output=True, text=True, timeout=60,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    lines = order.read_text().splitlines()
    assert sorted(lines[:2]) == ["pool", "thread"] and lines[2:] == ["atexit"], lines  # their own order may vary
