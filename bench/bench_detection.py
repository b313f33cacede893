"""Benchmark of step-time anomaly detection (prints numbers; no assertions).

Measures, on generated telemetry (``daemon/simulate/telemetry.py``, job step-time noise CV 5 % by default):

* detection delay in steps after a sustained job-wide slowdown begins (1 = fired on the first slow step),
  and recall (fired within ``--horizon`` steps) per slowdown size (5/10/20/50 %);
* false alarms per 100k stationary steps;
* ``JobDetector.observe`` cost per step report at 16k ranks (with and without per-stage times).

Usage: ``python bench/bench_detection.py [--trials 200] [--cv 0.05] [--world-size 8] [--robust-z 3.0]``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from daemon.core.anomaly import DetectionSettings, JobDetector
from daemon.simulate.telemetry import TelemetryScenario, iter_telemetry
from rankhook.wire import StepReport


def _feed(sc: TelemetryScenario, settings: DetectionSettings) -> list[tuple[str, int, dict]]:
    det = JobDetector(sc.job_id, sc.world_size, settings)
    out = []
    for rec in iter_telemetry(sc):
        rep = StepReport(sc.job_id, rec["rank"], rec["step"], rec["step_time_s"], rec["ts_unix_s"],  # type: ignore[arg-type]
                         rec.get("stages"), tuple(rec.get("flags", ())), bool(rec.get("capturing", False)))  # type: ignore[arg-type]
        for a in det.observe(rep):
            out.append((a.kind, a.step, a.detail))
    return out


def bench_delay_recall(args: argparse.Namespace, settings: DetectionSettings) -> None:
    start = 100
    print(f"== delay / recall: world_size={args.world_size} cv={args.cv} change at step {start}, "
          f"horizon {args.horizon} steps, {args.trials} trials per size")
    for size in (0.05, 0.10, 0.20, 0.50):
        delays: list[int] = []
        early = 0
        for t in range(args.trials):
            sc = TelemetryScenario(world_size=args.world_size, steps=start + args.horizon, cv=args.cv, seed=1000 + t,
                                   slowdown=size, slowdown_from_step=start, with_stages=False)
            regs = [(s, d) for k, s, d in _feed(sc, settings) if k == "step_regression"]
            early += sum(1 for s, _ in regs if s < start)
            after = [s for s, _ in regs if s >= start]
            if after:
                delays.append(after[0] - start + 1)
        recall = len(delays) / args.trials
        if delays:
            p = np.percentile(delays, [50, 90])
            within3 = sum(1 for d in delays if d <= 3) / args.trials
            print(f"  slowdown {size:4.0%}: recall {recall:6.1%}  delay median {p[0]:5.1f}  p90 {p[1]:5.1f} steps  "
                  f"fired within 3 steps {within3:6.1%}  (false fires before the change: {early})")
        else:
            print(f"  slowdown {size:4.0%}: recall {recall:6.1%}  (false fires before the change: {early})")


def bench_false_alarms(args: argparse.Namespace, settings: DetectionSettings) -> None:
    steps = args.fa_steps
    sc = TelemetryScenario(world_size=args.world_size, steps=steps, cv=args.cv, seed=7, with_stages=True)
    found = _feed(sc, settings)
    by_kind: dict[str, int] = {}
    for k, _, _ in found:
        by_kind[k] = by_kind.get(k, 0) + 1
    print(f"== false alarms: {steps} stationary steps, world_size={args.world_size}, cv={args.cv}: "
          f"{len(found)} total -> {len(found) * 100_000 / steps:.2f} per 100k steps {by_kind}")
    sc1 = TelemetryScenario(world_size=1, steps=steps, cv=args.cv, seed=8, with_stages=False)
    found1 = _feed(sc1, settings)
    print(f"   world_size=1: {len(found1)} -> {len(found1) * 100_000 / steps:.2f} per 100k steps")


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
        det = JobDetector("big", world, settings)
        t0 = time.perf_counter()
        for rep in reports:
            det.observe(rep)
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
    ap.add_argument("--big-world", type=int, default=16_384)
    ap.add_argument("--cost-steps", type=int, default=40)
    ap.add_argument("--robust-z", type=float, default=None)
    args = ap.parse_args()
    settings = DetectionSettings() if args.robust_z is None else DetectionSettings(robust_z=args.robust_z)
    print(f"settings: min_effect={settings.min_effect} robust_z={settings.robust_z} "
          f"sustain_steps={settings.sustain_steps} baseline_steps={settings.baseline_steps}")
    t0 = time.perf_counter()
    bench_delay_recall(args, settings)
    bench_false_alarms(args, settings)
    bench_cost(args, settings)
    print(f"total {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
