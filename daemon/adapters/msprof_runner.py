"""Run msprof-analyze 26.2.0 on one staged batch and turn its outputs into ClusterEvidence (I/O: subprocess, sqlite).

Facts this adapter relies on come from ``../shared/docs/msprof-analyze.md``: rc 0 for almost every failure
(sections 2.4, 14.1) so success is judged from the ``--agent`` JSON *and* the table in ``cluster_analysis.db``;
a fresh ``-o`` per command (section 0.5, advisor otherwise "succeeds" empty); ``MSPROF_ANALYZE_LOG_FILE`` per
run (gotcha 13); never ``-V`` (credential URL, section 1); the tool forks one worker per CPU (gotcha 16), so
runs are bounded by a semaphore. No policy here: statuses are facts about what the tool produced.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog
from pydantic import BaseModel, ConfigDict, Field
from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from daemon.core.evidence import ClusterEvidence, RecipeStatus
from daemon.core.msprof_results import (
    AgentMessage,
    common_steps,
    parse_agent_stdout,
    parse_cluster_time_summary,
    parse_rank_device_map,
    parse_slow_op_stats,
    parse_slow_rank,
    read_table,
    sqlite_truncated,
    summarize_advisor,
)

log = structlog.get_logger()
_LOG_TAIL_BYTES = 4000
_RESULT_DB = Path("cluster_analysis_output") / "cluster_analysis.db"


def _default_command() -> str:
    """The ``msprof-analyze`` script next to ``sys.executable`` (same venv), else the one on PATH."""
    beside = Path(sys.executable).with_name("msprof-analyze")
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("msprof-analyze") or "msprof-analyze"


class MsprofSettings(BaseModel):
    """How msprof-analyze is run. ``timeout_s`` per command; ``retries``: extra attempts for transient failures
    (spawn OSError; a timeout is retried once at most). ``max_concurrent_runs`` bounds commands running at once
    (each forks one worker per CPU). ``advisor_html`` adds a plain advisor run so the html/xlsx exist for people."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    command: str = Field(default_factory=_default_command)
    timeout_s: float = Field(default=900.0, gt=0)
    max_concurrent_runs: int = Field(default=1, ge=1)
    advisor: bool = True
    advisor_html: bool = True
    communication_matrix: bool = True
    """Run ``-m communication_matrix_sum`` (per-pair link bandwidth, for slow-link verdicts; a few seconds)."""
    retries: int = Field(default=1, ge=0, le=5)
    language: str = Field(default="en", pattern="^(en|cn)$")


def make_limiter(settings: MsprofSettings) -> threading.BoundedSemaphore:
    """A semaphore sized from settings; create one in the composition root and pass it to every analysis."""
    return threading.BoundedSemaphore(settings.max_concurrent_runs)


class _SpawnFailed(Exception):
    pass


class _TimedOut(Exception):
    pass


@dataclass(slots=True)
class ToolRun:
    """One finished msprof-analyze process. ``returncode`` None when it timed out."""

    name: str
    argv: list[str]
    output_dir: Path
    log_path: Path
    returncode: int | None = None
    stdout: str = ""
    stderr_tail: str = ""
    duration_s: float = 0.0
    timed_out: bool = False
    attempts: int = 1
    agent: AgentMessage = field(default_factory=lambda: AgentMessage(found=False))

    def log_tail(self) -> str:
        """Last ~4 KB of the per-run log file, else of stderr."""
        try:
            with self.log_path.open("rb") as fh:
                fh.seek(max(self.log_path.stat().st_size - _LOG_TAIL_BYTES, 0))
                text = fh.read().decode("utf-8", "replace")
        except OSError:
            text = ""
        return text or self.stderr_tail

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""


@dataclass(slots=True)
class InputFacts:
    """What the staged batch can answer, read before running (section 12 steps 2 and 6-7)."""

    rank_count: int = 0
    db_ranks: list[int] = field(default_factory=list)
    broken_db_ranks: list[int] = field(default_factory=list)
    has_communication: bool = False
    has_memcpy: bool = False
    collectives_per_step: float | None = None
    max_group_size: int = 0
    levels: set[str] = field(default_factory=set)
    torch_npu_versions: set[str] = field(default_factory=set)
    cann_versions: set[str] = field(default_factory=set)
    notes: list[str] = field(default_factory=list)

    @property
    def healthy_db_ranks(self) -> list[int]:
        return [r for r in self.db_ranks if r not in self.broken_db_ranks]


def _probe(db: Path, sql: str) -> bool:
    """True when ``sql`` returns a row from ``db`` opened read-only; False on no row or any sqlite error."""
    try:
        con = sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True)
    except sqlite3.Error:
        return False
    try:
        return con.execute(sql).fetchone() is not None
    except sqlite3.Error:
        return False
    finally:
        con.close()


def inspect_inputs(staged_dir: Path, *, max_depth: int = 5) -> InputFacts:
    """Walk ``staged_dir`` (as msprof-analyze does, section 3: dirs with ``ASCEND_PROFILER_OUTPUT`` up to 5
    levels) and record ranks, DB health (header-size truncation, RANK_DEVICE_MAP readable), communication and
    MEMCPY_ASYNC presence, group sizes (``parallel_group_info``), levels and versions (``profiler_info``)."""
    facts = InputFacts()
    rank_dirs: list[Path] = []
    for root, dirs, _files in os.walk(staged_dir):
        depth = len(Path(root).relative_to(staged_dir).parts)
        if "ASCEND_PROFILER_OUTPUT" in dirs:
            rank_dirs.append(Path(root))
        if depth >= max_depth:
            dirs[:] = []
    facts.rank_count = len(rank_dirs)
    groups: list[int] = []
    dbs: dict[int, Path] = {}
    for rd in sorted(rank_dirs):
        for info_path in rd.glob("profiler_info*.json"):
            try:
                info = json.loads(info_path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                facts.notes.append(f"unreadable {info_path}")
                continue
            facts.levels.add(str(info.get("config", {}).get("experimental_config", {}).get("_profiler_level", "")))
            for key, bag in (("torch_npu_version", facts.torch_npu_versions), ("cann_version", facts.cann_versions)):
                if info.get(key):
                    bag.add(str(info[key]))
        try:
            meta = json.loads((rd / "profiler_metadata.json").read_text(encoding="utf-8"))
            groups += [len(g.get("global_ranks", [])) for g in meta.get("parallel_group_info", {}).values()]
        except (OSError, ValueError, AttributeError):
            pass
        for db in (rd / "ASCEND_PROFILER_OUTPUT").glob("ascend_pytorch_profiler*.db"):
            digits = db.stem.rsplit("_", 1)[-1]
            rank = int(digits) if digits.isdigit() else -1
            dbs[rank] = db
            if sqlite_truncated(db) or not _probe(db, "SELECT rankId FROM RANK_DEVICE_MAP"):
                facts.broken_db_ranks.append(rank)
    facts.db_ranks = sorted(dbs)
    facts.max_group_size = max(groups, default=len(dbs))
    healthy = [dbs[r] for r in facts.healthy_db_ranks]
    facts.has_communication = any(_probe(db, "SELECT 1 FROM COMMUNICATION_OP LIMIT 1") for db in healthy)
    facts.has_memcpy = any(_probe(db, "SELECT 1 FROM TASK WHERE taskType IN (SELECT id FROM STRING_IDS "
                                      "WHERE value='MEMCPY_ASYNC') LIMIT 1") for db in healthy)
    if healthy and facts.has_communication:
        facts.collectives_per_step = _collectives_per_step(healthy[0])
    if facts.broken_db_ranks:
        facts.notes.append(f"unusable rank DBs (truncated or unreadable): ranks {facts.broken_db_ranks}")
    return facts


def _collectives_per_step(db: Path) -> float | None:
    """COMMUNICATION_OP rows per STEP_TIME row of one rank DB (for the impact estimate), None when unknown."""
    try:
        con = sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True)
    except sqlite3.Error:
        return None
    try:
        ops = con.execute("SELECT COUNT(*) FROM COMMUNICATION_OP").fetchone()[0]
        steps = con.execute("SELECT COUNT(*) FROM STEP_TIME").fetchone()[0]
        return ops / steps if steps and ops else None
    except sqlite3.Error:
        return None
    finally:
        con.close()


_running: set[subprocess.Popen[bytes]] = set()
_running_lock = threading.Lock()
_cancel = threading.Event()
_POLL_S = 0.5


def cancel_running() -> None:
    """Stop every msprof-analyze run of this process now (daemon shutdown): kill their process groups; runs not yet
    started are refused. Their recipes end as ``timeout`` with the detail "cancelled"; the coordinator redoes the
    analysis after its restart (the capture is still ``analysing`` in its state store)."""
    _cancel.set()
    with _running_lock:
        procs = list(_running)
    for proc in procs:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def resume_runs() -> None:
    """Allow new runs again after :func:`cancel_running` (once the cancelled analyses have returned)."""
    _cancel.clear()


def _collect(proc: subprocess.Popen[bytes], timeout_s: float) -> tuple[bytes, bytes, bool]:
    """Wait for ``proc`` up to ``timeout_s`` (or until :func:`cancel_running`); kill its group when over.
    Returns ``(stdout, stderr, timed_out)``. Never hangs on a descendant that keeps the pipes open."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            out, err = proc.communicate(timeout=min(_POLL_S, max(0.01, deadline - time.monotonic())))
            return out, err, _cancel.is_set()  # killed by cancel_running(): not a result
        except subprocess.TimeoutExpired:
            if time.monotonic() < deadline and not _cancel.is_set():
                continue
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            out, err = proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:  # a detached descendant still holds the pipes: stop reading them
            for f in (proc.stdout, proc.stderr):
                if f is not None:
                    f.close()
            proc.wait(timeout=5)
            out, err = b"", b"(output abandoned: a descendant kept the pipes open after the kill)"
        return out or b"", err or b"", True


def _spawn_once(name: str, args: list[str], out_root: Path, settings: MsprofSettings) -> ToolRun:
    out_root.mkdir(parents=True, exist_ok=True)
    run_dir = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=out_root))
    log_path = out_root / "logs" / f"{run_dir.name}.log"
    log_path.parent.mkdir(exist_ok=True)
    argv = [settings.command, *args, "-o", str(run_dir)]
    env = dict(os.environ, LANG="C.UTF-8", LC_ALL="C.UTF-8", MSPROF_ANALYZE_LOG_FILE=str(log_path))
    run = ToolRun(name=name, argv=argv, output_dir=run_dir, log_path=log_path)
    t0 = time.monotonic()
    if _cancel.is_set():
        run.timed_out = True
        run.stderr_tail = "cancelled: the daemon is shutting down"
        return run
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                cwd=run_dir, env=env, start_new_session=True)
    except OSError as exc:
        log.warning("msprof_spawn_failed", recipe=name, error=str(exc))
        raise _SpawnFailed(str(exc)) from exc
    with _running_lock:
        _running.add(proc)
    try:
        out, err, run.timed_out = _collect(proc, settings.timeout_s)
    finally:
        with _running_lock:
            _running.discard(proc)
    if run.timed_out and _cancel.is_set():
        err = b"cancelled: the daemon is shutting down\n" + err
    run.duration_s = time.monotonic() - t0
    run.returncode = None if run.timed_out else proc.returncode
    run.stdout = out.decode("utf-8", "replace")
    run.stderr_tail = err.decode("utf-8", "replace")[-_LOG_TAIL_BYTES:]
    run.agent = parse_agent_stdout(run.stdout)
    return run


def run_tool(name: str, args: list[str], out_root: Path, settings: MsprofSettings,
             limiter: threading.BoundedSemaphore) -> ToolRun:
    """Run ``msprof-analyze *args -o <fresh dir under out_root>`` once (plus transient retries), bounded by
    ``limiter``. Raises _SpawnFailed (an OSError kind) when the command cannot be started after all attempts."""
    attempts = 0
    timeouts = 0

    def attempt() -> ToolRun:
        nonlocal attempts, timeouts
        attempts += 1
        with limiter:
            log.info("msprof_run_started", recipe=name, attempt=attempts)
            run = _spawn_once(name, args, out_root, settings)
        run.attempts = attempts
        if run.timed_out:
            timeouts += 1
            log.warning("msprof_run_timeout", recipe=name, timeout_s=settings.timeout_s, attempt=attempts)
            if timeouts == 1 and attempts <= settings.retries and not _cancel.is_set():
                raise _TimedOut(name)
        return run

    retrying = Retrying(stop=stop_after_attempt(settings.retries + 1), reraise=True,
                        wait=wait_exponential(multiplier=0.5, max=5),
                        retry=retry_if_exception_type((_SpawnFailed, _TimedOut)))
    run: ToolRun = retrying(attempt)
    log.info("msprof_run_finished", recipe=name, returncode=run.returncode, duration_s=round(run.duration_s, 2),
             timed_out=run.timed_out, agent_status=run.agent.status, tables=run.agent.tables)
    return run


def _status(run: ToolRun, status: str, detail: str, *, tables: list[str] | None = None, rows: int = 0,
            with_log: bool = False) -> RecipeStatus:
    return RecipeStatus(name=run.name, status=status, detail=detail, tables=tables or [], rows=rows,  # type: ignore[arg-type]
                        output_dir=str(run.output_dir), log_tail=run.log_tail() if with_log else "",
                        duration_s=round(run.duration_s, 3), returncode=run.returncode)


def _failed(run: ToolRun) -> RecipeStatus | None:
    """timeout / tool_error statuses common to every command, or None when the process ended normally."""
    if run.timed_out:
        return _status(run, "timeout", f"killed after {run.duration_s:.0f} s ({run.attempts} attempt(s))",
                       with_log=True)
    if run.returncode != 0 or (run.agent.found and run.agent.status == "error"):
        why = run.agent.error or f"exit code {run.returncode}"
        return _status(run, "tool_error", why, with_log=True)
    return None


def _result_tables(run: ToolRun, *tables: str) -> dict[str, list[dict[str, Any]] | None]:
    db = run.output_dir / _RESULT_DB
    return {t: read_table(db, t) for t in tables}


def _why_empty(run: ToolRun, facts: InputFacts) -> tuple[str, str]:
    """(status, detail) for a run that wrote no table, from the per-run log (section 2.4 messages)."""
    text = run.log_text()
    if "only supports DB" in text or not facts.db_ranks:
        return "no_data", "no DB export in the batch (text-only data; the recipe needs export_type db)"
    if "No valid transmit and wait time" in text or not facts.has_communication:
        return "not_applicable", "no communication data in the capture (Level0 or no collectives)"
    if "exception: 'rank'" in text:
        return "not_applicable", "no MEMCPY_ASYNC task or TASK/COMPUTE_TASK_INFO missing on every rank"
    if "Failed to allocate profiling data" in text:
        return "no_data", "msprof-analyze found no rank data under the staged dir"
    return "no_data", "msprof-analyze wrote no result table (see log_tail)"


def _cluster_time_summary(run: ToolRun, facts: InputFacts, world_size: int, ev: ClusterEvidence,
                          expected_ranks: list[int] | None = None) -> RecipeStatus:
    failed = _failed(run)
    if failed:
        return failed
    rows = _result_tables(run, "ClusterTimeSummary")["ClusterTimeSummary"]
    if not rows or "ClusterTimeSummary" not in run.agent.tables:
        status, detail = _why_empty(run, facts)
        return _status(run, status, detail, with_log=True)
    summaries = parse_cluster_time_summary(rows)
    steps = [s for s in common_steps(summaries) if s != -1]
    ranks = sorted({s.rank for s in summaries})
    ev.summaries = [s for s in summaries if s.step in steps]
    problems = []
    if any(s.step == -1 for s in summaries):
        problems.append(f"step -1 rows (no STEP_TIME) on ranks {sorted({s.rank for s in summaries if s.step == -1})}")
    expected = expected_ranks if expected_ranks is not None else list(range(world_size))
    if ranks != expected:
        problems.append(f"ranks {ranks} != expected {expected if expected_ranks is not None else f'0..{world_size - 1}'}")
    if len(summaries) != len(expected) * len(steps):
        problems.append(f"{len(summaries)} rows != {len(expected)} ranks x {len(steps)} common steps")
    if not steps:
        problems.append("no step common to all ranks")
    table = ["ClusterTimeSummary"]
    if problems:
        return _status(run, "no_data", "incomplete result: " + "; ".join(problems), tables=table,
                       rows=len(rows), with_log=True)
    return _status(run, "ok", f"{len(ranks)} ranks x {len(steps)} steps {steps}", tables=table, rows=len(rows))


def _slow_rank(run: ToolRun, facts: InputFacts, world_size: int, ev: ClusterEvidence) -> RecipeStatus:
    failed = _failed(run)
    if failed:
        return failed
    got = _result_tables(run, "SlowRank", "SlowOpStats")
    if got["SlowRank"] is not None and "SlowRank" in run.agent.tables:
        ev.slow_rank_votes = parse_slow_rank(got["SlowRank"])
        ev.slow_ops = parse_slow_op_stats(got["SlowOpStats"] or [])
        return _status(run, "ok", f"votes {ev.slow_rank_votes}", tables=["SlowRank", "SlowOpStats"],
                       rows=len(got["SlowRank"]))
    text = run.log_text()
    if "No slow rank found" in text:
        usable = len(facts.healthy_db_ranks)
        if usable >= world_size:
            return _status(run, "ok", "no slow rank found: no collective had an outlier (0 votes)")
        return _status(run, "no_data", f"no votes, but only {usable} of {world_size} rank DBs were usable "
                                       f"(unusable: {facts.broken_db_ranks})", with_log=True)
    status, detail = _why_empty(run, facts)
    return _status(run, status, detail, with_log=True)


def _communication_matrix(run: ToolRun, facts: InputFacts, ev: ClusterEvidence) -> RecipeStatus:
    """``ClusterCommunicationMatrix`` rows (global ranks; MB, ms, GB/s) into ``ev.link_rows``."""
    failed = _failed(run)
    if failed:
        return failed
    rows = _result_tables(run, "ClusterCommunicationMatrix")["ClusterCommunicationMatrix"]
    if not rows or "ClusterCommunicationMatrix" not in run.agent.tables:
        status, detail = _why_empty(run, facts)
        return _status(run, status, detail, with_log=True)
    ev.link_rows = rows
    pairs = {(r.get("src_rank"), r.get("dst_rank")) for r in rows}
    return _status(run, "ok", f"{len(pairs)} rank pairs", tables=["ClusterCommunicationMatrix"], rows=len(rows))


def _advisor(run: ToolRun, ev: ClusterEvidence) -> RecipeStatus:
    failed = _failed(run)
    if failed:
        return failed
    rank_map = _result_tables(run, "RankDeviceMap")["RankDeviceMap"]
    if rank_map:
        ev.rank_paths = parse_rank_device_map(rank_map)
    if not run.agent.message or not any(isinstance(v, dict) for v in run.agent.message.values()):
        return _status(run, "no_data", "advisor returned an empty message", with_log=True)
    ev.advisor = summarize_advisor(run.agent.message)
    return _status(run, "ok", f"{len(ev.advisor['problems'])} problems; sheets {ev.advisor['sheets']}",
                   tables=run.agent.tables, rows=len(ev.advisor["problems"]))


def _advisor_html(run: ToolRun, ev: ClusterEvidence) -> RecipeStatus:
    failed = _failed(run)
    if failed:
        return failed
    files = sorted(str(p) for p in run.output_dir.rglob("mstt_advisor_*") if p.suffix in (".html", ".xlsx"))
    if not files:
        return _status(run, "no_data", "advisor wrote no html/xlsx", with_log=True)
    ev.notes.append("advisor report: " + ", ".join(files))
    return _status(run, "ok", " ".join(files))


def _skipped(name: str, status: str, detail: str) -> RecipeStatus:
    log.info("msprof_recipe_skipped", recipe=name, status=status, detail=detail)
    return RecipeStatus(name=name, status=status, detail=detail)  # type: ignore[arg-type]


def _versions(facts: InputFacts) -> dict[str, str]:
    versions = {"torch_npu": ",".join(sorted(facts.torch_npu_versions)),
                "cann": ",".join(sorted(facts.cann_versions))}
    try:
        versions["msprof_analyze"] = importlib.metadata.version("msprof-analyze")
    except importlib.metadata.PackageNotFoundError:
        versions["msprof_analyze"] = "unknown"
    return {k: v for k, v in versions.items() if v}


def run_msprof_analysis(staged_dir: Path, out_dir: Path, *, settings: MsprofSettings, world_size: int,
                        limiter: threading.BoundedSemaphore | None = None,
                        expected_ranks: list[int] | None = None) -> ClusterEvidence:
    """Run cluster_time_summary, slow_rank and ``advisor all`` (each ``--agent --force`` into its own fresh
    ``-o`` under ``out_dir``) on one staged batch of ``world_size`` ranks; return the evidence (µs).

    Statuses (``evidence.recipes[name]``): ``ok`` only when the agent JSON lists the table and
    ``cluster_analysis.db`` holds it with the expected rows (ClusterTimeSummary: world_size x common steps,
    no step -1). slow_rank with **no votes** is ``ok`` with empty ``slow_rank_votes`` when the tool logged
    "No slow rank found" and every rank DB was usable: Dixon's test ran on every collective and found no
    outlier, which is a result, not missing data. Recipes the inputs cannot answer are not run:
    ``not_applicable`` (no communication data, e.g. Level0; slow_rank with every group under 4 ranks;
    cluster_time_summary without any MEMCPY_ASYNC task) or ``no_data`` (no DB export). Otherwise
    ``no_data`` / ``tool_error`` (+ log tail) / ``timeout``. ``limiter`` bounds concurrent commands across
    callers (default: a new one from settings). ``expected_ranks``: the ranks staged when they are not
    ``0..world_size-1`` (a subset). Raises nothing for tool failures; OSError if ``out_dir`` cannot be created.
    """
    staged_dir, out_dir = Path(staged_dir), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    limiter = limiter or make_limiter(settings)
    facts = inspect_inputs(staged_dir)
    ev = ClusterEvidence(kind="ascend_pt", versions=_versions(facts), collectives_per_step=facts.collectives_per_step)
    ev.notes += facts.notes
    n_expected = len(expected_ranks) if expected_ranks is not None else world_size
    if facts.rank_count != n_expected:
        ev.notes.append(f"staged dir holds {facts.rank_count} rank dirs, expected {n_expected}")
    base = ["-d", str(staged_dir), "--agent", "--force"]
    jobs: dict[str, list[str]] = {}
    if not facts.db_ranks:
        for name in ("cluster_time_summary", "slow_rank"):
            ev.recipes[name] = _skipped(name, "no_data", "no DB export in the batch (export_type text only); "
                                                         "cluster_time_summary and slow_rank need db")
    elif not facts.has_communication:
        for name in ("cluster_time_summary", "slow_rank"):
            ev.recipes[name] = _skipped(name, "not_applicable", "no communication data in the capture "
                                        f"(profiler levels {sorted(facts.levels)}; arm Level1 for it)")
    else:
        if facts.has_memcpy:
            jobs["cluster_time_summary"] = ["-m", "cluster_time_summary", *base]
        else:
            ev.recipes["cluster_time_summary"] = _skipped(
                "cluster_time_summary", "not_applicable", "no MEMCPY_ASYNC task on any rank: the recipe cannot run")
        if settings.communication_matrix:
            jobs["communication_matrix"] = ["-m", "communication_matrix_sum", *base]
        if facts.max_group_size >= 4:
            jobs["slow_rank"] = ["-m", "slow_rank", *base]
        else:
            ev.recipes["slow_rank"] = _skipped("slow_rank", "not_applicable",
                                               f"largest collective group has {facts.max_group_size} ranks; "
                                               "slow_rank votes only in groups of 4 or more")
    if settings.advisor:
        jobs["advisor"] = ["advisor", "all", *base, "-l", settings.language]
        if settings.advisor_html:
            jobs["advisor_html"] = ["advisor", "all", "-d", str(staged_dir), "--force", "-l", settings.language]
    else:
        ev.recipes["advisor"] = _skipped("advisor", "skipped", "advisor disabled in settings")
    runs: dict[str, ToolRun | Exception] = {}
    with ThreadPoolExecutor(max_workers=max(1, min(len(jobs), settings.max_concurrent_runs)),
                            thread_name_prefix="msprof") as pool:
        futures = {name: pool.submit(run_tool, name, args, out_dir, settings, limiter) for name, args in jobs.items()}
        for name, fut in futures.items():
            try:
                runs[name] = fut.result()
            except _SpawnFailed as exc:
                runs[name] = exc
    for name, run in runs.items():
        if isinstance(run, Exception):
            ev.recipes[name] = RecipeStatus(name=name, status="tool_error", detail=f"cannot start: {run}")
        elif name == "cluster_time_summary":
            ev.recipes[name] = _cluster_time_summary(run, facts, world_size, ev, expected_ranks)
        elif name == "slow_rank":
            ev.recipes[name] = _slow_rank(run, facts, n_expected, ev)
        elif name == "communication_matrix":
            ev.recipes[name] = _communication_matrix(run, facts, ev)
        elif name == "advisor":
            ev.recipes[name] = _advisor(run, ev)
        else:
            ev.recipes[name] = _advisor_html(run, ev)
    log.info("msprof_analysis_finished", world_size=world_size,
             statuses={k: v.status for k, v in ev.recipes.items()}, votes=ev.slow_rank_votes)
    return ev
