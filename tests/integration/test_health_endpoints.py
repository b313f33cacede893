"""``/healthz`` and ``/readyz`` on real daemon processes: beside ``/metrics`` on ``metrics_port``; with metrics off
on ``health_port`` (loopback by default, beyond it the metrics TLS rules); 404 for any other path. The node is
ready only while its coordinator answers; the coordinator reports its state db, sockets and analysis workers."""

from __future__ import annotations

import json
import signal
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from profwatch.config import ConfigError, load_settings
from profwatch.core.health import Health
from tests.conftest import PYTHON, python_env, wait_for
from tests.integration.sink_support import free_port


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return 0, ""


def _start(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen([PYTHON, "-m", "profwatch.cli", *args], env=python_env(), stdout=out,
                                stderr=subprocess.STDOUT)


def _stop(p: subprocess.Popen[bytes]) -> None:
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(10)


def test_probes_beside_metrics_and_a_node_ready_only_with_its_coordinator(short_tmp: Path) -> None:
    ports = {k: free_port() for k in ("ingest", "control", "pub", "coord_http", "node_http")}
    cfg = short_tmp / "pw.toml"
    cfg.write_text(f"""
[coordinator]
ingest_bind = "tcp://127.0.0.1:{ports['ingest']}"
control_bind = "tcp://127.0.0.1:{ports['control']}"
pub_bind = "tcp://127.0.0.1:{ports['pub']}"
state_db = "{short_tmp / 'state.db'}"
work_dir = "{short_tmp / 'work'}"
metrics_port = {ports['coord_http']}
[node]
node_id = "n-health"
bind = "ipc://{short_tmp}/node.sock"
coordinator = "tcp://127.0.0.1:{ports['ingest']}"
heartbeat_interval_s = 0.5
health_port = {ports['node_http']}
[logging]
format = "console"
""")
    node = _start(["node", "--config", str(cfg)], short_tmp / "node.log")
    coord = None
    try:
        # the node, metrics off: /healthz and /readyz on health_port, no /metrics; not ready without a coordinator
        wait_for(lambda: _get(ports["node_http"], "/healthz")[0] == 200, 60, 0.2, "node /healthz")
        code, body = _get(ports["node_http"], "/readyz")
        assert code == 503 and json.loads(body)["checks"]["coordinator"]["ok"] is False, body
        assert _get(ports["node_http"], "/metrics")[0] == 404
        coord = _start(["coordinator", "--config", str(cfg)], short_tmp / "coord.log")
        wait_for(lambda: _get(ports["coord_http"], "/readyz")[0] == 200, 90, 0.2, "coordinator /readyz")
        code, body = _get(ports["coord_http"], "/readyz")
        checks = json.loads(body)["checks"]
        assert {"loop", "state_db", "sockets", "analysis_workers"} <= set(checks) and all(
            c["ok"] for c in checks.values()), body
        assert str(short_tmp / "state.db") in checks["state_db"]["detail"]
        assert f"control tcp://127.0.0.1:{ports['control']}" in checks["sockets"]["detail"]
        assert _get(ports["coord_http"], "/healthz")[0] == 200
        assert "profwatch_daemon_info" in _get(ports["coord_http"], "/metrics")[1]
        assert _get(ports["coord_http"], "/anything")[0] == 404  # no longer metrics on every URL
        # the node becomes ready once its coordinator answers, and not ready again when it is gone
        wait_for(lambda: _get(ports["node_http"], "/readyz")[0] == 200, 60, 0.2, "node ready with a coordinator")
        _stop(coord)
        wait_for(lambda: _get(ports["node_http"], "/readyz")[0] == 503, 60, 0.5, "node not ready without it")
        assert _get(ports["node_http"], "/healthz")[0] == 200  # alive all along: a restart would not help
    finally:
        _stop(node)
        if coord is not None:
            _stop(coord)


def test_health_port_rules() -> None:
    assert load_settings(None, node={"health_port": 9109}).node.http_port() == 9109
    with pytest.raises(ConfigError, match="health_port is for a daemon without metrics"):
        load_settings(None, coordinator={"metrics_port": 9100, "health_port": 9101})
    with pytest.raises(ConfigError, match="health_addr '0.0.0.0' is beyond loopback"):
        load_settings(None, node={"health_port": 9109, "health_addr": "0.0.0.0"})
    s = load_settings(None, node={"health_port": 9109, "health_addr": "0.0.0.0", "metrics_insecure": True})
    assert s.node.metrics_plain_beyond_loopback()


def test_liveness_follows_the_main_loop_and_readiness_every_check() -> None:
    h = Health(stale_after_s=30)
    assert h.live(0.0)[0] and not h.ready(0.0)[0]  # starting: alive, not ready
    h.tick(100.0)
    h.checks = lambda: {"state_db": (True, "open"), "sockets": (True, "bound")}
    assert h.live(129.0)[0] and h.ready(129.0)[0]
    ok, body = h.live(131.0)
    assert not ok and "stale after 30 s" in str(body["loop"])
    h.tick(131.0)
    h.checks = lambda: {"state_db": (False, "closed")}
    ok, body = h.ready(131.0)
    assert not ok and body["checks"]["state_db"] == {"ok": False, "detail": "closed"}

    def broken() -> dict[str, tuple[bool, str]]:
        raise RuntimeError("boom")

    h.checks = broken
    ok, body = h.ready(131.0)
    assert not ok and "could not be evaluated" in str(body["checks"])


def _raw(port: int, request: bytes) -> tuple[bytes, bytes]:
    """``(status line and headers, everything after them)`` of one HTTP/1.0 exchange (the server closes)."""
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(request)
        got = b""
        while chunk := s.recv(65536):
            got += chunk
    head, _, body = got.partition(b"\r\n\r\n")
    return head, body


def _headers(head: bytes) -> dict[str, str]:
    """The headers of a response head, names lower-cased, ``Date`` left out (it differs between two answers)."""
    pairs = (line.decode().split(":", 1) for line in head.split(b"\r\n")[1:] if b":" in line)
    return {k.strip().lower(): v.strip() for k, v in pairs if k.strip().lower() != "date"}


def test_head_has_no_body_and_other_methods_are_405() -> None:
    from prometheus_client import CollectorRegistry, Counter, make_wsgi_app

    from profwatch.adapters.outputs.http_probe import probe_app, serve

    registry = CollectorRegistry()
    Counter("probe_test", "a metric", registry=registry).inc()
    health = Health()
    health.tick(0.0)
    health.checks = lambda: {"sockets": (True, "bound")}
    port = free_port()
    server = serve(probe_app(health, make_wsgi_app(registry), clock=lambda: 1.0), port, "127.0.0.1")
    try:
        for path in ("/healthz", "/readyz", "/metrics"):
            get_head, get_body = _raw(port, f"GET {path} HTTP/1.0\r\n\r\n".encode())
            head, body = _raw(port, f"HEAD {path} HTTP/1.0\r\n\r\n".encode())
            assert head.split(b"\r\n")[0] == get_head.split(b"\r\n")[0] == b"HTTP/1.0 200 OK", (path, head)
            assert get_body and body == b"", (path, body)
            # RFC 9110 9.3.2: HEAD sends GET's headers, Content-Length included (the length of GET's body)
            assert _headers(head)["content-length"] == str(len(get_body)), (path, head)
            assert _headers(head) == _headers(get_head), (path, head, get_head)
            for method in ("POST", "PUT", "DELETE", "PATCH", "OPTIONS"):
                head, body = _raw(port, f"{method} {path} HTTP/1.0\r\nContent-Length: 2\r\n\r\n{{}}".encode())
                assert head.startswith(b"HTTP/1.0 405 ") and b"Allow: GET, HEAD" in head, (method, path, head)
        head, body = _raw(port, b"HEAD /nope HTTP/1.0\r\n\r\n")
        assert head.startswith(b"HTTP/1.0 404 ") and body == b""
    finally:
        server.shutdown()
        server.server_close()


def test_readyz_shows_the_bound_ports_where_the_config_says_0(short_tmp: Path) -> None:
    http = free_port()
    cfg = short_tmp / "pw0.toml"
    cfg.write_text(f"""
[coordinator]
ingest_bind = "tcp://127.0.0.1:0"
control_bind = "tcp://127.0.0.1:0"
pub_bind = "tcp://127.0.0.1:0"
state_db = "{short_tmp / 'state.db'}"
work_dir = "{short_tmp / 'work'}"
metrics_port = {http}
[logging]
format = "console"
""")
    coord = _start(["coordinator", "--config", str(cfg)], short_tmp / "coord0.log")
    try:
        wait_for(lambda: _get(http, "/readyz")[0] == 200, 90, 0.2, "coordinator /readyz")
        detail = json.loads(_get(http, "/readyz")[1])["checks"]["sockets"]["detail"]
        import re

        ports = dict(re.findall(r"(ingest|control|pub) tcp://127\.0\.0\.1:(\d+)", detail))
        assert set(ports) == {"ingest", "control", "pub"} and all(int(p) > 0 for p in ports.values()), detail
        assert len(set(ports.values())) == 3, detail
    finally:
        _stop(coord)
