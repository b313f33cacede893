"""``profwatch replay`` follows the coordinator's new-run rule on records that name their process (``pid``, ``node``):
a requeue under the same job id is a new run with its own detector and budget; a lone process opens nothing."""

from __future__ import annotations

import json
from typing import Any

from profwatch.commands.replay import replay_lines

T0 = 1_764_500_000.0


def _run(job: str, ranks: dict[int, tuple[str, int]], steps: int, t0: float, *, slow_from: int | None = None,
         step_s: float = 0.1, first_step: int = 1) -> list[dict[str, Any]]:
    """Records of one run: ``ranks[rank] = (node, pid)``; every rank ``step_s`` a step (a little jitter), 60 % slower
    from step ``slow_from`` (job-wide)."""
    world = len(ranks)
    out = []
    for i in range(steps):
        s = first_step + i
        t = step_s * (1.6 if slow_from is not None and s >= slow_from else 1.0)
        for r, (node, pid) in sorted(ranks.items()):
            jitter = 1 + 0.01 * ((s * 7 + r * 3) % 5)
            out.append({"job_id": job, "rank": r, "world_size": world, "step": s, "step_time_s": t * jitter,
                        "ts_unix_s": t0 + i * step_s + 0.001 * r, "pid": pid, "node": node})
    return out


def _replay(records: list[dict[str, Any]]) -> dict[str, Any]:
    return replay_lines([json.dumps(r) for r in records])


OLD = {0: ("n0", 100), 1: ("n0", 101), 2: ("n1", 102), 3: ("n1", 103)}


def test_a_requeue_with_fewer_ranks_on_another_node_is_a_new_run() -> None:
    old = _run("rq", OLD, 300, T0)
    new = _run("rq", {0: ("n5", 200), 1: ("n5", 201)}, 300, T0 + 30 + 60, slow_from=200)
    res = _replay(old + new)
    (g,) = res["generations"]
    assert (g["reason"], g["old_world_size"], g["world_size"], g["nodes"]) == ("every_rank_gone", 4, 2, ["n5"])
    assert res["jobs"]["rq"]["world_size"] == 2  # the detector was rebuilt for the new run
    assert not [a for a in res["anomalies"] if a["kind"] == "stalled_rank"]  # ranks 2 and 3 left with the old run
    slow = [a for a in res["arms"] if a["step"] >= 200 and a["kind"] != "stalled_rank"]
    assert slow and slow[0]["action"] == "arm"  # the new run's slowdown is judged and captured


def test_without_pids_the_same_records_are_one_run() -> None:
    """What replay did before (and does for records without ``pid``): the old ranks 2 and 3 look stalled."""
    old = _run("rq", OLD, 300, T0)
    new = _run("rq", {0: ("n5", 200), 1: ("n5", 201)}, 300, T0 + 90)
    res = _replay([{k: v for k, v in r.items() if k not in ("pid", "node")} for r in old + new])
    assert res["generations"] == [] and res["jobs"]["rq"]["world_size"] == 4


def test_steps_going_back_on_a_quorum_of_processes_open_a_run_and_a_lone_process_does_not() -> None:
    old = _run("rq", OLD, 300, T0)
    same_size = _run("rq", {r: (node, 300 + r) for r, (node, _pid) in OLD.items()}, 50, T0 + 30.5, first_step=101)
    res = _replay(old + same_size)  # new pids, steps back to 101 from 300, 0.5 s later: a requeue at the same size
    assert [g["reason"] for g in res["generations"]] == ["steps_went_back"]
    lone = _run("rq", dict.fromkeys(range(4), ("n0", 999)), 50, T0 + 30.5, first_step=101)
    res = _replay(old + lone)  # one process speaks for all four ranks and moves every counter back: one vote
    assert res["generations"] == []


def test_the_summary_gives_an_episode_s_steps_until_it_last_held() -> None:
    # a lasting job-wide slowdown: reported once (step ~231), held by its detector to the end of the file; the
    # summary said "steps 203-203", as if it had lasted one step
    from profwatch.commands.replay import render_summary
    res = _replay(_run("lasting", {r: ("n0", 100 + r) for r in range(4)}, 400, T0, slow_from=200))
    [ep] = [e for e in res["episodes"] if e["kind"] == "step_regression"]
    assert ep["last_step"] < 300 < 390 <= ep["last_ongoing_step"]
    [line] = [ln for ln in render_summary(res).splitlines() if "step_regression steps" in ln]
    assert f"steps {ep['opened_step']}-{ep['last_ongoing_step']} " in line


def test_a_file_with_no_valid_record_says_what_a_record_looks_like(tmp_path: Any) -> None:
    # a CSV and an empty file: exit 2, and the error shows a record of the expected format (it said only
    # "no valid step record in x.csv (2 bad lines)")
    from click.testing import CliRunner

    from profwatch.cli import cli
    from profwatch.commands.replay import TELEMETRY_EXAMPLE
    from profwatch.exitcodes import EXIT_USAGE

    csv = tmp_path / "steps.csv"
    csv.write_text("job_id,rank,step\nj1,0,1\n")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    for f, what in ((csv, "2 bad lines (listed above)"), (empty, "the file is empty")):
        res = CliRunner().invoke(cli, ["replay", str(f)])
        assert res.exit_code == EXIT_USAGE
        assert f"no valid step record in {f}: {what}. Expected one JSON object per line" in res.output
        assert TELEMETRY_EXAMPLE in res.output
    assert replay_lines([TELEMETRY_EXAMPLE])["records"] == 1  # the example is a valid record


def _checkpointing_job() -> list[dict[str, Any]]:
    """8 ranks with stages, 0.4 s a step; an unflagged 3 s checkpoint every 50 steps; rank 5's forward and backward
    2x from step 450 (the others wait for it)."""
    out = []
    t = T0
    for s in range(600):
        own = [0.34 * (1 + 0.01 * ((s * 7 + r * 3) % 5 - 2)) * (2 if r == 5 and s >= 450 else 1) for r in range(8)]
        st = max(own) + 0.05 + (3.0 if s and s % 50 == 0 else 0.0)
        for r in range(8):
            out.append({"job_id": "ck", "rank": r, "world_size": 8, "step": s, "step_time_s": st, "ts_unix_s": t,
                        "stages": {"forward": 0.4 * own[r], "backward": 0.6 * own[r], "comm": st - own[r]}})
        t += st
    return out


def test_the_summary_says_when_an_anomaly_began_and_whose_capture_covered_an_episode() -> None:
    # the anomaly lines gave the step a detector decided at (a checkpoint spike at step 100 read "step 102"),
    # and an episode covered only by another episode's capture read "1 capture(s)", as if captured itself
    from profwatch.commands.replay import render_summary
    res = _replay(_checkpointing_job())
    text = render_summary(res)
    spikes = [a for a in res["anomalies"] if a["kind"] == "step_spike"]
    assert spikes and all(a["detail"]["first_step"] % 50 == 0 < a["step"] - a["detail"]["first_step"] for a in spikes)
    for a in spikes:
        assert f"step {a['step']}: step_spike {a['magnitude']:+.1%} (since step {a['detail']['first_step']})" in text
    assert "periodic_spike" in text and "(every 50 steps)" in text
    [outlier] = [a for a in res["anomalies"] if a["kind"] == "rank_outlier"]
    assert outlier["ranks"] == [5]
    stage = outlier["detail"]["stage"][5]  # forward or backward: both doubled
    assert f"rank_outlier {outlier['magnitude']:+.1%} ranks=[5] in {stage}" in text  # it named no stage
    borrowed = [e for e in res["episodes"] if e["captures"] and not any(c["own"] for c in e["captures"])]
    assert borrowed
    for e in borrowed:
        [line] = [ln for ln in text.splitlines() if f"{e['kind']} steps {e['opened_step']}-" in ln]
        assert f"0 capture(s) (+{len(e['captures'])} of another episode)" in line


def _two_slow_ranks() -> list[dict[str, Any]]:
    """Rank 1 computes 1.5x slower from step 150, rank 0 ~19 % slower from step 160 (its compute grows, its wait
    shrinks: the job's step time stays rank 1's)."""
    from profwatch.simulate.telemetry import TelemetryScenario, generate_telemetry

    out = []
    for r in generate_telemetry(TelemetryScenario(job_id="j1", world_size=4, steps=700, slow_rank=1,
                                                  slow_rank_factor=1.5, slow_rank_from_step=150)):
        if r["rank"] == 0 and r["step"] >= 160:
            extra = 0.19 * r["stages"]["compute"]
            r = {**r, "stages": {"compute": r["stages"]["compute"] + extra,
                                 "comm": max(0.0, r["stages"]["comm"] - extra)}}
        out.append(r)
    return out


def test_each_rank_keeps_its_own_size_and_an_arm_says_why_it_starts_where_it_does() -> None:
    """Tried by a new user: replay folded rank 0's +19 % into rank 1's episode text (one magnitude per episode,
    the latest or largest report's), and an arm's start_step 77 steps after its report came with no reason."""
    from profwatch.commands.replay import render_summary

    text = render_summary(_replay(_two_slow_ranks()))
    episodes = text[text.index("\nepisodes:"):].splitlines()
    (both,) = [line for line in episodes if "rank_outlier ranks=[0, 1] " in line]
    assert "rank 0 +18.6% (step 175), rank 1 +49.5% (step 157)" in both, both
    arms = text[text.index("\narms:"):text.index("\nnot armed on arrival")].splitlines()
    (first,) = [line for line in arms if "step 157: arm start_step=165" in line]
    assert "per rank, as last reported: rank 1 +49.5% (step 157)" in first and "18.6" not in first, first
    (late,) = [i for i, line in enumerate(arms) if "step 175: arm start_step=252" in line]
    assert "rank 0 +18.6% (step 175), rank 1 +49.5% (step 157)" in arms[late], arms[late]
    assert arms[late + 1].strip() == (
        "armed at step 245, 70 steps after its report at step 175 (waited for the job's gap between arms "
        "(arming.min_arm_gap_s)); start_step 252 = step 245 + 7 steps of lead (the ranks read their profiler "
        "config every 1 s, plus [capture] margin_s and margin_steps)")


def test_two_ranks_slow_for_good_stay_one_episode_with_each_ranks_own_size() -> None:
    """Rank 1 +50 % from step 150, rank 0 +19 % from step 160, both slow to the end. Before, the second capture
    (taking rank 0 beside rank 1, still named) read as the culprit moving: a rotation, then each rank split off as
    ``persistent`` with its part's size. Both stayed slow: no rotation, one rank_outlier episode, and its second
    capture covers both ranks with each one's own size (the named-rank gap holds it after the first)."""
    res = _replay(_two_slow_ranks())
    assert [e for e in res["episodes"] if "+ranks:" in e["scope"]] == []
    (ep,) = [e for e in res["episodes"] if e["kind"] == "rank_outlier"]
    assert ep["ranks"] == [0, 1]
    assert [a["ranks"] for a in res["arms"]] == [[1], [0, 1]]
    first, late = res["arms"]
    assert first["reason"].startswith("rank_outlier +49% at step 157"), first["reason"]
    assert "latest +19%" in late["reason"] and late["reason"].endswith("ranks [0, 1]"), late["reason"]


def test_each_rank_of_a_report_naming_several_keeps_its_own_size() -> None:
    """A report naming ranks 0 and 1 carries each one's excess in ``detail.excess``, keyed by int as the detector
    writes it (str once through JSON): the int keys were missed, so the summary fell back to the episode's one
    figure."""
    from profwatch.commands.replay import rank_levels

    a = {"job_id": "j1", "kind": "rank_outlier", "ranks": [0, 1], "step": 90, "magnitude": 0.5,
         "detail": {"excess": {0: 0.21, 1: 0.5}}}
    assert rank_levels([a], "j1", "rank_outlier", [0, 1], None) == "rank 0 +21.0% (step 90), rank 1 +50.0% (step 90)"
    a["detail"] = {"excess": {"0": 0.21, "1": 0.5}}
    assert rank_levels([a], "j1", "rank_outlier", [0, 1], None) == "rank 0 +21.0% (step 90), rank 1 +50.0% (step 90)"


def test_an_arm_s_start_step_is_one_sum_that_names_each_term() -> None:
    """A user read ``start_step 131 = step 81 + 20 steps of lead (...), then +30 steps to the capture window's
    start`` and could not tell what the +30 was: each term of the sum says what it is."""
    from profwatch.commands.replay import arm_step_text

    arm = {"step": 81, "armed_at_step": 81, "base_step": 81, "lead_steps": 20, "poll_interval_s": 1.0,
           "start_step": 131, "kind": "step_regression"}
    text = arm_step_text(arm)
    assert text == ("armed at step 81; start_step 131 = step 81 + 20 steps of lead (the ranks read their profiler "
                    "config every 1 s, plus [capture] margin_s and margin_steps) + 30 steps (asked beyond the lead: "
                    "a level report's window waits to see whether its excursion comes back, "
                    "core/arming/policy.py: capture_request)"), text
    assert "then" not in text
    spike = arm_step_text({**arm, "kind": "periodic_spike", "start_step": 105})
    assert spike.endswith(" + 4 steps (to the spike's predicted onset: the window starts on an occurrence)"), spike
    assert arm_step_text({**arm, "start_step": 101}).endswith("margin_steps)")
