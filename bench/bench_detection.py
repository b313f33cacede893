"""Benchmark of step-time anomaly detection (prints numbers; no assertions).

Measures, on generated telemetry (``daemon/profwatch/simulate/telemetry.py``; job step-time noise CV 5 % by default):

* detection delay in steps after a sustained job-wide slowdown begins (1 = fired on the first slow step), median
  and p90, beside the CUSUM/Lorden bound ``ln(false_alarm_steps) / (delta^2 / 2)`` (delta = slowdown / CV), and
  recall (fired within ``--horizon`` steps) at 5/10/20/50 %; the change comes after the baseline is full (step
  400) and, for comparison, while it is still short (step 100);
* false alarms per 100k stationary steps of one job step series: through the whole ``JobDetector`` (8 ranks), and
  for ``--fa-steps-long`` steps through the regression detector alone (the same series model, faster);
* a replay suite through ``profwatch replay``'s arming path (the coordinator's) with the cooldown and the hourly
  cap OFF, so they cannot hide a false detection: GC pauses, unflagged checkpoints, data loader stalls, periodic
  evaluation, all of them together (no sustained regression), reporting anomalies by kind and arms separately
  (goal: <= 1 arm per 10k steps), and the same mix with a 10 % regression (delay);
* ``JobDetector.observe`` cost per step report at 16k ranks (with and without per-stage times).

Usage: ``python bench/bench_detection.py [--trials 200] [--cv 0.05] [--world-size 8] [--suite-steps 20000]``.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "daemon"))

from profwatch.commands.replay import ReplayConfig, replay_lines
from profwatch.core.arming.policy import ArmingSettings
from profwatch.core.capture.planner import CaptureSettings, spike_hold
from profwatch.core.detection.job_detector import DetectionSettings, JobDetector
from profwatch.core.detection.regression import StepTimeRegressionDetector
from profwatch.core.detection.types import FinalizedStep
from profwatch.core.fleet.telemetry import dump_jsonl
from profwatch.simulate.telemetry import TelemetryScenario, iter_telemetry
from rankhook.wire import StepReport


def _feed(sc: TelemetryScenario, settings: DetectionSettings) -> list[tuple[str, int, dict[str, Any]]]:
    det = JobDetector(sc.job_id, sc.world_size, settings, hold=spike_hold(CaptureSettings()))
    out: list[tuple[str, int, dict[str, Any]]] = []
    for rec in iter_telemetry(sc):
        rep = StepReport(sc.job_id, rec["rank"], rec["step"], rec["step_time_s"], rec["ts_unix_s"],
                         rec.get("stages"), tuple(rec.get("flags", ())), bool(rec.get("capturing", False)))
        for a in det.observe(rep, rec["ts_unix_s"]):
            out.append((a.kind, a.step, a.detail))
    return out


def lorden_bound(size: float, cv: float, false_alarm_steps: float) -> float:
    """Lorden's asymptotic delay bound (steps) for a shift of ``size / cv`` sigmas."""
    delta = size / cv
    return math.log(false_alarm_steps) / (delta * delta / 2.0)


def bench_delay_recall(args: argparse.Namespace, settings: DetectionSettings) -> None:
    print(f"== delay / recall: world_size={args.world_size} cv={args.cv} horizon {args.horizon} steps, "
          f"{args.trials} trials per size; bound = ln({settings.false_alarm_steps:g}) / (delta^2/2)")
    for start in (400, 100):
        print(f"  change at step {start}" + (" (baseline full)" if start == 400 else
                                             " (baseline still short: warm-up 10 + lag 16 + 30 learned)"))
        for size in (0.05, 0.10, 0.20, 0.50):
            delays: list[int] = []
            early = 0
            patterns: Counter[str] = Counter()
            for t in range(args.trials):
                sc = TelemetryScenario(world_size=args.world_size, steps=start + args.horizon, cv=args.cv,
                                       seed=1000 + t, slowdown=size, slowdown_from_step=start, with_stages=False)
                regs = [(s, d) for k, s, d in _feed(sc, settings) if k == "step_regression"]
                early += sum(1 for s, _ in regs if s < start)
                after = [(s, d) for s, d in regs if s >= start]
                if after:
                    delays.append(after[0][0] - start + 1)
                    patterns[after[0][1]["pattern"]] += 1
            bound = lorden_bound(size, args.cv, settings.false_alarm_steps)
            line = f"    slowdown {size:4.0%}: bound {bound:5.2f}  recall {len(delays) / args.trials:6.1%}"
            if delays:
                p = np.percentile(delays, [50, 90])
                line += f"  delay median {p[0]:5.1f} ({p[0] / bound:4.2f}x bound)  p90 {p[1]:5.1f} steps"
            print(line + f"  via {dict(patterns)}  (false fires before the change: {early})")


def bench_false_alarms(args: argparse.Namespace, settings: DetectionSettings) -> None:
    steps = args.fa_steps
    sc = TelemetryScenario(world_size=args.world_size, steps=steps, cv=args.cv, seed=7, with_stages=True)
    t0 = time.perf_counter()
    found = _feed(sc, settings)
    by_kind = Counter(k for k, _, _ in found)
    regs = by_kind.get("step_regression", 0)
    print(f"== false alarms (JobDetector, world_size={args.world_size}, cv={args.cv}, {steps} stationary steps, "
          f"{time.perf_counter() - t0:.0f} s): step_regression {regs} -> {regs * 100_000 / steps:.2f} per 100k "
          f"steps; all anomalies {dict(by_kind)}")
    long_steps = args.fa_steps_long
    rng = np.random.default_rng(8)
    total = 0
    t0 = time.perf_counter()
    chunk = 100_000
    det = StepTimeRegressionDetector("fa", settings, hold_steps=lambda _s, _t: 8)
    for c0 in range(0, long_steps, chunk):
        xs = 0.5 * np.maximum(0.2, 1.0 + args.cv * rng.standard_normal(min(chunk, long_steps - c0)))
        for i, x in enumerate(xs.tolist()):
            for a in det.on_step(FinalizedStep(c0 + i + 1, x, 0, 1, None, None)):
                total += a.kind == "step_regression"
    dt = time.perf_counter() - t0
    print(f"   regression detector alone, {long_steps} stationary steps (Gaussian, cv={args.cv}): {total} -> "
          f"{total * 100_000 / long_steps:.2f} per 100k steps ({dt * 1e6 / long_steps:.1f} us/step); "
          f"design target 1 per {settings.false_alarm_steps:g}")


SUITE: dict[str, dict[str, Any]] = {
    "gc_pauses": dict(gc_prob=0.02, gc_factor=3.0),
    "unflagged_checkpoints": dict(checkpoint_every=200, checkpoint_steps=3, checkpoint_factor=6.0,
                                  checkpoint_flagged=False),
    "data_loader_stalls": dict(loader_stall_prob=0.01, loader_stall_factor=3.0, loader_stall_steps=2),
    "periodic_eval": dict(eval_every=250, eval_factor=10.0),
}


def bench_replay_suite(args: argparse.Namespace, settings: DetectionSettings) -> None:
    steps = args.suite_steps
    arming = ArmingSettings(cooldown_s=0.0, max_captures_per_hour=10**6, max_capture_bytes_per_hour=None)
    cfg = ReplayConfig(detection=settings, arming=arming)
    print(f"== replay suite (profwatch replay's arming path, cooldown and hourly cap OFF): {steps} steps per "
          f"scenario, world_size={args.world_size}, cv={args.cv}, no sustained regression")
    mixed: dict[str, Any] = {k: v for d in SUITE.values() for k, v in d.items()}
    total_arms = total_steps = 0
    for name, effects in [*SUITE.items(), ("all_together", mixed)]:
        sc = replace(TelemetryScenario(world_size=args.world_size, steps=steps, cv=args.cv, seed=21,
                                       with_stages=True), **effects)
        t0 = time.perf_counter()
        res = replay_lines(dump_jsonl(iter_telemetry(sc)).splitlines(), cfg)
        kinds = Counter(a["kind"] for a in res["anomalies"])
        arms = len(res["arms"])
        total_arms += arms
        total_steps += steps
        print(f"  {name:22s} anomalies {dict(kinds)}  arms {arms} -> {arms * 10_000 / steps:.2f} per 10k steps "
              f"({time.perf_counter() - t0:.0f} s)")
    print(f"  overall: {total_arms} arms in {total_steps} steps -> {total_arms * 10_000 / total_steps:.2f} "
          f"per 10k steps (goal <= 1)")
    delays = []
    for t in range(args.suite_regression_trials):
        sc = replace(TelemetryScenario(world_size=args.world_size, steps=1300, cv=args.cv, seed=300 + t,
                                       with_stages=False, slowdown=0.10, slowdown_from_step=1050), **mixed)
        regs = [s for k, s, _ in _feed(sc, settings) if k == "step_regression" and s >= 1050]
        if regs:
            delays.append(regs[0] - 1050 + 1)
    if delays:
        p = np.percentile(delays, [50, 90])
        print(f"  10% regression from step 1050 while all of the above go on: recall "
              f"{len(delays) / args.suite_regression_trials:.0%}, delay median {p[0]:.1f} p90 {p[1]:.1f} steps "
              f"(bound {lorden_bound(0.10, args.cv, settings.false_alarm_steps):.2f})")


def bench_cost(args: argparse.Namespace, settings: DetectionSettings) -> None:
    world = args.big_world
    steps = args.cost_steps
    rng = np.random.default_rng(0)
    for with_stages in (False, True):
        reports = []
        for k in range(1, steps + 1):
            g = 1.0 + args.cv * float(rng.standard_normal())
            comp = (0.4 * g * (1.0 + 0.005 * rng.standard_normal(world))).tolist()
            for r in range(world):
                st = {"compute": comp[r], "comm": 0.1} if with_stages else None
                reports.append(StepReport("big", r, k, 0.5 * g, 1e9 + 0.5 * k, st))
        det = JobDetector("big", world, settings, hold=spike_hold(CaptureSettings()))
        t0 = time.perf_counter()
        for rep in reports:
            det.observe(rep, rep.ts_unix_s)
        dt = time.perf_counter() - t0
        t1 = time.perf_counter()
        det.tick(1e9 + 0.5 * steps)
        tick_s = time.perf_counter() - t1
        print(f"== observe cost: world_size={world}, {steps} steps, stages={with_stages}: "
              f"{dt * 1e6 / len(reports):.2f} us/report ({len(reports) / dt / 1e6:.2f} M reports/s); "
              f"tick {tick_s * 1e3:.2f} ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--horizon", type=int, default=100)
    ap.add_argument("--cv", type=float, default=0.05)
    ap.add_argument("--world-size", type=int, default=8)
    ap.add_argument("--fa-steps", type=int, default=100_000)
    ap.add_argument("--fa-steps-long", type=int, default=1_000_000)
    ap.add_argument("--suite-steps", type=int, default=20_000)
    ap.add_argument("--suite-regression-trials", type=int, default=50)
    ap.add_argument("--big-world", type=int, default=16_384)
    ap.add_argument("--cost-steps", type=int, default=40)
    ap.add_argument("--only", choices=("delay", "fa", "suite", "cost"), default=None)
    args = ap.parse_args()
    settings = DetectionSettings()
    print(f"settings: min_effect={settings.min_effect} false_alarm_steps={settings.false_alarm_steps:g} "
          f"baseline_steps={settings.baseline_steps} lag={settings.baseline_lag_steps} "
          f"spike_min_effect={settings.spike_min_effect} spike_z={settings.spike_z}")
    t0 = time.perf_counter()
    for name, fn in (("delay", bench_delay_recall), ("fa", bench_false_alarms), ("suite", bench_replay_suite),
                     ("cost", bench_cost)):
        if args.only in (None, name):
            fn(args, settings)
    print(f"total {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
