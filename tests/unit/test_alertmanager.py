"""Unit tests for profwatch.core.alerts.alertmanager (postable alerts, standing book, resolve rules; pure, fake clock)."""

from __future__ import annotations

import json

import pytest

from profwatch.core.alerts.alertmanager import AlertBook, judged_of, parse_time
from profwatch.core.alerts.events import (
    TYPE_ANALYSIS_ENRICHED,
    TYPE_ANALYSIS_FAILED,
    TYPE_ANOMALY,
    TYPE_BATCH_INCOMPLETE,
    TYPE_JOB_ENDED,
    TYPE_PATH_REFUSED,
    TYPE_SUSPECT_RANKS,
    make_cloudevent,
    rfc3339,
)

T0 = 1_764_500_000.0
RESEND = 10.0


def _suspect(rank: int, kind: str = "compute", host: str = "n0", score: float = 0.9) -> dict:
    return {"rank": rank, "score": score, "kind": kind, "hostname": host, "rank_dir": f"/p/{host}_{rank}_ascend_pt",
            "evidence": {"summary": f"rank {rank} computes longer", "effect_frac": 0.5,
                         "median_us": {"step_time_us": 60e3}, "peer_median_us": {"step_time_us": 40e3}}}


def _verdict(job: str, t: float, status: str, suspects: list[dict], judged: list[int] | None, cid: str = "c1") -> dict:
    data: dict = {"batch_id": f"b-{cid}", "capture_id": cid, "status": status, "suspects": suspects,
                  "world_size": 4, "paths": {"report_html": f"/w/{cid}/report.html"}}
    if judged is not None:
        data["judged_ranks"] = judged
    return make_cloudevent(TYPE_SUSPECT_RANKS, job, data, source="//t", now_unix_s=t, event_id=f"suspects-{cid}")


def _book() -> AlertBook:
    return AlertBook(cluster="c1", resend_interval_s=RESEND, max_suspects=3)


def test_suspects_fire_with_the_labels_and_annotations_alertmanager_needs():
    book = _book()
    out = book.apply(_verdict("j1", T0, "ok", [_suspect(2), _suspect(5, "host", "n1", 0.6)], [0, 1, 2, 3, 4, 5]), T0)
    assert len(out) == 2
    a, b = out
    assert a["labels"] == {"alertname": "ProfwatchSuspectRank", "job_id": "j1", "rank": "2", "hostname": "n0",
                           "kind": "compute", "severity": "critical", "cluster": "c1"}
    assert b["labels"]["severity"] == "warning" and b["labels"]["kind"] == "host"
    for key in ("summary", "description", "impact", "report", "rank_dir"):
        assert a["annotations"][key], key
    assert "+50%" in a["annotations"]["impact"] and "60.0 ms vs peer median 40.0 ms" in a["annotations"]["impact"]
    assert a["startsAt"] == rfc3339(T0) and a["endsAt"] == rfc3339(T0 + 4 * RESEND)
    assert a["generatorURL"] == "file:///w/c1/report.html"
    assert all(isinstance(v, str) for al in out for v in (*al["labels"].values(), *al["annotations"].values()))
    json.dumps(out)


def test_external_url_is_the_generator_url_and_empty_values_are_not_labels():
    book = AlertBook(cluster="c", resend_interval_s=RESEND, external_url="https://reports.example/profwatch")
    s = _suspect(1)
    s["hostname"] = None
    out = book.apply(_verdict("j1", T0, "ok", [s], None), T0)
    assert out[0]["generatorURL"] == "https://reports.example/profwatch" and "hostname" not in out[0]["labels"]


def test_standing_alerts_are_resent_with_a_fresh_end_until_resolved():
    book = _book()
    book.apply(_verdict("j1", T0, "ok", [_suspect(2)], [0, 1, 2, 3]), T0)
    first = book.due(T0)
    assert len(first) == 1 and first[0]["endsAt"] == rfc3339(T0 + 4 * RESEND)
    assert book.due(T0 + RESEND - 0.1) == []
    again = book.due(T0 + RESEND)
    assert again[0]["endsAt"] == rfc3339(T0 + 5 * RESEND) and again[0]["startsAt"] == rfc3339(T0)


@pytest.mark.parametrize("status", ["ok", "no_suspect"])
def test_a_later_verdict_that_judged_the_rank_not_slow_resolves_it(status: str):
    book = _book()
    book.apply(_verdict("j1", T0, "ok", [_suspect(2)], [0, 1, 2, 3]), T0)
    other = [_suspect(3)] if status == "ok" else []
    out = book.apply(_verdict("j1", T0 + 60, status, other, [0, 1, 2, 3], "c2"), T0 + 60)
    resolved = [a for a in out if a["labels"]["rank"] == "2"]
    assert resolved and resolved[0]["endsAt"] == rfc3339(T0 + 60)
    assert ("j1", "ProfwatchSuspectRank", 2) not in book.alerts
    assert [a["labels"]["rank"] for a in book.due(T0 + 61)] == (["3"] if status == "ok" else [])


def test_a_verdict_on_fewer_steps_than_the_one_that_fired_does_not_clear_the_page():
    """A new user's trial: a 4-step manual capture on a loaded box said no_suspect while rank 1 was 3x slow (the
    automatic 8-step captures named it); its "not slow" resolved the open alert."""
    book = _book()
    fired = _verdict("j1", T0, "ok", [_suspect(1)], [0, 1, 2, 3])
    fired["data"]["captured_steps"] = list(range(30, 38))  # 8 steps
    book.apply(fired, T0)
    short = _verdict("j1", T0 + 60, "no_suspect", [], [0, 1, 2, 3], "c2")
    short["data"]["captured_steps"] = [50, 51, 52, 53]
    # the page stands and says why: re-sent (same labels, same startsAt) with what the short capture found
    [held] = book.apply(short, T0 + 60)
    assert held["labels"]["rank"] == "1" and held["startsAt"] == rfc3339(T0) and held["endsAt"] > rfc3339(T0 + 60)
    assert held["annotations"]["held"] == (
        "capture c2 judged it not slow on 4 step(s), fewer than the 8 of the verdict that raised this alert and "
        "than 10: too short to clear it, so it stands until a capture of at least 8 steps judges it not slow")
    assert held["annotations"]["summary"] == book.alerts[("j1", "ProfwatchSuspectRank", 1)].annotations["summary"]
    assert book.apply(short, T0 + 61) == []  # said once
    as_long = _verdict("j1", T0 + 120, "no_suspect", [], [0, 1, 2, 3], "c3")
    as_long["data"]["captured_steps"] = list(range(60, 68))
    out = book.apply(as_long, T0 + 120)
    assert [a["labels"]["rank"] for a in out] == ["1"] and ("j1", "ProfwatchSuspectRank", 1) not in book.alerts


def test_a_page_a_sized_window_fired_is_cleared_by_a_capture_of_the_usual_window():
    """A small group's capture sized to 40 steps named the rank; after it healed, the job's next capture records
    the usual window (the default ``[capture] max_active``, 10 steps): its "not slow" resolves the page instead of
    leaving it standing until the job ends."""
    from profwatch.core.alerts.alertmanager import CLEAR_ENOUGH_STEPS
    from profwatch.core.capture.planner import CaptureSettings
    assert CLEAR_ENOUGH_STEPS == CaptureSettings().max_active
    book = _book()
    fired = _verdict("j1", T0, "ok", [_suspect(1)], [0, 1])
    fired["data"]["captured_steps"] = list(range(100, 140))  # 40 steps
    book.apply(fired, T0)
    nine = _verdict("j1", T0 + 60, "no_suspect", [], [0, 1], "c2")
    nine["data"]["captured_steps"] = list(range(200, 209))
    [held] = book.apply(nine, T0 + 60)
    assert ("j1", "ProfwatchSuspectRank", 1) in book.alerts
    assert "not slow on 9 step(s), fewer than the 40 " in held["annotations"]["held"]
    assert "a capture of at least 10 steps" in held["annotations"]["held"]
    usual = _verdict("j1", T0 + 120, "no_suspect", [], [0, 1], "c3")
    usual["data"]["captured_steps"] = list(range(300, 310))
    out = book.apply(usual, T0 + 120)
    assert [a["labels"]["rank"] for a in out] == ["1"] and ("j1", "ProfwatchSuspectRank", 1) not in book.alerts


def test_partial_targeted_other_job_and_old_events_resolve_nothing():
    book = _book()
    book.apply(_verdict("j1", T0, "ok", [_suspect(2)], [0, 1, 2, 3]), T0)
    assert book.apply(_verdict("j1", T0 + 2, "no_suspect", [], [0, 1], "c3"), T0 + 2) == []  # rank 2 not captured
    assert book.apply(_verdict("j2", T0 + 3, "no_suspect", [], [0, 1, 2, 3], "c4"), T0 + 3) == []  # other job
    assert book.apply(_verdict("j1", T0 + 4, "no_suspect", [], None, "c5"), T0 + 4) == []  # no judged_ranks
    assert book.apply(make_cloudevent(TYPE_ANOMALY, "j1", {"ranks": [2]}, source="s", now_unix_s=T0), T0) == []
    # partial: says so (its own warning) but resolves nothing
    out = book.apply(_verdict("j1", T0 + 5, "partial", [], [0, 1, 2, 3], "c2"), T0 + 5)
    assert [a["labels"]["alertname"] for a in out] == ["ProfwatchVerdictIncomplete"]
    assert list(book.alerts) == [("j1", "ProfwatchSuspectRank", 2), ("j1", "ProfwatchVerdictIncomplete", None)]


def test_a_still_slow_rank_keeps_its_start_and_changed_labels_replace_the_alert():
    book = _book()
    book.apply(_verdict("j1", T0, "ok", [_suspect(2)], [0, 1, 2, 3]), T0)
    same = book.apply(_verdict("j1", T0 + 60, "ok", [_suspect(2)], [0, 1, 2, 3], "c2"), T0 + 60)
    assert len(same) == 1 and same[0]["startsAt"] == rfc3339(T0)
    changed = book.apply(_verdict("j1", T0 + 90, "ok", [_suspect(2, "communication")], [0, 1, 2, 3], "c3"), T0 + 90)
    assert [(a["labels"]["kind"], a["endsAt"]) for a in changed] == [
        ("compute", rfc3339(T0 + 90)), ("communication", rfc3339(T0 + 90 + 4 * RESEND))]
    assert len(book.alerts) == 1


def test_job_level_alerts_resolve_on_a_verdict_or_job_end():
    book = _book()
    inc = make_cloudevent(TYPE_BATCH_INCOMPLETE, "j1", {"capture_id": "c1", "missing_ranks": [3]}, source="s",
                          now_unix_s=T0)
    refused = make_cloudevent(TYPE_PATH_REFUSED, "j1", {"problems": ["/etc outside"]}, source="s", now_unix_s=T0)
    out = book.apply(inc, T0) + book.apply(refused, T0)
    assert {a["labels"]["alertname"] for a in out} == {"ProfwatchBatchIncomplete", "ProfwatchPathRefused"}
    assert "rank" not in out[0]["labels"] and out[0]["annotations"]["description"] == "[3]"
    out = book.apply(_verdict("j1", T0 + 5, "partial", [], [0, 1]), T0 + 5)
    assert [a["labels"]["alertname"] for a in out] == ["ProfwatchBatchIncomplete", "ProfwatchVerdictIncomplete"]
    assert out[0]["endsAt"] == rfc3339(T0 + 5)  # the incomplete batch is resolved by a verdict
    failed = make_cloudevent(TYPE_ANALYSIS_FAILED, "j1", {"error": "boom"}, source="s", now_unix_s=T0 + 6)
    book.apply(failed, T0 + 6)
    book.apply(_verdict("j1", T0 + 7, "ok", [_suspect(1)], [0, 1]), T0 + 7)
    ended = make_cloudevent(TYPE_JOB_ENDED, "j1", {"last_report_unix_s": T0}, source="s", now_unix_s=T0 + 700)
    out = book.apply(ended, T0 + 700)
    assert {a["labels"]["alertname"] for a in out} == {"ProfwatchPathRefused", "ProfwatchSuspectRank"}
    assert all(a["endsAt"] == rfc3339(T0 + 700) for a in out) and not book.alerts


def test_max_suspects_caps_alerts_per_event():
    book = _book()
    out = book.apply(_verdict("j1", T0, "ok", [_suspect(r) for r in range(6)], list(range(8))), T0)
    assert [a["labels"]["rank"] for a in out] == ["0", "1", "2"]


def test_restore_rebuilds_the_book_from_stored_events_and_resends_at_once():
    evs = [_verdict("j1", T0, "ok", [_suspect(2), _suspect(3)], [0, 1, 2, 3]),
           _verdict("j1", T0 + 60, "ok", [_suspect(3)], [0, 1, 2, 3], "c2"),
           _verdict("j2", T0 + 61, "ok", [_suspect(0)], [0, 1], "c3"),
           make_cloudevent(TYPE_JOB_ENDED, "j2", {}, source="s", now_unix_s=T0 + 900)]
    book = _book()
    assert book.restore(evs) == 1
    due = book.due(T0 + 1000)
    assert [(a["labels"]["job_id"], a["labels"]["rank"]) for a in due] == [("j1", "3")]
    # rank 3 went from suspect #2 (warning) to #1 (critical): a new label set, so a new start
    assert due[0]["labels"]["severity"] == "critical" and due[0]["startsAt"] == rfc3339(T0 + 60)
    assert due[0]["endsAt"] == rfc3339(T0 + 1000 + 4 * RESEND)


def test_helpers_are_total():
    assert parse_time("2025-11-30T10:00:00.250Z", 0) == pytest.approx(1764496800.25)
    assert parse_time("garbage", 7.0) == 7.0 and parse_time(None, 3.0) == 3.0
    assert judged_of({"ranks": [{"rank": 1}, {"rank": "x"}, "y"]}) == {1}
    assert judged_of({"judged_ranks": [1, True, "2", 3]}) == {1, 3}
    assert judged_of({}) == set()
    book = _book()
    assert book.apply({"type": TYPE_SUSPECT_RANKS, "subject": "", "data": {}}, T0) == []
    assert book.apply({"type": TYPE_SUSPECT_RANKS, "subject": "j", "data": "not a dict"}, T0) == []
    assert book.apply(_verdict("j", T0, "ok", [{"rank": "2"}, {"no": 1}], [0]), T0) == []


def _ended(a: dict, t: float) -> bool:
    return a["endsAt"] == rfc3339(t)


def test_the_impact_annotation_leads_with_the_what_if_saving_when_the_verdict_has_one():
    s = _suspect(2)
    s["impact"] = {"saving_s_per_step": 0.012, "saving_pct_of_step": 8.0, "accelerator_hours_per_day": 46.1}
    (a,) = _book().apply(_verdict("j1", T0, "ok", [s], [0, 1, 2, 3]), T0)
    assert a["annotations"]["impact"] == ("fixing rank 2 alone would save 12.0 ms per step (8.0% of the mean step, "
                                          "46.1 accelerator-hours per day)")
    s["impact"] = {"saving_s_per_step": "lots"}  # malformed: the evidence-based text instead, never a crash
    (b,) = _book().apply(_verdict("j1", T0, "ok", [s], [0, 1, 2, 3]), T0)
    assert "+50%" in b["annotations"]["impact"]


def test_a_partial_verdict_without_suspects_still_reaches_alertmanager_and_the_next_full_verdict_resolves_it():
    book = _book()
    ev = _verdict("j1", T0, "partial", [], [0, 1, 2])
    ev["data"]["unjudged_ranks"] = [{"rank": 3, "reason": "no usable device data"}]
    ev["data"]["detail"] = "nobody stands out among the judged ranks; 1 rank(s) could not be judged"
    (a,) = book.apply(ev, T0)
    assert a["labels"]["alertname"] == "ProfwatchVerdictIncomplete" and a["labels"]["severity"] == "warning"
    assert "rank 3: no usable device data" in a["annotations"]["description"]
    assert not _ended(a, T0)
    assert book.apply(_verdict("j1", T0 + 5, "partial", [], [0, 1, 2], cid="c2"), T0 + 5)[0]["labels"] == a["labels"]
    (r,) = book.apply(_verdict("j1", T0 + 60, "no_suspect", [], [0, 1, 2, 3], cid="c3"), T0 + 60)
    assert r["labels"] == a["labels"] and _ended(r, T0 + 60)
    assert not book.alerts


def test_weak_verdicts_warn_too_and_another_job_resolves_nothing():
    book = _book()
    out = book.apply(_verdict("j1", T0, "weak", [_suspect(1, score=0.5)], [0, 1, 2, 3]), T0)
    assert {a["labels"]["alertname"] for a in out} == {"ProfwatchVerdictIncomplete", "ProfwatchSuspectRank"}
    assert book.apply(_verdict("j2", T0 + 1, "no_suspect", [], [0, 1, 2, 3]), T0 + 1) == []
    assert len(book.alerts) == 2


def test_a_slow_link_fires_one_link_alert_and_resolves_only_when_both_ends_were_judged():
    book = _book()
    link = {"ranks": [5, 4], "group": "tp0", "bandwidth_gbps": 3.2, "peer_median_gbps": 18.5,
            "impact": {"saving_s_per_step": 0.004, "saving_pct_of_step": 2.5, "accelerator_hours_per_day": 3.0}}
    ev = _verdict("j1", T0, "ok", [], list(range(8)))
    ev["data"]["links"] = [link, {"ranks": [1, 1]}, {"ranks": "x"}]  # malformed links are ignored
    (a,) = book.apply(ev, T0)
    assert a["labels"] == {"alertname": "ProfwatchSlowLink", "job_id": "j1", "link": "4-5", "kind": "communication",
                           "group": "tp0", "severity": "warning", "cluster": "c1"}
    assert "3.2 GB/s against a peer median of 18.5 GB/s" in a["annotations"]["summary"]
    assert a["annotations"]["impact"].startswith("fixing this link alone would save 4.0 ms per step")
    # a targeted capture that judged only one end resolves nothing
    assert book.apply(_verdict("j1", T0 + 30, "no_suspect", [], [0, 1, 2, 3, 4], cid="c2"), T0 + 30) == []
    (r,) = book.apply(_verdict("j1", T0 + 60, "no_suspect", [], list(range(8)), cid="c3"), T0 + 60)
    assert r["labels"]["link"] == "4-5" and _ended(r, T0 + 60)


def test_the_enriched_update_refreshes_the_same_alerts_and_keeps_their_start():
    book = _book()
    first = _verdict("j1", T0, "ok", [_suspect(2)], [0, 1, 2, 3])
    first["data"]["pending_recipes"] = ["advisor", "report_html"]
    (fired,) = book.apply(first, T0)
    assert fired["annotations"]["analysis"] == "first verdict; follow-up coming: advisor, report_html"
    data = {**first["data"], "pending_recipes": [], "follow_up": True,
            "recipes": {"advisor": {"status": "oom"}, "communication_matrix": {"status": "ok"}},
            "links": [{"ranks": [0, 3], "group": "g", "bandwidth_gbps": 5.0, "peer_median_gbps": 20.0}]}
    later = make_cloudevent(TYPE_ANALYSIS_ENRICHED, "j1", data, source="//t", now_unix_s=T0 + 60,
                            event_id="enriched-c1")
    out = book.apply(later, T0 + 60)
    rank = next(a for a in out if a["labels"]["alertname"] == "ProfwatchSuspectRank")
    assert rank["startsAt"] == rfc3339(T0) and rank["annotations"]["cloudevent_id"] == "enriched-c1"
    assert rank["annotations"]["analysis"] == "enriched: advisor=oom, communication_matrix=ok"
    assert any(a["labels"]["alertname"] == "ProfwatchSlowLink" for a in out)  # slow links come with the follow-up
    assert len(book.alerts) == 2 and not [a for a in out if a["endsAt"] == rfc3339(T0 + 60)]


def test_a_rotating_culprit_fires_one_job_alert_resolved_when_its_episode_closes() -> None:
    from profwatch.core.alerts.event_types import TYPE_CULPRIT_ROTATES, TYPE_EPISODE_CLOSED

    book = _book()
    text = "culprit rotates: ranks 0, 3, 6 in the last 3 captures: load imbalance, e.g. MoE routing"
    ev = make_cloudevent(TYPE_CULPRIT_ROTATES, "j1", {"episode_id": "ep-1", "rotation": [0, 3, 6], "detail": text},
                         source="//t", now_unix_s=10.0)
    (fired,) = book.apply(ev, 10.0)
    assert fired["labels"]["alertname"] == "ProfwatchCulpritRotates" and fired["labels"]["severity"] == "warning"
    assert text == fired["annotations"]["description"] and "balance the load" in fired["annotations"]["impact"]
    other = make_cloudevent(TYPE_EPISODE_CLOSED, "j1", {"episode_id": "ep-2", "rotation": []}, source="//t",
                            now_unix_s=20.0)
    assert book.apply(other, 20.0) == []  # an episode that did not rotate resolves nothing
    closed = make_cloudevent(TYPE_EPISODE_CLOSED, "j1", {"episode_id": "ep-1", "rotation": [0, 3, 6]},
                             source="//t", now_unix_s=30.0)
    (resolved,) = book.apply(closed, 30.0)
    assert resolved["labels"]["alertname"] == "ProfwatchCulpritRotates" and resolved["endsAt"] == rfc3339(30.0)


def test_two_rotating_episodes_of_one_job_are_two_alerts_each_resolved_by_its_own_episode() -> None:
    from profwatch.core.alerts.event_types import TYPE_CULPRIT_ROTATES, TYPE_EPISODE_CLOSED

    book = _book()
    for ep, ranks, t in (("ep-a", [0, 3, 6], 10.0), ("ep-b", [1, 2, 5], 11.0)):
        (fired,) = book.apply(make_cloudevent(TYPE_CULPRIT_ROTATES, "j1", {"episode_id": ep, "rotation": ranks},
                                              source="//t", now_unix_s=t), t)
        assert fired["labels"]["episode_id"] == ep and fired["endsAt"] > rfc3339(t)
    assert len(book.alerts) == 2  # the second episode did not replace the first one's alert
    closed = make_cloudevent(TYPE_EPISODE_CLOSED, "j1", {"episode_id": "ep-a", "rotation": [0, 3, 6]},
                             source="//t", now_unix_s=30.0)
    (resolved,) = book.apply(closed, 30.0)
    assert resolved["labels"]["episode_id"] == "ep-a" and resolved["endsAt"] == rfc3339(30.0)
    assert [k[2] for k in book.alerts] == ["ep-b"]  # ep-b still fires


def _enriched(job: str, t: float, suspects: list[dict], judged: list[int], cid: str = "c1", **extra) -> dict:
    data = {"batch_id": f"b-{cid}", "capture_id": cid, "status": "ok", "suspects": suspects, "judged_ranks": judged,
            "world_size": 4, "follow_up": True, "recipes": {"advisor": {"status": "ok"}}} | extra
    return make_cloudevent(TYPE_ANALYSIS_ENRICHED, job, data, source="//t", now_unix_s=t, event_id=f"enriched-{cid}")


def _job_ended(job: str, t: float, generation: int | None = 0) -> dict:
    data = {"last_report_unix_s": t - 600, "silent_s": 600.0} | ({"generation": generation} if generation is not None
                                                                else {})
    return make_cloudevent(TYPE_JOB_ENDED, job, data, source="//t", now_unix_s=t, event_id=f"job_ended-{job}-{t}")


@pytest.mark.parametrize("flagged", [True, False])
def test_a_verdict_after_the_job_ended_never_fires_again_in_that_generation(flagged: bool) -> None:
    """Issue 33 #1: the enrich follow-up (or an incomplete capture) judged after ``job_ended`` paged on-call again.
    Flagged: the coordinator's ``job_ended: true``; unflagged: an event stored before the field existed."""
    book = _book()
    first = _verdict("j1", T0, "ok", [_suspect(2)], [0, 1, 2, 3])
    first["data"]["generation"] = 0
    assert len(book.apply(first, T0)) == 1
    out = book.apply(_job_ended("j1", T0 + 700), T0 + 700)
    assert [a["endsAt"] for a in out] == [rfc3339(T0 + 700)] and not book.alerts
    extra = {"generation": 0} | ({"job_ended": True} if flagged else {})
    late = [_enriched("j1", T0 + 924, [_suspect(2)], [0, 1, 2, 3], **extra),
            make_cloudevent(TYPE_BATCH_INCOMPLETE, "j1", {"capture_id": "c9", "missing_ranks": [1]} | extra,
                            source="s", now_unix_s=T0 + 1420),
            make_cloudevent(TYPE_SUSPECT_RANKS, "j1", {"capture_id": "c8", "status": "partial", "suspects": [_suspect(3)],
                                                       "judged_ranks": [3]} | extra, source="s", now_unix_s=T0 + 1500)]
    for ev in late:
        assert book.apply(ev, T0 + 1500) == []
    assert not book.alerts and book.due(T0 + 2000) == []
    # restore after a restart gives the same answer
    again = _book()
    assert again.restore([first, _job_ended("j1", T0 + 700), *late]) == 0 and again.due(T0 + 2000) == []
    # a new generation (requeue) alerts as usual
    new = _verdict("j1", T0 + 3000, "ok", [_suspect(1)], [0, 1], cid="c10")
    new["data"] |= {"generation": 1, "job_ended": False}
    assert [a["labels"]["rank"] for a in book.apply(new, T0 + 3000)] == ["1"]


def test_a_job_live_again_in_its_generation_alerts_again_and_the_memory_is_bounded() -> None:
    from profwatch.core.fleet.job_end import EndedJobs

    book = _book()
    book.apply(_job_ended("j1", T0), T0)
    ev = _verdict("j1", T0 + 10, "ok", [_suspect(2)], [0, 1, 2, 3])
    ev["data"] |= {"generation": 0, "job_ended": False}  # the coordinator saw it report after its end
    assert len(book.apply(ev, T0 + 10)) == 1 and not book.ended.ended("j1", 0)
    ended = EndedJobs(max_items=3)
    for i in range(5):
        ended.mark(f"j{i}", 0, T0 + i)
    assert [ended.ended(f"j{i}", 0) for i in range(5)] == [False, False, True, True, True]
    assert ended.revive("j4", 0) and not ended.revive("j0", 0)  # j0 was evicted: nothing to revive
    assert ended.ended("j3", 0) and not ended.ended("j4", 0) and not ended.ended("j3", None)
    with pytest.raises(ValueError):
        EndedJobs(0)


def test_the_enrich_follow_up_updates_only_standing_rank_alerts() -> None:
    book = _book()
    book.apply(_verdict("j1", T0, "ok", [_suspect(2)], [0, 1, 2, 3]), T0)
    book.apply(_verdict("j1", T0 + 30, "ok", [], [0, 1, 2, 3], cid="c2"), T0 + 30)  # rank 2 resolved by a later verdict
    assert not book.alerts
    out = book.apply(_enriched("j1", T0 + 60, [_suspect(2)], [0, 1, 2, 3]), T0 + 60)
    assert out == [] and not book.alerts  # the follow-up of c1 does not bring rank 2 back
    book.apply(_verdict("j1", T0 + 90, "ok", [_suspect(1)], [0, 1, 2, 3], cid="c3"), T0 + 90)
    out = book.apply(_enriched("j1", T0 + 120, [_suspect(1), _suspect(3)], [0, 1, 2, 3], cid="c3"), T0 + 120)
    assert [a["labels"]["rank"] for a in out] == ["1"] and out[0]["startsAt"] == rfc3339(T0 + 90)
