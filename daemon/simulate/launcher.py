"""Launch a multi-process training job on this machine (SIMULATED CLUSTER; I/O: subprocesses).

Each rank is its own Python process running :mod:`daemon.simulate.train_job` with the standard launcher env
(``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``) plus the rankhook env, spread over
``nodes`` simulated nodes (rank r talks to the node daemon of node ``r // ranks_per_node``).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (bound then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class JobSpec:
    """What to launch. ``node_endpoints[k]`` is node k's rank endpoint."""

    job_id: str
    world_size: int
    node_endpoints: list[str]
    profiler_config_path: Path
    prof_root: Path
    mode: str = "torch"  # or "ascend-sim"
    slow_rank: int = -1
    slowdown: float = 2.0
    slow_at_step: int = 40
    max_steps: int = 5000
    max_seconds: float = 600.0
    stop_file: Path | None = None
    log_dir: Path | None = None
    extra_env: dict[str, str] = field(default_factory=dict)


@dataclass
class RunningJob:
    spec: JobSpec
    procs: list[subprocess.Popen]

    def request_stop(self) -> None:
        """Ask every rank to stop at the next agreed step (stop file), without breaking collectives."""
        if self.spec.stop_file is not None:
            self.spec.stop_file.touch()

    def wait(self, timeout_s: float) -> list[int | None]:
        """Wait for every rank; kill what is left after ``timeout_s``. Returns the exit codes."""
        import time

        deadline = time.monotonic() + timeout_s
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.send_signal(signal.SIGKILL)
                p.wait(timeout=10)
        return [p.returncode for p in self.procs]

    def kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass


def launch_job(spec: JobSpec) -> RunningJob:
    """Start ``spec.world_size`` rank processes; return handles. Raises OSError if a process cannot start."""
    spec.profiler_config_path.mkdir(parents=True, exist_ok=True)
    spec.prof_root.mkdir(parents=True, exist_ok=True)
    nodes = max(1, len(spec.node_endpoints))
    per_node = -(-spec.world_size // nodes)
    port = free_port()
    procs = []
    for rank in range(spec.world_size):
        node = min(rank // per_node, nodes - 1)
        env = dict(os.environ)
        env.update({
            "RANK": str(rank), "LOCAL_RANK": str(rank - node * per_node), "WORLD_SIZE": str(spec.world_size),
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "PROFWATCH_JOB_ID": spec.job_id,
            "PROFWATCH_NODE_ENDPOINT": spec.node_endpoints[node],
            "PROFWATCH_PROFILER_CONFIG_PATH": str(spec.profiler_config_path),
            "PROFWATCH_PROF_ROOT": str(spec.prof_root), "TORCH_DEVICE_BACKEND_AUTOLOAD": "0",
            "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
        })
        env.update(spec.extra_env)
        args = [sys.executable, "-m", "daemon.simulate.train_job", "--mode", spec.mode,
                "--slow-rank", str(spec.slow_rank), "--slowdown", str(spec.slowdown),
                "--slow-at-step", str(spec.slow_at_step), "--max-steps", str(spec.max_steps),
                "--max-seconds", str(spec.max_seconds)]
        if spec.stop_file is not None:
            args += ["--stop-file", str(spec.stop_file)]
        out = subprocess.DEVNULL
        if spec.log_dir is not None:
            spec.log_dir.mkdir(parents=True, exist_ok=True)
            out = open(spec.log_dir / f"{spec.job_id}-rank{rank}.log", "ab")  # noqa: SIM115 - owned by the child
        procs.append(subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
    return RunningJob(spec, procs)
