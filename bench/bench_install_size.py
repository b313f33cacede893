"""Install size per extra and the import time of the node daemon (issue 24 items 1 and 3).

For each extra (default ``hook,node,daemon,coordinator``) a fresh virtual env of this interpreter (or
``--python``) gets ``pip install ".[extra]"`` from this checkout (the coordinator with
``-c constraints/coordinator.txt``, as README says); printed: the size of its site-packages (MB, what the extra
adds to a bare venv, pip's own files subtracted), the number of distributions, and for node and above the time of
``profwatch node --help`` and of importing everything ``profwatch node`` loads (median of 5 fresh interpreters).
Goal: node under ~60 MB. Nothing is asserted.

Run from the repo root: ``python bench/bench_install_size.py [--extras node] [--python /path/to/python3.X]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NODE_IMPORTS = ("import profwatch.cli, profwatch.node, profwatch.adapters.fs.config_writer, "
                "profwatch.adapters.fs.dp_log_tail")


def _size_mb(folder: Path) -> float:
    total = 0
    for dirpath, _dirs, files in os.walk(folder):
        for f in files:
            try:
                total += os.lstat(os.path.join(dirpath, f)).st_size
            except OSError:
                pass
    return total / 1e6


def _site(venv: Path) -> Path:
    return next((venv / "lib").glob("python3*/site-packages"))


def measure(extra: str, python: str) -> dict[str, float | int | str]:
    with tempfile.TemporaryDirectory(prefix=f"pwsize-{extra}-") as tmp:
        venv = Path(tmp) / "venv"
        subprocess.run([python, "-m", "venv", str(venv)], check=True)
        base = _size_mb(_site(venv))
        cmd = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
               f"{ROOT}[{extra}]"]
        if extra == "coordinator":
            cmd += ["-c", str(ROOT / "constraints" / "coordinator.txt")]
        t = time.monotonic()
        subprocess.run(cmd, check=True)
        install_s = time.monotonic() - t
        site = _site(venv)
        dists = len(list(site.glob("*.dist-info"))) - len(list(site.glob("pip-*.dist-info")))
        row: dict[str, float | int | str] = {"extra": extra, "size_mb": round(_size_mb(site) - base, 1),
                                             "distributions": dists, "install_s": round(install_s, 1)}
        if extra != "hook":
            py = str(venv / "bin" / "python")
            env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}

            def timed(args: list[str]) -> float:
                t0 = time.perf_counter()
                subprocess.run(args, check=True, env=env, capture_output=True)
                return time.perf_counter() - t0

            row["node_help_s"] = round(statistics.median(timed([str(venv / "bin" / "profwatch"), "node", "--help"])
                                                         for _ in range(5)), 3)
            row["node_imports_s"] = round(statistics.median(timed([py, "-c", NODE_IMPORTS]) for _ in range(5)), 3)
            row["bare_python_s"] = round(statistics.median(timed([py, "-c", "pass"]) for _ in range(5)), 3)
        return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--extras", default="hook,node,daemon,coordinator")
    ap.add_argument("--python", default=sys.executable)
    args = ap.parse_args()
    v = subprocess.run([args.python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], capture_output=True,
                       text=True, check=True).stdout.strip()
    print(f"Python {v}; sizes are what each extra adds to a bare venv")
    for extra in args.extras.split(","):
        print(measure(extra, args.python), flush=True)


if __name__ == "__main__":
    main()
