"""systemd units: valid for systemd-analyze (where available), ExecStart commands exist, example config loads."""

from __future__ import annotations

import configparser
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from daemon.config import load_settings
from tests.conftest import PYTHON, REPO_ROOT, python_env

UNITS = ["profwatch-node.service", "profwatch-coordinator.service"]
SYSTEMD = REPO_ROOT / "systemd"


def _unit(name: str) -> configparser.ConfigParser:
    cp = configparser.ConfigParser(strict=False, interpolation=None)
    cp.optionxform = str  # type: ignore[assignment,method-assign]
    cp.read(SYSTEMD / name)
    return cp


@pytest.mark.parametrize("name", UNITS)
def test_unit_has_the_operational_settings(name: str) -> None:
    svc = _unit(name)["Service"]
    for key in ("User", "RuntimeDirectory", "StateDirectory", "Restart", "TimeoutStopSec", "ExecStart"):
        assert svc.get(key), f"{name} lacks {key}"
    assert svc["Restart"] == "on-failure"
    assert "LANG=C.UTF-8" in svc["Environment"]
    # hardening must not hide shared storage or /dev/shm
    assert svc.get("ProtectSystem") != "strict"
    assert "ProtectHome" not in svc and "PrivateDevices" not in svc


@pytest.mark.parametrize("name", UNITS)
def test_execstart_command_exists(name: str) -> None:
    argv = shlex.split(_unit(name)["Service"]["ExecStart"])
    assert Path(argv[0]).name == "profwatch"
    sub = argv[1]
    # the subcommand and its --config option exist in this installation
    res = subprocess.run([PYTHON, "-m", "daemon.cli", sub, "--help"], env=python_env(), capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert "--config" in res.stdout
    # the config it names is the example shipped here
    assert argv[argv.index("--config") + 1] == "/etc/profwatch/profwatch.toml"


def test_example_config_is_valid() -> None:
    s = load_settings(SYSTEMD / "profwatch.toml")
    assert s.coordinator.config_writer == "coordinator"
    assert s.analysis.msprof.advisor_html is True


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
@pytest.mark.parametrize("name", UNITS)
def test_systemd_analyze_verify(name: str, tmp_path: Path) -> None:
    # verify resolves ExecStart and User: point ExecStart at a real profwatch and drop User= (no such user here)
    exe = shutil.which("profwatch") or str(Path(PYTHON).parent / "profwatch")
    if not Path(exe).exists():
        pytest.skip("profwatch console script not installed")
    text = (SYSTEMD / name).read_text().replace("/usr/local/bin/profwatch", exe)
    text = "\n".join(line for line in text.splitlines() if not line.startswith(("User=", "Group=")))
    unit = tmp_path / name
    unit.write_text(text)
    res = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    assert not [ln for ln in out.splitlines() if "Unknown" in ln or "Invalid" in ln or "Ignoring" in ln], out
