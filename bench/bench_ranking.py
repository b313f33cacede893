"""Benchmark of suspect ranking (prints numbers; no assertions).

Part A, ranking only, on ``--batches`` generated batches (world sizes 4-64, slow factor 1.05x-3x, zero / one / two
slow ranks, kernel noise 1-3 %): timelines from ``daemon.simulate.ascend_tree.build_timelines`` are turned into
``RankStepSummary`` rows with msprof-analyze's ``cluster_time_summary`` definitions (section 5 of
``../shared/docs/msprof-analyze.md``) and slow_rank votes are EMULATED with the Dixon Q-test / 3-sigma rule of
section 6. No msprof-analyze run: this isolates the ranking.

Part B, end to end, on the first ``--msprof`` batches of the same list: the trees are written to disk, scanned
(``scan_tree``), analysed with the real msprof-analyze 26.2.0 (``analyze_batch``) and turned into an Alertmanager
payload. Prints accuracy of ``rank_suspects`` and of the real slow_rank votes alone, and the latency from "batch
complete" to "alert payload ready" minus the tool's own run time.

Usage: ``python bench/bench_ranking.py [--batches 200] [--msprof 40] [--seed 1]``.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from daemon.core.evidence import ClusterEvidence, RankStepSummary
from daemon.core.ranking import RankingSettings, rank_suspects
from daemon.simulate.ascend_tree import CollectiveSegment, RankTimeline, build_timelines

DIXON_CRIT = {4: 0.920, 5: 0.823, 6: 0.744, 7: 0.680, 8: 0.723, 9: 0.676, 10: 0.638, 11: 0.707, 12: 0.675,
              13: 0.649, 14: 0.672, 16: 0.629, 20: 0.568, 32: 0.473, 64: 0.382, 100: 0.341}


def scenarios(n: int, seed: int) -> list[dict[str, Any]]:
    """``n`` batch specs: world, slow {rank: factor}, noise, seed; kinds cycle balanced / one / two."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        world = rng.choice([4, 8, 16, 32, 64])
        kind = ("balanced", "one", "two")[i % 3]
        ranks = rng.sample(range(world), 2)
        slow: dict[int, float] = {}
        if kind in ("one", "two"):
            slow[ranks[0]] = round(rng.uniform(1.05, 3.0), 3)
        if kind == "two":
            slow[ranks[1]] = round(rng.uniform(1.05, 3.0), 3)
        out.append({"i": i, "world": world, "kind": kind, "slow": slow, "noise": round(rng.uniform(0.01, 0.03), 4),
                    "seed": rng.randrange(1 << 30)})
    return out


def _union(intervals: list[tuple[int, int]], a: int, b: int) -> int:
    total, cur_s, cur_e = 0, None, None
    for s, e in sorted((max(a, s), min(b, e)) for s, e in intervals if e > a and s < b):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def summaries_from_timelines(tls: list[RankTimeline]) -> tuple[list[RankStepSummary], dict[str, dict[int, float]]]:
    """msprof-analyze ClusterTimeSummary semantics from generator timelines (µs) + per-instance durations."""
    inst: dict[str, dict[int, float]] = defaultdict(dict)
    for tl in tls:
        for st in tl.steps:
            for seg in st.segments:
                if isinstance(seg, CollectiveSegment):
                    inst[f"{st.step}/{seg.name}"][tl.rank] = (seg.end_ns - seg.start_ns) / 1e3
    mins = {k: min(v.values()) for k, v in inst.items()}
    rows = []
    for tl in tls:
        for st in tl.steps:
            comp = [(s.start_ns, s.end_ns) for s in st.segments if not isinstance(s, CollectiveSegment)]
            comm = [(s.start_ns, s.end_ns) for s in st.segments if isinstance(s, CollectiveSegment)]
            busy = _union(comp + comm, st.start_ns, st.end_ns) / 1e3
            comm_us = _union(comm, st.start_ns, st.end_ns) / 1e3
            wait = tx = 0.0
            for s in st.segments:
                if isinstance(s, CollectiveSegment):
                    k = f"{st.step}/{s.name}"
                    wait += (s.end_ns - s.start_ns) / 1e3 - mins[k]
                    tx += mins[k]
            step_us = (st.end_ns - st.start_ns) / 1e3
            rows.append(RankStepSummary(tl.rank, st.step, step_us, busy - comm_us, comm_us, wait, tx, step_us - busy))
    return rows, inst


def _crit(n: int) -> float:
    keys = sorted(DIXON_CRIT)
    best = keys[0]
    for k in keys:
        if k <= n:
            best = k
    return DIXON_CRIT[best]


def emulate_slow_rank(inst: dict[str, dict[int, float]]) -> dict[int, int]:
    """EMULATION of msprof-analyze slow_rank (section 6): Dixon Q-test (n <= 100) for a low outlier, one vote
    to the rank holding the minimum; 3-sigma above 100 ranks."""
    votes: dict[int, int] = defaultdict(int)
    for durs in inst.values():
        n = len(durs)
        items = sorted(durs.items(), key=lambda kv: kv[1])
        x = [v for _, v in items]
        if n <= 2 or len(set(x)) <= 3:
            continue
        if n <= 100:
            if n <= 7:
                q = (x[1] - x[0]) / ((x[-1] - x[0]) or 1)
            elif n <= 10:
                q = (x[1] - x[0]) / ((x[-2] - x[0]) or 1)
            elif n <= 13:
                q = (x[2] - x[0]) / ((x[-2] - x[0]) or 1)
            else:
                q = (x[2] - x[0]) / ((x[-3] - x[0]) or 1)
            if q > _crit(n):
                votes[items[0][0]] += 1
        else:
            m, sd = statistics.mean(x), statistics.stdev(x)
            for r, v in items:
                if v < m - 3 * sd:
                    votes[r] += 1
    return dict(votes)


def judge(spec: dict[str, Any], ranked: list[int]) -> bool:
    slow = set(spec["slow"])
    if spec["kind"] == "balanced":
        return not ranked
    if spec["kind"] == "one":
        return bool(ranked) and ranked[0] in slow
    return set(ranked[:2]) == slow


def judge_votes(spec: dict[str, Any], votes: dict[int, int]) -> bool:
    ranked = sorted(votes, key=lambda r: -votes[r])
    if spec["kind"] == "balanced":
        return not votes
    if spec["kind"] == "one":
        return bool(ranked) and ranked[0] in spec["slow"]
    return set(ranked[:2]) == set(spec["slow"])


def _report(title: str, results: dict[str, list[bool]]) -> None:
    print(title)
    for kind, label in (("one", "one slow rank: top-1 correct"), ("two", "two slow ranks: both found (top-2)"),
                        ("balanced", "balanced: no suspect named")):
        vals = results.get(kind, [])
        if vals:
            print(f"  {label:<40} {sum(vals):>4}/{len(vals):<4} = {100 * sum(vals) / len(vals):6.1f} %")


def part_a(specs: list[dict[str, Any]], settings: RankingSettings) -> None:
    ours: dict[str, list[bool]] = defaultdict(list)
    emu: dict[str, list[bool]] = defaultdict(list)
    by_factor: dict[str, list[bool]] = defaultdict(list)
    fails = []
    t_rank: list[float] = []
    for spec in specs:
        tls = build_timelines(world_size=spec["world"], slow_ranks=spec["slow"], steps=3, seed=spec["seed"],
                              noise=spec["noise"])
        rows, inst = summaries_from_timelines(tls)
        votes = emulate_slow_rank(inst)
        ev = ClusterEvidence(kind="ascend_pt", summaries=rows, slow_rank_votes=votes)
        t0 = time.perf_counter()
        sus = rank_suspects(ev, settings=settings)
        t_rank.append(time.perf_counter() - t0)
        ok = judge(spec, [s.rank for s in sus])
        ours[spec["kind"]].append(ok)
        emu[spec["kind"]].append(judge_votes(spec, votes))
        if spec["slow"]:
            f = min(spec["slow"].values())
            bucket = "1.05-1.10" if f < 1.1 else "1.10-1.25" if f < 1.25 else "1.25-3.00"
            by_factor[f"{spec['kind']} {bucket}"].append(ok)
        if not ok:
            fails.append((spec, [(s.rank, s.score, s.kind) for s in sus]))
    print(f"Part A: ranking only, {len(specs)} generated batches (summaries computed from the generator's timelines "
          "with cluster_time_summary semantics; slow_rank votes EMULATED)")
    _report(" rank_suspects:", ours)
    _report(" slow_rank votes alone (emulated Dixon/3-sigma):", emu)
    print("  by smallest slow factor:", {k: f"{sum(v)}/{len(v)}" for k, v in sorted(by_factor.items())})
    print(f"  rank_suspects time: median {1e3 * statistics.median(t_rank):.2f} ms, max {1e3 * max(t_rank):.2f} ms")
    for spec, got in fails[:10]:
        print("  miss:", {k: spec[k] for k in ("world", "kind", "slow", "noise")}, "->", got[:3])


def part_a_hard(settings: RankingSettings, per_world: int = 20) -> None:
    """Hard cases: slow factor exactly 1.05 with 3 % kernel noise, and balanced clusters, per world size."""
    print("\nPart A2: hard cases (ranking only), slow factor 1.05x, kernel noise 3 %,", per_world, "batches each")
    for world in (4, 8, 16, 32, 64):
        hit = false = 0
        for seed in range(per_world):
            rows, _ = summaries_from_timelines(build_timelines(world_size=world, slow_ranks={1: 1.05}, steps=3,
                                                               seed=1000 + seed, noise=0.03))
            sus = rank_suspects(ClusterEvidence(kind="ascend_pt", summaries=rows), settings=settings)
            hit += bool(sus) and sus[0].rank == 1
            rows, _ = summaries_from_timelines(build_timelines(world_size=world, steps=3, seed=2000 + seed,
                                                               noise=0.03))
            false += bool(rank_suspects(ClusterEvidence(kind="ascend_pt", summaries=rows), settings=settings))
        print(f"  world {world:>2}: 1.05x top-1 {hit}/{per_world}; balanced with a suspect named {false}/{per_world}")


def part_b(specs: list[dict[str, Any]], settings: RankingSettings) -> None:
    from daemon.adapters.rank_dir_fs import scan_tree
    from daemon.analysis import AnalysisSettings, analyze_batch
    from daemon.core.alertmanager import AlertBook
    from daemon.core.alerts import make_cloudevent
    from daemon.simulate.ascend_tree import generate_cluster

    asettings = AnalysisSettings(ranking=settings, report=True)
    asettings.msprof.advisor = False
    asettings.msprof.max_concurrent_runs = 2
    ours: dict[str, list[bool]] = defaultdict(list)
    votes_only: dict[str, list[bool]] = defaultdict(list)
    overhead: list[float] = []
    tool: list[float] = []
    statuses: dict[str, int] = defaultdict(int)
    drift: list[float] = []
    with tempfile.TemporaryDirectory(prefix="pwbench") as tmp:
        for spec in specs:
            root = Path(tmp) / f"b{spec['i']}"
            generate_cluster(root / "prof", world_size=spec["world"], slow_ranks=spec["slow"], steps=3,
                             seed=spec["seed"], noise=spec["noise"], capture_id=f"cap{spec['i']}")
            t_complete = time.monotonic()
            batches = [b for b in scan_tree(root / "prof", world_size=spec["world"]) if b.status == "complete"]
            if not batches:
                statuses["not complete"] += 1
                continue
            res = analyze_batch(batches[0], work_dir=root / "work", settings=asettings)
            event = make_cloudevent(res.event_type, "bench", res.alert_data(), source="//bench", now_unix_s=time.time())
            AlertBook(cluster="bench", resend_interval_s=60).apply(event, time.time())
            elapsed = time.monotonic() - t_complete
            overhead.append(elapsed - res.timings_s.get("tool", 0.0))
            tool.append(res.timings_s.get("tool", 0.0))
            statuses[res.status] += 1
            ours[spec["kind"]].append(judge(spec, [s.rank for s in res.suspects]))
            if res.evidence and res.evidence.summaries:  # does Part A's emulation match the real tool?
                tls = build_timelines(world_size=spec["world"], slow_ranks=spec["slow"], steps=3, seed=spec["seed"],
                                      noise=spec["noise"])
                emu = {(r.rank, r.step): r for r in summaries_from_timelines(tls)[0]}
                for r in res.evidence.summaries:
                    e = emu.get((r.rank, r.step))
                    if e is not None and r.step_time_us > 0:
                        drift.append(max(abs(r.computation_us - e.computation_us), abs(r.wait_us - e.wait_us),
                                         abs(r.free_us - e.free_us)) / r.step_time_us)
            votes_only[spec["kind"]].append(judge_votes(spec, res.evidence.slow_rank_votes if res.evidence else {}))
    print(f"\nPart B: end to end with the real msprof-analyze (cluster_time_summary + slow_rank, advisor off) on "
          f"{len(specs)} of the same batches")
    _report(" rank_suspects:", ours)
    _report(" msprof-analyze slow_rank votes alone:", votes_only)
    print(f"  statuses: {dict(statuses)}")
    if drift:
        print(f"  Part A emulation vs real ClusterTimeSummary (max |diff| of computation/wait/free per row, "
              f"fraction of step): median {statistics.median(drift):.4f}, max {max(drift):.4f}")
    if overhead:
        print(f"  batch complete -> alert payload, minus tool time: median {statistics.median(overhead):.3f} s, "
              f"max {max(overhead):.3f} s (target <= 1 s); tool time median {statistics.median(tool):.1f} s")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, default=210)
    ap.add_argument("--msprof", type=int, default=40)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    import logging

    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    specs = scenarios(args.batches, args.seed)
    settings = RankingSettings()
    part_a(specs, settings)
    part_a_hard(settings)
    if args.msprof:
        part_b(specs[: args.msprof], settings)


if __name__ == "__main__":
    main()
