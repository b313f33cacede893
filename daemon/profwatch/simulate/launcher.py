"""Launch a multi-process training job on this machine (SIMULATED CLUSTER; I/O: subprocesses).

Each rank is its own Python process running :mod:`profwatch.simulate.train_job` with the standard launcher env
(``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``) plus the rankhook env, spread over
``nodes`` simulated nodes (rank r talks to the node daemon of node ``r // ranks_per_node``).

The ranks of one job share one process group of their own (the first rank leads it), so whoever launched them
stops them all with :meth:`RunningJob.stop` (stop file, then SIGTERM and SIGKILL to that group) and never signals
anything else; on Linux each rank also gets SIGTERM when the launching process dies (``PR_SET_PDEATHSIG``,
prctl(2)), so a launcher killed outright leaves no rank running.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, NoReturn


def exit_rank(code: int = 0) -> NoReturn:
    """End a rank process that used a gloo process group as a normal exit would, up to the interpreter's
    finalization, which it skips: wait for the non-daemon threads and run threading's exit hooks (what
    ``Py_FinalizeEx`` does first: ``threading._shutdown``, e.g. a ThreadPoolExecutor's queued work), run the atexit
    hooks (``logging.shutdown`` among them; a hook that raises is printed and the rest still run, as at a normal
    exit), flush Python's stdout/stderr and libc's stdio buffers (``fflush(NULL)``, as ``exit(3)`` does: output a
    C/C++ library wrote to a stdout that is a file or pipe), then ``os._exit(code)``. Call it from the main thread.

    Why: a gloo worker thread can still hold the last collective's work (tensors with Python objects) when the
    main thread returns, and release it while the interpreter finalizes. Taking the GIL then ends that thread
    with a forced unwind through a destructor, and the process aborts (SIGABRT, "terminate called without an
    active exception"; core dump: ``ProcessGroupGloo::AsyncWork::~AsyncWork`` -> ``gil_scoped_acquire`` ->
    ``PyThread_exit_thread`` in a gloo thread while the main thread is in ``Py_FinalizeEx``). Seen with torch
    2.13.0+cpu in 4 of 97 four-rank gloo jobs with torch.profiler on (0 of 34 without it), after every file was
    written and ``destroy_process_group`` had returned; 0 of 80 with this exit. The rank's own work is done at
    this point, so its exit code should not be the torch runtime's race. Never returns.
    """
    threading._shutdown()  # type: ignore[attr-defined]  # joins non-daemon threads (gloo's are C++, not these)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            pass  # closed or broken: nothing more to save
    try:
        ctypes.CDLL(None).fflush(None)  # every C stdio stream (fflush(3) with NULL)
    except (OSError, AttributeError):
        pass  # no libc to load by that name (not POSIX): nothing buffered there to lose
    os._exit(code)


_HANDED_OUT: set[int] = set()
_HANDED_LOCK = threading.Lock()


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (bound then released), never one this process was handed before.

    The kernel may give the port it just released to the next ``bind(0)``: two calls in a row once returned the same
    port, and a test's ``pub_bind`` equalled its ``control_bind``. Ports handed out are remembered for the process's
    life (at most the ~28k ephemeral ports; a test session uses a few hundred).

    Raises:
        OSError: no port left that this process was not handed before.
    """
    with _HANDED_LOCK:
        for _ in range(64):
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = int(s.getsockname()[1])
            if port not in _HANDED_OUT:
                _HANDED_OUT.add(port)
                return port
    raise OSError("no free TCP port on 127.0.0.1 that this process was not handed before (64 tries)")


ALL_RANKS = -2
"""``JobSpec.slow_rank`` value that slows every rank."""


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
    """The rank made slower from ``slow_at_step``: -1 none, :data:`ALL_RANKS` every rank (a job-wide regression)."""
    slowdown: float = 2.0
    slow_at_step: int = 40
    burst_at_step: int = -1  # a job-wide load burst: every rank burst_factor times slower for burst_steps steps
    burst_steps: int = 0
    burst_factor: float = 1.5
    max_steps: int = 5000
    max_seconds: float = 600.0
    stop_file: Path | None = None
    slow_file: Path | None = None
    """When set, the slowdown starts only once this file exists (and ``slow_at_step`` is reached)."""
    log_dir: Path | None = None
    extra_env: dict[str, str] = field(default_factory=dict)


@dataclass
class RunningJob:
    spec: JobSpec
    procs: list[subprocess.Popen]
    pgid: int | None = None  # the ranks' own process group (None: no rank started)

    def request_stop(self) -> None:
        """Ask every rank to stop at the next agreed step (stop file), without breaking collectives."""
        if self.spec.stop_file is not None:
            self.spec.stop_file.touch()

    def running(self) -> int:
        """How many rank processes are still running."""
        return sum(1 for p in self.procs if p.poll() is None)

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

    def stop(self, grace_s: float = 30.0, term_s: float = 10.0) -> list[int | None]:
        """Stop every rank: the stop file (they leave together at the next agreed step) and up to ``grace_s``
        for that, then SIGTERM to their process group and up to ``term_s``, then SIGKILL. Returns exit codes."""
        import time

        self.request_stop()
        for sig, bound in ((None, grace_s), (signal.SIGTERM, term_s), (signal.SIGKILL, 10.0)):
            if sig is not None and self.running():
                self._signal_group(sig)
            deadline = time.monotonic() + bound
            while self.running() and time.monotonic() < deadline:
                time.sleep(0.1)
            if not self.running():
                break
        return [p.poll() for p in self.procs]

    def _signal_group(self, sig: int) -> None:
        if self.pgid is not None:
            try:
                os.killpg(self.pgid, sig)  # our ranks' own group: nothing else is in it
                return
            except (ProcessLookupError, PermissionError):
                pass  # the leader's group is gone: signal the ranks still running one by one
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(sig)

    def kill(self) -> None:
        self._signal_group(signal.SIGKILL)
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass


def die_with_parent() -> Callable[[], None]:
    """A function a forked child calls to get SIGTERM when its parent dies (Linux prctl PR_SET_PDEATHSIG);
    a no-op elsewhere. libc is loaded here, in the parent: a child between fork and exec only calls it."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return lambda: None
    pr_set_pdeathsig = 1
    return lambda: prctl(pr_set_pdeathsig, int(signal.SIGTERM), 0, 0, 0)


def _child_setup(pgid: int, on_parent_death: Callable[[], None]) -> Callable[[], None]:
    """``preexec_fn`` of a rank: join process group ``pgid`` (0: lead a new one) and die with its parent."""
    def setup() -> None:
        os.setpgid(0, pgid)
        on_parent_death()

    return setup


def launch_job(spec: JobSpec) -> RunningJob:
    """Start ``spec.world_size`` rank processes; return handles. Raises OSError if a process cannot start."""
    spec.profiler_config_path.mkdir(parents=True, exist_ok=True)
    spec.prof_root.mkdir(parents=True, exist_ok=True)
    nodes = max(1, len(spec.node_endpoints))
    per_node = -(-spec.world_size // nodes)
    port = free_port()
    procs: list[subprocess.Popen] = []
    pgid = 0
    on_parent_death = die_with_parent()
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
            "PYTHONSAFEPATH": "1",  # `-m` must not import a `profwatch` folder in the cwd instead (Python >= 3.11)
        })
        env.update(spec.extra_env)
        args = [sys.executable, "-m", "profwatch.simulate.train_job", "--mode", spec.mode,
                "--slow-rank", str(spec.slow_rank), "--slowdown", str(spec.slowdown),
                "--slow-at-step", str(spec.slow_at_step), "--burst-at-step", str(spec.burst_at_step),
                "--burst-steps", str(spec.burst_steps), "--burst-factor", str(spec.burst_factor),
                "--max-steps", str(spec.max_steps),
                "--max-seconds", str(spec.max_seconds)]
        if spec.stop_file is not None:
            args += ["--stop-file", str(spec.stop_file)]
        if spec.slow_file is not None:
            args += ["--slow-file", str(spec.slow_file)]
        out: int | IO[bytes] = subprocess.DEVNULL
        if spec.log_dir is not None:
            spec.log_dir.mkdir(parents=True, exist_ok=True)
            out = open(spec.log_dir / f"{spec.job_id}-rank{rank}.log", "ab")  # noqa: SIM115 - closed below
        try:
            proc = subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    preexec_fn=_child_setup(pgid, on_parent_death))
        except BaseException:
            RunningJob(spec, procs, pgid or None).kill()  # leave no rank of a half-started job behind
            raise
        finally:
            if not isinstance(out, int):
                out.close()  # the child holds its own copy
        procs.append(proc)
        pgid = pgid or proc.pid
    return RunningJob(spec, procs, pgid or None)
