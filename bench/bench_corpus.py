"""A randomized corpus of job shapes x injected changes, replayed through the coordinator's detection and arming
path (prints tables; no assertions). Issue 31: "an evaluation that cannot be tuned to".

Each run draws a job shape at random within its *shape class* and, in half of the runs, one injected change at
random; the telemetry is generated here (seeded numpy streams) and replayed through ``profwatch replay``'s path
(``replay_lines``: the same ``JobDetector``, episodes, arming policy and capture planner as the coordinator,
default config), as ``bench/bench_workloads.py`` does. The seed list is fixed (run ``i`` of class ``c`` uses the
seed ``[SEED, class index, i]``), so a run is reproducible and a change to the detector cannot be tuned to one
series: the shapes it is judged on are drawn, not picked.

Shape classes (``--classes`` to pick some):

- ``steady``: 2-16 ranks, 0.05-2 s steps, 1-5 % noise; the reference for delays ("the steady job's").
- ``noisy``: 2-64 ranks, 5 ms-10 s steps (log-uniform), 1-20 % noise.
- ``warmup_down`` / ``warmup_up``: the first 5-60 steps after start-up 1.5-20x slower (caches, autotuning) and
  falling, linearly or exponentially / 0.3-0.9x and rising to the level.
- ``interrupts``: unflagged checkpoints (every 100-500 steps, 1-5 steps at 3-8x), evaluations (every 200-1000
  steps, 5-20x), GC pauses (1-3 % of steps, 2-4x), data loader stalls on one rank, pauses of 30-600 s between
  steps.
- ``faster``: a series that only gets faster (a warm-up that falls, speedups of 10-50 %); any
  ``step_regression``, ``drift`` or arm here is an invariant violation.
- ``levels``: level shifts both ways (speedups of 10-40 %, then a slowdown soon after in the injected runs) and
  host-load episodes that persist (+10-30 % job-wide from a random step on): those are real slowdowns, so the
  time they cover is not healthy time and arms there are not false.
- ``drift``: +0.01-0.3 %/step from a random step.
- ``pipeline``: 4-16 ranks in 2-4 declared stages (``role``), the last stage 10-25 % slower from the start.
- ``moe``: 8-32 ranks, a hot expert (+30-60 %) that moves every 20-300 steps from a random step. Its first stay
  on one rank, when it lasts (>= ``LASTING_STEPS`` steps and ``LASTING_S`` s: the issue's "persistent"), is a slow
  rank like any other (a real change, not scored): its time is not healthy and an arm in it is no false arm (seeds
  31, 32 and 34, healthy runs 4, 0 and 3: a 300-step job whose expert never moved, +24-45 % from step 82-104 to the
  end, armed once: counted false before).
- ``requeue``: 2-8 ranks, the same job id requeued after 300-800 steps with 1-8 ranks on other nodes.
- ``large``: 256-1024 ranks, 150-250 steps (per-step aggregates at scale).
- ``serving_work`` / ``serving_nowork`` / ``serving_dp``: serving engines (``mode="serving"``; tensor parallel 2-4
  / 2-4 independent replicas), bursts and idle gaps of 3-60 s, batch size following the load, prefills, and the
  host load changing every 20-90 s (x1.0-1.5), 30-60 minutes each; with and without the ``work`` field.

Injected changes (half of the runs): job-wide, one rank, one node (``node`` field, 2-8 ranks per node), one
replica (serving DP); onset anywhere from step 12 on (a quarter of them while the baseline learns, before step
60); size 1.3x (40 %), 3x (40 %) or uniform 1.1-4x (20 %); lasting to the end of the run (in a requeued job, to the
end of its generation: the next one runs at the old level on new ranks). Reported per class:

- false arms per healthy hour: arms before any change (injected, or a host-load rise in ``levels``) or more than
  ``GRACE_S`` after its end; healthy hours are the record time outside those windows. The captures a rotating
  culprit took by design are counted apart, in ``rot caps``: those a ``culprit_rotates`` event names
  (``capture_ids``), at most ``[arming] rotation_captures`` (2) per job generation (issue 31: "a rotation ... takes
  at most two captures"; until the hot spot first moves, a hot MoE expert is a slow rank like any other). Every
  other arm in healthy time, a third capture of a rotation included, is a false arm. ``rot caps`` are arms all
  the same: a user sees them, so they are printed beside the false arms, with their own rate, never dropped.
  Arms withdrawn before their window (the replay's ``withdrawn``: the excursion came back during the capture's
  lead, nothing recorded, no budget spent, one ``episode_closed`` with reason ``returned``) are counted apart in
  ``wdrawn`` (all of them, healthy or not), never as false arms, and never cover a change;
- changes lost: a *lasting* change (>= 60 steps and >= 5 minutes, or to the end of a run shorter than that when
  it outlasted a capture armed at its onset: the planner's lead at the step time before it, plus the capture's
  warm-up and active steps; one cut short by the run's end sooner could not have been profiled by any capture and
  is counted apart, in ``short``; one whose changed unit never ran a step before its onset has no level to change
  from and is shown apart, in ``unseen``, as not detectable) at
  least 2x the unit's noise and at least ``min_effect`` that no arm covered while it lasted (covers: the arm's
  rank list holds the changed ranks and it names them or none; it was made after the onset, or just before it with
  a capture window that starts on a changed step; in a training run its window must also begin on a step the run
  has while the change lasts: an arm whose window lay past the run's end profiled nothing);
- detection delay percentiles (steps from onset to the first report that names the change) at 1.3x and at 3x;
  after the table, each class's median delays beside the steady job's in steps and in seconds, with whether it is
  within 2x of the steady job's in steps, in seconds, both or neither (a fast-step job's capture lead holds a
  spike for seconds, which is hundreds of its steps; a slow-step job's few steps are minutes), and the median
  seconds from the change to the window of its first covering capture (``window``: the report's delay, any wait
  for the budget, the capture's lead and warm-up; the delay a user waits for a trace);
- invariant violations: a magnitude not finite, over 100 (+10,000 %) or under -1; a ``baseline_s`` under 1 % of
  the observed level (the median job step time of the 50 steps before the report; a serving unit's baseline is a
  ratio to its load's usual time: level 1); a regression in ``faster``;
- the noise floor used (``noise_floor`` and ``MIN_NOISE`` of ``regression.py``). The unit's noise that decides
  "detectable": the per-step noise drawn for a training job; for a serving unit, also measured on its steps
  before the onset (``_unit_noise``: what its comparison sees, less its work band's median, ``1.4826 * MAD`` of the
  log), the larger of the two. Without ``work``, a job-wide change is seen against the batch (nothing measures
  it) and the host load: ~0.12-0.31 in log in seeds 31-32, where the drawn jitter was 1-8 %. Where the drawn
  noise alone would score differently, the table prints that count too, with the measured noise used.

Usage: ``python bench/bench_corpus.py [--runs 48] [--classes steady,noisy] [--seed 31]``; ``--runs`` is runs per
class (serving classes half, ``large`` a quarter). Cost: about 10 s of CPU and 200k records per run of 8 per
class (``--runs 8``: 102 runs, 1.6M records, 81 s CPU); the default of 48 is about 8 minutes of one idle core
(much longer on a loaded host: niced at a load of 13 on 2 cores, ``--runs 8`` took 12-15 minutes of wall) and
covers about 6 healthy hours per class; the 20 healthy hours per class the false-arm rate should be judged on
need about ``--runs 160``. ``--json PATH`` writes every run.

``--healthy-hours H [--seed 31,32,33,34] [--class-wall S]``: the false-arm rate alone, measured over H healthy hours
per class. Only healthy runs are drawn (no injected change; a class's own background changes stay, and the time
they cover is not healthy: ``levels``' persistent host load, ``drift``'s drift), from a seed stream of their own
(run ``i`` of seed ``s``: ``[s, class index, HEALTHY_STREAM, i]``, never an injected run's), round-robin over the
seed list, until the class's healthy hours reach H or its runs have taken S s of wall time (default 600). The
shapes are the class's own (same step counts and durations: a longer run would be another class, e.g. a warm-up
or a learning baseline a smaller share of the time). Per class: runs, healthy hours reached (``SHORT`` where the
wall cap ended the class under H), false arms, their rate, the exact one-sided 95 % Poisson upper bound on it
(:func:`poisson_upper`; 0 arms in 20 h bound the rate at 0.15/h, 30 h are needed to bound it under 0.1/h), the
rotation's captures, withdrawn arms, wall seconds and wall seconds per healthy hour; then every false arm with its
seed, run, step and time. Cost per healthy hour (CPU): ~3-4 s for most classes; ``levels`` ~10 s and ``drift``
~16 s (most of their time follows a persistent slowdown: not healthy); ``large`` ~18 s (256-1024 ranks, ~0.9M
records per healthy hour). Niced on 2 cores at a load average of 7-14 that was 5-30 s of wall per healthy hour,
50-95 s for ``levels``, ``drift`` and ``large``: 200 s a class reached 20 h only for ``warmup_down`` and
``requeue`` (seeds 31-34); 20 h of every class is about 1.5 hours of wall there.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "daemon"))

from profwatch.commands.replay import ReplayConfig, replay_lines
from profwatch.core.arming.settings import ArmingSettings
from profwatch.core.capture.planner import CaptureSettings, lead_steps
from profwatch.core.detection.settings import DetectionSettings

try:
    from profwatch.core.detection.regression import MIN_NOISE
except ImportError:  # a tree from before issue 31 (the bench is run on it for the "before" table)
    MIN_NOISE = 0.0

SEED = 31
T0 = 1_764_500_000.0
GRACE_S = 600.0
"""An arm this long after a change ended still belongs to it (an episode waits for the budget)."""
LASTING_STEPS = 60
LASTING_S = 300.0
MAX_MAGNITUDE = 100.0
MIN_BASELINE_FRACTION = 0.01
HEALTHY_STREAM = 4_848
"""``--healthy-hours`` runs are seeded ``[SEED, class index, HEALTHY_STREAM, i]``: a stream of their own, apart
from the injected runs' ``[SEED, class index, i]`` and the streams derived from those (``[..., i, 1]``,
``[..., i, 7, q]``)."""


@dataclass
class Change:
    """An injected change (or a background one: ``scored`` False): onset step (of ``epoch``), ``factor`` on the
    changed ranks' compute (job-wide: every rank's whole step), ``ranks`` (() = job-wide), ``until`` step or None."""

    kind: str
    onset: int
    factor: float
    ranks: tuple[int, ...] = ()
    scored: bool = True
    epoch: int = 0
    noise: float = 0.03
    onset_t: float = math.nan
    end_t: float = math.nan
    steps_lasting: int = 0
    learning: bool = False
    """Its onset falls while the baseline learns (before step 60; serving: in the first minute)."""
    seen: bool = True
    """The changed unit ran a step before the onset (serving: a replica's first step comes after an idle gap of up
    to a minute). One that never ran at the old level has no level to change from: nothing can tell the change from
    the job's own level (seed 31, ``serving_work`` runs 0 and 6: 1.3x at 36 s and 22 s, each replica's first step at
    40 s and 26 s). Such a change is scored as not detectable and shown apart (``unseen``)."""
    until: int | None = None
    """The change's last step (of its epoch); None: it lasts to the end of its generation."""
    lasting_only: bool = False
    """A background change that is a change only when it lasts (:func:`_lasting`: >= ``LASTING_STEPS`` steps and
    ``LASTING_S`` s): a hot MoE expert that stays on one rank that long is a slow rank like any other (an arm for it
    is no false arm); one that moves sooner is the rotation, whose arms are judged as a rotation's."""
    unit_noise: float = math.nan
    """Serving: the changed unit's noise measured on its steps before the onset (:func:`_unit_noise`); NaN where
    not measured (training: :attr:`noise`, the per-step jitter drawn, is the noise of what the detectors judge)."""


@dataclass
class Run:
    cls: str
    seed: int
    lines: list[str] = field(default_factory=list)
    changes: list[Change] = field(default_factory=list)
    serving: bool = False
    start_t: float = T0
    end_t: float = T0
    levels: list[tuple[float, float]] = field(default_factory=list)
    """(arrival time, job step time) of each step (rank 0), for the observed level."""
    step_at: dict[tuple[int, int], float] = field(default_factory=dict)
    """(epoch, step) -> first arrival time."""
    shape: dict[str, Any] = field(default_factory=dict)


def _loguniform(rng: np.random.Generator, lo: float, hi: float) -> float:
    return float(math.exp(rng.uniform(math.log(lo), math.log(hi))))


def _size(rng: np.random.Generator) -> float:
    u = rng.random()
    return 1.3 if u < 0.4 else 3.0 if u < 0.8 else float(rng.uniform(1.1, 4.0))


def _onset(rng: np.random.Generator, steps: int) -> int:
    if rng.random() < 0.25:
        return int(rng.integers(12, 60))
    return int(rng.integers(60, max(61, int(0.7 * steps))))


# -- training jobs -------------------------------------------------------------------------------------------------
@dataclass
class TrainShape:
    world: int
    steps: int
    step_s: float
    cv: float
    level: np.ndarray
    """Job-wide factor per step (index 0 = step 1)."""
    rank_factor: np.ndarray | None = None
    """Per step and rank compute factor (steps x world), or None."""
    pauses: dict[int, float] = field(default_factory=dict)
    roles: list[str] | None = None
    ranks_per_node: int = 8
    restart_after: int | None = None
    restart_world: int = 0
    restart_steps: int = 0
    restart_level: float = 1.0
    """Job-wide factor of the requeued generation's steps (1.0: the old level on new ranks; ``bench_new_shapes.py``
    requeues onto a slower or faster node set)."""


def _train_shape(cls: str, rng: np.random.Generator) -> tuple[TrainShape, list[Change]]:
    background: list[Change] = []
    if cls == "steady":
        world, step_s, cv = int(rng.integers(2, 17)), _loguniform(rng, 0.05, 2.0), float(rng.uniform(0.01, 0.05))
    elif cls == "large":
        world, step_s, cv = int(rng.integers(256, 1025)), _loguniform(rng, 0.2, 10.0), float(rng.uniform(0.01, 0.1))
    elif cls == "moe":
        world, step_s, cv = int(rng.choice([8, 16, 32])), _loguniform(rng, 0.1, 5.0), float(rng.uniform(0.01, 0.1))
    elif cls == "pipeline":
        world, step_s, cv = int(rng.choice([4, 8, 16])), _loguniform(rng, 0.1, 5.0), float(rng.uniform(0.01, 0.1))
    else:
        world = int(min(64, max(2, round(_loguniform(rng, 2, 64)))))
        step_s, cv = _loguniform(rng, 0.005, 10.0), float(rng.uniform(0.01, 0.20))
    if cls == "large":
        steps = int(rng.integers(150, 251))
    else:  # 10-30 minutes of steps, 300..1500 of them (fast jobs: fewer ranks)
        steps = int(min(1500, max(300, rng.uniform(600, 1800) / step_s)))
        if step_s < 0.05:
            world = min(world, 4)
    level = np.ones(steps)
    rank_factor: np.ndarray | None = None
    sh = TrainShape(world, steps, step_s, cv, level)
    if cls in ("warmup_down", "faster"):
        n = int(rng.integers(5, 61))
        top = _loguniform(rng, 1.5, 20.0)
        ramp = np.linspace(top, 1.0, n) if rng.random() < 0.5 else 1.0 + (top - 1.0) * np.exp(-np.arange(n) / (n / 4))
        level[:n] = ramp
    if cls == "warmup_up":
        n = int(rng.integers(5, 61))
        low = float(rng.uniform(0.3, 0.9))
        level[:n] = np.linspace(low, 1.0, n)
    if cls == "faster":
        for _ in range(int(rng.integers(1, 4))):
            at = int(rng.integers(60, steps))
            level[at:] *= float(rng.uniform(0.5, 0.9))
    if cls == "interrupts":
        ck, ev = int(rng.integers(100, 501)), int(rng.integers(200, 1001))
        ckf, ckn, evf = float(rng.uniform(3, 8)), int(rng.integers(1, 6)), float(rng.uniform(5, 20))
        idx = np.arange(steps)
        level[(idx % ck < ckn) & (idx > 0)] *= ckf
        level[(idx % ev == 0) & (idx > 0)] *= evf
        gc = rng.random(steps) < float(rng.uniform(0.01, 0.03))
        level[gc] *= rng.uniform(2, 4, int(gc.sum()))
        rank_factor = np.ones((steps, world))
        stalls = np.flatnonzero(rng.random(steps) < 0.01)
        rank_factor[stalls, rng.integers(0, world, stalls.size)] = rng.uniform(2, 4, stalls.size)
        for _ in range(int(rng.integers(0, 3))):
            sh.pauses[int(rng.integers(20, steps))] = float(rng.uniform(30, 600))
    if cls == "levels":
        for _ in range(int(rng.integers(1, 3))):
            at = int(rng.integers(30, steps))
            if rng.random() < 0.5:
                level[at:] *= float(rng.uniform(0.6, 0.9))  # a speedup (a noisy neighbour left)
            else:
                f = float(rng.uniform(1.1, 1.3))  # host load that persists: a real slowdown (not scored)
                level[at:] *= f
                background.append(Change("host_load", at + 1, f, (), scored=False, noise=cv))
    if cls == "drift":
        at = int(rng.integers(1, max(2, steps // 2)))
        rate = _loguniform(rng, 1e-4, 3e-3)
        level *= 1.0 + rate * np.maximum(0, np.arange(steps) - at)
        sh.level = level = np.minimum(level, 3.0)
        background.append(Change("drift", at + 1, 1.0, (), scored=False, noise=cv))  # a real slowdown too
    if cls == "pipeline":
        stages = int(rng.choice([2, 4]))
        per = world // stages
        sh.roles = [f"pp{r // per}" for r in range(world)]
        rank_factor = np.ones((steps, world))
        rank_factor[:, world - per:] = float(rng.uniform(1.10, 1.25))
    if cls == "moe":
        every, f, at = int(rng.integers(20, 301)), float(rng.uniform(1.3, 1.6)), int(rng.integers(50, steps // 2))
        rank_factor = np.ones((steps, world))
        for i in range(at, steps):
            rank_factor[i, ((i - at) // every) % world] = f
        # the hot expert's first stay on rank 0 (steps at+1 .. at+every): a slow rank when it lasts
        background.append(Change("hot_expert", at + 1, 1.0, (), scored=False, noise=cv, until=at + every,
                                 lasting_only=True))
    if cls == "requeue":
        lo = min(300, steps // 2)  # a short run (<= 300 steps) is requeued in its second half
        sh.restart_after = int(rng.integers(lo, max(lo + 1, min(801, steps))))
        sh.restart_world = int(rng.integers(1, world + 1))
        sh.restart_steps = int(rng.integers(300, 900))
    sh.rank_factor = rank_factor
    sh.ranks_per_node = int(rng.choice([2, 4, 8]))
    return sh, background


def _train_change(cls: str, sh: TrainShape, rng: np.random.Generator) -> Change | None:
    if cls == "faster" or rng.random() >= 0.5:
        return None
    epoch = 1 if sh.restart_after is not None and rng.random() < 0.5 else 0
    world = sh.restart_world if epoch else sh.world
    steps = sh.restart_steps if epoch else (sh.restart_after or sh.steps)
    onset = _onset(rng, steps)
    if cls == "levels":  # a slowdown soon after a speedup
        at = max(30, onset - int(rng.integers(5, 46)))
        sh.level[at:] *= 0.75
    size = _size(rng)
    u = rng.random()
    if u < 0.4 or world < 2:
        c = Change("job", onset, size, (), epoch=epoch, noise=sh.cv)
    elif u < 0.7 or world <= sh.ranks_per_node:
        c = Change("rank", onset, size, (int(rng.integers(0, world)),), epoch=epoch, noise=sh.cv)
    else:
        node = int(rng.integers(0, world // sh.ranks_per_node))
        c = Change("node", onset, size, tuple(range(node * sh.ranks_per_node, (node + 1) * sh.ranks_per_node)),
                   epoch=epoch, noise=sh.cv)
    c.learning = onset < 60
    return c


def _fmt(v: float) -> str:
    return f"{v:.6g}"


def _train_run(cls: str, seed: list[int], inject: bool = True,
               shape_fn: Callable[[str, np.random.Generator], tuple[TrainShape, list[Change]]] | None = None,
               change_fn: Callable[[str, TrainShape, np.random.Generator], Change | None] | None = None) -> Run:
    """One training run of class ``cls``: its shape drawn by ``shape_fn`` (default :func:`_train_shape`) and, when
    ``inject``, its change by ``change_fn`` (default :func:`_train_change`), both from the seed's stream.
    ``bench_new_shapes.py`` passes shapes of its own."""
    rng = np.random.default_rng(seed)
    sh, background = (shape_fn or _train_shape)(cls, rng)
    change = (change_fn or _train_change)(cls, sh, rng) if inject else None
    run = Run(cls, seed[-1], changes=background + ([change] if change else []))
    run.shape = {"world": sh.world, "steps": sh.steps, "step_s": round(sh.step_s, 4), "cv": round(sh.cv, 3)}
    noise = np.random.default_rng([*seed, 1])
    job = f"{cls}-{seed[-1]}"
    t = T0
    plan = [(0, i) for i in range(sh.steps if sh.restart_after is None else sh.restart_after)]
    if sh.restart_after is not None:
        plan += [(1, i) for i in range(sh.restart_steps)]
    prev_epoch = 0
    lines = run.lines
    for epoch, i in plan:
        if epoch != prev_epoch:
            t += float(rng.uniform(30, 300))
            prev_epoch = epoch
        world = sh.restart_world if epoch else sh.world
        step = i + 1
        if epoch == 0 and i in sh.pauses:
            t += sh.pauses[i]
        lvl = float(sh.level[min(i, sh.steps - 1)]) if epoch == 0 else sh.restart_level
        g = max(0.2, 1.0 + sh.cv * float(noise.standard_normal()))
        base = sh.step_s * lvl * g
        compute = base * 0.8 * np.maximum(0.2, 1.0 + 0.005 * noise.standard_normal(world))
        if sh.rank_factor is not None and epoch == 0:
            compute *= sh.rank_factor[min(i, sh.steps - 1), :world]
        for c in run.changes:
            if c.epoch == epoch and step >= c.onset:
                if c.ranks:
                    for r in c.ranks:
                        if r < world:
                            compute[r] *= c.factor
                elif c.scored:
                    compute *= c.factor
                    base *= c.factor
        comm = base * 0.2
        st = float(compute.max()) + comm
        t += st
        run.levels.append((t, st))
        run.step_at.setdefault((epoch, step), t)
        tail = f', "step_time_s": {_fmt(st)}, "ts_unix_s": {t:.6f}, "stages": {{"compute": '
        for r in range(world):
            extra = ""
            if sh.roles is not None:
                extra += f', "role": "{sh.roles[r]}"'
            if sh.restart_after is not None:  # a requeued job (class ``requeue`` alone in this corpus)
                extra += f', "pid": {10000 + r + 50000 * epoch}, "node": "n{epoch}-{r // sh.ranks_per_node}"'
            elif world > sh.ranks_per_node:
                extra += f', "node": "n-{r // sh.ranks_per_node}"'
            lines.append(f'{{"job_id": "{job}", "rank": {r}, "world_size": {world}, "step": {step}{tail}'
                         f'{_fmt(float(compute[r]))}, "comm": {_fmt(st - float(compute[r]))}}}{extra}}}')
    run.end_t = t
    return run


# -- serving jobs --------------------------------------------------------------------------------------------------
def _serving_change(rng: np.random.Generator, dp: bool, replicas: int, tp: int, cv: float,
                    duration: float) -> Change:
    """A serving run's injected change (drawn after the coin that decided it): a replica's (DP), else one TP rank's
    or the job's, its size, onset 60 s to 70 % of the run (a quarter of them 20-60 s: while the unit learns)."""
    size = _size(rng)
    onset_s = float(rng.uniform(60, 0.7 * duration)) if rng.random() >= 0.25 else float(rng.uniform(20, 60))
    if dp:
        change = Change("replica", 0, size, (int(rng.integers(0, replicas)),), noise=cv)
    elif rng.random() < 0.5:
        change = Change("rank", 0, size, (int(rng.integers(0, tp)),), noise=cv)
    else:
        change = Change("job", 0, size, (), noise=cv)
    change.onset_t = T0 + onset_s
    change.learning = onset_s < 60
    return change


def _host_loads(rng: np.random.Generator, duration: float) -> tuple[np.ndarray, list[float]]:
    """The host's load over a serving run, shared by its replicas: piecewise constant, 1.0-1.5x, changing every
    20-90 s; ``(start times, loads)``."""
    cuts, loads, t = [], [], 0.0
    while t < duration:
        cuts.append(T0 + t)
        loads.append(float(rng.uniform(1.0, 1.5)))
        t += float(rng.uniform(20, 90))
    return np.asarray(cuts), loads


def _serving_run(cls: str, seed: list[int], inject: bool = True,
                 traffic: Callable[[float], float] | None = None, duration_s: tuple[float, float] | None = None) -> Run:
    """One serving run of class ``cls``. ``traffic`` (``bench_new_shapes.py``; None here): the load's share of its
    peak (0-1] at a fraction (0-1) of the run: bursts ``2 * share`` times their drawn mean, idle gaps over ``share``,
    the batch capped at ``32 * share`` (at least 1); ``duration_s``: the run's length range in seconds instead of
    30-60 minutes."""
    rng = np.random.default_rng(seed)
    dp = cls == "serving_dp"
    replicas = int(rng.integers(2, 5)) if dp else 1
    tp = 1 if dp else int(rng.integers(2, 5))
    with_work = cls != "serving_nowork"
    step_s = _loguniform(rng, 0.05, 0.5)
    cv = float(rng.uniform(0.01, 0.08))
    duration = float(rng.uniform(1800, 3600))
    if duration_s is not None:
        duration = float(rng.uniform(*duration_s))
    idle_mean = float(rng.uniform(10, 60))
    burst_mean = float(rng.uniform(30, 200))
    world = replicas * tp
    change = _serving_change(rng, dp, replicas, tp, cv, duration) if inject and rng.random() < 0.5 else None
    cuts_a, loads = _host_loads(rng, duration)
    run = Run(cls, seed[-1], changes=[change] if change else [], serving=True)
    run.shape = {"replicas": replicas, "tp": tp, "step_s": round(step_s, 4), "cv": round(cv, 3),
                 "minutes": round(duration / 60, 1), "work": with_work}
    job = f"{cls}-{seed[-1]}"
    recs: list[tuple[float, str]] = []
    first_t: list[float] = []
    healthy: list[tuple[int, int, float, float, float]] = []  # (replica, tokens, step s, host load, rank ratio)
    for q in range(replicas):
        rs = np.random.default_rng([*seed, 7, q])
        t = T0 + float(rs.uniform(0, idle_mean))
        first_t.append(t)
        step, batch, pending = 0, 8, t - T0
        end = T0 + duration
        while t < end:
            share = 1.0 if traffic is None else max(0.02, min(1.0, traffic((t - T0) / duration)))
            cap = 32 if traffic is None else max(1, int(32 * share))
            for _ in range(max(1, int(rs.exponential(burst_mean if traffic is None else 2 * share * burst_mean)))):
                batch = int(min(cap, max(1, batch + rs.integers(-2, 3))))
                step += 1
                tokens = batch
                frac = 0.5 + 0.5 * batch / 32
                if step % 16 == 0:
                    tokens += 1024
                    frac += 0.4
                host = loads[int(np.searchsorted(cuts_a, t, side="right")) - 1]
                it = step_s * frac * host * max(0.3, 1.0 + cv * float(rs.standard_normal()))
                late = change is not None and t >= change.onset_t
                if late and change is not None and (change.kind == "job" or (change.kind == "replica"
                                                                              and change.ranks == (q,))):
                    it *= change.factor
                compute = 0.8 * it * np.maximum(0.3, 1.0 + 0.01 * rs.standard_normal(tp))
                if late and change is not None and change.kind == "rank":
                    compute[change.ranks[0]] *= change.factor
                dur = float(compute.max()) + 0.2 * it
                if change is not None and not late:
                    r0 = change.ranks[0] if change.kind == "rank" else 0
                    healthy.append((q, tokens, dur, host, float(compute[r0] / np.median(compute))))
                t += dur
                for i in range(tp):
                    r = q * tp + i
                    if q == 0 and i == 0:
                        run.levels.append((t, dur))
                    w = f', "work": {tokens}' if with_work else ""
                    recs.append((t, f'{{"job_id": "{job}", "rank": {r}, "world_size": {world}, "step": {step}, '
                                    f'"step_time_s": {_fmt(dur + pending)}, "ts_unix_s": {t:.6f}, "stages": '
                                    f'{{"compute": {_fmt(float(compute[i]))}, "comm": {_fmt(dur - float(compute[i]))}}}'
                                    f'{w}, "mode": "serving"}}'))
                pending = 0.0
                if t >= end:
                    break
            gap = max(3.0, float(rs.exponential(idle_mean if traffic is None else idle_mean / share)))
            t += gap
            pending = gap
    recs.sort(key=lambda x: x[0])
    run.lines = [line for _, line in recs]
    run.end_t = recs[-1][0] if recs else T0
    if change is not None:
        _settle_serving_change(change, first_t, healthy, with_work, replicas, tp if dp else 0)
    return run


def _settle_serving_change(change: Change, first_t: list[float], healthy: list[tuple[int, int, float, float, float]],
                           with_work: bool, replicas: int, dp_tp: int) -> None:
    """After a serving run is drawn: whether the changed replicas (a job-wide change: any) ran a step before the
    onset (its first step started at the old level), the changed unit's noise (:func:`_unit_noise`), and for a
    replica's change (``dp_tp`` its TP size; 0: not DP) the replica's first rank."""
    units = range(replicas) if change.kind == "job" else [change.ranks[0]] if dp_tp else [0]
    change.seen = any(first_t[q] < change.onset_t for q in units)
    change.unit_noise = _unit_noise(change, healthy, with_work)
    if dp_tp:
        change.ranks = (change.ranks[0] * dp_tp,)  # replica q's rank(s)


def _unit_noise(change: Change, healthy: list[tuple[int, int, float, float, float]], with_work: bool) -> float:
    """The changed serving unit's noise, measured on its steps before the onset: ``1.4826 * MAD`` of the log of
    what the unit's comparison sees, less the median of its work band (powers of 1.1 of ``work``, as the detectors
    band it; one band without ``work``). What it sees: a TP rank (``rank``), its compute over the median of its
    replica's (its peers share everything else); a replica, its step time over the host load (its peers share
    that); a job-wide change, the step time itself (nothing cancels the host load or, without ``work``, the
    batch). NaN with fewer than 30 such steps (then the drawn per-step noise stands)."""
    if change.kind == "rank":
        xs = [(1, math.log(rr)) for _, _, _, _, rr in healthy]
    elif change.kind == "replica":
        xs = [(tok, math.log(st / host)) for q, tok, st, host, _ in healthy if q == change.ranks[0]]
    else:
        xs = [(tok, math.log(st)) for _, tok, st, _, _ in healthy]
    if len(xs) < 30:
        return math.nan
    bands: dict[int, list[float]] = defaultdict(list)
    for tok, x in xs:
        bands[int(math.floor(math.log(tok) / math.log(1.1))) if with_work else 0].append(x)
    res = [x - m for v in bands.values() for m in [float(np.median(v))] for x in v]
    return float(1.4826 * np.median(np.abs(np.asarray(res) - np.median(res))))


# -- scoring -------------------------------------------------------------------------------------------------------
def _change_windows(run: Run) -> None:
    """Fill each change's onset / end time and how many steps it lasted. A change ends with its generation: one in
    a requeued job's first generation is gone when the job is requeued (the new ranks run at the old level), so
    the second generation's time is neither its time nor its arms its captures (it ran to the run's end before:
    a requeue's arms for anything counted as captures of a change already gone, and its time as not healthy)."""
    for c in run.changes:
        if math.isnan(c.onset_t):
            c.onset_t = min((t for (e, s), t in run.step_at.items() if e == c.epoch and s >= c.onset),
                            default=run.end_t)
        c.end_t = max((t for (e, s), t in run.step_at.items() if e == c.epoch and (c.until is None or s <= c.until)),
                      default=run.end_t)
        c.steps_lasting = sum(1 for t, _ in run.levels if c.onset_t <= t <= c.end_t)


def _observed_level(run: Run, t: float) -> float:
    times = [st for at, st in run.levels if at <= t][-50:]
    if not times:
        times = [st for _, st in run.levels[:50]]
    return float(np.median(times)) if times else math.nan


def _lasting(c: Change) -> bool:
    """Whether a change (its window filled by :func:`_change_windows`) lasted ``LASTING_STEPS`` steps and
    ``LASTING_S`` seconds: the issue's "persistent"."""
    return c.steps_lasting >= LASTING_STEPS and c.end_t - c.onset_t >= LASTING_S


def _rotation_arms(res: dict[str, Any]) -> set[str]:
    """Capture ids of the arms a rotating culprit took by design: the captures that each ``culprit_rotates`` event
    lists (``capture_ids``: the captures that showed the hot spot moving), at most ``[arming] rotation_captures``
    per job generation, the earliest first. Issue 31 prescribes them ("a rotation ... takes at most two
    captures"): until the hot spot moves, a hot MoE expert is a slow rank like any other. Any further arm of a
    rotation stays a false arm."""
    cap = ArmingSettings().rotation_captures
    arms = {a.get("capture_id"): a for a in res["arms"]}
    ids: dict[str, set[str]] = defaultdict(set)
    for e in res["episode_events"]:
        if e["type"].endswith(".culprit_rotates.v1"):
            ids[e["job_id"]].update(c for c in e.get("capture_ids") or () if c in arms)
    out: set[str] = set()
    for job, cids in ids.items():
        gens = 1 + sum(1 for g in res.get("generations") or () if g.get("job_id") == job)
        out.update(sorted(cids, key=lambda c: arms[c]["at_unix_s"])[:cap * gens])
    return out


def _violations(run: Run, res: dict[str, Any], arms: list[dict[str, Any]]) -> list[str]:
    """The invariant violations of one run's reports (see the module docstring)."""
    violations: list[str] = []
    for a in res["anomalies"]:
        m = a["magnitude"]
        if not math.isfinite(m) or m > MAX_MAGNITUDE or m < -1.0:
            violations.append(f"{a['kind']} magnitude {m}")
        b = a["detail"].get("baseline_s") if isinstance(a.get("detail"), dict) else None
        if isinstance(b, (int, float)):
            level = 1.0 if run.serving else _observed_level(run, a["at_unix_s"])
            if not math.isfinite(b) or (math.isfinite(level) and b < MIN_BASELINE_FRACTION * level):
                violations.append(f"{a['kind']} baseline_s {b} vs level {level:.4g}")
        if run.cls == "faster" and a["kind"] in ("step_regression", "drift"):
            violations.append(f"{a['kind']} on a series that only gets faster")
    if run.cls == "faster":
        violations += [f"arm {a['kind']} on a series that only gets faster" for a in arms]
    return violations


def _window_t(run: Run, c: Change, arm: dict[str, Any]) -> float | None:
    """When an arm's capture window (``start_step + warmup``) began in the change's generation (None: the arm has
    no ``start_step``, or the run has no such step)."""
    start = arm.get("start_step")
    if not isinstance(start, int):
        return None
    return run.step_at.get((c.epoch, start + int(arm.get("warmup") or 0)))


def _window_after_onset(run: Run, c: Change, arm: dict[str, Any]) -> bool:
    """An arm made just before the change began whose capture window (``start_step + warmup`` on) profiled the
    changed steps: it captured the change (its window starts at or after the onset, within ``GRACE_S`` of the arm
    and before the change ended)."""
    t = _window_t(run, c, arm)
    return t is not None and c.onset_t <= t <= c.end_t and 0.0 <= t - arm["at_unix_s"] <= GRACE_S


def _capture_steps(run: Run, c: Change) -> int:
    """Steps a capture armed at the change's onset needs before its window has profiled changed steps: the
    planner's lead (``lead_steps``, at the median step time of the 50 steps before the onset) plus the warm-up and
    active steps of the captures detection arms (``[arming] warmup``/``active`` defaults). A requeued 7.7 ms job whose 3x change ran 226 steps
    to the job's end (bench seed 31, ``requeue`` run 26) had a lead of 393 steps: no capture could start in time."""
    before = [st for t, st in run.levels if t < c.onset_t][-50:]
    step_s = float(np.median(before)) if before else float(np.median([st for _, st in run.levels[:50]]))
    cs, arming = CaptureSettings(), ArmingSettings()
    return lead_steps(c.onset, step_s, cs) + arming.warmup + arming.active


def _scored_changes(run: Run, res: dict[str, Any], arms: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per scored change: lasting, detectable, delay (steps), captured."""
    out_changes = []
    for c in run.changes:
        if not c.scored:
            continue
        dur_s = c.end_t - c.onset_t
        cut = dur_s < LASTING_S and c.end_t >= run.end_t  # ended with the run
        need = _capture_steps(run, c)
        short = cut and c.steps_lasting >= LASTING_STEPS and c.steps_lasting < need
        lasting = c.steps_lasting >= LASTING_STEPS and (dur_s >= LASTING_S or (cut and not short))
        floor = max(c.noise, c.unit_noise) if math.isfinite(c.unit_noise) else c.noise
        detectable = c.seen and abs(c.factor - 1.0) >= max(2.0 * floor, DetectionSettings().min_effect)
        detectable_drawn = c.seen and abs(c.factor - 1.0) >= max(2.0 * c.noise, DetectionSettings().min_effect)

        def names(a: dict[str, Any], c: Change = c) -> bool:
            return not c.ranks or not a["ranks"] or bool(set(c.ranks) & set(a["ranks"]))

        hits = [a for a in res["anomalies"] if a["kind"] in ("step_regression", "rank_outlier")
                and a["at_unix_s"] >= c.onset_t and names(a)]
        delay = delay_s = math.nan
        if hits:
            first = min(hits, key=lambda a: a["at_unix_s"])
            delay = float(sum(1 for t, _ in run.levels if c.onset_t <= t <= first["at_unix_s"]))
            delay_s = float(first["at_unix_s"] - c.onset_t)
        def profiled(a: dict[str, Any], c: Change = c) -> bool:
            """A training run's arm whose capture window (``start_step + warmup``) began while the change lasted,
            on a step the run has: an arm whose window lay past the run's last step (a lead planned at the step
            time before the change) never profiled it (bench seed 40 requeue run 0: armed at step 384, window at
            866 of a 635-step run; counted captured before). Serving runs keep no step clock here: their arms
            count as before."""
            if run.serving or not isinstance(a.get("start_step"), int):
                return True
            t = _window_t(run, c, a)
            return t is not None and a["at_unix_s"] <= t <= c.end_t

        covering = [a for a in arms
                    if (c.onset_t <= a["at_unix_s"] <= c.end_t + GRACE_S or _window_after_onset(run, c, a))
                    and names(a) and (a["rank_list"] is None or not c.ranks or set(c.ranks) <= set(a["rank_list"]))
                    and profiled(a)]
        captured = bool(covering)
        window_s = math.nan  # onset -> the first covering capture's window (start_step + warmup), seconds
        for a in sorted(covering, key=lambda a: a["at_unix_s"]):
            t = _window_t(run, c, a)
            if t is not None:
                window_s = float(t - c.onset_t)
                break
        out_changes.append({"kind": c.kind, "factor": round(c.factor, 3), "onset": c.onset,
                            "onset_s": round(c.onset_t - T0, 1), "lasting": lasting,
                            "short": short, "steps_lasting": c.steps_lasting, "capture_steps": need,
                            "detectable": detectable, "delay_steps": delay, "delay_s": delay_s,
                            "window_s": window_s, "captured": captured,
                            "noise_used": round(floor, 4), "detectable_drawn": detectable_drawn,
                            "learning": c.learning, "unseen": not c.seen})
    return out_changes


def score(run: Run, res: dict[str, Any]) -> dict[str, Any]:
    _change_windows(run)
    gone = {w["capture_id"] for w in res.get("withdrawn") or ()}
    withdrawn = [a for a in res["arms"] if a.get("capture_id") in gone]
    arms = [a for a in res["arms"] if a.get("capture_id") not in gone]  # withdrawn: never a capture, never covers
    changes = [c for c in run.changes if not c.lasting_only or _lasting(c)]
    windows = [(c.onset_t, c.end_t + GRACE_S) for c in changes]
    healthy_arms = [a for a in arms if not any(lo <= a["at_unix_s"] <= hi for lo, hi in windows)
                    and not any(_window_after_onset(run, c, a) for c in changes)]
    by_design = _rotation_arms(res)
    rotation_arms = [a for a in healthy_arms if a.get("capture_id") in by_design]
    false_arms = [a for a in healthy_arms if a.get("capture_id") not in by_design]
    healthy_s = run.end_t - run.start_t
    for lo, hi in sorted(windows):
        healthy_s -= max(0.0, min(hi, run.end_t) - max(lo, run.start_t))
    healthy_s = max(0.0, healthy_s)
    violations = _violations(run, res, res["arms"])
    out_changes = _scored_changes(run, res, arms)
    return {"class": run.cls, "seed": run.seed, "shape": run.shape, "healthy_h": healthy_s / 3600.0,
            "false_arms": len(false_arms), "false_arm_kinds": [a["kind"] for a in false_arms],
            "false_arm_at": [{"kind": a["kind"], "step": a["step"], "at_s": round(a["at_unix_s"] - run.start_t, 1),
                              "ranks": a["ranks"], "reason": a["reason"]} for a in false_arms],
            "rotation_arms": len(rotation_arms), "withdrawn": len(withdrawn),
            "violations": violations, "changes": out_changes, "records": len(run.lines),
            "max_magnitude": max((a["magnitude"] for a in res["anomalies"]), default=0.0)}


CLASSES: dict[str, Callable[[str, list[int], bool], Run]] = {
    **{c: _train_run for c in ("steady", "noisy", "warmup_down", "warmup_up", "interrupts", "faster", "levels",
                               "drift", "pipeline", "moe", "requeue", "large")},
    **{c: _serving_run for c in ("serving_work", "serving_nowork", "serving_dp")},
}
RUN_WEIGHT = {"large": 0.25, "serving_work": 0.5, "serving_nowork": 0.5, "serving_dp": 0.5}
"""Runs of these classes per ``--runs`` (they are larger per run)."""


def _pct(xs: list[float], q: float) -> float:
    return float(np.percentile(xs, q)) if xs else math.nan


def _run_corpus(wanted: list[str], runs: int, seed0: int, t0: float) -> list[dict[str, Any]]:
    """Replay ``runs`` runs of each wanted class (weighted by :data:`RUN_WEIGHT`); one scored row per run."""
    rows: list[dict[str, Any]] = []
    for cls in wanted:
        n = max(1, round(runs * RUN_WEIGHT.get(cls, 1.0)))
        for i in range(n):
            seed = [seed0, list(CLASSES).index(cls), i]
            run = CLASSES[cls](cls, seed, True)
            res = replay_lines(run.lines, ReplayConfig())
            rows.append(score(run, res))
        print(f"  {cls}: {n} runs, {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    return rows


def poisson_upper(k: int, confidence: float = 0.95) -> float:
    """The exact (Garwood) one-sided upper confidence bound on a Poisson mean given ``k`` >= 0 events:
    ``chi2.ppf(confidence, 2k + 2) / 2`` (scipy). 0 events give 3.0 at 95 % (the "rule of three"); divided by the
    exposure (healthy hours) it bounds the false-arm rate per hour. Source: Garwood, "Fiducial limits for the
    Poisson distribution", Biometrika 28 (1936)."""
    from scipy.stats import chi2

    return float(chi2.ppf(confidence, 2 * k + 2) / 2.0)


def _healthy_corpus(wanted: list[str], hours: float, seeds: list[int], wall_cap_s: float,
                    t0: float) -> list[dict[str, Any]]:
    """Healthy runs only (no injected change; a class's own background changes stay: ``levels``' persistent host
    load, ``drift``'s drift, whose time is not healthy) of each wanted class, run ``i`` of seed ``s`` seeded
    ``[s, class index, HEALTHY_STREAM, i]``, taken round-robin over ``seeds`` (run 0 of each seed, then run 1 ...),
    until the class's healthy hours reach ``hours`` or its runs have taken ``wall_cap_s`` of wall time; one scored
    row per run, with ``seed_list`` (its seed) and ``wall_s``."""
    rows: list[dict[str, Any]] = []
    for cls in wanted:
        idx, hh, n, c0 = list(CLASSES).index(cls), 0.0, 0, time.perf_counter()
        while hh < hours and time.perf_counter() - c0 < wall_cap_s:
            r0 = time.perf_counter()
            s, i = seeds[n % len(seeds)], n // len(seeds)
            run = CLASSES[cls](cls, [s, idx, HEALTHY_STREAM, i], False)
            row = score(run, replay_lines(run.lines, ReplayConfig()))
            row["wall_s"], row["seed_list"] = time.perf_counter() - r0, s
            rows.append(row)
            hh += row["healthy_h"]
            n += 1
            for a in row["false_arm_at"]:  # as found: a long class shows its arms before the table
                print(f"  {cls} seed {s} healthy run {i}: false arm {a}", file=sys.stderr, flush=True)
        print(f"  {cls}: {n} healthy runs, {hh:.1f} h, {time.perf_counter() - t0:.0f} s", file=sys.stderr,
              flush=True)
    return rows


def _print_healthy(wanted: list[str], rows: list[dict[str, Any]], hours: float) -> None:
    """One line per class: runs, healthy hours reached (``short`` where under ``hours``: the wall cap ended it),
    false arms, their rate and its exact 95 % upper bound, the rotation's captures and withdrawn arms, wall seconds
    and wall seconds per healthy hour; then each false arm (class, run, step, seconds into the run, kind, ranks)."""
    print(f"{'class':15s} {'runs':>4s} {'healthy h':>9s} {'reached':>7s} {'false arms':>10s} {'/h':>6s} "
          f"{'95% ub/h':>8s} {'rot caps':>8s} {'wdrawn':>6s} {'wall s':>6s} {'s/h':>5s}")
    for cls in wanted:
        rs = [r for r in rows if r["class"] == cls]
        hh = sum(r["healthy_h"] for r in rs)
        fa = sum(r["false_arms"] for r in rs)
        wall = sum(r["wall_s"] for r in rs)
        print(f"{cls:15s} {len(rs):4d} {hh:9.1f} {'yes' if hh >= hours else 'SHORT':>7s} {fa:10d} "
              f"{fa / hh if hh else math.nan:6.3f} {poisson_upper(fa) / hh if hh else math.nan:8.3f} "
              f"{sum(r.get('rotation_arms', 0) for r in rs):8d} {sum(r.get('withdrawn', 0) for r in rs):6d} "
              f"{wall:6.0f} {wall / hh if hh else math.nan:5.0f}")
    for r in rows:
        for a in r.get("false_arm_at") or ():
            print(f"  false arm: {r['class']} seed {r['seed_list']} healthy run {r['seed']}: {a['kind']} step {a['step']} at "
                  f"{a['at_s']} s ranks {a['ranks']} ({a['reason']}) {r['shape']}")
    viol = [(r["class"], r["seed"], v) for r in rows for v in r["violations"]]
    for cls, seed, v in viol[:8]:
        print(f"  violation: {cls} healthy run {seed}: {v}")
    print(f"violations: {len(viol)}")


def _print_table(wanted: list[str], rows: list[dict[str, Any]]) -> None:
    """One line per class (healthy hours, false arms, lost changes, detection delays, violations), then the total
    and the steady job's median delays."""
    print(f"{'class':15s} {'runs':>4s} {'healthy h':>9s} {'false arms':>10s} {'/h':>5s} {'rot caps':>8s} "
          f"{'/h':>5s} {'wdrawn':>6s} {'lost':>9s} {'short':>5s} {'d1.3 p50':>8s} {'p90':>5s} {'d3 p50':>6s} {'p90':>5s} {'learn lost':>10s} {'viol':>4s}")
    tot: dict[str, float] = defaultdict(float)
    steady_delays: dict[str, list[float]] = {"1.3": [], "3": []}
    for cls in wanted:
        rs = [r for r in rows if r["class"] == cls]
        hh = sum(r["healthy_h"] for r in rs)
        fa = sum(r["false_arms"] for r in rs)
        ra = sum(r.get("rotation_arms", 0) for r in rs)
        wd = sum(r.get("withdrawn", 0) for r in rs)
        tot["wd"] += wd
        ch = [c for r in rs for c in r["changes"]]
        scored = [c for c in ch if c["lasting"] and c["detectable"]]
        lost = [c for c in scored if not c["captured"]]
        short = sum(1 for c in ch if c.get("short") and c["detectable"])
        learn_lost = [c for c in lost if c["learning"]]
        d13 = [c["delay_steps"] for c in ch if c["factor"] == 1.3 and c["detectable"] and not math.isnan(c["delay_steps"])]
        d3 = [c["delay_steps"] for c in ch if c["factor"] == 3.0 and not math.isnan(c["delay_steps"])]
        if cls == "steady":
            steady_delays = {"1.3": d13, "3": d3}
        viol = sum(len(r["violations"]) for r in rs)
        tot["hh"] += hh
        tot["fa"] += fa
        tot["ra"] += ra
        tot["lost"] += len(lost)
        tot["scored"] += len(scored)
        tot["short"] += short
        tot["viol"] += viol
        print(f"{cls:15s} {len(rs):4d} {hh:9.1f} {fa:10d} {fa / hh if hh else math.nan:5.2f} "
              f"{ra:8d} {ra / hh if hh else math.nan:5.2f} {wd:6d} {len(lost):4d}/{len(scored):<4d} {short:5d} {_pct(d13, 50):8.0f} {_pct(d13, 90):5.0f} {_pct(d3, 50):6.0f} "
              f"{_pct(d3, 90):5.0f} {len(learn_lost):10d} {viol:4d}")
        _print_drawn(ch)
    print(f"{'all':15s} {len(rows):4d} {tot['hh']:9.1f} {int(tot['fa']):10d} "
          f"{tot['fa'] / tot['hh'] if tot['hh'] else math.nan:5.2f} {int(tot['ra']):8d} "
          f"{tot['ra'] / tot['hh'] if tot['hh'] else math.nan:5.2f} {int(tot['wd']):6d} {int(tot['lost']):4d}/{int(tot['scored']):<4d}"
          f" {int(tot['short']):5d} {'':8s} {'':5s} {'':6s} {'':5s} {'':10s} {int(tot['viol']):4d}")
    if steady_delays["1.3"] or steady_delays["3"]:
        print(f"steady job's median delay (steps): 1.3x {_pct(steady_delays['1.3'], 50):.0f}, "
              f"3x {_pct(steady_delays['3'], 50):.0f}")
    _print_delays(wanted, rows)


def _median_delays(rs: list[dict[str, Any]], factor: float) -> tuple[float, float]:
    """Median delay of a class's detected changes of one size, in steps and in seconds (nan where none)."""
    ch = [c for r in rs for c in r["changes"] if c["factor"] == factor and c["detectable"]
          and not math.isnan(c["delay_steps"])]
    return _pct([c["delay_steps"] for c in ch], 50), _pct([c.get("delay_s", math.nan) for c in ch], 50)


def _median_window(rs: list[dict[str, Any]], factor: float) -> float:
    """Median seconds from a class's changes of one size to the window of the first capture that covered them
    (``window_s``: the capture's ``start_step + warmup`` reached; the delay a user waits for a trace), over the
    changes whose window was reached in the run (nan where none)."""
    return _pct([c["window_s"] for r in rs for c in r["changes"] if c["factor"] == factor and c["detectable"]
                 and math.isfinite(c.get("window_s", math.nan))], 50)


def _print_delays(wanted: list[str], rows: list[dict[str, Any]]) -> None:
    """Each class's median delays beside the steady job's, in steps and in seconds, and whether it is within 2x of
    the steady job's in either unit.

    Steps and seconds answer different questions: a job with 8 ms steps whose capture lead holds a spike for 3 s
    takes hundreds of steps, and a job with 10 s steps takes minutes for a few steps. The verdict says which unit it
    holds in ("steps", "s", "both") or "no"; "-" where the class or the steady class has no delay of that size.
    ``window``: the median seconds from the change to its first covering capture's window (the report's delay,
    any wait for the budget, the capture lead and warm-up), the delay the user waits for a trace."""
    steady = [r for r in rows if r["class"] == "steady"]
    if not steady:
        return
    ref = {f: _median_delays(steady, f) for f in (1.3, 3.0)}
    print("median delay beside the steady job's (steps / s; within 2x in steps, in seconds, both or no):")
    for cls in wanted:
        rs = [r for r in rows if r["class"] == cls]
        parts = []
        for f in (1.3, 3.0):
            (st, sec), (rst, rsec) = _median_delays(rs, f), ref[f]
            if math.isnan(st) or math.isnan(rst):
                parts.append(f"{f}x -")
                continue
            ok_st, ok_s = st <= 2 * max(rst, 1.0), sec <= 2 * max(rsec, 0.001)
            verdict = "both" if ok_st and ok_s else "steps" if ok_st else "s" if ok_s else "no"
            parts.append(f"{f}x {st:.0f} / {sec:.1f} s ({verdict}; window {_median_window(rs, f):.1f} s)")
        print(f"  {cls:15s} " + ", ".join(parts))


def _print_drawn(ch: list[dict[str, Any]]) -> None:
    """Where the measured unit noise scored a class's changes differently from the drawn per-step noise: the lost
    count by the drawn noise, and the measured noise used."""
    if not any(c.get("detectable_drawn", c["detectable"]) != c["detectable"] for c in ch):
        return
    drawn = [c for c in ch if c["lasting"] and c.get("detectable_drawn", c["detectable"])]
    floors = [c["noise_used"] for c in ch if "noise_used" in c]
    print(f"{'':15s} detectable by the drawn per-step noise instead: lost "
          f"{sum(1 for c in drawn if not c['captured'])}/{len(drawn)}; measured unit noise used "
          f"(floor / 2) p50 {_pct(floors, 50):.3f}, range {min(floors):.3f}-{max(floors):.3f}")


def _print_examples(rows: list[dict[str, Any]]) -> None:
    """Up to 8 violations, 12 lost changes, 12 changes scored apart as ``short`` (with the steps they lasted, the
    steps a capture needed and what was found) and 12 runs with false arms, each with its class and seed."""
    examples = [(r["class"], r["seed"], v) for r in rows for v in r["violations"]][:8]
    for cls, seed, v in examples:
        print(f"  violation: {cls} run {seed}: {v}")
    lost_ex = [(r["class"], r["seed"], c) for r in rows for c in r["changes"]
               if c["lasting"] and c["detectable"] and not c["captured"]][:12]
    for cls, seed, c in lost_ex:
        at = f"onset {c['onset_s']} s" if cls.startswith("serving") else f"onset step {c['onset']}"
        print(f"  lost: {cls} run {seed}: {c['kind']} x{c['factor']} {at} delay {c['delay_steps']}"
              + (f" (unit noise used {c['noise_used']})" if "noise_used" in c else ""))
    not_det = [(r["class"], r["seed"], c) for r in rows for c in r["changes"]
               if c["lasting"] and c.get("detectable_drawn") and not c["detectable"]]
    for cls, seed, c in not_det[:12]:  # shown, so that a change the measured noise scores apart can be checked
        print(f"  under 2x its unit's noise: {cls} run {seed}: {c['kind']} x{c['factor']} onset {c['onset_s']} s, "
              f"unit noise {c['noise_used']}; captured {c['captured']}")
    short_ex = [(r["class"], r["seed"], c) for r in rows for c in r["changes"] if c.get("short") and c["detectable"]]
    for cls, seed, c in short_ex[:12]:  # shown, so that a change scored apart as short can be checked
        print(f"  short: {cls} run {seed}: {c['kind']} x{c['factor']} onset step {c['onset']}: lasted "
              f"{c['steps_lasting']} steps, a capture armed at its onset needs {c['capture_steps']}; "
              f"first report after {c['delay_steps']} steps, captured {c['captured']}")
    for cls, seed, c in [(r["class"], r["seed"], c) for r in rows for c in r["changes"] if c.get("unseen")][:12]:
        print(f"  unseen: {cls} run {seed}: {c['kind']} x{c['factor']} onset {c['onset_s']} s, before the changed "
              f"unit's first step (no level to change from: not detectable); captured {c['captured']}")
    fa_ex = [(r["class"], r["seed"], r["false_arm_kinds"], r["shape"]) for r in rows if r["false_arms"]][:12]
    for cls, seed, kinds, shape in fa_ex:
        print(f"  false arms: {cls} run {seed}: {kinds} {shape}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=48, help="runs per shape class (fewer for the large ones)")
    ap.add_argument("--classes", default=None, help="comma-separated shape classes")
    ap.add_argument("--seed", default=str(SEED),
                    help="seed; with --healthy-hours a comma-separated list, taken round-robin")
    ap.add_argument("--json", type=Path, default=None, help="write every run's result here")
    ap.add_argument("--healthy-hours", type=float, default=None, metavar="H",
                    help="healthy runs only (no injected change), per class until its healthy hours reach H")
    ap.add_argument("--class-wall", type=float, default=600.0, metavar="S",
                    help="with --healthy-hours: stop a class after S s of wall time (the table says SHORT)")
    args = ap.parse_args()
    wanted = args.classes.split(",") if args.classes else list(CLASSES)
    t0, c0 = time.perf_counter(), time.process_time()
    settings = DetectionSettings()
    print(f"noise floor used: max(noise_floor {settings.noise_floor}, MIN_NOISE {MIN_NOISE}) of the level; "
          f"min_effect {settings.min_effect}; detectable = change >= max(2x the unit's noise, min_effect); a serving "
          f"unit's noise is measured on its steps before the onset (_unit_noise), at least the drawn per-step noise")
    if args.healthy_hours is not None:
        seeds = [int(x) for x in args.seed.split(",")]
        rows = _healthy_corpus(wanted, args.healthy_hours, seeds, args.class_wall, t0)
        _print_healthy(wanted, rows, args.healthy_hours)
    else:
        rows = _run_corpus(wanted, args.runs, int(args.seed), t0)
        _print_table(wanted, rows)
        _print_examples(rows)
    print(f"total {time.perf_counter() - t0:.0f} s wall, {time.process_time() - c0:.0f} s CPU, "
          f"{sum(r['records'] for r in rows)} records")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1, default=str))


if __name__ == "__main__":
    main()
