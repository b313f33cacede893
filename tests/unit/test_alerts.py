"""Unit tests for profwatch.core.alerts.events (CloudEvents 1.0 envelopes, suspect event data; pure)."""

from __future__ import annotations

import json

import pytest

from profwatch.core.alerts.events import (
    TYPE_JOB_ENDED,
    TYPE_SUSPECT_RANKS,
    AlertFormatError,
    judged_ranks,
    make_cloudevent,
    rfc3339,
    suspect_alert_data,
)
from profwatch.core.verdict.evidence import RankStepSummary, RecipeStatus, Suspect

NOW = 1_764_500_000.25


def _data() -> dict:
    sus = [Suspect(2, 0.93, "compute", "node1", {"summary": "computation 60 ms vs 40 ms"}, "/p/node1_2_ascend_pt"),
           Suspect(5, 0.61, "host", "node2", {"summary": "idle"}, "/p/node2_5_ascend_pt")]
    rows = [RankStepSummary(r, s, 64e3, 40e3 + (20e3 if r == 2 else 0), 20e3, 0 if r == 2 else 19e3, 4e3, 500)
            for r in range(4) for s in (1, 2, 3)]
    recipes = {"slow_rank": RecipeStatus("slow_rank", "ok", tables=["SlowRank"], rows=1),
               "advisor": RecipeStatus("advisor", "tool_error", "rc 1", log_tail="boom")}
    return suspect_alert_data(batch_id="b1", job_id="j1", kind="ascend_pt", status="ok", suspects=sus,
                              summaries=rows, recipes=recipes, capture_reason="step_time_spike",
                              paths={"staging": "/s", "report_html": "/r/report.html", "advisor_html": None},
                              world_size=4)


def test_rfc3339():
    assert rfc3339(0) == "1970-01-01T00:00:00.000Z"
    assert rfc3339(NOW).endswith(".250Z")


def test_cloudevent_required_attributes_and_deterministic_id():
    data = _data()
    ev = make_cloudevent(TYPE_SUSPECT_RANKS, "j1", data, source="//profwatch/coord/h1", now_unix_s=NOW)
    assert ev["specversion"] == "1.0" and ev["type"] == TYPE_SUSPECT_RANKS and ev["subject"] == "j1"
    assert ev["datacontenttype"] == "application/json" and ev["source"] == "//profwatch/coord/h1"
    assert ev["time"] == rfc3339(NOW) and len(ev["id"]) == 32
    assert ev == make_cloudevent(TYPE_SUSPECT_RANKS, "j1", data, source="//profwatch/coord/h1", now_unix_s=NOW)
    assert make_cloudevent(TYPE_SUSPECT_RANKS, "j1", data, source="s", now_unix_s=NOW, event_id="x")["id"] == "x"
    json.dumps(ev)  # serialisable


def test_suspect_data_shape():
    data = _data()
    assert [s["rank"] for s in data["suspects"]] == [2, 5]
    assert data["ranks"][2]["computation_us"] == 60e3 and data["ranks"][0]["steps"] == 3
    assert data["recipes"]["advisor"]["status"] == "tool_error"
    assert "advisor_html" not in data["paths"] and data["paths"]["report_html"] == "/r/report.html"


@pytest.mark.parametrize("bad", [{"type_": "nope"}, {"job_id": ""}, {"source": ""}])
def test_cloudevent_rejects(bad):
    kw = {"type_": TYPE_SUSPECT_RANKS, "job_id": "j", "data": {}, "source": "s", "now_unix_s": NOW} | bad
    with pytest.raises(AlertFormatError):
        make_cloudevent(**kw)


def test_judged_ranks_are_the_ranks_with_a_time_breakdown():
    data = _data()
    assert data["judged_ranks"] == [0, 1, 2, 3]
    rows = [RankStepSummary(r, 1, 64e3, 40e3, 20e3, 0, 4e3, 500) for r in (5, 2)]
    rows.append(RankStepSummary(7, -1, 0, 0, 0, 0, 0, 0))  # a per-rank total row, not a step: not judged
    assert judged_ranks(rows) == [2, 5]
    assert judged_ranks([]) == []


def test_job_ended_is_an_event_type():
    ev = make_cloudevent(TYPE_JOB_ENDED, "j1", {"last_report_unix_s": NOW, "silent_s": 600.0}, source="s",
                         now_unix_s=NOW + 600)
    assert ev["type"] == "io.profwatch.job_ended.v1" and ev["subject"] == "j1"
