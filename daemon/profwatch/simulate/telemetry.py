"""SIMULATOR: generated per-rank step telemetry (pure; seeded numpy RNG; no I/O).

Produces the JSONL record shape ``profwatch replay`` reads and the coordinator dumps::

    {"job_id": "sim", "rank": 3, "world_size": 8, "step": 120, "step_time_s": 0.512, "ts_unix_s": 1764500042.5,
     "stages": {"compute": 0.41, "comm": 0.10}, "flags": ["checkpoint"], "capturing": false}

Model (synchronous training, ``sync=True``): per step k a level ``L_k`` (base step time times the slowdown,
drift, spike, checkpoint and capture factors) and a job-wide noise factor ``g_k ~ 1 + cv * N(0, 1)``. Each
rank computes for ``L_k * g_k * compute_frac * (1 + rank_jitter_cv * N(0, 1))`` (times ``slow_rank_factor``
for the slow rank); every rank then waits at the barrier, so every rank's step time is the slowest compute
plus the communication time (``stages["comm"]`` is that wait plus communication). With ``sync=False``
(inference) each rank's step time is its own compute plus communication. ``cv`` is thus roughly the
coefficient of variation of the job step time.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True, slots=True)
class TelemetryScenario:
    """Parameters of one generated job (steps are ``rankhook.step()`` counts; times in seconds).

    Effects (each off by default): ``slowdown`` (relative, e.g. 0.2) from ``slowdown_from_step`` (job-wide);
    ``slow_rank`` computing ``slow_rank_factor`` times slower from ``slow_rank_from_step``; ``drift_per_step``
    (relative per step, linear) from ``drift_from_step``; one ``spike_step`` of ``spike_factor``; a checkpoint
    step every ``checkpoint_every`` steps of ``checkpoint_factor`` (flagged ``checkpoint`` when
    ``checkpoint_flagged``); ``stall_rank`` sending nothing from ``stall_from_step`` while peers go on;
    a capture window of ``capture_steps`` steps from ``capture_start_step`` (``capturing`` true, slowed by
    ``capture_factor``, the last one by ``capture_flush_factor``) followed by ``parse_steps`` steps slowed by
    ``parse_factor``; a restart after ``restart_after_step``: the counter starts again at ``first_step`` after
    ``restart_gap_s`` seconds (then ``restart_steps`` more steps are generated).

    Job shapes: ``slowdown_until_step`` ends the job-wide slowdown (a load burst); ``rank_compute_factors`` gives
    each rank a compute factor from step 0 (a pipeline stage that does more work); ``roles`` a role label per rank
    (the ``role`` field); ``rotate_every`` moves the slow rank (``slow_rank_factor``) every that many steps through
    ``rotate_ranks`` (default every rank: a hot MoE expert); after a restart (a requeue) ``restart_world_size``
    ranks report, ``restart_slow_rank`` is slow from ``restart_slow_rank_from_step``; ``with_identity`` adds
    ``pid`` and ``node`` (new pids and other nodes after a restart); ``mode`` is copied into every record.

    Job-wide interruptions (unflagged unless said; drawn from a second seeded stream, so adding them leaves the
    noise of a scenario unchanged): a GC pause on every rank with probability ``gc_prob`` per step, making the
    step ``gc_factor`` times longer; a checkpoint lasting ``checkpoint_steps`` steps (see above); an evaluation
    every ``eval_every`` steps making one step ``eval_factor`` times longer (flagged ``eval`` when
    ``eval_flagged``); a data loader stall with probability ``loader_stall_prob`` per step: one random rank waits
    ``loader_stall_factor - 1`` step times for data during ``loader_stall_steps`` steps (its compute stage holds
    the wait), and in synchronous training every rank waits for it.
    """

    job_id: str = "sim"
    world_size: int = 8
    steps: int = 200
    first_step: int = 1
    step_time_s: float = 0.5
    cv: float = 0.02
    rank_jitter_cv: float = 0.005
    compute_frac: float = 0.8
    sync: bool = True
    with_stages: bool = True
    seed: int = 0
    t0_unix_s: float = 1_764_500_000.0
    slowdown: float = 0.0
    slowdown_from_step: int | None = None
    slow_rank: int | None = None
    slow_rank_factor: float = 1.3
    slow_rank_from_step: int = 1
    drift_per_step: float = 0.0
    drift_from_step: int = 1
    spike_step: int | None = None
    spike_factor: float = 3.0
    checkpoint_every: int | None = None
    checkpoint_factor: float = 4.0
    checkpoint_flagged: bool = True
    stall_rank: int | None = None
    stall_from_step: int | None = None
    capture_start_step: int | None = None
    capture_steps: int = 3
    capture_factor: float = 1.5
    capture_flush_factor: float = 3.0
    parse_steps: int = 2
    parse_factor: float = 1.4
    checkpoint_steps: int = 1
    gc_prob: float = 0.0
    gc_factor: float = 3.0
    eval_every: int | None = None
    eval_factor: float = 10.0
    eval_flagged: bool = False
    loader_stall_prob: float = 0.0
    loader_stall_factor: float = 3.0
    loader_stall_steps: int = 1
    restart_after_step: int | None = None
    restart_gap_s: float = 30.0
    restart_steps: int = 100
    slowdown_until_step: int | None = None
    rank_compute_factors: tuple[float, ...] | None = None
    roles: tuple[str, ...] | None = None
    rotate_every: int | None = None
    rotate_ranks: tuple[int, ...] | None = None
    restart_world_size: int | None = None
    restart_slow_rank: int | None = None
    restart_slow_rank_from_step: int = 1
    with_identity: bool = False
    ranks_per_node: int = 8
    mode: str | None = None


def _level(sc: TelemetryScenario, step: int, restarted: bool) -> tuple[float, str | None, bool]:
    """Return (relative level, flag or None, capturing?) of ``step``."""
    lvl = 1.0
    flagged: str | None = None
    capturing = False
    if sc.slowdown_from_step is not None and step >= sc.slowdown_from_step \
            and (sc.slowdown_until_step is None or step < sc.slowdown_until_step):
        lvl *= 1.0 + sc.slowdown
    if sc.drift_per_step and step >= sc.drift_from_step:
        lvl *= 1.0 + sc.drift_per_step * (step - sc.drift_from_step)
    if sc.spike_step is not None and step == sc.spike_step:
        lvl *= sc.spike_factor
    if sc.checkpoint_every and step > sc.first_step \
            and (step - sc.first_step) % sc.checkpoint_every < max(1, sc.checkpoint_steps):
        lvl *= sc.checkpoint_factor
        flagged = "checkpoint" if sc.checkpoint_flagged else None
    if sc.eval_every and step > sc.first_step and (step - sc.first_step) % sc.eval_every == 0:
        lvl *= sc.eval_factor
        flagged = flagged or ("eval" if sc.eval_flagged else None)
    cs = sc.capture_start_step
    if cs is not None and not restarted:
        end = cs + sc.capture_steps - 1
        if cs <= step <= end:
            capturing = True
            lvl *= sc.capture_flush_factor if step == end else sc.capture_factor
        elif end < step <= end + sc.parse_steps:
            lvl *= sc.parse_factor
    return lvl, flagged, capturing


def iter_telemetry(sc: TelemetryScenario) -> Iterator[dict[str, Any]]:
    """Yield records step by step (ranks in order within a step; ``ts_unix_s`` non-decreasing per rank).

    Shapes: ``steps * world_size`` records (fewer with a stall; more with a restart). Raises ValueError for
    ``world_size < 1``.
    """
    if sc.world_size < 1:
        raise ValueError("world_size must be >= 1")
    rng = np.random.default_rng(sc.seed)
    events = np.random.default_rng([sc.seed, 1])  # interruptions: a separate stream keeps the noise unchanged
    stall = _LoaderStall()
    n = sc.world_size
    factors = np.asarray(sc.rank_compute_factors, dtype=np.float64) if sc.rank_compute_factors else np.ones(n)
    if factors.shape != (n,):
        raise ValueError("rank_compute_factors needs one factor per rank")
    ts = np.full(n, sc.t0_unix_s)
    prev_restarted = False
    for step, restarted in _step_plan(sc):
        if restarted and not prev_restarted:
            ts = ts + sc.restart_gap_s
        prev_restarted = restarted
        lvl, flagged, capturing = _level(sc, step, restarted)
        g = max(0.2, 1.0 + sc.cv * float(rng.standard_normal()))
        if sc.gc_prob and events.random() < sc.gc_prob:
            lvl *= sc.gc_factor
        base = sc.step_time_s * lvl * g
        compute = _rank_compute(sc, rng, events, stall, step, restarted, base, g, factors)
        live = n if not restarted or sc.restart_world_size is None else min(n, sc.restart_world_size)
        if live < n:
            compute[live:] = 0.0
        comm = base * (1.0 - sc.compute_frac)
        if sc.sync:
            step_t = np.full(n, float(compute.max()) + comm) * (1.0 + 0.001 * np.abs(rng.standard_normal(n)))
        else:
            step_t = compute + comm
        ts = ts + step_t
        for r in range(live):
            if sc.stall_rank == r and sc.stall_from_step is not None and step >= sc.stall_from_step \
                    and not restarted:
                continue
            yield _record(sc, r, live, step, float(step_t[r]), float(ts[r]), float(compute[r]), restarted, flagged,
                          capturing)


@dataclass(slots=True)
class _LoaderStall:
    """The data-loader stall in progress: which rank, for how many more steps."""

    rank: int = -1
    left: int = 0


def _step_plan(sc: TelemetryScenario) -> list[tuple[int, bool]]:
    """``(step, restarted)`` in order: the steps before a restart, then the restarted run's from ``first_step``."""
    plan: list[tuple[int, bool]] = [(sc.first_step + i, False) for i in range(sc.steps)]
    if sc.restart_after_step is not None:
        plan = [p for p in plan if p[0] <= sc.restart_after_step]
        plan += [(sc.first_step + i, True) for i in range(sc.restart_steps)]
    return plan


def _rank_compute(sc: TelemetryScenario, rng: np.random.Generator, events: np.random.Generator,
                  stall: _LoaderStall, step: int, restarted: bool, base: float, g: float,
                  factors: np.ndarray) -> np.ndarray:
    """Each rank's compute time of one step (s): jitter, a loader stall, the slow rank (fixed, rotating, or after
    the restart). Draws from ``rng`` and ``events`` in a fixed order, so a scenario's records never change."""
    n = sc.world_size
    compute = base * sc.compute_frac * factors * np.maximum(0.2, 1.0 + sc.rank_jitter_cv * rng.standard_normal(n))
    if sc.loader_stall_prob and stall.left == 0 and events.random() < sc.loader_stall_prob:
        stall.rank, stall.left = int(events.integers(n)), max(1, sc.loader_stall_steps)
    if stall.left > 0:
        compute[stall.rank] += sc.step_time_s * g * (sc.loader_stall_factor - 1.0)
        stall.left -= 1
    if sc.slow_rank is not None and step >= sc.slow_rank_from_step and not restarted:
        compute[sc.slow_rank] *= sc.slow_rank_factor
    if sc.rotate_every and step >= sc.slow_rank_from_step and not restarted:
        rotation = sc.rotate_ranks or tuple(range(n))
        compute[rotation[((step - sc.slow_rank_from_step) // sc.rotate_every) % len(rotation)]] *= sc.slow_rank_factor
    if restarted and sc.restart_slow_rank is not None and step >= sc.restart_slow_rank_from_step:
        compute[sc.restart_slow_rank] *= sc.slow_rank_factor
    return compute


def _record(sc: TelemetryScenario, r: int, live: int, step: int, step_t: float, ts: float, compute: float,
            restarted: bool, flagged: str | None, capturing: bool) -> dict[str, Any]:
    """One rank's step record in the ``profwatch replay`` format."""
    rec: dict[str, Any] = {"job_id": sc.job_id, "rank": r, "world_size": live, "step": step,
                           "step_time_s": round(step_t, 6), "ts_unix_s": round(ts, 6)}
    if sc.roles:
        rec["role"] = sc.roles[r]
    if sc.mode:
        rec["mode"] = sc.mode
    if sc.with_identity:
        rec["pid"] = 10_000 + r + (50_000 if restarted else 0)
        rec["node"] = f"node-{'b' if restarted else 'a'}{r // max(1, sc.ranks_per_node)}"
    if sc.with_stages:
        rec["stages"] = {"compute": round(compute, 6), "comm": round(step_t - compute, 6)}
    if flagged:
        rec["flags"] = [flagged]
    if capturing:
        rec["capturing"] = True
    return rec


def generate_telemetry(sc: TelemetryScenario) -> list[dict[str, Any]]:
    """All records of :func:`iter_telemetry` as a list."""
    return list(iter_telemetry(sc))


@dataclass(frozen=True, slots=True)
class ServingScenario:
    """Parameters of one generated serving job: ``replicas`` independent engines of ``tp`` ranks each (ranks
    ``q * tp .. q * tp + tp - 1`` form replica q), run for ``duration_s`` seconds.

    Model (per replica, its own seeded stream): bursts of work alternate with idle gaps drawn from an
    exponential law of mean ``idle_mean_s`` (at least ``idle_min_s``); a burst has an exponential number of
    iterations of mean ``burst_mean_steps``. The load (how busy the replica is) follows a slow day curve
    ``1 + load_swing * sin(2 pi t / load_period_s)``: it shortens the idle gaps and sets the batch size
    ``b`` (requests in the batch, 1..``max_batch``, a random walk around ``max_batch * load / 2``). One
    iteration in ``prefill_every`` is a prefill of ``prefill_tokens`` extra tokens. Iteration time
    ``t = step_time_s * (0.5 + 0.5 * b / max_batch + prefill_cost * tokens / prefill_tokens) * (1 + cv * N)``;
    ``work`` is the tokens of the iteration (``b`` plus the prefill's). The TP ranks of a replica step together:
    each computes for ``0.8 t`` times its own jitter (its ``stages["compute"]``) and they all take the slowest.
    ``step_time_s`` of the first iteration after an idle gap includes the gap (the hook times from the previous
    ``step()`` call). Changes: ``slow_rank`` computes ``slow_factor`` times slower from ``slow_from_s``;
    ``slow_replica`` runs every iteration ``slow_factor`` times slower from ``slow_from_s``. ``with_work`` /
    ``with_mode`` add the ``work`` / ``mode`` fields. Records come in arrival (``ts_unix_s``) order.
    """

    job_id: str = "serve"
    replicas: int = 1
    tp: int = 4
    duration_s: float = 3600.0
    step_time_s: float = 0.05
    cv: float = 0.03
    rank_jitter_cv: float = 0.01
    idle_mean_s: float = 20.0
    idle_min_s: float = 3.0
    burst_mean_steps: float = 400.0
    max_batch: int = 32
    load_swing: float = 0.6
    load_period_s: float = 4 * 3600.0
    prefill_every: int = 16
    prefill_tokens: int = 2048
    prefill_cost: float = 0.6
    slow_rank: int | None = None
    slow_replica: int | None = None
    slow_factor: float = 1.3
    slow_from_s: float = 0.0
    with_work: bool = True
    with_mode: bool = True
    seed: int = 0
    t0_unix_s: float = 1_764_500_000.0


def _iter_replica(sc: ServingScenario, q: int) -> Iterator[dict[str, Any]]:
    rng = np.random.default_rng([sc.seed, 7, q])
    ranks = list(range(q * sc.tp, (q + 1) * sc.tp))
    world = sc.replicas * sc.tp
    t = sc.t0_unix_s + float(rng.uniform(0, sc.idle_mean_s))
    end = sc.t0_unix_s + sc.duration_s
    step, batch = 0, max(1, sc.max_batch // 4)
    pending_gap = t - sc.t0_unix_s
    while t < end:
        load = 1.0 + sc.load_swing * float(np.sin(2 * np.pi * (t - sc.t0_unix_s) / sc.load_period_s))
        for _ in range(max(1, int(rng.exponential(sc.burst_mean_steps * load)))):
            target = sc.max_batch * load / 2.0
            batch = int(min(sc.max_batch, max(1, batch + rng.integers(-2, 3) + (1 if batch < target else -1))))
            step += 1
            tokens = batch
            frac = 0.5 + 0.5 * batch / sc.max_batch
            if step % sc.prefill_every == 0:
                tokens += sc.prefill_tokens
                frac += sc.prefill_cost
            it = sc.step_time_s * frac * max(0.3, 1.0 + sc.cv * float(rng.standard_normal()))
            late = t - sc.t0_unix_s >= sc.slow_from_s
            if late and sc.slow_replica == q:
                it *= sc.slow_factor
            compute = 0.8 * it * np.maximum(0.3, 1.0 + sc.rank_jitter_cv * rng.standard_normal(sc.tp))
            if late and sc.slow_rank in ranks:
                compute[ranks.index(sc.slow_rank)] *= sc.slow_factor
            dur = float(compute.max()) + 0.2 * it
            t += dur
            for i, r in enumerate(ranks):
                rec: dict[str, Any] = {"job_id": sc.job_id, "rank": r, "world_size": world, "step": step,
                                       "step_time_s": round(dur + pending_gap, 6), "ts_unix_s": round(t, 6),
                                       "stages": {"compute": round(float(compute[i]), 6),
                                                  "comm": round(dur - float(compute[i]), 6)}}
                if sc.with_work:
                    rec["work"] = float(tokens)
                if sc.with_mode:
                    rec["mode"] = "serving"
                yield rec
            pending_gap = 0.0
            if t >= end:
                return
        gap = max(sc.idle_min_s, float(rng.exponential(sc.idle_mean_s / max(0.2, load))))
        t += gap
        pending_gap = gap


def iter_serving_telemetry(sc: ServingScenario) -> Iterator[dict[str, Any]]:
    """Yield the records of every replica merged in ``ts_unix_s`` order (shapes in :class:`ServingScenario`).
    Raises ValueError for ``replicas < 1`` or ``tp < 1``."""
    if sc.replicas < 1 or sc.tp < 1:
        raise ValueError("replicas and tp must be >= 1")
    yield from heapq.merge(*(_iter_replica(sc, q) for q in range(sc.replicas)), key=lambda r: r["ts_unix_s"])
