"""False ``rank_outlier`` on ``cpu/step`` of a healthy 2-rank serving pair on a busy host, and the delay of a real
+30 % rank (deterministic, seeded).

The live shape (``bench/bench_live_serving.py``, a 2-core box at load 8-12): bursts of 3-40 iterations, idle gaps
of 0.2-6 s, batches of 1-32 (``work``), 0.4 ms of CPU per request per rank, a lockstep all-reduce; the hook's CPU
samples every 0.25 s (``tests/unit/test_cpu_time.py`` ``_SimSampler``). A busy host's noise is per stretch of time,
not per step: each rank's CPU time per request is multiplied by a factor redrawn every 0.25 s (lognormal, sigma
drawn per hour in 0.10-0.25: cache and frequency effects of a starved core), and about once a minute one rank
spins or runs hot for 0.25-1 s (+30-60 %). ``--hours`` healthy hours count false fires; ``--slow`` runs put
rank 1 at +30 % from 600 s and measure the delay to its first ``rank_outlier``.

Run: ``python bench/bench_busy_cpu_pair.py --hours 200 --slow 40`` (prints one JSON line).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from typing import Any

T0 = 1_790_000_000.0
SAMPLE_S = 0.25


def busy_pair(seed: int, *, duration_s: float = 3_600.0, onset_s: float = math.inf, factor: float = 1.3,
              sigma: tuple[float, float] = (0.10, 0.25), excursions_per_min: float = 1.0) -> list[dict[str, Any]]:
    """One pair's report records (dicts for ``tests.unit.detection_helpers.to_report``), CPU samples in the hook
    form; rank 1 does ``factor`` x the CPU work per request from ``onset_s``."""
    rng = random.Random(seed)
    sig = rng.uniform(*sigma)
    period = SAMPLE_S
    next_t = [rng.uniform(0.0, period) for _ in range(2)]
    cum = [5.0, 5.0]
    asked_at = [0, 0]
    pending: list[dict[str, Any]] = [{}, {}]
    noise = [1.0, 1.0]
    next_noise = 0.0
    hot = [(-1.0, -1.0, 1.0), (-1.0, -1.0, 1.0)]  # per rank: (from, to, factor) of an excursion
    t, step, share, next_load = 0.0, 0, 0.6, 0.0
    out: list[dict[str, Any]] = []
    while t < duration_s:
        gap = rng.uniform(0.2, 6.0)
        # excursions that start in the gap or the burst: about excursions_per_min a minute over both ranks
        if rng.random() < excursions_per_min * gap / 60.0:
            r = rng.randrange(2)
            start = t + rng.uniform(0.0, gap)
            hot[r] = (start, start + rng.uniform(0.25, 1.0), 1.0 + rng.uniform(0.3, 0.6))
        t += gap
        for i in range(rng.randint(3, 40)):
            if t >= next_load:
                share, next_load = rng.uniform(0.3, 0.9), t + rng.uniform(20, 90)
            while t >= next_noise:
                noise = [math.exp(rng.gauss(0.0, sig)) for _ in range(2)]
                next_noise += period
            batch = rng.randint(1, 32)
            c = []
            for r in range(2):
                x = 0.0004 * batch * noise[r] * math.exp(rng.gauss(0.0, 0.03))
                if hot[r][0] <= t < hot[r][1]:
                    x *= hot[r][2]
                if r == 1 and t >= onset_s:
                    x *= factor
                c.append(x)
            wall = max(c) / (share * math.exp(rng.gauss(0.0, 0.1)))
            t += wall
            step += 1
            for r in range(2):
                rec: dict[str, Any] = {"job_id": "svc", "rank": r, "step": step, "ts_unix_s": T0 + t,
                                       "step_time_s": round(wall + (gap if i == 0 else 0.0), 6), "mode": "serving",
                                       "work": float(batch)}
                rec.update(pending[r])
                pending[r] = {}
                cum[r] += c[r]
                asked = False
                while next_t[r] < t:
                    next_t[r] += period
                    if step - 1 != asked_at[r]:
                        asked, asked_at[r] = True, step - 1
                if asked:
                    pending[r] = {"cpu_at_step": step, "cpu_total_s": cum[r]}
                out.append(rec)
    return out


def feed(recs: list[dict[str, Any]]) -> list[tuple[float, int, Any]]:
    """Through the whole job detector (ticks once a second): ``[(seconds, step, anomaly)]`` of rank outliers."""
    from profwatch.core.capture.planner import CaptureSettings, spike_hold
    from profwatch.core.detection.job_detector import JobDetector
    from profwatch.core.detection.settings import DetectionSettings
    from tests.unit.detection_helpers import to_report

    det = JobDetector("svc", 2, DetectionSettings(), hold=spike_hold(CaptureSettings()))
    found: list[tuple[float, int, Any]] = []
    last_tick = -math.inf
    for rec in recs:
        now = rec["ts_unix_s"]
        found += [(now - T0, rec["step"], a) for a in det.observe(to_report(rec), now)]
        if now - last_tick >= 1.0:
            last_tick = now
            found += [(now - T0, rec["step"], a) for a in det.tick(now)]
    return [f for f in found if f[2].kind == "rank_outlier"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--hours", type=int, default=200, help="healthy simulated hours (one seed each)")
    p.add_argument("--slow", type=int, default=40, help="runs with rank 1 +30 %% from 600 s")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    t0 = time.perf_counter()
    false_fires = 0
    hours_with = 0
    for h in range(a.hours):
        n = len(feed(busy_pair(a.seed + h)))
        false_fires += n
        hours_with += n > 0
    delays_s: list[float] = []
    delays_steps: list[int] = []
    lost = wrong = early = 0
    for i in range(a.slow):
        recs = busy_pair(a.seed + 10_000 + i, duration_s=900.0, onset_s=600.0)
        onset_step = next(r["step"] for r in recs if r["ts_unix_s"] - T0 >= 600.0)
        found = feed(recs)
        early += sum(1 for t, _, _ in found if t < 600.0)
        after = [(t, s, an) for t, s, an in found if t >= 600.0]
        if not after:
            lost += 1
            continue
        t, s, an = after[0]
        if an.ranks != (1,):
            wrong += 1
        delays_s.append(t - 600.0)
        delays_steps.append(s - onset_step)

    def q(xs: list[Any], f: float) -> Any:
        return sorted(xs)[min(len(xs) - 1, int(f * len(xs)))] if xs else None

    print(json.dumps({"healthy_hours": a.hours, "false_fires": false_fires, "hours_with_false_fire": hours_with,
                      "slow_runs": a.slow, "lost": lost, "wrong_rank": wrong, "fired_before_onset": early,
                      "delay_s_median": q(delays_s, 0.5), "delay_s_p90": q(delays_s, 0.9),
                      "delay_steps_median": q(delays_steps, 0.5), "delay_steps_p90": q(delays_steps, 0.9),
                      "wall_s": round(time.perf_counter() - t0, 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
