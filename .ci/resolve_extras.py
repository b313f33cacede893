"""CI check: the [hook], [node] and [coordinator] installs resolve on every Python the project declares, with each
pyenv interpreter present on this machine (``~/.pyenv/versions/3.*``; absent ones are skipped, as is the whole
check without pyenv). ``pip install --dry-run --only-binary=:all:`` of the extras' requirement strings (read from
pyproject.toml, ``profwatch[...]`` self-references followed): nothing is built or installed. One pip per
interpreter and extra, all at once. Expected: hook and node from the requires-python floor, coordinator from
COORDINATOR_FLOOR; any expected resolution that fails fails the check (exit 1).

Run: ``python .ci/resolve_extras.py`` (the project's venv; .ci/run does).
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
COORDINATOR_FLOOR = (3, 11)  # watchdog 7, and pandas/numpy of msprof-analyze 26.2.0's era (pyproject.toml)
TIMEOUT_S = 600


def extra_requirements(project: dict, name: str) -> list[str]:
    out: list[str] = list(project["dependencies"])
    for req in project["optional-dependencies"][name]:
        m = re.match(r"profwatch\[([\w,]+)\]", req)
        if m:
            for sub in m.group(1).split(","):
                out += extra_requirements(project, sub)
        else:
            out.append(req)
    return sorted(set(out))


def main() -> int:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    floor = tuple(int(x) for x in re.findall(r"\d+", project["requires-python"])[:2])
    versions = Path.home() / ".pyenv" / "versions"
    found = []
    for d in sorted(versions.glob("3.*")) if versions.is_dir() else []:
        v = tuple(int(x) for x in d.name.split(".")[:2])
        if v >= floor and (d / "bin" / "python").exists():
            found.append((v, d / "bin" / "python"))
    if not found:
        print(f"resolve-extras: no pyenv interpreter >= {floor[0]}.{floor[1]} here: skipped")
        return 0
    runs = []
    for v, py in found:
        for extra in ("hook", "node", "coordinator"):
            if extra == "coordinator" and v < COORDINATOR_FLOOR:
                continue
            cmd = [str(py), "-m", "pip", "install", "--dry-run", "--quiet", "--only-binary=:all:",
                   "--disable-pip-version-check", "--ignore-installed", *extra_requirements(project, extra)]
            runs.append((v, extra, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)))
    t0, failed = time.monotonic(), 0
    for v, extra, p in runs:
        try:
            _out, err = p.communicate(timeout=max(1.0, TIMEOUT_S - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired:
            p.kill()
            _out, err = p.communicate()
            err = f"timed out after {TIMEOUT_S} s\n" + err
        ok = p.returncode == 0
        failed += not ok
        errors = [ln for ln in err.splitlines() if ln.startswith("ERROR")]
        print(f"resolve-extras: Python {v[0]}.{v[1]} [{extra}]: {'resolves' if ok else 'FAILS'}"
              + ("" if ok else ": " + " | ".join(errors[-3:] or err.strip().splitlines()[-3:])))
    print(f"resolve-extras: {len(runs) - failed}/{len(runs)} resolved in {time.monotonic() - t0:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
