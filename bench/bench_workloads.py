"""Benchmark of detection and capture on the job shapes real jobs have (prints a table; no assertions).

Replays generated telemetry (``daemon/profwatch/simulate/telemetry.py``) of each family through ``profwatch
replay``'s path (``replay_lines``: the coordinator's detectors, episodes, arming policy and capture planner, default
config) and prints per family: hours of healthy traffic (before the first injected change), false pages per hour
of it (an arm, or an event the event table marks as an alert, before any change), arms in all, the reports of the
new kinds (``structural_imbalance``, ``drift``), and for each injected change: the detection delay (steps and
seconds from its onset to the first report that names it: a ``step_regression`` for a job-wide change, a
``rank_outlier`` or a unit's ``step_regression`` naming the rank, any of them for a rotating culprit; steps are
counted from the onset step to the report's step for a training family, where a drift may have made each step
several times longer than the usual job's 0.5 s), the usual delay (the same change on a steady plain training job,
measured here: 3 steps there for a job-wide one) and whether it was *captured*: the first arm
after its onset covers steps after the onset and the changed ranks.

Families: ``plain_burst`` (4 ranks: +25 % job-wide load burst for 60 steps, then one rank 50 % slower),
``serving_tp`` (tensor parallel 4, ``--hours`` of healthy traffic, then one rank 30 % slower),
``serving_dp`` (4 independent replicas, idem, then one replica 30 % slower), ``serving_tp_nowork`` /
``serving_dp_nowork`` (the same traffic without the optional ``work`` field: compared within load bands), ``pipeline`` (8 ranks, the last
stage's 2 ranks 15 % slower from step 0, later +25 % on a middle-stage rank), ``drift_slow`` (+0.05 %/step, a
sudden +11 % during it), ``drift_fast`` (+0.3 %/step, a sudden +11 % during it), ``requeue`` (4 ranks, then the
same job id requeued on other nodes with 2 ranks, one of them 50 % slower), ``moe_slow`` / ``moe_fast`` (the slow
rank moves every 150 / 20 steps), ``fast_5ms`` (5 ms steps with host jitter, then +15 % job-wide).

Usage: ``python bench/bench_workloads.py [--hours 8] [--only serving_tp,pipeline] [--seed 1]``; about 3-4 minutes
on 2 cores at the defaults.
"""

from __future__ import annotations

import argparse
import functools
import math
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "daemon"))

from profwatch.commands.replay import ReplayConfig, replay_lines
from profwatch.core.alerts.event_types import BY_NAME
from profwatch.core.fleet.telemetry import dump_jsonl
from profwatch.simulate.telemetry import (
    ServingScenario,
    TelemetryScenario,
    iter_serving_telemetry,
    iter_telemetry,
)


@dataclass(frozen=True)
class Change:
    """An injected change: ``what`` (text), onset ``at_s`` (seconds after the first record), the ``ranks`` it
    slows (() = job-wide), the report kinds that name it, and the key of its usual delay."""

    what: str
    at_s: float
    ranks: tuple[int, ...]
    kinds: tuple[str, ...]
    usual: str | None = None
    at_step: int | None = None
    """For training families: the onset step (its first arrival in epoch ``epoch`` is the onset time)."""
    epoch: int = 0


@dataclass
class Family:
    name: str
    records: Callable[[], Iterable[dict[str, Any]]]
    changes: list[Change] = field(default_factory=list)
    step_s: float = 0.5
    """The usual step time (seconds), to give delays in steps."""
    t0_unix_s: float | None = None
    """What ``Change.at_s`` counts from (the generator's start; default: the first record)."""


def families(hours: float, seed: int) -> list[Family]:
    out: list[Family] = []
    plain = TelemetryScenario(job_id="plain", world_size=4, steps=2400, cv=0.03, step_time_s=0.5, seed=seed,
                              slowdown=0.25, slowdown_from_step=1000, slowdown_until_step=1060, slow_rank=2,
                              slow_rank_factor=1.5, slow_rank_from_step=1130)
    out.append(Family("plain_burst", lambda: iter_telemetry(plain), [
        Change("+25% job-wide burst (60 steps)", 0, (), ("step_regression",), "job", 1000),
        Change("rank 2 +50%", 0, (2,), ("rank_outlier", "step_regression"), "rank", 1130)]))
    dur = hours * 3600.0
    tp = ServingScenario(job_id="serve_tp", replicas=1, tp=4, duration_s=dur + 1800, step_time_s=0.2,
                         slow_rank=1, slow_factor=1.3, slow_from_s=dur, seed=seed)
    out.append(Family("serving_tp", lambda: iter_serving_telemetry(tp), [
        Change("TP rank 1 +30% forward", dur, (1,), ("rank_outlier",), None)], tp.step_time_s, tp.t0_unix_s))
    dp = ServingScenario(job_id="serve_dp", replicas=4, tp=1, duration_s=dur + 1800, step_time_s=0.25,
                         slow_replica=2, slow_factor=1.3, slow_from_s=dur, seed=seed)
    out.append(Family("serving_dp", lambda: iter_serving_telemetry(dp), [
        Change("replica 2 +30%", dur, (2,), ("step_regression",), None)], dp.step_time_s, dp.t0_unix_s))
    for tag, base in (("tp", tp), ("dp", dp)):  # the same traffic without the optional `work` field
        bare = replace(base, job_id=f"serve_{tag}_nowork", with_work=False)
        ranks, kinds = ((1,), ("rank_outlier",)) if tag == "tp" else ((2,), ("step_regression",))
        out.append(Family(f"serving_{tag}_nowork", functools.partial(iter_serving_telemetry, bare), [
            Change(f"{'TP rank 1 +30% forward' if tag == 'tp' else 'replica 2 +30%'} (no work field)", dur, ranks,
                   kinds, None)], bare.step_time_s, bare.t0_unix_s))
    pp = TelemetryScenario(job_id="pipeline", world_size=8, steps=3000, cv=0.02, step_time_s=0.5, seed=seed,
                           rank_compute_factors=(1, 1, 1, 1, 1, 1, 1.15, 1.15),
                           roles=("pp0", "pp0", "pp1", "pp1", "pp2", "pp2", "pp3", "pp3"),
                           slow_rank=3, slow_rank_factor=1.25, slow_rank_from_step=1500)
    out.append(Family("pipeline", lambda: iter_telemetry(pp), [
        Change("middle-stage rank 3 +25%", 0, (3,), ("rank_outlier",), "rank25", 1500)]))
    ds = TelemetryScenario(job_id="drift_slow", world_size=4, steps=8000, cv=0.03, step_time_s=0.5, seed=seed,
                           drift_per_step=0.0005, slowdown=0.11, slowdown_from_step=6000)
    out.append(Family("drift_slow", lambda: iter_telemetry(ds), [
        Change("+11% job-wide during the drift", 0, (), ("step_regression",), "job11", 6000)]))
    dfast = TelemetryScenario(job_id="drift_fast", world_size=4, steps=2000, cv=0.03, step_time_s=0.5, seed=seed,
                              drift_per_step=0.003, drift_from_step=500, slowdown=0.11, slowdown_from_step=1300)
    out.append(Family("drift_fast", lambda: iter_telemetry(dfast), [
        Change("+11% job-wide during the drift", 0, (), ("step_regression",), "job11", 1300)]))
    rq = TelemetryScenario(job_id="requeue", world_size=4, steps=1500, cv=0.03, step_time_s=0.5, seed=seed,
                           restart_after_step=1500, restart_steps=1200, restart_gap_s=120.0, restart_world_size=2,
                           restart_slow_rank=1, restart_slow_rank_from_step=600, with_identity=True,
                           ranks_per_node=2)
    out.append(Family("requeue", lambda: iter_telemetry(rq), [
        Change("after the requeue (2 ranks, other node): rank 1 +50%", 0, (1,),
               ("step_regression", "rank_outlier"), "rank", 600, 1)]))
    for name, every in (("moe_slow", 150), ("moe_fast", 20)):
        moe = TelemetryScenario(job_id=name, world_size=8, steps=2400, cv=0.02, step_time_s=0.5, seed=seed,
                                rotate_every=every, slow_rank_factor=1.5, slow_rank_from_step=800)
        out.append(Family(name, functools.partial(iter_telemetry, moe), [
            Change(f"hot expert +50%, moves every {every} steps", 0, tuple(range(8)),
                   ("rank_outlier", "step_regression"), None, 800)]))
    fast = TelemetryScenario(job_id="fast_5ms", world_size=4, steps=72_000, cv=0.05, step_time_s=0.005, seed=seed,
                             gc_prob=0.02, gc_factor=3.0, loader_stall_prob=0.01, slowdown=0.15,
                             slowdown_from_step=60_000)
    out.append(Family("fast_5ms", lambda: iter_telemetry(fast), [
        Change("+15% job-wide", 0, (), ("step_regression",), None, 60_000)], fast.step_time_s))
    return out


def usual_delays(seed: int) -> dict[str, float]:
    """Detection delay (s) of each change on a steady plain 4-rank (8 for 'rank25') training job."""
    base = TelemetryScenario(job_id="usual", world_size=4, steps=1600, cv=0.03, step_time_s=0.5, seed=seed)
    cases = {"job": (replace(base, slowdown=0.25, slowdown_from_step=1000), (), "step_regression"),
             "job11": (replace(base, slowdown=0.11, slowdown_from_step=1000), (), "step_regression"),
             "rank": (replace(base, slow_rank=2, slow_rank_factor=1.5, slow_rank_from_step=1000), (2,),
                      "rank_outlier"),
             "rank25": (replace(base, world_size=8, cv=0.02, slow_rank=3, slow_rank_factor=1.25,
                                slow_rank_from_step=1000), (3,), "rank_outlier")}
    out: dict[str, float] = {}
    for key, (sc, ranks, kind) in cases.items():
        recs = list(iter_telemetry(sc))
        res = replay_lines(dump_jsonl(recs).splitlines(), ReplayConfig())
        steps = [a["step"] for a in res["anomalies"] if a["kind"] == kind and a["step"] >= 1000
                 and (not ranks or set(ranks) & set(a["ranks"]))]
        out[key] = (steps[0] - 1000 + 1) * sc.step_time_s if steps else math.nan
    return out


def _times(records: list[dict[str, Any]]) -> tuple[dict[tuple[int, int, int], float], float]:
    """(epoch, rank, step) -> arrival time, and the first time; the epoch counts step-counter restarts."""
    at: dict[tuple[int, int, int], float] = {}
    epoch = 0
    last: dict[int, int] = {}
    for r in records:
        if r["step"] < last.get(r["rank"], -1) - 1:
            epoch += 1 if r["rank"] == 0 else 0
        last[r["rank"]] = r["step"]
        at.setdefault((epoch, r["rank"], r["step"]), r["ts_unix_s"])
    return at, min(r["ts_unix_s"] for r in records)


def run_family(fam: Family, usual: dict[str, float]) -> dict[str, Any]:
    t0, c0 = time.perf_counter(), time.process_time()
    records = list(fam.records())
    res = replay_lines(dump_jsonl(records).splitlines(), ReplayConfig())
    at, start = _times(records)
    end = max(r["ts_unix_s"] for r in records)

    def onset_of(c: Change) -> float:
        """The first step of the change: its onset step's first arrival, or (serving, where a replica may be idle
        when the change begins) the first step the changed ranks made after its onset time."""
        if c.at_step is None:
            nominal = (fam.t0_unix_s if fam.t0_unix_s is not None else start) + c.at_s
            return min((t for (_, r, _), t in at.items() if t >= nominal and (not c.ranks or r in c.ranks)),
                       default=nominal)
        return min(t for (e, _, s), t in at.items() if e == c.epoch and s >= c.at_step)

    onsets = [onset_of(c) for c in fam.changes]
    first_change = min(onsets, default=end)
    index: dict[tuple[int, int], list[float]] = {}
    for (_, r, s), t in at.items():
        index.setdefault((r, s), []).append(t)

    def when(ranks: list[int], step: int, after: float = -math.inf) -> float:
        times = sorted(index.get((ranks[0] if ranks else 0, step), []))
        later = [t for t in times if t >= after]
        return later[0] if later else (times[-1] if times else math.nan)

    def timed(items: list[dict[str, Any]]) -> list[tuple[float, dict[str, Any]]]:
        """Each report or arm with the record time replay saw it at (``at_unix_s``); an alert event with the
        arrival of its step (the first at or after the previous one's)."""
        out, cursor = [], -math.inf
        for a in items:
            t = a.get("at_unix_s")
            if t is None:
                t = when(a.get("ranks") or [], a["step"], cursor) if isinstance(a.get("step"), int) else cursor
            if not math.isnan(t):
                cursor = max(cursor, t)
            out.append((t, a))
        return out

    alerts = [e for e in res["episode_events"] if BY_NAME.get(e["type"].split(".")[2]) is not None
              and BY_NAME[e["type"].split(".")[2]].alert]
    arm_times = timed(res["arms"])
    anomaly_times = timed(res["anomalies"])
    false_pages = sum(1 for t, _ in arm_times if t < first_change) + sum(
        1 for t, _ in timed(alerts) if t < first_change)
    healthy_h = (first_change - start) / 3600.0
    kinds = Counter(a["kind"] for a in res["anomalies"])
    rows = []
    for c, onset in zip(fam.changes, onsets, strict=True):
        hits = [(t, a) for t, a in anomaly_times if a["kind"] in c.kinds
                and (not c.ranks or not a["ranks"] or set(c.ranks) & set(a["ranks"]))]
        hits = [(t, a) for t, a in hits if t >= onset]
        delay_s = min((t for t, _ in hits), default=math.nan) - onset
        first_hit = min(hits, key=lambda h: h[0], default=None)
        after = sorted(((t, a) for t, a in arm_times if t >= onset), key=lambda x: x[0])
        captured = False
        first_arm = "none"
        if after:
            t, arm = after[0]
            first_arm = f"{arm['kind']}{arm['ranks'] or ''}"
            rl = arm["rank_list"]
            covers_ranks = rl is None or not c.ranks or bool(set(c.ranks) & set(rl))
            related = (not c.ranks) or (not arm["ranks"]) or bool(set(c.ranks) & set(arm["ranks"]))
            captured = covers_ranks and related
        step_s = fam.step_s
        if c.at_step is not None and first_hit is not None and isinstance(first_hit[1].get("step"), int):
            delay_steps = float(first_hit[1]["step"] - c.at_step + 1)  # counted in steps: steps may be longer there
        else:
            delay_steps = delay_s / step_s if step_s else math.nan
        rows.append({"change": c.what, "delay_s": delay_s, "delay_steps": delay_steps,
                     "usual_s": usual.get(c.usual, math.nan) if c.usual else math.nan, "captured": captured,
                     "first_arm": first_arm})
    return {"family": fam.name, "records": len(records), "healthy_h": healthy_h, "false_pages": false_pages,
            "arms": len(res["arms"]), "kinds": kinds, "changes": rows, "seconds": time.perf_counter() - t0,
            "episodes": len(res.get("episodes") or []), "cpu_s": time.process_time() - c0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hours", type=float, default=8.0, help="hours of healthy serving traffic")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--only", default=None, help="comma-separated family names")
    args = ap.parse_args()
    t0 = time.perf_counter()
    usual = usual_delays(args.seed)
    print("usual delays on a steady plain training job (s): "
          + ", ".join(f"{k} {v:.1f}" for k, v in usual.items()))
    wanted = set(args.only.split(",")) if args.only else None
    print(f"{'family':12s} {'records':>8s} {'healthy h':>9s} {'false pages/h':>13s} {'arms':>5s}  reports of new kinds"
          f" / injected change: delay (usual), captured by the first arm after it")
    for fam in families(args.hours, args.seed):
        if wanted and fam.name not in wanted:
            continue
        r = run_family(fam, usual)
        per_h = r["false_pages"] / r["healthy_h"] if r["healthy_h"] > 0 else math.nan
        new = {k: v for k, v in r["kinds"].items() if k in ("structural_imbalance", "drift")}
        print(f"{r['family']:12s} {r['records']:8d} {r['healthy_h']:9.2f} {per_h:8.2f} ({r['false_pages']:2d})"
              f" {r['arms']:5d}  {dict(new) or ''}  all reports {dict(r['kinds'])} ({r['cpu_s']:.0f} s CPU)")
        for c in r["changes"]:
            usual_txt = f"{c['usual_s']:.1f} s" if not math.isnan(c["usual_s"]) else "-"
            print(f"{'':12s}   {c['change']}: delay {c['delay_s']:.1f} s ({c['delay_steps']:.0f} steps; usual "
                  f"{usual_txt}), captured {'yes' if c['captured'] else 'NO'} (first arm after it: {c['first_arm']})")
    print(f"total {time.perf_counter() - t0:.0f} s wall, {time.process_time():.0f} s CPU")


if __name__ == "__main__":
    main()
