"""profwatch against the REAL torch_npu dynamic-profile monitor (torch-npu 2.13.0 from PyPI, see conftest.py).

Real, unmodified upstream files (``real_torch_npu.MONITOR_FILES`` and every other file of
``torch_npu/profiler``, ``torch_npu/utils``, ``torch_npu/_init`` they import): ``dynamic_profile.py`` (init /
step / start rules), ``_dynamic_profiler/*`` (the forked monitor process, shared memory, config parsing, log
files), ``profiler.py`` / ``profiler_interface.py`` / ``scheduler.py`` / ``_profiler_action_controller.py``
(the profiler object's start/step/stop state machine, ``profiler_info_{rank}.json`` and
``profiler_metadata.json``), ``_profiler_path_creator.py`` (rank dir names) and the async online parse
(``analysis/*``: ``ascend_pytorch_profiler_{rank}.db``, ``analyse.done``).
Stand-ins (``real_torch_npu.STANDINS``): ``torch_npu._C`` (the native profiler calls, which log when they are
called), ``torch_npu.npu`` (stream, synchronize, Event, ``mstx``) and two package initialisers.

Driven by profwatch's own pieces: the planner (``plan_capture``), the ``ConfigWriter`` on the coordinator side
(in this process) and on the node side (a real ``NodeDaemon`` receiving ``write_config``), ``rankhook`` with its
torch_npu backend in every rank, the node's dp log tailer, and the acknowledgements as the coordinator receives
them (validated by ``parse_node_message``).
"""

from __future__ import annotations

import json
import os
import time

import pytest

from profwatch.adapters.fs.config_writer import ConfigWriter
from profwatch.adapters.fs.rank_dir_fs import scan_tree
from profwatch.core.batches.prof_layout import parse_profiler_info
from profwatch.core.capture.planner import ProfilerConfig
from profwatch.core.capture.profiler_config import idle_config
from tests.conformance.helpers import (
    assert_dp_log_parsed,
    dp_acks,
    hook_events,
    plan,
    rank_dir_of,
    recorded_steps,
    wait_hook_events,
    wait_stopped,
    window_end,
)
from tests.conftest import wait_for

ALL4 = [0, 1, 2, 3]


def test_prewritten_config_is_ignored_and_an_armed_window_starts_at_start_step_on_every_rank(npu_job, tmp_path) -> None:
    pre_prof = tmp_path / "pre-prof"
    writer = ConfigWriter()
    # a config that exists before the job starts (a previous job's arm, or a hand-written one)
    job = None
    cfg_root = tmp_path / "j0" / "cfg"
    (cfg_root / "job1").mkdir(parents=True)
    pre = ProfilerConfig(start_step=15, prof_dir=str(pre_prof)).render()
    writer.write(str(cfg_root / "job1"), pre, not_before_unix_s=0, allowed_roots=[str(cfg_root)])
    time.sleep(1.1)  # the ranks start in a later second than the file's mtime
    job = npu_job(world=4)
    job.wait_steps(20, 180)
    # real monitor: the creator rank takes the file's mtime as its baseline and the ranks' init time is newer:
    # never loaded, never armed (docs/torch_npu-dynamic-profile.md#mtime-rules)
    assert not any("load json success" in ln for ln in job.monitor_log()), job.monitor_log()
    for r in ALL4:
        assert not job.dp_lines_with(r, "Start step will be set"), job.dp_log(r)
    assert not pre_prof.exists()
    # profwatch agrees: the backend saw no arm and no capture, the node relayed no acknowledgement
    assert not job.coord.captures(), job.coord.captures()

    p = plan(job)
    res = writer.write(str(job.cfg), p.config.render(), not_before_unix_s=job.not_before(),
                       allowed_roots=[str(cfg_root)])
    end = window_end(p)
    wait_stopped(job, end, ALL4)
    started = wait_hook_events(job, "started", p.capture_id, ALL4)
    completed = wait_hook_events(job, "completed", p.capture_id, ALL4)
    armed_steps = list(range(p.start_step + p.warmup, end))
    for r in ALL4:
        # the real monitor started and stopped the window at the armed steps on every rank ...
        assert job.dp_lines_with(r, f"Start step will be set to {p.start_step}."), job.dp_log(r)
        assert job.dp_lines_with(r, f"Start Dynamic Profiler at {p.start_step} step."), job.dp_log(r)
        rd = rank_dir_of(job, p.prof_dir, r)
        # ... and the real profiler object recorded exactly the active steps
        assert recorded_steps(rd, job.steps_log(r)) == armed_steps
        info = json.loads((rd / f"profiler_info_{r}.json").read_text())
        # torch_npu writes rank_id as the RANK environment string; profwatch's reader takes both
        assert info["rank_id"] == str(r) and parse_profiler_info(info).rank_id == r
        assert info["torch_npu_version"] == job.tree.version
        meta = json.loads((rd / "profiler_metadata.json").read_text())
        assert meta["profwatch_capture_id"] == p.capture_id and meta["profwatch_job_id"] == job.job_id
        assert (rd / "ASCEND_PROFILER_OUTPUT" / "analyse.done").exists()
        assert (rd / "ASCEND_PROFILER_OUTPUT" / f"ascend_pytorch_profiler_{r}.db").exists()
        # ... which is what rankhook's backend predicted and reported
        ev = started[r][0]
        assert ev.step == p.start_step and ev.generation is not None and ev.generation >= res.mtime_s - 1
        assert ev.rank_dir == str(rd)
        assert completed[r][0].steps == tuple(armed_steps) and completed[r][0].rank_dir == str(rd)
    # the node's dp log acknowledgements say the same
    wait_for(lambda: set(dp_acks(job, "completed")) >= set(ALL4), 30, what="dp log completed acks")
    for r in ALL4:
        assert p.start_step in {e.start_step for e in dp_acks(job, "arm_seen")[r]}
        assert [(e.start_step, e.step) for e in dp_acks(job, "started")[r]] == [(p.start_step, p.start_step)]
        assert [e.step for e in dp_acks(job, "completed")[r]] == [end]
    assert_dp_log_parsed(job)
    assert not job.coord.rejected
    # profwatch reads what the real parse wrote without crashing: framework-only DBs (no CANN data on a CPU host)
    # are named as such, and gloo gives no parallel_group_info, so the world size must come from elsewhere
    (batch,) = scan_tree(p.prof_dir)
    assert batch.capture_id == p.capture_id and sorted(batch.ranks) == ALL4
    assert any("world size unknown" in pr.reason for pr in batch.problems)
    (batch,) = scan_tree(p.prof_dir, world_size=4)
    assert batch.status == "incomplete" and batch.expected_ranks == ALL4
    assert all(s.state == "failed" and "missing tables" in s.reasons[0] for s in batch.ranks.values()), batch.to_json()
    for bad in ("rank ?", "rank None", "missing ranks []"):
        assert bad not in batch.describe()


def test_two_writes_within_one_second_are_both_seen_node_side_writer(npu_job) -> None:
    job = npu_job(world=2)
    job.wait_steps(14, 180)
    p2 = plan(job, in_steps=40)  # both writes take their turn at a fresh mtime second first (about 2-4 s)
    p1 = plan(job, start_step=p2.start_step + 400)  # a far arm, replaced by the second write before it is due
    # the coordinator sends both commands within a millisecond; the node's ConfigWriter must make both visible
    c1 = job.coord.write_config(job.node_id, job.cfg, p1.config.render(), job.not_before())
    c2 = job.coord.write_config(job.node_id, job.cfg, p2.config.render(), job.not_before())
    a1 = wait_for(lambda: job.coord.ack(c1), 30, what="ack of write 1")
    a2 = wait_for(lambda: job.coord.ack(c2), 30, what="ack of write 2")
    assert a1.ok and a2.ok, (a1, a2)
    end = window_end(p2)
    wait_stopped(job, end, [0, 1])
    for r in (0, 1):
        # the real monitor delivered both generations to every rank
        assert job.dp_lines_with(r, f"Start step will be set to {p1.start_step}."), job.dp_log(r)
        assert job.dp_lines_with(r, f"Start step will be set to {p2.start_step}."), job.dp_log(r)
        assert job.dp_lines_with(r, f"Start Dynamic Profiler at {p2.start_step} step."), job.dp_log(r)
        assert not job.dp_lines_with(r, f"Start Dynamic Profiler at {p1.start_step} step.")
    assert a2.result["mtime_s"] > a1.result["mtime_s"]
    # rankhook's backend saw both generations and predicted the window of the second
    wait_hook_events(job, "arm_seen", p1.capture_id, [0, 1])
    wait_hook_events(job, "started", p2.capture_id, [0, 1])
    assert not hook_events(job, "started", p1.capture_id)
    assert_dp_log_parsed(job)


def test_writes_after_a_config_with_a_past_or_future_mtime_are_seen(npu_job) -> None:
    job = npu_job(world=2)
    job.wait_steps(14, 180)
    writer = ConfigWriter()  # the coordinator-side writer
    roots = [str(job.root / "cfg")]
    cfg_file = job.cfg / "profiler_config.json"

    def loads() -> int:
        return sum("load json success" in ln for ln in job.monitor_log())

    # 1. someone copies an old config in with its mtime preserved (cp -p, rsync -t): the real monitor loads it,
    # the ranks drop it silently (mtime not newer than what they accepted)
    n = loads()
    old = ProfilerConfig(start_step=max(job.progress()) + 6, prof_dir=str(job.prof / "old")).render()
    cfg_file.write_text(json.dumps(old, indent=4))
    past = time.time() - 3600
    os.utime(cfg_file, (past, past))
    wait_for(lambda: loads() > n, 30, what="monitor reloads the past-mtime config")
    pa = plan(job)
    writer.write(str(job.cfg), pa.config.render(), not_before_unix_s=job.not_before(), allowed_roots=roots)
    wait_stopped(job, window_end(pa), [0, 1])
    for r in (0, 1):
        assert not job.dp_lines_with(r, f"Start step will be set to {old['start_step']}."), job.dp_log(r)
        assert job.dp_lines_with(r, f"Start Dynamic Profiler at {pa.start_step} step."), job.dp_log(r)
    wait_hook_events(job, "started", pa.capture_id, [0, 1])
    assert not (job.prof / "old").exists()

    # 2. someone sets the mtime an hour ahead (touch -d, a skewed NFS server): the real monitor loads it and the
    # ranks accept it, so they ignore any later edit whose mtime is not beyond it
    n = loads()
    future = time.time() + 3600
    os.utime(cfg_file, (future, future))
    wait_for(lambda: loads() > n, 30, what="monitor reloads the future-mtime config")
    job.wait_steps(window_end(pa) + 4, 60)
    pb = plan(job)
    writer.write(str(job.cfg), pb.config.render(), not_before_unix_s=job.not_before(), allowed_roots=roots)
    wait_stopped(job, window_end(pb), [0, 1])
    for r in (0, 1):
        assert job.dp_lines_with(r, f"Start Dynamic Profiler at {pb.start_step} step."), job.dp_log(r)
    wait_hook_events(job, "started", pb.capture_id, [0, 1])

    # 3. the same after a writer restart (a new ConfigWriter knows only the file)
    pc = plan(job)
    ConfigWriter().write(str(job.cfg), pc.config.render(), not_before_unix_s=job.not_before(), allowed_roots=roots)
    wait_stopped(job, window_end(pc), [0, 1])
    for r in (0, 1):
        assert job.dp_lines_with(r, f"Start Dynamic Profiler at {pc.start_step} step."), job.dp_log(r)
    wait_hook_events(job, "started", pc.capture_id, [0, 1])
    assert_dp_log_parsed(job)


@pytest.mark.parametrize("fake", [False, True], ids=["real-monitor-coordinator-writer", "fake-monitor-node-writer"])
def test_the_idle_config_of_a_cancel_drops_the_waiting_arm_on_every_rank(npu_job, fake: bool) -> None:
    job = npu_job(world=2, fake=fake)
    job.wait_steps(14, 180)
    p = plan(job, in_steps=80)  # 20 s ahead: the idle config lands long before
    idle = idle_config(f"capture {p.capture_id} cancelled")
    if fake:  # the node daemon's writer, answering write_config commands as profwatch cancel sends them
        arm_cmd = job.coord.write_config(job.node_id, job.cfg, p.config.render(), job.not_before())
        assert wait_for(lambda: job.coord.ack(arm_cmd), 30, what="arm written").ok
    else:  # the coordinator-side writer
        writer, roots = ConfigWriter(), [str(job.root / "cfg")]
        writer.write(str(job.cfg), p.config.render(), not_before_unix_s=job.not_before(), allowed_roots=roots)
    wait_hook_events(job, "arm_seen", p.capture_id, [0, 1])
    for r in (0, 1):
        wait_for(lambda r=r: job.dp_lines_with(r, f"Start step will be set to {p.start_step}."), 60,
                 what=f"rank {r} took the arm")
    if fake:
        refused = job.coord.write_config(job.node_id, job.cfg, idle, job.not_before())  # not marked idle
        assert "never fires" in wait_for(lambda: job.coord.ack(refused), 30, what="refusal").detail
        other = job.coord.write_config(job.node_id, job.cfg, idle, job.not_before(), idle_for="c-someone-else")
        assert "holds capture" in wait_for(lambda: job.coord.ack(other), 30, what="skip").result["skipped"]
        idle_cmd = job.coord.write_config(job.node_id, job.cfg, idle, job.not_before(), idle_for=p.capture_id)
        done = wait_for(lambda: job.coord.ack(idle_cmd), 30, what="idle written")
        assert done.ok and "skipped" not in done.result and done.result["mtime_s"] > 0
    else:
        writer.write(str(job.cfg), idle, not_before_unix_s=job.not_before(), allowed_roots=roots,
                     idle_for=p.capture_id)
    for r in (0, 1):  # the monitor delivered the idle config to every rank ...
        wait_for(lambda r=r: job.dp_lines_with(r, "Start step will be set to 0."), 60, what=f"rank {r} idle")
    assert max(job.progress()) < p.start_step, "the idle config came too late to test anything"
    job.wait_steps(window_end(p) + 3, 120)
    job.check_alive()
    for r in (0, 1):  # ... which replaced the waiting arm: its start step passed and nothing started
        assert not job.dp_lines_with(r, "Start Dynamic Profiler at"), job.dp_log(r)
    assert "Dynamic Profiler config is not effective. The start_step=0" in job.stdout(0)
    assert not job.rank_dirs(p.prof_dir)
    # rankhook's mirror agrees: it reported the idle config as rejected and never marked a step as captured
    wait_hook_events(job, "arm_rejected", None, [0, 1])
    assert not hook_events(job, "started", p.capture_id) and not hook_events(job, "started")
    job.coord.pump()
    steps = [m for m in job.coord.rank_messages if m.kind == "step"]  # a wire.StepReport or its plain-path struct
    assert {m.rank for m in steps if m.step > window_end(p)} == {0, 1}
    assert not [m for m in steps if m.capturing], "the mirror still ran the cancelled window"


def test_rank_list_captures_only_listed_ranks_and_keeps_the_async_parse(npu_job) -> None:
    job = npu_job(world=4)
    job.wait_steps(14, 180)
    p = plan(job, rank_list=[1, 3])
    assert p.config.is_rank and p.config.analyse and p.config.async_mode
    ConfigWriter().write(str(job.cfg), p.config.render(), not_before_unix_s=job.not_before(),
                         allowed_roots=[str(job.root / "cfg")])
    end = window_end(p)
    wait_stopped(job, end, [1, 3])
    job.wait_steps(end + 3, 60)
    for r in (0, 2):
        assert job.dp_lines_with(r, f"Rank {r} not in valid rank_list {{1, 3}}!"), job.dp_log(r)
        assert not job.dp_lines_with(r, "Start Dynamic Profiler")
    for r in (1, 3):
        assert not job.dp_lines_with(r, "analyse will be closed"), job.dp_log(r)
        done = rank_dir_of(job, p.prof_dir, r) / "ASCEND_PROFILER_OUTPUT" / "analyse.done"
        wait_for(done.exists, 60, what=f"online parse of rank {r}")
    assert len(job.rank_dirs(p.prof_dir)) == 2
    # rankhook's backend: only ranks 1 and 3 capture; 0 and 2 report that the arm excludes them
    completed = wait_hook_events(job, "completed", p.capture_id, [1, 3])
    assert set(completed) == {1, 3}
    rejected = wait_hook_events(job, "arm_rejected", p.capture_id, [0, 2])
    assert all("rank_list" in rejected[r][0].detail for r in (0, 2))
    assert not hook_events(job, "started", p.capture_id).keys() - {1, 3}
    # the node's dp log acknowledgements too
    wait_for(lambda: set(dp_acks(job, "arm_rejected")) >= {0, 2}, 30, what="dp log rank_list rejections")
    assert set(dp_acks(job, "started")) == {1, 3}
    assert_dp_log_parsed(job)
