"""The daemons' HTTP endpoint: ``/metrics`` (Prometheus text, prometheus-client's WSGI app), ``/healthz`` and
``/readyz`` (``profwatch.core.health``; 200 when the probe holds, 503 otherwise, a JSON body saying why), 404
for any other path, 405 for a method other than GET and HEAD (HEAD answers without a body). One server, on
``metrics_port``; with metrics off, on ``health_port`` without ``/metrics``
(``daemon/profwatch/config.py``). HTTPS with a certificate and key (PEM), and client certificates signed by a CA
required when one is given: the same TLS options as prometheus-client's ``start_http_server``, whose server this
mirrors (wsgiref's ``make_server`` with a threading mixin, one daemon thread).

The listening socket stays plain: the accept thread only accepts, and each connection's TLS handshake runs on
that connection's own thread under the connection timeout, so one silent client cannot stall the endpoint.
Every connection reads under ``CONN_TIMEOUT_S`` and at most ``MAX_CONNS`` are served at once; a connection
beyond that is closed at once and counted (``ProbeServer.refused``).
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


CONN_TIMEOUT_S = 10.0  # a scrape sends its request in milliseconds; an idle or half-sent one is dropped after this
MAX_CONNS = 32  # connections served at once (Prometheus scrapes one at a time; probes are rare)


class ProbeServer(ThreadingMixIn, WSGIServer):
    """wsgiref's server, one thread per connection: plain accept, per-connection TLS handshake and read timeout,
    at most ``slots`` connections at once; ``refused`` and ``dropped`` count the connections it did not serve."""

    daemon_threads = True
    request_queue_size = 64  # listen backlog: a burst of connects is accepted (and refused) rather than SYN-dropped
    tls: ssl.SSLContext | None = None
    conn_timeout_s: float = CONN_TIMEOUT_S
    slots: threading.BoundedSemaphore
    refused: int = 0  # connections closed unserved because MAX_CONNS were open
    dropped: int = 0  # connections that timed out, broke, or failed their TLS handshake

    def process_request(self, request: Any, client_address: Any) -> None:
        """On the accept thread: take a slot or close the connection at once (counted in ``refused``)."""
        if not self.slots.acquire(blocking=False):
            self.refused += 1
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        """On the connection's thread: read timeout, TLS handshake (when serving HTTPS), then the request."""
        conn = request
        try:
            conn.settimeout(self.conn_timeout_s)
            if self.tls is not None:
                try:
                    conn = self.tls.wrap_socket(request, server_side=True, do_handshake_on_connect=False)
                    conn.do_handshake()
                except (OSError, ValueError):
                    self.dropped += 1
                    return
            self.finish_request(conn, client_address)
        except OSError:  # the read timed out or the peer went away: nothing to answer
            self.dropped += 1
        except Exception:  # noqa: BLE001 - socketserver's contract: an app error is logged, the server lives
            self.handle_error(conn, client_address)
        finally:
            self.shutdown_request(conn)
            self.slots.release()


class _V6Server(ProbeServer):
    address_family = socket.AF_INET6


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        """No access log on stderr (a scrape every 15 s would flood the journal)."""


def probe_app(health: Health, metrics_app: Wsgi | None, clock: Callable[[], float] = time.monotonic) -> Wsgi:
    """The WSGI app: ``/metrics`` to ``metrics_app`` (when given), ``/healthz``, ``/readyz``, else 404. GET and
    HEAD only (HEAD: the same status and headers as GET, ``Content-Length`` the GET body's, no body); any other
    method is 405 with ``Allow: GET, HEAD``."""

    def app(environ: dict[str, Any], start: Callable[..., Any]) -> Iterable[bytes]:
        method = str(environ.get("REQUEST_METHOD") or "GET").upper()
        if method not in ("GET", "HEAD"):  # RFC 9110 15.5.6: 405 with the methods the resource allows
            data = b"method not allowed: GET, HEAD\n"
            start("405 Method Not Allowed", [("Allow", "GET, HEAD"), ("Content-Type", "text/plain"),
                                             ("Content-Length", str(len(data)))])
            return [data]
        if method == "GET":
            return routed(environ, start)
        return head(environ, start)

    def head(environ: dict[str, Any], start: Callable[..., Any]) -> Iterable[bytes]:
        """HEAD answered as GET (prometheus-client's app would refuse it), RFC 9110 9.3.2: GET's status and headers,
        no content. The GET body is made and measured so ``Content-Length`` is GET's (prometheus-client's app
        sets none and leaves it to the server, which would count the empty HEAD body and say 0)."""
        answer: list[Any] = []
        chunks: list[bytes] = []

        def capture(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Callable[[bytes], None]:
            answer[:] = [status, list(headers)]
            return chunks.append  # PEP 3333 write(): counted with the returned body

        body = routed(environ | {"REQUEST_METHOD": "GET"}, capture)
        try:
            chunks.extend(body)
        finally:
            close = getattr(body, "close", None)
            if close is not None:
                close()
        status, headers = answer
        if not any(name.lower() == "content-length" for name, _ in headers):
            headers.append(("Content-Length", str(sum(len(c) for c in chunks))))
        start(status, headers)
        return []

    def routed(environ: dict[str, Any], start: Callable[..., Any]) -> Iterable[bytes]:
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
          client_cafile: str | None = None, conn_timeout_s: float = CONN_TIMEOUT_S,
          max_conns: int = MAX_CONNS) -> ProbeServer:
    """Serve ``app`` on ``addr:port`` from a daemon thread; returns the server (``shutdown()`` stops it).
    Each connection reads under ``conn_timeout_s`` seconds; at most ``max_conns`` are served at once.
    Raises ``OSError`` (address in use) or ``ssl.SSLError`` (unusable certificate files)."""
    cls = _V6Server if ":" in addr else ProbeServer
    httpd = make_server(addr, port, app, cls, handler_class=_Quiet)
    assert isinstance(httpd, ProbeServer)
    httpd.conn_timeout_s = conn_timeout_s
    httpd.slots = threading.BoundedSemaphore(max_conns)
    if certfile and keyfile:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        if client_cafile:
            ctx.load_verify_locations(cafile=client_cafile)
            ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.load_cert_chain(certfile=certfile, keyfile=keyfile)
        httpd.tls = ctx  # the handshake runs per connection, off the accept thread (process_request_thread)
    threading.Thread(target=httpd.serve_forever, name="profwatch-http", daemon=True).start()
    return httpd
