"""``profwatch demo``: the whole loop for real on one machine (coordinator + node daemons as processes, real
ZeroMQ, a real gloo PyTorch job, simulated Ascend ranks speaking the dynamic_profile protocol, real msprof-analyze).

Scenario ``torch``: rank R of a DDP job gets really slower from step S; the coordinator detects the regression,
arms a capture through ``profiler_config.json``, the ranks capture it with torch.profiler, the batch completes,
the Kineto analysis runs and the alert's top suspect must be R.
Scenario ``ascend``: the same with ranks using the fake ``torch_npu`` package (clearly labelled simulator) that
writes Ascend-format rank dirs from the measured timings; the coordinator runs the real msprof-analyze.
Scenario ``reference`` (not in ``both``): Ascend ranks again, the coordinator set to take its healthy reference
capture after 5 steady seconds (docs/reference.md); once that reference is analysed (``reference_captured``; the
scenario waits for it up to ``--start-timeout-s``, however many steps that takes on a busy host) every rank gets slower (a job-wide regression, nobody stands out)
and the verdict's ``changes`` must be led by ``compute``: what changed since the reference.

Both scenarios run real PyTorch processes (gloo on the CPU): without torch the demo says how to install the CPU
build and exits 2. Progress goes to stderr as it happens; the timelines (``demo_timeline.py``) and results go to
stdout at the end. Exit codes (``daemon/profwatch/exitcodes.py``): 0 every scenario's first alert names the slow rank and
every announced enriched update arrived; 1 otherwise (also when stopped by Ctrl-C / SIGTERM, which stops the
daemons and ranks it started); 2 usage error or torch missing.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

import click

from profwatch.commands.demo_stack import Stack
from profwatch.commands.demo_timeline import SAYS_EPISODES, Timeline, event_time
from profwatch.core.alerts.alertmanager import saving_text
from profwatch.core.alerts.event_types import (
    ANOMALY_TYPES,
    TYPE_ANALYSIS_ENRICHED,
    TYPE_ANALYSIS_FAILED,
    TYPE_ARM,
    TYPE_ARM_DECISION,
    TYPE_BATCH,
    TYPE_BATCH_INCOMPLETE,
    TYPE_CAPTURE,
    TYPE_REFERENCE_CAPTURED,
    TYPE_SUSPECT_RANKS,
    display_name,
)
from profwatch.core.capture.lifecycle import CaptureState
from profwatch.core.capture.record import IN_FLIGHT
from profwatch.core.changes.comparison import headline_line
from profwatch.exitcodes import EXIT_NOT_OK, EXIT_OK, EXIT_USAGE
from profwatch.signals import handling
from profwatch.simulate.launcher import ALL_RANKS, JobSpec, launch_job

TORCH_CPU_INSTALL = "pip install torch --index-url https://download.pytorch.org/whl/cpu"
NOTE_EVERY_S = 15.0
"""While a capture is analysed or enriched, a progress line on stderr this often (what runs, for how long)."""


class Stopped(BaseException):
    """SIGTERM reached the demo: unwind (stopping ranks and daemons) like Ctrl-C does."""


def _furthest(status: dict[str, Any], job_id: str) -> int | None:
    for j in status.get("jobs", []):
        if j["job_id"] == job_id:
            return int(j["furthest_step"])
    return None


def _suspects_text(d: dict[str, Any]) -> str:
    sus = d.get("suspects") or []
    if not sus:
        return f"{d.get('status', '?')}: no suspect"
    return f"{d.get('status', '?')}: " + "; ".join(
        f"rank {s['rank']} {s['kind']} score {s['score']:.2f}" for s in sus[:3])


def _recipes(d: dict[str, Any]) -> str:
    """``name=status`` per recipe of a verdict payload, with ``(N.Ns)`` where the recipe reports ``duration_s``."""
    out = []
    for k, v in (d.get("recipes") or {}).items():
        if not isinstance(v, dict):
            out.append(f"{k}={v}")
            continue
        dur = v.get("duration_s")
        out.append(f"{k}={v.get('status')}" + (f" ({float(dur):.1f}s)" if isinstance(dur, (int, float)) else ""))
    return ", ".join(out)


def on_event(tl: Timeline, ev: dict[str, Any], now: float, note: Callable[[str, float, str], None]) -> None:
    """Fold one published event of the scenario's job into its timeline; ``note(stage, t, detail)`` reports a
    stage the first time it is seen."""
    t_ev, d = event_time(ev, now), ev.get("data") or {}
    typ = ev.get("type", "")

    def mark(stage: str, t: float, detail: str, step: int | None = None) -> None:
        if tl.add(stage, t, step, detail):
            note(stage, t, detail)

    if typ == TYPE_REFERENCE_CAPTURED:
        mark("reference", t_ev, reference_row(d))
    elif typ in ANOMALY_TYPES and int(d.get("step") or 0) >= tl.at_step:
        mark("detection", t_ev, f"{d.get('kind')} +{100 * float(d.get('magnitude') or 0):.0f}%", d.get("step"))
    elif typ == TYPE_ARM_DECISION and d.get("action") == "arm" and d.get("capture_id"):
        if not tl.after_slowdown_only or tl.t("slowdown") is not None:
            tl.episode_captures.add(str(d["capture_id"]))
    elif tl.after_slowdown_only and typ in (TYPE_SUSPECT_RANKS, TYPE_BATCH_INCOMPLETE, TYPE_ANALYSIS_FAILED,
                                            TYPE_ANALYSIS_ENRICHED) and \
            str(d.get("capture_id")) not in tl.episode_captures:
        return  # the verdict of a capture armed before the slowdown: not the slowdown's
    elif d.get("capture_id") and str(d["capture_id"]) not in tl.episode_captures and typ in (TYPE_ARM, TYPE_CAPTURE,
                                                                                           TYPE_BATCH):
        return  # the reference capture's (or another not armed for an episode): not the slowdown's pipeline
    elif typ == TYPE_ARM_DECISION and d.get("action") != "arm":
        key = f"{d.get('action')} ({d.get('reason')})"
        tl.suppressed[key] = tl.suppressed.get(key, 0) + 1
    elif typ == TYPE_ARM and d.get("status") == CaptureState.WRITTEN:
        mark("arm", t_ev, f"config written: start_step={d.get('start_step')} warmup={d.get('warmup')} "
                          f"active={d.get('active')}")
    elif typ == TYPE_CAPTURE and d.get("event") == "all_ranks_completed":
        mark("capture", t_ev, "every rank wrote its rank dir")
    elif typ == TYPE_BATCH:
        mark("batch_complete", t_ev, (d.get("batch") or {}).get("batch_id", ""))
    elif typ == TYPE_SUSPECT_RANKS:
        took = float(d.get("analysis_duration_s") or 0.0)
        mark("analysis", t_ev - took, f"{took:.1f} s to the verdict; recipes: {_recipes(d)}")
        pending = _pending(d)
        mark("first_alert", t_ev, _suspects_text(d) + (f"; follow-up pending: {', '.join(pending)}" if pending else ""))
        tl.alert = tl.alert or ev
    elif typ in (TYPE_BATCH_INCOMPLETE, TYPE_ANALYSIS_FAILED):
        mark("first_alert", t_ev, f"{display_name(typ)}: {d.get('detail', '')}"[:160])
        tl.alert = tl.alert or ev
    elif typ == TYPE_ANALYSIS_ENRICHED:
        enrich_s = d.get("enrich_duration_s")
        mark("enriched_update", t_ev, "analysis_enriched" + (f" after {float(enrich_s):.1f} s of follow-up" if enrich_s else "")
             + f": {_suspects_text(d)}; recipes: {_recipes(d)}")
        tl.enriched = tl.enriched or ev


def _pending(d: dict[str, Any]) -> list[str]:
    """What the verdict's follow-up will still run (``pending_recipes``); [] when no enriched update follows."""
    return list(d.get("pending_recipes") or [])


def _expects_enrichment(tl: Timeline) -> bool:
    return bool(tl.alert is not None and _pending(tl.alert.get("data") or {}))


def run_scenario(stack: Stack, scenario: str, *, ranks: int, slow_rank: int, slowdown: float, at_step: int,
                 timeout_s: float, progress: Callable[[str], None], start_timeout_s: float = 600.0) -> Timeline:
    """Run one scenario to its first alert and, when that alert announces a follow-up, to its enriched update;
    return its timeline. The clocks (:meth:`Timeline.deadline`): up to ``start_timeout_s`` from the job's launch to
    the slowdown, then ``timeout_s`` from the slowdown to the first alert, then ``timeout_s`` again from the first
    alert to the enriched update. Past a bound, ``tl.timed_out`` says which. A progress line every
    :data:`NOTE_EVERY_S` of every wait. The job's ranks are stopped at the first alert."""
    import zmq

    from profwatch.adapters.zmq.control import ControlError, call
    from profwatch.adapters.zmq.publish import Subscription

    job_id = f"demo-{scenario}"
    tl = Timeline(scenario, job_id)
    whom = "every rank" if slow_rank == ALL_RANKS else f"rank {slow_rank}"
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    sub = Subscription(ctx, stack.pub, ["alert", "event"], job_id)
    slow_file = stack.root / f"{job_id}.slow" if scenario == "reference" else None  # touched once the reference is in
    tl.at_step = at_step if slow_file is None else 1 << 62  # known once the slow file is touched
    tl.after_slowdown_only = slow_file is not None
    spec = JobSpec(job_id=job_id, world_size=ranks, node_endpoints=[stack.endpoint(k) for k in range(stack.nodes)],
                   profiler_config_path=stack.root / "cfg" / job_id, prof_root=stack.root / "prof",
                   mode="torch" if scenario == "torch" else "ascend-sim", slow_rank=slow_rank, slowdown=slowdown,
                   slow_at_step=at_step, max_seconds=start_timeout_s + timeout_s + 60,
                   stop_file=stack.root / f"{job_id}.stop", log_dir=stack.root / "logs", slow_file=slow_file)
    job = launch_job(spec)
    started = time.time()
    progress(f"[{scenario}] {ranks} ranks on {stack.nodes} nodes; {whom} gets {slowdown:g}x slower "
             + ("once the coordinator's reference capture is analysed; waiting for the reference" if slow_file
                else f"at step {at_step}; waiting for the slowdown")
             + f" (up to {start_timeout_s:g} s), then up to {timeout_s:g} s from the slowdown to the first alert")

    def note(_stage: str = "", _t: float = 0.0, _detail: str = "", final: bool = False) -> None:
        """A progress line per stage :meth:`Timeline.release` hands out: pipeline order, the final table's times."""
        t0 = tl.t("slowdown")
        for stage, t, detail in tl.release(final):
            progress(f"[{scenario}] {'' if t0 is None else f'+{t - t0:.1f}s '}{stage}: {detail}")

    seen: set[str] = set()
    last_note = time.monotonic()
    job_stopped = False
    step: int | None = None
    end, what = tl.deadline(started, start_timeout_s, timeout_s, False)
    try:
        while True:
            if tl.alert is not None:
                if not job_stopped:  # the verdict is in: free the CPU for the follow-up
                    job.request_stop()
                    job_stopped = True
                    if _expects_enrichment(tl):
                        progress(f"[{scenario}] waiting for the enriched update (up to {timeout_s:.0f} s)")
                if tl.enriched is not None or not _expects_enrichment(tl):
                    break
            end, what = tl.deadline(started, start_timeout_s, timeout_s, _expects_enrichment(tl))
            if time.time() >= end:
                tl.timed_out = f"no {what}"
                progress(f"[{scenario}] timed out: no {what}")
                break
            ev = sub.recv(250)
            if ev is not None and str(ev.get("id")) not in seen:
                seen.add(str(ev.get("id")))
                on_event(tl, ev, time.time(), note)
            st: dict[str, Any] = {}
            try:
                st = call(stack.control, "status", {"job_id": job_id}, timeout_s=5)
            except ControlError:
                pass  # still say where we are every NOTE_EVERY_S below
            step = _furthest(st, job_id) if st else step
            if st and tl.waiting_for() == "reference":
                _reference_from_status(tl, st, note, time.time())
            if st and step is not None:
                _on_step(tl, step, slow_file, at_step, f"{whom} x{slowdown:g}", note)
            if time.monotonic() - last_note >= NOTE_EVERY_S:
                last_note = time.monotonic()
                end, what = tl.deadline(started, start_timeout_s, timeout_s, _expects_enrichment(tl))
                progress(tl.progress_line(time.time(), step, end, what, _in_flight(st)))
                for line in _running_captures(st):
                    progress(f"[{scenario}] {line}")
            if not job_stopped and any(p.poll() not in (None, 0) for p in job.procs):
                progress(f"[{scenario}] a rank process died; see {stack.root / 'logs'}")
                break
        if tl.alert is None or (_expects_enrichment(tl) and tl.enriched is None):
            _catch_up_from_store(stack, tl, end, note, progress)
        note(final=True)
    finally:
        sub.close()
        job.stop(grace_s=60)
    return tl


def _on_step(tl: Timeline, step: int, slow_file: Path | None, at_step: int, slowing: str,
             note: Callable[[str, float, str], None]) -> None:
    """Fold the job's furthest ``step`` (from a status reply) into ``tl``: a step sample, and the slowdown's time.
    With a ``slow_file`` (scenario ``reference``) it is touched once the reference is in (without one the
    scenario times out waiting for it: a comparison needs it) and the slowdown is this step; else the slowdown is when ``at_step`` was
    reached. ``slowing`` says who slows by how much (``"rank 2 x3"``)."""
    if slow_file is not None and not slow_file.exists() and tl.t("reference") is not None:
        slow_file.touch()  # every rank slows from its next step: the slowdown's step is about this one
        tl.at_step = step
        tl.add("slowdown", time.time(), step, f"{slowing} from about step {step}")
        note("slowdown", time.time(), f"{slowing} from about step {step}")
    tl.samples.append((time.time(), step))
    if slow_file is None:
        t_slow = tl.time_of_step(at_step)
        if t_slow is not None and tl.add("slowdown", t_slow, at_step, f"{slowing} from step {at_step}"):
            note("slowdown", t_slow, f"{slowing} from step {at_step}")


IN_FLIGHT_STATES = frozenset(str(s.value) for s in IN_FLIGHT)
"""A capture in these states is in flight (``core/capture/record.py: IN_FLIGHT``): one of an episode holds the
job's config slot, and the reference waits for it (``capture_in_flight``)."""


def _reference_from_status(tl: Timeline, st: dict[str, Any], note: Callable[[str, float, str], None],
                           now: float) -> None:
    """Fold a ``status`` reply (received at ``now``, Unix s) into ``tl`` while the scenario waits for its reference:
    the coordinator's account of the job's reference and open episodes (:attr:`Timeline.coordinator_says`), and the
    reference stage itself when the reply holds an analysed one whose ``reference_captured`` event was not received
    (a PUB message is dropped while the subscriber's queue is full; the reply is the coordinator's record). That
    stage is placed at ``now``: the reply's reference (``ReferenceInfo``) says when it was armed, not when its
    analysis ended (the event's time), and carries no judged ranks nor captured steps."""
    from profwatch.core.status_text import render_episode, render_reference

    refs = [r for r in st.get("references") or [] if r.get("job_id") == tl.job_id]
    eps = [e for e in st.get("episodes") or [] if e.get("job_id") == tl.job_id and e.get("closed_unix_s") is None]
    caps = [c for c in st.get("captures") or [] if c.get("job_id") == tl.job_id and c.get("state") in IN_FLIGHT_STATES]
    tl.coordinator_says = ([render_reference(refs[0])[0].strip()] if refs else ["no reference state yet"]) + [
        "open episode " + render_episode(e)[0].strip() for e in eps[:SAYS_EPISODES]] + [
        f"capture {c.get('capture_id')} ({c.get('reason')}) {c.get('state')} for {float(c.get('in_state_s') or 0):.0f} s, "
        f"ranks acknowledged {c.get('acknowledged_ranks')}, completed {c.get('completed_ranks')} of "
        f"{c.get('expected_ranks')}, window from step {c.get('start_step')}" for c in caps[-SAYS_EPISODES:]]
    latest = refs[0].get("latest") if refs else None
    if isinstance(latest, dict) and latest.get("capture_id"):
        world, st_s = latest.get("world_size"), latest.get("step_time_s")
        detail = (f"reference capture {latest['capture_id']}: healthy baseline"
                  + (f" of the job's {world} ranks" if world else "") + ", analysed (never alerted on)"
                  + (f", {float(st_s):.4g} s per step" if st_s else "")
                  + " (from status: its reference_captured event was missed)")
        if tl.add("reference", now, None, detail):
            note("reference", now, detail)


def _in_flight(st: dict[str, Any]) -> list[str]:
    """``"<capture id> <state>"`` of each capture of a status reply being analysed or enriched."""
    return [f"{cap.get('capture_id', '?')} {cap['state']}" for cap in st.get("captures") or []
            if cap.get("state") in (CaptureState.ANALYSING, CaptureState.ENRICHING)]


def _running_captures(st: dict[str, Any]) -> list[str]:
    """A progress line per capture of a status reply that is being analysed or enriched: its id, state, for how
    long, and what it does or waits for now (``core/status_text.py: capture_activity``)."""
    from profwatch.core.status_text import capture_activity

    out = []
    for cap in st.get("captures") or []:
        if cap["state"] in (CaptureState.ANALYSING, CaptureState.ENRICHING):
            doing = capture_activity({**cap, "running": cap.get("running") or []})
            out.append(f"capture {cap.get('capture_id', '?')} state {cap['state']} for the last "
                       f"{cap.get('in_state_s', 0):.0f} s; {doing}")
    return out


def _catch_up_from_store(stack: Stack, tl: Timeline, end: float, note: Callable[[str, float, str], None],
                         progress: Callable[[str], None]) -> None:
    """Fold the job's stored alerts (up to 50) into ``tl``, in case a PUB message was missed; a timeout is lifted
    when what it waited for was published by ``end`` (epoch s)."""
    from profwatch.adapters.zmq.control import ControlError, call

    try:
        rows = call(stack.control, "events", {"job_id": tl.job_id, "alerts_only": True, "limit": 50}, timeout_s=5)
    except ControlError as exc:
        rows = []
        progress(f"[{tl.scenario}] cannot read the stored alerts: {exc}")
    for row in rows:
        on_event(tl, row["event"], time.time(), note)
    late = tl.t("enriched_update" if tl.enriched is not None else "first_alert")
    if tl.timed_out and late is not None and late <= end and (tl.enriched is not None
                                                              or not _expects_enrichment(tl)):
        tl.timed_out = None  # it was published in time; only its PUB message was missed


REFERENCE_OUTCOMES = {"suspect_ranks": "analysis done", "batch_incomplete": "batch incomplete",
                      "analysis_failed": "analysis failed"}
"""A ``reference_captured`` event's ``outcome`` (the verdict type it replaces; never alerted on) in words."""


def reference_row(d: dict[str, Any]) -> str:
    """The timeline row of a ``reference_captured`` event's data ``d``: what the capture is (the job's healthy
    baseline), the ranks it judged of the job's world size, its outcome in words and its steps (e.g.
    ``reference capture c-1: healthy baseline of all 4 ranks, analysis done (never alerted on): steps 102-107``)."""
    judged, world = d.get("judged_ranks") or [], d.get("world_size")
    cover = ("" if not judged else f" of all {len(judged)} ranks" if len(judged) == world
             else f" of {len(judged)} of {world} ranks" if world else f" of {len(judged)} ranks")
    outcome = REFERENCE_OUTCOMES.get(str(d.get("outcome")), str(d.get("outcome")))
    return (f"reference capture {d.get('capture_id')}: healthy baseline{cover}, {outcome} (never alerted on): "
            f"steps {_steps(d.get('captured_steps'))}")


def _steps(steps: list[int] | None) -> str:
    if not steps:
        return "none"
    return f"{steps[0]}-{steps[-1]}" if steps == list(range(steps[0], steps[-1] + 1)) else ",".join(map(str, steps))


def miss_evidence(data: dict[str, Any], max_ranks: int = 8, max_steps: int = 8) -> list[str]:
    """What the analysis saw, for a scenario that missed: the verdict's detail, notes and recipes, then each rank's
    computation / wait / free time per step (ms) from the capture's report JSON (``data["report"]`` with ``.json``;
    at most ``max_ranks`` x ``max_steps``). Lines without leading spaces; only the status line when there is no
    report, and a line saying why when its JSON cannot be read."""
    out = [f"status {data.get('status')}: {data.get('detail')}"]
    from profwatch.adapters.fs.bounded_read import read_capped
    from profwatch.adapters.fs.rank_dir_fs import MAX_JSON_BYTES

    path = data.get("report")
    try:
        doc = json.loads(read_capped(Path(str(path)).with_suffix(".json"), MAX_JSON_BYTES, "report JSON")) \
            if path else None
    except (OSError, ValueError) as exc:
        return out + [f"report JSON not readable: {exc}"]
    if not isinstance(doc, dict):
        return out
    out += [f"note: {n}" for n in (doc.get("notes") or [])[:6]]
    recipes: dict[str, Any] = doc["recipes"] if isinstance(doc.get("recipes"), dict) else {}
    out += [f"recipe {name}: {r.get('status')}: {r.get('detail')}" for name, r in recipes.items() if isinstance(r, dict)]
    rows = [r for r in doc.get("summaries") or [] if isinstance(r, dict)]
    ranks = sorted({int(r["rank"]) for r in rows if isinstance(r.get("rank"), int)})[:max_ranks]
    steps = sorted({int(r["step"]) for r in rows if isinstance(r.get("step"), int)})[:max_steps]
    cell = {(r.get("rank"), r.get("step")): r for r in rows}
    if ranks and steps:
        out.append("per step, ms (computation/wait/free) " + " ".join(f"{'rank ' + str(k):>17}" for k in ranks))
        for st in steps:
            vals = []
            for k in ranks:
                r = cell.get((k, st))
                text = "-" if r is None else "/".join(f"{float(r.get(m) or 0.0) / 1e3:.1f}"
                                                     for m in ("computation_us", "wait_us", "free_us"))
                vals.append(text.rjust(17))
            out.append(f"step {st:<31}" + " ".join(vals))
    return out


def report(tl: Timeline, slow_rank: int, echo: Callable[[str], None]) -> bool:
    """Print one scenario's timeline and result; True when its first alert names ``slow_rank`` first (scenario
    ``reference``: when its ``changes`` against the reference are led by ``compute``) and an announced enriched
    update arrived."""
    echo(f"\n== scenario {tl.scenario} (job {tl.job_id}) ==")
    echo(tl.render())
    if tl.alert is None:  # nothing to judge: say why, and what was seen so far (never "top suspect None")
        seen = ", ".join(s for s, *_ in tl.ordered()) or "nothing"
        why = f"TIMED OUT: {tl.timed_out}" if tl.timed_out else "no alert (the job ended or a rank process died)"
        echo(f"  result: {why}; seen so far: {seen}")
        if tl.timed_out:
            echo("  a loaded host may need more: --timeout-s (from the slowdown) or --start-timeout-s (to it)")
        for line in tl.coordinator_says if tl.waiting_for() == "reference" else ():  # taken during that wait only
            echo(f"  the coordinator's account at the end of the wait: {line}")
        return False
    d = (tl.alert or {}).get("data", {})
    sus = d.get("suspects") or []
    top = sus[0]["rank"] if sus else None
    verdict = tl.alert is not None and tl.alert.get("type") == TYPE_SUSPECT_RANKS
    headline = str((d.get("comparison") or {}).get("headline") or "")
    if tl.scenario == "reference":
        changes = d.get("changes") or []
        lead = changes[0].get("component") if changes and isinstance(changes[0], dict) else None
        hit = verdict and lead == "compute"
        echo(f"  result: what changed since the reference led by {lead} (expected compute) -> "
             f"{'OK' if hit else 'MISSED'}; {d.get('status')}: {d.get('detail')}")
    else:
        hit = verdict and top == slow_rank
        echo(f"  result: top suspect {top} (expected {slow_rank}) -> {'OK' if hit else 'MISSED'}; steps captured "
             f"{_steps(d.get('captured_steps'))} of armed {_steps(d.get('armed_steps'))}")
    if not hit:
        for line in miss_evidence(d):
            echo("  " + line)
    if headline:
        echo(f"  {headline_line({'headline': headline})}")
    saving = saving_text(sus[0].get("impact")) if sus else ""
    if saving:
        echo(f"  impact: fixing rank {top} alone would save {saving}")
    ok = hit
    if _expects_enrichment(tl):
        if tl.enriched is None:
            echo("  enriched update: " + (f"TIMED OUT ({tl.timed_out})" if tl.timed_out else "MISSING")
                 + " (the first alert announced one: " + ", ".join(_pending(d)) + ")")
            ok = False
        else:
            first, enr = tl.t("first_alert"), tl.t("enriched_update")
            echo(f"  first alert, then the enriched update {0.0 if first is None or enr is None else enr - first:.1f} s "
                 "later (analysis_enriched)")
    enriched = (tl.enriched or {}).get("data") or {}
    if enriched.get("report") or d.get("report"):
        echo(f"  report: {enriched.get('report') or d['report']}")
    if sus and sus[0].get("rank_dir"):
        echo(f"  {drill_down_line(sus[0])}")
    return ok


def drill_down_line(suspect: Mapping[str, Any]) -> str:
    """Where to look first: ``drill down (rank R): RANK_DIR`` for a verdict's suspect (``rank``, ``rank_dir``);
    the rank is named because a rank dir's name carries the host and pid, not the rank."""
    rank = suspect.get("rank")
    return f"drill down{f' (rank {rank})' if rank is not None else ''}: {suspect.get('rank_dir')}"


@click.command()
@click.option("--workdir", type=click.Path(file_okay=False, path_type=Path), default=Path("profwatch-demo"),
              show_default=True, help="where configs, captures, reports and logs go")
@click.option("--ranks", default=4, show_default=True)
@click.option("--nodes", default=2, show_default=True)
@click.option("--slow-rank", default=2, show_default=True)
@click.option("--slowdown", default=3.0, show_default=True, help="slow rank's compute factor")
@click.option("--at-step", default=40, show_default=True, help="step from which the rank is slower")
@click.option("--scenario", type=click.Choice(["both", "torch", "ascend", "reference"]), default="both",
              show_default=True, help="both = torch then ascend; reference (1-2 minutes): the coordinator's healthy "
                                      "reference capture, then a job-wide slowdown compared with it")
@click.option("--timeout-s", default=240.0, show_default=True,
              help="per scenario, counted from the slowdown: bound to the first alert, and again (from the first "
                   "alert) to the enriched update")
@click.option("--start-timeout-s", default=600.0, show_default=True,
              help="per scenario: bound from the job's launch to the slowdown (the reference scenario: to the "
                   "reference's analysis, then the slowdown)")
def demo(workdir: Path, ranks: int, nodes: int, slow_rank: int, slowdown: float, at_step: int, scenario: str,
         timeout_s: float, start_timeout_s: float) -> None:
    """Run the end-to-end demo: real job, real daemons, real detection, capture, analysis and alert.

    Progress goes to stderr as it happens; each scenario's timeline (stages in pipeline order, with how long each
    took) and result go to stdout. Exit 0 when every first alert names the slow rank, 1 otherwise, 2 when
    PyTorch is not installed (both scenarios run real PyTorch ranks).
    """
    if not 0 <= slow_rank < ranks:
        raise click.UsageError("--slow-rank must be in [0, ranks)")
    if nodes < 1 or nodes > ranks:
        raise click.UsageError("--nodes must be in [1, ranks]")
    if importlib.util.find_spec("torch") is None:
        click.echo("profwatch demo: PyTorch is not installed. Both scenarios run real PyTorch ranks (gloo on the "
                   f"CPU; the Ascend one through a simulated torch_npu). Install the CPU-only build:\n  "
                   f"{TORCH_CPU_INSTALL}\n(about 190 MB to download; the default PyPI torch is the CUDA build, several "
                   "GB with its NVIDIA packages)", err=True)
        sys.exit(EXIT_USAGE)
    root = (workdir / time.strftime("run-%Y%m%d-%H%M%S")).resolve()
    root.mkdir(parents=True, exist_ok=True)
    runtime = Path(tempfile.mkdtemp(prefix="pwdemo", dir="/tmp"))  # short ipc:// paths
    stack = Stack(root, runtime, nodes, reference=scenario == "reference")
    scenarios = ["torch", "ascend"] if scenario == "both" else [scenario]
    results: list[Timeline] = []
    t0 = time.time()

    def on_term(signum: int, frame: Any) -> None:
        raise Stopped()

    progress = _progress_printer(t0)
    stopped = ""
    with handling(on_term, signal.SIGTERM):  # the demo's own, only while it runs (profwatch.signals)
        try:
            stack.start(progress)
            progress(f"daemons up (coordinator + {nodes} node daemons; JSON logs in {root / 'logs'}), work dir {root}")
            for sc in scenarios:
                job_wide = sc == "reference"
                results.append(run_scenario(stack, sc, ranks=ranks, slow_rank=ALL_RANKS if job_wide else slow_rank,
                                            slowdown=slowdown, at_step=1 if job_wide else at_step, timeout_s=timeout_s,
                                            progress=progress, start_timeout_s=start_timeout_s))
        except (KeyboardInterrupt, Stopped) as exc:
            stopped = "SIGTERM" if isinstance(exc, Stopped) else "Ctrl-C"
            progress(f"{stopped}: stopping the ranks and daemons this demo started")
        finally:
            stack.stop()
            shutil.rmtree(runtime, ignore_errors=True)
    ok = not stopped and len(results) == len(scenarios)
    missed: list[str] = []
    timed_out: list[str] = []
    for tl in results:
        if not report(tl, slow_rank, click.echo):
            ok = False
            missed.append(tl.scenario)
            if tl.timed_out is not None:
                timed_out.append(tl.scenario)
    (root / "demo_result.json").write_text(json.dumps(
        {"ok": ok, "elapsed_s": round(time.time() - t0, 1), "stopped": stopped or None,
         "scenarios": [tl.to_json() for tl in results]}, indent=2, default=str))
    verdict = ("the verdict said what changed since the reference" if scenario == "reference" else
               "all alerts named the slow rank") if ok else (f"stopped by {stopped}" if stopped else "TIMED OUT"
                                                              if any(tl.timed_out for tl in results) else "FAILED")
    click.echo(f"\ndemo finished in {time.time() - t0:.0f}s: {verdict}; results in {root / 'demo_result.json'}, "
               f"logs in {root / 'logs'}")
    if missed and not stopped:
        click.echo(_missed_hint(missed, timed_out=timed_out))
    sys.exit(EXIT_OK if ok else EXIT_NOT_OK)


def _missed_hint(missed: list[str], *, timed_out: Collection[str] = ()) -> str:
    """What to do when a scenario's alert did not name the slow rank (its lines above say what it said), or, for
    those of ``missed`` in ``timed_out``, when one stopped waiting (its ``result: TIMED OUT`` line says for what):
    the host's load average, since other work on a small box swamps a 3x rank's steps (a new user's demo at load
    3-7 missed the torch scenario: "does not confirm at its noise ... 28.6 % of a step"; the rerun passed)."""
    try:
        load = f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count() or 1} CPUs"
    except OSError:
        load = "load average unknown"
    named = [m for m in missed if m not in timed_out]
    late = [m for m in missed if m in timed_out]
    what = "; ".join([f"scenario {', '.join(named)}: the alert did not name the slow rank"] * bool(named)
                     + [f"scenario {', '.join(late)}: timed out (the result line above says waiting for what)"]
                     * bool(late))
    return (f"{what} ({load}). Other work on this machine adds noise "
            f"to every rank's steps; rerun it when the machine is quieter: profwatch demo --scenario "
            f"{missed[0]}")


def _progress_printer(t0: float) -> Callable[[str], None]:
    def progress(line: str) -> None:
        click.echo(f"[{time.time() - t0:6.1f}s] {line}", err=True)

    return progress
