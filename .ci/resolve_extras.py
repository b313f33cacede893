"""CI check: every extra of pyproject.toml resolves on every Python the project's metadata declares (the
``Programming Language :: Python :: 3.x`` classifiers, 3.10-3.13 today, each at or above ``requires-python``),
with the pyenv interpreter of that version (``~/.pyenv/versions/3.x.*``; a declared version without one is
reported and skipped, as is the whole check without pyenv). ``pip install --dry-run --only-binary=:all:`` of the
extras' requirement strings (read from pyproject.toml, ``profwatch[...]`` self-references followed, environment
markers evaluated by pip for that interpreter): nothing is built or installed. Any failure fails the check (exit 1).

What must resolve where: every extra on every declared Python. On 3.10 the ``daemon`` and ``coordinator`` extras'
own requirements carry ``python_version >= '3.11'`` markers, so they resolve to the node extra there (and the
commands say they need 3.11: profwatch/console.py). ``npu`` is left out: torch-npu is for real Ascend nodes with
CANN (pyproject.toml), not an index this check can rely on.

Busy hosts: one resolution per Python of the union of the extras (a solution of the union is one of each
extra; only where the union fails is each extra resolved alone, to name it), at most ``os.cpu_count()`` pips at
once, and a resolution that passed is cached in ``$PROFWATCH_RESOLVE_CACHE`` (default ``~/.cache/profwatch/resolve-extras``) under a key of
pyproject.toml, constraints/coordinator.txt, the interpreter's full version and the extra: a rerun with the same
inputs costs nothing (the check once took 461 s on a loaded 2-core host). ``--no-cache`` resolves everything again.

Run: ``python .ci/resolve_extras.py [--no-cache]`` (the project's venv; .ci/run does).
"""

from __future__ import annotations

import hashlib
import json
import os
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
TIMEOUT_S = 600
SKIPPED_EXTRAS = {"npu": "torch-npu is for real Ascend nodes with CANN only"}


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


def declared_pythons(project: dict) -> list[tuple[int, int]]:
    """The ``major.minor`` versions the classifiers declare, at or above requires-python's floor."""
    floor = tuple(int(x) for x in re.findall(r"\d+", project["requires-python"])[:2])
    found = {tuple(int(x) for x in m.groups()) for c in project.get("classifiers", [])
             if (m := re.fullmatch(r"Programming Language :: Python :: (\d+)\.(\d+)", c))}
    return sorted(v for v in found if v >= floor)  # type: ignore[misc]


def checked_extras(project: dict) -> list[str]:
    """Every extra pyproject.toml declares but those of :data:`SKIPPED_EXTRAS`."""
    return [e for e in project["optional-dependencies"] if e not in SKIPPED_EXTRAS]


def interpreter(v: tuple[int, int]) -> Path | None:
    versions = Path.home() / ".pyenv" / "versions"
    for d in sorted(versions.glob(f"{v[0]}.{v[1]}.*"), reverse=True) if versions.is_dir() else []:
        if (d / "bin" / "python").exists():
            return d / "bin" / "python"
    return None


def cache_key(inputs: bytes, py: Path, extra: str) -> str:
    return hashlib.sha256(inputs + b"\0" + str(py.resolve()).encode() + b"\0" + extra.encode()).hexdigest()[:32]


def main(argv: list[str]) -> int:
    raw = (ROOT / "pyproject.toml").read_bytes()
    project = tomllib.loads(raw.decode("utf-8"))["project"]
    inputs = raw + b"\0" + (ROOT / "constraints" / "coordinator.txt").read_bytes()
    cache = Path(os.environ.get("PROFWATCH_RESOLVE_CACHE") or Path.home() / ".cache" / "profwatch" / "resolve-extras")
    use_cache = "--no-cache" not in argv
    extras = checked_extras(project)
    pythons, missing = [], []
    for v in declared_pythons(project):
        py = interpreter(v)
        if py is None:
            missing.append(f"{v[0]}.{v[1]}")
        else:
            pythons.append((v, py))
    if missing:
        print(f"resolve-extras: no pyenv interpreter for declared Python {', '.join(missing)}: not checked there")
    if not pythons:
        print("resolve-extras: no declared Python has a pyenv interpreter here: skipped")
        return 0
    t0 = time.monotonic()
    # Pass 1, per Python: the union of every checked extra in one resolution. A set of versions that satisfies the
    # union satisfies each extra's subset of it, so one pass proves them all (4 pips, not 24).
    todo, cached = [], 0
    for v, py in pythons:
        left = [e for e in extras if not (use_cache and (cache / f"{cache_key(inputs, py, e)}.json").exists())]
        cached += len(extras) - len(left)
        if left:
            union = sorted({r for e in left for r in extra_requirements(project, e)})
            todo.append((v, py, left, union))
    print(f"resolve-extras: extras {', '.join(extras)} on Python {', '.join(f'{v[0]}.{v[1]}' for v, _ in pythons)}: "
          f"{cached} cached (unchanged pyproject/constraints), {sum(len(t[2]) for t in todo)} to resolve; skipped: "
          f"{', '.join(f'{k} ({v})' for k, v in SKIPPED_EXTRAS.items())}", flush=True)
    results = _resolve([(v, py, "+".join(left), union) for v, py, left, union in todo], t0)
    failed = 0
    retry = []
    for (v, py, left, _union), (ok, _why) in zip(todo, results, strict=True):
        if ok:
            for e in left:
                _remember(cache, cache_key(inputs, py, e), v, e)
            print(f"resolve-extras: Python {v[0]}.{v[1]} [{', '.join(left)}]: resolve (one resolution of their union)")
        else:
            retry += [(v, py, e, extra_requirements(project, e)) for e in left]
    # Pass 2, only where a union failed: each extra alone, to say which one does not resolve.
    for (v, py, e, _reqs), (ok, why) in zip(retry, _resolve(retry, t0), strict=True):
        failed += not ok
        if ok:
            _remember(cache, cache_key(inputs, py, e), v, e)
        print(f"resolve-extras: Python {v[0]}.{v[1]} [{e}]: {'resolves' if ok else 'FAILS: ' + why}", flush=True)
    print(f"resolve-extras: {'all resolve' if not failed else f'{failed} FAIL'} ({time.monotonic() - t0:.0f} s, "
          f"{cached} from the cache)")
    return 1 if failed else 0


def _remember(cache: Path, key: str, v: tuple[int, int], extra: str) -> None:
    cache.mkdir(parents=True, exist_ok=True)
    (cache / f"{key}.json").write_text(json.dumps({"python": f"{v[0]}.{v[1]}", "extra": extra}))


def _resolve(runs: list[tuple[tuple[int, int], Path, str, list[str]]], t0: float) -> list[tuple[bool, str]]:
    """``pip install --dry-run`` of each run's requirements with its interpreter, at most ``os.cpu_count()`` at
    once, all within TIMEOUT_S of ``t0``: (resolved, the last error lines) per run, in order."""
    width = max(1, os.cpu_count() or 1)
    procs: list[subprocess.Popen[str] | None] = [None] * len(runs)
    out: list[tuple[bool, str]] = [(False, "not run")] * len(runs)
    started = 0
    for i in range(len(runs)):
        while started < len(runs) and started < i + width:
            _v, py, _what, reqs = runs[started]
            procs[started] = subprocess.Popen(
                [str(py), "-m", "pip", "install", "--dry-run", "--quiet", "--only-binary=:all:",
                 "--disable-pip-version-check", "--ignore-installed", *reqs],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            started += 1
        p = procs[i]
        assert p is not None
        try:
            _o, err = p.communicate(timeout=max(1.0, TIMEOUT_S - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired:
            p.kill()
            _o, err = p.communicate()
            err = f"ERROR timed out: the whole check is bounded to {TIMEOUT_S} s\n" + err
        errors = [ln for ln in err.splitlines() if ln.startswith("ERROR")]
        out[i] = (p.returncode == 0, " | ".join(errors[-3:] or err.strip().splitlines()[-3:]))
    return out


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
