"""Shared test helpers: bounded polling (`wait_for`), per-test ipc paths, thread-leak check."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import zmq

REPO_ROOT = Path(__file__).resolve().parent.parent
SHARED = REPO_ROOT.parent / "shared"
# The source roots a child process needs on PYTHONPATH: daemon/ (package ``profwatch``) and the root (``rankhook``).
SOURCE_PATHS = os.pathsep.join([str(REPO_ROOT / "daemon"), str(REPO_ROOT)])
# Tests never read the host's /etc/profwatch/profwatch.toml (nor a PROFWATCH_CONFIG of the shell that runs them):
# set but empty means "no config file" to every command and to the child processes the tests start.
os.environ["PROFWATCH_CONFIG"] = ""

T = TypeVar("T")


def wait_for(predicate: Callable[[], T], timeout_s: float = 10.0, interval_s: float = 0.02, what: str = "") -> T:
    """Poll ``predicate`` until it returns a truthy value; return it. Raise AssertionError after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    last: T = predicate()
    while not last:
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.1f}s waiting for {what or predicate}")
        time.sleep(interval_s)
        last = predicate()
    return last


@pytest.fixture
def short_tmp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A short temp dir for ipc:// socket paths (AF_UNIX paths are limited to ~107 bytes)."""
    import tempfile

    d = Path(tempfile.mkdtemp(prefix="pw", dir="/tmp"))
    yield d
    import shutil

    if not os.environ.get("PROFWATCH_KEEP_TMP"):
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(autouse=True)
def _structlog_defaults():
    """Each test starts with structlog's defaults: a command run in-process (``profwatch analyze`` through click's
    runner) configures logging for the process, e.g. a WARNING filter that would hide the info events a later test
    captures with ``structlog.testing.capture_logs``."""
    import structlog

    structlog.reset_defaults()
    yield
    structlog.reset_defaults()


def _sigterm_as_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt("SIGTERM")


def pytest_configure(config: pytest.Config) -> None:
    """The suite ends on SIGTERM and SIGINT, tearing its fixtures down (the daemons and jobs the tests started):
    SIGTERM is handled as Ctrl-C, and a SIGINT the shell set to ignored is given back its default (bash ignores
    SIGINT in the commands it starts in the background without job control, which is how .ci/run runs pytest so
    that it can forward CI's signals; Python then never raises KeyboardInterrupt). Issue 35."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _sigterm_as_interrupt)


@pytest.fixture(autouse=True)
def _signal_handlers_restored():
    """Fail a test that leaves the process's SIGTERM/SIGINT handlers changed (and put them back): a command run
    in-process that left its handler behind made the whole suite ignore SIGTERM and SIGINT (issue 35;
    daemon/profwatch/signals.py)."""
    import signal

    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    yield
    changed = {signal.Signals(s).name: signal.getsignal(s) for s, h in before.items() if signal.getsignal(s) != h}
    for s, h in before.items():
        signal.signal(s, h if h is not None else signal.SIG_DFL)
    assert not changed, f"the test left signal handlers installed: {changed}"


@pytest.fixture(autouse=True)
def _no_leaked_threads():
    """Fail a test that leaves non-daemon-library threads running (watchdog/zmq loops must be closed)."""
    before = {t.ident for t in threading.enumerate()}
    yield
    deadline = time.monotonic() + 5.0
    while True:
        leaked = [
            t
            for t in threading.enumerate()
            if t.ident not in before and t.is_alive() and not t.name.startswith(("pytest_timeout", "asyncio"))
        ]
        if not leaked or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    assert not leaked, f"test leaked threads: {[t.name for t in leaked]}"


def require_tool(name: str, why: str) -> str:
    """Path of the executable ``name``. Missing: skip with ``why``, but fail when ``PROFWATCH_REQUIRE_REAL_TOOLS=1``
    (``.ci/run`` sets it after installing the tools, so CI never passes by skipping)."""
    path = shutil.which(name)
    if path:
        return path
    msg = f"{name} is not installed: {why}"
    if os.environ.get("PROFWATCH_REQUIRE_REAL_TOOLS") == "1":
        pytest.fail(f"{msg} (PROFWATCH_REQUIRE_REAL_TOOLS=1: .ci/run should have installed it)")
    pytest.skip(msg)


def python_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for child Python processes: the repo on PYTHONPATH, no torch_npu autoload."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([SOURCE_PATHS, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    env.setdefault("PYTHONUNBUFFERED", "1")
    if extra:
        env.update(extra)
    return env


PYTHON = sys.executable


def finish_process(proc: subprocess.Popen, timeout_s: float, *, terminate: bool = False) -> str:
    """End a process this test started: optionally SIGTERM it, wait up to ``timeout_s`` (reading its piped stdout),
    then SIGKILL it by its pid if it is still running, and reap it. Never by name. Returns its stdout ("" when not
    piped; bytes are decoded as UTF-8 with replacement)."""
    if terminate and proc.poll() is None:
        proc.terminate()
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate(timeout=30)
    if isinstance(out, bytes):
        return out.decode("utf-8", "replace")
    return out or ""


def kill_group_in(pidfile: Path) -> None:
    """End the process group whose leader's pid a test's tool wrote to ``pidfile`` (the tool runs in its own
    session), if anything is left; nothing when the file is missing or not a pid. By process group, never by name."""
    try:
        pid = int(pidfile.read_text().strip())
    except (OSError, ValueError):
        return
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def scrape_metrics(port: int) -> str:
    """The Prometheus text of ``http://127.0.0.1:PORT/metrics`` ("" while nothing answers: total for wait_for)."""
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            return str(r.read().decode())
    except OSError:
        return ""


# Property-based tests (hypothesis): reproducible in CI (the same examples every run), random elsewhere.
try:
    from hypothesis import settings as _hypothesis_settings
except ImportError:  # the test extra is not installed: those tests fail on their own import
    pass
else:
    _hypothesis_settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
    if os.environ.get("CI") == "true":
        _hypothesis_settings.load_profile("ci")


@pytest.fixture
def step_pull(short_tmp: Path) -> Iterator[tuple[str, Callable[[], list[dict[str, Any]]]]]:
    """A bound ZeroMQ PULL socket standing in for the node daemon: ``(endpoint, steps)``, ``steps()`` draining
    what arrived and returning every step report so far (JSON dicts, in arrival order)."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PULL)
    sock.setsockopt(zmq.LINGER, 0)
    endpoint = f"ipc://{short_tmp}/node.sock"
    sock.bind(endpoint)
    got: list[dict[str, Any]] = []

    def steps() -> list[dict[str, Any]]:
        while sock.poll(0):
            _topic, payload = sock.recv_multipart()
            got.append(json.loads(payload))
        return [m for m in got if m["kind"] == "step"]

    yield endpoint, steps
    sock.close(0)
    ctx.term()
