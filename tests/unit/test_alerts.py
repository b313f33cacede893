"""Unit tests for daemon.core.alerts (CloudEvents 1.0 and Alertmanager webhook v4 shapes; pure)."""

from __future__ import annotations

import json

import pytest

from daemon.core.alerts import (
    ALERTMANAGER_ZERO_TIME,
    TYPE_BATCH_INCOMPLETE,
    TYPE_SUSPECT_RANKS,
    AlertFormatError,
    make_cloudevent,
    rfc3339,
    suspect_alert_data,
    to_alertmanager,
)
from daemon.core.evidence import RankStepSummary, RecipeStatus, Suspect

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


def test_alertmanager_v4_payload():
    ev = make_cloudevent(TYPE_SUSPECT_RANKS, "j1", _data(), source="s", now_unix_s=NOW)
    ev2 = make_cloudevent(TYPE_BATCH_INCOMPLETE, "j1", {"batch_id": "b2", "detail": "rank 3 missing"}, source="s",
                          now_unix_s=NOW + 1)
    p = to_alertmanager([ev, ev2], external_url="http://coord:9000")
    assert set(p) == {"receiver", "status", "alerts", "groupLabels", "commonLabels", "commonAnnotations",
                      "externalURL", "version", "groupKey", "truncatedAlerts"}
    assert p["version"] == "4" and p["status"] == "firing" and p["truncatedAlerts"] == 0
    a0, a1, a2 = p["alerts"]
    assert a0["labels"]["rank"] == "2" and a0["labels"]["severity"] == "critical" and a1["labels"]["rank"] == "5"
    assert a0["labels"]["alertname"] == "ProfwatchSuspectRank" and a2["labels"]["alertname"] == "ProfwatchBatchIncomplete"
    assert a0["endsAt"] == ALERTMANAGER_ZERO_TIME and a0["startsAt"] == ev["time"]
    assert a0["annotations"]["rank_dir"] == "/p/node1_2_ascend_pt" and "computation" in a0["annotations"]["description"]
    assert len({a["fingerprint"] for a in p["alerts"]}) == 3
    assert p["commonLabels"] == {"job_id": "j1", "source": "profwatch"}
    assert p["groupLabels"] == {"job_id": "j1"} and p["groupKey"] == '{}:{job_id="j1"}'
    json.dumps(p)


def test_alertmanager_truncation_and_empty():
    ev = make_cloudevent(TYPE_SUSPECT_RANKS, "j1", _data(), source="s", now_unix_s=NOW)
    p = to_alertmanager([ev], external_url="http://x", max_alerts=1)
    assert len(p["alerts"]) == 1 and p["truncatedAlerts"] == 1
    assert p["groupLabels"]["alertname"] == "ProfwatchSuspectRank"
    empty = make_cloudevent(TYPE_SUSPECT_RANKS, "j1", {"suspects": []}, source="s", now_unix_s=NOW)
    assert to_alertmanager([empty], external_url="http://x")["alerts"] == []
    with pytest.raises(AlertFormatError):
        to_alertmanager([{"type": "x"}], external_url="http://x")
