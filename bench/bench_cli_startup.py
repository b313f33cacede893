"""What every ``profwatch`` command pays before it does anything: import time and start-up wall time (prints numbers).

Measures, as the median of ``--runs`` fresh interpreters each:

- ``import profwatch.cli``: the cumulative import time ``python -X importtime`` reports for it (ms);
- ``import profwatch.config`` + ``load_settings()``: what ``profwatch status`` runs before its control call (ms);
- the wall time of ``profwatch status --help``, run as ``python -m profwatch.cli status --help`` so the same
  command line also measures an older checkout (``--repo``), and as the installed console script (ms);
- which heavy packages (numpy, pandas, msprof_analyze, ijson, sqlite3, watchdog) those imports load;
- what a missing coordinator costs ``profwatch status`` (exit 3): nothing listening on the control port (the
  refused connection is seen at once), and a port that accepts but never answers (bounded by the first ``ping``,
  ``daemon/profwatch/commands/common.py: PING_TIMEOUT_S``).

Usage: ``python bench/bench_cli_startup.py [--runs 7] [--repo PATH]`` (``--repo``: measure another checkout, e.g.
``git archive main | tar -x -C /tmp/ref``, with this interpreter). Numbers vary with machine load; compare
medians of runs made back to back on the same machine.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

HEAVY = ("numpy", "pandas", "msprof_analyze", "ijson", "sqlite3", "watchdog")
REPO = Path(__file__).resolve().parent.parent


def _env() -> dict[str, str]:
    """The child's environment: ``REPO`` first on PYTHONPATH, ahead of the editable install's finder (children
    also run with ``cwd=REPO``: ``-c`` and ``-m`` put the working directory first on sys.path)."""
    env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "daemon"), str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def import_ms(module: str) -> float:
    """Cumulative import time of ``module`` in a fresh interpreter (``-X importtime``), in ms."""
    out = subprocess.run([sys.executable, "-X", "importtime", "-c", f"import {module}"], env=_env(), cwd=REPO,
                         capture_output=True, text=True, check=True)
    for line in reversed(out.stderr.splitlines()):
        parts = [p.strip() for p in line.split("|")]
        if len(parts) == 3 and parts[2] == module:
            return int(parts[1]) / 1000.0
    raise RuntimeError(f"no importtime line for {module}")


def wall_ms(argv: list[str], env: dict[str, str] | None = None, rc: int = 0) -> float:
    t0 = time.perf_counter()
    res = subprocess.run(argv, env=_env() | (env or {}), cwd=REPO, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    if res.returncode != rc:
        raise RuntimeError(f"{argv} exited {res.returncode}, expected {rc}")
    return (time.perf_counter() - t0) * 1000.0


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def missing_coordinator_ms(runs: int) -> dict[str, list[float]]:
    """Wall time of ``status`` (exit 3) against a closed port and against a port that never answers."""
    import zmq

    status = [sys.executable, "-m", "profwatch.cli", "status"]
    closed = {"PROFWATCH_COORDINATOR__CONTROL_BIND": f"tcp://127.0.0.1:{_free_port()}"}
    ctx = zmq.Context()
    mute = ctx.socket(zmq.ROUTER)  # accepts connections and requests, answers nothing
    port = mute.bind_to_random_port("tcp://127.0.0.1")
    silent = {"PROFWATCH_COORDINATOR__CONTROL_BIND": f"tcp://127.0.0.1:{port}"}
    try:
        return {
            "status, nothing listening (exit 3, wall, ms)": [wall_ms(status, closed, rc=3) for _ in range(runs)],
            "status, endpoint never answers (exit 3, wall, ms)": [wall_ms(status, silent, rc=3)
                                                                 for _ in range(min(runs, 3))],
        }
    finally:
        mute.close(0)
        ctx.term()


def heavy_loaded(code: str) -> list[str]:
    probe = f"{code}\nimport sys\nprint(' '.join(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r}))))"
    out = subprocess.run([sys.executable, "-c", probe], env=_env(), cwd=REPO, capture_output=True, text=True,
                         check=True)
    return out.stdout.split()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--repo", type=Path, default=None, help="checkout to measure (default: this one)")
    args = ap.parse_args()
    global REPO
    if args.repo is not None:
        REPO = args.repo.resolve()
    print(f"repo: {REPO}")
    profwatch = shutil.which("profwatch") or str(Path(sys.executable).with_name("profwatch"))
    rows = {
        "import profwatch.cli (importtime, ms)": [import_ms("profwatch.cli") for _ in range(args.runs)],
        "import profwatch.config + load_settings() (wall, ms)": [
            wall_ms([sys.executable, "-c", "import profwatch.cli, profwatch.config; profwatch.config.load_settings()"])
            for _ in range(args.runs)],
        "python -m profwatch.cli status --help (wall, ms)": [
            wall_ms([sys.executable, "-m", "profwatch.cli", "status", "--help"]) for _ in range(args.runs)],
    }
    if args.repo is None:  # the installed console script runs this checkout's profwatch.console
        rows["profwatch status --help (console script, wall, ms)"] = [
            wall_ms([profwatch, "status", "--help"]) for _ in range(args.runs)]
    rows |= missing_coordinator_ms(args.runs)
    rows |= {
        "python -c pass (wall, ms; the floor)": [wall_ms([sys.executable, "-c", "pass"]) for _ in range(args.runs)],
    }
    for name, values in rows.items():
        print(f"{name:<56} median {statistics.median(values):8.1f}  min {min(values):8.1f}  (n={len(values)})")
    print(f"{'heavy packages after import profwatch.cli':<56} {heavy_loaded('import profwatch.cli') or 'none'}")
    print(f"{'heavy packages after load_settings()':<56} "
          f"{heavy_loaded('import profwatch.config; profwatch.config.load_settings()') or 'none'}")


if __name__ == "__main__":
    main()
