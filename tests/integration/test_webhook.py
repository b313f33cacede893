"""WebhookSink against a real local http.server on 127.0.0.1 (success, 500-then-200, 4xx, dead port, full queue)."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from daemon.adapters.alert_sinks import WebhookSink
from daemon.core.alerts import TYPE_SUSPECT_RANKS, make_cloudevent
from tests.conftest import wait_for


class Receiver:
    """A local webhook receiver answering with a scripted list of status codes (then 200)."""

    def __init__(self, codes: list[int] | None = None, delay_s: float = 0.0) -> None:
        self.codes = list(codes or [])
        self.delay_s = delay_s
        self.bodies: list[dict] = []
        self.hits = 0
        self.release = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                outer.hits += 1
                if outer.delay_s:
                    outer.release.wait(outer.delay_s)
                code = outer.codes.pop(0) if outer.codes else 200
                if code == 200:
                    outer.bodies.append(json.loads(body))
                self.send_response(code)
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                                       name="test-http")
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


def _event() -> dict:
    data = {"batch_id": "b1", "suspects": [{"rank": 3, "score": 0.9, "kind": "compute", "hostname": "n0",
                                            "evidence": {"summary": "x"}, "rank_dir": "/d"}]}
    return make_cloudevent(TYPE_SUSPECT_RANKS, "job1", data, source="//profwatch/test", now_unix_s=1.7e9)


def test_posts_alertmanager_payload(receiver: Receiver):
    with WebhookSink(receiver.url, timeout_s=2, retries=2, queue_size=4) as sink:
        assert sink.send_events([_event()], external_url="http://coord")
        assert sink.flush(10)
    assert sink.stats.sent == 1 and sink.stats.failed == 0
    body = receiver.bodies[0]
    assert body["version"] == "4" and body["alerts"][0]["labels"]["rank"] == "3"


def test_submit_one_cloudevent_with_external_url(receiver: Receiver):
    sink = WebhookSink(receiver.url, timeout_s=2, retries=0, queue_size=4, external_url="http://coord:7714")
    try:
        assert sink.submit(_event())
        assert sink.flush(10)
    finally:
        sink.close()
    assert receiver.bodies[0]["externalURL"] == "http://coord:7714"
    assert receiver.bodies[0]["alerts"][0]["generatorURL"] == "http://coord:7714"


def test_500_then_200_is_retried():
    r = Receiver(codes=[500, 503])
    try:
        sink = WebhookSink(r.url, timeout_s=2, retries=3, queue_size=4, backoff_s=0.01)
        sink.send({"version": "4", "alerts": []})
        assert sink.flush(10)
        sink.close()
        assert sink.stats.sent == 1 and sink.stats.attempts == 3 and r.hits == 3 and len(r.bodies) == 1
    finally:
        r.close()


def test_4xx_is_not_retried():
    r = Receiver(codes=[400])
    try:
        sink = WebhookSink(r.url, timeout_s=2, retries=3, backoff_s=0.01)
        sink.send({"a": 1})
        assert sink.flush(10)
        sink.close()
        assert sink.stats.failed == 1 and sink.stats.attempts == 1
    finally:
        r.close()


def test_dead_port_gives_up_after_retries_and_never_blocks():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    sink = WebhookSink(f"http://127.0.0.1:{port}/x", timeout_s=0.5, retries=2, backoff_s=0.01)
    t0 = time.monotonic()
    assert sink.send({"a": 1})
    assert time.monotonic() - t0 < 0.1
    wait_for(lambda: sink.stats.failed == 1, timeout_s=10, what="give up")
    assert sink.stats.attempts == 3 and sink.stats.sent == 0
    sink.close()


def test_full_queue_drops_and_counts_and_close_is_prompt():
    r = Receiver(delay_s=30)  # the first POST hangs until close
    try:
        sink = WebhookSink(r.url, timeout_s=30, retries=0, queue_size=2)
        t0 = time.monotonic()
        results = [sink.send({"i": i}) for i in range(10)]
        assert time.monotonic() - t0 < 0.5  # never blocks the caller
        wait_for(lambda: r.hits == 1, timeout_s=5, what="first POST in flight")
        assert results[:2] == [True, True] and results.count(False) >= 7
        assert sink.stats.dropped >= 7
        r.release.set()
        assert sink.flush(10)
        sink.close()
        assert not sink._thread.is_alive()
        assert sink.send({"late": 1}) is False
    finally:
        r.close()


def test_close_interrupts_backoff():
    r = Receiver(codes=[500] * 10)
    try:
        sink = WebhookSink(r.url, timeout_s=2, retries=5, backoff_s=20, max_backoff_s=20)
        sink.send({"a": 1})
        wait_for(lambda: r.hits >= 1, timeout_s=5, what="first attempt")
        t0 = time.monotonic()
        sink.close(timeout_s=5)
        assert time.monotonic() - t0 < 3 and sink.stats.sent == 0
    finally:
        r.close()


def test_rejects_non_http_url():
    with pytest.raises(ValueError):
        WebhookSink("file:///etc/passwd")
