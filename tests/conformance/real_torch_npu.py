"""The real torch_npu dynamic-profile monitor for conformance tests: fetch the wheel, build an isolated tree.

* :func:`wheel_version` picks the torch-npu release matching the installed torch (``2.13.0`` for torch
  ``2.13.0+cpu``); ``PROFWATCH_TORCH_NPU_VERSION`` overrides it.
* :func:`ensure_wheel` finds ``torch_npu-<version>-<python tag>-*.whl`` in the cache folder
  ``${PROFWATCH_WHEEL_CACHE:-~/.cache/profwatch/wheels}`` or downloads it there with
  ``pip download --no-deps`` (about 44 MB). The wheel is never installed: importing torch_npu for real needs
  CANN, and merely installing it breaks ``import torch``.
* :func:`build_tree` extracts the pure-Python files the monitor needs (``torch_npu/profiler/**``,
  ``torch_npu/utils/**``, ``torch_npu/_init/**``, ``torch_npu/version.py``) byte for byte, checks each against
  the wheel's ``RECORD`` hash, and lays the stand-ins of ``tests/conformance/torch_npu_standins`` over them
  (:data:`STANDINS`: the native extension ``torch_npu._C``, the NPU device module with its stream, ``mstx`` and
  ``Event``, and two package initialisers that would load the native extension). The tree is a private
  folder that only the conformance tests' rank processes put on ``sys.path``.

Run ``python -m tests.conformance.real_torch_npu`` to fetch the wheel into the cache (``.ci/run`` does).
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

STANDIN_ROOT = Path(__file__).resolve().parent / "torch_npu_standins"
STANDINS: dict[str, str] = {
    "torch_npu/__init__.py": "package initialiser: loads the native extension; stand-in sets __version__, torch.npu",
    "torch_npu/_C/__init__.py": "native extension (CANN)",
    "torch_npu/_C/_profiler.py": "native profiler: _init/_warmup/_start/_stop/_finalize_profiler and friends",
    "torch_npu/npu/__init__.py": "NPU device module: current_stream, synchronize, _lazy_init, Event",
    "torch_npu/npu/mstx.py": "mstx range markers",
    "torch_npu/utils/__init__.py": "package initialiser: imports native-backed helpers",
}
"""Files of the isolated tree that are NOT torch_npu's code, and what each replaces."""

REAL_PREFIXES = ("torch_npu/profiler/", "torch_npu/utils/", "torch_npu/_init/")
REAL_FILES = ("torch_npu/version.py",)

MONITOR_FILES: tuple[str, ...] = (
    "torch_npu/profiler/dynamic_profile.py",
    "torch_npu/profiler/_dynamic_profiler/_dynamic_profiler_monitor.py",
    "torch_npu/profiler/_dynamic_profiler/_dynamic_profiler_monitor_shm.py",
    "torch_npu/profiler/_dynamic_profiler/_dynamic_profiler_config_context.py",
    "torch_npu/profiler/_dynamic_profiler/_dynamic_profiler_utils.py",
    "torch_npu/profiler/_dynamic_profiler/_dynamic_monitor_proxy.py",
    "torch_npu/profiler/profiler.py",
    "torch_npu/profiler/profiler_interface.py",
    "torch_npu/profiler/_profiler_path_creator.py",
    "torch_npu/profiler/_profiler_action_controller.py",
    "torch_npu/profiler/scheduler.py",
    "torch_npu/profiler/experimental_config.py",
    "torch_npu/profiler/analysis/_npu_profiler.py",
    "torch_npu/profiler/analysis/_profiling_parser.py",
    "torch_npu/utils/_path_manager.py",
    "torch_npu/profiler/analysis/prof_common_func/_file_manager.py",
)
"""The upstream files whose behaviour the conformance tests check (all run unmodified); coverage is reported
for these (``tests/conformance/coverage_report.py``)."""


class WheelUnavailable(RuntimeError):
    """The torch-npu wheel is not in the cache and could not be downloaded; the message says why."""


def cache_dir() -> Path:
    """``$PROFWATCH_WHEEL_CACHE`` or ``~/.cache/profwatch/wheels`` (created)."""
    d = Path(os.environ.get("PROFWATCH_WHEEL_CACHE") or Path.home() / ".cache" / "profwatch" / "wheels")
    d.mkdir(parents=True, exist_ok=True)
    return d


def wheel_version() -> str:
    """The torch-npu release for the installed torch: its ``major.minor.patch`` (``PROFWATCH_TORCH_NPU_VERSION``
    overrides). torch-npu X.Y.Z pins ``torch==X.Y.Z.*``."""
    explicit = os.environ.get("PROFWATCH_TORCH_NPU_VERSION", "").strip()
    if explicit:
        return explicit
    import importlib.metadata

    base = importlib.metadata.version("torch").split("+")[0]
    parts = base.split(".")
    return ".".join((parts + ["0", "0"])[:3])


def _python_tag() -> str:
    return f"cp{sys.version_info.major}{sys.version_info.minor}"


def find_cached_wheel(version: str, directory: Path | None = None) -> Path | None:
    """A cached ``torch_npu-<version>-cpXY-cpXY-*x86_64|aarch64*.whl`` for this interpreter, or None."""
    d = directory or cache_dir()
    tag = _python_tag()
    for p in sorted(d.glob(f"torch_npu-{version}-{tag}-{tag}-*.whl")):
        if zipfile.is_zipfile(p):
            return p
    return None


def ensure_wheel(version: str | None = None, *, timeout_s: float = 600.0, offline: bool = False) -> Path:
    """Return the cached wheel, downloading it with ``pip download --no-deps`` when missing (not when ``offline``).

    Raises:
        WheelUnavailable: not cached and ``offline``, or pip failed or timed out (no network, no such release for
        this Python).
    """
    version = version or wheel_version()
    d = cache_dir()
    found = find_cached_wheel(version, d)
    if found is not None:
        return found
    if offline:
        raise WheelUnavailable(f"not in the cache {d} and PROFWATCH_OFFLINE=1 forbids downloading it")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
           "-d", str(d), f"torch-npu=={version}"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise WheelUnavailable(f"'{' '.join(cmd)}' timed out after {timeout_s:.0f} s") from None
    found = find_cached_wheel(version, d)
    if proc.returncode != 0 or found is None:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise WheelUnavailable(f"'{' '.join(cmd)}' failed (rc {proc.returncode}): {' | '.join(tail)}")
    return found


def _record_hashes(z: zipfile.ZipFile) -> dict[str, str]:
    rec = next(n for n in z.namelist() if n.endswith(".dist-info/RECORD"))
    out = {}
    for row in csv.reader(io.StringIO(z.read(rec).decode())):
        if len(row) >= 2 and row[1].startswith("sha256="):
            out[row[0]] = row[1][len("sha256="):]
    return out


def _sha256_b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


@dataclass(frozen=True)
class MonitorTree:
    """An isolated tree: put ``site`` on a rank's ``PYTHONPATH`` to import the monitor as ``torch_npu``.

    ``real_files``: relative paths copied unmodified from the wheel (hash-checked); ``standins``: see
    :data:`STANDINS`; ``version``: the torch-npu release; ``wheel``: its path.
    """

    site: Path
    version: str
    wheel: Path
    real_files: tuple[str, ...]
    standins: tuple[str, ...]

    def path_of(self, rel: str) -> Path:
        return self.site / rel


def build_tree(wheel: Path, dest: Path, version: str) -> MonitorTree:
    """Extract the monitor's pure-Python files from ``wheel`` into ``dest/site`` and overlay the stand-ins.

    Raises:
        RuntimeError: a file's content does not match the wheel's RECORD hash (a corrupt download).
    """
    site = dest / "site"
    if site.exists():
        shutil.rmtree(site)
    site.mkdir(parents=True)
    real: list[str] = []
    with zipfile.ZipFile(wheel) as z:
        hashes = _record_hashes(z)
        for name in z.namelist():
            if not name.endswith(".py") or not (name.startswith(REAL_PREFIXES) or name in REAL_FILES):
                continue
            if name in STANDINS:
                continue
            data = z.read(name)
            want = hashes.get(name)
            if want is None or want != _sha256_b64(data):
                raise RuntimeError(f"{wheel.name}: {name} does not match its RECORD hash")
            out = site / name
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(data)
            real.append(name)
    for rel in STANDINS:
        out = site / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(STANDIN_ROOT / rel, out)
    missing = [f for f in MONITOR_FILES if f not in real]
    if missing:
        raise RuntimeError(f"{wheel.name} lacks the monitor files {missing}")
    return MonitorTree(site=site, version=version, wheel=wheel, real_files=tuple(sorted(real)),
                       standins=tuple(STANDINS))


def main() -> int:
    """Fetch the wheel into the cache; print its path (``.ci/run``)."""
    try:
        print(ensure_wheel())
    except WheelUnavailable as exc:
        print(f"torch-npu wheel unavailable: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
