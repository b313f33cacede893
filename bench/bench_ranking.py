"""Benchmark of the verdicts: accuracy, false secondary suspects, kind accuracy, impact and cost (prints numbers).

Part A, ranking only, on generated batches: timelines from ``profwatch.simulate.ascend_tree.build_timelines`` (kernel
noise 1-5 %, slowdowns 3-25 %, 8-64 ranks, one or two slow ranks, a host-bound rank, or none) turned into
``ClusterTimeSummary`` rows by the simulator's emulation (``cluster_time_summary``), slow_rank votes EMULATED with
the Dixon Q-test of msprof-analyze (``emulate_slow_rank``). Prints top-1 (one slow rank), both-found (two),
false secondary suspects per alert (innocent ranks named beside the real ones, per batch that named anyone;
goal <= 1 %), alerts on balanced batches, kind accuracy, and the same by pooled separation (the slow rank's robust
z of computation + free averaged over the steps against the innocent ranks: goal top-1 >= 99 % from 5 sigma; two
yardsticks of the noise, see ``separation``), and how often a rank's worst step is dropped from its pooled value
(innocent and slow ranks; designed for ~2 %).

Part B, impact: pairs of batches with and without the slowdown (same seed, so the same noise): predicted saving
against the measured step-time difference, by size of the saving.

Part C, cost: ``judge_batch`` wall and CPU time at 256 .. 16,384 ranks (4 steps; issue 13 goal <= 0.5 s at
16,384).

Part D (``--msprof N``), end to end with the real msprof-analyze 26.2.0 on the first N batches of part A written
to disk: accuracy and the time from "batch complete" to "alert payload" minus the tool's own time.

Usage: ``python bench/bench_ranking.py [--per-cell 6] [--steps 4] [--msprof 0] [--seed 1]``.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "daemon"))

from profwatch.core.verdict.evidence import ClusterEvidence, RankStepSummary
from profwatch.core.verdict.ranking import RankingSettings, judge_batch
from profwatch.core.verdict.robust import mad_sigma, median, within_sigma
from profwatch.core.verdict.signals import measure_signals
from profwatch.simulate.ascend_tree import CollectiveSegment, RankTimeline, build_timelines, cluster_time_summary

DIXON_CRIT = {4: 0.920, 5: 0.823, 6: 0.744, 7: 0.680, 8: 0.723, 9: 0.676, 10: 0.638, 11: 0.707, 12: 0.675,
              13: 0.649, 14: 0.672, 16: 0.629, 20: 0.568, 32: 0.473, 64: 0.382, 100: 0.341}
WORLDS = (8, 16, 32, 64)
NOISES = (0.01, 0.03, 0.05)
SLOWDOWNS = (0.03, 0.05, 0.10, 0.25)


def instance_durations(tls: list[RankTimeline]) -> dict[str, dict[int, float]]:
    inst: dict[str, dict[int, float]] = defaultdict(dict)
    for tl in tls:
        for st in tl.steps:
            for seg in st.segments:
                if isinstance(seg, CollectiveSegment):
                    inst[f"{st.step}/{seg.name}"][tl.rank] = (seg.end_ns - seg.start_ns) / 1e3
    return inst


def _crit(n: int) -> float:
    best = min(DIXON_CRIT)
    for k in sorted(DIXON_CRIT):
        if k <= n:
            best = k
    return DIXON_CRIT[best]


def emulate_slow_rank(inst: dict[str, dict[int, float]]) -> dict[int, int]:
    """EMULATION of msprof-analyze slow_rank: Dixon's Q-test (n <= 100) for a low outlier, one vote to the rank
    holding the minimum; 3-sigma above 100 ranks."""
    votes: dict[int, int] = defaultdict(int)
    for durs in inst.values():
        n = len(durs)
        items = sorted(durs.items(), key=lambda kv: kv[1])
        x = [v for _, v in items]
        if n <= 2 or len(set(x)) <= 3:
            continue
        if n <= 100:
            lo, hi = (1, -1) if n <= 7 else (1, -2) if n <= 10 else (2, -2) if n <= 13 else (2, -3)
            q = (x[lo] - x[0]) / ((x[hi] - x[0]) or 1)
            if q > _crit(n):
                votes[items[0][0]] += 1
        else:
            m, sd = statistics.mean(x), statistics.stdev(x)
            for r, v in items:
                if v < m - 3 * sd:
                    votes[r] += 1
    return dict(votes)


def separation(rows: list[RankStepSummary], slow: set[int]) -> tuple[float, float]:
    """Smallest robust z of the slow ranks' computation + free averaged over the steps (per-step excess over the
    step median, fraction of step time) against the innocent ranks, with two yardsticks of the noise:
    ``(between, within)``. ``between``: the MAD scale of the innocent ranks' averages (the issue's yardstick; at 8
    ranks a MAD of 7 values, itself off by 2x now and then). ``within``: the innocent ranks' step-to-step sigma
    (chi-square-unbiased, ``within_sigma``) over ``sqrt(steps)``, the sd of an average of independent steps;
    estimated from ranks x steps values, so precise at 8 ranks too."""
    steps = sorted({r.step for r in rows})
    by_step: dict[int, list[RankStepSummary]] = defaultdict(list)
    for r in rows:
        by_step[r.step].append(r)
    med = {s: median(x.computation_us + x.free_us for x in by_step[s]) for s in steps}
    step_t = {s: median(x.step_time_us for x in by_step[s]) for s in steps}
    per: dict[int, list[float]] = defaultdict(list)
    for r in rows:
        per[r.rank].append((r.computation_us + r.free_us - med[r.step]) / step_t[r.step])
    pooled = {k: sum(v) / len(v) for k, v in per.items()}
    innocent = [v for k, v in pooled.items() if k not in slow]
    sigma = mad_sigma(innocent) or 1e-12
    within = within_sigma([v for k, v in per.items() if k not in slow])[0] / math.sqrt(len(steps)) or 1e-12
    center = median(innocent)
    return (min((pooled[k] - center) / sigma for k in slow), min((pooled[k] - center) / within for k in slow))


def scenarios(per_cell: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    out = []
    for world in WORLDS:
        for noise in NOISES:
            for slowdown in SLOWDOWNS:
                for kind in ("one", "two", "host", "balanced"):
                    for _ in range(per_cell if kind != "balanced" else max(1, per_cell // 2)):
                        a, b = rng.sample(range(world), 2)
                        spec: dict[str, Any] = {"world": world, "noise": noise, "slowdown": slowdown, "kind": kind,
                                                "seed": rng.randrange(1 << 30), "slow": {}, "host": {}}
                        if kind in ("one", "two"):
                            spec["slow"][a] = 1 + slowdown
                        if kind == "two":
                            spec["slow"][b] = 1 + slowdown * rng.uniform(1.0, 2.0)
                        if kind == "host":
                            spec["host"][a] = slowdown
                        out.append(spec)
    return out


def part_a(specs: list[dict[str, Any]], steps: int, settings: RankingSettings) -> None:
    res: dict[str, list[bool]] = defaultdict(list)
    by_sep: dict[str, list[bool]] = defaultdict(list)
    false_named = alerts = 0
    kind_ok: list[bool] = []
    misses: list[str] = []
    drops: dict[str, list[int]] = defaultdict(lambda: [0, 0])  # innocent / slow ranks: [steps dropped, ranks]
    for spec in specs:
        tls = build_timelines(world_size=spec["world"], slow_ranks=spec["slow"], host_bound_ranks=spec["host"],
                              steps=steps, seed=spec["seed"], noise=spec["noise"])
        rows = cluster_time_summary(tls)
        ev = ClusterEvidence(kind="ascend_pt", summaries=rows, slow_rank_votes=emulate_slow_rank(instance_durations(tls)))
        v = judge_batch(ev, settings=settings)
        named = [s.rank for s in v.suspects]
        truth = set(spec["slow"]) | set(spec["host"])
        table = measure_signals(rows, trim_z=settings.trim_z)
        for r in table.n_steps:
            d = drops["slow" if r in truth else "innocent"]
            d[0] += r in table.left_out
            d[1] += 1
        if named:
            alerts += 1
            false_named += len(set(named) - truth)
        if spec["kind"] == "balanced":
            res["balanced: nobody named"].append(not named)
            continue
        sep, sep_within = separation(rows, truth)
        ok = set(named[:2]) == truth if spec["kind"] == "two" else bool(named) and named[0] in truth
        label = {"one": "one slow rank: top-1", "two": "two slow ranks: both found",
                 "host": "host-bound rank: top-1"}[spec["kind"]]
        res[label].append(ok)
        for yardstick, z in (("MAD", sep), ("within", sep_within)):
            bucket = ">= 5" if z >= 5 else "3-5" if z >= 3 else "< 3"
            by_sep[f"{label} @ {yardstick} separation {bucket}"].append(ok)
            if z >= 5:
                by_sep[f"any slow rank: top-1 @ {yardstick} separation >= 5"].append(ok)
        want = "host" if spec["kind"] == "host" else "compute"
        kind_ok += [s.kind == want for s in v.suspects if s.rank in truth]
        if not ok and sep_within >= 5 and len(misses) < 8:
            misses.append(f"{ {k: spec[k] for k in ('world', 'noise', 'slowdown', 'kind')} } sep {sep:.1f} "
                          f"(within {sep_within:.1f}) -> "
                          f"{[(s.rank, s.kind, s.evidence.get('z')) for s in v.suspects[:3]]}")
    print(f"Part A: ranking only, {len(specs)} generated batches, {steps} steps, worlds {WORLDS}, kernel noise "
          f"{NOISES}, slowdowns {SLOWDOWNS} (slow_rank votes EMULATED)")
    for label, vals in sorted(res.items()):
        print(f"  {label:<46} {sum(vals):>5}/{len(vals):<5} = {100 * sum(vals) / len(vals):6.1f} %")
    for label, vals in sorted(by_sep.items()):
        print(f"  {label:<62} {sum(vals):>5}/{len(vals):<5} = {100 * sum(vals) / len(vals):6.1f} %")
    print("  (separation: the slow ranks' pooled own-work excess in noise sigmas; MAD = the spread of the innocent ranks'\n"
          "   averages, within = their step-to-step sigma / sqrt(steps); goal: top-1 >= 99 % from 5 sigma)")
    print(f"  false secondary suspects per alert: {false_named}/{alerts} = "
          f"{100 * false_named / max(alerts, 1):.2f} % (goal <= 1 %)")
    print(f"  kind accuracy (compute / host as generated): {sum(kind_ok)}/{len(kind_ok)} = "
          f"{100 * sum(kind_ok) / max(len(kind_ok), 1):.1f} %")
    for who, (n_drop, n_ranks) in sorted(drops.items()):
        print(f"  {who} ranks with a step dropped from the pooled own work: {n_drop}/{n_ranks} = "
              f"{100 * n_drop / max(n_ranks, 1):.1f} %")
    for m in misses:
        print("  miss:", m)


def part_b(seed: int, steps: int, cps: float | None) -> None:
    rng = random.Random(seed)
    errs: dict[str, list[float]] = defaultdict(list)
    abs_err: dict[str, list[float]] = defaultdict(list)
    for _ in range(60):
        world = rng.choice(WORLDS)
        slow = {rng.randrange(world): 1 + rng.choice(SLOWDOWNS)}
        noise = rng.choice(NOISES)
        s = rng.randrange(1 << 30)
        base = build_timelines(world_size=world, steps=steps, seed=s, noise=noise)
        slowed = build_timelines(world_size=world, steps=steps, seed=s, noise=noise, slow_ranks=slow)
        # collectives per step as the msprof runner reads it from COMMUNICATION_OP / STEP_TIME (4 here); without
        # it the estimate assumes 1 and is optimistic
        ev = ClusterEvidence(kind="ascend_pt", summaries=cluster_time_summary(slowed), collectives_per_step=cps)
        v = judge_batch(ev, world_size=world)

        def mean_step(tls: list[RankTimeline]) -> float:
            return sum(x.end_ns - x.start_ns for x in tls[0].steps) / len(tls[0].steps) / 1e9

        measured = mean_step(slowed) - mean_step(base)
        predicted = v.impact["saving_s_per_step"] if v.impact else 0.0
        pct = 100 * measured / mean_step(slowed)
        bucket = ">= 10 % of step" if pct >= 10 else "5-10 % of step" if pct >= 5 else "< 5 % of step"
        errs[bucket].append((predicted - measured) / measured)
        abs_err[bucket].append(100 * abs(predicted - measured) / mean_step(slowed))
    print(f"\nPart B: impact, predicted saving vs measured step-time difference (pairs with / without the slowdown, "
          f"{steps} steps, collectives per step {'known (4)' if cps else 'unknown'})")
    for bucket, e in sorted(errs.items()):
        within = sum(abs(x) <= 0.10 for x in e)
        print(f"  saving {bucket:<16} n={len(e):<3} median error {100 * statistics.median(e):+5.1f} %, max |error| "
              f"{100 * max(abs(x) for x in e):5.1f} %, within 10 %: {within}/{len(e)}; |error| in % of the step: "
              f"median {statistics.median(abs_err[bucket]):.2f}, max {max(abs_err[bucket]):.2f}")


def synthetic(world: int, steps: int, seed: int, slow: dict[int, float]) -> ClusterEvidence:
    rng = random.Random(seed)
    rows = []
    for step in range(1, steps + 1):
        comp = [40_000 * slow.get(r, 1.0) * (1 + 0.02 * rng.gauss(0, 1)) for r in range(world)]
        free = [500 * (1 + 0.02 * rng.gauss(0, 1)) for _ in range(world)]
        own = [c + f for c, f in zip(comp, free, strict=True)]
        last = max(own)
        dur = [last - o + 4000 for o in own]
        short = min(dur)
        st = max(o + d for o, d in zip(own, dur, strict=True))
        rows += [RankStepSummary(r, step, st, comp[r], dur[r], dur[r] - short, short, free[r]) for r in range(world)]
    return ClusterEvidence(kind="ascend_pt", summaries=rows)


def part_c(steps: int) -> None:
    print(f"\nPart C: judge_batch cost ({steps} steps, one slow rank; goal <= 0.5 s at 16,384 ranks)")
    prev = None
    for world in (256, 1024, 4096, 16384):
        ev = synthetic(world, steps, world, {7: 1.05})
        walls, cpus = [], []
        for _ in range(3):
            w0, c0 = time.perf_counter(), time.process_time()
            v = judge_batch(ev)
            walls.append(time.perf_counter() - w0)
            cpus.append(time.process_time() - c0)
        wall, cpu = min(walls), min(cpus)
        growth = f", x{wall / prev:.1f} for 4x ranks" if prev else ""
        prev = wall
        print(f"  {world:>6} ranks: wall {wall:6.3f} s, cpu {cpu:6.3f} s{growth}; named {[s.rank for s in v.suspects]}")


def part_d(specs: list[dict[str, Any]], steps: int, settings: RankingSettings) -> None:
    from profwatch.adapters.fs.rank_dir_fs import scan_tree
    from profwatch.analysis.facade import AnalysisSettings, analyze_batch
    from profwatch.core.alerts.alertmanager import AlertBook
    from profwatch.core.alerts.events import make_cloudevent
    from profwatch.simulate.ascend_tree import generate_cluster

    asettings = AnalysisSettings(ranking=settings, report=True)
    asettings.msprof.advisor = False
    asettings.msprof.max_concurrent_runs = 2
    ok: list[bool] = []
    overhead: list[float] = []
    tool: list[float] = []
    statuses: dict[str, int] = defaultdict(int)
    with tempfile.TemporaryDirectory(prefix="pwbench") as tmp:
        for i, spec in enumerate(specs):
            root = Path(tmp) / f"b{i}"
            generate_cluster(root / "prof", world_size=spec["world"], slow_ranks=spec["slow"],
                             host_bound_ranks=spec["host"], steps=steps, seed=spec["seed"], noise=spec["noise"],
                             capture_id=f"cap{i}")
            t_complete = time.monotonic()
            batches = [b for b in scan_tree(root / "prof", world_size=spec["world"]) if b.status == "complete"]
            if not batches:
                statuses["not complete"] += 1
                continue
            res = analyze_batch(batches[0], work_dir=root / "work", settings=asettings,
                                armed_steps=list(range(1, steps + 1)))
            event = make_cloudevent(res.event_type, "bench", res.alert_data(), source="//bench", now_unix_s=time.time())
            AlertBook(cluster="bench", resend_interval_s=60).apply(event, time.time())
            elapsed = time.monotonic() - t_complete
            tool.append(res.timings_s.get("tool", 0.0))
            overhead.append(elapsed - tool[-1])
            statuses[res.status] += 1
            truth = set(spec["slow"]) | set(spec["host"])
            named = [s.rank for s in res.suspects]
            ok.append(set(named[:len(truth)]) == truth if truth else not named)
    print(f"\nPart D: end to end with the real msprof-analyze (cluster_time_summary, slow_rank, communication_matrix; "
          f"advisor off) on {len(specs)} batches")
    print(f"  right verdict {sum(ok)}/{len(ok)}; statuses {dict(statuses)}")
    print(f"  batch complete -> alert payload minus tool time: median {statistics.median(overhead):.3f} s, "
          f"max {max(overhead):.3f} s; tool time median {statistics.median(tool):.1f} s")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--per-cell", type=int, default=6, help="batches per (world, noise, slowdown, kind) cell")
    ap.add_argument("--steps", type=int, default=4, help="captured steps per batch (the default window: 4)")
    ap.add_argument("--msprof", type=int, default=0, help="batches for the end-to-end part D (0: skip)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--skip-cost", action="store_true")
    args = ap.parse_args()
    import logging

    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    settings = RankingSettings()
    specs = scenarios(args.per_cell, args.seed)
    t0 = time.monotonic()
    part_a(specs, args.steps, settings)
    part_b(args.seed, args.steps, 4.0)
    part_b(args.seed, args.steps, None)
    if not args.skip_cost:
        part_c(args.steps)
    if args.msprof:
        small = [s for s in specs if s["world"] <= 16]
        part_d(random.Random(args.seed).sample(small, min(args.msprof, len(small))), args.steps, settings)
    print(f"\n(total {time.monotonic() - t0:.0f} s)")


if __name__ == "__main__":
    main()
