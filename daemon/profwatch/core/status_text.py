"""What ``profwatch status`` prints: the coordinator's status snapshot as lines of text (pure).

Input: the ``status`` control reply (``daemon/profwatch/core/fleet/registry.py: Registry.snapshot`` plus the coordinator's
``counters``, ``captures``, ``episodes`` and ``ingest_bind``). Output: lines without trailing newlines. Every figure says which
window it comes from; every rank has a state; a coordinator with no node says so and names the likely cause.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from profwatch.core.capture.lifecycle import DEADLINE_BOUNDS, CaptureState
from profwatch.core.detection.settings import SERVING_BLOCK_MIN
from profwatch.core.display import span_text
from profwatch.core.display import when_text as _when
from profwatch.core.fleet.host_load import MAX_EXPLAIN_GAP_S

SILENT_MIN_S = 10.0
"""A rank is ``silent`` once its last report is older than this, or than ``SILENT_STEPS`` of its own median step
time when that is longer (a slow job is not silent between two steps)."""
SILENT_STEPS = 5.0
DEFAULT_INGEST = "tcp://127.0.0.1:7711"


def rank_state(rank: Mapping[str, Any], median_s: float | None) -> str:
    """One rank's state: ``left`` (said bye), ``capturing`` (its capture backend records now), ``no step yet``
    (said hello only), ``silent Ns`` (no report for longer than the bound above), else ``running``."""
    if rank.get("left"):
        return "left"
    if rank.get("capturing"):
        return "capturing"
    age = rank.get("age_s")
    if rank.get("last_step", -1) < 0 and not rank.get("step_time_s"):
        return "no step yet"
    bound = max(SILENT_MIN_S, SILENT_STEPS * (median_s or 0.0))
    if age is not None and age > bound:
        return f"silent {age:.0f}s"
    return "running"


def _s(x: float | None, digits: int = 4) -> str:
    return f"{x:.{digits}f}" if x is not None else "-"


def _step(step: int | None) -> str:
    """A step number, or ``-`` for none yet (the registry's ``-1``)."""
    return "-" if step is None or step < 0 else str(step)


def render_job(job: Mapping[str, Any]) -> list[str]:
    """Header, step-time line and the rank table of one job."""
    n = job.get("median_steps") or 20
    lines = [f"job {job['job_id']}  world_size={job['world_size']} ranks_seen={job['ranks_seen']} "
             f"backend={job.get('backend') or '-'} furthest_step={_step(job['furthest_step'])} "
             f"rank_drops={job.get('rank_drops', 0)}"]
    mst = job.get("median_step_time_s")
    lines.append(f"  step time: {_s(mst, 3)} s = median over ranks of each rank's median of its last {n} steps "
                 f"(the median{n}_s column)" if mst else "  step time: - (no step reported yet)")
    lines.extend(render_generation(job))
    lines.extend(render_serving(job.get("serving")))
    for rank, err in sorted((job.get("backend_errors") or {}).items(), key=lambda kv: int(kv[0])):
        lines.append(f"  rank {rank}: capture backend not in use: {err}")
    for warning in job.get("warnings") or []:
        lines.append(f"  warning: {warning}")
    lines.append(f"  {'rank':>5} {'host':<20} {'last_step':>9} {'last_step_s':>11} {f'median{n}_s':>11} {'age_s':>7}  "
                 "state")
    for r in job.get("ranks", []):
        med = r.get("median_step_time_s")
        age = f"{r['age_s']:.1f}" if r.get("age_s") is not None else "-"
        state = rank_state(r, med)
        # a rank that said hello only has no step: its registry placeholders (-1, 0.0) are no figures
        step, step_s = ("-", None) if state == "no step yet" else (r["last_step"], r.get("step_time_s"))
        lines.append(f"  {r['rank']:>5} {str(r.get('hostname') or '-')[:20]:<20} {step:>9} "
                     f"{_s(step_s):>11} {_s(med):>11} {age:>7}  {state}")
    return lines


def render_generation(job: Mapping[str, Any]) -> list[str]:
    """The job's generation (elastic restarts and resizes, docs/generations.md), its start in local time, and each
    claim of a next generation still short of a quorum; nothing for a job that never reported a restart count."""
    lines = []
    gen, rc = job.get("generation") or 0, job.get("restart_count")
    if gen or rc is not None:
        since = datetime.fromtimestamp(float(job.get("generation_since_unix_s") or 0.0)).strftime("%H:%M:%S")
        lines.append(f"  generation {gen} (restart count {'-' if rc is None else rc}, since {since})")
    for c in job.get("pending_generations") or []:
        if c.get("steps_went_back"):  # one vote per process (docs/generations.md)
            lines.append(f"  steps went back: {c['agreeing_through_job_nodes']} of {c['quorum']} processes "
                         f"({c['ranks']} ranks); no new run yet")
            continue
        lines.append(f"  claimed: world_size={c['world_size']} restart count {c['restart_count']}: "
                     f"{c['agreeing_through_job_nodes']} of {c['quorum']} ranks agree through the job's nodes "
                     f"({c['ranks']} held); no new generation yet")
    return lines


def _span(seconds: float) -> str:
    """``"18 min"`` / ``"45 s"`` / ``"1.5 h"``: a duration for a status line."""
    if seconds >= 5400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 60:.0f} min" if seconds >= 120 else f"{seconds:.0f} s"


def _learning_unit_line(u: Mapping[str, Any], block: float) -> str:
    """One learning unit in the user's terms: it learns its normal pace from periods of traffic (each of the regression
    test's blocks is ``block`` seconds of the unit's time with at least :data:`SERVING_BLOCK_MIN` steps), how much
    traffic time it has and needs, and that until then only large rises are caught. With no block yet it says it waits
    for traffic (the count "0 of 18 blocks" read as a stuck job)."""
    ranks = ",".join(str(r) for r in u.get("ranks", []))
    have, need = int(u.get("blocks", 0)), int(u.get("blocks_needed", 0))
    what = (f"learning its normal speed: has {_span(have * block)} of the {_span(need * block)} of traffic it "
            f"needs ({have} of {need} periods of {block:.0f} s with {SERVING_BLOCK_MIN}+ steps)")
    if have == 0:
        what = (f"waiting for traffic to learn its normal speed: needs {_span(need * block)} of it ({need} "
                f"periods of {block:.0f} s with {SERVING_BLOCK_MIN}+ steps), none complete yet")
    return f"    unit of ranks {ranks}: {what}; until then only large slowdowns are reported"


def render_serving(view: Mapping[str, Any] | None) -> list[str]:
    """A serving job's units (replicas) and what each is judged on yet (``JobDetector.serving_view``); nothing
    for a training job. A unit still learning is judged only for large rises (``spike_min_effect``) by its own
    test: the line says so, and what it waits for (traffic, in minutes), instead of letting a quiet status
    read as a watched one."""
    if not view:
        return []
    n = view.get("units", 0)
    block = view.get("block_s", 60.0)
    parts = [f"{view.get('watched', 0)} watched"]
    if view.get("learning"):
        parts.append(f"{view['learning']} still learning their normal speed from traffic (only large slowdowns "
                     "are reported until then)")
    if view.get("no_busy_step"):
        parts.append(f"{view['no_busy_step']} with no busy step yet (every step an idle gap: not judged)")
    if view.get("no_step"):
        parts.append(f"{view['no_step']} with no step yet")
    peers = ""
    if view.get("replica_peers"):
        peers = f"; replicas also compared with each other ({view.get('replica_blocks', 0)} blocks judged so far)"
    lines = [f"  serving: {n} unit{'s' if n != 1 else ''}: " + ", ".join(parts) + peers]
    for u in view.get("detail") or []:
        if u.get("state") == "learning":
            lines.append(_learning_unit_line(u, block))
    return lines


def render_nodes(nodes: Sequence[Mapping[str, Any]], ingest_bind: str | None) -> list[str]:
    """The node lines; with no node (or every node down) the likely cause: nodes dial ``[node] coordinator``,
    which must name this coordinator's ingest endpoint."""
    where = ingest_bind or DEFAULT_INGEST
    cause = (f"node daemons dial [node] coordinator, which must be this coordinator's ingest endpoint {where} "
             "([coordinator] ingest_bind; mind the host and port); a node that gets no answer logs "
             "coordinator_unanswered")
    if not nodes:
        return ["nodes: no node connected", f"  likely cause: no node daemon is running, or {cause}"]
    lines = ["nodes:"]
    for n in nodes:
        c = n.get("counters") or {}
        down = " DOWN" if n.get("down") else ""
        lines.append(f"  {n['node_id']:<20}{down} last heard {n['age_s']:.1f}s ago received={c.get('received', 0)} "
                     f"rejected={c.get('rejected', 0)} dropped={c.get('dropped', 0)} lost_batches={n['lost_batches']}")
        if n.get("stale_state"):
            lines.append(f"    stale torch_npu state: {n['stale_state']}")
        load = _host_load_line(n.get("host_load"))
        if load:
            lines.append(load)
    if all(n.get("down") for n in nodes):
        lines.append(f"  every node is down: their daemons stopped, or they now dial another coordinator ({cause})")
    return lines


def _host_load_line(load: Any) -> str:
    """A node's host-load line (``core/fleet/host_load.py``), or "" before its first measured heartbeat."""
    if not isinstance(load, dict) or load.get("runnable_per_core") is None:
        return ""
    psi = load.get("cpu_psi_some_pct")
    psi_text = (f"CPU pressure (PSI some avg10) {psi:.1f} %" if psi is not None
                else "CPU pressure: no PSI on this kernel (the run queue alone is measured)")
    line = f"    host load: {load['runnable_per_core']:.2f} runnable tasks per core; {psi_text}"
    if load.get("too_sparse_to_explain"):
        line += (f"; heartbeats {load.get('heartbeat_gap_s')} s apart: too few to explain a job's move by host load "
                 f"(at most {MAX_EXPLAIN_GAP_S:.0f} s: [node] heartbeat_interval_s)")
    return line


def render_capture(cap: Mapping[str, Any]) -> list[str]:
    """One capture: state and for how long, its deadline (what it bounds), acknowledgements, what runs now,
    outcome."""
    left = cap.get("deadline_in_s")
    what = DEADLINE_BOUNDS.get(str(cap.get("state")), "")
    what = f"{what} " if what else ""
    deadline = "" if left is None else (f", {what}deadline in {span_text(left)}" if left >= 0
                                        else f", {what}deadline passed {span_text(-left)} ago")
    queued = " (queued)" if str(cap.get("stage") or "").endswith("_queued") else ""
    lines = [f"  {cap['capture_id']:<32} {cap['state']}{queued} for {cap.get('in_state_s', 0):.0f}s{deadline}; "
             f"start_step={cap['start_step']} warmup={cap.get('warmup', '-')} active={cap.get('active', '-')} "
             f"acked={cap.get('acknowledged_ranks')}/{cap.get('expected_ranks')} reason={cap['reason']}"
             + (" [not yet stored: the state store is failing]" if cap.get("stored") is False else "")]
    doing = capture_activity(cap)
    if doing:
        lines.append(f"    {doing}")
    if cap.get("outcome"):
        lines.append(f"    {cap['outcome']}")
    return lines


IDLE_ON_WORKER = {
    CaptureState.ANALYSING.value: "staging, ranking or the Kineto analysis (no msprof-analyze command)",
    CaptureState.ENRICHING.value: "its follow-up between msprof-analyze commands (staging the advisor's ranks, judging again, "
                 "writing the report; no msprof-analyze command)",
}
"""What an analysing / enriching capture on its worker does while no msprof-analyze command of it runs."""


RUN_RANK_WHY = {"reference_compare": "a rank whose step time changed most since the reference",
                "suspect_compare": "a suspect rank, compared with its median peer"}
"""Why a per-rank run of each recipe (``<recipe>_rank<N>``: ``changes/compare.py``, the reference comparison;
``analysis/drilldown.py``, the Ascend drill-down of each suspect) compares that rank."""


def run_label(name: str) -> str:
    """A running msprof-analyze command's name in words: ``reference_compare_rank2`` (a job-wide comparison that
    picks ranks) -> ``reference_compare of rank 2 (a rank whose step time changed most since the reference)``,
    ``suspect_compare_rank3`` -> ``suspect_compare of rank 3 (a suspect rank, compared with its median peer)``;
    any other name as it is (the machine name stays in ``running_recipes``' JSON)."""
    recipe, sep, rank = name.rpartition("_rank")
    why = RUN_RANK_WHY.get(recipe)
    return f"{recipe} of rank {rank} ({why})" if sep and why and rank.isdigit() else name


def capture_activity(cap: Mapping[str, Any]) -> str:
    """What an analysing or enriching capture of a ``status`` reply does or waits for now, in words: the
    msprof-analyze commands running for it (``running``), else, by its ``stage`` (``AnalysisSteps.stage_of``),
    the worker it is queued for and the captures ``ahead`` of it, or what its worker does between commands.
    "" for a capture in no such state (no ``running`` key)."""
    if cap.get("running") is None:
        return ""
    if cap["running"]:
        return f"running now: {', '.join(cap['running'])}"
    stage = str(cap.get("stage") or "")
    ahead = [str(c) for c in cap.get("ahead") or ()]
    behind = f": behind {', '.join(ahead[:4])}" + (f" and {len(ahead) - 4} more" if len(ahead) > 4 else "") \
        if ahead else ""
    if stage == "enrich_queued":
        return f"waiting for the enrich worker (one capture's follow-up at a time){behind}"
    if stage == "analysis_queued":
        return f"waiting for an analysis worker ([coordinator] analysis_workers, all busy){behind}"
    state = stage or str(cap.get("state"))
    return f"running now: {IDLE_ON_WORKER.get(state, IDLE_ON_WORKER[CaptureState.ANALYSING.value])}"


WAITS = {
    "capture_in_flight": "a capture of the job in flight, one at a time",
    "min_arm_gap": "the job's gap between arms (arming.min_arm_gap_s)",
    "cooldown": "its own cooldown (arming.cooldown_s)",
    "captured_unchanged": "a change: captured already, captured again once it grows by arming.recapture_growth "
                          "or names new ranks",
    "hourly_cap": "the job's hourly capture cap (arming.max_captures_per_hour)",
    "byte_cap": "the job's hourly byte cap (arming.max_capture_bytes_per_hour)",
    "larger_than_byte_cap": "nothing it can get: its capture is larger than the hourly byte cap",
    "explained_by_ranks": "nothing while a known slow rank explains it: the job is slower because a rank a verdict "
                          "named is, within host load of the level at that verdict; captured once that no longer "
                          "holds",
    "explained_by_level": "nothing while the job's latest verdict, within the hour, found no suspect rank at a level "
                          "this one is within host load of; captured once that no longer holds",
    "explained_by_host_load": "nothing while its hosts' CPU load explains it: the run queue per core rose as much "
                              "as the job slowed (daemon/profwatch/core/fleet/host_load.py); captured once that no "
                              "longer holds",
    "culprit_rotates": "nothing: the culprit rotates (load imbalance), not captured again",
    "kind_not_armed": "nothing: its kind is not in arming.arm_on (reported only)",
    "stalled_rank_not_capturable": "nothing: a stalled rank never reaches a capture window (reported only)",
    "below_min_magnitude": "nothing: below arming.min_magnitude (reported only)",
    "mode_off": "nothing: arming.mode is off",
    "stalled_rank_in_capture": "a stalled rank of its capture to report again",
}
"""What an episode waiting for each reason of the arming policy waits for, in words."""


REFERENCE_WAITS = {
    "disabled": "nothing: [reference] enabled = false",
    "not_act_mode": "nothing: arming.mode is not act",
    "episode_open": "the job to be healthy: an anomaly episode is open",
    "no_baseline": "the detector to know the job's baseline step time and a recent one",
    "off_baseline": "the step time to be within [reference] step_time_tolerance of the baseline",
    "settling": "the job to stay steady for [reference] steady_s",
    "capture_in_flight": "the job's capture in flight, one at a time",
    "retry_wait": "[reference] retry_after_s since its last try, which did not end analysed",
    "byte_cap": "the job's hourly byte cap, arming.max_capture_bytes_per_hour",
}
"""What a job's reference capture waiting for each reason of ``core/changes/reference.py: decide_reference``
waits for, in words (the reason word stays first: ``status --json`` and docs/reference.md use it)."""
REFERENCE_ENDED = "job_ended: none will come, the job ended (its ranks left or went silent) until it runs again"
"""The reference line of a job ``decide_reference`` found ended: it waits for nothing."""


def render_reference(ref: Mapping[str, Any]) -> list[str]:
    """One job's reference capture (``ReferenceDesk.view``): the newest (capture, generation, age, step time), the
    one in flight, else what it waits for (docs/reference.md)."""
    latest = ref.get("latest")
    if latest:
        st = latest.get("step_time_s")
        head = (f"  {ref['job_id']}: {latest['capture_id']} (generation {latest['generation']}, "
                f"{float(latest['age_s']):.0f} s old" + (f", step time {float(st):.4g} s" if st else "") + ")")
    else:
        head = f"  {ref['job_id']}: none yet"
    if ref.get("in_flight"):
        head += f"; taking {ref['in_flight']}"
    elif ref.get("waiting") == "job_ended":
        head += f"; {REFERENCE_ENDED}"
    elif ref.get("waiting") and ref["waiting"] != "fresh":
        why = REFERENCE_WAITS.get(str(ref["waiting"]))
        head += f"; waits: {ref['waiting']}" + (f" (for {why})" if why else "")
    return [head]


def render_episode(ep: Mapping[str, Any]) -> list[str]:
    """One episode: kind, ranks and stage, magnitude, since when; its captures; what it waits for and until when
    (open), or how it ended (closed)."""
    ranks = f"ranks {ep['ranks'][:8]}" if ep.get("ranks") else "job-wide"
    scope = f" stage {ep['scope']}" if ep.get("scope") and not str(ep["scope"]).startswith("ranks:") else ""
    head = (f"  {ep['episode_id']} {ep['kind']} {ranks}{scope} {float(ep['magnitude']):+.0%} "
            f"(peak {float(ep['peak_magnitude']):+.0%}) since step {ep['opened_step']}, {ep.get('reports', 1)} "
            f"report(s)")
    caps = ep.get("captures") or []
    done = ", ".join(f"{c['capture_id']} ({c['status'] or 'in flight'}" + _named_text(c.get("named"), ep.get("ranks"))
                     + ")" for c in caps[-3:])
    lines = [head]
    if ep.get("closed_unix_s") is not None:
        lines.append(f"    closed ({ep.get('close_reason')}); " + (f"captured: {done}" if caps else
                     f"never captured (waited for: {ep.get('waiting') or '-'})"))
        return lines
    if caps:
        lines.append(f"    captured: {done}")
    if ep.get("rotation"):
        lines.append(f"    culprit rotates: ranks {', '.join(map(str, ep['rotation']))}: load imbalance, not captured "
                     "again")
    follow = ep.get("follow_ranks") or []
    if follow:
        given = ep.get("follow_count")
        count = given if isinstance(given, int) else len(follow)
        shown = ", ".join(map(str, follow[:16])) + (f", ... ({count} ranks)" if count > 16 else "")
        lines.append(f"    follow-up queued: its last capture's ranks waited for ranks {shown}, not captured")
    wait = ep.get("waiting")
    if wait and (ep.get("queue_position") or wait != "capture_in_flight"):
        lines.append("    " + render_wait(str(wait), ep.get("waiting_in_s"), ep.get("waiting_behind"),
                                         ep.get("queue_position")))
    return lines


def _named_text(named: object, episode_ranks: object) -> str:
    """What a capture's verdict named, beside the episode's own ranks: ``, names rank 1`` (up to 4 ranks, then a
    count), and ``, not rank 0`` when the episode names ranks and the verdict named none of them (the episode's
    ranks were not confirmed). Empty when it named nobody."""
    if not isinstance(named, (list, tuple)) or not named:
        return ""
    ranks = [int(r) for r in named]
    shown = ", ".join(map(str, ranks[:4])) + (f" (+{len(ranks) - 4} more)" if len(ranks) > 4 else "")
    text = f", names rank{'s' if len(ranks) > 1 else ''} {shown}"
    own = [int(r) for r in episode_ranks] if isinstance(episode_ranks, (list, tuple)) else []
    if own and not set(own) & set(ranks):
        text += f", not rank{'s' if len(own) > 1 else ''} " + ", ".join(map(str, own[:4])) + (
            " ..." if len(own) > 4 else "")
    return text


def wait_phrase(wait: str, past: bool = False) -> str:
    """A reason of :data:`WAITS` in words: ``waits for the job's gap between arms (arming.min_arm_gap_s)``
    (``waited for ...`` when ``past``), or, for a reason that waits for nothing (the episode is held, not queued),
    ``held while a known slow rank explains it: ...`` / ``held: the culprit rotates ...`` ("waits for nothing while
    ..." read as if the episode waited for nothing at all). An unknown reason is returned as given (``waited for``
    it when ``past``)."""
    text = WAITS.get(wait)
    if text is None:
        return f"waited for {wait}" if past else wait
    if text.startswith("nothing"):
        return "held" + text[len("nothing"):]
    return ("waited for " if past else "waits for ") + text


def render_wait(wait: str, left_s: object, behind: object = None, position: object = None) -> str:
    """What an open episode waits for, in words: a reason of the arming policy (:data:`WAITS`: ``waits for the
    job's gap between arms (arming.min_arm_gap_s), 29 s left``), or an arm that could not be planned or written
    (``refused: ...``, ``plan_failed: ...``: ``arm failed (refused: only 3/4 ranks are live); retried in 29 s``)."""
    secs = f"{left_s:.0f} s" if isinstance(left_s, (int, float)) and not isinstance(left_s, bool) else ""
    if wait in WAITS:
        line = wait_phrase(wait) + (f", {secs} left" if secs else "")
    else:
        line = f"arm failed ({wait}); " + (f"retried in {secs}" if secs else "retried at the next pass")
    line += f", queued behind {behind}" if behind else ""
    return line + (f" (#{position} in the job's capture queue)" if position else "")


def render_status(snap: Mapping[str, Any]) -> list[str]:
    """The whole ``status`` text: jobs, nodes, captures, episodes, coordinator counters."""
    lines: list[str] = []
    for job in snap.get("jobs", []):
        lines += render_job(job)
    if not snap.get("jobs"):
        lines.append("jobs: none (no rank has said hello to this coordinator)")
    lines += render_nodes(snap.get("nodes", []), snap.get("ingest_bind"))
    if snap.get("captures"):
        lines.append("captures (newest last):")
        for cap in snap["captures"]:
            lines += render_capture(cap)
    if snap.get("episodes"):
        lines.append("episodes (open ones in capture order, then the last closed; README: episodes):")
        for ep in snap["episodes"]:
            lines += render_episode(ep)
    if snap.get("references"):
        lines.append("reference captures (docs/reference.md):")
        for ref in snap["references"]:
            lines += render_reference(ref)
    cnt = snap.get("counters") or {}
    lines.append(f"coordinator: received={cnt.get('received', 0)} rejected={cnt.get('rejected', 0)} "
                 f"lost_batches={cnt.get('lost_batches', 0)}")
    return lines


def render_offline_status(why: str, state: Mapping[str, Any], now: float, *, refused: bool = True) -> list[str]:
    """``status`` while the coordinator is down: a first line that says so and that what follows is its last
    recorded state, with that state's time, then the jobs, nodes and captures its state db holds (``why``: the
    control call's message, naming the endpoint; ``refused``: nothing listens there, so it is not running, else it
    did not answer in time; ``state``:
    ``adapters/store/state_reader.py: OfflineStatus.to_json``; ``now``: unix s, for the ages)."""
    down = "is not running" if refused else "does not answer (stopped, hung or unreachable)"
    lines = [f"the coordinator {down} ({why}): what follows is its last recorded state, "
             f"as of {_when(state.get('recorded_unix_s'), now)}, read from its state db {state.get('state_db')}"]
    jobs = state.get("jobs") or []
    lines.append("jobs (as last recorded):" if jobs else "jobs: none recorded")
    for j in jobs:
        left = f" ({j['left']} left)" if j.get("left") else ""
        step = "-" if j.get("last_step") is None else j["last_step"]
        lines.append(f"  {j['job_id']} world_size={j['world_size']} generation={j.get('generation', 0)}: "
                     f"{j.get('ranks', 0)} ranks{left}, last step {step}, last heard {_when(j.get('seen_unix_s'), now)}")
    nodes = state.get("nodes") or []
    lines.append("nodes (as last recorded):" if nodes else "nodes: none recorded")
    for n in nodes:
        lines.append(f"  {n['node_id']} ({n.get('hostname') or '?'}) last heard {_when(n.get('last_seen_unix_s'), now)}")
    caps = state.get("captures") or []
    if caps:
        lines.append("captures (newest last, as last recorded):")
    for c in caps:
        lines.append(f"  {c['capture_id']:<32} {c['state']} since {_when(c.get('state_since_unix_s'), now)}; "
                     f"job={c['job_id']} start_step={c['start_step']} reason={c['reason']}")
        if c.get("outcome"):
            lines.append(f"    {c['outcome']}")
    lines += [f"note: {n}" for n in state.get("notes") or ()]
    return lines
