"""``profwatch status`` text: every rank has a state, figures name their window, no node names the cause."""

from __future__ import annotations

from profwatch.core.status_text import SILENT_MIN_S, rank_state, render_capture, render_nodes, render_status


def _rank(rank: int, **kw: object) -> dict[str, object]:
    base: dict[str, object] = {"rank": rank, "hostname": "h1", "last_step": 120, "step_time_s": 0.41,
                               "median_step_time_s": 0.4, "age_s": 0.3, "capturing": False, "left": False}
    base.update(kw)
    return base


def _snap(**kw: object) -> dict[str, object]:
    job = {"job_id": "j1", "world_size": 2, "ranks_seen": 2, "backend": "torch", "furthest_step": 120,
           "median_step_time_s": 0.4, "median_steps": 20, "rank_drops": 0, "ranks": [_rank(0), _rank(1)]}
    snap: dict[str, object] = {"jobs": [job], "nodes": [{"node_id": "n1", "age_s": 0.5, "lost_batches": 0,
                                                         "down": False, "counters": {"received": 9}}],
                               "captures": [], "counters": {"received": 9, "rejected": 0, "lost_batches": 0},
                               "ingest_bind": "tcp://10.0.0.5:17711"}
    snap.update(kw)
    return snap


def test_every_live_rank_has_a_state() -> None:
    assert rank_state(_rank(0), 0.4) == "running"
    assert rank_state(_rank(0, capturing=True), 0.4) == "capturing"
    assert rank_state(_rank(0, left=True, capturing=True), 0.4) == "left"
    assert rank_state(_rank(0, last_step=-1, step_time_s=0.0, median_step_time_s=None), None) == "no step yet"
    assert rank_state(_rank(0, age_s=SILENT_MIN_S + 5), 0.4) == "silent 15s"
    # a slow job (60 s steps) is not silent between two steps, but is after five of them
    assert rank_state(_rank(0, age_s=100.0), 60.0) == "running"
    assert rank_state(_rank(0, age_s=301.0), 60.0) == "silent 301s"


def test_the_table_names_the_window_of_each_figure() -> None:
    text = "\n".join(render_status(_snap()))
    assert "median over ranks of each rank's median of its last 20 steps" in text
    assert "last_step_s" in text and "median20_s" in text
    row = next(line for line in text.splitlines() if line.strip().startswith("0 "))
    assert row.split()[-1] == "running" and "0.4100" in row and "0.4000" in row


def test_no_node_connected_names_the_likely_cause() -> None:
    lines = render_nodes([], "tcp://10.0.0.5:17711")
    assert lines[0] == "nodes: no node connected"
    assert "[node] coordinator" in lines[1] and "tcp://10.0.0.5:17711" in lines[1]
    text = "\n".join(render_status(_snap(jobs=[], nodes=[])))
    assert "jobs: none" in text and "no node connected" in text


def test_every_node_down_says_so() -> None:
    lines = render_nodes([{"node_id": "n1", "age_s": 42.0, "lost_batches": 0, "down": True}], None)
    assert " DOWN " in lines[1] and "every node is down" in lines[-1] and "tcp://127.0.0.1:7711" in lines[-1]


def test_an_analysing_capture_says_what_runs_and_for_how_long() -> None:
    cap = {"capture_id": "c-1", "state": "analysing", "in_state_s": 42.4, "deadline_in_s": 258.0, "start_step": 70,
           "warmup": 1, "active": 4, "acknowledged_ranks": 4, "expected_ranks": 4, "reason": "step_regression",
           "running": ["slow_rank (12 s)"]}
    lines = render_capture(cap)
    assert "analysing for 42s, analysis deadline in 4m18s" in lines[0] and "warmup=1 active=4" in lines[0]
    # an enriching capture's 2 h follow-up bound read "deadline in 7486s"
    enriching = render_capture({**cap, "state": "enriching", "deadline_in_s": 7486.0})[0]
    assert "enriching for 42s, follow-up (advisor) deadline in 2h04m;" in enriching  # says what it bounds
    late = render_capture({**cap, "state": "collecting", "deadline_in_s": -5.2})[0]
    assert "collecting for 42s, judgement deadline passed 5s ago;" in late
    from profwatch.core.status_text import span_text

    assert [span_text(v) for v in (float("nan"), float("inf"), 99.4, 3599.6)] == ["?", "?", "99s", "1h00m"]
    assert lines[1] == "    running now: slow_rank (12 s)"
    assert "staging, ranking" in render_capture({**cap, "running": []})[1]


def test_alert_lines_name_the_suspects_of_the_verdict_and_of_its_follow_up() -> None:
    from profwatch.commands.alerts import render_event

    sus = [{"rank": 2, "kind": "compute", "score": 0.91, "hostname": "h2"}]
    first = render_event({"type": "io.profwatch.suspect_ranks.v1", "time": "T", "subject": "j1",
                          "data": {"status": "ok", "suspects": sus, "pending_recipes": ["advisor"],
                                   "report": "/w/report.json"}})
    assert first == ("T suspect_ranks.v1 job=j1 ok: suspects rank 2 (compute, score 0.91, h2) "
                     "(follow-up pending: advisor) report=/w/report.json")
    later = render_event({"type": "io.profwatch.analysis_enriched.v1", "time": "T", "subject": "j1",
                          "data": {"capture_id": "c-1", "status": "ok", "suspects": sus, "report": "/w/report.html"}})
    assert later.startswith("T analysis_enriched.v1 job=j1 capture c-1 follow-up: ok: suspects rank 2")
    assert later.endswith("report=/w/report.html")
    none = render_event({"type": "io.profwatch.suspect_ranks.v1", "time": "T", "subject": "j1",
                         "data": {"status": "no_suspect", "suspects": [], "detail": "balanced"}})
    assert none.endswith("no_suspect: no suspect (balanced)")
    one = render_event({"type": "io.profwatch.suspect_ranks.v1", "time": "T", "subject": "j1",
                        "data": {"status": "not_applicable", "suspects": [], "detail": "one rank: no peer"}})
    assert one.endswith("not_applicable: cannot judge (one rank: no peer)")
    weak = render_event({"type": "io.profwatch.suspect_ranks.v1", "time": "T", "subject": "j1",
                         "data": {"status": "weak", "suspects": sus,
                                  "detail": "rank 2; evidence is weak: 2 of 5 steps"}})
    assert weak.endswith("weak: suspects rank 2 (compute, score 0.91, h2) (rank 2; evidence is weak: 2 of 5 steps)")
    other = render_event({"type": "io.profwatch.suspect_ranks.v1", "time": "T", "subject": "j1",
                          "data": {"status": "ok", "suspects": sus,
                                   "detail": "1 suspect rank(s), 0 slow link(s); top: rank 2 (compute); armed for "
                                             "rank_outlier +30% at step 9 ranks [1], not named by this capture: x"}})
    assert other.endswith("ok: suspects rank 2 (compute, score 0.91, h2) "
                          "(armed for rank_outlier +30% at step 9 ranks [1], not named by this capture: x)")
    late = render_event({"type": "io.profwatch.analysis_enriched.v1", "time": "T", "subject": "j1",
                         "data": {"capture_id": "c-1", "status": "ok", "suspects": sus, "job_ended": True}})
    assert late.endswith("(after the job ended: information, no alert)")  # issue 33 #1


def test_the_readable_alert_line_carries_the_saving_and_the_rank_dir() -> None:
    """Issue 22 item 7: what the JSON says of each suspect (impact, rank_dir) is on the readable line too."""
    from profwatch.commands.alerts import render_event

    sus = [{"rank": 2, "kind": "compute", "score": 0.91, "hostname": "h2", "rank_dir": "/prof/h2_42_x_ascend_pt",
            "impact": {"saving_s_per_step": 0.0123, "saving_pct_of_step": 8.1, "accelerator_hours_per_day": 15.6}},
           {"rank": 5, "kind": "host", "score": 0.6, "hostname": None, "rank_dir": None, "impact": None}]
    line = render_event({"type": "io.profwatch.suspect_ranks.v1", "time": "T", "subject": "j1",
                         "data": {"status": "ok", "suspects": sus}})
    assert ("rank 2 (compute, score 0.91, h2, saves 12.3 ms/step (8.1% of the mean step), dir /prof/h2_42_x_ascend_pt)"
            in line)
    assert line.endswith("rank 5 (host, score 0.60, host unknown)")


def test_episodes_say_what_they_wait_for_and_how_they_ended() -> None:
    from profwatch.core.arming.episodes import JobEpisodes
    from profwatch.core.arming.policy import ArmingPolicy, ArmingSettings
    from profwatch.core.detection.types import Anomaly

    s = ArmingSettings(min_arm_gap_s=60, cooldown_s=900)
    b, p = JobEpisodes("j", s), ArmingPolicy(s)
    # a named-rank arm holds the next named-rank episode for the gap (a job-wide one would not: gap_holds)
    load, _ = b.observe(Anomaly("rank_outlier", "j", 150, (3,), 0.25, {"stage": {3: "backward"}}), 1000.0)
    picked = b.next_arm(p, 1000.0, capture_in_flight=False)
    assert picked is not None and load is not None
    b.history.record(picked[1], 1000.0, "c1")
    b.armed(load.episode_id, "c1", 1000.0, covered=(0, 1))
    b.capture_ended("c1", 1030.0, "no_suspect")
    b.observe(Anomaly("rank_outlier", "j", 290, (5,), 3.36, {"stage": {5: "forward"}}), 1040.0)
    assert b.next_arm(p, 1040.0, capture_in_flight=False) is None
    text = "\n".join(render_status({"jobs": [], "nodes": [], "episodes": b.view(1040.0)}))
    assert "episodes (open ones in capture order" in text
    assert "rank_outlier ranks [5] stage forward +336%" in text
    assert "waits for the job's gap between arms (arming.min_arm_gap_s), 20 s left (#1 in the job's capture " \
           "queue)" in text
    assert "rank_outlier ranks [3] stage backward +25%" in text and "captured: c1 (no_suspect)" in text
    out = next(e for e in b.open.values() if e.ranks == (5,))
    b.arm_failed(out.episode_id, 1061.0, "refused: only 3/4 ranks are live")
    text = "\n".join(render_status({"jobs": [], "nodes": [], "episodes": b.view(1070.0)}))
    assert "arm failed (refused: only 3/4 ranks are live); retried in 51 s" in text
    assert "waits for refused" not in text and "s more" not in text
    b.close_all(1100.0, "all_ranks_left")
    text = "\n".join(render_status({"jobs": [], "nodes": [], "episodes": b.view(1100.0)}))
    assert "closed (all_ranks_left); never captured (waited for: refused: only 3/4 ranks are live)" in text


def test_episode_and_rotation_events_have_one_line_each() -> None:
    from profwatch.commands.alerts import render_event

    closed = {"type": "io.profwatch.episode_closed.v1", "subject": "j", "time": "t",
              "data": {"episode_id": "ep-1", "kind": "rank_outlier", "ranks": [3], "magnitude": 0.5, "step": 10,
                       "reason": "quiet", "captured": False, "waited_for": "hourly_cap"}}
    assert render_event(closed) == ("t episode_closed.v1 job=j ep-1 rank_outlier ranks=[3] +50% step 10 closed "
                                    "(quiet): never captured (waited for the job's hourly capture cap "
                                    "(arming.max_captures_per_hour))")
    # an episode whose only capture failed says so (before: "never captured (waited for None)")
    failed = {**closed, "data": {**closed["data"], "waited_for": None,
                                 "captures": [{"capture_id": "c-9", "status": "failed"}]}}
    assert render_event(failed).endswith("closed (quiet): no capture analysed (captures: c-9 (failed))")
    bare = {**closed, "data": {**closed["data"], "waited_for": None}}
    assert render_event(bare).endswith("closed (quiet): never captured")
    rot = {"type": "io.profwatch.culprit_rotates.v1", "subject": "j", "time": "t",
           "data": {"episode_id": "ep-1", "detail": "culprit rotates: ranks 0, 3, 6 in the last 3 captures"}}
    assert render_event(rot).endswith("ep-1: culprit rotates: ranks 0, 3, 6 in the last 3 captures")


def test_other_alerts_show_their_detail_whole_and_no_control_characters() -> None:
    from profwatch.commands.alerts import render_event

    fix = "create the folder " + "/x" * 120 + " or set PROFWATCH_CONFIG_PATH"  # past the 200-character cut
    un = {"type": "io.profwatch.capture_unavailable.v1", "subject": "j", "time": "t",
          "data": {"rank": 0, "hostname": "h", "error": "e" * 300, "detail": f"rank 0 on h: no folder. Fix: {fix}"}}
    assert render_event(un).endswith(fix)
    col = {"type": "io.profwatch.job_id_collision.v1", "subject": "j", "time": "t",
           "data": {"reason": "uid_mismatch", "detail": "uid 1001 on n1\x1b]0;owned\x07"}}
    assert render_event(col) == "t job_id_collision.v1 job=j uid_mismatch: uid 1001 on n1\\x1b]0;owned\\x07"
    refused = {"type": "io.profwatch.path_refused.v1", "subject": "j", "time": "t",
               "data": {"rank": 1, "problems": ["outside the allowed roots: /etc", "changed"]}}
    assert render_event(refused).endswith(" outside the allowed roots: /etc; changed")


def test_a_queued_follow_up_is_shown_in_status_and_as_one_alert_line() -> None:
    from profwatch.commands.alerts import render_event
    from profwatch.core.arming.episodes import JobEpisodes
    from profwatch.core.arming.policy import ArmingPolicy, ArmingSettings
    from profwatch.core.detection.types import Anomaly

    s = ArmingSettings(min_arm_gap_s=60, cooldown_s=900)
    b, p = JobEpisodes("j", s), ArmingPolicy(s)
    ep, _ = b.observe(Anomaly("step_regression", "j", 150, (), 0.25, {"baseline_s": 0.5}), 1000.0)
    picked = b.next_arm(p, 1000.0, capture_in_flight=False)
    assert picked is not None and ep is not None
    b.history.record(picked[1], 1000.0, "c1")
    b.armed(ep.episode_id, "c1", 1000.0, covered=(0, 1))
    (ev,) = b.capture_ended("c1", 1030.0, "partial", waited=tuple(range(2, 40)))
    text = "\n".join(render_status({"jobs": [], "nodes": [], "episodes": b.view(1040.0)}))
    assert "follow-up queued: its last capture's ranks waited for ranks 2, 3, 4" in text and "(38 ranks)" in text
    line = render_event({"type": ev.type, "subject": "j", "time": "t", "data": ev.data})
    assert "a follow-up capture of ranks 2, 3," in line and "..." in line and "\n" not in line


def test_a_rank_with_no_step_yet_shows_no_step_figures() -> None:
    """Right after its hello a rank has no step: status printed ``furthest_step=-1`` and ``-1  0.0000`` in its
    row (the registry's placeholders, read as a step and a 0 s step time). Now ``-``, and its state says why."""
    job = {"job_id": "j1", "world_size": 2, "ranks_seen": 2, "backend": "torch_npu", "furthest_step": -1,
           "median_step_time_s": None, "median_steps": 20, "rank_drops": 0,
           "ranks": [_rank(r, last_step=-1, step_time_s=0.0, median_step_time_s=None, age_s=4.4) for r in (0, 1)]}
    lines = render_status(_snap(jobs=[job]))
    assert "furthest_step=- " in lines[0], lines[0]
    rows = [ln for ln in lines if ln.endswith("no step yet")]
    assert len(rows) == 2 and all(ln.split()[2:5] == ["-", "-", "-"] for ln in rows), rows
    assert not [ln for ln in lines if "-1" in ln.split() or "0.0000" in ln], lines
    # a rank that has stepped keeps its figures
    assert "0.4100" in "\n".join(render_status(_snap())) and "furthest_step=120 " in render_status(_snap())[0]


def test_a_job_ended_alert_line_says_why_in_words() -> None:
    from profwatch.commands.alerts import render_event

    silent = render_event({"type": "io.profwatch.job_ended.v1", "time": "T", "subject": "j1",
                           "data": {"last_report_unix_s": 1.0e9, "silent_s": 612.4, "reason": "silent", "generation": 2}})
    assert silent == "T job_ended.v1 job=j1 generation 2: no rank reported (silent 612 s)"
    left = render_event({"type": "io.profwatch.job_ended.v1", "time": "T", "subject": "j1",
                         "data": {"last_report_unix_s": 1.0e9, "silent_s": 0.0, "reason": "all_ranks_left",
                                  "generation": 1}})
    assert left == "T job_ended.v1 job=j1 generation 1: every rank said bye"


def test_a_held_episode_reads_held_and_a_capture_that_named_another_rank_says_so() -> None:
    """The new user's trial: "waits for nothing while a known slow rank explains it" read as if the episode waited
    for nothing; a rank-0 episode "captured: c1 (ok, names rank 1)" did not say rank 0 was not confirmed."""
    from profwatch.commands.alerts import render_event
    from profwatch.core.status_text import render_episode, wait_phrase

    assert wait_phrase("explained_by_ranks").startswith("held while a known slow rank explains it: ")
    assert wait_phrase("culprit_rotates") == "held: the culprit rotates (load imbalance), not captured again"
    assert wait_phrase("cooldown") == "waits for its own cooldown (arming.cooldown_s)"
    assert wait_phrase("cooldown", past=True) == "waited for its own cooldown (arming.cooldown_s)"
    ep = {"episode_id": "ep-1", "kind": "rank_outlier", "ranks": [0], "magnitude": 0.3, "peak_magnitude": 0.3,
          "opened_step": 40, "captures": [{"capture_id": "c1", "status": "ok", "named": [1]}],
          "waiting": "explained_by_ranks"}
    text = "\n".join(render_episode(ep))
    assert "captured: c1 (ok, names rank 1, not rank 0)" in text
    assert "held while a known slow rank explains it" in text and "waits for nothing" not in text
    both = {**ep, "captures": [{"capture_id": "c2", "status": "ok", "named": [0, 3]}]}
    assert "c2 (ok, names ranks 0, 3)" in "\n".join(render_episode(both))
    wide = {**ep, "ranks": [], "captures": [{"capture_id": "c3", "status": "ok", "named": [1]}]}
    assert "c3 (ok, names rank 1)" in "\n".join(render_episode(wide))
    closed = {"type": "io.profwatch.episode_closed.v1", "subject": "j", "time": "t",
              "data": {"episode_id": "ep-2", "kind": "step_regression", "ranks": [], "magnitude": -0.25, "step": 9,
                       "reason": "quiet", "captured": False, "waited_for": "culprit_rotates"}}
    line = render_event(closed)
    assert "-25% step 9" in line and "+-" not in line
    assert line.endswith("never captured (held: the culprit rotates (load imbalance), not captured again)")


def test_an_alert_line_with_a_comparison_says_what_changed() -> None:
    """A job-wide slowdown compared with its reference capture read "no_suspect: no suspect (...)" on the line and
    "nothing found" at 3 a.m.; the comparison's headline (what changed since the reference) is on the line now."""
    from profwatch.commands.alerts import render_event

    line = render_event({"type": "io.profwatch.suspect_ranks.v1", "time": "T", "subject": "j1",
                         "data": {"status": "no_suspect", "suspects": [], "detail": "the whole job",
                                  "comparison": {"headline": "+259.9 ms/step since the reference: compute +242.7 ms"},
                                  "report": "/w/report.html"}})
    assert line == ("T suspect_ranks.v1 job=j1 no_suspect: no suspect (the whole job); what changed: +259.9 ms/step "
                    "since the reference: compute +242.7 ms report=/w/report.html")


def test_each_of_two_enriching_captures_says_what_it_does_or_waits_for() -> None:
    """Tried by a new user: with two captures enriched at once, the one queued for the one enrich worker read
    plainly "enriching", and one without a command running read "staging, ranking or the Kineto analysis"."""
    cap = {"capture_id": "c-2", "state": "enriching", "in_state_s": 30.0, "deadline_in_s": 600.0, "start_step": 70,
           "warmup": 1, "active": 4, "acknowledged_ranks": 4, "expected_ranks": 4, "reason": "step_regression",
           "running": [], "stage": "enrich_queued", "ahead": ["c-1"]}
    queued = render_capture(cap)
    assert "c-2" in queued[0] and "enriching (queued) for 30s" in queued[0]
    assert queued[1] == "    waiting for the enrich worker (one capture's follow-up at a time): behind c-1"
    between = render_capture({**cap, "capture_id": "c-1", "stage": "enriching", "ahead": []})
    assert "enriching for 30s" in between[0] and "Kineto" not in between[1] and "follow-up between" in between[1]
    running = render_capture({**cap, "capture_id": "c-1", "stage": "enriching", "ahead": [],
                              "running": ["advisor (12 s) [enrich]"]})
    assert running[1] == "    running now: advisor (12 s) [enrich]"
    waiting = render_capture({**cap, "state": "analysing", "stage": "analysis_queued", "ahead": ["c-0", "c-1"]})
    assert "waiting for an analysis worker" in waiting[1] and waiting[1].endswith("behind c-0, c-1")


def test_a_job_wide_reference_compare_says_which_rank_and_why() -> None:
    """A user saw ``running now: reference_compare_rank2 (2 s) [enrich]`` in a job-wide scenario (no suspect) and
    read it as rank 2 being blamed: the running command says it compares rank 2 because its step time changed most
    since the reference."""
    from profwatch.core.status_text import capture_activity, run_label

    label = run_label("reference_compare_rank2")
    assert label == "reference_compare of rank 2 (a rank whose step time changed most since the reference)"
    assert run_label("slow_rank") == "slow_rank" and run_label("x_rankz") == "x_rankz"
    assert capture_activity({"running": [f"{label} (2 s) [enrich]"]}).startswith("running now: reference_compare of")


def test_a_suspect_drilldown_says_which_rank_and_why() -> None:
    """The Ascend drill-down runs ``suspect_compare_rank<N>`` (``analysis/drilldown.py``) per suspect: the status
    says it in words, as the reference comparison's runs, not the raw machine name."""
    from profwatch.analysis.drilldown import SUSPECT_COMPARE
    from profwatch.changes.compare import REFERENCE_COMPARE
    from profwatch.core.status_text import RUN_RANK_WHY, run_label

    assert {SUSPECT_COMPARE, REFERENCE_COMPARE} <= set(RUN_RANK_WHY)  # the recipes that run per rank
    assert run_label("suspect_compare_rank3") == "suspect_compare of rank 3 (a suspect rank, compared with its median peer)"
    assert run_label("suspect_compare") == "suspect_compare" and run_label("suspect_compare_rankx") == "suspect_compare_rankx"
