"""``profwatch replay`` end to end through click's CliRunner on generated telemetry files (no sockets, no sleeps)."""

from __future__ import annotations

import json
import os
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from profwatch.commands.replay import dump_jsonl, replay, replay_lines
from profwatch.simulate.telemetry import TelemetryScenario, generate_telemetry
from rankhook.wire import StepReport

BASE = TelemetryScenario(world_size=8, steps=300, cv=0.01, step_time_s=0.5)


def invoke(path: Path, *extra: str) -> tuple[int, str]:
    res = CliRunner().invoke(replay, [str(path), *extra])
    return res.exit_code, res.output


def run_json(tmp_path: Path, records: list[dict[str, Any]], *extra: str, tail: str = "") -> dict[str, Any]:
    f = tmp_path / "telemetry.jsonl"
    f.write_text(dump_jsonl(records) + tail)
    code, out = invoke(f, "--json", *extra)
    assert code == 0, out
    return json.loads(out)


def test_slowdown_arms_one_capture_and_its_window_does_not_retrigger(tmp_path: Path) -> None:
    res = run_json(tmp_path, generate_telemetry(replace(BASE, slowdown=0.3, slowdown_from_step=150)))
    assert [a["kind"] for a in res["anomalies"]] == ["step_regression"]
    arm = res["arms"][0]
    assert len(res["arms"]) == 1 and arm["action"] == "arm"
    assert arm["start_step"] > arm["step"] and (arm["warmup"], arm["active"], arm["rank_list"]) == (1, 4, None)
    # placed by the coordinator's planner, its lead ahead of the furthest rank: ceil((1 s poll + 2 s margin) /
    # step time) + 2 with the step time now 0.5 s * 1.3 (the detector re-learns the new level): 7 steps
    assert arm["start_step"] == arm["step"] + 7
    assert res["bad_lines"]["count"] == 0 and res["records"] == 300 * 8


def test_stationary_and_capture_window_replay_quietly(tmp_path: Path) -> None:
    res = run_json(tmp_path, generate_telemetry(replace(BASE, capture_start_step=150, capture_factor=2.0)))
    assert res["anomalies"] == [] and res["arms"] == [] and res["suppressed"] == []


def test_stalled_rank_reported_and_suppressed(tmp_path: Path) -> None:
    cfg = tmp_path / "pw.toml"
    cfg.write_text("[detection]\nstall_after_s = 10.0\n")
    res = run_json(tmp_path, generate_telemetry(replace(BASE, stall_rank=2, stall_from_step=100)), "--config", str(cfg))
    assert [(a["kind"], a["ranks"]) for a in res["anomalies"]] == [("stalled_rank", [2])]
    [sup] = res["suppressed"]
    assert sup["kind"] == "stalled_rank" and sup["step"] == res["anomalies"][0]["step"]
    assert sup["reason"] == "stalled_rank_not_capturable"
    [ep] = res["episodes"]
    assert (ep["kind"], ep["ranks"], ep["captures"], ep["episode_id"]) == ("stalled_rank", [2], [], sup["episode_id"])
    assert res["arms"] == []


def test_bye_is_not_a_stall(tmp_path: Path) -> None:
    recs = generate_telemetry(replace(BASE, stall_rank=2, stall_from_step=100))
    idx = next(i for i, r in enumerate(recs) if r["step"] == 100)
    recs.insert(idx, {"kind": "bye", "job_id": "sim", "rank": 2, "step": 99, "ts_unix_s": recs[idx]["ts_unix_s"]})
    cfg = tmp_path / "pw.toml"
    cfg.write_text("[detection]\nstall_after_s = 10.0\n")
    res = run_json(tmp_path, recs, "--config", str(cfg))
    assert res["anomalies"] == []


def test_observe_mode_gap_and_episodes_from_config(tmp_path: Path) -> None:
    """Observe mode: the job-wide regression would arm at once; the slow rank behind it is another episode, held
    neither by the first one's cooldown nor by the job's min gap (an arm naming no ranks does not hold a new
    named-rank episode: issue 31, bench_corpus seed 36 levels run 4): both are captured, the rank at once."""
    cfg = tmp_path / "pw.toml"
    cfg.write_text('[detection]\nmin_effect = 0.1\n\n[arming]\nmode = "observe"\ncooldown_s = 3600\n'
                   'min_arm_gap_s = 30\n')
    recs = generate_telemetry(replace(BASE, steps=400, slow_rank=5, slow_rank_from_step=150))
    res = run_json(tmp_path, recs, "--config", str(cfg))
    kinds = sorted(a["kind"] for a in res["anomalies"])
    assert kinds == ["rank_outlier", "step_regression"]
    outlier = next(a for a in res["anomalies"] if a["kind"] == "rank_outlier")
    assert outlier["ranks"] == [5]
    assert [(a["action"], a["kind"]) for a in res["arms"]] == [("would_arm", "step_regression"),
                                                               ("would_arm", "rank_outlier")]
    first, second = res["arms"]
    assert second["ranks"] == [5] and second["waited_s"] == 0
    assert [s["reason"] for s in res["suppressed"]] == []
    # one replay: the same episode is not re-armed within its cooldown
    assert {e["kind"]: len(e["captures"]) for e in res["episodes"]} == {"step_regression": 1, "rank_outlier": 1}


def test_counter_restart_replays_quietly(tmp_path: Path) -> None:
    res = run_json(tmp_path, generate_telemetry(replace(BASE, steps=200, restart_after_step=150, restart_steps=150)))
    assert res["anomalies"] == []
    assert res["jobs"]["sim"]["counters"]["restarts"] == 1


def test_bad_lines_counted_with_line_numbers_never_crash(tmp_path: Path) -> None:
    recs = generate_telemetry(replace(BASE, steps=30, world_size=2))
    tail = 'not json\n[1, 2]\n{"job_id": "sim", "rank": 9, "world_size": 2, "step": 1, "step_time_s": 1, ' \
           '"ts_unix_s": 1}\n{"job_id": "sim", "rank": 0, "step": 1, "step_time_s": NaN, "ts_unix_s": 1}\n\n' \
           '{"job_id": "sim", "rank": 0, "step": 1, "ts_unix_s": 1}\n\xff\xfe\n'
    res = run_json(tmp_path, recs, tail=tail)
    n = len(recs)
    assert res["bad_lines"]["count"] == 6
    assert [b["line"] for b in res["bad_lines"]["lines"]] == [n + 1, n + 2, n + 3, n + 4, n + 6, n + 7]
    assert res["records"] == n
    missing = run_json(tmp_path, recs, tail='{"type": "step"}\n')["bad_lines"]["lines"][0]["error"]
    assert missing == "job_id, rank, step, ts_unix_s: Field required"  # every missing field, not the first


def test_readable_summary_and_config_errors(tmp_path: Path) -> None:
    f = tmp_path / "t.jsonl"
    f.write_text(dump_jsonl(generate_telemetry(replace(BASE, slowdown=0.5, slowdown_from_step=100))))
    code, out = invoke(f)
    assert code == 0
    assert "step_regression" in out and "arms: 1" in out and "start_step=" in out
    bad = tmp_path / "bad.toml"
    bad.write_text("[detection]\nno_such_threshold = 1\n")
    code, out = invoke(f, "--config", str(bad))
    assert code == 2 and "no_such_threshold" in out
    bad.write_text("[detection\n")
    code, out = invoke(f, "--config", str(bad))
    assert code == 2
    # issue 33 #4: a --config that is a device or a FIFO is refused unread (it was read whole: /dev/zero grew
    # without bound, a FIFO blocked for ever)
    dev = tmp_path / "dev.toml"
    dev.symlink_to("/dev/zero")
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)
    for p in (dev, fifo):
        code, out = invoke(f, "--config", str(p))
        assert code == 2 and "not a regular file" in out, out


def test_dump_jsonl_accepts_wire_step_reports() -> None:
    reps = [StepReport("j9", r, k, 0.5, 100.0 + k, {"compute": 0.4}, ("eval",) if k == 3 else ())
            for k in range(1, 40) for r in range(4)]
    text = dump_jsonl(reps, world_size=4)
    first = json.loads(text.splitlines()[0])
    assert first == {"job_id": "j9", "rank": 0, "step": 1, "step_time_s": 0.5, "ts_unix_s": 101.0,
                     "stages": {"compute": 0.4}, "world_size": 4}
    res = replay_lines(text.splitlines())
    assert res["records"] == len(reps) and res["bad_lines"]["count"] == 0
    assert res["jobs"]["j9"]["world_size"] == 4
    assert res["jobs"]["j9"]["counters"]["excluded"] >= 1  # the eval step


def test_periodic_checkpoint_armed_on_its_next_onset_when_asked(tmp_path: Path) -> None:
    """Issue 11 item 3 (b): unflagged 3-step checkpoints every 200 steps; with periodic_spike in arm_on the one
    capture covers the next occurrence (active steps from its onset), nothing else arms."""
    sc = replace(BASE, steps=1100, cv=0.03, checkpoint_every=200, checkpoint_steps=3, checkpoint_factor=6.0,
                 checkpoint_flagged=False)
    cfg = tmp_path / "pw.toml"
    cfg.write_text('[arming]\narm_on = ["step_regression", "periodic_spike"]\n')
    res = run_json(tmp_path, generate_telemetry(sc), "--config", str(cfg))
    assert [a["kind"] for a in res["anomalies"]].count("step_regression") == 0
    [arm] = res["arms"]
    assert arm["kind"] == "periodic_spike" and arm["action"] == "arm"
    assert arm["start_step"] + arm["warmup"] == 1001 and arm["active"] >= 3
    [ep] = res["episodes"]  # the learned pattern is one standing episode, captured once (its cooldown)
    assert ep["kind"] == "periodic_spike" and ep["closed_unix_s"] is None and len(ep["captures"]) == 1
    quiet = run_json(tmp_path, generate_telemetry(sc))
    assert quiet["arms"] == []
    assert {s["reason"] for s in quiet["suppressed"]} == {"transient_not_capturable", "kind_not_armed"}


def test_planner_errors_are_reported_not_hidden(tmp_path: Path) -> None:
    cfg = tmp_path / "pw.toml"
    cfg.write_text("[arming]\nactive = 15\n\n[capture]\nmax_active = 10\n")
    res = run_json(tmp_path, generate_telemetry(replace(BASE, slowdown=0.3, slowdown_from_step=150)),
                   "--config", str(cfg))
    assert res["arms"] == []
    [sup] = res["suppressed"]
    assert sup["kind"] == "step_regression" and sup["reason"].startswith("plan_failed: active 15 over max_active 10")


def test_no_valid_record_is_an_input_error(tmp_path: Path) -> None:
    f = tmp_path / "empty.jsonl"
    f.write_text("not json\n")
    code, out = invoke(f)
    assert code == 2 and "bad lines: 1" in out


def test_a_refused_value_is_said_in_the_validators_words(tmp_path: Path) -> None:
    """A negative step time read ``bad line 1: Value error, bad_value: step_time_s=-1.0 must be ...``: pydantic's
    prefix before the validator's message. Now the message alone."""
    f = tmp_path / "neg.jsonl"
    f.write_text('{"job_id": "j", "rank": 0, "world_size": 2, "step": 1, "step_time_s": -1, "ts_unix_s": 1}\n')
    code, out = invoke(f)
    assert code == 2 and "bad line 1: bad_value: step_time_s=-1.0 must be finite" in out, out
    assert "Value error" not in out


def _with_load_burst(recs: list[dict[str, Any]], first: int, last: int, factor: float) -> list[dict[str, Any]]:
    """Every rank (all its stages) ``factor`` times slower for steps ``first..last``: host load on the whole job."""
    out = []
    for r in recs:
        if "step_time_s" in r and first <= r["step"] <= last:
            r = {**r, "step_time_s": r["step_time_s"] * factor,
                 "stages": {k: v * factor for k, v in (r.get("stages") or {}).items()}}
        out.append(r)
    return out


def test_a_load_burst_does_not_keep_the_slow_rank_after_it_from_being_captured() -> None:
    """Issue 20 item 1, default config: a +25 % job-wide load burst arms first (its verdict would be no_suspect);
    the slow rank (+336 %) that comes 60 steps after the burst is its own episode, not held by the burst's cooldown:
    the first arm after its onset captures it."""
    onset = 290
    recs = generate_telemetry(replace(BASE, steps=500, slow_rank=5, slow_rank_factor=4.36, slow_rank_from_step=onset))
    res = replay_lines(dump_jsonl(_with_load_burst(recs, 150, 230, 1.25)).splitlines())
    arms = res["arms"]
    assert arms and arms[0]["kind"] == "step_regression" and arms[0]["step"] < onset  # the burst armed first
    after = [a for a in arms if a["start_step"] > onset]
    assert after, arms
    first = after[0]
    assert first["action"] == "arm" and first["kind"] == "rank_outlier" and first["ranks"] == [5], arms
    eps = {e["episode_id"]: e for e in res["episodes"]}
    straggler = eps[first["episode_id"]]
    assert straggler["opened_step"] >= onset and straggler["captures"][0]["ranks"] == [5]
    burst = eps[arms[0]["episode_id"]]
    assert burst["closed_unix_s"] is not None and burst["close_reason"] == "quiet"  # the burst ended


def test_replay_of_a_file_and_of_a_pipe_give_the_same_result(tmp_path: Path) -> None:
    """The file is read twice (bounded memory), a pipe once (held whole): both replay every record."""
    recs = generate_telemetry(replace(BASE, job_id="jp", slow_rank=2, slow_rank_from_step=150, slow_rank_factor=1.5))
    path = tmp_path / "t.jsonl"
    path.write_text(dump_jsonl(recs) + "not json\n")
    runner = CliRunner()
    from_file = runner.invoke(replay, [str(path), "--json"])
    assert from_file.exit_code == 0, from_file.output
    fifo = tmp_path / "t.fifo"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_text(path.read_text()))
    writer.start()
    from_pipe = runner.invoke(replay, [str(fifo), "--json"])
    writer.join(30)
    assert from_pipe.exit_code == 0, from_pipe.output
    a, b = json.loads(from_file.output), json.loads(from_pipe.output)
    assert a["records"] == b["records"] == len(recs) and a["bad_lines"]["count"] == b["bad_lines"]["count"] == 1
    assert a["anomalies"] == b["anomalies"] and a["arms"] == b["arms"] and any(
        2 in x["ranks"] for x in a["anomalies"])  # the slow rank was found from the file too


def test_a_file_that_changes_between_the_two_passes_replays_what_the_first_pass_read() -> None:
    """A job still appending to the file (another job's records included) while it is replayed: the second pass
    replays only the lines the first pass judged, so a job it did not size is never looked up (no KeyError)."""
    from profwatch.commands.replay import replay_source

    lines = dump_jsonl(generate_telemetry(replace(BASE, steps=60))).splitlines()
    late = dump_jsonl(generate_telemetry(replace(BASE, job_id="late", world_size=2, steps=5))).splitlines()
    reads: list[int] = []

    def open_lines() -> list[str]:
        reads.append(1)
        return lines if len(reads) == 1 else lines + late  # appended between the passes

    res = replay_source(open_lines)
    assert len(reads) == 2 and res["records"] == len(lines) and set(res["jobs"]) == {"sim"}

    def rewritten() -> list[str]:
        reads.append(1)
        return lines if len(reads) == 3 else late + lines  # rewritten: another job's lines first

    res = replay_source(rewritten)
    assert set(res["jobs"]) == {"sim"}


def _step_line(job: str, step: int = 1) -> str:
    return json.dumps({"job_id": job, "rank": 0, "world_size": 1, "step": step, "step_time_s": 0.5,
                       "ts_unix_s": 1.7e9 + step})


def test_a_line_over_the_wire_cap_is_a_counted_bad_line_and_the_rest_replays(tmp_path: Path) -> None:
    """Issue 33 #4: a line without end grew to 23 GB; now every line is read in bounded memory."""
    f = tmp_path / "t.jsonl"
    good = [_step_line("j1", s) for s in range(1, 51)]
    with f.open("w") as out:
        out.write("\n".join(good[:25]) + "\n")
        out.write('{"job_id": "' + "x" * (5 * 1024 * 1024) + '"}\n')  # 5 MiB: over the 4 MiB batch cap
        out.write("\n".join(good[25:]) + "\n")
    code, out_text = invoke(f, "--json")
    assert code == 0, out_text[-500:]
    res = json.loads(out_text)
    assert res["records"] == 50 and res["bad_lines"]["count"] == 1
    (bad,) = res["bad_lines"]["lines"]
    assert bad["line"] == 26 and "longer than the wire's 4194304 byte cap" in bad["error"]


def test_a_line_without_end_and_a_file_of_nothing_usable_exit_2(tmp_path: Path) -> None:
    zero = tmp_path / "zero.jsonl"
    zero.symlink_to("/dev/zero")  # a device: read once, through the spool; no newline ever
    code, out = invoke(zero)
    assert code == 2 and "more than 268435456 bytes" in out and "nothing replayed" in out, out[-500:]
    only = tmp_path / "only.jsonl"
    only.write_bytes(b"y" * (4 * 1024 * 1024 + 1) + b"\n")
    code, out = invoke(only, "--json")
    assert code == 2 and "longer than the wire" in out, out[-500:]


def test_a_pipe_that_never_ends_is_spooled_up_to_the_cap_then_exits_2(tmp_path: Path) -> None:
    """Adversarial finding: ``profwatch replay /dev/urandom`` or ``yes ... | profwatch replay /dev/stdin`` spooled to
    a temporary file without limit (139 MB in 6 s, never replaying). A pipe or device is read at most
    ``MAX_SPOOL_BYTES`` (256 MiB), then exit 2 with a message, and the temporary file is gone."""
    from profwatch.commands.replay import MAX_SPOOL_BYTES

    fifo = tmp_path / "endless.fifo"
    os.mkfifo(fifo)
    line = (_step_line("j1") + " " * (1 << 20) + "\n").encode()  # ~1 MiB lines, valid JSON, forever
    sent = [0]

    def write_forever() -> None:
        try:
            with fifo.open("wb") as w:
                while sent[0] < 2 * MAX_SPOOL_BYTES:  # bounded: the reader stops at the cap long before
                    w.write(line)
                    sent[0] += len(line)
        except BrokenPipeError:
            pass

    writer = threading.Thread(target=write_forever, daemon=True)
    writer.start()
    code, out = invoke(fifo)
    writer.join(60)
    assert code == 2 and f"more than {MAX_SPOOL_BYTES} bytes (256 MiB)" in out and "nothing replayed" in out, out[-500:]
    assert MAX_SPOOL_BYTES < sent[0] < 2 * MAX_SPOOL_BYTES  # the reader stopped: the writer's pipe broke


def test_a_file_naming_more_jobs_than_the_coordinator_tracks_counts_the_rest_as_bad(tmp_path: Path) -> None:
    from profwatch.commands.replay import MAX_JOBS

    f = tmp_path / "jobs.jsonl"
    f.write_text("\n".join(_step_line(f"job{i}") for i in range(MAX_JOBS + 76)) + "\n")
    code, out = invoke(f, "--json")
    assert code == 0
    res = json.loads(out)
    assert len(res["jobs"]) == MAX_JOBS and res["records"] == MAX_JOBS and res["bad_lines"]["count"] == 76
    assert "job cap" in res["bad_lines"]["lines"][0]["error"]


def test_the_bounded_reader_keeps_lines_and_skips_overlong_ones() -> None:
    import io

    from profwatch.adapters.fs.bounded_read import EndlessInput, OverlongLine, iter_lines

    data = b"a\n" + b"b" * 100 + b"\nccc\n\nlast"
    assert list(iter_lines(io.BytesIO(data), 10)) == ["a", OverlongLine(100), "ccc", "", "last"]
    big = b"x" * 300_000 + b"\nok\n"  # over several chunks
    assert list(iter_lines(io.BytesIO(big), 200_000)) == [OverlongLine(300_000), "ok"]
    try:
        list(iter_lines(io.BytesIO(b"z" * 1000), 10, max_skip_bytes=100))
    except EndlessInput:
        pass
    else:
        raise AssertionError("a line without end must stop the reader")


def test_the_daemons_own_toml_is_taken_and_its_other_tables_ignored_with_one_line(tmp_path: Path) -> None:
    """Issue 35: README writes ``profwatch replay FILE --config /etc/profwatch/profwatch.toml``, and replay refused
    that file (``Extra inputs are not permitted``). Its [detection], [arming] and [capture] tables are used; the
    others are neither used nor validated, and one line says so."""
    from tests.conftest import REPO_ROOT

    f = tmp_path / "t.jsonl"
    f.write_text(dump_jsonl(generate_telemetry(replace(BASE, slowdown=0.5, slowdown_from_step=100))))
    res = CliRunner().invoke(replay, [str(f), "--config", str(REPO_ROOT / "systemd" / "profwatch.toml")])
    assert res.exit_code == 0, res.output
    notes = [ln for ln in res.output.splitlines() if ln.startswith("profwatch replay: using")]
    assert len(notes) == 1 and "ignoring [node], [coordinator]" in notes[0], res.output
    cfg = tmp_path / "daemons.toml"  # a node-table value replay does not use is not validated; arming's are
    cfg.write_text('[node]\nheartbeat_interval_s = -1\n[security]\ncurve = "on"\n[arming]\nmode = "observe"\n')
    res = CliRunner().invoke(replay, [str(f), "--config", str(cfg), "--json"])
    assert res.exit_code == 0, res.output
    assert "ignoring [node], [security]" in res.output
    cfg.write_text('[coordinator]\nwindow_steps = 5\n[arming]\nmode = "sometimes"\n')
    res = CliRunner().invoke(replay, [str(f), "--config", str(cfg)])
    assert res.exit_code == 2 and "mode" in res.output and "window_steps" not in res.output, res.output


def test_the_job_cap_is_the_configs_limits_max_jobs_total(tmp_path: Path) -> None:
    """``--config``'s ``[limits] max_jobs_total`` is the file's job cap, as it is the coordinator's (it was the
    built-in 1024 whatever the config said)."""
    f = tmp_path / "jobs.jsonl"
    f.write_text("\n".join(_step_line(f"job{i}") for i in range(5)) + "\n")
    cfg = tmp_path / "pw.toml"
    cfg.write_text("[limits]\nmax_jobs_total = 3\n")
    code, out = invoke(f, "--json", "--config", str(cfg))
    assert code == 0, out
    res = json.loads(out[out.index("{"):])
    assert sorted(res["jobs"]) == ["job0", "job1", "job2"] and res["bad_lines"]["count"] == 2, res["bad_lines"]
    assert "more than 3 jobs" in res["bad_lines"]["lines"][0]["error"]
    cfg.write_text("[limits]\nmax_jobs_total = 0\n")  # validated as the daemons validate it
    code, out = invoke(f, "--config", str(cfg))
    assert code == 2 and "max_jobs_total" in out, out


def test_a_rotating_hot_expert_is_published_with_the_captures_that_showed_it(tmp_path: Path) -> None:
    """Replay publishes what the coordinator publishes when a capture ends (culprit_rotates), and each arm carries
    the capture id the episodes name: a hot expert (+50 %) moving every 150 steps over 8 ranks takes at most
    rotation_captures (2) captures, all listed by the one culprit_rotates event."""
    moe = replace(BASE, steps=2400, cv=0.02, rotate_every=150, slow_rank_factor=1.5, slow_rank_from_step=800)
    res = run_json(tmp_path, generate_telemetry(moe))
    rot = [e for e in res["episode_events"] if e["type"] == "io.profwatch.culprit_rotates.v1"]
    assert len(rot) == 1 and len(set(rot[0]["rotation"])) >= 2
    ids = [a["capture_id"] for a in res["arms"]]
    assert len(ids) == len(set(ids)) and set(rot[0]["capture_ids"]) <= set(ids)
    assert len(res["arms"]) <= 2


def test_replay_reads_the_config_every_command_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without ``--config`` replay reads what every profwatch command reads (``PROFWATCH_CONFIG`` here) and says
    which file (before: the built-in defaults, whatever PROFWATCH_CONFIG named: an [arming] mode of observe armed)."""
    f = tmp_path / "t.jsonl"
    f.write_text(dump_jsonl(generate_telemetry(replace(BASE, slowdown=0.5, slowdown_from_step=100))))
    cfg = tmp_path / "pw.toml"
    cfg.write_text('[arming]\nmode = "observe"\n')
    monkeypatch.setenv("PROFWATCH_CONFIG", "")
    res = CliRunner().invoke(replay, [str(f), "--json"])
    assert res.exit_code == 0, res.output
    armed_by_default = json.loads(res.stdout)
    monkeypatch.setenv("PROFWATCH_CONFIG", str(cfg))
    res = CliRunner().invoke(replay, [str(f), "--json"])
    assert res.exit_code == 0, res.output
    assert f"profwatch replay: config {cfg}" in res.stderr
    observed = json.loads(res.stdout)
    assert [a.get("action") for a in armed_by_default["arms"]] == ["arm"], armed_by_default["arms"]
    assert [a.get("action") for a in observed["arms"]] == ["would_arm"], observed["arms"]


def test_two_ranks_slow_from_the_same_step_are_no_rotation(tmp_path: Path) -> None:
    """Ranks 2 and 5 both compute 12 % longer from step 400 on and stay so. The detector named rank 5 a step before
    rank 2; the episode's second capture took rank 2 beside rank 5, and its new rank read as the culprit moving
    5 -> 2: ``culprit_rotates``, and neither rank was captured again. A rank still named when the next capture is
    armed was not left behind: no rotation."""
    two = replace(BASE, steps=700, cv=0.02, rank_jitter_cv=0.01, slow_rank=2, slow_rank_factor=1.12,
                  slow_rank_from_step=400, rotate_every=10**6, rotate_ranks=(5,), seed=0)
    res = run_json(tmp_path, generate_telemetry(two))
    assert not [e for e in res["episode_events"] if e["type"] == "io.profwatch.culprit_rotates.v1"]
    assert {r for a in res["arms"] for r in a["ranks"]} == {2, 5}
    assert all(not e["rotation"] for e in res["episodes"])
