"""Run msprof-analyze 26.2.0 as subprocesses for one staged batch and collect what each run left (I/O: subprocess).

:class:`MsprofRunner` owns the processes: a bound on concurrent commands, timeouts, a process-group kill that
cannot hang on descendants, cancellation (per analysis or all at once, e.g. at daemon shutdown) and the list of
running recipes for ``status``. :func:`run_msprof_analysis` reads the batch (``msprof_db.inspect_inputs``), runs
the commands ``daemon.core.msprof_plan.plan_recipes`` chooses and hands each run's outputs to
``msprof_plan.interpret_run``: no policy here. Facts relied on (docs/msprof-analyze.md): exit code 0 for most
failures, so outcomes are judged from the ``--agent`` JSON and the result tables; a fresh ``-o`` per command (an
existing output folder makes advisor "succeed" empty); ``MSPROF_ANALYZE_LOG_FILE`` per run; ``--force`` (no
interactive prompt), stdin closed; never ``-V``; each command forks one worker per CPU, hence the bound. Every
path handed to the tool is absolute: it runs with its own output folder as working directory.
"""

from __future__ import annotations

import importlib.metadata
import itertools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import structlog
from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from daemon.adapters.msprof_db import inspect_inputs, read_tables
from daemon.core.evidence import ClusterEvidence
from daemon.core.msprof_plan import (
    RESULT_DB,
    RESULT_TABLES,
    InputFacts,
    MsprofSettings,
    RunOutcome,
    input_notes,
    interpret_run,
    plan_recipes,
)
from daemon.core.msprof_results import AgentMessage, parse_agent_stdout

__all__ = ["MsprofRunner", "MsprofSettings", "RunningRecipe", "RunTicket", "SpawnFailed", "ToolRun",
           "resolve_command", "run_msprof_analysis"]

log = structlog.get_logger()
_LOG_TAIL_BYTES = 4000
_LOG_TEXT_MAX_BYTES = 2 * 2**20
_POLL_S = 0.5
_MAX_CANCELLED_OWNERS = 1024
_SHUTDOWN = "the runner was closed (daemon shutting down)"


def resolve_command(command: str) -> str:
    """The executable to run for ``command``: a bare name is looked up next to ``sys.executable`` first (same
    venv, also when the venv is not on PATH, e.g. under systemd), then on PATH; a path is returned as given."""
    if os.sep in command:
        return command
    beside = Path(sys.executable).with_name(command)
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which(command) or command


class SpawnFailed(OSError):
    """The command could not be started (after every attempt)."""


class _TimedOut(Exception):
    pass


@dataclass(frozen=True, slots=True)
class RunTicket:
    """Identifies the runs of one analysis for cancellation: every run made with a ticket issued before
    :meth:`MsprofRunner.cancel` (same owner) or :meth:`MsprofRunner.cancel_all` is cancelled."""

    owner: str
    serial: int


@dataclass(frozen=True, slots=True)
class RunningRecipe:
    """One msprof-analyze process running now: recipe name, owner (batch id), pid, start (wall, s), elapsed (s)."""

    name: str
    owner: str
    pid: int
    started_unix_s: float
    elapsed_s: float


@dataclass(slots=True)
class ToolRun:
    """One finished msprof-analyze process. ``returncode`` None when killed (timeout or cancelled)."""

    name: str
    argv: list[str]
    output_dir: Path
    log_path: Path
    returncode: int | None = None
    stdout: str = ""
    stderr_tail: str = ""
    duration_s: float = 0.0
    timed_out: bool = False
    cancelled: bool = False
    cancel_reason: str = ""
    attempts: int = 1
    agent: AgentMessage = field(default_factory=lambda: AgentMessage(found=False))

    def log_tail(self) -> str:
        """Last ~4 KB of the per-run log file, else of stderr (UTF-8, undecodable bytes replaced)."""
        try:
            with self.log_path.open("rb") as fh:
                fh.seek(max(self.log_path.stat().st_size - _LOG_TAIL_BYTES, 0))
                text = fh.read().decode("utf-8", "replace")
        except OSError:
            text = ""
        return text or self.stderr_tail

    def log_text(self) -> str:
        """The per-run log (its last 2 MiB at most), or "" when there is none."""
        try:
            with self.log_path.open("rb") as fh:
                fh.seek(max(self.log_path.stat().st_size - _LOG_TEXT_MAX_BYTES, 0))
                return fh.read().decode("utf-8", "replace")
        except OSError:
            return ""


@dataclass(slots=True)
class _Proc:
    popen: subprocess.Popen[bytes]
    name: str
    ticket: RunTicket
    started_unix_s: float
    started_mono: float


class MsprofRunner:
    """Runs msprof-analyze commands for any number of analyses, at most ``settings.max_concurrent_runs`` at once.

    One per process that analyses (the coordinator owns one; ``profwatch analyze`` makes its own). Thread-safe.
    ``clock``/``wall_clock`` (monotonic and wall seconds) are injectable for tests. Use as a context manager or
    call :meth:`close`, which kills running commands and refuses new ones.
    """

    def __init__(self, settings: MsprofSettings | None = None, *, clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time) -> None:
        self.settings = settings or MsprofSettings()
        self._clock = clock
        self._wall = wall_clock
        self._slots = threading.BoundedSemaphore(self.settings.max_concurrent_runs)
        self._lock = threading.Lock()
        self._procs: dict[int, _Proc] = {}
        self._serials = itertools.count(1)
        self._all_cancelled_below = 0
        self._owner_cancelled_below: dict[str, int] = {}
        self._cancelled_serials: dict[int, None] = {}  # insertion-ordered set, bounded
        self._closed = False

    # ---------------------------------------------------------------------------------------------- control
    def ticket(self, owner: str = "") -> RunTicket:
        """A ticket for the runs of one analysis (``owner``: e.g. the batch id, for :meth:`cancel`)."""
        with self._lock:
            return RunTicket(owner=owner, serial=next(self._serials))

    def running(self) -> list[RunningRecipe]:
        """The commands running now, oldest first (for ``status``: which recipe runs and since when)."""
        now_mono = self._clock()
        with self._lock:
            procs = sorted(self._procs.values(), key=lambda p: p.started_mono)
        return [RunningRecipe(p.name, p.ticket.owner, p.popen.pid, p.started_unix_s,
                              round(now_mono - p.started_mono, 3)) for p in procs]

    def cancel(self, owner: str) -> int:
        """Cancel the runs of every ticket of ``owner`` issued so far: running ones are killed, waiting and later
        ones end at once as cancelled. Returns the number of processes killed."""
        with self._lock:
            self._owner_cancelled_below[owner] = next(self._serials)
            while len(self._owner_cancelled_below) > _MAX_CANCELLED_OWNERS:
                self._owner_cancelled_below.pop(next(iter(self._owner_cancelled_below)))
        return self._kill_cancelled()

    def cancel_ticket(self, ticket: RunTicket) -> int:
        """Cancel the runs of this one ticket (e.g. an analysis interrupted by Ctrl-C). Returns processes killed."""
        with self._lock:
            self._cancelled_serials[ticket.serial] = None
            while len(self._cancelled_serials) > _MAX_CANCELLED_OWNERS:
                self._cancelled_serials.pop(next(iter(self._cancelled_serials)))
        return self._kill_cancelled()

    def cancel_all(self) -> int:
        """Cancel every analysis started so far (tickets issued before this call); later ones run normally.
        Returns the number of processes killed."""
        with self._lock:
            self._all_cancelled_below = next(self._serials)
            self._owner_cancelled_below.clear()
        return self._kill_cancelled()

    def close(self) -> None:
        """Kill every running command and refuse new ones for good (daemon shutdown). Idempotent. The analyses
        cancelled this way end with their recipes ``timeout`` ("cancelled"); the coordinator redoes them after
        its restart (the capture is still ``analysing`` in its state store)."""
        with self._lock:
            self._closed = True
        self._kill_cancelled()

    def __enter__(self) -> MsprofRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _cancel_reason(self, ticket: RunTicket) -> str:
        """Why ``ticket`` is cancelled, or "" (caller holds no lock; reads are atomic enough under the GIL)."""
        with self._lock:
            if self._closed:
                return _SHUTDOWN
            if ticket.serial < self._all_cancelled_below:
                return "all analyses were cancelled"
            if ticket.serial < self._owner_cancelled_below.get(ticket.owner, 0):
                return f"the analysis of {ticket.owner or 'this batch'} was cancelled"
            if ticket.serial in self._cancelled_serials:
                return "the analysis was interrupted"
            return ""

    def _kill_cancelled(self) -> int:
        with self._lock:
            procs = list(self._procs.values())
        killed = 0
        for p in procs:
            if self._cancel_reason(p.ticket):
                killed += _kill_group(p.popen)
        return killed

    # ---------------------------------------------------------------------------------------------- running
    def run(self, name: str, args: list[str] | tuple[str, ...], out_root: Path, *,
            ticket: RunTicket | None = None) -> ToolRun:
        """Run ``msprof-analyze *args -o <fresh dir under out_root>`` (plus transient retries), waiting for a free
        slot first. ``out_root`` is made absolute. Raises SpawnFailed when the command cannot be started after
        every attempt; timeouts and cancellations are results (``timed_out`` / ``cancelled``), never raised."""
        ticket = ticket or self.ticket()
        out_root = Path(out_root).absolute()
        attempts = 0
        timeouts = 0

        def attempt() -> ToolRun:
            nonlocal attempts, timeouts
            attempts += 1
            run = self._run_once(name, list(args), out_root, ticket)
            run.attempts = attempts
            if run.timed_out and not run.cancelled:
                timeouts += 1
                log.warning("msprof_run_timeout", recipe=name, timeout_s=self.settings.timeout_s, attempt=attempts)
                if timeouts == 1 and attempts <= self.settings.retries:
                    raise _TimedOut(name)
            return run

        retrying = Retrying(stop=stop_after_attempt(self.settings.retries + 1), reraise=True,
                            wait=wait_exponential(multiplier=0.5, max=5),
                            retry=retry_if_exception_type((SpawnFailed, _TimedOut)))
        run: ToolRun = retrying(attempt)
        log.info("msprof_run_finished", recipe=name, returncode=run.returncode, duration_s=round(run.duration_s, 2),
                 timed_out=run.timed_out, cancelled=run.cancelled, agent_status=run.agent.status,
                 tables=run.agent.tables)
        return run

    def _acquire_slot(self, ticket: RunTicket) -> str:
        """Wait for a slot; return "" once held, or the cancellation reason (no slot held)."""
        while True:
            reason = self._cancel_reason(ticket)
            if reason:
                return reason
            if self._slots.acquire(timeout=_POLL_S):
                reason = self._cancel_reason(ticket)
                if reason:
                    self._slots.release()
                return reason

    def _run_once(self, name: str, args: list[str], out_root: Path, ticket: RunTicket) -> ToolRun:
        out_root.mkdir(parents=True, exist_ok=True)
        run_dir = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=out_root))
        log_path = out_root / "logs" / f"{run_dir.name}.log"
        log_path.parent.mkdir(exist_ok=True)
        argv = [resolve_command(self.settings.command), *args, "-o", str(run_dir)]
        run = ToolRun(name=name, argv=argv, output_dir=run_dir, log_path=log_path)
        reason = self._acquire_slot(ticket)
        if reason:
            run.timed_out = run.cancelled = True
            run.cancel_reason = run.stderr_tail = f"cancelled: {reason}"
            return run
        try:
            return self._spawn(run, ticket)
        finally:
            self._slots.release()

    def _spawn(self, run: ToolRun, ticket: RunTicket) -> ToolRun:
        env = dict(os.environ, LANG="C.UTF-8", LC_ALL="C.UTF-8", PYTHONIOENCODING="utf-8",
                   MSPROF_ANALYZE_LOG_FILE=str(run.log_path))
        log.info("msprof_run_started", recipe=run.name, owner=ticket.owner)
        t0 = self._clock()
        try:
            proc = subprocess.Popen(run.argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, cwd=run.output_dir, env=env, start_new_session=True)
        except OSError as exc:
            log.warning("msprof_spawn_failed", recipe=run.name, error=str(exc))
            raise SpawnFailed(str(exc)) from exc
        entry = _Proc(proc, run.name, ticket, self._wall(), t0)
        with self._lock:
            self._procs[proc.pid] = entry
        try:
            out, err, over = self._collect(proc, ticket, t0 + self.settings.timeout_s)
        finally:
            with self._lock:
                self._procs.pop(proc.pid, None)
        reason = self._cancel_reason(ticket) if over else ""
        if reason:
            run.cancelled = True
            run.cancel_reason = reason
            err = f"cancelled: {reason}\n".encode() + err
        run.timed_out = over
        run.duration_s = self._clock() - t0
        run.returncode = None if over else proc.returncode
        run.stdout = out.decode("utf-8", "replace")
        run.stderr_tail = err.decode("utf-8", "replace")[-_LOG_TAIL_BYTES:]
        run.agent = parse_agent_stdout(run.stdout)
        return run

    def _collect(self, proc: subprocess.Popen[bytes], ticket: RunTicket,
                 deadline: float) -> tuple[bytes, bytes, bool]:
        """Wait for ``proc`` until ``deadline`` (monotonic) or its cancellation; then kill its process group.
        Returns ``(stdout, stderr, killed)``. Never hangs on a descendant that keeps the pipes open."""
        while True:
            try:
                out, err = proc.communicate(timeout=min(_POLL_S, max(0.01, deadline - self._clock())))
                return out, err, bool(self._cancel_reason(ticket))  # killed by a cancellation: not a result
            except subprocess.TimeoutExpired:
                if self._clock() < deadline and not self._cancel_reason(ticket):
                    continue
            _kill_group(proc)
            try:
                out, err = proc.communicate(timeout=5)
            except subprocess.TimeoutExpired:  # a detached descendant still holds the pipes: stop reading them
                for f in (proc.stdout, proc.stderr):
                    if f is not None:
                        f.close()
                proc.wait(timeout=5)
                out, err = b"", b"(output abandoned: a descendant kept the pipes open after the kill)"
            return out or b"", err or b"", True


def _kill_group(proc: subprocess.Popen[bytes]) -> int:
    """SIGKILL the process group of ``proc`` (its own session); 1 when signalled, 0 when already gone."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
        return 1
    except (ProcessLookupError, PermissionError):
        return 0


def _outcome(run: ToolRun | SpawnFailed, name: str) -> RunOutcome:
    """Read what one run left (result tables, log, advisor files) into a :class:`RunOutcome`."""
    if isinstance(run, SpawnFailed):
        return RunOutcome(name=name, spawn_error=str(run))
    tables = read_tables(run.output_dir / RESULT_DB, RESULT_TABLES.get(name, ()))
    files = []
    if name == "advisor_html" and not run.timed_out:
        files = sorted(str(p) for p in run.output_dir.rglob("mstt_advisor_*") if p.suffix in (".html", ".xlsx"))
    return RunOutcome(name=name, output_dir=str(run.output_dir), returncode=run.returncode, timed_out=run.timed_out,
                      cancelled=run.cancelled, cancel_reason=run.cancel_reason, attempts=run.attempts,
                      duration_s=run.duration_s, agent=run.agent, log_text=run.log_text(), log_tail=run.log_tail(),
                      tables=tables, files=files)


def _versions(facts: InputFacts) -> dict[str, str]:
    versions = {"torch_npu": ",".join(sorted(facts.torch_npu_versions)),
                "cann": ",".join(sorted(facts.cann_versions))}
    try:
        versions["msprof_analyze"] = importlib.metadata.version("msprof-analyze")
    except importlib.metadata.PackageNotFoundError:
        versions["msprof_analyze"] = "unknown"
    return {k: v for k, v in versions.items() if v}


def run_msprof_analysis(staged_dir: Path, out_dir: Path, *, runner: MsprofRunner, world_size: int,
                        owner: str = "", expected_ranks: list[int] | None = None) -> ClusterEvidence:
    """Run the recipes ``plan_recipes`` picks (cluster_time_summary, slow_rank, ``advisor all``; each
    ``--agent --force`` into its own fresh ``-o`` under ``out_dir``) on one staged batch of ``world_size``
    ranks through ``runner``; return the evidence (µs) with a :class:`RecipeStatus` per recipe
    (``evidence.recipes[name]``, statuses as ``msprof_plan.interpret_run`` documents).

    ``owner`` labels the runs for :meth:`MsprofRunner.cancel` and ``running()``. ``expected_ranks``: the ranks
    staged when they are not ``0..world_size-1`` (a subset). Paths are made absolute first.
    Raises nothing for tool failures; OSError if ``out_dir`` cannot be created.
    """
    staged_dir, out_dir = Path(staged_dir).absolute(), Path(out_dir).absolute()
    out_dir.mkdir(parents=True, exist_ok=True)
    ticket = runner.ticket(owner)
    facts = inspect_inputs(staged_dir)
    ev = ClusterEvidence(kind="ascend_pt", versions=_versions(facts), collectives_per_step=facts.collectives_per_step)
    ev.notes += input_notes(facts, len(expected_ranks) if expected_ranks is not None else world_size)
    plan = plan_recipes(facts, runner.settings, str(staged_dir))
    for name, status in plan.skipped.items():
        log.info("msprof_recipe_skipped", recipe=name, status=status.status, detail=status.detail)
        ev.recipes[name] = status
    runs: dict[str, ToolRun | SpawnFailed] = {}
    if plan.commands:
        workers = max(1, min(len(plan.commands), runner.settings.max_concurrent_runs))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="msprof") as pool:
            futures = {c.name: pool.submit(runner.run, c.name, c.args, out_dir, ticket=ticket) for c in plan.commands}
            try:
                for name, fut in futures.items():
                    try:
                        runs[name] = fut.result()
                    except SpawnFailed as exc:
                        runs[name] = exc
            except BaseException:  # interrupted (Ctrl-C) or a bug: leave no tool running, do not wait for it
                runner.cancel_ticket(ticket)
                raise
    for name, run in runs.items():
        ev.recipes[name] = interpret_run(_outcome(run, name), facts, world_size, ev, expected_ranks)
    log.info("msprof_analysis_finished", world_size=world_size, owner=owner,
             statuses={k: v.status for k, v in ev.recipes.items()}, votes=ev.slow_rank_votes)
    return ev

