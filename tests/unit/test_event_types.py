"""The one table of event types (``core/alerts/event_types.py``): its consumers read it, nothing else spells a type."""

from __future__ import annotations

import re

from profwatch.adapters.outputs.alert_sinks import RESTORE_TYPES as SINK_RESTORE_TYPES
from profwatch.core.alerts.alertmanager import AlertBook
from profwatch.core.alerts.event_types import (
    ALERT_TYPES,
    BY_TYPE,
    EVENT_TYPES,
    JOB_ALERTNAMES,
    RESTORE_TYPES,
    TABLE,
    TYPE_JOB_ENDED,
    short_name,
)
from profwatch.core.alerts.events import AlertFormatError, make_cloudevent
from tests.conftest import REPO_ROOT

TYPE_STRING = re.compile(r"io\.profwatch\.\w+\.v\d+")
OWNER = REPO_ROOT / "daemon" / "profwatch" / "core" / "alerts" / "event_types.py"


def test_no_other_product_module_spells_an_event_type() -> None:
    files = [p for root in ("daemon", "rankhook") for p in sorted((REPO_ROOT / root).rglob("*.py")) if p != OWNER]
    assert len(files) > 100
    found = [f"{p.relative_to(REPO_ROOT)}: {m.group(0)}" for p in files
             for m in TYPE_STRING.finditer(p.read_text(encoding="utf-8"))]
    assert not found, "\n".join(found)


def test_table_rows_are_consistent() -> None:
    names = [e.name for e in TABLE]
    assert len(names) == len(set(names))
    assert EVENT_TYPES == {f"io.profwatch.{n}.v1" for n in names}
    assert ALERT_TYPES < EVENT_TYPES and set(RESTORE_TYPES) <= EVENT_TYPES
    for e in TABLE:
        assert TYPE_STRING.fullmatch(e.type), e
        assert (e.severity is None) == (not e.alertmanager), e  # an Alertmanager alert has a severity, and only then
        assert not e.job_alert or len(e.alertmanager) == 1, e
        assert e.resolved_by and e.summary, e
        if e.alertmanager:
            assert e.alert and e.restored_by_sinks, f"{e.name}: fires Alertmanager alerts, so it pages and is restored"
    assert short_name(TYPE_JOB_ENDED) == "job_ended" and short_name("x.y") == "x.y"


def test_consumers_read_the_table() -> None:
    assert SINK_RESTORE_TYPES is RESTORE_TYPES
    with_names = {e.type for e in TABLE if e.job_alert}
    assert set(JOB_ALERTNAMES) == with_names
    try:
        make_cloudevent("io.profwatch.not_in_table.v1", "j", {}, source="//t", now_unix_s=1.0)
    except AlertFormatError:
        pass
    else:
        raise AssertionError("an event type outside the table was accepted")


def test_each_job_alert_fires_its_table_name_and_severity() -> None:
    for type_, alertname in JOB_ALERTNAMES.items():
        book = AlertBook(cluster="c", resend_interval_s=60)
        ev = make_cloudevent(type_, "job1", {"capture_id": "c1", "detail": "x"}, source="//t", now_unix_s=10.0)
        posted = book.apply(ev, 10.0)
        assert [p["labels"]["alertname"] for p in posted] == [alertname], (type_, posted)
        assert posted[0]["labels"]["severity"] == BY_TYPE[type_].severity
        resolved = book.apply(make_cloudevent(TYPE_JOB_ENDED, "job1", {}, source="//t", now_unix_s=20.0), 20.0)
        assert [p["labels"]["alertname"] for p in resolved] == [alertname]  # job_ended resolves it


def test_docs_list_every_event_type() -> None:
    text = (REPO_ROOT / "docs" / "alerts.md").read_text(encoding="utf-8")
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^\| `(io\.profwatch\.\w+\.v\d+)` \| (yes|no) \|", text, re.M)}
    assert rows == {e.type: ("yes" if e.alert else "no") for e in TABLE}
