"""``profwatch analyze DIR``: offline completeness check plus analysis, the coordinator's code path (CLI body).

Wired by ``daemon/profwatch/cli.py`` with ``cli.add_command(analyze)``. Settings: ``ctx.obj["analysis_settings"]`` if the
CLI group provides one, else the ``[analysis]`` section of ``--config`` / ``PROFWATCH_CONFIG``, else defaults;
the flags below override them.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any, NoReturn

import click

from profwatch.adapters.fs.rank_dir_fs import TreeUnavailable, describe_unsupported, find_unsupported, scan_tree
from profwatch.adapters.fs.staging import mark_output_dir
from profwatch.adapters.tools.msprof_runner import MsprofRunner
from profwatch.analysis.facade import (
    AnalysisResult,
    AnalysisSettings,
    analyze_batch,
    enrich_analysis,
    rewrite_report,
)
from profwatch.changes.compare import attach_comparison
from profwatch.commands.scan import one_rank_dir_note, one_rank_lead
from profwatch.core.batches.completeness import BatchState
from profwatch.core.changes.comparison import headline_line
from profwatch.core.display import clip, display_str, printable
from profwatch.core.messages import MAX_WORLD_SIZE
from profwatch.core.verdict.drilldown import delta_text, excess_text
from profwatch.core.verdict.evidence import RecipeStatus, hours_unit
from profwatch.signals import handling

GOOD = ("ok", "no_suspect")


class RecipeProgress:
    """Per-recipe progress of one batch on stderr (``profwatch.analysis.facade.Progress``): plain lines, or on a terminal one
    status line drawn by tqdm (what runs, what finished, elapsed time) that ends in the same lines. Stdout keeps
    only the results. Use as a context manager (it owns a refresh thread on a terminal)."""

    def __init__(self, batch_id: str, stream: IO[str] | None = None, tty: bool | None = None) -> None:
        self.batch_id = batch_id
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.t0 = time.monotonic()
        self.running: dict[str, float] = {}
        self.done: list[str] = []
        self.ran: dict[str, str] = {}  # enrich-phase recipes that ran (not skipped) -> their status
        self._bar: Any = None
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        if self.tty:
            from tqdm import tqdm

            self._bar = tqdm(total=None, file=self.stream, bar_format="{desc}", leave=False, dynamic_ncols=True)
            self._ticker = threading.Thread(target=self._tick, name="profwatch-progress", daemon=True)
            self._ticker.start()

    def __enter__(self) -> RecipeProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join(2)
        if self._bar is not None:
            self._bar.close()

    def _tick(self) -> None:
        while not self._stop.wait(1.0):
            self._draw()

    def _draw(self) -> None:
        if self._bar is None:
            return
        now = time.monotonic()
        runs = ", ".join(f"{n} {now - t:.0f} s" for n, t in self.running.items()) or "-"
        self._bar.set_description_str(f"{self.batch_id}: {now - self.t0:.0f} s; running: {runs}; done: "
                                      f"{len(self.done)}", refresh=True)

    def _line(self, text: str) -> None:
        line = f"analyze: {self.batch_id}: {text} [t+{time.monotonic() - self.t0:.1f} s]"
        if self._bar is not None:
            self._bar.write(line, file=self.stream)
            self._draw()
        else:
            print(line, file=self.stream, flush=True)

    def __call__(self, event: str, name: str, status: RecipeStatus | None) -> None:
        if event == "started":
            self.running[name] = time.monotonic()
            self._line(f"{name} started")
        elif event == "finished" and status is not None:
            self.running.pop(name, None)
            self.done.append(name)
            if status.phase == "enrich" and status.status not in ("skipped", "not_applicable"):
                self.ran[name] = status.status
            took = f" in {status.duration_s:.1f} s" if status.duration_s else ""
            mem = f", peak {status.peak_rss_bytes / 2**20:.0f} MiB" if status.peak_rss_bytes else ""
            self._line(f"{name} {status.status}{took}{mem}" + (f": {clip(status.detail, 100)}" if status.status != "ok"
                                                                else ""))
        elif event == "verdict":
            self._line(f"verdict {name} (the alert would go out now)")
        elif event == "follow_up":
            ran = ", ".join(f"{n} {s}" for n, s in self.ran.items()) or "no follow-up tool ran"
            self._line(f"follow-up done ({ran}; verdict judged again, report rewritten): {name}")


def _settings(ctx: click.Context, config_path: Path | None, no_advisor: bool, timeout_s: float | None,
              no_html: bool, advisor_html: bool = False) -> AnalysisSettings:
    obj: Any = ctx.obj
    base = obj.get("analysis_settings") if isinstance(obj, dict) else None
    from profwatch.commands.common import resolve_config_path

    config_path = resolve_config_path(config_path)
    if base is None and config_path is not None:
        from profwatch.config import ConfigError, load_settings

        try:
            base = load_settings(config_path).analysis
        except ConfigError as exc:
            click.echo(f"profwatch: {exc}", err=True)
            ctx.exit(2)
    settings = base.model_copy(deep=True) if isinstance(base, AnalysisSettings) else AnalysisSettings()
    if no_advisor:
        settings.msprof.without_advisor("turned off by --no-advisor")
    if advisor_html:
        settings.msprof.advisor_html = True
    if timeout_s is not None:
        settings.msprof.timeout_s = timeout_s
    if no_html:
        settings.report_html = False
    return settings


def _saving(impact: dict[str, Any] | None) -> str:
    if not impact:
        return ""
    return (f"saves {1e3 * impact['saving_s_per_step']:.1f} ms/step ({impact['saving_pct_of_step']:.1f}% of the mean step, "
            f"{impact['accelerator_hours_per_day']:.0f} {hours_unit(impact)} per day)")


def _human(res: AnalysisResult) -> str:
    lines = [f"batch {res.batch_id} [{res.kind}, {res.world_size} ranks]: {res.status} - {res.detail}"]
    if res.impact:
        lines.append(f"  if every suspect were fixed: {_saving(res.impact)}")
    if res.captured_steps:
        armed = f" of armed {res.armed_steps}" if res.armed_steps else ""
        lines.append(f"  steps analysed {res.captured_steps}{armed}; evidence {res.strength or '-'}")
    for name, r in res.recipes.items():
        lines.append(f"  recipe {name:<22} {r.status:<15} {clip(r.detail, 110)}")
    for i, s in enumerate(res.suspects, start=1):
        lines.append(f"  #{i} rank {s.rank:<5} score {s.score:.2f}  {s.kind:<13} host {s.hostname or '-'}  "
                     f"{_saving(s.impact)}")
        lines.append(f"      {s.evidence.get('summary', '')} [{s.evidence.get('strength', '-')}]")
        if s.rank_dir:
            lines.append(f"      {s.rank_dir}")
        drill = next((c for c in res.op_compare if c.get("rank") == s.rank), None)
        if drill is not None:
            lines.append(f"      why (over its median peer, rank {drill.get('reference_rank')}, "
                         f"{drill.get('source') or '-'}):")
            lines += [f"        {o.get('kind') or 'operator':<10} {str(o.get('name'))[:60]}  "
                      f"{excess_text(float(o.get('excess_us_per_step') or 0.0))}" for o in drill["ops"][:5]]
            if not drill["ops"]:
                lines.append("        no operator stands out")
    for lk in res.links:
        lines.append(f"  link {lk.ranks[0]}<->{lk.ranks[1]} (group {lk.group}, {lk.transport or '?'}): "
                     f"{lk.bandwidth_gbps:.2f} GB/s vs peers {lk.peer_median_gbps:.2f} GB/s  {_saving(lk.impact)}")
    for rank, why in sorted(res.unjudged_ranks.items()):
        lines.append(f"  not judged: rank {rank}: {why}")
    if res.comparison is not None:
        c = res.comparison
        lines.append(f"  {headline_line(c)}")
        changed = {ch["component"] for ch in c["changes"]}
        for comp in c["components"]:
            iv, p = comp.get("interval_s_per_step"), comp.get("p_value")
            lines.append(f"    {comp['component']:<14} reference {1e3 * comp['baseline_s_per_step']:8.2f} ms/step  "
                         f"now {1e3 * comp['now_s_per_step']:8.2f}  change {delta_text(1e6 * comp['delta_s_per_step']):>9}"
                         + (f"  98% [{delta_text(1e6 * iv[0])}, {delta_text(1e6 * iv[1])}]" if iv else "")
                         + (f"  p {p:.2g}" if p is not None else "")
                         + ("  changed" if comp["component"] in changed else ""))
        basis = next((ch["basis"] for ch in c["changes"] if ch.get("basis")), None)
        if basis:
            lines.append(f"    {basis}")
        for ch in c["changes"]:
            if isinstance(ch.get("detail"), list):
                lines.append(f"    behind the {ch['component']} change (ranks {ch['detail'][0].get('ranks')}, "
                             f"{ch['detail'][0].get('source')}):")
                lines += [f"      {d['kind']:<10} {d['name'][:60]}"
                          + (f" [group {d['group'][:40]}]" if d.get("group") and d["group"] != d["name"] else "")
                          + f"  {excess_text(1e6 * d['delta_s_per_step'])}" for d in ch["detail"]]
        if c.get("impact_accelerator_hours_per_day") is not None:
            lines.append(f"    the step-time change costs {c['impact_accelerator_hours_per_day']:.1f} "
                         "accelerator-hours per day")
        for note in c["notes"]:
            lines.append(f"    note: {note}")
    if res.report:
        lines.append(f"  report: {res.report}")
    return display_str("\n".join(lines))


@click.command("analyze")
@click.argument("directory", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--world-size", type=click.IntRange(min=1, max=MAX_WORLD_SIZE), default=None,
              help=f"Expected ranks per batch, at most {MAX_WORLD_SIZE} (default: from profiler_info / the rank dirs).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per batch (JSON Lines).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Work folder for staging, tool outputs and reports (default: ./profwatch-analysis).")
@click.option("--batch", "batch_ids", multiple=True, help="Only these batch ids (repeatable).")
@click.option("--no-advisor", is_flag=True, help="Skip msprof-analyze advisor (it runs after the verdict; about 10-60 s "
              "on 2 cores, longer on large batches).")
@click.option("--advisor-html", is_flag=True, help="Also write msprof-analyze advisor's own html/xlsx (another advisor "
              "run).")
@click.option("--quiet", is_flag=True, help="No per-recipe progress on stderr.")
@click.option("--no-html", is_flag=True, help="Write report.json only.")
@click.option("--timeout-s", type=click.FloatRange(min=1), default=None, help="Per msprof-analyze command.")
@click.option("--baseline", "baseline_dir", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
              help="A healthy reference capture of the same job: each verdict gains `changes` (what changed since it: "
                   "compute, communication, host, software, hardware; docs/changes.md).")
@click.option("--baseline-batch", default=None, help="The reference batch id when BASELINE holds several.")
@click.option("--config", "config_path", type=click.Path(dir_okay=False, path_type=Path),
              default=None, help="TOML config; its [analysis] section gives the settings (flags override).")
@click.pass_context
def analyze(ctx: click.Context, directory: Path, world_size: int | None, as_json: bool, out_dir: Path | None,
            batch_ids: tuple[str, ...], no_advisor: bool, advisor_html: bool, quiet: bool, no_html: bool,
            timeout_s: float | None, config_path: Path | None, baseline_dir: Path | None = None,
            baseline_batch: str | None = None) -> None:
    """Check which capture batches under DIR are complete, analyse them and rank suspect slow ranks.

    Exit status: 0 when every batch was analysed (ok / no_suspect), 1 when any batch was incomplete, partial,
    weak (evidence on too few steps) or its analysis failed, 2 when DIR holds no batch or cannot be read.
    Progress per recipe goes to stderr (the verdict is reached before the advisor runs; see --quiet).
    """
    from profwatch.logsetup import configure_logging

    configure_logging("WARNING", "console")  # logs to stderr: stdout carries only the result (--json lines)
    settings = _settings(ctx, config_path, no_advisor, timeout_s, no_html, advisor_html)
    work = out_dir or Path.cwd() / "profwatch-analysis"
    try:
        batches = scan_tree(directory, world_size=world_size)
    except TreeUnavailable as exc:
        _fail(ctx, as_json, "unreadable", f"cannot read {directory}: {exc}")
    if batch_ids:
        batches = [b for b in batches if b.batch_id in set(batch_ids)]
    if not batches:
        other = describe_unsupported(find_unsupported(directory))
        _fail(ctx, as_json, "no_batch", f"no capture batch found under {directory}" + (f"; {other}" if other else ""))
    lead = None if as_json else one_rank_lead(directory, batches)
    if lead is not None:  # one rank dir of an incomplete batch: what to pass first, not "missing ranks [1, 2, 3]"
        click.echo(lead)
        ctx.exit(1)
    # the reference is scanned at its own world size (--world-size is the capture's): a different one is a note
    ref_batch = _baseline_batch(ctx, as_json, baseline_dir, baseline_batch, None) if baseline_dir else None
    _check_out(ctx, as_json, work, directory)  # after the input checks: a bad DIR leaves no output folder behind
    worst = 0
    # SIGTERM (a scheduler, `timeout`) ends the command like Ctrl-C: the exception unwinds the block below, whose
    # exit kills every msprof-analyze still running (each runs in its own session, out of reach of our signals)
    with handling(_terminated, signal.SIGTERM):
        # one runner for every batch; leaving the block (also by Ctrl-C or SIGTERM) kills any msprof-analyze running
        with MsprofRunner(settings.msprof) as runner:
            reference = None
            if ref_batch is not None and baseline_dir is not None:
                ref_settings = settings.for_reference()  # only the time breakdown is compared
                if quiet:
                    reference = analyze_batch(ref_batch, work_dir=work / "reference", settings=ref_settings,
                                              runner=runner)
                else:
                    click.echo(f"profwatch: analysing the reference batch {display_str(ref_batch.batch_id)} first "
                               f"({display_str(str(baseline_dir))}; its time breakdown only)", err=True)
                    with RecipeProgress(display_str(ref_batch.batch_id)) as progress:
                        reference = analyze_batch(ref_batch, work_dir=work / "reference", settings=ref_settings,
                                                  runner=runner, progress=progress)
            for batch in batches:
                if quiet:
                    res = _analyse_one(batch, work, settings, runner, reference, baseline_dir, ref_batch, None)
                else:
                    with RecipeProgress(display_str(batch.batch_id)) as progress:
                        res = _analyse_one(batch, work, settings, runner, reference, baseline_dir, ref_batch, progress)
                if res.status == "incomplete":
                    res.notes.append(json.dumps({"completeness": batch.to_json()}, default=str)[:4000])
                if as_json:
                    click.echo(json.dumps(printable(res.to_json()), default=str))
                else:
                    click.echo(_human(res))
                if res.status not in GOOD:
                    worst = 1
        note = one_rank_dir_note(directory)
        if note and any(b.status != "complete" for b in batches):  # last: the other ranks were not looked for
            click.echo(note, err=True)
        ctx.exit(worst)


def _analyse_one(batch: BatchState, work: Path, settings: AnalysisSettings, runner: MsprofRunner,
                 reference: AnalysisResult | None, baseline_dir: Path | None, ref_batch: BatchState | None,
                 progress: Any) -> AnalysisResult:
    """Analyse one batch: the alert phase, the comparison with the reference when there is one (its changes'
    detail is found in the enrich phase, ``reference_compare``), then the enrich phase."""
    res = analyze_batch(batch, work_dir=work, settings=settings, runner=runner, progress=progress, enrich=False)
    if reference is not None and baseline_dir is not None and res.status != "incomplete":
        res.job_id = res.job_id or _job_of(batch)
        if ref_batch is not None:
            reference.job_id = reference.job_id or _job_of(ref_batch)
        attach_comparison(res, reference, reference_path=str(baseline_dir))
        if ref_batch is not None and _same_dirs(ref_batch, batch) and res.comparison is not None:
            res.comparison["notes"].append("the reference is this capture itself (same rank dirs): "
                                           "nothing can have changed; pass a capture of the healthy job")
        rewrite_report(res, time.time())  # report.json carries the comparison the output shows
    if res.pending:
        enrich_analysis(res, runner=runner, progress=progress)
    return res


def _job_of(batch: BatchState) -> str | None:
    """``profwatch_job_id`` from a rank dir's ``profiler_metadata.json`` (the job profwatch armed the capture for),
    the first rank dir that has one; None offline without it. Reads at most 64 KiB of each file."""
    for rank in sorted(batch.rank_dirs):
        try:
            with open(os.path.join(batch.rank_dirs[rank], "profiler_metadata.json"), "rb") as fh:
                meta = json.loads(fh.read(65536))
        except (OSError, ValueError):
            continue
        job = meta.get("profwatch_job_id") if isinstance(meta, dict) else None
        if isinstance(job, str) and job:
            return job[:200]
    return None


EXIT_SIGTERM = 128 + signal.SIGTERM
"""Exit status after SIGTERM (the shell's convention for a signal's death: 143)."""


def _terminated(signum: int, frame: Any) -> None:
    """SIGTERM handler: unwind the command (the runner's ``with`` block kills its tool processes), exit 143."""
    raise SystemExit(EXIT_SIGTERM)


def _baseline_batch(ctx: click.Context, as_json: bool, directory: Path, batch_id: str | None,
                    world_size: int | None) -> BatchState:
    """The one complete reference batch under ``directory`` (exits 2 with a clear message otherwise)."""
    try:
        found = scan_tree(directory, world_size=world_size)
    except TreeUnavailable as exc:
        _fail(ctx, as_json, "unreadable", f"cannot read the baseline {directory}: {exc}")
    if batch_id:
        found = [b for b in found if b.batch_id == batch_id]
    complete = [b for b in found if b.status == "complete"]
    if len(complete) != 1:  # each batch with its status: a lone incomplete one is not fixed by --baseline-batch
        names = ", ".join(f"{display_str(b.batch_id)} ({b.status})" for b in found) or "none"
        hint = ("; choose one with --baseline-batch" if len(complete) > 1
                else "; " + "; ".join(f"{display_str(b.batch_id)}: {b.describe(limit=1)}" for b in found[:2]) if found
                else "")
        _fail(ctx, as_json, "no_batch", f"the baseline {directory} must hold exactly one complete batch "
                                        f"(found {len(complete)} complete of: {names}){hint}")
    return complete[0]


def _same_dirs(a: BatchState, b: BatchState) -> bool:
    """True when two batches share a rank dir (``--baseline`` pointing at the capture itself)."""
    return bool({os.path.realpath(r.path) for r in a.ranks.values()} & {os.path.realpath(r.path) for r in b.ranks.values()})


def _check_out(ctx: click.Context, as_json: bool, work: Path, directory: Path) -> None:
    """Exit 2 unless ``work`` can be created and written; mark it as profwatch output (later scans skip it) unless
    it holds the capture data itself (``--out`` = DIR or a parent of DIR)."""
    cap, out = os.path.realpath(directory), os.path.realpath(work)
    holds_captures = cap == out or cap.startswith(out.rstrip(os.sep) + os.sep)
    try:
        mark_output_dir(work, mark=not holds_captures)
    except OSError as exc:
        _fail(ctx, as_json, "bad_out", f"cannot write the output folder {work} (--out): "
                                       f"{exc.strerror or exc}; choose a writable folder with --out")


def _fail(ctx: click.Context, as_json: bool, status: str, detail: str) -> NoReturn:
    if as_json:
        click.echo(json.dumps({"status": status, "detail": display_str(detail)}))
    else:
        click.echo(display_str(detail), err=True)
    ctx.exit(2)
