"""Which msprof-analyze recipes to run on a staged batch, and what a finished run means (pure).

The adapter ``daemon/profwatch/adapters/tools/msprof_runner.py`` inspects the batch (``msprof_db.inspect_inputs`` ->
:class:`InputFacts`), asks :func:`plan_recipes` which commands to run, runs them, reads each run's result tables
and log into a :class:`RunOutcome`, and asks :func:`interpret_run` for the recipe's :class:`RecipeStatus`. No
I/O here: every fact about files arrives as data. The tool behaviour these rules rely on (exit code 0 for most
failures, the ``--agent`` JSON line, result tables and their columns, the log lines quoted below) is written
down in ``docs/msprof-analyze.md``; the upstream source is the msprof-analyze package of Ascend/mstt
(https://gitcode.com/Ascend/mstt, ``profiler/msprof_analyze``), version 26.2.0.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from statistics import median
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from profwatch.core.verdict.evidence import ClusterEvidence, RecipePhase, RecipeState, RecipeStatus
from profwatch.core.verdict.link_rows import LinkRows
from profwatch.core.verdict.matrix_chunks import MatrixChunkPlan, plan_matrix_chunks, rank_list_arg
from profwatch.core.verdict.msprof_results import (
    AgentMessage,
    common_steps,
    parse_cluster_time_summary,
    parse_rank_device_map,
    parse_slow_op_stats,
    parse_slow_rank,
    summarize_advisor,
)

#: Where every msprof-analyze 26.2.0 cluster command writes its tables, relative to its ``-o`` folder.
RESULT_DB = "cluster_analysis_output/cluster_analysis.db"
#: Result tables read after each recipe (table name -> rows, or None when missing); advisor reads RankDeviceMap
#: from the cluster pass it runs first.
RESULT_TABLES: dict[str, tuple[str, ...]] = {
    "cluster_time_summary": ("ClusterTimeSummary",),
    "slow_rank": ("SlowRank", "SlowOpStats"),
    "communication_matrix": ("ClusterCommunicationMatrix",),
    "advisor": ("RankDeviceMap",),
    "advisor_html": (),
}
#: Result tables read straight into columns (``link_rows.LinkRows``) instead of one dict per row: one row per
#: directed rank pair, about a million per step at 1024 ranks.
COLUMNAR_TABLES: frozenset[str] = frozenset({"ClusterCommunicationMatrix"})
#: slow_rank votes only inside communication groups of at least this many ranks (Dixon's Q test needs 4 values).
SLOW_RANK_MIN_GROUP = 4


class MsprofSettings(BaseModel):
    """How msprof-analyze is run.

    ``command``: the executable; a bare name (the default ``msprof-analyze``) is looked up by the runner next to
    the Python interpreter first (same venv), then on PATH. ``timeout_s`` per command; ``retries``: extra attempts
    for transient failures (spawn OSError; a timeout is retried once at most). ``language``: advisor's ``-l``.

    Phases (docs/msprof-analyze.md#phases): the verdict waits only for ``cluster_time_summary`` and
    ``slow_rank`` (the *alert* phase); ``communication_matrix`` and ``advisor`` run after it is published (the
    *enrich* phase, ``analysis_enriched``). ``max_concurrent_runs`` bounds alert-phase commands running at once per
    runner (each command forks one worker per CPU); 0 = from the CPU count (:func:`concurrent_runs`). Enrich-phase
    commands run one at a time, ``enrich_nice`` lower in CPU priority. ``advisor_html`` adds a plain advisor run
    for the html/xlsx (off by default: produced on request, e.g. ``profwatch analyze --advisor-html``).

    Bounds: ``memory_limit_bytes`` caps the resident memory of one command's whole process group (None = 40 %
    of the host's memory: :func:`memory_cap_bytes`); a command over it is killed, recipe status ``oom``.
    ``memory_limit``: ``auto`` (watchdog, plus a systemd scope where one can be started), ``watchdog``, ``scope``
    (asked for; falls back to the watchdog with a warning), ``off``. Size rule: a batch of more than
    ``advisor_max_ranks`` ranks runs the advisor on the suspects and ``advisor_reference_ranks`` reference ranks
    only (``advisor_above_max = "subset"``) or not at all (``"skip"``), the reason in its recipe status.
    ``communication_matrix`` on a batch of more than ``matrix_max_ranks`` ranks or ``matrix_max_input_bytes``
    bytes of ``analysis.db`` runs in chunks, one ``--rank_list`` run per chunk (by communication group when the
    groups are known), merged into one table (``core/verdict/matrix_chunks.py``, docs/msprof-analyze.md#matrix-chunks).
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    def without_advisor(self, why: str) -> None:
        """Turn the advisor off; ``why`` (e.g. "turned off by --no-advisor") is its ``skipped`` status's reason."""
        self.advisor = False
        self._advisor_off = why

    @property
    def advisor_off_reason(self) -> str:
        """Why the advisor is off: what :meth:`without_advisor` was told, else the setting."""
        return self._advisor_off

    command: str = Field(default="msprof-analyze", min_length=1, description=(
        "the msprof-analyze executable; a bare name is looked up next to the Python interpreter first, then on PATH"))
    timeout_s: float = Field(default=900.0, gt=0, description="longest one msprof-analyze command may run")
    max_concurrent_runs: int = Field(default=0, ge=0, le=64, description=(
        "alert-phase commands running at once per runner (each forks one worker per CPU); 0 = from the CPU count"))
    advisor: bool = Field(True, description="run the advisor in the enrich phase")
    _advisor_off: str = PrivateAttr(default="disabled in settings ([analysis.msprof] advisor = false)")
    advisor_html: bool = Field(False, description="add a plain advisor run that keeps its HTML/XLSX for people")
    communication_matrix: bool = Field(True, description=(
        "Run ``-m communication_matrix_sum`` (per-pair link bandwidth, for slow-link verdicts; a few seconds)."))
    retries: int = Field(default=1, ge=0, le=5, description=(
        "extra attempts for transient failures (spawn errors; a timeout is retried once at most)"))
    language: str = Field(default="en", pattern="^(en|cn)$", description="advisor language (-l): en or cn")
    memory_limit_bytes: int | None = Field(default=None, ge=64 * 2**20, le=2**50, description=(
        "resident memory cap of one command's process group; over it the command is killed (status oom); unset: 40 % "
        "of the host's memory"))
    memory_limit: Literal["auto", "watchdog", "scope", "off"] = Field("auto", description=(
        "how the cap is enforced: auto (watchdog plus a systemd scope where possible), watchdog, scope, off"))
    memory_poll_interval_s: float = Field(default=0.5, gt=0, le=10, description=(
        "how often the memory watchdog reads the process group's resident memory"))
    enrich_nice: int = Field(default=10, ge=0, le=19, description=(
        "CPU niceness added to enrich-phase commands (advisor, communication matrix)"))
    advisor_max_ranks: int = Field(default=256, ge=2, description=(
        "batches of more ranks run the advisor on a subset or not at all (advisor_above_max)"))
    advisor_above_max: Literal["subset", "skip"] = Field("subset", description=(
        "above advisor_max_ranks: subset (the suspects and advisor_reference_ranks references) or skip"))
    advisor_reference_ranks: int = Field(default=4, ge=1, le=64, description=(
        "reference ranks in the advisor's subset beside the suspects"))
    matrix_max_ranks: int = Field(default=256, ge=1, description=(
        "Most ranks one ``communication_matrix_sum`` run reads; a larger batch runs in chunks."))
    matrix_max_input_bytes: int = Field(default=2**30, ge=1, description=(
        "Most bytes of ``analysis.db`` one ``communication_matrix_sum`` run reads (the size estimate of its matrix "
        "rows; on generated trees the tool's resident memory grew about 7x the bytes it read)."))
    matrix_oom_splits: int = Field(default=2, ge=0, le=8, description=(
        "Rounds of cutting in two the communication_matrix runs (the whole batch, or chunks) killed at the memory "
        "cap, and running the halves (``matrix_chunks.split_after_oom``); 0 = an ``oom`` status as for any recipe."))


#: Recipes the verdict waits for; every other command runs in the enrich phase.
ALERT_RECIPES = ("cluster_time_summary", "slow_rank")
#: Share of the host's physical memory one command may hold when ``memory_limit_bytes`` is not set.
DEFAULT_MEMORY_SHARE = 0.4


def concurrent_runs(settings: MsprofSettings, cpus: int) -> int:
    """Alert-phase commands to run at once: ``max_concurrent_runs``, else (0) every alert recipe at once when
    there are two CPUs or more, one at a time on a single CPU. Each command forks one worker per CPU, but most
    of a run is single-threaded start-up and I/O: on two CPUs the pair together took 1.07-1.7x the slower one
    alone, one after the other 1.8-2.4x (``bench/bench_alert_latency.py --concurrency 1|2``, 16-256 ranks)."""
    if settings.max_concurrent_runs:
        return settings.max_concurrent_runs
    return len(ALERT_RECIPES) if cpus >= 2 else 1


def memory_cap_bytes(settings: MsprofSettings, host_bytes: int | None) -> int | None:
    """The resident-memory cap of one command's process group, bytes: ``memory_limit_bytes``, else
    :data:`DEFAULT_MEMORY_SHARE` of ``host_bytes`` (None when that is unknown too, or ``memory_limit == "off"``)."""
    if settings.memory_limit == "off":
        return None
    if settings.memory_limit_bytes is not None:
        return settings.memory_limit_bytes
    return int(host_bytes * DEFAULT_MEMORY_SHARE) if host_bytes else None


@dataclass(slots=True)
class InputFacts:
    """What a staged batch can answer, read before running anything (docs/msprof-analyze.md, "Before running").

    ``db_ranks``: ranks with an ``ascend_pytorch_profiler*.db``; ``broken_db_ranks``: those whose DB is truncated
    or has no readable ``RANK_DEVICE_MAP``; ``max_group_size``: ranks in the largest communication group
    (``profiler_metadata.json`` ``parallel_group_info``, else the number of DBs); ``levels``: profiler levels.
    ``groups``: the distinct communication groups as sorted global rank tuples (``parallel_group_info``
    ``global_ranks``; empty when no rank dir has it); ``analysis_bytes``: rank -> bytes of its ``analysis.db``.
    """

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
    groups: list[tuple[int, ...]] = field(default_factory=list)
    analysis_bytes: dict[int, int] = field(default_factory=dict)

    @property
    def healthy_db_ranks(self) -> list[int]:
        return [r for r in self.db_ranks if r not in self.broken_db_ranks]


@dataclass(frozen=True, slots=True)
class RecipeCommand:
    """One msprof-analyze command to run: ``msprof-analyze *args -o <fresh dir>`` (the runner adds ``-o``), in
    the ``alert`` phase (the verdict waits for it) or the ``enrich`` phase (after the verdict is published).
    ``ranks``: the chunk it reads (``--rank_list``) when the recipe runs in chunks (their results merged), else
    None (the whole batch)."""

    name: str
    args: tuple[str, ...]
    phase: RecipePhase = "alert"
    ranks: tuple[int, ...] | None = None


@dataclass(slots=True)
class RecipePlan:
    """:func:`plan_recipes` output: commands to run, in order, and recipes decided without running;
    ``matrix_chunks``: the chunk plan when communication_matrix runs in chunks (one command per chunk)."""

    commands: list[RecipeCommand] = field(default_factory=list)
    skipped: dict[str, RecipeStatus] = field(default_factory=dict)
    matrix_chunks: MatrixChunkPlan | None = None

    def phase(self, phase: RecipePhase) -> list[RecipeCommand]:
        """The commands of one phase, in order."""
        return [c for c in self.commands if c.phase == phase]

    def recipe_names(self, phase: RecipePhase) -> list[str]:
        """The recipes of one phase, in order, each once (a chunked recipe has several commands)."""
        return list(dict.fromkeys(c.name for c in self.phase(phase)))


def plan_recipes(facts: InputFacts, settings: MsprofSettings, staged_dir: str) -> RecipePlan:
    """Choose the recipes for one staged batch (``staged_dir`` must be an absolute path: the tool runs elsewhere).

    Rules (docs/msprof-analyze.md, "Recipes"): without any DB export, cluster_time_summary and slow_rank are
    ``no_data`` (text-only exports); without communication data (Level0, no collectives) both are
    ``not_applicable``; cluster_time_summary needs a MEMCPY_ASYNC task on some rank (the tool raises otherwise);
    slow_rank needs a group of at least 4 ranks. communication_matrix above ``matrix_max_ranks`` ranks or
    ``matrix_max_input_bytes`` of ``analysis.db`` is one ``--rank_list`` command per chunk of
    ``matrix_chunks.plan_matrix_chunks`` (``plan.matrix_chunks``). Every command gets ``--agent --force`` (JSON line on stdout; no
    interactive ownership prompt). ``advisor all`` runs when ``settings.advisor``, plus a plain run for the html
    when ``settings.advisor_html``. Phases: cluster_time_summary and slow_rank (:data:`ALERT_RECIPES`) are
    ``alert``, the others ``enrich``; the advisor's size rule is :func:`advisor_ranks`, applied once the verdict
    names the suspects. Raises ValueError for a relative ``staged_dir``.
    """
    if not posixpath.isabs(staged_dir):
        raise ValueError(f"staged_dir must be absolute (the tool runs from its own folder): {staged_dir!r}")
    plan = RecipePlan()
    enrich = enrich_recipe_names(settings)
    base = ("-d", staged_dir, "--agent", "--force")
    if not facts.db_ranks:
        for name in ("cluster_time_summary", "slow_rank"):
            plan.skipped[name] = RecipeStatus(name, "no_data", "no DB export in the batch (export_type text only); "
                                                               "cluster_time_summary and slow_rank need db")
    elif not facts.has_communication:
        for name in ("cluster_time_summary", "slow_rank"):
            plan.skipped[name] = RecipeStatus(name, "not_applicable", "no communication data in the capture "
                                              f"(profiler levels {sorted(facts.levels)}; arm Level1 for it)")
    else:
        if facts.has_memcpy:
            plan.commands.append(RecipeCommand("cluster_time_summary", ("-m", "cluster_time_summary", *base)))
        else:
            plan.skipped["cluster_time_summary"] = RecipeStatus(
                "cluster_time_summary", "not_applicable", "no MEMCPY_ASYNC task on any rank: the recipe cannot run")
        if "communication_matrix" in enrich:
            plan.matrix_chunks = plan_matrix_chunks(facts.db_ranks, facts.groups, facts.analysis_bytes,
                                                    max_ranks=settings.matrix_max_ranks,
                                                    max_bytes=settings.matrix_max_input_bytes)
            if plan.matrix_chunks is None:
                plan.commands.append(RecipeCommand("communication_matrix", ("-m", "communication_matrix_sum", *base),
                                                   "enrich"))
            else:
                plan.commands += matrix_chunk_commands(staged_dir, plan.matrix_chunks.chunks)
        if facts.max_group_size >= SLOW_RANK_MIN_GROUP:
            plan.commands.append(RecipeCommand("slow_rank", ("-m", "slow_rank", *base)))
        else:
            plan.skipped["slow_rank"] = RecipeStatus(
                "slow_rank", "not_applicable", f"largest collective group has {facts.max_group_size} ranks; "
                f"slow_rank votes only in groups of {SLOW_RANK_MIN_GROUP} or more")
    if "advisor" in enrich:
        plan.commands.append(RecipeCommand("advisor", ("advisor", "all", *base, "-l", settings.language), "enrich"))
        if "advisor_html" in enrich:
            plan.commands.append(RecipeCommand(
                "advisor_html", ("advisor", "all", "-d", staged_dir, "--force", "-l", settings.language), "enrich"))
    else:
        plan.skipped["advisor"] = RecipeStatus("advisor", "skipped", settings.advisor_off_reason)
    return plan


def matrix_chunk_commands(staged_dir: str, chunks: Sequence[Sequence[int]]) -> list[RecipeCommand]:
    """One enrich-phase ``communication_matrix_sum`` command per chunk, each with ``--rank_list`` (its ranks)."""
    return [RecipeCommand("communication_matrix", ("-m", "communication_matrix_sum", "-d", staged_dir, "--agent",
                                                   "--force", "--rank_list", rank_list_arg(c)), "enrich", tuple(c))
            for c in chunks]


def enrich_recipe_names(settings: MsprofSettings) -> list[str]:
    """The enrich-phase recipes the settings ask for, in plan order (``communication_matrix``, ``advisor``,
    ``advisor_html``): what :func:`plan_recipes` plans for a batch with DB and communication data, and what a
    first alert announces before the batch has been inspected."""
    names = ["communication_matrix"] if settings.communication_matrix else []
    if settings.advisor:
        names.append("advisor")
        if settings.advisor_html:
            names.append("advisor_html")
    return names


def advisor_ranks(ranks: Sequence[int], suspects: Sequence[int], step_time_us: Mapping[int, float],
                  hosts: Mapping[int, str], settings: MsprofSettings) -> tuple[list[int] | None, str]:
    """The advisor's size rule: ``(None, "")`` to run it on the whole batch (at most ``advisor_max_ranks``
    ranks); ``([], why)`` to skip it (``advisor_above_max = "skip"``); else ``(subset, why)``: the suspects
    (best first, as many as fit), for each suspect one peer of its node, and ``advisor_reference_ranks`` ranks
    whose step time is closest to the batch median (the fast ranks the advisor compares the slow ones with); with
    no suspect, the slowest and the fastest rank join the references. At least two ranks (the advisor's cluster
    mode needs two rank dirs).

    Why: the advisor's memory grows about as N^1.8 with the ranks it reads (3.5 GiB at 256 ranks, above 10 GiB
    at 512; ``docs/msprof-analyze.md``), while what it adds, the slow-vs-fast kernel comparison and per-rank deep dives, is about
    the suspects. ``step_time_us``: a rank's median step time (ranks without one rank last as references).
    """
    ranks = sorted(set(ranks))
    n, cap = len(ranks), settings.advisor_max_ranks
    if n <= cap:
        return None, ""
    if settings.advisor_above_max == "skip":
        return [], (f"skipped by the size rule: {n} ranks > advisor_max_ranks {cap} (advisor_above_max = skip); "
                    "the verdict rests on cluster_time_summary and slow_rank")
    present = set(ranks)
    chosen: list[int] = []
    room = max(2, cap - settings.advisor_reference_ranks)
    for r in suspects:
        if r in present and r not in chosen and len(chosen) < room:
            chosen.append(r)
    timed = [r for r in ranks if r in step_time_us]
    mid = median(step_time_us[r] for r in timed) if timed else 0.0
    by_mid = sorted(ranks, key=lambda r: (r not in step_time_us, abs(step_time_us.get(r, 0.0) - mid), r))
    for s in list(chosen):
        peer = next((r for r in by_mid if r not in chosen and hosts.get(r) and hosts.get(r) == hosts.get(s)), None)
        if peer is not None and len(chosen) < cap:
            chosen.append(peer)
    refs = [r for r in by_mid if r not in chosen][: settings.advisor_reference_ranks]
    if not suspects and timed:
        refs += [r for r in (max(timed, key=lambda r: step_time_us[r]), min(timed, key=lambda r: step_time_us[r]))
                 if r not in chosen and r not in refs]
    chosen += refs[: max(0, cap - len(chosen))]
    for r in by_mid:
        if len(set(chosen)) >= 2:
            break
        chosen.append(r)
    chosen = sorted(set(chosen))
    named = [r for r in suspects if r in chosen]
    return chosen, (f"size rule: {n} ranks > advisor_max_ranks {cap}: advisor ran on {len(chosen)} ranks "
                    f"(suspects {named}, same-node peers and ranks nearest the median step) {chosen[:16]}"
                    + (" ..." if len(chosen) > 16 else ""))


def with_input(cmd: RecipeCommand, staged_dir: str) -> RecipeCommand:
    """``cmd`` reading ``staged_dir`` (absolute) instead of its ``-d`` folder (the advisor's subset staging)."""
    if not posixpath.isabs(staged_dir):
        raise ValueError(f"staged_dir must be absolute: {staged_dir!r}")
    args = list(cmd.args)
    if "-d" in args:
        args[args.index("-d") + 1] = staged_dir
    return RecipeCommand(cmd.name, tuple(args), cmd.phase, cmd.ranks)


def input_notes(facts: InputFacts, world_size: int) -> list[str]:
    """Notes about the inputs worth showing with any result (unreadable files, unusable DBs, rank count)."""
    notes = list(facts.notes)
    if facts.broken_db_ranks:
        notes.append(f"unusable rank DBs (truncated or unreadable): ranks {facts.broken_db_ranks}")
    if facts.rank_count != world_size:
        notes.append(f"staged dir holds {facts.rank_count} rank dirs, expected {world_size}")
    return notes


@dataclass(slots=True)
class RunOutcome:
    """What one finished msprof-analyze command left behind, as data.

    ``returncode`` None when killed; ``timed_out`` only for the timeout (a cancelled run is ``cancelled``); ``spawn_error`` set when the
    command could not be started at all (the other fields are then empty). ``tables``: each table of
    :data:`RESULT_TABLES` for this recipe -> rows (dicts by column name; :class:`LinkRows` for
    :data:`COLUMNAR_TABLES`) or None when absent/unreadable.
    ``files``: advisor html/xlsx files found under ``output_dir``. ``log_text``: the per-run log (bounded);
    ``stderr_tail``: the last ~4 KB of stderr (the tool's traceback when it dies: its log file does not get it).
    ``oom``: killed at the memory cap (``oom_detail`` says how much); ``peak_rss_bytes``: the watchdog's peak.
    """

    name: str
    output_dir: str = ""
    returncode: int | None = None
    timed_out: bool = False
    cancelled: bool = False
    cancel_reason: str = ""
    attempts: int = 1
    duration_s: float = 0.0
    agent: AgentMessage = field(default_factory=lambda: AgentMessage(found=False))
    log_text: str = ""
    log_tail: str = ""
    stderr_tail: str = ""
    tables: dict[str, Sequence[Mapping[str, Any]] | None] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)
    spawn_error: str | None = None
    phase: RecipePhase = "alert"
    oom: bool = False
    oom_detail: str = ""
    peak_rss_bytes: int | None = None


def _status(run: RunOutcome, status: RecipeState, detail: str, *, tables: list[str] | None = None, rows: int = 0,
            with_log: bool = False) -> RecipeStatus:
    return RecipeStatus(name=run.name, status=status, detail=detail, tables=tables or [], rows=rows,
                        output_dir=run.output_dir or None, log_tail=run.log_tail if with_log else "",
                        duration_s=round(run.duration_s, 3), returncode=run.returncode, phase=run.phase,
                        peak_rss_bytes=run.peak_rss_bytes)


_DISK_SIGNS = (
    ("No space left on device", "no space left"), ("[Errno 28]", "no space left"),
    ("database or disk is full", "no space left"), ("Disk quota exceeded", "disk quota exceeded"),
    ("[Errno 122]", "disk quota exceeded"), ("disk I/O error", "disk I/O error"),
    ("Read-only file system", "read-only file system"), ("[Errno 30]", "read-only file system"),
)
"""Log fragments of a write that failed for lack of room (or a read-only disk) -> the cause named. msprof-analyze
26.2.0 catches these inside a recipe, logs "Execute <Recipe> with exception: database or disk is full" (SQLite's
SQLITE_FULL) or "disk I/O error" (SQLITE_IOERR, what a full disk gives during a journal write) and exits 0; when
its log file sits on the full disk too, Python's logging says "OSError: [Errno 28] No space left on device" on
stderr instead (observed on a full tmpfs)."""


def disk_error(log_text: str) -> str | None:
    """``"no space left: <the log line>"`` (or quota, I/O, read-only) when the tool's log says a write failed
    for lack of room; None otherwise. The first matching line is quoted (at most 200 characters)."""
    for line in log_text.splitlines():
        for sign, cause in _DISK_SIGNS:
            if sign in line:
                return f"{cause}: {line.strip()[:200]}"
    return None


def _failed(run: RunOutcome) -> RecipeStatus | None:
    """Statuses common to every command (cannot start, memory cap, cancelled, timeout, a full disk named from the
    tool's log, tool error), or None."""
    if run.spawn_error is not None:
        missing = "No such file or directory" in run.spawn_error
        hint = ("; msprof-analyze is not installed where the daemon runs: install it with "
                "`pip install 'profwatch[coordinator]'` (or set analysis.msprof.command)") if missing else ""
        return RecipeStatus(name=run.name, status="tool_error", detail=f"cannot start: {run.spawn_error}{hint}",
                            phase=run.phase)
    if run.oom:
        return _status(run, "oom", f"killed after {run.duration_s:.0f} s: {run.oom_detail or 'memory cap'}",
                       with_log=True)
    if run.cancelled:
        return _status(run, "cancelled", f"cancelled after {run.duration_s:.0f} s: {run.cancel_reason or 'on request'}",
                       with_log=True)
    if run.timed_out:
        return _status(run, "timeout", f"killed after {run.duration_s:.0f} s ({run.attempts} attempt(s))",
                       with_log=True)
    disk = disk_error(run.log_text + "\n" + run.log_tail)  # on a full disk the log file stays empty: stderr
    if disk is not None:  # the tool exits 0 and every recipe looks empty: name the cause, as for a kill
        return _status(run, "tool_error", f"{disk} (free space under {run.output_dir or 'the output folder'})",
                       with_log=True)
    if run.returncode != 0 or (run.agent.found and run.agent.status == "error"):
        return _status(run, "tool_error", run.agent.error or exit_reason(run.returncode, run.stderr_tail),
                       with_log=True)
    return None


_REASON_MAX_CHARS = 300


def exit_reason(returncode: int | None, stderr_tail: str) -> str:
    """``"exit code N: <why>"`` for a run that failed without saying so on stdout: ``<why>`` is the last line of
    its stderr that is not a traceback frame (a Python exception's type and message, e.g. ``UnicodeEncodeError:
    'utf-8' codec can't encode character '\\udcff' ...``), at most 300 characters; just ``"exit code N"`` when
    stderr says nothing."""
    lines = [ln.strip() for ln in stderr_tail.splitlines() if ln.strip()]
    why = next((ln for ln in reversed(lines) if not ln.startswith(("File ", "Traceback", "^", "~"))), "")
    if len(why) > _REASON_MAX_CHARS:
        why = why[:_REASON_MAX_CHARS - 3] + "..."
    return f"exit code {returncode}: {why}" if why else f"exit code {returncode}"


def why_empty(log_text: str, facts: InputFacts) -> tuple[RecipeState, str]:
    """(status, detail) for a run that wrote no table, from the messages msprof-analyze 26.2.0 logs."""
    if "only supports DB" in log_text or not facts.db_ranks:
        return "no_data", "no DB export in the batch (text-only data; the recipe needs export_type db)"
    if "No valid transmit and wait time" in log_text or not facts.has_communication:
        return "not_applicable", "no communication data in the capture (Level0 or no collectives)"
    if "exception: 'rank'" in log_text:
        return "not_applicable", "no MEMCPY_ASYNC task or TASK/COMPUTE_TASK_INFO missing on every rank"
    if "Failed to allocate profiling data" in log_text:
        return "no_data", "msprof-analyze found no rank data under the staged dir"
    return "no_data", "msprof-analyze wrote no result table (see log_tail)"


def _cluster_time_summary(run: RunOutcome, facts: InputFacts, world_size: int, ev: ClusterEvidence,
                          expected_ranks: list[int] | None = None) -> RecipeStatus:
    rows = run.tables.get("ClusterTimeSummary")
    if not rows or "ClusterTimeSummary" not in run.agent.tables:
        status, detail = why_empty(run.log_text, facts)
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


def _slow_rank(run: RunOutcome, facts: InputFacts, world_size: int, ev: ClusterEvidence) -> RecipeStatus:
    slow = run.tables.get("SlowRank")
    if slow is not None and "SlowRank" in run.agent.tables:
        ev.slow_rank_votes = parse_slow_rank(slow)
        ev.slow_ops = parse_slow_op_stats(run.tables.get("SlowOpStats") or [])
        return _status(run, "ok", f"votes {ev.slow_rank_votes}", tables=["SlowRank", "SlowOpStats"], rows=len(slow))
    if "No slow rank found" in run.log_text:
        usable = len(facts.healthy_db_ranks)
        if usable >= world_size:
            return _status(run, "ok", "no slow rank found: no collective had an outlier (0 votes)")
        return _status(run, "no_data", f"no votes, but only {usable} of {world_size} rank DBs were usable "
                                       f"(unusable: {facts.broken_db_ranks})", with_log=True)
    status, detail = why_empty(run.log_text, facts)
    return _status(run, status, detail, with_log=True)


def _communication_matrix(run: RunOutcome, facts: InputFacts, ev: ClusterEvidence) -> RecipeStatus:
    """``ClusterCommunicationMatrix`` rows (global ranks; MB, ms, GB/s) into ``ev.link_rows``."""
    rows = run.tables.get("ClusterCommunicationMatrix")
    if not rows or "ClusterCommunicationMatrix" not in run.agent.tables:
        status, detail = why_empty(run.log_text, facts)
        return _status(run, status, detail, with_log=True)
    ev.link_rows = LinkRows.from_rows(rows)
    return _status(run, "ok", f"{ev.link_rows.pair_count()} rank pairs", tables=["ClusterCommunicationMatrix"],
                   rows=len(rows))


def _advisor(run: RunOutcome, ev: ClusterEvidence) -> RecipeStatus:
    rank_map = run.tables.get("RankDeviceMap")
    if rank_map:
        ev.rank_paths = parse_rank_device_map(rank_map)
    if not run.agent.message or not any(isinstance(v, dict) for v in run.agent.message.values()):
        return _status(run, "no_data", "advisor returned an empty message", with_log=True)
    ev.advisor = summarize_advisor(run.agent.message)
    return _status(run, "ok", f"{len(ev.advisor['problems'])} problems; sheets {ev.advisor['sheets']}",
                   tables=run.agent.tables, rows=len(ev.advisor["problems"]))


def _advisor_html(run: RunOutcome, ev: ClusterEvidence) -> RecipeStatus:
    if not run.files:
        return _status(run, "no_data", "advisor wrote no html/xlsx", with_log=True)
    ev.notes.append("advisor report: " + ", ".join(run.files))
    return _status(run, "ok", " ".join(run.files))


def interpret_run(run: RunOutcome, facts: InputFacts, world_size: int, ev: ClusterEvidence,
                  expected_ranks: list[int] | None = None) -> RecipeStatus:
    """The :class:`RecipeStatus` of one finished command; fills the matching fields of ``ev`` (µs).

    ``oom`` when the run was killed at its memory cap (whatever it left). ``ok`` only when the ``--agent`` JSON
    lists the result table *and* the table holds the expected rows
    (ClusterTimeSummary: ``world_size`` x common steps, no step -1): msprof-analyze exits 0 for most failures.
    slow_rank with **no votes** is ``ok`` when the tool logged "No slow rank found" and every rank DB was
    usable (the outlier test ran and found nothing: a result, not missing data). Otherwise ``no_data`` /
    ``not_applicable`` (from the log, :func:`why_empty`), ``tool_error`` (non-zero exit, agent status
    ``error``, cannot start) or ``timeout`` (also for cancelled runs). Raises ResultParseError when a result
    table lacks a key column. Unknown recipe names raise KeyError. ``expected_ranks``: the ranks staged when they
    are not ``0..world_size-1`` (a subset, e.g. a targeted capture); ``world_size`` is then their count.
    """
    failed = _failed(run)
    if failed is not None:
        return failed
    if run.name == "cluster_time_summary":
        return _cluster_time_summary(run, facts, world_size, ev, expected_ranks)
    if run.name == "slow_rank":
        return _slow_rank(run, facts, len(expected_ranks) if expected_ranks is not None else world_size, ev)
    if run.name == "communication_matrix":
        return _communication_matrix(run, facts, ev)
    if run.name == "advisor":
        return _advisor(run, ev)
    if run.name == "advisor_html":
        return _advisor_html(run, ev)
    raise KeyError(f"unknown msprof-analyze recipe {run.name!r}")
