"""msprof-analyze on one staged batch, in two phases: the recipes the verdict waits for, then the enrichment
(I/O: reads the staged batch and the tools' outputs; runs them through :class:`MsprofRunner`).

:func:`prepare_msprof` reads the batch (``msprof_db.inspect_inputs``) and plans the recipes
(``msprof_plan.plan_recipes``); :func:`run_phase` runs the commands of one phase concurrently (as the runner's
bounds allow) and hands each run's outputs to ``msprof_plan.interpret_run`` as it finishes; no policy here.
:func:`run_msprof_analysis` does both phases in a row (the offline path and the older callers).
"""

from __future__ import annotations

import functools
import importlib.metadata
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

import structlog

from profwatch.adapters.tools.msprof_db import inspect_inputs, read_tables
from profwatch.adapters.tools.msprof_runner import MsprofRunner, RunTicket, SpawnFailed, ToolRun
from profwatch.core.verdict.evidence import ClusterEvidence, RecipePhase, RecipeStatus
from profwatch.core.verdict.matrix_chunks import MatrixChunkPlan, MatrixPart, merge_matrix_parts, split_after_oom
from profwatch.core.verdict.msprof_plan import (
    RESULT_DB,
    RESULT_TABLES,
    InputFacts,
    MsprofSettings,
    RecipeCommand,
    RecipePlan,
    RunOutcome,
    input_notes,
    interpret_run,
    matrix_chunk_commands,
    plan_recipes,
    with_input,
)

__all__ = ["MsprofSession", "Progress", "prepare_msprof", "run_msprof_analysis", "run_phase"]

log = structlog.get_logger()
_WAKE_S = 0.25
"""Longest the thread running a phase waits on its runs without looking for a pending signal (seconds)."""

Progress = Callable[[str, str, "RecipeStatus | None"], None]
"""``progress(event, recipe, status)``: ``("started", name, None)`` when a tool process starts, ``("finished",
name, status)`` when its status is known (also for recipes decided without running: ``skipped`` ones)."""


@dataclass(slots=True)
class MsprofSession:
    """One staged batch between its phases: where it is, what it holds, the plan, the runs' ticket (``owner``
    for cancel), the ranks staged (``expected_ranks``; None = ``0..world_size-1``) and the settings the plan was
    made with (None = the runner's)."""

    staged_dir: Path
    out_dir: Path
    facts: InputFacts
    plan: RecipePlan
    world_size: int
    ticket: RunTicket
    owner: str = ""
    expected_ranks: list[int] | None = None
    settings: MsprofSettings | None = None


def _outcome(run: ToolRun | SpawnFailed, name: str, phase: RecipePhase) -> RunOutcome:
    """Read what one run left (result tables, log, advisor files) into a :class:`RunOutcome`."""
    if isinstance(run, SpawnFailed):
        return RunOutcome(name=name, spawn_error=str(run), phase=phase)
    tables = read_tables(run.output_dir / RESULT_DB, RESULT_TABLES.get(name, ())) if not run.oom else {}
    files = []
    if name == "advisor_html" and not run.timed_out and not run.cancelled and not run.oom:
        files = sorted(str(p) for p in run.output_dir.rglob("mstt_advisor_*") if p.suffix in (".html", ".xlsx"))
    return RunOutcome(name=name, output_dir=str(run.output_dir), returncode=run.returncode, timed_out=run.timed_out,
                      cancelled=run.cancelled, cancel_reason=run.cancel_reason, attempts=run.attempts,
                      duration_s=run.duration_s, agent=run.agent, log_text=run.log_text(), log_tail=run.log_tail(),
                      stderr_tail=run.stderr_tail,
                      tables=tables, files=files, phase=phase, oom=run.oom, oom_detail=run.oom_detail,
                      peak_rss_bytes=run.peak_rss_bytes or None)


def _versions(facts: InputFacts) -> dict[str, str]:
    versions = {"torch_npu": ",".join(sorted(facts.torch_npu_versions)),
                "cann": ",".join(sorted(facts.cann_versions))}
    try:
        versions["msprof_analyze"] = importlib.metadata.version("msprof-analyze")
    except importlib.metadata.PackageNotFoundError:
        versions["msprof_analyze"] = "unknown"
    return {k: v for k, v in versions.items() if v}


def prepare_msprof(staged_dir: Path, out_dir: Path, *, runner: MsprofRunner, world_size: int, owner: str = "",
                   expected_ranks: list[int] | None = None, progress: Progress | None = None,
                   settings: MsprofSettings | None = None,
                   ticket: RunTicket | None = None) -> tuple[ClusterEvidence, MsprofSession]:
    """Inspect one staged batch and plan its recipes; the evidence holds the recipes decided without running
    (``skipped``, ``not_applicable``...). ``settings``: the recipes to plan (advisor, communication matrix...) for
    this batch (default the runner's: one runner serves batches planned differently, e.g. ``analyze --baseline``'s
    reference without the advisor). Paths are made absolute. Raises OSError if ``out_dir`` cannot be made."""
    staged_dir, out_dir = Path(staged_dir).absolute(), Path(out_dir).absolute()
    out_dir.mkdir(parents=True, exist_ok=True)
    facts = inspect_inputs(staged_dir)
    ev = ClusterEvidence(kind="ascend_pt", versions=_versions(facts), collectives_per_step=facts.collectives_per_step)
    ev.notes += input_notes(facts, len(expected_ranks) if expected_ranks is not None else world_size)
    settings = settings or runner.settings
    plan = plan_recipes(facts, settings, str(staged_dir))
    for name, status in plan.skipped.items():
        log.info("msprof_recipe_skipped", recipe=name, status=status.status, detail=status.detail)
        ev.recipes[name] = status
        if progress is not None:
            progress("finished", name, status)
    session = MsprofSession(staged_dir, out_dir, facts, plan, world_size, ticket or runner.ticket(owner), owner,
                            expected_ranks, settings)
    return ev, session


def run_phase(session: MsprofSession, ev: ClusterEvidence, phase: RecipePhase, *, runner: MsprofRunner,
              commands: Sequence[RecipeCommand] | None = None, progress: Progress | None = None) -> ClusterEvidence:
    """Run the commands of ``phase`` (default: the plan's; ``commands`` overrides, e.g. the advisor on a subset
    staging) concurrently within the runner's bounds, each ``--agent --force`` into its own fresh ``-o`` under
    ``session.out_dir``; fill ``ev`` (µs) and ``ev.recipes[name]`` as each run finishes. A recipe that fails,
    times out or is killed at the memory cap is a status and never holds up the others. Commands of a chunked
    recipe (``RecipeCommand.ranks`` set: communication_matrix above its size limits) each read into their own
    evidence; once all have finished, ``matrix_chunks.merge_matrix_parts`` makes them one status, one table
    (``ev.link_rows``) and notes saying which ranks the link search covered; progress reports such a recipe
    started once and finished once. A communication_matrix run killed at the memory cap (the whole batch, or a
    chunk) is cut in two and run again, up to ``matrix_oom_splits`` rounds (``matrix_chunks.split_after_oom``),
    so the estimate before running need not be right. Raises nothing for tool failures; a KeyboardInterrupt cancels the runs of
    this session and is re-raised."""
    cmds = list(session.plan.phase(phase) if commands is None else commands)
    if not cmds:
        return ev
    workers = len(cmds)
    parts: list[MatrixPart] = []
    whole_oom: RecipeStatus | None = None
    splits = (session.settings or runner.settings).matrix_oom_splits
    started: set[str] = set()
    lock = threading.Lock()

    def on_start(name: str) -> None:
        with lock:
            first = name not in started
            started.add(name)
        if first and progress is not None:
            progress("started", name, None)

    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"msprof-{phase}") as pool:
        futures: dict[Future[ToolRun], RecipeCommand] = {}
        try:  # from the first submit on: a Ctrl-C between two submits must also cancel the tool already running
            for c in cmds:
                futures[pool.submit(runner.run, c.name, c.args, session.out_dir, ticket=session.ticket, phase=phase,
                                    on_start=functools.partial(on_start, c.name))] = c
            pending = set(futures)
            while pending:
                # with a timeout: a signal the kernel hands to one of the pool's threads only sets Python's flag, and
                # a main thread blocked in an untimed wait would not run its handler (Ctrl-C or SIGTERM ignored until
                # a tool ends by itself); waking every _WAKE_S lets KeyboardInterrupt / SystemExit through
                done, pending = wait(pending, timeout=_WAKE_S, return_when=FIRST_COMPLETED)
                for fut in done:
                    c = futures[fut]
                    try:
                        run: ToolRun | SpawnFailed = fut.result()
                    except SpawnFailed as exc:
                        run = exc
                    if c.ranks is not None:  # one chunk: merged with the others once all have finished
                        own = ClusterEvidence(kind=ev.kind)
                        part = interpret_run(_outcome(run, c.name, phase), session.facts, len(c.ranks), own,
                                             list(c.ranks))
                        parts.append(MatrixPart(c.ranks, part, own.link_rows))
                        continue
                    status = interpret_run(_outcome(run, c.name, phase), session.facts, session.world_size, ev,
                                           session.expected_ranks)
                    if c.name == "communication_matrix" and status.status == "oom" and splits:
                        whole_oom = status  # run again in chunks below
                        continue
                    ev.recipes[c.name] = status
                    if progress is not None:
                        progress("finished", c.name, status)
        except BaseException:  # interrupted (Ctrl-C) or a bug: leave no tool running, do not wait for it
            runner.cancel_ticket(session.ticket)
            raise
    chunk_plan = session.plan.matrix_chunks
    if whole_oom is not None or (parts and chunk_plan is not None):
        chunk_plan, parts = _split_killed(session, chunk_plan, parts, whole_oom is not None, splits, runner, phase)
        session.plan.matrix_chunks = chunk_plan
    if whole_oom is not None and chunk_plan is None:  # could not be cut (one rank)
        ev.recipes[whole_oom.name] = whole_oom
        if progress is not None:
            progress("finished", whole_oom.name, whole_oom)
    if parts and chunk_plan is not None:
        status, ev.link_rows, notes = merge_matrix_parts(chunk_plan, parts)
        ev.recipes[status.name] = status
        if whole_oom is not None:
            notes.insert(0, f"communication_matrix over the whole batch: {whole_oom.detail}; run again in chunks")
        ev.notes += notes
        log.info("msprof_chunks_merged", recipe=status.name, status=status.status, chunks=len(chunk_plan.chunks),
                 ok=sum(p.status.status == "ok" for p in parts), rows=status.rows,
                 peak_rss_mib=round((status.peak_rss_bytes or 0) / 2**20, 1))
        if progress is not None:
            progress("finished", status.name, status)
    log.info("msprof_phase_finished", phase=phase, world_size=session.world_size, owner=session.owner,
             statuses={c.name: ev.recipes[c.name].status for c in cmds if c.name in ev.recipes},
             votes=ev.slow_rank_votes)
    return ev


def _split_killed(session: MsprofSession, plan: MatrixChunkPlan | None, parts: list[MatrixPart], whole_killed: bool,
                  rounds: int, runner: MsprofRunner, phase: RecipePhase
                  ) -> tuple[MatrixChunkPlan | None, list[MatrixPart]]:
    """Up to ``rounds`` times: cut the communication_matrix runs killed at the memory cap in two
    (``split_after_oom``; ``whole_killed``: the single whole-batch run) and run the new chunks one after the other.
    Returns the final plan (None when nothing was cut) and the parts of its chunks."""
    facts = session.facts
    for _ in range(rounds):
        killed = [p.ranks for p in parts if p.status.status == "oom"]
        if plan is None and whole_killed:
            killed = [tuple(facts.db_ranks)]
        new = split_after_oom(plan, facts.db_ranks, facts.groups, facts.analysis_bytes, killed)
        if new is None:
            break
        kept = set(plan.chunks) if plan is not None else set()
        fresh = [c for c in new.chunks if c not in kept]
        log.info("msprof_matrix_split_after_oom", killed=len(killed), chunks=len(new.chunks), fresh=len(fresh))
        parts = [p for p in parts if p.ranks in set(new.chunks)]
        for c in matrix_chunk_commands(str(session.staged_dir), fresh):
            try:
                run: ToolRun | SpawnFailed = runner.run(c.name, c.args, session.out_dir, ticket=session.ticket,
                                                        phase=phase)
            except SpawnFailed as exc:
                run = exc
            except BaseException:
                runner.cancel_ticket(session.ticket)
                raise
            own = ClusterEvidence(kind="ascend_pt")
            assert c.ranks is not None
            status = interpret_run(_outcome(run, c.name, phase), facts, len(c.ranks), own, list(c.ranks))
            parts.append(MatrixPart(c.ranks, status, own.link_rows))
        plan = new
    return plan, parts


def advisor_commands(session: MsprofSession, staged_dir: Path | None) -> list[RecipeCommand]:
    """The plan's advisor commands, reading ``staged_dir`` when given (the size rule's subset staging)."""
    cmds = [c for c in session.plan.phase("enrich") if c.name in ("advisor", "advisor_html")]
    return [with_input(c, str(Path(staged_dir).absolute())) for c in cmds] if staged_dir is not None else cmds


def run_msprof_analysis(staged_dir: Path, out_dir: Path, *, runner: MsprofRunner, world_size: int,
                        owner: str = "", expected_ranks: list[int] | None = None,
                        progress: Progress | None = None) -> ClusterEvidence:
    """Run every recipe ``plan_recipes`` picks (cluster_time_summary, slow_rank, communication_matrix, ``advisor
    all``) on one staged batch of ``world_size`` ranks through ``runner``, the alert phase then the enrich phase;
    return the evidence (µs) with a :class:`RecipeStatus` per recipe (statuses as ``msprof_plan.interpret_run``
    documents). The advisor runs on the whole batch here (no size rule: ``daemon/profwatch/analysis/facade.py`` applies it).

    ``owner`` labels the runs for :meth:`MsprofRunner.cancel` and ``running()``. ``expected_ranks``: the ranks
    staged when they are not ``0..world_size-1`` (a subset). Paths are made absolute first.
    Raises nothing for tool failures; OSError if ``out_dir`` cannot be created.
    """
    ev, session = prepare_msprof(staged_dir, out_dir, runner=runner, world_size=world_size, owner=owner,
                                 expected_ranks=expected_ranks, progress=progress)
    for phase in ("alert", "enrich"):
        run_phase(session, ev, phase, runner=runner, progress=progress)
    return ev
