"""Run msprof-analyze 26.2.0 as subprocesses and collect what each run left (I/O: subprocess).

:class:`MsprofRunner` owns the processes: a bound on concurrent commands per phase (the recipes the verdict waits
for never wait for an enrichment run: those have their own slot and run at a lower CPU priority), timeouts, a
memory watchdog on each tool's whole process session (``daemon/profwatch/adapters/fs/proc_memory.py``; a run killed at the
cap is a result, ``oom``, never an exception), a process-group kill that cannot hang on descendants,
cancellation (per analysis or all at once, e.g. at daemon shutdown) and the list of running recipes for
``status``. What to run and what a run means is decided elsewhere (``daemon/profwatch/core/verdict/msprof_plan.py``; the batch
level is ``daemon/profwatch/adapters/tools/msprof_analysis.py``). Facts relied on (docs/msprof-analyze.md): exit code 0 for most
failures; a fresh ``-o`` per command; ``MSPROF_ANALYZE_LOG_FILE`` per run; ``--force`` (no interactive prompt),
stdin closed; never ``-V``; each command forks one worker per CPU, hence the bounds. Every path handed to the
tool is absolute: it runs with its own output folder as working directory, and on a path it takes
(``staging.tool_safe_root``): under an odd ``out_root`` a run is made in the system's temporary folder and
moved there after.
"""

from __future__ import annotations

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
from dataclasses import dataclass, field
from pathlib import Path

import structlog
from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from profwatch.adapters.fs import proc_memory
from profwatch.adapters.fs.staging import tool_safe_root
from profwatch.core.verdict.evidence import RecipePhase
from profwatch.core.verdict.msprof_plan import MsprofSettings, concurrent_runs, memory_cap_bytes
from profwatch.core.verdict.msprof_results import AgentMessage, parse_agent_stdout

__all__ = ["MsprofRunner", "MsprofSettings", "RunningRecipe", "RunTicket", "SpawnFailed", "ToolRun",
           "resolve_command"]


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
    """One msprof-analyze process running now: recipe name, owner (batch id), pid, start (wall, s), elapsed (s),
    phase (``alert`` / ``enrich``) and the resident memory of its process group at the last watchdog poll."""

    name: str
    owner: str
    pid: int
    started_unix_s: float
    elapsed_s: float
    phase: RecipePhase = "alert"
    rss_bytes: int = 0


@dataclass(slots=True)
class ToolRun:
    """One finished msprof-analyze process. ``returncode`` None when killed (timeout, cancelled, memory cap).
    ``oom``: killed by the memory watchdog at ``memory_limit_bytes`` (or, under a systemd scope, by the kernel);
    ``peak_rss_bytes``: the highest resident memory of its process session seen by the watchdog."""

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
    phase: RecipePhase = "alert"
    oom: bool = False
    oom_detail: str = ""
    peak_rss_bytes: int = 0
    memory_limit_bytes: int | None = None

    def log_tail(self) -> str:
        """Last ~4 KB of the per-run log file, else of stderr (UTF-8, undecodable bytes replaced)."""
        try:
            with self.log_path.open("rb") as fh:
                fh.seek(max(self.log_path.stat().st_size - _LOG_TAIL_BYTES, 0))
                text = fh.read(_LOG_TAIL_BYTES).decode("utf-8", "replace")  # bounded: the log may grow meanwhile
        except OSError:
            text = ""
        return text or self.stderr_tail

    def log_text(self) -> str:
        """The per-run log (its last 2 MiB at most), or "" when there is none."""
        try:
            with self.log_path.open("rb") as fh:
                fh.seek(max(self.log_path.stat().st_size - _LOG_TEXT_MAX_BYTES, 0))
                return fh.read(_LOG_TEXT_MAX_BYTES).decode("utf-8", "replace")
        except OSError:
            return ""


@dataclass(slots=True)
class _Proc:
    popen: subprocess.Popen[bytes]
    name: str
    ticket: RunTicket
    started_unix_s: float
    started_mono: float
    phase: RecipePhase = "alert"
    rss_bytes: int = 0


class MsprofRunner:
    """Runs msprof-analyze commands for any number of analyses.

    Bounds: at most ``concurrency`` alert-phase commands at once (``settings.max_concurrent_runs``, 0 = from the
    CPU count: ``msprof_plan.concurrent_runs``) and one enrich-phase command, which runs ``settings.enrich_nice``
    lower in CPU priority, so an advisor never holds a slot nor CPU the verdict of another batch waits for. Every
    command's process session is capped at ``memory_limit_bytes`` (``msprof_plan.memory_cap_bytes``: the setting,
    else a share of the host's memory) by a watchdog polling ``/proc`` every ``memory_poll_interval_s``, plus a
    systemd scope where one can be started (``settings.memory_limit``).

    One per process that analyses (the coordinator owns one; ``profwatch analyze`` makes its own). Thread-safe.
    ``clock``/``wall_clock`` (monotonic and wall seconds) are injectable for tests. Use as a context manager or
    call :meth:`close`, which kills running commands and refuses new ones.
    """

    def __init__(self, settings: MsprofSettings | None = None, *, clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time) -> None:
        self.settings = settings or MsprofSettings()
        self._clock = clock
        self._wall = wall_clock
        self.concurrency = concurrent_runs(self.settings, _cpu_count())
        self.memory_limit_bytes = memory_cap_bytes(self.settings, proc_memory.host_memory_bytes())
        self.scope = (proc_memory.probe_systemd_scope() if self.settings.memory_limit in ("auto", "scope")
                      and self.memory_limit_bytes else proc_memory.ScopeSupport(why="not asked for"))
        if self.settings.memory_limit == "scope" and not self.scope.available:
            log.warning("msprof_memory_scope_unavailable", why=self.scope.why, fallback="watchdog")
        self._slots = threading.BoundedSemaphore(self.concurrency)
        self._enrich_slots = threading.BoundedSemaphore(1)
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
                              round(now_mono - p.started_mono, 3), p.phase, p.rss_bytes) for p in procs]

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
        cancelled this way end with their recipes ``cancelled``; the coordinator redoes them after
        its restart (the capture is still ``analysing`` in its state store)."""
        with self._lock:
            self._closed = True
        self._kill_cancelled()

    def __enter__(self) -> MsprofRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def cancelled(self, ticket: RunTicket) -> str:
        """Why the runs of ``ticket`` are cancelled (its owner's analysis, every analysis, or the runner closed),
        or "" while they may run: a caller about to start a further step stops when it is not ""."""
        return self._cancel_reason(ticket)

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
            ticket: RunTicket | None = None, phase: RecipePhase = "alert",
            on_start: Callable[[], None] | None = None) -> ToolRun:
        """Run ``msprof-analyze *args -o <fresh dir under out_root>`` (plus transient retries), waiting for a free
        slot of its ``phase`` first. ``out_root`` is made absolute. Raises SpawnFailed when the command cannot be
        started after every attempt; timeouts, cancellations and the memory cap are results (``timed_out`` /
        ``cancelled`` / ``oom``), never raised; a run killed at the memory cap is not retried. ``on_start`` is
        called once, when the first attempt's process starts (after the wait for a slot)."""
        ticket = ticket or self.ticket()
        out_root = Path(out_root).absolute()
        attempts = 0
        timeouts = 0

        def attempt() -> ToolRun:
            nonlocal attempts, timeouts
            attempts += 1
            run = self._run_once(name, list(args), out_root, ticket, phase, on_start if attempts == 1 else None)
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
                 timed_out=run.timed_out, cancelled=run.cancelled, oom=run.oom, phase=phase,
                 peak_rss_mib=round(run.peak_rss_bytes / 2**20, 1), agent_status=run.agent.status,
                 tables=run.agent.tables)
        return run

    def _acquire_slot(self, ticket: RunTicket, slots: threading.BoundedSemaphore) -> str:
        """Wait for one of ``slots``; return "" once held, or the cancellation reason (no slot held)."""
        while True:
            reason = self._cancel_reason(ticket)
            if reason:
                return reason
            if slots.acquire(timeout=_POLL_S):
                reason = self._cancel_reason(ticket)
                if reason:
                    slots.release()
                return reason

    def _run_once(self, name: str, args: list[str], out_root: Path, ticket: RunTicket,
                  phase: RecipePhase = "alert", on_start: Callable[[], None] | None = None) -> ToolRun:
        out_root.mkdir(parents=True, exist_ok=True)
        # an out_root msprof-analyze cannot take (a byte that is not UTF-8 makes it fail to print its own output
        # paths, exit code 1): the run writes under the system's temporary folder, moved to out_root after
        work_root = tool_safe_root(out_root)
        moved = work_root != out_root
        if moved:
            work_root = Path(tempfile.mkdtemp(prefix="tool-output-", dir=work_root))
        run_dir = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=work_root))
        log_path = work_root / "logs" / f"{run_dir.name}.log"
        log_path.parent.mkdir(exist_ok=True)
        argv = [resolve_command(self.settings.command), *args, "-o", str(run_dir)]
        run = ToolRun(name=name, argv=argv, output_dir=run_dir, log_path=log_path, phase=phase,
                      memory_limit_bytes=self.memory_limit_bytes)
        slots = self._enrich_slots if phase == "enrich" else self._slots
        try:
            reason = self._acquire_slot(ticket, slots)
            if reason:
                run.cancelled = True
                run.cancel_reason = run.stderr_tail = f"cancelled: {reason}"
                return run
            try:
                return self._spawn(run, ticket, on_start)
            finally:
                slots.release()
        finally:
            if moved:
                _bring_back(run, work_root, out_root)

    def _spawn(self, run: ToolRun, ticket: RunTicket, on_start: Callable[[], None] | None = None) -> ToolRun:
        env = dict(os.environ, LANG="C.UTF-8", LC_ALL="C.UTF-8", PYTHONIOENCODING="utf-8",
                   MSPROF_ANALYZE_LOG_FILE=str(run.log_path))
        log.info("msprof_run_started", recipe=run.name, owner=ticket.owner, phase=run.phase)
        limit = self.memory_limit_bytes
        # the kernel's cap (a scope, where systemd allows) sits 10 % above the watchdog's: the watchdog, which
        # can name the cause, acts first; the scope stops a spike between two polls
        prefix = proc_memory.scope_prefix(self.scope, int(limit * 1.1)) if limit else []
        nice = shutil.which("nice") if run.phase == "enrich" and self.settings.enrich_nice else None
        # nice(1) execs the tool at the lower priority: every worker it forks inherits it, from the first instant
        lower = [nice, "-n", str(self.settings.enrich_nice)] if nice else []
        if (prefix or lower) and shutil.which(run.argv[0]) is None:  # a wrapper would start and fail with 127
            log.warning("msprof_spawn_failed", recipe=run.name, error=f"not an executable: {run.argv[0]}")
            raise SpawnFailed(f"[Errno 2] No such file or directory: {run.argv[0]!r}")
        t0 = self._clock()
        try:
            proc = subprocess.Popen([*prefix, *lower, *run.argv], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, cwd=run.output_dir, env=env, start_new_session=True)
        except OSError as exc:
            log.warning("msprof_spawn_failed", recipe=run.name, error=str(exc))
            raise SpawnFailed(str(exc)) from exc
        if run.phase == "enrich" and self.settings.enrich_nice and not nice:
            try:  # no nice(1): lower it right after the start, before the tool forks its workers (~1 s of imports)
                os.setpriority(os.PRIO_PROCESS, proc.pid, min(19, os.getpriority(os.PRIO_PROCESS, 0)
                                                                + self.settings.enrich_nice))
            except OSError as exc:
                log.warning("msprof_nice_failed", recipe=run.name, error=str(exc))
        entry = _Proc(proc, run.name, ticket, self._wall(), t0, run.phase)
        with self._lock:
            self._procs[proc.pid] = entry
        if on_start is not None:
            try:
                on_start()
            except Exception:  # noqa: BLE001 - a progress display never stops a run
                log.warning("msprof_progress_failed", recipe=run.name, exc_info=True)
        try:
            out, err, why = self._collect(proc, ticket, t0 + self.settings.timeout_s, run, entry)
        finally:
            with self._lock:
                self._procs.pop(proc.pid, None)
        over = bool(why)
        reason = self._cancel_reason(ticket) if why == "cancel" else ""
        if reason:
            run.cancelled = True
            run.cancel_reason = reason
            err = f"cancelled: {reason}\n".encode() + err
        if why == "oom":
            run.oom = True
            err = f"killed: {run.oom_detail}\n".encode() + err
        elif not why and prefix and limit and proc.returncode == -signal.SIGKILL:
            run.oom = True  # nobody here sent it: the scope's MemoryMax (the kernel's OOM killer) did
            run.oom_detail = (f"killed by SIGKILL in its systemd scope (MemoryMax={int(limit * 1.1)} bytes): "
                              "the kernel's OOM killer")
        run.timed_out = why == "timeout"  # a cancelled run is cancelled, not timed out
        run.duration_s = self._clock() - t0
        run.returncode = None if over else proc.returncode
        if run.oom:
            log.warning("msprof_run_oom", recipe=run.name, owner=ticket.owner, detail=run.oom_detail)
        run.stdout = out.decode("utf-8", "replace")
        run.stderr_tail = err.decode("utf-8", "replace")[-_LOG_TAIL_BYTES:]
        run.agent = parse_agent_stdout(run.stdout)
        return run

    def _collect(self, proc: subprocess.Popen[bytes], ticket: RunTicket, deadline: float, run: ToolRun,
                 entry: _Proc) -> tuple[bytes, bytes, str]:
        """Wait for ``proc`` until ``deadline`` (monotonic), its cancellation or its memory cap; then kill its
        process group. Returns ``(stdout, stderr, why)``, ``why`` "" when it ended by itself, else ``timeout``,
        ``cancel`` or ``oom``. Never hangs on a descendant that keeps the pipes open."""
        limit = self.memory_limit_bytes if self.settings.memory_limit != "off" else None
        poll = min(_POLL_S, self.settings.memory_poll_interval_s)
        why = ""
        while True:
            try:
                out, err = proc.communicate(timeout=min(poll, max(0.01, deadline - self._clock())))
                # killed by a cancellation while we waited: not a result
                return out, err, "cancel" if self._cancel_reason(ticket) else ""
            except subprocess.TimeoutExpired:
                rss = proc_memory.session_rss_bytes(proc.pid)
                entry.rss_bytes = rss
                run.peak_rss_bytes = max(run.peak_rss_bytes, rss)
                if limit is not None and rss > limit:
                    why = "oom"
                    run.oom_detail = (f"resident memory of its process group reached {rss / 2**20:.0f} MiB, over "
                                      f"the cap of {limit / 2**20:.0f} MiB ([analysis.msprof] memory_limit_bytes)")
                elif self._cancel_reason(ticket):
                    why = "cancel"
                elif self._clock() >= deadline:
                    why = "timeout"
                else:
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
            return out or b"", err or b"", why


def _bring_back(run: ToolRun, holder: Path, out_root: Path) -> None:
    """Move a run made under ``holder`` (a fresh folder of the system's temporary folder: ``out_root`` was not a
    path the tool takes) into ``out_root`` as if it had run there: its output folder and its log (our own files,
    never the user's), then remove ``holder``; ``run``'s paths are updated. A move that fails is logged and
    leaves the run where it is (its paths still point there)."""
    try:
        dest = out_root / run.output_dir.name
        shutil.move(run.output_dir, dest)
        run.output_dir = dest
        if run.log_path.exists():
            (out_root / "logs").mkdir(exist_ok=True)
            log_dest = out_root / "logs" / run.log_path.name
            shutil.move(run.log_path, log_dest)
            run.log_path = log_dest
        shutil.rmtree(holder)
    except OSError as exc:
        log.warning("msprof_output_move_failed", recipe=run.name, error=str(exc), left_at=str(holder))


def _kill_group(proc: subprocess.Popen[bytes]) -> int:
    """SIGKILL the process group of ``proc`` (its own session) and any process of its session that left the
    group; 1 when signalled, 0 when already gone."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
        killed = 1
    except (ProcessLookupError, PermissionError):
        killed = 0
    for pid in proc_memory.session_members(proc.pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            continue
    return killed


def _cpu_count() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


