"""Stopping ``profwatch simulate job`` stops the rank processes it started (issue 14, item 8): SIGTERM, Ctrl-C
(SIGINT) and even SIGKILL of the command leave no rank running. Real rank processes (torch + gloo on the CPU)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from tests.conftest import PYTHON, python_env, wait_for

pytest.importorskip("torch", reason="the simulated ranks are real PyTorch processes")


def _group(pgid: int) -> list[int]:
    """PIDs of live (not zombie) processes in process group ``pgid``, from /proc."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] != "Z" and int(fields[2]) == pgid:
            pids.append(int(entry))
    return pids


def _start(tmp_path: Path) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen(
        [PYTHON, "-m", "profwatch.cli", "simulate", "job", "--ranks", "2", "--config-dir", str(tmp_path / "cfg"),
         "--prof-root", str(tmp_path / "prof"), "--node-endpoint", f"ipc://{tmp_path}/nobody.sock",
         "--duration-s", "300", "--stop-grace-s", "10"],
        env=python_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stderr is not None
    # no node daemon at that socket: said first (the ranks' own stderr goes to their logs), then the launch line
    warned = proc.stderr.readline()
    assert warned.startswith(f"warning: the node socket {tmp_path}/nobody.sock does not exist"), warned
    first = proc.stderr.readline()
    m = re.search(r"\(process group (\d+)\)", first)
    assert m, first
    pgid = int(m.group(1))
    wait_for(lambda: len(_group(pgid)) == 2, 60, 0.1, "both rank processes running")
    return proc, pgid


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL])
def test_stopping_the_command_stops_its_ranks(tmp_path: Path, sig: signal.Signals) -> None:
    proc, pgid = _start(tmp_path)
    try:
        assert pgid != proc.pid and proc.pid not in _group(pgid)  # the ranks' own group, not the command's
        proc.send_signal(sig)
        rc = proc.wait(120)
        if sig != signal.SIGKILL:
            assert rc in (0, 1)  # stopped by request: the ranks' exit codes decide (a rank SIGTERMed counts as 1)
            assert proc.stderr is not None and f"{sig.name} received: stopping" in proc.stderr.read()
        # SIGKILL: the ranks get SIGTERM from the kernel when their parent dies (PR_SET_PDEATHSIG)
        wait_for(lambda: not _group(pgid), 60, 0.1, f"no rank left in process group {pgid}")
    finally:
        for group in (pgid, proc.pid):
            try:
                os.killpg(group, signal.SIGKILL)  # only what this test started: the command's and the ranks' groups
            except (ProcessLookupError, PermissionError):
                pass
        if proc.poll() is None:
            proc.wait(30)
