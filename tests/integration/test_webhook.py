"""The generic webhook: CloudEvents over HTTP (structured mode) parsed by a real CloudEvents consumer (the
``cloudevents`` SDK), Authorization from an env var or a file, TLS with a private CA and a client certificate;
and the HTTP poster under both sinks (retries, 4xx, dead port, full queue, prompt close)."""

from __future__ import annotations

import json
import os
import socket
import ssl
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cloudevents.core.bindings.http import HTTPMessage, from_http_event

from profwatch.adapters.outputs.alert_sinks import CloudEventsWebhookSink
from profwatch.adapters.outputs.http_post import HttpPoster, SinkConfigError
from profwatch.core.alerts.events import TYPE_ANOMALY, TYPE_SUSPECT_RANKS, make_cloudevent
from profwatch.core.alerts.settings import HttpClientSettings, WebhookSettings
from tests.conftest import require_tool, wait_for
from tests.integration.sink_support import CoordinatorHarness, Recorder


@pytest.fixture
def receiver() -> Iterator[Recorder]:
    r = Recorder()
    yield r
    r.close()


def _settings(**kw: object) -> HttpClientSettings:
    return HttpClientSettings(**({"timeout_s": 2.0, "retries": 2, "backoff_s": 0.01, "queue_size": 4} | kw))


def _consume(rec: Recorder) -> list:
    """What a CloudEvents consumer gets: each request parsed by the SDK's HTTP binding."""
    return [from_http_event(HTTPMessage(headers=h, body=b)) for h, b, _p in list(rec.requests)]


def test_live_coordinator_events_reach_a_cloudevents_consumer(short_tmp: Path, receiver: Recorder,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PW_TEST_WEBHOOK_AUTH", "Bearer t0ken")
    h = CoordinatorHarness(short_tmp, webhook={"url": receiver.url, "authorization_env": "PW_TEST_WEBHOOK_AUTH"})
    try:
        data = {"batch_id": "b1", "status": "ok", "judged_ranks": [0, 1],
                "suspects": [{"rank": 1, "score": 0.9, "kind": "compute", "hostname": "n1"}]}
        h.emit(TYPE_SUSPECT_RANKS, "jobW", data, event_id="suspects-c1")
        h.emit(TYPE_ANOMALY, "jobW", {"kind": "step_regression", "ranks": [1]})  # not an alert: not forwarded
        h.emit(TYPE_SUSPECT_RANKS, "jobW", data, event_id="suspects-c1")  # a duplicate: stored once, sent once
        wait_for(lambda: len(h.events("jobW")) == 2, 20, what="events stored")
        wait_for(lambda: receiver.requests, 20, what="webhook POST")
        time.sleep(0.5)  # a second (wrong) POST would arrive within this
        events = _consume(receiver)
    finally:
        h.close()
    assert len(events) == 1
    ev = events[0]
    assert ev.get_type() == TYPE_SUSPECT_RANKS and ev.get_id() == "suspects-c1" and ev.get_subject() == "jobW"
    assert ev.get_specversion() == "1.0" and ev.get_source() == h.settings.coordinator.event_source
    assert ev.get_time() is not None and ev.get_data()["suspects"][0]["rank"] == 1
    headers = receiver.requests[0][0]
    assert headers["content-type"].startswith("application/cloudevents+json")
    assert headers["authorization"] == "Bearer t0ken"
    assert not any(k.startswith("ce-") for k in headers)  # structured mode: attributes in the body only


def test_all_events_mode_and_authorization_file(tmp_path: Path, receiver: Recorder) -> None:
    auth = tmp_path / "auth"
    auth.write_text("Basic dXNlcjpwdw==\n")
    os.chmod(auth, 0o600)
    from profwatch.adapters.outputs.http_post import read_authorization

    s = WebhookSettings(url=receiver.url, events="all", authorization_file=auth, backoff_s=0.01)
    sink = CloudEventsWebhookSink(s, read_authorization(s, {}, "webhook"))
    try:
        for i, t in enumerate((TYPE_ANOMALY, TYPE_SUSPECT_RANKS)):
            ev = make_cloudevent(t, "j", {"i": i}, source="//t", now_unix_s=1.7e9 + i)
            sink.submit(ev, is_alert=t == TYPE_SUSPECT_RANKS, now_unix_s=1.7e9)
        assert sink.poster.flush(10)
    finally:
        sink.close()
    assert [e.get_type() for e in _consume(receiver)] == [TYPE_ANOMALY, TYPE_SUSPECT_RANKS]
    assert all(h["authorization"] == "Basic dXNlcjpwdw==" for h, _b, _p in receiver.requests)


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run([require_tool("openssl", "the TLS test makes its own certificates"), *args], cwd=cwd, check=True,
                   capture_output=True, timeout=60)


def _self_signed(d: Path, name: str) -> tuple[Path, Path]:
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.pem",
             "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1", cwd=d)
    return d / f"{name}.pem", d / f"{name}.key"


def test_tls_private_ca_and_client_certificate(tmp_path: Path) -> None:
    server_cert, server_key = _self_signed(tmp_path, "server")
    client_cert, client_key = _self_signed(tmp_path, "client")
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(server_cert, server_key)
    tls.verify_mode = ssl.CERT_REQUIRED  # mutual TLS: the server wants our client certificate
    tls.load_verify_locations(client_cert)
    rec = Recorder(tls=tls)
    body = b'{"specversion":"1.0","id":"1","source":"//t","type":"x"}'
    try:
        good = HttpPoster("webhook", rec.url, _settings(ca_file=server_cert, cert_file=client_cert,
                                                         key_file=client_key), content_type="application/json")
        no_client_cert = HttpPoster("webhook", rec.url, _settings(ca_file=server_cert, retries=0),
                                    content_type="application/json")
        unknown_ca = HttpPoster("webhook", rec.url, _settings(cert_file=client_cert, key_file=client_key,
                                                               retries=0), content_type="application/json")
        posters = [good, no_client_cert, unknown_ca]
        try:
            for p in posters:
                p.post(body)
                assert p.flush(20)
        finally:
            for p in posters:
                p.close()
        assert good.stats.sent == 1 and len(rec.requests) == 1
        assert no_client_cert.stats.failed == 1 and unknown_ca.stats.failed == 1
        with pytest.raises(SinkConfigError, match="TLS files cannot be loaded"):
            HttpPoster("webhook", rec.url, _settings(ca_file=tmp_path / "missing.pem"), content_type="x")
    finally:
        rec.close()


# -- the poster under both sinks --------------------------------------------------------------------------------

def test_500_then_200_is_retried_and_counted() -> None:
    r = Recorder(codes=[500, 503])
    seen: list[tuple[str, int]] = []
    try:
        p = HttpPoster("t", r.url, _settings(retries=3), content_type="application/json",
                       on_outcome=lambda o, n: seen.append((o, n)))
        p.post(b"{}")
        assert p.flush(10)
        p.close()
        assert p.stats.sent == 1 and p.stats.attempts == 3 and r.hits == 3 and len(r.requests) == 1
        assert seen.count(("retried", 1)) == 2 and ("sent", 1) in seen and ("queued", 1) in seen
    finally:
        r.close()


def test_4xx_is_not_retried() -> None:
    r = Recorder(codes=[400])
    try:
        p = HttpPoster("t", r.url, _settings(retries=3), content_type="application/json")
        p.post(b"{}")
        assert p.flush(10)
        p.close()
        assert p.stats.rejected == 1 and p.stats.attempts == 1
    finally:
        r.close()


def test_dead_port_gives_up_after_retries_and_never_blocks() -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    p = HttpPoster("t", f"http://127.0.0.1:{port}/x", _settings(timeout_s=0.5, retries=2, backoff_s=1.0, max_backoff_s=1.0),
                   content_type="application/json")
    t0 = time.monotonic()
    assert p.post(b"{}")
    assert time.monotonic() - t0 < 1.0  # posting in the caller's thread would take the two 1 s backoffs
    wait_for(lambda: p.stats.failed == 1, timeout_s=30, what="give up")
    assert p.stats.attempts == 3 and p.stats.sent == 0
    p.close()


def test_full_queue_drops_and_counts_and_close_is_prompt() -> None:
    r = Recorder(delay_s=30)  # the first POST hangs until released
    try:
        p = HttpPoster("t", r.url, _settings(timeout_s=30, retries=0, queue_size=2), content_type="application/json")
        t0 = time.monotonic()
        results = [p.post(b"{}") for _ in range(10)]
        assert time.monotonic() - t0 < 5  # never blocks the caller (the first POST hangs 30 s)
        wait_for(lambda: r.hits == 1, timeout_s=5, what="first POST in flight")
        assert results[:2] == [True, True] and results.count(False) >= 7
        assert p.stats.dropped >= 7
        r.release.set()
        assert p.flush(10)
        p.close()
        assert not p._thread.is_alive()
        assert p.post(b"{}") is False
    finally:
        r.close()


def test_close_interrupts_backoff() -> None:
    r = Recorder(codes=[500] * 10)
    try:
        p = HttpPoster("t", r.url, _settings(retries=5, backoff_s=60, max_backoff_s=60), content_type="x")
        p.post(b"{}")
        wait_for(lambda: r.hits >= 1, timeout_s=10, what="first attempt")
        t0 = time.monotonic()
        p.close(timeout_s=30)
        assert time.monotonic() - t0 < 20 and not p._thread.is_alive() and p.stats.sent == 0  # not the 60 s backoff
    finally:
        r.close()


def test_rejects_non_http_url() -> None:
    with pytest.raises(SinkConfigError):
        HttpPoster("t", "file:///etc/passwd", _settings(), content_type="x")


def _ids(rec: Recorder) -> list[str]:
    return [json.loads(b)["id"] for _h, b, _p in list(rec.requests)]


def test_deliveries_survive_an_outage_and_a_restart_in_order(short_tmp: Path) -> None:
    """Issue 24 item 15: the webhook answers 500 for a while (and the coordinator restarts meanwhile): every
    alert is kept (in the state store too), none is dropped, and all arrive once the receiver is back, in the
    order they were published."""
    rec = Recorder(codes=[500] * 1_000_000)
    webhook = {"url": rec.url, "backoff_s": 0.02, "max_backoff_s": 0.2, "retries": 0, "queue_size": 100}
    h = CoordinatorHarness(short_tmp, webhook=webhook)
    try:
        sent = [f"suspects-o{i}" for i in range(20)]
        for eid in sent[:12]:
            h.emit(TYPE_SUSPECT_RANKS, "jobO", {"batch_id": eid}, event_id=eid)
        wait_for(lambda: rec.hits >= 10, 30, what="failed attempts during the outage")
        h.stop()  # mid-outage: the undelivered events are in the state store's outbox
        h.start()
        for eid in sent[12:]:
            h.emit(TYPE_SUSPECT_RANKS, "jobO", {"batch_id": eid}, event_id=eid)
        wait_for(lambda: len(h.events("jobO")) == 20, 30, what="events stored")
        assert rec.requests == []
        rec.codes.clear()  # the receiver is back
        wait_for(lambda: len(rec.requests) >= 20, 60, what="every undelivered event re-sent")
        wait_for(lambda: h.coord is not None and h.coord.sinks.sinks[0].poster.depth() == 0, 20, what="outbox empty")
        m = h.coord.metrics.registry  # type: ignore[union-attr]
        assert (m.get_sample_value("profwatch_sink_requests_total", {"sink": "webhook", "outcome": "dropped"})
                or 0) == 0
    finally:
        h.close()
        rec.close()
    assert _ids(rec) == sent  # in order, each once
    from profwatch.adapters.store.state import StateStore

    st = StateStore(short_tmp / "state.db")
    try:
        assert st.outbox_load("webhook") == []  # delivered: forgotten
    finally:
        st.close()


def test_outbox_bound_drops_the_oldest_and_counts(short_tmp: Path) -> None:
    rec = Recorder(codes=[500] * 1_000_000)
    h = CoordinatorHarness(short_tmp, webhook={"url": rec.url, "backoff_s": 0.02, "max_backoff_s": 0.1,
                                               "queue_size": 5})
    try:
        sent = [f"suspects-b{i}" for i in range(8)]
        for eid in sent:
            h.emit(TYPE_SUSPECT_RANKS, "jobB", {"batch_id": eid}, event_id=eid)
        m = h.coord.metrics.registry  # type: ignore[union-attr]
        dropped = lambda: m.get_sample_value("profwatch_sink_requests_total",  # noqa: E731
                                             {"sink": "webhook", "outcome": "dropped"}) or 0
        wait_for(lambda: dropped() == 3, 30, what="3 dropped at the bound of 5")
        rec.codes.clear()
        wait_for(lambda: len(rec.requests) >= 5, 30, what="the kept ones delivered")
        wait_for(lambda: h.coord is not None and h.coord.sinks.sinks[0].poster.depth() == 0, 20, what="outbox empty")
    finally:
        h.close()
        rec.close()
    # the oldest waiting ones went: the four newest are kept, plus the one in flight when the bound was hit (any of
    # the first four, depending on when the sink's thread took it), in order
    ids = _ids(rec)
    assert len(ids) == 5 and ids[1:] == sent[4:] and ids[0] in sent[:4], ids
