"""The probe endpoint survives silent and half-sent clients (``adapters/outputs/http_probe.py``): with TLS, one
TCP client that never sends a ClientHello does not stall ``/healthz`` (the handshake runs per connection, not in
``accept()``); on plain HTTP an idle half-request is closed after the connection timeout, and the number of
connections served at once is bounded (the rest are closed at once and counted)."""

from __future__ import annotations

import socket
import ssl
import threading
import urllib.request
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from profwatch.adapters.outputs.http_probe import serve
from tests.conftest import wait_for
from tests.integration.test_metrics_endpoint import _self_signed


def _ok(environ: dict[str, Any], start: Callable[..., Any]) -> Iterable[bytes]:
    start("200 OK", [("Content-Type", "text/plain"), ("Content-Length", "3")])
    return [b"ok\n"]


def _get(url: str, ctx: ssl.SSLContext | None = None) -> str:
    with urllib.request.urlopen(url, timeout=5, context=ctx) as r:
        return str(r.read().decode())


def test_a_silent_tls_client_does_not_stall_the_endpoint(tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path, "server")
    httpd = serve(_ok, 0, "127.0.0.1", certfile=str(cert), keyfile=str(key), conn_timeout_s=2.0)
    port = httpd.server_address[1]
    silent = socket.create_connection(("127.0.0.1", port))  # connects, never sends a ClientHello
    try:
        ctx = ssl.create_default_context(cafile=str(cert))
        assert _get(f"https://127.0.0.1:{port}/healthz", ctx) == "ok\n"  # before the fix: hangs in accept()
        # the silent client is dropped by the handshake timeout, and counted
        wait_for(lambda: silent.recv(1) == b"", timeout_s=10, what="the silent client closed")
        assert httpd.dropped >= 1
    finally:
        silent.close()
        httpd.shutdown()
        httpd.server_close()


def test_plain_idle_half_requests_time_out_and_are_bounded() -> None:
    httpd = serve(_ok, 0, "127.0.0.1", conn_timeout_s=4.0, max_conns=4)
    port = httpd.server_address[1]
    base = threading.active_count()
    held = []
    try:
        for _ in range(12):
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # a half-sent request, never finished
            held.append(s)
        wait_for(lambda: httpd.refused >= 8, what="connections beyond max_conns refused")
        assert threading.active_count() <= base + 4  # one thread per served connection, at most max_conns
        for s in held:  # every one is closed by the server: refused at once, or after the read timeout
            s.settimeout(10)
            assert s.recv(1) == b""
        assert _get(f"http://127.0.0.1:{port}/healthz") == "ok\n"  # slots came back
        assert httpd.dropped + httpd.refused == 12  # every drop is counted
    finally:
        for s in held:
            s.close()
        httpd.shutdown()
        httpd.server_close()
