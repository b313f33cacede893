"""systemd notifications from real daemon processes: a fake $NOTIFY_SOCKET receiver (AF_UNIX datagrams, as
systemd listens) gets READY=1, then WATCHDOG=1 pings at half of $WATCHDOG_USEC, then STOPPING=1 on SIGTERM; a
daemon that cannot start exits 2 without READY. Plus the notifier's own rules (sd_notify(3))."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from profwatch.adapters.outputs.sd_notify import SdNotifier
from tests.conftest import PYTHON, python_env, wait_for
from tests.integration.sink_support import free_port


@pytest.fixture
def notify_socket(short_tmp: Path) -> Iterator[tuple[socket.socket, str]]:
    path = str(short_tmp / "notify.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(path)
    yield s, path
    s.close()


def _drain(s: socket.socket, into: list[str]) -> list[str]:
    while True:
        try:
            into.append(s.recv(4096, socket.MSG_DONTWAIT).decode())
        except (TimeoutError, BlockingIOError):
            return into


def _config(root: Path) -> Path:
    p = root / "pw.toml"
    p.write_text(f"""
[node]
node_id = "n-notify"
bind = "ipc://{root}/node.sock"
coordinator = "tcp://127.0.0.1:{free_port()}"
[coordinator]
ingest_bind = "tcp://127.0.0.1:{free_port()}"
control_bind = "tcp://127.0.0.1:{free_port()}"
pub_bind = "tcp://127.0.0.1:{free_port()}"
state_db = "{root / 'state.db'}"
work_dir = "{root / 'work'}"
[logging]
format = "console"
""")
    return p


@pytest.mark.parametrize("daemon", ["node", "coordinator"])
def test_daemon_sends_ready_watchdog_and_stopping(short_tmp: Path, notify_socket, daemon: str) -> None:
    sock, path = notify_socket
    env = python_env({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "200000"})
    log = open(short_tmp / f"{daemon}.log", "wb")  # noqa: SIM115
    p = subprocess.Popen([PYTHON, "-m", "profwatch.cli", daemon, "--config", str(_config(short_tmp))], env=env,
                         stdout=log, stderr=subprocess.STDOUT)
    got: list[str] = []
    try:
        wait_for(lambda: any(m.startswith("READY=1") for m in _drain(sock, got)), 60, 0.05, f"{daemon} READY=1")
        ready_at = got.index(next(m for m in got if m.startswith("READY=1")))
        t0 = time.monotonic()
        wait_for(lambda: _drain(sock, got)[ready_at:].count("WATCHDOG=1") >= 5, 20, 0.05, "5 watchdog pings")
        # pinged at half the 0.2 s period: 5 pings take ~0.4 s (generous bound for a loaded host)
        assert time.monotonic() - t0 < 10
        assert "STOPPING=1" not in got
        p.send_signal(signal.SIGTERM)
        assert p.wait(30) == 0
        _drain(sock, got)
        assert got[-1] == "STOPPING=1"
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)
        log.close()
    assert got[ready_at] == "READY=1\nSTATUS=serving"


def test_daemon_that_cannot_start_exits_2_without_ready(short_tmp: Path, notify_socket) -> None:
    sock, path = notify_socket
    bad = short_tmp / "bad.toml"
    bad.write_text("[coordinator]\nno_such_key = 1\n")
    res = subprocess.run([PYTHON, "-m", "profwatch.cli", "coordinator", "--config", str(bad)],
                         env=python_env({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "200000"}), capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 2 and "no_such_key" in res.stderr
    assert _drain(sock, []) == []


def test_notifier_rules(short_tmp: Path, notify_socket) -> None:
    sock, path = notify_socket
    assert not SdNotifier({}).enabled and SdNotifier({}).ready() is False
    n = SdNotifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "1000000"}, pid=42)
    assert n.watchdog_interval_s == 0.5
    assert n.watchdog(100.0) and not n.watchdog(100.2) and n.watchdog(100.5)
    assert n.ready() and n.stopping()
    assert _drain(sock, []) == ["WATCHDOG=1", "WATCHDOG=1", "READY=1", "STOPPING=1"]
    n.close()
    # the watchdog is meant for another process: no pings; no watchdog at all without WATCHDOG_USEC
    assert SdNotifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "1000000", "WATCHDOG_PID": "7"}, pid=42
                      ).watchdog_interval_s is None
    assert SdNotifier({"NOTIFY_SOCKET": path}).watchdog(0.0) is False
    # abstract socket names (leading @) map to a leading NUL byte
    assert SdNotifier({"NOTIFY_SOCKET": "@pw-test"}).address == "\0pw-test"
    # a vanished socket is logged once and never raised
    gone = SdNotifier({"NOTIFY_SOCKET": str(short_tmp / "nothing.sock")})
    assert gone.ready() is False and gone.ready() is False
    gone.close()
    assert os.path.exists(path)


def test_a_stalled_notify_socket_never_blocks_the_daemon(short_tmp: Path) -> None:
    """Issue 33 #8: a notify socket nobody reads stopped the coordinator's main loop ~4 minutes (a blocking
    sendto on a full datagram queue). The send is non-blocking: a full queue is a failed send, logged once."""
    import threading

    path = str(short_tmp / "stalled.sock")
    stalled = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    stalled.bind(path)  # never read
    n = SdNotifier({"NOTIFY_SOCKET": path})
    results: list[bool] = []
    t = threading.Thread(target=lambda: results.extend(n.send("WATCHDOG=1") for _ in range(5000)), daemon=True)
    t.start()
    t.join(30)
    try:
        assert not t.is_alive(), "sd_notify blocked on a stalled socket"
        assert results[0] is True and results[-1] is False  # the queue filled: later sends fail, never wait
    finally:
        n.close()
        stalled.close()
