"""Helpers for the alert sink tests: a real Alertmanager process, a local HTTP recorder, an in-process coordinator
fed by a fake node over real ZeroMQ."""

from __future__ import annotations

import json
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import zmq

from profwatch.adapters.zmq.control import call
from profwatch.config import load_settings
from profwatch.coordinator import Coordinator
from rankhook import wire
from tests.conftest import require_tool, wait_for
from tests.integration.live_stack import free_port, loopback_coordinator


class Recorder:
    """Local HTTP server that records POSTs (headers + body) and answers with scripted status codes (then 200)."""

    def __init__(self, codes: list[int] | None = None, delay_s: float = 0.0, tls: Any = None) -> None:
        self.codes = list(codes or [])
        self.delay_s = delay_s
        self.requests: list[tuple[dict[str, str], bytes, str]] = []  # (headers, body, path)
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
                    outer.requests.append(({k.lower(): v for k, v in self.headers.items()}, body, self.path))
                self.send_response(code)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        scheme = "http"
        if tls is not None:
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
            scheme = "https"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                                       name="test-http")
        self.thread.start()
        self.port = self.server.server_address[1]
        self.url = f"{scheme}://127.0.0.1:{self.port}/hook"

    def json_bodies(self) -> list[Any]:
        return [json.loads(b) for _h, b, _p in list(self.requests)]

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


class Alertmanager:
    """A real Alertmanager (Debian's ``prometheus-alertmanager`` or upstream ``alertmanager``) on a free loopback
    port, no cluster gossip, routing every alert to ``notify_url`` (with resolved notifications)."""

    def __init__(self, root: Path, notify_url: str, resolve_timeout_s: int = 2) -> None:
        import shutil

        exe = shutil.which("alertmanager") or require_tool(
            "prometheus-alertmanager", "the Alertmanager sink is tested against a real Alertmanager (.ci/run installs "
            "Debian's prometheus-alertmanager)")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        root.mkdir(parents=True, exist_ok=True)
        cfg = root / "alertmanager.yml"
        cfg.write_text(f"""
global:
  resolve_timeout: {resolve_timeout_s}s
route:
  receiver: recorder
  group_by: ['alertname', 'job_id', 'rank']
  group_wait: 0s
  group_interval: 1s
  repeat_interval: 1h
receivers:
- name: recorder
  webhook_configs:
  - url: '{notify_url}'
    send_resolved: true
""")
        self.log = open(root / "alertmanager.log", "ab")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(
            [exe, f"--config.file={cfg}", f"--storage.path={root / 'am-data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--cluster.listen-address=", "--log.level=warn"],
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        wait_for(self._ready, 60, 0.1, "alertmanager ready")

    def _ready(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"alertmanager exited with {self.proc.returncode}")
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def alerts(self, **labels: str) -> list[dict[str, Any]]:
        """Active alerts (GET /api/v2/alerts) matching every ``label="value"``; [] on a transient error."""
        q = urllib.parse.urlencode([("filter", f'{k}="{v}"') for k, v in labels.items()])
        try:
            with urllib.request.urlopen(f"{self.url}/api/v2/alerts?{q}", timeout=5) as r:
                return json.loads(r.read())
        except OSError:
            return []

    def alerts_strict(self, **labels: str) -> list[dict[str, Any]]:
        """Like :meth:`alerts`, for assertions: retries a failed GET (up to 3 tries, 1 s apart) and raises
        ``OSError`` when every try failed, so a slow Alertmanager is not read as "no alerts"."""
        q = urllib.parse.urlencode([("filter", f'{k}="{v}"') for k, v in labels.items()])
        for attempt in range(3):
            try:
                with urllib.request.urlopen(f"{self.url}/api/v2/alerts?{q}", timeout=10) as r:
                    return json.loads(r.read())
            except OSError:
                if attempt == 2:
                    raise
                time.sleep(1.0)
        raise AssertionError("unreachable")

    def close(self) -> None:
        try:
            if self.proc.poll() is None:
                self.proc.terminate()
                try:
                    self.proc.wait(15)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(15)
        finally:
            self.log.close()


class CoordinatorHarness:
    """An in-process Coordinator on free loopback ports, and a fake node (DEALER) to feed it rank messages."""

    def __init__(self, root: Path, *, start: bool = True, **sections: Any) -> None:
        self.root = root
        self.ports = {k: free_port() for k in ("ingest", "control", "pub")}
        coord = loopback_coordinator(root, self.ports)
        coord.update(sections.pop("coordinator", {}))
        sections.setdefault("watch", {"reconcile_interval_s": 0.5, "parse_allowance_s": 5.0})
        sections.setdefault("analysis", {"msprof": {"advisor": False, "advisor_html": False}})
        self.settings = load_settings(None, coordinator=coord, **sections)
        self.coord: Coordinator | None = None
        self.thread: threading.Thread | None = None
        self.ctx = zmq.Context()
        self.dealer: zmq.Socket[bytes] | None = None
        self.seq = 0
        if start:
            self.start()

    def start(self) -> None:
        self.coord = Coordinator(self.settings)
        self.thread = threading.Thread(target=self.coord.run, name="test-coordinator")
        self.thread.start()
        if self.dealer is None:
            self.dealer = self.ctx.socket(zmq.DEALER)
            self.dealer.setsockopt(zmq.IDENTITY, b"fake-node")
            self.dealer.setsockopt(zmq.LINGER, 0)
            self.dealer.connect(self.settings.coordinator.ingest_bind)

    def stop(self) -> None:
        if self.coord is not None and self.thread is not None:
            self.coord.stop()
            self.thread.join(30)
            assert not self.thread.is_alive(), "coordinator did not stop"
        self.coord = None

    @property
    def control(self) -> str:
        return self.settings.coordinator.control_bind

    def on_main(self, fn: Callable[[], Any]) -> None:
        """Run ``fn`` on the coordinator's main loop (its result queue), as its own workers do."""
        assert self.coord is not None
        self.coord.results.put(fn)

    def emit(self, type_: str, job_id: str, data: dict[str, Any], event_id: str | None = None) -> None:
        """Have the live coordinator emit (store, publish, hand to the sinks) one event."""
        self.on_main(lambda: self.coord.emit(type_, job_id, data, event_id=event_id))  # type: ignore[union-attr]

    def send(self, *msgs: object) -> None:
        assert self.dealer is not None
        self.seq += 1
        b = wire.NodeBatch(node_id="fake-node", hostname="fake", seq=self.seq, ts_unix_s=time.time(),
                           messages=[wire.to_dict(m) for m in msgs])
        self.dealer.send(wire.encode(b))

    def hellos(self, job: str, world: int, cfg: Path | None = None, prof: Path | None = None) -> None:
        self.send(*[wire.RankHello(job_id=job, rank=r, local_rank=r, world_size=world, hostname="fake", pid=100 + r,
                                   backend="torch_npu", ts_unix_s=time.time() - 5,
                                   profiler_config_path=str(cfg) if cfg else None,
                                   prof_root=str(prof) if prof else None) for r in range(world)])

    def steps(self, job: str, world: int, first: int, last: int, step_time_s: float = 0.5) -> None:
        for s in range(first, last + 1):
            self.send(*[wire.StepReport(job_id=job, rank=r, step=s, step_time_s=step_time_s, ts_unix_s=time.time())
                        for r in range(world)])

    def events(self, job: str | None = None, alerts_only: bool = False) -> list[dict[str, Any]]:
        args: dict[str, Any] = {"alerts_only": alerts_only, "limit": 1000}
        if job:
            args["job_id"] = job
        return [r["event"] for r in call(self.control, "events", args, timeout_s=10)]

    def close(self) -> None:
        try:
            self.stop()
        finally:
            if self.dealer is not None:
                self.dealer.close(0)
            self.ctx.term()
