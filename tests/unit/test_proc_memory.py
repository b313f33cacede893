"""The memory watchdog's reading of /proc (daemon/profwatch/adapters/fs/proc_memory.py) on a fake proc tree: the session filter,
command names holding spaces and parentheses, vanished and malformed entries; the host's memory; the scope prefix
and the probe where systemd is absent. The real /proc: this process's own session is found."""

from __future__ import annotations

import os
from pathlib import Path

from profwatch.adapters.fs.proc_memory import (
    PAGE_BYTES,
    ScopeSupport,
    host_memory_bytes,
    probe_systemd_scope,
    scope_prefix,
    session_members,
    session_rss_bytes,
)


def _stat(proc: Path, pid: int, comm: str, session: int, rss_pages: int, state: str = "S") -> None:
    # proc(5): pid (comm) state ppid pgrp session tty_nr tpgid flags minflt cminflt majflt cmajflt utime stime
    # cutime cstime priority nice num_threads itrealvalue starttime vsize rss ...
    fields = [state, "1", str(session), str(session), "0", "-1", "0", "0", "0", "0", "0", "0", "0", "0", "0",
              "20", "0", "1", "0", "100", "1000000", str(rss_pages), "18446744073709551615"]
    (proc / str(pid)).mkdir()
    (proc / str(pid) / "stat").write_text(f"{pid} ({comm}) " + " ".join(fields) + "\n")


def test_members_of_one_session_with_odd_command_names(tmp_path: Path) -> None:
    _stat(tmp_path, 100, "msprof-analyze", 100, 1000)
    _stat(tmp_path, 101, "python3 ) (worker", 100, 500)  # a name with spaces and parentheses
    _stat(tmp_path, 102, "zombie", 100, 0, state="Z")
    _stat(tmp_path, 200, "other", 200, 9999)  # another session
    (tmp_path / "300").mkdir()  # vanished between listing and reading: no stat file
    (tmp_path / "301").mkdir()
    (tmp_path / "301" / "stat").write_text("301 (short) S 1\n")  # malformed: too few fields
    (tmp_path / "self").mkdir()  # not a pid
    assert session_members(100, proc_root=str(tmp_path)) == {100: 1000 * PAGE_BYTES, 101: 500 * PAGE_BYTES,
                                                             102: 0}
    assert session_rss_bytes(100, proc_root=str(tmp_path)) == 1500 * PAGE_BYTES
    assert session_rss_bytes(200, proc_root=str(tmp_path)) == 9999 * PAGE_BYTES
    assert session_rss_bytes(999, proc_root=str(tmp_path)) == 0
    assert session_members(100, proc_root=str(tmp_path / "missing")) == {}


def test_the_real_proc_holds_this_process_in_its_session() -> None:
    members = session_members(os.getsid(0))
    assert os.getpid() in members and members[os.getpid()] > 0


def test_host_memory(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       131072000 kB\nMemFree:        1000 kB\n")
    assert host_memory_bytes(meminfo=str(meminfo)) == 131072000 * 1024
    meminfo.write_text("MemFree: 1 kB\n")
    assert host_memory_bytes(meminfo=str(meminfo)) is None
    assert host_memory_bytes(meminfo=str(tmp_path / "none")) is None


def test_scope_prefix_and_probe_without_systemd(tmp_path: Path) -> None:
    assert scope_prefix(ScopeSupport(why="no systemd"), 2**30) == []
    argv = scope_prefix(ScopeSupport(argv=("systemd-run", "--scope")), 2**30)
    assert argv == ["systemd-run", "--scope", "-p", "MemoryMax=1073741824", "-p", "MemorySwapMax=0", "--"]
    support = probe_systemd_scope(run_dir=str(tmp_path / "no-systemd"))
    assert not support.available and "systemd is not running here" in support.why
