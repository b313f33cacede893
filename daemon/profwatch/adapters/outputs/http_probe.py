"""The daemons' HTTP endpoint: ``/metrics`` (Prometheus text, prometheus-client's WSGI app), ``/healthz`` and
``/readyz`` (``profwatch.core.health``; 200 when the probe holds, 503 otherwise, a JSON body saying why), 404
for any other path. One server, on ``metrics_port``; with metrics off, on ``health_port`` without ``/metrics``
(``daemon/profwatch/config.py``). HTTPS with a certificate and key (PEM), and client certificates signed by a CA
required when one is given: the same TLS options as prometheus-client's ``start_http_server``, whose server this
mirrors (wsgiref's ``make_server`` with a threading mixin, one daemon thread).
"""

from __future__ import annotations

import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from profwatch.core.health import Health, body_bytes

Wsgi = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _V6Server(_Server):
    address_family = socket.AF_INET6


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        """No access log on stderr (a scrape every 15 s would flood the journal)."""


def probe_app(health: Health, metrics_app: Wsgi | None, clock: Callable[[], float] = time.monotonic) -> Wsgi:
    """The WSGI app: ``/metrics`` to ``metrics_app`` (when given), ``/healthz``, ``/readyz``, else 404."""

    def app(environ: dict[str, Any], start: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO") or "/"
        if path == "/metrics" and metrics_app is not None:
            return metrics_app(environ, start)
        if path in ("/healthz", "/readyz"):
            ok, body = (health.live if path == "/healthz" else health.ready)(clock())
            data = body_bytes(body)
            start("200 OK" if ok else "503 Service Unavailable",
                  [("Content-Type", "application/json"), ("Content-Length", str(len(data))),
                   ("Cache-Control", "no-store")])
            return [data]
        data = b"not found: /metrics, /healthz, /readyz\n" if metrics_app is not None else \
            b"not found: /healthz, /readyz\n"
        start("404 Not Found", [("Content-Type", "text/plain"), ("Content-Length", str(len(data)))])
        return [data]

    return app


def serve(app: Wsgi, port: int, addr: str, *, certfile: str | None = None, keyfile: str | None = None,
          client_cafile: str | None = None) -> WSGIServer:
    """Serve ``app`` on ``addr:port`` from a daemon thread; returns the server (``shutdown()`` stops it).
    Raises ``OSError`` (address in use) or ``ssl.SSLError`` (unusable certificate files)."""
    cls = _V6Server if ":" in addr else _Server
    httpd = make_server(addr, port, app, cls, handler_class=_Quiet)
    if certfile and keyfile:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        if client_cafile:
            ctx.load_verify_locations(cafile=client_cafile)
            ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.load_cert_chain(certfile=certfile, keyfile=keyfile)
        httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True)
    threading.Thread(target=httpd.serve_forever, name="profwatch-http", daemon=True).start()
    return httpd
