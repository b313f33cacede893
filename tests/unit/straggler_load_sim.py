"""A 4-rank synchronous job whose host load wanders, with ranks that get slower, fed through the coordinator's
detection and episode/arming path with an oracle verdict (pure; deterministic; a helper of the episode tests).

Telemetry: per step ``k`` a host-load factor ``H_k`` (piecewise constant, a new level drawn every 120-360 s, x0.9-1.3
of the base), job noise ``g_k ~ 1 + 0.02 N(0, 1)``; rank ``r`` computes ``0.4 s * H_k * g_k * (1 + 0.005 N) * f_r(k)``
(``f_r``: the slowdowns injected), then every rank waits at the barrier and communicates ``0.1 s * H_k``.
Captures take their window's steps, then the oracle verdict: ``ok`` naming the ranks whose compute factor was > 1.2
in the window (slowest first), else ``no_suspect``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from profwatch.core.arming.episodes import JobEpisodes
from profwatch.core.arming.policy import ArmingPolicy, ArmingSettings
from profwatch.core.capture.planner import CaptureSettings, spike_hold
from profwatch.core.detection.job_detector import JobDetector
from rankhook.wire import StepReport

T0 = 1_764_500_000.0
WORLD = 4


@dataclass
class SimResult:
    arms: list[dict[str, Any]] = field(default_factory=list)
    events: list[Any] = field(default_factory=list)


def run_job(duration_s: float, factor: Callable[[int, float], float], *, seed: int = 31,
            load: bool = True, job_factor: Callable[[float], float] = lambda t: 1.0,
            window_steps: int = 8, stages: bool = True, verdict_steps: int = 2) -> SimResult:
    """Run ``duration_s`` seconds of the job; ``factor(rank, t)`` is rank's compute factor at ``t`` (seconds from
    the start), ``job_factor(t)`` a job-wide factor (a software change); ``stages=False``: no stage timings (the
    zero-code hook without ``rankhook.stage``: every rank reports the same synchronous step time);
    ``verdict_steps``: steps from the end of a capture's window to its verdict (analysis time: the capture stays in
    flight). Returns the arms and episode events."""
    rng = np.random.default_rng(seed)
    settings = ArmingSettings()
    policy = ArmingPolicy(settings)
    book = JobEpisodes("sim", settings)
    det = JobDetector("sim", WORLD, None, hold=spike_hold(CaptureSettings()))
    res = SimResult()
    t, step, h, next_h = 0.0, 0, 1.0, float(rng.uniform(120, 360))
    last_tick = -1.0
    flight: tuple[str, int, list[tuple[int, ...]]] | None = None  # capture id, last step, slow ranks seen
    while t < duration_s:
        step += 1
        if load and t >= next_h:
            h, next_h = float(rng.uniform(0.9, 1.3)), t + float(rng.uniform(120, 360))
        g = 1.0 + 0.02 * float(rng.standard_normal())
        jf = job_factor(t)
        comp = [0.4 * h * g * jf * (1.0 + 0.005 * float(rng.standard_normal())) * factor(r, t) for r in range(WORLD)]
        st = max(comp) + 0.1 * h * jf
        t += st
        now = T0 + t
        found = []
        for r in range(WORLD):
            found += det.observe(StepReport(job_id="sim", rank=r, step=step, step_time_s=round(st, 6),
                                            ts_unix_s=now, stages={"compute": round(comp[r], 6),
                                                                   "comm": round(st - comp[r], 6)} if stages
                                            else None), now)
        if now - last_tick >= 1.0:
            last_tick = now
            found += det.tick(now)
        if flight is not None:
            slow = tuple(sorted((r for r in range(WORLD) if factor(r, t) > 1.2), key=lambda r: -factor(r, t)))
            flight[2].append(slow)
            if step > flight[1]:
                seen = flight[2][-window_steps:]
                named = seen[-1] if seen else ()
                res.events += book.capture_ended(flight[0], now, "ok" if named else "no_suspect", named)
                res.arms[-1]["named"] = list(named)
                flight = None
        for a in found:
            res.events += book.observe(a, now)[1]
        res.events += book.advance(now, furthest_step=det.furthest_step, step_time_s=det.baseline_step_time_s,
                                   ongoing=det.ongoing(), unit_steps=det.unit_steps())
        picked = book.next_arm(policy, now, capture_in_flight=flight is not None)
        if picked is not None:
            ep, d = picked
            cid = f"c{len(res.arms) + 1}"
            book.history.record(d, now, cid)
            start = step + 3
            book.armed(ep.episode_id, cid, now, covered=None, start_step=start)
            det.exclude_steps(start, start + window_steps, "capture")
            flight = (cid, start + window_steps + verdict_steps, [])
            res.arms.append({"t": round(t, 1), "step": step, "kind": ep.kind, "ranks": list(ep.ranks),
                             "magnitude": round(ep.magnitude, 3), "episode": ep.episode_id})
    return res
