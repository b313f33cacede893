"""The Alertmanager sink against a real Alertmanager (Debian's prometheus-alertmanager) on loopback: a live
coordinator's suspect alert appears with the right labels, stays firing across re-sends, resolves on a later
balanced capture or when the job ends, survives a coordinator restart; an unreachable, refusing or hanging
Alertmanager never blocks the coordinator and is counted."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from profwatch.adapters.zmq.control import call
from profwatch.core.alerts.alertmanager import parse_time
from profwatch.core.alerts.events import TYPE_ANALYSIS_ENRICHED, TYPE_BATCH_INCOMPLETE, TYPE_SUSPECT_RANKS
from profwatch.simulate.ascend_tree import generate_cluster
from profwatch.simulate.launcher import free_port
from tests.conftest import wait_for
from tests.integration.sink_support import Alertmanager, CoordinatorHarness, Recorder

RESEND_S = 1.0
LIFETIME_S = 4 * RESEND_S


@pytest.fixture
def notifications() -> Iterator[Recorder]:
    r = Recorder()
    yield r
    r.close()


@pytest.fixture
def alertmanager(short_tmp: Path, notifications: Recorder) -> Iterator[Alertmanager]:
    am = Alertmanager(short_tmp / "am", notifications.url)
    yield am
    am.close()


@pytest.fixture
def harnesses() -> Iterator[list[CoordinatorHarness]]:
    hs: list[CoordinatorHarness] = []
    yield hs
    for h in hs:
        h.close()


def _am_section(url: str, **over: Any) -> dict[str, Any]:
    return {"url": url, "resend_interval_s": RESEND_S, "cluster": "testcluster", "timeout_s": 2.0, "retries": 1,
            "backoff_s": 0.1} | over


def _verdict(status: str, suspects: list[int], judged: list[int], cid: str) -> dict[str, Any]:
    return {"batch_id": f"b-{cid}", "capture_id": cid, "status": status, "world_size": len(judged) or 4,
            "judged_ranks": judged, "paths": {"report_html": f"/w/{cid}/report.html"},
            "suspects": [{"rank": r, "score": 0.9, "kind": "compute", "hostname": "fake", "rank_dir": f"/p/{r}",
                          "evidence": {"summary": f"rank {r} computes longer", "effect_frac": 0.4}}
                         for r in suspects]}


def _resolved_notifications(rec: Recorder, job: str, rank: str) -> list[dict[str, Any]]:
    out = []
    for body in rec.json_bodies():
        for a in body.get("alerts", []):
            if a["status"] == "resolved" and a["labels"].get("job_id") == job and a["labels"].get("rank") == rank:
                out.append(a)
    return out


def _armed_config(cfg: Path, capture_id: str) -> dict[str, Any]:
    def read() -> dict[str, Any] | None:
        try:
            d = json.loads((cfg / "profiler_config.json").read_text())
        except (OSError, ValueError):
            return None
        return d if (d.get("metadata") or {}).get("profwatch_capture_id") == capture_id else None

    return wait_for(read, 30, 0.1, f"profiler_config.json armed for {capture_id}")


def _furthest(h: CoordinatorHarness, job_id: str) -> int | None:
    """The job's furthest step in ``status``; None while the coordinator has not seen the job yet."""
    jobs = call(h.control, "status", {"job_id": job_id})["jobs"]
    return jobs[0]["furthest_step"] if jobs else None


def _stays_firing(am: Alertmanager, seconds: float, **labels: str) -> list[float]:
    """Poll for ``seconds``; every poll must find the alert. Returns the endsAt values seen (Unix s)."""
    ends = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = am.alerts_strict(**labels)
        assert found, f"alert {labels} disappeared while it should stand"
        ends.append(parse_time(found[0]["endsAt"], 0.0))
        time.sleep(0.3)
    return ends


@pytest.mark.slow
def test_live_capture_alert_reaches_alertmanager_stays_and_a_balanced_capture_resolves_it(
        short_tmp: Path, alertmanager: Alertmanager, notifications: Recorder, harnesses) -> None:
    h = CoordinatorHarness(short_tmp, alertmanager=_am_section(alertmanager.url))
    harnesses.append(h)
    cfg, prof = short_tmp / "cfg" / "jobA", short_tmp / "prof"
    cfg.mkdir(parents=True)
    h.hellos("jobA", 4, cfg, prof)
    h.steps("jobA", 4, 1, 12)
    wait_for(lambda: _furthest(h, "jobA") == 12, 20)
    res = call(h.control, "arm", {"job_id": "jobA", "reason": "test", "active": 2})
    written = _armed_config(cfg, res["capture_id"])
    generate_cluster(Path(res["prof_dir"]), world_size=4, slow_ranks={2: 1.6}, capture_id=res["capture_id"],
                     metadata=written["metadata"])
    alert = wait_for(lambda: alertmanager.alerts(job_id="jobA"), 240, 0.3, "suspect alert in Alertmanager")[0]
    assert alert["labels"] == {"alertname": "ProfwatchSuspectRank", "job_id": "jobA", "rank": "2",
                               "hostname": alert["labels"]["hostname"], "kind": alert["labels"]["kind"],
                               "severity": "critical", "cluster": "testcluster"}
    assert alert["labels"]["kind"] in ("compute", "host", "communication", "unknown")
    for key in ("summary", "description", "impact", "report", "rank_dir"):
        assert alert["annotations"].get(key), key
    assert alert["generatorURL"].startswith("file:///") and alert["generatorURL"].endswith("report.html")
    # it stands across several re-sends, well past one lifetime (endsAt moves forward with each re-send)
    ends = _stays_firing(alertmanager, LIFETIME_S + 3 * RESEND_S, job_id="jobA", rank="2")
    assert max(ends) > min(ends) + RESEND_S
    # a later capture of the same job, balanced and covering every rank, resolves it
    h.steps("jobA", 4, 13, 30)
    wait_for(lambda: _furthest(h, "jobA") == 30, 20)
    # the verdict's follow-up (slow links) ends the capture's life; the alert stood all along
    wait_for(lambda: call(h.control, "captures", {"job_id": "jobA"})[-1]["state"] == "enriched", 120)
    res2 = call(h.control, "arm", {"job_id": "jobA", "reason": "recheck", "active": 2})
    written2 = _armed_config(cfg, res2["capture_id"])
    generate_cluster(Path(res2["prof_dir"]), world_size=4, capture_id=res2["capture_id"],
                     metadata=written2["metadata"], seed=7)
    verdict = wait_for(lambda: [e for e in h.events("jobA", alerts_only=True) if e["type"] == TYPE_SUSPECT_RANKS
                                and e["data"]["capture_id"] == res2["capture_id"]], 240, 0.3, "second verdict")[0]
    assert verdict["data"]["status"] == "no_suspect" and verdict["data"]["judged_ranks"] == [0, 1, 2, 3]
    wait_for(lambda: not alertmanager.alerts(job_id="jobA"), 20, 0.2, "alert resolved in Alertmanager")
    resolved = wait_for(lambda: _resolved_notifications(notifications, "jobA", "2"), 20, 0.2, "resolved notice")[0]
    # resolved by profwatch at the verdict: an expiry would end >= 3 re-send intervals after it (re-sends went on
    # until the verdict, each with a lifetime of 4 intervals)
    assert abs(parse_time(resolved["endsAt"], 0.0) - parse_time(verdict["time"], 0.0)) < RESEND_S


def _alive_wait(h: CoordinatorHarness, predicate: Any, timeout_s: float, what: str) -> Any:
    """``wait_for`` while the job's ranks keep reporting (so it does not end meanwhile)."""
    step = [100]

    def poll() -> Any:
        step[0] += 1
        h.steps("jobR", 2, step[0], step[0])
        return predicate()

    return wait_for(poll, timeout_s, 0.25, what)


def test_alerts_survive_a_coordinator_restart_and_resolve_at_job_end(
        short_tmp: Path, alertmanager: Alertmanager, notifications: Recorder, harnesses) -> None:
    sections = {"alertmanager": _am_section(alertmanager.url), "coordinator": {"job_end_after_s": 10.0}}
    h = CoordinatorHarness(short_tmp, **sections)
    harnesses.append(h)
    h.hellos("jobR", 2)
    h.steps("jobR", 2, 1, 3)
    h.emit(TYPE_SUSPECT_RANKS, "jobR", _verdict("ok", [1], [0, 1], "c1"), event_id="suspects-c1")
    h.emit(TYPE_BATCH_INCOMPLETE, "jobR", {"capture_id": "c0", "missing_ranks": [0]}, event_id="inc-c0")
    _alive_wait(h, lambda: len(alertmanager.alerts(job_id="jobR")) == 2, 30, "two alerts in Alertmanager")
    assert {a["labels"]["alertname"] for a in alertmanager.alerts_strict(job_id="jobR")} == {
        "ProfwatchSuspectRank", "ProfwatchBatchIncomplete"}
    h.stop()
    stopped = time.monotonic()
    h2 = CoordinatorHarness(short_tmp, start=False, **sections)
    harnesses.append(h2)
    h2.start()
    # the restarted coordinator rebuilt its standing alerts from the state store and keeps them alive
    _alive_wait(h2, lambda: time.monotonic() > stopped + LIFETIME_S + 1.5, 30, "past the old alerts' lifetime")
    assert {a["labels"]["alertname"] for a in alertmanager.alerts_strict(job_id="jobR")} == {
        "ProfwatchSuspectRank", "ProfwatchBatchIncomplete"}
    # a partial verdict resolves no rank, but a verdict was reached: the incomplete-batch alert resolves and a
    # job-level ProfwatchVerdictIncomplete says some ranks could not be judged
    h2.emit(TYPE_SUSPECT_RANKS, "jobR", _verdict("partial", [], [0, 1], "c2"), event_id="suspects-c2")
    _alive_wait(h2, lambda: sorted(a["labels"]["alertname"] for a in alertmanager.alerts(job_id="jobR")) == [
        "ProfwatchSuspectRank", "ProfwatchVerdictIncomplete"], 20, "incomplete-batch alert resolved")
    # the ranks fall silent: job_ended after job_end_after_s, and the rank's alert resolves
    ended = wait_for(lambda: [e for e in h2.events("jobR") if e["type"] == "io.profwatch.job_ended.v1"], 60, 0.2,
                     "job_ended event")[0]
    assert ended["data"]["silent_s"] >= 10.0
    wait_for(lambda: not alertmanager.alerts(job_id="jobR"), 20, 0.2, "alerts resolved at job end")
    wait_for(lambda: _resolved_notifications(notifications, "jobR", "1"), 20, 0.2, "resolved notification")




@pytest.mark.parametrize("kind", ["unreachable", "refusing", "failing", "hanging"])
def test_a_bad_alertmanager_never_blocks_the_coordinator_and_is_counted(short_tmp: Path, harnesses,
                                                                        kind: str) -> None:
    holder: Any = None
    if kind == "unreachable":
        url, outcome = f"http://127.0.0.1:{free_port()}", "failed"
    elif kind in ("refusing", "failing"):
        holder = Recorder(codes=[400 if kind == "refusing" else 503] * 1000)
        url, outcome = f"http://127.0.0.1:{holder.port}", "rejected" if kind == "refusing" else "failed"
    else:  # accepts connections (kernel backlog) and never answers
        holder = socket.socket()
        holder.bind(("127.0.0.1", 0))
        holder.listen(1000)
        url, outcome = f"http://127.0.0.1:{holder.getsockname()[1]}", "dropped"
    try:
        am = _am_section(url, timeout_s=1.0, retries=2, backoff_s=0.2, queue_size=4)
        h = CoordinatorHarness(short_tmp, alertmanager=am)
        harnesses.append(h)
        for i in range(40):
            h.emit(TYPE_SUSPECT_RANKS, f"job{i}", _verdict("ok", [i % 4], [0, 1, 2, 3], f"c{i}"),
                   event_id=f"suspects-c{i}")
        # the control socket answers promptly throughout, and every event was stored
        t0 = time.monotonic()
        for _ in range(10):
            assert call(h.control, "ping", timeout_s=2)["pong"]
        assert time.monotonic() - t0 < 10  # a loop that waited on the sink would answer late (2 s limit each)
        wait_for(lambda: len(h.events(alerts_only=True)) == 40, 20, what="40 alerts stored")
        assert h.coord is not None
        reg = h.coord.metrics.registry

        def counted() -> float:
            return reg.get_sample_value("profwatch_sink_requests_total",
                                        {"sink": "alertmanager", "outcome": outcome}) or 0.0

        wait_for(lambda: counted() >= 1, 30, 0.1, f"{outcome} counted")
        wait_for(lambda: reg.get_sample_value("profwatch_alertmanager_alerts_standing") == 40, 10, 0.1,
                 "40 alerts standing")
        t0 = time.monotonic()
        h.stop()  # stopping is prompt even with requests in flight
        assert time.monotonic() - t0 < 15
    finally:
        if isinstance(holder, Recorder):
            holder.close()
        elif holder is not None:
            holder.close()


def test_the_documented_route_is_valid_and_routes_profwatch_alerts(tmp_path: Path) -> None:
    import re
    import shutil
    import subprocess

    from tests.conftest import REPO_ROOT, require_tool

    amtool = shutil.which("amtool") or require_tool("amtool", "the route in docs/alerts.md is checked by Alertmanager's "
                                                    "amtool (Debian's prometheus-alertmanager ships it)")
    doc = (REPO_ROOT / "docs" / "alerts.md").read_text()
    route = re.search(r"```yaml\n(# alertmanager.yml\n.*?)```", doc, re.S)
    assert route, "docs/alerts.md lost its Alertmanager route"
    cfg = tmp_path / "alertmanager.yml"
    cfg.write_text(route.group(1))
    res = subprocess.run([amtool, "check-config", str(cfg)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and "SUCCESS" in res.stdout, res.stdout + res.stderr
    for labels, receiver in ((["alertname=ProfwatchSuspectRank", "job_id=j1", "severity=critical"], "training-oncall"),
                             (["alertname=ProfwatchBatchIncomplete", "job_id=j1"], "training-oncall"),
                             (["alertname=ProfwatchCoordinatorDown", "component=profwatch", "severity=critical"],
                              "profwatch-admins"),
                             (["alertname=ProfwatchStateStoreFailing", "component=profwatch"], "profwatch-admins"),
                             (["alertname=SomethingElse"], "default")):
        res = subprocess.run([amtool, "config", "routes", "test", f"--config.file={cfg}", *labels],
                             capture_output=True, text=True, timeout=60)
        assert res.stdout.strip() == receiver, (labels, res.stdout, res.stderr)


def _never_in_alertmanager(am: Alertmanager, job: str, for_s: float) -> None:
    """Poll Alertmanager for ``for_s`` seconds (past re-sends and lifetimes) and fail as soon as ``job`` alerts."""
    until = time.monotonic() + for_s
    polls = 0
    while time.monotonic() < until or polls < 3:
        assert am.alerts_strict(job_id=job) == [], "an alert fired for an ended job"
        polls += 1
        time.sleep(0.25)


def test_a_verdict_after_the_job_ended_is_information_and_never_pages_again_even_after_a_restart(
        short_tmp: Path, alertmanager: Alertmanager, notifications: Recorder, harnesses) -> None:
    """Issue 33 #1 live: the enrich follow-up and an incomplete capture judged after ``job_ended`` re-fired the
    ended job's alert (re-sent every resend interval, surviving a restart)."""
    sections = {"alertmanager": _am_section(alertmanager.url), "coordinator": {"job_end_after_s": 3.0}}
    h = CoordinatorHarness(short_tmp, **sections)
    harnesses.append(h)
    h.hellos("jobE", 2)
    h.steps("jobE", 2, 1, 3)
    wait_for(lambda: h.coord is not None and "jobE" in h.coord.registry.jobs, 30, 0.1, "job registered")
    h.emit(TYPE_SUSPECT_RANKS, "jobE", _verdict("ok", [1], [0, 1], "e1") | {"pending_recipes": ["advisor"]},
           event_id="suspects-e1")
    wait_for(lambda: len(alertmanager.alerts(job_id="jobE")) == 1, 30, 0.2, "the suspect alert fires")
    wait_for(lambda: [e for e in h.events("jobE") if e["type"] == "io.profwatch.job_ended.v1"], 60, 0.2, "job_ended")
    wait_for(lambda: not alertmanager.alerts(job_id="jobE"), 20, 0.2, "resolved at job end")
    # the follow-up of e1, and a capture judged incomplete, both after the end
    h.emit(TYPE_ANALYSIS_ENRICHED, "jobE", _verdict("ok", [1], [0, 1], "e1") | {"follow_up": True},
           event_id="enriched-e1")
    h.emit(TYPE_BATCH_INCOMPLETE, "jobE", {"capture_id": "e2", "missing_ranks": [0]}, event_id="inc-e2")
    wait_for(lambda: len([e for e in h.events("jobE") if e["id"] in ("enriched-e1", "inc-e2")]) == 2, 20, 0.2,
             "both late verdicts stored")
    late = [e for e in h.events("jobE") if e["id"] in ("enriched-e1", "inc-e2")]
    assert all(e["data"]["job_ended"] is True and e["data"]["generation"] == 0 for e in late)  # information
    _never_in_alertmanager(alertmanager, "jobE", LIFETIME_S + 2 * RESEND_S)
    h.stop()
    h2 = CoordinatorHarness(short_tmp, start=False, **sections)
    harnesses.append(h2)
    h2.start()
    h2.emit(TYPE_ANALYSIS_ENRICHED, "jobE", _verdict("ok", [1], [0, 1], "e3"), event_id="enriched-e3")
    wait_for(lambda: [e for e in h2.events("jobE") if e["id"] == "enriched-e3"], 20, 0.2, "stored after restart")
    assert [e for e in h2.events("jobE") if e["id"] == "enriched-e3"][0]["data"]["job_ended"] is True
    _never_in_alertmanager(alertmanager, "jobE", LIFETIME_S + 2 * RESEND_S)
    # the job reports again after its end: a new generation (resumed_after_end), live; the ended generation 0 stays
    # ended (its late verdicts stay information), and the next verdict, of the live generation, pages as usual
    h2.steps("jobE", 2, 4, 6)

    def live_again() -> bool:
        job = h2.coord.registry.jobs.get("jobE") if h2.coord is not None else None
        return job is not None and job.generation == 1 and not h2.coord._ended.ended("jobE", 1)

    wait_for(live_again, 20, 0.05, "job live again in a new generation")
    assert h2.coord._ended.ended("jobE", 0)
    h2.emit(TYPE_SUSPECT_RANKS, "jobE", _verdict("ok", [0], [0, 1], "e4"), event_id="suspects-e4")
    wait_for(lambda: [a["labels"]["rank"] for a in alertmanager.alerts(job_id="jobE")] == ["0"], 30, 0.2,
             "a live job's verdict fires")
