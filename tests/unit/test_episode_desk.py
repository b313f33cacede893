"""EpisodeDesk.start (arming/episode_desk.py) over a real state store: stored episodes with odd rows."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from profwatch.adapters.store.state import StateStore
from profwatch.arming.episode_desk import EpisodeDesk
from profwatch.config import Settings
from profwatch.core.arming.episodes import Episode, JobEpisodes
from profwatch.core.arming.policy import ArmingPolicy
from profwatch.core.detection.types import Anomaly

T0 = 100_000.0


def stored_episode(job: str) -> dict[str, Any]:
    b = JobEpisodes(job, Settings().arming)
    ep, _ = b.observe(Anomaly("step_regression", job, 50, (), 0.3, {"pattern": "cusum", "baseline_s": 1.0}), T0)
    assert ep is not None
    return ep.to_json()


def desk(store: StateStore, jobs: list[str]) -> EpisodeDesk:
    s = Settings()
    return EpisodeDesk(settings=s, store=store, jobs=dict.fromkeys(jobs), detectors=None,  # type: ignore[arg-type]
                       emit=lambda ev: None, arm=lambda *a, **k: {}, in_flight=lambda j: False,
                       topology=lambda j: None, policy=lambda: ArmingPolicy(s.arming))


def test_odd_stored_follow_ranks_drop_the_follow_up_and_an_infinite_rank_only_its_row(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state.db")
    odd = stored_episode("a")
    del odd["follow_spans"]  # a row stored before follow_spans: its follow_ranks list is read
    odd["follow_ranks"] = ["3", 4.5, True, None, -1, 7, 7, 2]
    store.save_episode(odd["episode_id"], "a", True, T0, odd)
    assert Episode.from_json(odd).follow_ranks == (2, 7)
    bad = stored_episode("b")
    store.save_episode(bad["episode_id"], "b", True, T0 + 1, bad)
    store.db.execute("UPDATE episodes SET body = ? WHERE job_id = 'b'",  # a rank the JSON reads as infinity
                     (json.dumps(bad).replace('"ranks": []', '"ranks": [Infinity]'),))
    store.db.commit()
    good = stored_episode("c")
    store.save_episode(good["episode_id"], "c", True, T0 + 2, good)
    d = desk(store, ["a", "b", "c"])
    d.start()  # raised OverflowError: the coordinator could not start
    (resumed,) = d.books["a"].open.values()
    assert set(d.books) == {"a", "c"} and resumed.follow_ranks == (2, 7)


def _captured_in_flight(s: Settings, store: StateStore) -> tuple[Any, JobEpisodes, Episode]:
    """A job-wide change of job ``j`` (generation 0) armed and stored in flight as capture ``c1`` (window planned after
    step 100 at 1 s steps): the capture, the live episode book and its episode."""
    from profwatch.core.capture import lifecycle as lc
    from profwatch.core.capture.planner import CaptureRequest, JobProgress, plan_capture

    plan = plan_capture(CaptureRequest(job_id="j", reason="step_regression", capture_id="c1"),
                        JobProgress(job_id="j", world_size=2, furthest_step=100, step_time_s=1.0, prof_root="/prof",
                                    now_unix_s=T0), s.capture)
    cap = lc.open_capture(plan, world_size=2, profiler_config_path="/cfg", writer="coordinator",
                          rank_steps={0: 100, 1: 100}, rank_step_time_s={}, rank_backends={}, nodes=[], now=T0,
                          settings=lc.LifecycleSettings()).capture
    assert cap.state in lc.IN_FLIGHT and cap.start_step > 100
    store.save_capture(cap)
    live, policy = JobEpisodes("j", s.arming), ArmingPolicy(s.arming)
    first, _ = live.observe(Anomaly("step_regression", "j", 100, (), 0.3,
                                    {"pattern": "cusum", "baseline_s": 1.0, "first_step": 80}), T0)
    picked = live.next_arm(policy, T0, capture_in_flight=False)
    assert first is not None and picked is not None and picked[0] is first
    live.history.record(picked[1], T0, "c1")
    live.armed(first.episode_id, "c1", T0, covered=None, start_step=cap.start_step)
    return cap, live, first


def test_a_capture_in_flight_keeps_its_window_start_across_a_restart(tmp_path: Path) -> None:
    """A job-wide change is captured (window at the planned ``start_step``); the coordinator restarts with the
    capture in flight. A 3x report whose evidence starts before that window is one the capture sees: an update of
    the episode whose captured level is the report's (``JobEpisodes._seen_by_flight``), as without the restart.
    Before, the restarted desk lost the window start (only the episodes were seeded) and took the report for a new
    change of its own (``_new_change``), captured again."""
    s = Settings()
    store = StateStore(tmp_path / "state.db")
    cap, live, first = _captured_in_flight(s, store)
    for ep in (*live.closed, *live.open.values()):
        store.save_episode(ep.episode_id, "j", ep.closed_unix_s is None, ep.updated_unix_s, ep.to_json())
    d = desk(store, ["j"])
    d.start()
    restarted = d.books["j"]
    onset = cap.start_step - 2  # after the episode's last report, before the window
    for b in (live, restarted):
        report = Anomaly("step_regression", "j", cap.start_step - 1, (), 2.0,
                         {"pattern": "cusum", "baseline_s": 1.0, "first_step": onset})
        ep, _ = b.observe(report, T0 + 5)
        assert ep is not None and ep.episode_id == first.episode_id and ep.in_flight == "c1"
        assert [c.level for c in ep.captures] == [ep.level] and len(b.open) == 1
    assert not restarted.resume_flight("c1", start_step=cap.start_step, covered=None)  # resumed once
    store.close()


def test_a_capture_of_an_older_generation_resumes_no_flight_after_a_restart(tmp_path: Path) -> None:
    """A job-wide change is captured in generation 0; the job starts generation 1 while that capture is analysed
    (``supersede_generation`` lets an ``analysing`` one finish: it stays in flight) and its episode closes with the
    generation (``JobEpisodes.new_run`` forgets the capture's flight). The coordinator restarts. A report of the new
    generation whose evidence starts before the old capture's window start (the new run's steps count from 0 again)
    is a change of the new run, not one the old run's capture saw, as without the restart. Before, the restarted
    desk resumed the old capture's flight and took it to cover the new generation's episode."""
    from types import SimpleNamespace

    s = Settings()
    store = StateStore(tmp_path / "state.db")
    cap, live, first = _captured_in_flight(s, store)
    live.new_run(T0 + 10, "new_generation")
    assert first.closed_unix_s is not None
    for ep in (*live.closed, *live.open.values()):
        store.save_episode(ep.episode_id, "j", ep.closed_unix_s is None, ep.updated_unix_s, ep.to_json())
    d = EpisodeDesk(settings=s, store=store, jobs={"j": SimpleNamespace(generation=1)},  # type: ignore[dict-item]
                    detectors=None, emit=lambda ev: None, arm=lambda *a, **k: {},  # type: ignore[arg-type]
                    in_flight=lambda j: False, topology=lambda j: None, policy=lambda: ArmingPolicy(s.arming))
    d.start()
    restarted = d.books["j"]
    for b in (live, restarted):
        report = Anomaly("step_regression", "j", 30, (), 2.0, {"pattern": "cusum", "baseline_s": 1.0, "first_step": 20})
        new, _ = b.observe(report, T0 + 20)
        assert new is not None and new.episode_id != first.episode_id
        assert new.captures == [] and new.in_flight is None, new.captures  # not the old run's capture
    store.close()
