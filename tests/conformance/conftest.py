"""Fixtures of the conformance suite: the real torch_npu monitor tree and a job of real ranks running under it.

The wheel comes from the cache or PyPI (``real_torch_npu.ensure_wheel``). Without it the suite FAILS with the
reason, unless ``PROFWATCH_OFFLINE=1`` (then it skips with the reason; never when ``PROFWATCH_REQUIRE_REAL_TOOLS=1``,
as in CI).

:class:`NpuJob` runs, for one test: a fake coordinator (a ZeroMQ ROUTER on loopback that validates what it
receives with the coordinator's own ``parse_node_message``), a real :class:`profwatch.node.NodeDaemon` (relay,
node-side ``ConfigWriter``, dp log tailer) in a thread, and ``world`` rank processes (``npu_rank.py``: real CPU
torch with gloo, ``rankhook`` with its torch_npu backend over the real monitor). Everything a test observes
comes from the real monitor's files (``log/dp_*``, ``monitor_dp_*``, rank dirs, stdout) or from what the
coordinator would receive.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from profwatch.config import load_settings
from profwatch.core.messages import MessageRejected, parse_node_message
from profwatch.node import NodeDaemon
from profwatch.simulate.launcher import free_port
from rankhook import wire
from tests.conformance.real_torch_npu import MonitorTree, WheelUnavailable, build_tree, ensure_wheel, wheel_version
from tests.conftest import PYTHON, REPO_ROOT, SOURCE_PATHS, python_env, wait_for

RANK_WORKER = str(Path(__file__).with_name("npu_rank.py"))


@pytest.fixture(scope="session")
def monitor_tree(tmp_path_factory: pytest.TempPathFactory) -> MonitorTree:
    """The isolated real-monitor tree (session-wide). Fails, or skips under PROFWATCH_OFFLINE=1, without it."""
    version = wheel_version()
    offline = os.environ.get("PROFWATCH_OFFLINE") == "1"
    try:
        wheel = ensure_wheel(version, offline=offline)
    except WheelUnavailable as exc:
        reason = (f"conformance needs the torch-npu {version} wheel (pip download --no-deps torch-npu=={version}, "
                  f"cached in $PROFWATCH_WHEEL_CACHE or ~/.cache/profwatch/wheels): {exc}")
        if offline and os.environ.get("PROFWATCH_REQUIRE_REAL_TOOLS") != "1":
            pytest.skip(reason)
        pytest.fail(reason, pytrace=False)
    tree = build_tree(wheel, tmp_path_factory.mktemp("torch_npu_real"), version)
    cov_dir = os.environ.get("PROFWATCH_CONFORMANCE_COVERAGE")
    if cov_dir:  # tests/conformance/coverage_report.py maps the data files back to the upstream names
        Path(cov_dir).mkdir(parents=True, exist_ok=True)
        (Path(cov_dir) / "site.txt").write_text(str(tree.site))
        (Path(cov_dir) / "coveragerc").write_text(
            f"[run]\ndata_file = {Path(cov_dir) / '.coverage'}\nparallel = True\n"
            f"concurrency = thread,multiprocessing\ninclude = {tree.site}/torch_npu/*\n")
    return tree




class FakeCoordinator:
    """The coordinator end of the node link (ROUTER, loopback). ``pump()`` reads what arrived (call it from the
    test thread only); every message goes through the coordinator's validation (``parse_node_message``)."""

    def __init__(self) -> None:
        self.endpoint = f"tcp://127.0.0.1:{free_port()}"
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(self.endpoint)
        self.rank_messages: list[Any] = []
        self.acks: list[wire.NodeAck] = []
        self.rejected: list[MessageRejected] = []
        self.node_ids: set[bytes] = set()
        self.routes: dict[str, bytes] = {}  # node_id -> routing id of the connection that speaks for it
        self._ids = itertools.count(1)

    def pump(self) -> None:
        while True:
            try:
                ident, data = self.sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            self.node_ids.add(ident)
            env, good, bad = parse_node_message(data)
            self.routes[env.node_id] = ident  # as the coordinator does: reply on the connection the node spoke on
            self.rank_messages += good
            self.rejected += bad
            if isinstance(env, wire.NodeAck):
                self.acks.append(env)

    def captures(self, source: str | None = None) -> list[wire.CaptureEvent]:
        """Capture events received so far (``source`` ``hook`` or ``dp_log``)."""
        self.pump()
        return [m for m in self.rank_messages if isinstance(m, wire.CaptureEvent)
                and (source is None or m.source == source)]

    def hellos(self) -> list[wire.RankHello]:
        self.pump()
        return [m for m in self.rank_messages if isinstance(m, wire.RankHello)]

    def write_config(self, node_id: str, config_dir: Path, config: dict[str, Any], not_before_unix_s: float,
                     idle_for: str | None = None) -> str:
        """Send the node a ``write_config`` command (as the coordinator does with ``config_writer = "node"``;
        ``idle_for``: the idle config taking that capture's arm back)."""
        cid = f"w-{next(self._ids)}"
        args = {"profiler_config_path": str(config_dir), "config": config, "not_before_unix_s": not_before_unix_s}
        cmd = wire.NodeCommand(cmd="write_config", command_id=cid,
                               args=args | ({"idle_for": idle_for} if idle_for else {}))
        self.pump()
        route = self.routes.get(node_id)
        if route is None:
            raise AssertionError(f"node {node_id} has not spoken to the fake coordinator yet")
        self.sock.send_multipart([route, wire.encode(cmd)])
        return cid

    def ack(self, command_id: str) -> wire.NodeAck | None:
        self.pump()
        return next((a for a in self.acks if a.command_id == command_id), None)

    def close(self) -> None:
        self.sock.close(0)
        self.ctx.term()


class NpuJob:
    """One job of ``world`` real ranks under the real monitor, a real node daemon and a fake coordinator."""

    def __init__(self, root: Path, ipc_dir: Path, tree: MonitorTree, *, world: int = 4, step_s: float = 0.25,
                 max_steps: int = 4000, job_id: str = "job1", node_id: str = "node-a", fake: bool = False) -> None:
        self.root, self.tree, self.world, self.step_s = root, tree, world, step_s
        self.fake = fake  # run profwatch's fake (daemon/profwatch/simulate/fake_torch_npu) instead of the real monitor
        self.max_steps, self.job_id, self.node_id = max_steps, job_id, node_id
        self.cfg = root / "cfg" / job_id
        self.prof = root / "prof"
        self.out = root / "out"
        for d in (self.cfg, self.prof, self.out):
            d.mkdir(parents=True, exist_ok=True)
        self.ipc = ipc_dir
        self.shm_tag = "pw" + uuid.uuid4().hex[:10]
        self.coord = FakeCoordinator()
        settings = load_settings(None, node={
            "node_id": node_id, "bind": f"ipc://{ipc_dir}/node.sock", "coordinator": self.coord.endpoint,
            "allowed_config_roots": [str(root / "cfg")], "dp_log_poll_s": 0.2, "heartbeat_interval_s": 1.0})
        self.node_settings = settings.node
        self.node: NodeDaemon | None = None
        self.node_thread: threading.Thread | None = None
        self.procs: list[subprocess.Popen[bytes]] = []
        self.started_unix_s = 0.0

    # -- lifecycle -------------------------------------------------------------------------------------------
    def start(self) -> NpuJob:
        self.node = NodeDaemon(self.node_settings)
        self.node_thread = threading.Thread(target=self.node.run, name="conformance-node")
        self.node_thread.start()
        site = REPO_ROOT / "daemon" / "profwatch" / "simulate" / "fake_torch_npu" if self.fake else self.tree.site
        env = python_env({
            "PYTHONPATH": os.pathsep.join([str(site), SOURCE_PATHS]),
            "PROFWATCH_CONFORMANCE_SHM_TAG": self.shm_tag,
            "PROFWATCH_TORCH_NPU_STANDIN_VERSION": self.tree.version,
            "OMP_NUM_THREADS": "1",
        })
        for k in ("PROF_CONFIG_PATH", "MSMONITOR_USE_DAEMON", "KINETO_USE_DAEMON", "PROFWATCH_POLL_INTERVAL_S",
                  "PROFWATCH_SIM_POLL_INTERVAL_S"):
            env.pop(k, None)
        store = self.out / "gloo_store"
        self.started_unix_s = time.time()
        for r in range(self.world):
            with open(self.out / f"stdout_{r}.txt", "wb") as log:
                self.procs.append(subprocess.Popen(
                    [PYTHON, RANK_WORKER, self.job_id, str(self.cfg), str(self.out), str(r), str(self.world),
                     str(self.step_s), str(self.max_steps), str(store), self.node_settings.rank_endpoint()],
                    env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
        return self

    def stop(self, timeout_s: float = 120.0) -> None:
        """Ask the ranks to stop (same step on every rank) and wait for them to exit (their exit hooks run)."""
        (self.out / "stop").touch()
        deadline = time.monotonic() + timeout_s
        for p in self.procs:
            try:
                p.wait(max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass

    def close(self) -> None:
        """Stop the ranks (gracefully first: torch_npu's exit hooks stop its monitor and unlink its shared
        memory), then kill what is left, stop the node daemon and the fake coordinator."""
        if any(p.poll() is None for p in self.procs):
            self.stop(timeout_s=30.0)
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)  # the rank and its forked monitor (same process group)
                except ProcessLookupError:
                    pass
                p.wait(30)
        if self.node is not None and self.node_thread is not None:
            self.node.stop()
            self.node_thread.join(20)
        self.coord.close()
        for shm in Path("/dev/shm").glob(f"DynamicProfileNpuShm*{self.shm_tag}"):
            shm.unlink(missing_ok=True)  # only this job's block (left behind when a rank was killed)

    # -- observations ------------------------------------------------------------------------------------------
    def progress(self) -> list[int]:
        vals = []
        for r in range(self.world):
            try:
                vals.append(int((self.out / f"progress_{r}").read_text() or 0))
            except (OSError, ValueError):
                vals.append(0)
        return vals

    def wait_steps(self, step: int, timeout_s: float = 120.0) -> None:
        self.check_alive()
        wait_for(lambda: min(self.progress()) >= step or not self.alive(), timeout_s, 0.05,
                 f"every rank past step {step}")
        self.check_alive()

    def alive(self) -> bool:
        return all(p.poll() is None for p in self.procs)

    def check_alive(self) -> None:
        dead = [(r, p.returncode) for r, p in enumerate(self.procs) if p.poll() is not None]
        if dead:
            tails = {r: self.stdout(r)[-2000:] for r, _ in dead}
            raise AssertionError(f"ranks exited early {dead}: {tails}")

    def stdout(self, rank: int) -> str:
        try:
            return (self.out / f"stdout_{rank}.txt").read_text(errors="replace")
        except OSError:
            return ""

    def dp_log_paths(self, rank: int) -> list[Path]:
        return sorted((self.cfg / "log").glob(f"dp_*_rank_{rank}.log*"), key=lambda p: p.name.endswith(".log"))

    def dp_log(self, rank: int) -> list[str]:
        """The lines of rank ``rank``'s ``log/dp_{host}_{pid}_rank_{rank}.log`` (rotated part first)."""
        lines: list[str] = []
        for p in self.dp_log_paths(rank):
            lines += p.read_text(errors="replace").splitlines()
        return lines

    def monitor_log(self) -> list[str]:
        lines: list[str] = []
        for p in sorted((self.cfg / "log").glob("monitor_dp_*.log*")):
            lines += p.read_text(errors="replace").splitlines()
        return lines

    def dp_lines_with(self, rank: int, text: str) -> list[str]:
        return [ln for ln in self.dp_log(rank) if text in ln]

    def steps_log(self, rank: int) -> list[dict[str, int]]:
        p = self.out / f"steps_{rank}.jsonl"
        return [json.loads(x) for x in p.read_text().splitlines() if x.strip()] if p.exists() else []

    def not_before(self) -> float:
        """When the ranks started (max hello time), as the coordinator passes it to the writers."""
        hellos = self.coord.hellos()
        return max((h.ts_unix_s for h in hellos), default=self.started_unix_s)

    def rank_dirs(self, prof_dir: str | Path) -> list[Path]:
        return sorted(Path(prof_dir).glob("*_ascend_pt"))


@pytest.fixture
def npu_job(monitor_tree: MonitorTree, tmp_path: Path, short_tmp: Path) -> Iterator[Any]:
    """Factory: ``npu_job(world=4, ...)`` returns a started :class:`NpuJob`; all are closed after the test."""
    jobs: list[NpuJob] = []

    def make(**kw: Any) -> NpuJob:
        i = len(jobs)
        job = NpuJob(tmp_path / f"j{i}", short_tmp / f"n{i}", monitor_tree, **kw)
        (short_tmp / f"n{i}").mkdir()
        jobs.append(job)
        return job.start()

    yield make
    for j in jobs:
        j.close()
