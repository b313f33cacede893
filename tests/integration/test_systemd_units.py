"""systemd units: valid for systemd-analyze (where available), ExecStart commands exist, example config loads;
no restart storm on permanent errors (exit 2 is never restarted, transient failures back off and are limited),
Type=notify with a watchdog; under a real systemd (when this machine runs one) the units are started for real."""

from __future__ import annotations

import configparser
import os
import shlex
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from profwatch.config import load_settings
from profwatch.exitcodes import EXIT_USAGE
from tests.conftest import PYTHON, REPO_ROOT, python_env, wait_for

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
    res = subprocess.run([PYTHON, "-m", "profwatch.cli", sub, "--help"], env=python_env(), capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert "--config" in res.stdout
    # the config it names is the example shipped here
    assert argv[argv.index("--config") + 1] == "/etc/profwatch/profwatch.toml"


def test_example_config_is_valid() -> None:
    s = load_settings(SYSTEMD / "profwatch.toml")
    assert s.coordinator.config_writer == "coordinator"
    assert s.analysis.msprof.advisor_html is True


def _verify_copy(name: str, unit_dir: Path) -> str:
    """``systemd-analyze verify`` on a copy of unit ``name`` in ``unit_dir`` (drop-ins beside it are read too), its
    ExecStart pointing at this venv's profwatch and without User/Group (no such user here). Returns the output."""
    exe = shutil.which("profwatch") or str(Path(PYTHON).parent / "profwatch")
    if not Path(exe).exists():
        pytest.skip("profwatch console script not installed")
    text = (SYSTEMD / name).read_text().replace("/usr/local/bin/profwatch", exe)
    text = "\n".join(line for line in text.splitlines() if not line.startswith(("User=", "Group=")))
    unit_dir.mkdir(parents=True, exist_ok=True)
    unit = unit_dir / name
    unit.write_text(text)
    res = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    assert not [ln for ln in out.splitlines() if "Unknown" in ln or "Invalid" in ln or "Ignoring" in ln], out
    return out


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
@pytest.mark.parametrize("name", UNITS)
def test_systemd_analyze_verify(name: str, tmp_path: Path) -> None:
    _verify_copy(name, tmp_path)


@pytest.mark.parametrize("name", UNITS)
def test_units_start_on_a_default_install_without_keys(name: str) -> None:
    """LoadCredential= of an absent file fails the start (243/CREDENTIALS): the shipped units load no key; the
    drop-ins ``keys init`` / ``keys install`` write do."""
    text = (SYSTEMD / name).read_text()
    assert not [ln for ln in text.splitlines() if ln.startswith(("LoadCredential", "SetCredential"))]


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_keys_init_and_install_write_drop_ins_that_verify(tmp_path: Path) -> None:
    units = tmp_path / "units"
    units.mkdir()

    def cli(*args: str) -> str:
        res = subprocess.run([PYTHON, "-m", "profwatch.cli", "keys", *args, "--systemd-dir", str(units)],
                             env=python_env(), capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, res.stderr
        return res.stdout

    out = cli("init", "--dir", str(tmp_path / "coord"))
    assert "daemon-reload" in out
    res = subprocess.run([PYTHON, "-m", "profwatch.cli", "keys", "add", "node7", "--role", "node", "--dir",
                          str(tmp_path / "coord")], env=python_env(), capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    # the node host: the issued secret and the server's public key, installed by the named command
    out = cli("install", str(tmp_path / "coord" / "issued" / "node7.key_secret"), "--server-key",
              str(tmp_path / "coord" / "server.key"), "--dir", str(tmp_path / "node"))
    assert "node.node_id = 'node7'" in out
    assert (tmp_path / "node" / "client.key_secret").stat().st_mode & 0o777 == 0o600
    for unit, cred, env, key in (
            ("profwatch-coordinator.service", "server.key_secret", "PROFWATCH_SECURITY__SERVER_SECRET_KEY",
             tmp_path / "coord" / "server.key_secret"),
            ("profwatch-node.service", "client.key_secret", "PROFWATCH_SECURITY__CLIENT_SECRET_KEY",
             tmp_path / "node" / "client.key_secret")):
        dropin = (units / f"{unit}.d" / "50-profwatch-curve.conf").read_text()
        assert f"LoadCredential={cred}:{key.resolve()}" in dropin and f"Environment={env}=%d/{cred}" in dropin
        _verify_copy(unit, units)  # the unit with its drop-in beside it


@pytest.mark.skipif(not (shutil.which("systemd-sysusers") and shutil.which("systemd-tmpfiles")) or os.geteuid() != 0,
                    reason="systemd-sysusers / systemd-tmpfiles not installed, or not root (the folders are chowned)")
def test_sysusers_and_tmpfiles_create_the_user_and_key_folders(tmp_path: Path) -> None:
    """The real tools, applied to an empty root (``--root``): the profwatch user and group, and the key folders
    readable by that group only."""
    root = tmp_path / "root"
    for sub, conf in (("sysusers.d", "sysusers.d/profwatch.conf"), ("tmpfiles.d", "tmpfiles.d/profwatch.conf")):
        (root / "usr/lib" / sub).mkdir(parents=True)
        shutil.copy(SYSTEMD / conf, root / "usr/lib" / sub / "profwatch.conf")
    (root / "etc").mkdir()
    for f in ("passwd", "group", "shadow", "gshadow"):
        (root / "etc" / f).touch()
    for tool in (["systemd-sysusers"], ["systemd-tmpfiles", "--create"]):
        res = subprocess.run([*tool, f"--root={root}", "profwatch.conf"], capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, res.stderr
    passwd = (root / "etc/passwd").read_text()
    group = (root / "etc/group").read_text()
    assert passwd.startswith("profwatch:") and "/usr/sbin/nologin" in passwd and group.startswith("profwatch:")
    gid = int(group.split(":")[2])
    keys = root / "etc/profwatch/keys"
    for d in (keys, keys / "clients"):
        st = d.stat()
        assert (st.st_mode & 0o777, st.st_uid, st.st_gid) == (0o750, 0, gid), d


def _seconds(v: str) -> float:
    """systemd time span (``30s``, ``10min``, ``2min 30s``, plain seconds) -> seconds."""
    total = 0.0
    for part in v.split():
        num = part.rstrip("abcdefghijklmnopqrstuvwxyz")
        unit = part[len(num):] or "s"
        total += float(num) * {"s": 1, "sec": 1, "min": 60, "m": 60, "h": 3600, "ms": 0.001}[unit]
    return total


@pytest.mark.parametrize("name", UNITS)
def test_no_restart_storm_and_notify_watchdog(name: str) -> None:
    unit = _unit(name)
    svc, top = unit["Service"], unit["Unit"]
    # permanent errors (exit 2 in the one exit-code table) are never restarted
    assert str(EXIT_USAGE) in svc["RestartPreventExitStatus"].split()
    # transient ones back off and are limited: at most StartLimitBurst starts per StartLimitIntervalSec
    assert _seconds(svc["RestartSec"]) >= 5
    burst, interval = int(top["StartLimitBurst"]), _seconds(top["StartLimitIntervalSec"])
    assert 1 <= burst <= 10 and interval >= burst * _seconds(svc["RestartSec"])
    # readiness and liveness come from the daemon itself
    assert svc["Type"] == "notify" and svc.get("NotifyAccess", "main") == "main"
    assert 10 <= _seconds(svc["WatchdogSec"]) <= 300
    assert "ExecReload" not in svc  # restart is the reload path (docs/systemd.md)


@pytest.mark.parametrize("daemon", ["node", "coordinator"])
def test_a_bad_config_is_a_permanent_error_for_both_daemons(daemon: str, tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(f"[{daemon}]\nno_such_key = 1\n")
    res = subprocess.run([PYTHON, "-m", "profwatch.cli", daemon, "--config", str(bad)], env=python_env(),
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == EXIT_USAGE, res.stderr  # ...which the units' RestartPreventExitStatus never restarts


def _real_systemd() -> bool:
    return (os.geteuid() == 0 and Path("/run/systemd/system").is_dir() and shutil.which("systemctl") is not None
            and Path("/proc/1/comm").read_text().strip() == "systemd")


def _show(unit: str, *props: str) -> dict[str, str]:
    out = subprocess.run(["systemctl", "show", unit, *(f"-p{p}" for p in props)], capture_output=True, text=True,
                         timeout=30).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


@pytest.mark.skipif(not _real_systemd(), reason="this machine does not run systemd as PID 1 (root needed): the "
                    "directives are checked by the tests above instead")
@pytest.mark.parametrize("daemon", ["node", "coordinator"])
def test_units_under_a_real_systemd(daemon: str) -> None:
    exe = shutil.which("profwatch") or str(Path(PYTHON).parent / "profwatch")
    tag = f"pwtest-{uuid.uuid4().hex[:8]}"
    runtime = Path("/run") / tag  # outside /tmp: the units run with PrivateTmp=yes
    runtime.mkdir(mode=0o755)
    from tests.integration.sink_support import free_port

    good = runtime / "good.toml"
    good.write_text(f"""
[node]
node_id = "{tag}"
bind = "ipc://{runtime}/node.sock"
coordinator = "tcp://127.0.0.1:{free_port()}"
[coordinator]
ingest_bind = "tcp://127.0.0.1:{free_port()}"
control_bind = "tcp://127.0.0.1:{free_port()}"
pub_bind = "tcp://127.0.0.1:{free_port()}"
state_db = "{runtime}/state.db"
work_dir = "{runtime}/work"
""")
    bad = runtime / "bad.toml"
    bad.write_text(f"[{daemon}]\nno_such_key = 1\n")
    src = (SYSTEMD / f"profwatch-{daemon}.service").read_text().replace("/usr/local/bin/profwatch", exe)
    src = "\n".join(ln for ln in src.splitlines() if not ln.startswith(("User=", "Group=")))
    units = {}
    for kind, cfg in (("good", good), ("bad", bad)):
        name = f"{tag}-{daemon}-{kind}.service"
        text = src.replace("/etc/profwatch/profwatch.toml", str(cfg)).replace("RestartSec=", "RestartSec=1s\n#")
        (Path("/run/systemd/system") / name).write_text(text)
        units[kind] = name
    try:
        subprocess.run(["systemctl", "daemon-reload"], check=True, timeout=60)
        # Type=notify: start returns once the daemon said READY=1
        res = subprocess.run(["systemctl", "start", units["good"]], capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stderr
        assert _show(units["good"], "ActiveState")["ActiveState"] == "active"
        # a permanent error: exit 2, and no restart however long we wait
        subprocess.run(["systemctl", "start", units["bad"]], capture_output=True, text=True, timeout=120)
        wait_for(lambda: _show(units["bad"], "ActiveState")["ActiveState"] == "failed", 60, 0.2, "bad unit failed")
        subprocess.run(["sleep", "4"], timeout=10)  # > 3 x RestartSec of this copy
        st = _show(units["bad"], "ActiveState", "NRestarts", "ExecMainStatus")
        assert st == {"ActiveState": "failed", "NRestarts": "0", "ExecMainStatus": str(EXIT_USAGE)}, st
    finally:
        for name in units.values():
            subprocess.run(["systemctl", "stop", name], capture_output=True, timeout=60)
            subprocess.run(["systemctl", "reset-failed", name], capture_output=True, timeout=60)
            (Path("/run/systemd/system") / name).unlink(missing_ok=True)
        subprocess.run(["systemctl", "daemon-reload"], capture_output=True, timeout=60)
        shutil.rmtree(runtime, ignore_errors=True)
