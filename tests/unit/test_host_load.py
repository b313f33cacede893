"""Host CPU load per node, and a job-wide move it explains (daemon/profwatch/core/fleet/host_load.py, the node's
sampler daemon/profwatch/adapters/host_load.py, and ``explained_by_host_load`` in core/arming/episodes.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from profwatch.adapters.host_load import HostLoadSampler
from profwatch.core.arming.episodes import Episode, JobEpisodes
from profwatch.core.arming.policy import ArmingPolicy, ArmingSettings
from profwatch.core.detection.types import Anomaly
from profwatch.core.fleet.host_load import (
    BUCKET_S,
    SERIES_BUCKETS,
    HostLoadSeries,
    LoadExplanation,
    explain_job_change,
    parse_procs_running,
    parse_psi_some_avg10,
)
from profwatch.core.messages import parse_node_message

T0 = 100_000.0
PSI = "some avg10=93.35 avg60=42.11 avg300=14.09 total=46753305706\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"


def test_parsers_read_the_kernel_formats_and_refuse_what_is_not_there() -> None:
    assert parse_psi_some_avg10(PSI) == pytest.approx(93.35)
    assert parse_psi_some_avg10("") is None
    assert parse_psi_some_avg10("some avg10=abc avg60=1") is None
    assert parse_psi_some_avg10("some avg10=250.0") is None  # a share is at most 100 %
    assert parse_procs_running("cpu  1 2 3\nprocs_running 5\nprocs_blocked 0\n") == 5
    assert parse_procs_running("procs_running x\n") is None
    assert parse_procs_running("cpu 1 2\n") is None


def _series(levels: list[tuple[float, float, float]], psi: float = -1.0) -> HostLoadSeries:
    """A node's series: for each ``(from_s, to_s, runnable_per_core)`` one heartbeat every 2 s."""
    s = HostLoadSeries()
    for a, b, r in levels:
        t = a
        while t < b:
            s.add(t, r, psi)
            t += 2.0
    return s


def test_the_series_is_bounded_and_averages_heartbeats_into_buckets() -> None:
    s = _series([(T0, T0 + 3 * 3600, 1.0)])
    assert len(s.t) == SERIES_BUCKETS  # three hours of heartbeats: 30 minutes of buckets kept
    assert s.t[-1] - s.t[0] == pytest.approx((SERIES_BUCKETS - 1) * BUCKET_S)
    s2 = HostLoadSeries()
    for i, r in enumerate((1.0, 2.0, 3.0)):
        s2.add(T0 + i, r, -1.0)
    assert len(s2.t) == 1 and s2.runnable[0] == pytest.approx(2.0) and math.isnan(s2.psi[0])
    assert s2.view() == {"runnable_per_core": 2.0, "cpu_psi_some_pct": None, "psi_available": False, "samples": 3,
                         "heartbeat_gap_s": 1.0, "too_sparse_to_explain": False}
    s2.add(T0 - 100, 9.0, 50.0)  # a clock stepped back: dropped
    s2.add(T0 + 20, -1.0, 50.0)  # not measured (an older node daemon): ignored
    assert len(s2.t) == 1 and s2.samples == 3


def _explain(levels: list[tuple[float, float, float]], magnitude: float, psi: float = -1.0) -> LoadExplanation | None:
    return explain_job_change([("n0", _series(levels, psi))], opened_s=T0 + 1200, now_s=T0 + 1500, magnitude=magnitude)


def test_a_job_wide_move_that_the_run_queue_predicts_is_explained() -> None:
    # 1 runnable task per core for 20 minutes, then 2: a CPU-bound job gets half the CPU, twice the time
    ev = _explain([(T0, T0 + 1100, 1.0), (T0 + 1100, T0 + 1500, 2.0)], magnitude=0.9, psi=95.0)
    assert ev is not None and ev.explained
    assert ev.predicted == pytest.approx(2.0) and ev.observed == pytest.approx(1.9)
    assert ev.to_json()["cpu_psi_some_pct_after"] == 95.0
    # the same load move, a job 2.5x slower: 25 % more than the load explains
    ev = _explain([(T0, T0 + 1100, 1.0), (T0 + 1100, T0 + 1500, 2.0)], magnitude=1.5)
    assert ev is not None and not ev.explained


def test_a_move_without_a_load_move_is_not_explained_and_an_idle_host_predicts_nothing() -> None:
    # the load stays: a +30 % job (a slow rank in lockstep) is the job's own
    ev = _explain([(T0, T0 + 1500, 1.5)], magnitude=0.3)
    assert ev is not None and not ev.explained and ev.predicted == pytest.approx(1.0)
    # under one runnable task per core the job has its CPUs: 0.2 -> 0.9 predicts no slowdown
    ev = _explain([(T0, T0 + 1100, 0.2), (T0 + 1100, T0 + 1500, 0.9)], magnitude=0.3)
    assert ev is not None and not ev.explained and ev.predicted == pytest.approx(1.0)


def test_too_little_data_or_a_bad_magnitude_says_nothing() -> None:
    assert _explain([(T0 + 1050, T0 + 1500, 2.0)], magnitude=0.5) is None  # 30 s of load before the change
    assert _explain([(T0, T0 + 1100, 1.0)], magnitude=0.5) is None  # no heartbeat since (the node is down)
    assert _explain([(T0, T0 + 1500, 1.0)], magnitude=math.nan) is None
    assert explain_job_change([], opened_s=T0, now_s=T0 + 10, magnitude=0.5) is None


def test_the_worst_node_of_the_job_is_the_evidence() -> None:
    calm = _series([(T0, T0 + 1500, 1.0)])
    busy = _series([(T0, T0 + 1100, 1.0), (T0 + 1100, T0 + 1500, 3.0)])
    ev = explain_job_change([("a", calm), ("b", busy)], opened_s=T0 + 1200, now_s=T0 + 1500, magnitude=1.0)
    assert ev is not None and ev.node_id == "b" and ev.explained


def _reg(step: int, base: float, reached: float, ranks: tuple[int, ...] = ()) -> Anomaly:
    kind = "rank_outlier" if ranks else "step_regression"
    return Anomaly(kind, "j", step, ranks, reached / base - 1.0,
                   {"pattern": "cusum", "baseline_s": base, "step_time_s": reached, "first_step": step - 20})


def test_an_episode_the_host_load_explains_waits_and_is_captured_once_it_no_longer_does() -> None:
    settings = ArmingSettings(cooldown_s=900, min_arm_gap_s=60)
    b, p = JobEpisodes("j", settings), ArmingPolicy(settings)
    ep, _ = b.observe(_reg(400, 1.0, 1.8), T0)
    assert ep is not None
    explained = LoadExplanation("n0", 1.0, 2.0, 2.0, 1.8, 90.0, 95.0, True)
    assert b.next_arm(p, T0, capture_in_flight=False, host_load=lambda e: explained) is None
    assert ep.waiting == "explained_by_host_load" and b.load_explained == 1
    assert b.load_evidence[ep.episode_id]["predicted_ratio"] == 2.0
    b.next_arm(p, T0 + 1, capture_in_flight=False, host_load=lambda e: explained)
    assert b.load_explained == 1  # counted once while it waits
    # the load went back but the job stayed slow: captured
    gone = LoadExplanation("n0", 1.0, 1.0, 1.0, 1.8, 90.0, 90.0, False)
    picked = b.next_arm(p, T0 + 30, capture_in_flight=False, host_load=lambda e: gone)
    assert picked is not None and picked[0] is ep and picked[1].action == "arm"
    # without host-load data (None, or an older coordinator's call) the episode is judged as before
    b2 = JobEpisodes("j", settings)
    ep2, _ = b2.observe(_reg(400, 1.0, 1.8), T0)
    picked = b2.next_arm(p, T0, capture_in_flight=False, host_load=lambda e: None)
    assert picked is not None and picked[0] is ep2


def test_host_load_never_explains_an_episode_that_names_ranks() -> None:
    settings = ArmingSettings(cooldown_s=900, min_arm_gap_s=60)
    b, p = JobEpisodes("j", settings), ArmingPolicy(settings)
    ep, _ = b.observe(_reg(400, 1.0, 1.3, ranks=(1,)), T0)
    explained = LoadExplanation("n0", 1.0, 2.0, 2.0, 1.3, None, None, True)
    picked = b.next_arm(p, T0, capture_in_flight=False, host_load=lambda e: explained)
    assert ep is not None and picked is not None and picked[0] is ep
    assert isinstance(picked[0], Episode) and b.load_explained == 0


def test_the_sampler_reads_proc_and_degrades_when_psi_is_absent(tmp_path: Path) -> None:
    (tmp_path / "stat").write_text("cpu  1 2 3\nprocs_running 5\n")
    (tmp_path / "pressure").mkdir()
    (tmp_path / "pressure" / "cpu").write_text(PSI)
    s = HostLoadSampler(tmp_path, cores=2)
    s.sample()
    (tmp_path / "stat").write_text("cpu  1 2 3\nprocs_running 3\n")
    s.sample()
    assert s.pending == 2
    runnable, psi = s.take()
    assert runnable == pytest.approx(((5 - 1) + (3 - 1)) / 2 / 2)  # less the sampler itself, per core
    assert psi == pytest.approx(93.35) and s.psi_available
    assert s.take() == (-1.0, -1.0)  # nothing since the last heartbeat
    # a kernel without PSI (before 4.20, or psi=0): the run queue alone, PSI reads as not measured
    (tmp_path / "pressure" / "cpu").unlink()
    s.sample()
    runnable, psi = s.take()
    assert runnable == pytest.approx(1.0) and psi == -1.0 and s.psi_available is False
    # nothing readable at all: both not measured, and the sampler keeps going
    bare = HostLoadSampler(tmp_path / "absent", cores=2)
    bare.sample()
    assert bare.take() == (-1.0, -1.0) and bare.stat_available is False



def test_a_heartbeat_with_an_absurd_host_load_is_kept_without_it() -> None:
    """A node saying PSI 250 % (or a run queue of 1e9 per core) loses that figure only, with one counted
    ``bad_value``: its heartbeat (liveness, counters, ``stopping``) still counts, and a good figure beside the bad
    one is kept. Before, the whole heartbeat was refused: every heartbeat of such a node."""
    hb = {"kind": "node_heartbeat", "v": 2, "node_id": "n0", "hostname": "h0", "pid": 7, "ts_unix_s": 1.7e9,
          "started_unix_s": 1.7e9, "counters": {"relayed": 5}, "stopping": True}
    env, msgs, bad = parse_node_message(json.dumps({**hb, "runnable_per_core": 2.0,
                                                    "cpu_psi_some_pct": 250.0}).encode())
    assert msgs == [] and [b.reason for b in bad] == ["bad_value"] and "cpu_psi_some_pct=250" in bad[0].detail
    assert env.kind == "node_heartbeat" and env.counters == {"relayed": 5} and env.stopping is True
    assert env.runnable_per_core == 2.0 and env.cpu_psi_some_pct == -1.0
    env, _, bad = parse_node_message(json.dumps({**hb, "runnable_per_core": 1e9, "cpu_psi_some_pct": 3.0}).encode())
    assert len(bad) == 1 and env.runnable_per_core == -1.0 and env.cpu_psi_some_pct == 3.0
    env, _, bad = parse_node_message(json.dumps({**hb, "runnable_per_core": 0.5, "cpu_psi_some_pct": 3.0}).encode())
    assert bad == [] and (env.runnable_per_core, env.cpu_psi_some_pct) == (0.5, 3.0)


def test_heartbeats_too_far_apart_to_explain_anything_are_said_in_status_not_silent() -> None:
    """``[node] heartbeat_interval_s`` of 30 s leaves fewer than MIN_BUCKETS after a move: host load then never
    explains a job's move, and before, nothing said so."""
    from profwatch.core.fleet.host_load import MAX_EXPLAIN_GAP_S
    from profwatch.core.status_text import _host_load_line

    sparse, dense = HostLoadSeries(), HostLoadSeries()
    for i in range(60):
        t = T0 + 30.0 * i
        sparse.add(t, 1.0 if t < T0 + 900 else 3.0, -1.0)
    for i in range(900):
        t = T0 + 2.0 * i
        dense.add(t, 1.0 if t < T0 + 900 else 3.0, -1.0)
    # at 30 s apart, 2 of every 3 judgement times see only 2 heartbeats after the move: no explanation
    phases = [explain_job_change([("n1", sparse)], opened_s=T0 + 960, now_s=T0 + 1_020 + k, magnitude=2.0)
              for k in range(30)]
    assert sum(p is None for p in phases) >= 15
    assert all(explain_job_change([("n1", dense)], opened_s=T0 + 960, now_s=T0 + 1_020 + k, magnitude=2.0)
               is not None for k in range(30))
    assert sparse.view()["too_sparse_to_explain"] and sparse.view()["heartbeat_gap_s"] == 30.0
    assert not dense.view()["too_sparse_to_explain"]
    line = _host_load_line(sparse.view())
    assert "heartbeats 30.0 s apart: too few to explain" in line and f"at most {MAX_EXPLAIN_GAP_S:.0f} s" in line
    assert "too few" not in _host_load_line(dense.view())


def test_one_late_heartbeat_does_not_make_a_node_too_sparse() -> None:
    """The heartbeat interval is the median of the newest gaps: a heartbeat 40 s late among 2 s ones is no "too
    sparse" warning (the newest gap alone said so until the next heartbeat came)."""
    s = HostLoadSeries()
    for t in (0.0, 2.0, 4.0, 6.0, 46.0):
        s.add(T0 + t, 1.0, -1.0)
    assert s.view()["heartbeat_gap_s"] == 2.0 and not s.view()["too_sparse_to_explain"]
    for t in (76.0, 106.0, 136.0):
        s.add(T0 + t, 1.0, -1.0)
    assert s.view()["too_sparse_to_explain"]
