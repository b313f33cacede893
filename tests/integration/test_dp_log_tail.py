"""daemon/profwatch/adapters/fs/dp_log_tail.py: per-rank acknowledgements from dp_*.log, rotation/truncation, stale state."""

from __future__ import annotations

import os
from pathlib import Path

from profwatch.adapters.fs.dp_log_tail import DpLogTail, find_stale_dp_state, parse_log_name


def _line(msg: str, level: str = "INFO", pid: int = 42) -> str:
    return f"2026-11-30 10:30:00,123 [{level}] [{pid}] _dynamic_profiler_utils.py: {msg}\n"


def test_acks_per_rank_with_rotation_and_truncation(tmp_path: Path) -> None:
    log = tmp_path / "log"
    log.mkdir()
    r0 = log / "dp_node_a_42_rank_0.log"
    r1 = log / "dp_node-b_43_rank_1.log"
    (log / "monitor_dp_node_a_40_rank_3.log").write_text(_line("Start step will be set to 9."))
    r0.write_text(_line("Rank 0 shared memory is created") + _line("Start step will be set to 120."))
    r1.write_text(_line("Start step will be set to 0.") + _line("Rank 1 not in valid rank_list {0}!"))
    tail = DpLogTail(str(tmp_path), job_id="j1")
    evs = tail.poll()
    # order holds within a file; files are read in name order
    assert sorted(((e.rank, e.event, e.start_step) for e in evs), key=lambda x: x[0]) == [
        (0, "arm_seen", 120), (1, "arm_rejected", 0), (1, "arm_rejected", None)]
    assert all(e.source == "dp_log" and e.job_id == "j1" for e in evs)
    assert evs[0].ts_unix_s > 1.7e9
    assert tail.poll() == []
    with open(r0, "a") as f:
        f.write(_line("Start Dynamic Profiler at 120 step.") + "2026-11-30 10:30:01,000 [INFO] [42] partial")
    evs = tail.poll()
    assert [(e.event, e.step) for e in evs] == [("started", 120)]
    # rotation: the handler renames to .1 (finishing the partial line first) and opens a new file
    with open(r0, "a") as f:
        f.write(" _dynamic_profiler_utils.py: Stop Dynamic Profiler at 123 step.\n")
    os.rename(r0, str(r0) + ".1")
    r0.write_text(_line("Start step will be set to 200."))
    evs = tail.poll()
    assert [(e.event, e.step, e.start_step) for e in evs] == [("completed", 123, None), ("arm_seen", None, 200)]
    # truncation: shorter than our offset -> read again from 0
    r1.write_text(_line("Start Dynamic Profiler at 5 step."))
    evs = tail.poll()
    assert [(e.rank, e.event, e.step) for e in evs] == [(1, "started", 5)]
    assert sorted(tail.files) == [0, 1] and tail.files[1].hostname == "node-b"


def test_from_end_and_missing_dir(tmp_path: Path) -> None:
    assert DpLogTail(str(tmp_path / "nope"), job_id="j").poll() == []
    log = tmp_path / "log"
    log.mkdir()
    p = log / "dp_h_1_rank_-1.log"
    p.write_text(_line("Start step will be set to 7."))
    tail = DpLogTail(str(tmp_path), job_id="j", from_start=False)
    assert tail.poll() == []
    with open(p, "a") as f:
        f.write(_line("Start Dynamic Profiler at 7 step."))
    assert [(e.rank, e.event) for e in tail.poll()] == [(-1, "started")]


def test_parse_log_name() -> None:
    f = parse_log_name("dp_my_host_1_99_rank_12.log.1")
    assert f is not None and (f.hostname, f.pid, f.rank) == ("my_host_1", 99, 12)
    assert parse_log_name("monitor_dp_h_1_rank_0.log") is None
    assert parse_log_name("dp_h_1_rank_0.log.2") is None


def test_find_stale_dp_state(tmp_path: Path) -> None:
    shm = tmp_path / "shm"
    proc = tmp_path / "proc"
    shm.mkdir()
    (shm / "DynamicProfileNpuShm2026113010").write_bytes(b"\0")
    (shm / "other").write_bytes(b"\0")
    for pid, comm, ppid in ((100, "DynMonitorProc", 1), (101, "DynMonitorProc", 55), (102, "python", 1)):
        d = proc / str(pid)
        d.mkdir(parents=True)
        (d / "comm").write_text(comm + "\n")
        (d / "stat").write_text(f"{pid} ({comm}) S {ppid} 1 1 0")
        (d / "cmdline").write_bytes(b"python\0train.py\0")
    os.utime(shm / "DynamicProfileNpuShm2026113010", (1000.0, 1000.0))
    st = find_stale_dp_state(str(shm), str(proc), now_unix_s=4600.0)
    assert [b.path.endswith("Shm2026113010") for b in st.shm_blocks] == [True]
    assert st.shm_blocks[0].age_s == 3600.0
    assert sorted((m.pid, m.orphan) for m in st.monitors) == [(100, True), (101, False)]
    assert [m.pid for m in st.orphans] == [100] and st.stale and "orphan" in st.describe()
    assert not find_stale_dp_state(str(tmp_path / "x"), str(tmp_path / "y")).stale


def test_a_line_longer_than_a_read_is_skipped_and_the_tail_goes_on(tmp_path: Path) -> None:
    """Issue 33 #4: a dp log line over MAX_READ_BYTES (a runaway log) stalled the tail for good (the offset never
    moved past it, every poll re-read the same 4 MiB); it is now skipped, counted, and later lines are read."""
    from profwatch.adapters.fs.dp_log_tail import MAX_READ_BYTES

    log = tmp_path / "log"
    log.mkdir()
    r0 = log / "dp_node_a_42_rank_0.log"
    r0.write_bytes(_line("Start step will be set to 7.").encode() + b"x" * (2 * MAX_READ_BYTES + 10) + b"\n"
                   + _line("Start Dynamic Profiler at 7 step.").encode())
    tail = DpLogTail(str(tmp_path), job_id="j1")
    evs = []
    for _ in range(5):  # each poll reads at most MAX_READ_BYTES
        evs += tail.poll()
    assert [(e.event, e.step) for e in evs] == [("arm_seen", None), ("started", 7)]
    assert tail.overlong_lines == 1
