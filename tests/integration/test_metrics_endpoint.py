"""The /metrics endpoint beyond loopback (issue 24 item 6), on real daemon processes: metrics_addr binds where it
is told; beyond loopback it is served over TLS with a client CA (a scrape with a signed client certificate gets
the metrics, one without is refused), plain only with metrics_insecure = true (warned at start), and refused
(exit 2) otherwise."""

from __future__ import annotations

import signal
import ssl
import subprocess
import urllib.request
from pathlib import Path

import pytest
from click.testing import CliRunner

from profwatch.cli import cli
from profwatch.exitcodes import EXIT_USAGE
from tests.conftest import PYTHON, python_env, require_tool, wait_for
from tests.integration.sink_support import free_port


def _self_signed(d: Path, name: str) -> tuple[Path, Path]:
    subprocess.run([require_tool("openssl", "the TLS test makes its own certificates"), "req", "-x509", "-newkey",
                    "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", "1", "-subj",
                    "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"], cwd=d, check=True,
                   capture_output=True, timeout=60)
    return d / f"{name}.pem", d / f"{name}.key"


def _node_config(root: Path, port: int, metrics: str) -> Path:
    p = root / "node.toml"
    p.write_text(f'[node]\nnode_id = "n-metrics"\nbind = "ipc://{root}/node.sock"\n'
                 f'coordinator = "tcp://127.0.0.1:{free_port()}"\nmetrics_port = {port}\n{metrics}\n'
                 '[logging]\nformat = "console"\n')
    return p


def _scrape(url: str, ctx: ssl.SSLContext | None = None) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=5, context=ctx) as r:
            return str(r.read().decode())
    except (OSError, ssl.SSLError):
        return None


def _run_node(cfg: Path, log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen([PYTHON, "-m", "profwatch.cli", "node", "--config", str(cfg)], env=python_env(),
                                stdout=out, stderr=subprocess.STDOUT)


def _stop(p: subprocess.Popen[bytes]) -> None:
    p.send_signal(signal.SIGTERM)
    try:
        p.wait(30)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait(10)


def test_tls_with_a_client_ca_beyond_loopback(short_tmp: Path) -> None:
    server_cert, server_key = _self_signed(short_tmp, "server")
    client_cert, client_key = _self_signed(short_tmp, "client")
    port = free_port()
    cfg = _node_config(short_tmp, port, f'metrics_addr = "0.0.0.0"\nmetrics_tls_cert = "{server_cert}"\n'
                                        f'metrics_tls_key = "{server_key}"\nmetrics_client_ca = "{client_cert}"')
    p = _run_node(cfg, short_tmp / "node.log")
    try:
        signed = ssl.create_default_context(cafile=str(server_cert))
        signed.load_cert_chain(str(client_cert), str(client_key))
        url = f"https://127.0.0.1:{port}/metrics"
        wait_for(lambda: (_scrape(url, signed) or "").find("profwatch_daemon_info") >= 0, 60,
                 what="metrics over TLS with a client certificate")
        anonymous = ssl.create_default_context(cafile=str(server_cert))
        assert _scrape(url, anonymous) is None  # no client certificate: refused
        assert _scrape(f"http://127.0.0.1:{port}/metrics") is None  # plain HTTP: no answer
    finally:
        _stop(p)


def test_plain_beyond_loopback_only_when_insecure_and_warned(short_tmp: Path) -> None:
    port = free_port()
    refused = _node_config(short_tmp, port, 'metrics_addr = "0.0.0.0"')
    res = CliRunner().invoke(cli, ["node", "--config", str(refused)])
    assert res.exit_code == EXIT_USAGE and "metrics_tls_cert" in res.output and "metrics_insecure" in res.output
    cfg = _node_config(short_tmp, port, 'metrics_addr = "0.0.0.0"\nmetrics_insecure = true')
    log = short_tmp / "node.log"
    p = _run_node(cfg, log)
    try:
        wait_for(lambda: "profwatch_daemon_info" in (_scrape(f"http://127.0.0.1:{port}/metrics") or ""), 60,
                 what="plain metrics")
    finally:
        _stop(p)
    text = log.read_text()
    assert "metrics_insecure" in text and "warning" in text


@pytest.mark.parametrize("section", ["node", "coordinator"])
def test_metrics_addr_exists_for_both_daemons_with_a_loopback_default(section: str) -> None:
    from profwatch.config import load_settings

    s = getattr(load_settings(None), section)
    assert s.metrics_addr == "127.0.0.1" and s.metrics_loopback()
