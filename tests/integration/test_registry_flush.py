"""The registry's rows in the state store (a real coordinator object, its real SQLite store): the frequent flush
writes only the records whose identity changed; the per-step fields reach the store at the slow full flush and on
shutdown, and a restart restores them (the 2 s flush once upserted every rank row, linear in ranks)."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

from profwatch.config import load_settings
from profwatch.coordinator import Coordinator
from profwatch.core.alerts.event_types import TYPE_JOB_ENDED
from rankhook import wire
from tests.integration.live_stack import free_port, loopback_coordinator


def _coordinator(root: Path) -> Coordinator:
    ports = {k: free_port() for k in ("ingest", "control", "pub")}
    return Coordinator(load_settings(None, coordinator=loopback_coordinator(root, ports)))


def _rows(root: Path) -> dict[int, tuple[int, int]]:
    """rank -> (last_step, left) as stored."""
    with closing(sqlite3.connect(root / "state.db")) as db:
        return {r: (s, left) for r, s, left in db.execute("SELECT rank, last_step, left FROM ranks")}


def _ended_job(coord: Coordinator) -> Any:
    """Job ``j`` (2 ranks on node n0) reports steps 1-10 at t=2 s, then stays silent past ``job_end_after_s``: the
    coordinator's tick ends it. Returns the job's registry record."""
    reg = coord.registry
    reg.touch_node("n0", "h0", 1.0)
    for r in range(2):
        reg.hello(wire.RankHello(job_id="j", rank=r, local_rank=r, world_size=2, hostname="h0", pid=100 + r,
                                 backend="torch", ts_unix_s=1.0), "n0", 1.0)
    job = reg.jobs["j"]
    for s in range(1, 11):
        reg.step_run(job, [wire.StepReport("j", r, s, 0.1, 2.0) for r in range(2)], 0, 2.0, "n0", [])
    coord._next_observe = 0.0
    coord._tick_jobs_and_sinks(2.0 + coord.settings.coordinator.job_end_after_s + 1)  # silent: ended
    return job


def test_frequent_flush_writes_identity_changes_and_the_full_flush_the_step_fields(tmp_path: Path) -> None:
    coord = _coordinator(tmp_path)
    try:
        reg = coord.registry
        reg.touch_node("n0", "h0", 1.0)
        for r in range(3):
            reg.hello(wire.RankHello(job_id="j", rank=r, local_rank=r, world_size=3, hostname="h0", pid=100 + r,
                                     backend="torch", ts_unix_s=1.0), "n0", 1.0)
        coord._flush_registry(full=False)
        assert _rows(tmp_path) == {0: (-1, 0), 1: (-1, 0), 2: (-1, 0)}
        job = reg.jobs["j"]
        for s in range(1, 21):
            reg.step_run(job, [wire.StepReport("j", r, s, 0.1, 2.0) for r in range(3)], 0, 2.0, "n0", [])
        coord._flush_registry(full=False)
        assert _rows(tmp_path) == {0: (-1, 0), 1: (-1, 0), 2: (-1, 0)}  # steps alone: nothing written
        reg.bye(wire.RankBye(job_id="j", rank=1, step=20, ts_unix_s=3.0), 3.0, "n0")
        coord._flush_registry(full=False)
        assert _rows(tmp_path) == {0: (-1, 0), 1: (20, 1), 2: (-1, 0)}  # the bye, with that rank's fields
        coord._flush_registry(full=True)
        assert _rows(tmp_path) == {0: (20, 0), 1: (20, 1), 2: (20, 0)}
        for s in range(21, 31):
            reg.step_run(job, [wire.StepReport("j", r, s, 0.1, 4.0) for r in (0, 2)], 0, 4.0, "n0", [])
    finally:
        coord.close()  # shutdown writes everything
    assert _rows(tmp_path) == {0: (30, 0), 1: (20, 1), 2: (30, 0)}
    again = _coordinator(tmp_path)
    try:
        job = again.registry.jobs["j"]
        assert {r.rank: r.last_step for r in job.ranks.values()} == {0: 30, 1: 20, 2: 30}
        assert job.last_heard_unix_s() == 4.0 and job.furthest_step() == 30
    finally:
        again.close()


def test_a_job_ended_before_a_restart_opens_a_new_generation_when_it_reports_again(tmp_path: Path) -> None:
    """A report after a job's end opens a new generation (``resumed_after_end``), with or without a coordinator
    restart in between: the restart restores the job's end from the stored ``job_ended`` event, so the ended
    generation is never made live again (no same-generation revival: ``docs/alerts.md``, "Ended jobs")."""
    coord = _coordinator(tmp_path)
    try:
        job = _ended_job(coord)
        assert coord._ended.ended("j", 0) and job.ended_unix_s is not None
    finally:
        coord.close()
    again = _coordinator(tmp_path)
    try:
        job = again.registry.jobs["j"]
        assert again._ended.ended("j", 0) and job.generation == 0
        assert job.ended_unix_s is not None  # the end is restored, not only the alert book's memory of it
        now = 5000.0
        again._ingest_steps([wire.StepReport("j", 0, 11, 0.1, now)], 0, "n0", now)
        assert job.generation == 1 and again._ended.ended("j", 0) and not again._ended.ended("j", 1)
        again._next_observe = 0.0
        again._tick_jobs_and_sinks(now)
        assert again._ended.ended("j", 0)  # the ended generation stays ended: its late verdicts never page
    finally:
        again.close()


def test_a_restart_does_not_report_an_ended_generation_again(tmp_path: Path) -> None:
    """A job that ended before a restart is not reported ended again after it, even when the restart restores an
    older last report time (a crash restores the last full flush's fields, so the silence gets another event id)."""
    coord = _coordinator(tmp_path)
    try:
        _ended_job(coord)
    finally:
        coord.close()
    again = _coordinator(tmp_path)
    try:
        assert len(list(again.state.iter_events((TYPE_JOB_ENDED,)))) == 1
        again.registry.jobs["j"].heard_unix_s = 1.5  # as restored after a crash: an older last report time
        again._next_observe = 0.0
        again._tick_jobs_and_sinks(5000.0)
        assert len(list(again.state.iter_events((TYPE_JOB_ENDED,)))) == 1
    finally:
        again.close()
