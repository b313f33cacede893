"""Recipe choice and run interpretation for msprof-analyze (pure: facts and outcomes in, plans and statuses out)."""

from __future__ import annotations

import pytest

from profwatch.core.verdict.evidence import ClusterEvidence
from profwatch.core.verdict.msprof_plan import (
    InputFacts,
    MsprofSettings,
    RunOutcome,
    advisor_ranks,
    concurrent_runs,
    disk_error,
    exit_reason,
    input_notes,
    interpret_run,
    memory_cap_bytes,
    plan_recipes,
    with_input,
)
from profwatch.core.verdict.msprof_results import AgentMessage

GOOD = InputFacts(rank_count=4, db_ranks=[0, 1, 2, 3], has_communication=True, has_memcpy=True, max_group_size=4,
                  levels={"Level1"})


def _names(facts: InputFacts, **settings: object) -> tuple[list[str], dict[str, str]]:
    plan = plan_recipes(facts, MsprofSettings(**settings), "/stage/b1")  # type: ignore[arg-type]
    return [c.name for c in plan.commands], {n: s.status for n, s in plan.skipped.items()}


def test_plan_runs_everything_on_a_good_batch_with_absolute_paths() -> None:
    plan = plan_recipes(GOOD, MsprofSettings(language="cn", advisor_html=True), "/stage/b1")
    assert [c.name for c in plan.commands] == ["cluster_time_summary", "communication_matrix", "slow_rank", "advisor",
                                               "advisor_html"]
    # the verdict waits for the time breakdown and the votes only; the rest follows it
    assert [c.name for c in plan.phase("alert")] == ["cluster_time_summary", "slow_rank"]
    assert [c.name for c in plan.phase("enrich")] == ["communication_matrix", "advisor", "advisor_html"]
    assert plan.skipped == {}
    for c in plan.commands:
        assert c.args[c.args.index("-d") + 1] == "/stage/b1" and "--force" in c.args and "-o" not in c.args
    assert "--agent" in plan.commands[3].args and "--agent" not in plan.commands[4].args
    assert plan.commands[3].args[-2:] == ("-l", "cn")
    with pytest.raises(ValueError, match="absolute"):
        plan_recipes(GOOD, MsprofSettings(), "stage/b1")


@pytest.mark.parametrize(("facts", "ran", "skipped"), [
    (InputFacts(rank_count=4), ["advisor"], {"cluster_time_summary": "no_data", "slow_rank": "no_data"}),
    (InputFacts(rank_count=4, db_ranks=[0, 1, 2, 3], levels={"Level0"}), ["advisor"],
     {"cluster_time_summary": "not_applicable", "slow_rank": "not_applicable"}),
    (InputFacts(rank_count=4, db_ranks=[0, 1, 2, 3], has_communication=True, max_group_size=4),
     ["communication_matrix", "slow_rank", "advisor"], {"cluster_time_summary": "not_applicable"}),
    (InputFacts(rank_count=3, db_ranks=[0, 1, 2], has_communication=True, has_memcpy=True, max_group_size=3),
     ["cluster_time_summary", "communication_matrix", "advisor"], {"slow_rank": "not_applicable"}),
])
def test_plan_skips_what_the_inputs_cannot_answer(facts: InputFacts, ran: list[str], skipped: dict[str, str]) -> None:
    assert _names(facts) == (ran, skipped)


def test_plan_without_advisor() -> None:
    assert _names(GOOD, advisor=False) == (["cluster_time_summary", "communication_matrix", "slow_rank"],
                                           {"advisor": "skipped"})
    assert "communication_matrix" not in _names(GOOD, communication_matrix=False)[0]
    assert _names(GOOD, advisor_html=False)[0][-1] == "advisor"
    assert _names(GOOD, advisor_html=True)[0][-1] == "advisor_html"  # the html only on request


def test_input_notes() -> None:
    facts = InputFacts(rank_count=3, db_ranks=[0, 1, 2], broken_db_ranks=[1], notes=["unreadable x"])
    notes = input_notes(facts, 4)
    assert notes[0] == "unreadable x" and "ranks [1]" in notes[1] and "3 rank dirs, expected 4" in notes[2]
    assert input_notes(GOOD, 4) == []


def _cts_rows(ranks: int, steps: list[int]) -> list[dict[str, object]]:
    return [{"rank": r, "step": s, "stepTime": 100.0, "computation": 60.0 + r, "communication": 30.0,
             "communicationWaitStageTime": 10.0, "communicationTransmitStageTime": 20.0, "free": 10.0}
            for r in range(ranks) for s in steps]


def _ok(name: str, tables: dict, agent_tables: list[str] | None = None, **kw: object) -> RunOutcome:
    agent = AgentMessage(found=True, status="success", code=0, message={"tables": agent_tables or list(tables)})
    return RunOutcome(name=name, output_dir="/o/x", returncode=0, agent=agent, tables=tables, **kw)  # type: ignore[arg-type]


def test_cluster_time_summary_ok_and_incomplete() -> None:
    ev = ClusterEvidence(kind="ascend_pt")
    st = interpret_run(_ok("cluster_time_summary", {"ClusterTimeSummary": _cts_rows(4, [1, 2])}), GOOD, 4, ev)
    assert st.status == "ok" and st.rows == 8 and len(ev.summaries) == 8 and st.output_dir == "/o/x"
    ev = ClusterEvidence(kind="ascend_pt")
    rows = _cts_rows(3, [1, 2]) + [{"rank": 3, "step": -1, "stepTime": 1.0}]
    st = interpret_run(_ok("cluster_time_summary", {"ClusterTimeSummary": rows}, log_tail="tail"), GOOD, 4, ev)
    assert st.status == "no_data" and "step -1" in st.detail and "incomplete" in st.detail and st.log_tail == "tail"
    # rows in the DB but the agent JSON does not list the table: not trusted
    st = interpret_run(_ok("cluster_time_summary", {"ClusterTimeSummary": _cts_rows(4, [1])}, agent_tables=["X"]),
                       GOOD, 4, ClusterEvidence(kind="ascend_pt"))
    assert st.status == "no_data"


@pytest.mark.parametrize(("log", "status", "words"), [
    ("... only supports DB ...", "no_data", "text-only"),
    ("No valid transmit and wait time", "not_applicable", "communication"),
    ("exception: 'rank'", "not_applicable", "MEMCPY_ASYNC"),
    ("Failed to allocate profiling data", "no_data", "no rank data"),
    ("", "no_data", "no result table"),
])
def test_empty_results_are_explained_from_the_log(log: str, status: str, words: str) -> None:
    run = _ok("cluster_time_summary", {"ClusterTimeSummary": None}, agent_tables=[], log_text=log)
    st = interpret_run(run, GOOD, 4, ClusterEvidence(kind="ascend_pt"))
    assert (st.status, words in st.detail) == (status, True)


def test_slow_rank_votes_and_no_votes() -> None:
    ev = ClusterEvidence(kind="ascend_pt")
    run = _ok("slow_rank", {"SlowRank": [{"rankId": 2, "slowAffectCount": 7}],
                            "SlowOpStats": [{"SlowRank": "2", "OpName": "hcom", "Timestamp": 5}]},
              agent_tables=["SlowRank"])
    assert interpret_run(run, GOOD, 4, ev).status == "ok" and ev.slow_rank_votes == {2: 7} and ev.slow_ops
    none = _ok("slow_rank", {"SlowRank": None, "SlowOpStats": None}, agent_tables=[], log_text="No slow rank found")
    assert interpret_run(none, GOOD, 4, ClusterEvidence(kind="ascend_pt")).status == "ok"
    broken = InputFacts(rank_count=4, db_ranks=[0, 1, 2, 3], broken_db_ranks=[1], has_communication=True)
    st = interpret_run(none, broken, 4, ClusterEvidence(kind="ascend_pt"))
    assert st.status == "no_data" and "3 of 4" in st.detail


def test_failures_common_to_every_recipe() -> None:
    ev = ClusterEvidence(kind="ascend_pt")
    for name in ("cluster_time_summary", "slow_rank", "advisor", "advisor_html"):
        assert interpret_run(RunOutcome(name, spawn_error="no such file"), GOOD, 4, ev).detail.startswith("cannot start")
        missing = interpret_run(RunOutcome(name, spawn_error="[Errno 2] No such file or directory: 'msprof-analyze'"),
                                GOOD, 4, ev)
        assert missing.status == "tool_error" and "profwatch[coordinator]" in missing.detail  # names the install
        timed = interpret_run(RunOutcome(name, timed_out=True, attempts=2, duration_s=9.0), GOOD, 4, ev)
        assert (timed.status, timed.detail) == ("timeout", "killed after 9 s (2 attempt(s))")
        cancelled = interpret_run(RunOutcome(name, cancelled=True, cancel_reason="shutdown"), GOOD, 4, ev)
        assert (cancelled.status, cancelled.detail) == ("cancelled", "cancelled after 0 s: shutdown")
        rc = interpret_run(RunOutcome(name, returncode=3, log_tail="boom"), GOOD, 4, ev)
        assert (rc.status, rc.detail, rc.log_tail) == ("tool_error", "exit code 3", "boom")
        err = RunOutcome(name, returncode=0, agent=AgentMessage(found=True, status="error", message={"err": "bad -d"}))
        assert interpret_run(err, GOOD, 4, ev).detail == "bad -d"
    with pytest.raises(KeyError):
        interpret_run(RunOutcome("nope", returncode=0), GOOD, 4, ev)


TRACEBACK = """[2026-12-06 09:32:34][INFO][analysis_facade.py:103] Recipe ClusterTimeSummary analysis finished.
Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/msprof_analyze/prof_common/json_output.py", line 56, in write_json
    sys.stdout.write(json_str)
UnicodeEncodeError: 'utf-8' codec can't encode character '\\udcff' in position 71: surrogates not allowed
"""


@pytest.mark.parametrize("name", ["cluster_time_summary", "slow_rank", "communication_matrix"])
def test_a_failed_run_says_why_from_its_stderr(name: str) -> None:
    """A run that dies with a traceback (msprof-analyze 26.2.0 printing its output path, with a byte that is not
    UTF-8, to stdout): the detail names the exception, not only "exit code 1"; its log file holds only INFO lines,
    so the stderr tail is the one place that says why."""
    ev = ClusterEvidence(kind="ascend_pt")
    run = RunOutcome(name, returncode=1, log_tail="[INFO] Recipe analysis finished.", stderr_tail=TRACEBACK)
    got = interpret_run(run, GOOD, 4, ev)
    assert got.status == "tool_error"
    assert got.detail == ("exit code 1: UnicodeEncodeError: 'utf-8' codec can't encode character '\\udcff' in "
                          "position 71: surrogates not allowed")


def test_exit_reason_is_bounded_and_never_a_frame() -> None:
    assert exit_reason(1, "") == "exit code 1"
    assert exit_reason(2, "Traceback (most recent call last):\n  File \"x.py\", line 1\n    ^^^^\n") == "exit code 2"
    long = exit_reason(1, "RuntimeError: " + "x" * 1000)
    assert long.startswith("exit code 1: RuntimeError: xxx") and long.endswith("...") and len(long) <= 313
    assert exit_reason(None, "Killed\n") == "exit code None: Killed"


def test_advisor_and_its_html() -> None:
    ev = ClusterEvidence(kind="ascend_pt")
    msg = {"tables": [], "problems": {"headers": ["category", "description"], "data": [["slow rank", "d"]]}}
    run = RunOutcome("advisor", returncode=0, agent=AgentMessage(found=True, status="success", message=msg),
                     tables={"RankDeviceMap": [{"rankId": 0, "profilePath": "/p0"}]})
    assert interpret_run(run, GOOD, 4, ev).status == "ok" and ev.rank_paths == {0: "/p0"} and ev.advisor["problems"]
    empty = RunOutcome("advisor", returncode=0, agent=AgentMessage(found=True, status="success"))
    assert interpret_run(empty, GOOD, 4, ev).status == "no_data"
    html = RunOutcome("advisor_html", returncode=0, files=["/o/mstt_advisor_1.html"])
    assert interpret_run(html, GOOD, 4, ev).status == "ok" and ev.notes[-1].endswith("mstt_advisor_1.html")
    assert interpret_run(RunOutcome("advisor_html", returncode=0), GOOD, 4, ev).status == "no_data"


def test_a_run_killed_at_the_memory_cap_is_oom_whatever_it_left() -> None:
    ev = ClusterEvidence(kind="ascend_pt")
    for name in ("cluster_time_summary", "slow_rank", "advisor"):
        run = RunOutcome(name, returncode=None, timed_out=False, oom=True, duration_s=31.0, phase="enrich",
                         oom_detail="resident memory of its process group reached 900 MiB, over the cap of 512 MiB",
                         peak_rss_bytes=900 * 2**20)
        st = interpret_run(run, GOOD, 4, ev)
        assert st.status == "oom" and st.detail.startswith("killed after 31 s: resident memory")
        assert st.phase == "enrich" and st.peak_rss_bytes == 900 * 2**20


def test_concurrency_from_the_cpu_count_unless_set() -> None:
    auto = MsprofSettings()
    assert [concurrent_runs(auto, n) for n in (1, 2, 3, 4, 16, 64)] == [1, 2, 2, 2, 2, 2]
    assert concurrent_runs(MsprofSettings(max_concurrent_runs=3), 2) == 3


def test_memory_cap_is_the_setting_else_a_share_of_the_host() -> None:
    assert memory_cap_bytes(MsprofSettings(), 10 * 2**30) == int(0.4 * 10 * 2**30)
    assert memory_cap_bytes(MsprofSettings(memory_limit_bytes=2**30), 10 * 2**30) == 2**30
    assert memory_cap_bytes(MsprofSettings(), None) is None
    assert memory_cap_bytes(MsprofSettings(memory_limit="off", memory_limit_bytes=2**30), 2**34) is None


def _times(n: int, slow: dict[int, float] | None = None) -> dict[int, float]:
    return {r: 1000.0 + r % 7 + (slow or {}).get(r, 0.0) for r in range(n)}


def test_advisor_size_rule_whole_batch_subset_or_skip() -> None:
    hosts = {r: f"node{r // 8}" for r in range(512)}
    small = MsprofSettings(advisor_max_ranks=64)
    assert advisor_ranks(range(64), [3], _times(64), hosts, small) == (None, "")
    subset, why = advisor_ranks(range(512), [300, 17], _times(512, {300: 500.0, 17: 400.0}), hosts, small)
    assert subset is not None and 300 in subset and 17 in subset and len(subset) <= 64
    # each suspect brings a peer of its own node, and the references sit nearest the median step
    assert any(r != 300 and hosts[r] == "node37" for r in subset) and any(r != 17 and hosts[r] == "node2" for r in subset)
    assert len(subset) == 2 + 2 + small.advisor_reference_ranks
    assert "512 ranks > advisor_max_ranks 64" in why and "suspects [300, 17]" in why
    skip, why = advisor_ranks(range(512), [300], _times(512), hosts,
                              MsprofSettings(advisor_max_ranks=64, advisor_above_max="skip"))
    assert skip == [] and why.startswith("skipped by the size rule")
    # no suspect: references plus the slowest and the fastest rank
    refs, _ = advisor_ranks(range(512), [], _times(512, {5: 900.0}), hosts, small)
    assert refs is not None and 5 in refs and len(refs) >= 2


def test_with_input_points_a_command_at_another_staging() -> None:
    plan = plan_recipes(GOOD, MsprofSettings(), "/stage/b1")
    adv = next(c for c in plan.commands if c.name == "advisor")
    moved = with_input(adv, "/stage/b1-advisor-subset")
    assert moved.args[moved.args.index("-d") + 1] == "/stage/b1-advisor-subset" and moved.phase == "enrich"
    with pytest.raises(ValueError):
        with_input(adv, "relative")


@pytest.mark.parametrize(("log_text", "log_tail", "cause"), [
    ("[2026-12-02][ERROR][cluster_time_summary.py:355] Execute ClusterTimeSummary with exception: database or disk "
     "is full", "", "no space left"),
    ("", "--- Logging error ---\nOSError: [Errno 28] No space left on device\n", "no space left"),
    ("[ERROR] Execute SlowRank with exception: disk I/O error", "", "disk I/O error"),
    ("", "OSError: [Errno 122] Disk quota exceeded: '/o/x/cluster_analysis_output'", "disk quota exceeded"),
    ("sqlite3.OperationalError: attempt to write a readonly database\nOSError: [Errno 30] Read-only file system",
     "", "read-only file system"),
])
def test_a_full_disk_is_named_from_the_log_even_when_the_tool_exits_0(log_text: str, log_tail: str,
                                                                      cause: str) -> None:
    for name in ("cluster_time_summary", "slow_rank", "communication_matrix", "advisor"):
        st = interpret_run(RunOutcome(name, output_dir="/o/x", returncode=0, log_text=log_text, log_tail=log_tail,
                                      agent=AgentMessage(found=True, status="success")), GOOD, 4, ClusterEvidence(kind="ascend_pt"))
        assert st.status == "tool_error" and st.detail.startswith(f"{cause}: "), (name, st)
        assert "free space under /o/x" in st.detail


def test_other_log_lines_are_not_a_full_disk() -> None:
    assert disk_error("[INFO] Exporting data to database: /o/x/cluster_analysis_output/cluster_analysis.db") is None
    assert disk_error("[WARNING] No valid transmit and wait time") is None
