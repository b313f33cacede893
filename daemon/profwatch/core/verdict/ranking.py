"""Suspect-rank ranking: turn one batch's ``ClusterEvidence`` into suspects, slow links and their impact (pure).

Inputs are the per-(rank, step) time breakdowns (msprof-analyze ``ClusterTimeSummary`` or the Kineto analyzer,
both in microseconds), msprof-analyze ``slow_rank`` votes when present, the advisor's per-rank "slow link" sheet
and the ``ClusterCommunicationMatrix`` rows for links. :func:`judge_batch` returns a :class:`Verdict`;
:func:`rank_suspects` only its suspects. An empty suspect list means "no rank stands out", never "analysis
failed". Statistics: ``daemon/profwatch/core/verdict/robust.py``; links: ``daemon/profwatch/core/verdict/links.py``; impact: ``daemon/profwatch/core/verdict/impact.py``;
the rules in words: ``docs/verdicts.md``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from profwatch.core.verdict.evidence import (
    HOURS_UNITS,
    ClusterEvidence,
    Impact,
    SlowLink,
    Strength,
    Suspect,
    SuspectKind,
)
from profwatch.core.verdict.explain import vote_notes
from profwatch.core.verdict.impact import (
    SyncOverhead,
    impact_of,
    own_work_us,
    single_rank_impacts,
    step_savings_us,
    sync_overhead,
    to_impact,
)
from profwatch.core.verdict.links import LinkFindings, LinkSettings, find_slow_links
from profwatch.core.verdict.paired import PAIRED_SIGNALS, PairedTest, peer_differences, permutation_test
from profwatch.core.verdict.robust import OutlierTest, median, upper_outliers
from profwatch.core.verdict.signals import SignalTable, measure_signals, parse_link_rows

__all__ = ["RankingSettings", "Verdict", "find_near_misses", "find_one_offs", "judge_batch", "parse_link_rows", "rank_suspects", "ranking_notes",
           "score_is_valid"]


class RankingSettings(BaseModel):
    """Thresholds of :func:`judge_batch` (fractions are of the step's median step time)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    min_effect_frac: float = Field(default=0.015, gt=0, lt=1, description=(
        "Smallest pooled excess, as a fraction of step time, that can make a rank a suspect (practical size)."))
    min_robust_z: float = Field(default=4.0, ge=0, description=(
        "Significance: the pooled excess must be this many robust sigmas above the noise of the other ranks..."))
    family_alpha: float = Field(default=0.01, gt=0, lt=1, description=(
        "...and above ``Phi^-1(1 - family_alpha / N)`` for N ranks tested (Bonferroni), so a batch of N innocent "
        "ranks names one with probability at most ``family_alpha`` per signal: 4.0 up to ~500 ranks, 4.85 at 16,384."))
    candidate_z: float = Field(default=3.0, ge=0, description=(
        "Ranks above this z are left out of the noise estimate (two slow ranks must not hide each other)."))
    min_sigma_frac: float = Field(default=0.0005, gt=0, description=(
        "Floor of the pooled noise sigma (0.05 % of a step), so identical synthetic timings stay finite."))
    min_strong_steps: int = Field(default=3, ge=1, description=(
        "Evidence resting on fewer captured steps is ``weak``."))
    trim_z: float = Field(default=3.0, gt=0, description=(
        "A rank's worst step is left out of its pooled excess when it exceeds the rank's other steps by this many "
        "within-rank sigmas (a one-off delay is not a slow rank)."))
    vote_weight: float = Field(default=0.25, ge=0, le=1, description=(
        "Weight of the msprof-analyze slow_rank vote share in the score (only when any vote was cast)."))
    agreement_weight: float = Field(default=0.15, ge=0, le=1, description=(
        "Weight of \"two independent signals agree\" (peers wait for the rank AND it has an explaining excess)."))
    vote_only_min_count: int = Field(default=2, ge=1, description=(
        "A rank without usable time data is still named when slow_rank gave it at least this many votes and at least "
        "half of all votes."))
    vote_z_relief: float = Field(default=0.75, gt=0, le=1, description=(
        "A rank holding at least half of all slow_rank votes needs only this fraction of ``min_robust_z``."))
    max_suspects: int = Field(default=8, ge=1, description=(
        "most suspect ranks a verdict names (by saving, then score)"))
    paired_max_ranks: int = Field(default=5, ge=0, le=64, description=(
        "Groups of at most this many compared ranks also get the paired test (each rank against its peers step by "
        "step, core/verdict/paired.py): below ~6 ranks the between-rank noise cannot be measured. 0 turns it off."))
    paired_tie_frac: float = Field(default=0.005, gt=0, le=0.5, description=(
        "Noise floor of the paired test: a step whose excess is within this fraction of a step of "
        "``min_effect_frac`` counts as a tie."))
    links: LinkSettings = Field(default_factory=lambda: LinkSettings())


TESTED = ("own", "comm", "late", "link")
"""Signals a rank is tested on (``daemon/profwatch/core/verdict/signals.py``): own work (computation + free), collective time not
explained by waiting, peers' wait for it, its link time (advisor sheet). ``comp``/``free`` only decide the kind."""


@dataclass(slots=True)
class Verdict:
    """Everything :func:`judge_batch` concluded about one batch.

    ``suspects`` ordered by impact then score; ``links`` slow links; ``impact`` the headline (every suspect and
    link fixed) as JSON; ``captured_steps`` the steps analysed; ``armed_steps`` the window armed (``None`` when
    unknown); ``strength`` of the whole verdict (``None`` without suspects or links); ``noise`` the noise
    estimate per signal; ``notes`` data-quality remarks.
    """

    suspects: list[Suspect] = field(default_factory=list)
    links: list[SlowLink] = field(default_factory=list)
    impact: dict[str, Any] | None = None
    captured_steps: list[int] = field(default_factory=list)
    armed_steps: list[int] | None = None
    strength: Strength | None = None
    noise: dict[str, dict[str, float]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    short_window: bool = False
    enough_steps: bool = True
    """False when fewer steps were captured than ``min_strong_steps``: an empty verdict then proves little."""
    one_offs: list[dict[str, Any]] = field(default_factory=list)
    """Ranks slow in one step only (that step left out of their evidence), with what it cost: see
    :func:`find_one_offs`."""
    compared_ranks: int = 0
    """Ranks with a time breakdown in a step shared with at least one other rank (0 or 1: nothing to compare)."""
    near_misses: list[dict[str, Any]] = field(default_factory=list)
    """Ranks not named whose pooled excess is positive in some tested signal, with how far they came: see
    :func:`find_near_misses` (so a ``no_suspect`` verdict can say what it saw of a rank detection named)."""


def _noise_tests(table: SignalTable, settings: RankingSettings) -> dict[str, OutlierTest]:
    """One :func:`~profwatch.core.verdict.robust.upper_outliers` test per signal, with a floor from the step-to-step noise."""
    tests: dict[str, OutlierTest] = {}
    for name in TESTED:
        pooled = table.pooled.get(name)
        if not pooled:
            continue
        within, steps = table.within.get(name, (0.0, 1.0))
        floor = max(settings.min_sigma_frac, within / math.sqrt(max(1.0, steps)))
        tests[name] = upper_outliers(pooled, candidate_z=settings.candidate_z, sigma_floor=floor, final_sd=True)
    return tests


def paired_tests(table: SignalTable, settings: RankingSettings) -> dict[int, dict[str, PairedTest]]:
    """rank -> signal -> :func:`~profwatch.core.verdict.paired.permutation_test` of its per-step excess over its
    peers' mean, in a group of 2 to ``paired_max_ranks`` compared ranks (else ``{}``); only ranks with a positive
    excess in some step are tested (the others cannot pass). The null is an excess of ``min_effect_frac``; the
    level is ``family_alpha`` over the ranks (Bonferroni), per signal as the between-rank test's. Steps where a rank
    is missing are left out of its test. O(min(N^S, DRAWS) x S log S) per rank tested.
    """
    n_ranks = len(table.n_steps)
    if not 2 <= n_ranks <= settings.paired_max_ranks or not table.columns:
        return {}
    diffs = peer_differences(table.by_step, {c.step: c.t_step_us for c in table.columns}, table.unreliable)
    alpha = settings.family_alpha / n_ranks
    out: dict[int, dict[str, PairedTest]] = {}
    for name in PAIRED_SIGNALS:
        for rank in sorted(table.n_steps):
            steps = [d for d in diffs.get(name, []) if rank in d]
            if not any(d[rank] > settings.min_effect_frac for d in steps):
                continue
            values = [list(d.values()) for d in steps]
            own = [list(d).index(rank) for d in steps]
            test = permutation_test(values, own, delta=settings.min_effect_frac, tie=settings.paired_tie_frac,
                                    alpha=alpha, signal=name)
            if test is not None:
                out.setdefault(rank, {})[name] = test
    return out


def _kind(pooled: Mapping[str, float], passed: set[str]) -> SuspectKind:
    """Kind rules (docs/verdicts.md): own work -> compute or host by the larger component; else communication;
    else unknown (peers wait for the rank but the breakdown does not say why)."""
    if "own" in passed:
        return "compute" if pooled.get("comp", 0.0) >= pooled.get("free", 0.0) else "host"
    if passed & {"comm", "link"}:
        return "communication"
    return "unknown"


def _summary_text(pooled: Mapping[str, float], details: Mapping[str, Any], kind: SuspectKind, votes: int,
                  total_votes: int, standing: int, steps: int) -> str:
    """One human line for the alert and the report, e.g. ``computation 60.1 ms vs peers 40.0 ms (+31% of step)``."""
    med, peer = details["median_us"], details["peer_median_us"]
    parts: list[str] = []
    if kind == "compute" and "computation_us" in peer:
        parts.append(f"computation {med['computation_us'] / 1e3:.1f} ms vs peers {peer['computation_us'] / 1e3:.1f} ms"
                     f" (medians; mean excess +{100 * pooled.get('comp', 0.0):.1f}% of step)")
    elif kind == "host" and "free_us" in peer:
        parts.append(f"idle/host time {med['free_us'] / 1e3:.1f} ms vs peers {peer['free_us'] / 1e3:.1f} ms"
                     f" (medians; mean excess +{100 * pooled.get('free', 0.0):.1f}% of step)")
    elif kind == "communication" and pooled.get("link", 0.0) > pooled.get("comm", 0.0):
        ratio = details.get("bandwidth_ratio")
        bw = f" (bandwidth {100 * ratio:.0f}% of peers)" if ratio is not None else ""
        parts.append(f"slow link: link time +{100 * pooled.get('link', 0.0):.1f}% of step vs peers{bw}")
    elif kind == "communication":
        parts.append(f"collectives {100 * pooled.get('comm', 0.0):.1f}% of step longer than peers, "
                     "not explained by waiting")
    if pooled.get("late", 0.0) > 0 and "wait_us" in peer and "wait_us" in med:
        parts.append(f"peers wait {peer['wait_us'] / 1e3:.1f} ms/step in collectives, it waits "
                     f"{med['wait_us'] / 1e3:.1f} ms (each peer waits "
                     f"{max(0.0, peer['wait_us'] - med['wait_us']) / 1e3:.1f} ms/step for it)")
    if total_votes:
        parts.append(f"slow_rank votes {votes}/{total_votes}")
    parts.append(f"stands out in {standing}/{steps} steps")
    return "; ".join(parts)


def _link_rows(evidence: ClusterEvidence) -> list[Mapping[str, Any]]:
    rows = evidence.advisor.get("slow_link") if isinstance(evidence.advisor, Mapping) else None
    return [r for r in rows if isinstance(r, Mapping)] if isinstance(rows, list) else []


def _strength(steps: int, settings: RankingSettings, short: bool) -> Strength:
    return "weak" if steps < settings.min_strong_steps or short else "strong"


def _strong_only_with_a_saving(sus: Suspect, imp: Impact | None, settings: RankingSettings,
                               tie_share: Callable[[float], float]) -> None:
    """A suspect stays ``strong`` only when fixing it saves more than the verdict's noise for it: its
    ``saving_pct_of_step`` alone, or, when other suspects do as much own work as it within that noise (ties: two
    equally slow ranks, where fixing either alone gives nothing back because the other still sets the step), its
    equal share of fixing the tied ranks together (``tie_share(noise)``, a fraction of the step), above its lead
    signal's noise scale (``evidence["noise_sigma_frac"]``, floored at ``settings.min_sigma_frac``). A rank behind a
    slower suspect is no tie: its fix saves nothing, so it is ``weak`` and ``evidence["strength_note"]`` says why."""
    if sus.evidence.get("strength") != "strong":
        return
    noise = sus.evidence.get("noise_sigma_frac")
    floor = max(float(noise) if isinstance(noise, (int, float)) else 0.0, settings.min_sigma_frac)
    saving = imp.saving_pct_of_step / 100.0 if imp is not None else 0.0
    if saving > floor:
        return
    share = tie_share(floor)
    if share > floor:
        sus.evidence["strength_note"] = (
            f"fixing it alone saves {100 * saving:.2f}% of the step: a suspect as slow as it still sets the step; "
            f"its share of fixing them together is {100 * share:.2f}%, above the verdict's noise for it "
            f"({100 * floor:.2f}%)")
        return
    sus.evidence["strength"] = "weak"
    sus.evidence["strength_note"] = (
        f"weak: fixing it alone saves {100 * saving:.2f}% of the step ("
        f"{1e3 * (imp.saving_s_per_step if imp else 0.0):.1f} ms), not more than the verdict's noise for it "
        f"({100 * floor:.2f}% of the step)")


def find_one_offs(table: SignalTable, tests: Mapping[str, OutlierTest], named: set[int],
                  settings: RankingSettings, collectives_per_step: float | None = None) -> list[dict[str, Any]]:
    """Ranks (not named) whose worst step was left out of their pooled own work and that step alone is a
    significant excess: a one-off delay, reported with its cost instead of hidden (docs/verdicts.md).

    Returns ``[{"rank", "step", "excess_us", "excess_frac", "z", "cost_us", "cost_pct_of_window", "text"}]``,
    largest cost first. ``excess``: the rank's own work in that step above its peers' median (µs, and fraction of
    the step); ``cost_us``: the step time the job would have saved in that step with the rank as fast as its peers
    (:func:`~profwatch.core.verdict.impact.step_savings_us`); ``cost_pct_of_window``: that over the summed step
    times of the analysed steps.

    Notes:
        Size: its cost must be at least ``min_effect_frac`` of the window. Significance: the one step's excess must
        be at least ``min_effect_frac`` of the step and ``z >=
        max(min_robust_z, Phi^-1(1 - family_alpha / (N S)))`` (Bonferroni over the N ranks x S steps tested)
        against the sd of one step's excess, ``sqrt(tau^2 + sigma_within^2)``: ``tau^2`` the between-rank spread
        of pooled values less their step-to-step part (``sigma_pooled^2 - sigma_within^2 / S``).
    """
    test = tests.get("own")
    within, steps = table.within.get("own", (0.0, 1.0))
    if test is None or not table.left_out:
        return []
    n_tests = max(1, sum(table.n_steps.values()))
    z_need = max(settings.min_robust_z, NormalDist().inv_cdf(1.0 - settings.family_alpha / n_tests))
    tau2 = max(0.0, test.sigma ** 2 - within ** 2 / max(1.0, steps))
    sd = max(math.sqrt(tau2 + within ** 2), settings.min_sigma_frac)
    window_us = sum(c.t_step_us for c in table.columns)
    found: list[tuple[int, int, float, float]] = []
    for rank, index in sorted(table.left_out.items()):
        step = table.step_of(rank, "own", index)
        if rank in named or step is None:
            continue
        x = table.series(rank, "own")[index]
        z = (x - test.center) / sd
        if x >= settings.min_effect_frac and z >= z_need:
            found.append((rank, step, x, z))
    if not found:
        return []
    over = sync_overhead(table.by_step, {f[0] for f in found}, collectives_per_step=collectives_per_step).overhead_us
    out: list[dict[str, Any]] = []
    for rank, step, x, z in found:
        col = next(c for c in table.columns if c.step == step)
        rows = table.by_step[step]
        cost = step_savings_us(rows, {rank}, suspects={rank}, overhead_us=over)
        pct = 100.0 * cost / window_us if window_us > 0 else 0.0
        if pct < 100.0 * settings.min_effect_frac:
            continue  # a one-off that cost the window less than the effect size is not worth a line
        excess_us = x * col.t_step_us
        text = (f"rank {rank} was slow in step {step} only (+{excess_us / 1e3:.1f} ms of own work, "
                f"{100 * x:.1f}% of the step): a one-off, not a slow rank; it cost the job {cost / 1e3:.1f} ms, "
                f"{pct:.1f}% of the {len(table.columns)} analysed steps")
        out.append({"rank": rank, "step": step, "excess_us": round(excess_us, 3), "excess_frac": round(x, 5),
                    "z": round(z, 3), "cost_us": round(cost, 3), "cost_pct_of_window": round(pct, 3), "text": text})
    out.sort(key=lambda d: (-d["cost_us"], d["rank"]))
    return out


def find_near_misses(table: SignalTable, tests: Mapping[str, OutlierTest], named: set[int], z_needed: float,
                     limit: int, paired: Mapping[int, Mapping[str, PairedTest]] | None = None, *,
                     min_effect_frac: float = RankingSettings.model_fields["min_effect_frac"].default,
                     ) -> list[dict[str, Any]]:
    """The ``limit`` ranks (not in ``named``) with the highest z on a tested signal whose pooled excess is
    positive, highest z first: ``[{"rank", "signal", "z", "z_needed", "effect_frac", "min_effect_frac",
    "noise_sigma_frac", "within_sigma_frac", "steps"}]``. ``effect_frac``: the pooled excess (fraction of the step),
    ``min_effect_frac`` the effect size the batch's rule needs (``RankingSettings.min_effect_frac``); ``noise_sigma_frac``:
    the scale its z is measured in; ``within_sigma_frac``: the step-to-step noise of one step of that signal;
    ``z_needed``: the batch's threshold (``max(min_robust_z, Bonferroni)``, without vote relief). Evidence, not a
    verdict: a rank here did not pass :func:`judge_batch`'s rules (z, effect size, consistency). O(N) per signal.
    ``paired`` (small groups, :func:`paired_tests`): each entry also gets its paired test of the same signal as
    ``"paired"`` (:meth:`~profwatch.core.verdict.paired.PairedTest.to_json`) when there is one."""
    best: dict[int, tuple[float, str]] = {}
    for name, test in tests.items():
        pooled = table.pooled.get(name, {})
        for rank, z in test.z.items():
            if rank not in named and pooled.get(rank, 0.0) > 0 and z > best.get(rank, (-math.inf, ""))[0]:
                best[rank] = (z, name)
    top = sorted(best.items(), key=lambda kv: (-kv[1][0], kv[0]))[:limit]
    out: list[dict[str, Any]] = [
        {"rank": rank, "signal": name, "z": round(z, 3), "z_needed": round(z_needed, 3),
         "effect_frac": round(table.pooled[name][rank], 5), "min_effect_frac": min_effect_frac, "noise_sigma_frac": round(tests[name].sigma, 6),
         "within_sigma_frac": round(table.within.get(name, (0.0, 0.0))[0], 6),
         "steps": table.n_steps.get(rank, 0)} for rank, (z, name) in top]
    for entry in out:
        pt = (paired or {}).get(entry["rank"], {}).get(entry["signal"])
        if pt is not None:
            entry["paired"] = pt.to_json()
    return out


def judge_batch(evidence: ClusterEvidence, *, hostnames: Mapping[int, str] | None = None,
                rank_dirs: Mapping[int, str] | None = None, settings: RankingSettings | None = None,
                armed_steps: Sequence[int] | None = None, world_size: int | None = None) -> Verdict:
    """Judge one batch: suspect ranks, slow links, each one's impact and how strong the evidence is.

    Args:
        evidence: summaries (µs), slow_rank votes, advisor sheets and matrix rows of one batch.
        hostnames: rank -> hostname (missing ranks get ``None``).
        rank_dirs: rank -> rank dir path; falls back to ``evidence.rank_paths``.
        settings: thresholds (defaults when ``None``).
        armed_steps: the steps the capture was armed to record (``None`` when unknown).
        world_size: accelerators of the job (default: ranks in the evidence), for accelerator-hours per day.

    Returns:
        :class:`Verdict`. Never raises for odd data (it is noted instead).

    Notes:
        Signals, per step ``s`` with >= 2 valid ranks, ``T`` = median step time of the step, ``ref(x)`` = median
        of ``x`` over the *other* ranks (leave-one-out):

        * ``own = (W - ref(W)) / T`` with own work ``W = computation + free``; its components ``comp`` and
          ``free`` likewise. The rank the others wait for does more own work.
        * ``late = (ref(wait) - wait) / T``: msprof-analyze's wait is own collective time minus the shortest
          duration of the same collective instance, so the rank the others wait for has wait ~0.
        * ``comm``: collective time not explained by waiting, ``U = C - (max W - W)`` with ``C`` the
          non-overlapped collective time; ``(U - ref(U)) / T``.
        * ``link = (link_time - ref(link_time)) / T`` from the advisor's per-rank "slow link" sheet.

        Pooling and test (``docs/verdicts.md``): a rank's pooled value of a signal is its mean over the
        captured steps, its worst step left out when that step exceeds its other steps by more than ``trim_z``
        (3) robust within-rank sigmas (:func:`profwatch.core.verdict.signals.pool`): a one-off delay cannot make a suspect,
        a consistent excess keeps the full gain of pooling. A rank must also stand out (excess above half its
        pooled value) in at least half of its steps. The noise is the batch's own: per signal, the median and MAD
        scale of the pooled values of the *other* ranks, candidates (z > ``candidate_z``) left out and the
        estimate repeated until stable (:func:`profwatch.core.verdict.robust.upper_outliers`, the modified z-score rule of
        Iglewicz & Hoaglin 1993 with candidates excluded from the scale), floored at the pooled step-to-step
        noise ``sigma_within / sqrt(steps)`` and at ``min_sigma_frac``. A rank is named when some signal has
        ``z >= min_robust_z`` (4.0; with at least half of the slow_rank votes ``vote_z_relief x`` that) **and**
        a pooled excess of at least ``min_effect_frac`` of the step. For N ranks the threshold is at least
        ``Phi^-1(1 - family_alpha / N)`` (Bonferroni; 4.85 sigma at 16,384 ranks), so with Gaussian noise a batch
        of innocent ranks names one with probability at most ``family_alpha`` (1 %) per signal.

        Kind rules (stable from capture to capture, since a fault moves one component): a significant ``own``
        excess is ``compute`` when its computation part is at least its free part, else ``host``; otherwise a
        significant ``comm`` or ``link`` excess is ``communication``; otherwise (only peers' wait says it) the
        kind is ``unknown``. A rank named only from slow_rank votes (no time data) is ``unknown`` too.

        Links (:func:`profwatch.core.verdict.links.find_slow_links`): a slow pair is a link verdict, not two suspect
        ranks: a ``communication`` suspect at the end of a slow link is folded into it. A rank at the end of
        several slow links is a ``communication`` suspect (its port or NIC).

        Impact (:mod:`profwatch.core.verdict.impact`): each suspect's saving with that rank alone as fast as its peers;
        the headline with every suspect and link fixed. Suspects are ordered by their saving, then score.

        Strength: ``weak`` when the verdict rests on fewer than ``min_strong_steps`` captured steps, or when
        fewer steps were captured than armed (``short_window``); else ``strong``.

        Score, in [0, 1] (for ordering equals and for sinks): ``e = z / (z + min_robust_z)`` (0.5 at the
        threshold), ``a`` = 1 when ``late`` and the explaining signal are both significant, 0.5 when one is;
        ``v`` = the rank's share of the slow_rank votes; ``score = w_e e + w_a a + w_v v`` with ``w_v =
        vote_weight`` only when some vote was cast, ``w_a = agreement_weight``, ``w_e = 1 - w_a - w_v``.

        Assumes synchronous data-parallel-style collectives in which every rank of a step takes part; pipeline
        stages with different work per rank will look like compute excess.
    """
    settings = settings or RankingSettings()
    dirs: dict[int, str] = dict(evidence.rank_paths)
    dirs.update(rank_dirs or {})
    table = measure_signals(evidence.summaries, _link_rows(evidence), trim_z=settings.trim_z)
    verdict = _open_verdict(evidence, table, settings, armed_steps)
    tests = _noise_tests(table, settings)
    verdict.noise = {name: {"center": round(t.center, 6), "sigma": round(t.sigma, 6),
                            "sigma_between": round(t.sigma_between, 6), "ranks": t.n_noise}
                     for name, t in tests.items()}
    batch = _batch_context(evidence, table, tests, settings, world_size, hostnames or {}, dirs, verdict.short_window)
    batch.paired = paired_tests(table, settings)
    pending = [judged for rank in _candidate_ranks(batch) if (judged := _judge_rank(batch, rank)) is not None]
    timed = {s.rank for _, s in pending if s.evidence.get("signal")}
    sync = sync_overhead(table.by_step, timed, collectives_per_step=evidence.collectives_per_step) if timed else None
    verdict.suspects = _order_by_impact(batch, pending, timed, sync)
    verdict.one_offs = find_one_offs(table, tests, {s.rank for s in verdict.suspects}, settings,
                                     evidence.collectives_per_step)
    verdict.notes += [o["text"] for o in verdict.one_offs]
    verdict.near_misses = find_near_misses(table, tests, {s.rank for s in verdict.suspects}, batch.z_base,
                                           settings.max_suspects, batch.paired,
                                           min_effect_frac=settings.min_effect_frac)
    slow_rank = evidence.recipes.get("slow_rank")
    own = tests.get("own")
    verdict.notes += vote_notes(batch.votes, verdict.suspects, slow_rank.status if slow_rank is not None else None,
                                own.z if own is not None else {}, table.pooled.get("own", {}), z_needed=batch.z_base,
                                min_effect_frac=settings.min_effect_frac)
    verdict.links = batch.found.links if batch.found else []
    if batch.found:
        verdict.notes += batch.found.notes
    if verdict.suspects or verdict.links:
        _add_headline(verdict, batch, evidence, timed, sync)
    if verdict.suspects and verdict.notes:
        verdict.suspects[0].evidence.setdefault("notes", list(verdict.notes))
    return verdict


@dataclass(slots=True)
class _BatchContext:
    """What every step of :func:`judge_batch` reads about one batch: signals, noise tests, votes, slow links."""

    settings: RankingSettings
    table: SignalTable
    tests: dict[str, OutlierTest]
    hostnames: Mapping[int, str]
    dirs: Mapping[int, str]
    world: int
    votes: dict[int, int]
    total_votes: int
    w_e: float
    w_a: float
    w_v: float
    mean_step_us: float | None
    found: LinkFindings | None
    link_ranks: set[int]
    folded: dict[int, dict[str, Any]]
    z_base: float
    """The lowest z a rank must reach: ``max(min_robust_z, Phi^-1(1 - family_alpha / N))`` (Bonferroni)."""
    short_window: bool
    paired: dict[int, dict[str, PairedTest]] = field(default_factory=dict)
    """Small groups: rank -> signal -> its paired test (:func:`paired_tests`); empty otherwise."""


def _open_verdict(evidence: ClusterEvidence, table: SignalTable, settings: RankingSettings,
                  armed_steps: Sequence[int] | None) -> Verdict:
    """The verdict's frame before any rank is judged: steps captured and armed, window and data-quality notes."""
    verdict = Verdict(captured_steps=table.steps_seen or sorted(c.step for c in table.columns),
                      armed_steps=list(armed_steps) if armed_steps else None, notes=list(table.notes),
                      compared_ranks=len(table.n_steps))
    if len(table.n_steps) < 2 and evidence.summaries:
        verdict.notes.append("one rank with a time breakdown: no peer to compare it with")
    captured = len(verdict.captured_steps)
    verdict.enough_steps = captured >= settings.min_strong_steps
    if verdict.armed_steps is not None and captured < len(verdict.armed_steps):
        verdict.short_window = True
        verdict.notes.append(f"{captured} of {len(verdict.armed_steps)} armed steps captured: evidence is weak")
    return verdict


def _batch_context(evidence: ClusterEvidence, table: SignalTable, tests: dict[str, OutlierTest],
                   settings: RankingSettings, world_size: int | None, hostnames: Mapping[int, str],
                   dirs: Mapping[int, str], short_window: bool) -> _BatchContext:
    """Votes and score weights, the mean step time, the slow links and the Bonferroni threshold of one batch."""
    by_step = table.by_step
    world = world_size or len({r for rows in by_step.values() for r in rows}) or \
        len({r.rank for r in evidence.summaries})
    votes = {int(k): int(v) for k, v in evidence.slow_rank_votes.items() if v > 0}
    total_votes = sum(votes.values())
    w_v = settings.vote_weight if total_votes else 0.0
    w_a = settings.agreement_weight
    step_us = [median(r.step_time_us for r in rows.values()) for rows in by_step.values()]
    mean_step_us = sum(step_us) / len(step_us) if step_us else None
    found = find_slow_links(evidence.link_rows, settings=settings.links, world_size=world,
                            step_time_us=mean_step_us) if evidence.link_rows else None
    n_tested = max(len(table.n_steps), 1)
    return _BatchContext(
        settings=settings, table=table, tests=tests, hostnames=hostnames, dirs=dirs, world=world, votes=votes,
        total_votes=total_votes, w_e=max(0.0, 1.0 - w_v - w_a), w_a=w_a, w_v=w_v, mean_step_us=mean_step_us,
        found=found, link_ranks={r for lk in (found.links if found else []) for r in lk.ranks},
        folded=found.folded_ranks if found else {},
        z_base=max(settings.min_robust_z, NormalDist().inv_cdf(1.0 - settings.family_alpha / n_tested)),
        short_window=short_window)


def _candidate_ranks(batch: _BatchContext) -> list[int]:
    """Only ranks that can pass are looked at in detail: those above the lowest threshold in some signal, voted
    ranks and ranks at the end of several slow links (O(N) scan, O(S) work per candidate); in rank order."""
    z_floor = batch.z_base * min(batch.settings.vote_z_relief, 1.0)
    maybe = {r for t in batch.tests.values() for r, z in t.z.items() if z >= z_floor}
    maybe |= {r for r, tests in batch.paired.items() if any(t.passed for t in tests.values())}
    return sorted(maybe | set(batch.votes) | set(batch.folded))


def _judge_rank(batch: _BatchContext, rank: int) -> tuple[float, Suspect] | None:
    """One candidate: a suspect with its score, or None when it does not pass (``judge_batch``'s Notes)."""
    n_votes = batch.votes.get(rank, 0)
    share = n_votes / batch.total_votes if batch.total_votes else 0.0
    if rank not in batch.table.n_steps:
        return _vote_only_suspect(batch, rank, n_votes, share)
    s = batch.settings
    z_needed = batch.z_base * (s.vote_z_relief if share >= 0.5 and n_votes > 0 else 1.0)
    z = {name: t.z[rank] for name, t in batch.tests.items() if rank in t.z}
    pooled = {name: vals[rank] for name, vals in batch.table.pooled.items() if rank in vals}
    passed, by_pair = _passed_signals(batch, rank, z, z_needed, pooled)
    folded = rank in batch.folded
    if folded:
        passed.add("link")
    if not passed:
        return None
    kind = _kind(pooled, passed)
    if kind == "communication" and rank in batch.link_ranks and not folded:
        return None  # the slow link explains it: reported as the link, not as a rank
    lead = _lead_signal(passed, pooled)
    series = batch.table.series(rank, lead)
    pooled_lead = pooled.get(lead, 0.0)
    standing = sum(1 for x in series if x > 0 and x >= 0.5 * pooled_lead)
    if series and not folded and 2 * standing < len(series):
        return None  # stands out in a minority of its steps: not consistent (docs/verdicts.md)
    z_lead = max(z.get(lead, 0.0), z_needed if folded else 0.0)
    if lead in by_pair:  # the normal quantile of its paired p-value: the same evidence on the z scale
        z_lead = max(z_lead, NormalDist().inv_cdf(1.0 - min(0.5, max(1e-15, batch.paired[rank][lead].p))))
    agree = 1.0 if ("late" in passed and bool(passed - {"late"})) else 0.5
    e = z_lead / (z_lead + s.min_robust_z) if z_lead > 0 else 0.0
    score = min(1.0, max(0.0, batch.w_e * e + batch.w_a * agree + batch.w_v * share))
    ev = _rank_evidence(batch, rank, kind, lead, z, z_needed, pooled, standing, n_votes, share, agree)
    if batch.paired.get(rank):
        _add_paired_evidence(ev, batch.paired[rank], passed, by_pair, lead, z)
    return score, Suspect(rank, round(score, 4), kind, batch.hostnames.get(rank), ev, batch.dirs.get(rank))


def _passed_signals(batch: _BatchContext, rank: int, z: Mapping[str, float], z_needed: float,
                    pooled: Mapping[str, float]) -> tuple[set[str], set[str]]:
    """The signals a rank passes, and those of them the paired test passed. A small group's own work and lateness
    are judged step by step (the paired test) once its steps can reach the level; with fewer steps the between-rank
    z stays, and only with the rank above the null in every step (docs/verdicts.md, "Small groups")."""
    s = batch.settings
    paired = batch.paired.get(rank, {})
    passed = {name for name in z if z[name] >= z_needed and pooled.get(name, 0.0) >= s.min_effect_frac
              and (not batch.paired or name not in PAIRED_SIGNALS or _few_steps_agree(paired.get(name)))}
    by_pair = {name for name, t in paired.items() if t.decides and t.passed and t.effect >= s.min_effect_frac}
    return passed | by_pair, by_pair


def _add_paired_evidence(ev: dict[str, Any], tests: Mapping[str, PairedTest], passed: set[str], by_pair: set[str],
                         lead: str, z: Mapping[str, float]) -> None:
    """A small group's suspect's evidence: its paired tests (``paired``), which test passed each signal
    (``passed_by``: ``paired``, ``between_ranks`` or ``link``), the test that named it (``test``) and, when the
    paired test did, its clause in the summary."""
    ev["paired"] = {name: t.to_json() for name, t in tests.items()}
    ev["passed_by"] = {name: ("paired" if name in by_pair else "between_ranks" if name in z else "link")
                       for name in sorted(passed)}
    ev["test"] = "paired" if lead in by_pair else "between_ranks"
    if by_pair:
        ev["summary"] += "; " + _paired_text(tests[lead if lead in by_pair else min(by_pair)])


def _few_steps_agree(test: PairedTest | None) -> bool:
    """Whether a small group's between-rank pass of a signal stands: only when its steps are too few for the
    paired test to decide, and the rank was above the null's excess in every one of them."""
    return test is not None and not test.decides and test.positive == test.steps


def _paired_text(test: PairedTest) -> str:
    """The paired test's clause of a suspect's summary, e.g. ``step by step: peers waited for it +36.2% of the
    step (mean of 10 steps), above 1.5% in 8/10 steps: p 0.00025 where 0.0025 is needed (within-step permutation
    test, 4 ranks)``."""
    what = "its own work exceeded its peers' by" if test.signal == "own" else "peers waited for it"
    return (f"step by step: {what} {100 * test.effect:+.1f}% of the step (mean of {test.steps} steps), above "
            f"{100 * test.delta:.1f}% in {test.positive}/{test.steps} steps: p {test.p:.2g} where {test.alpha:.2g} "
            f"is needed (within-step permutation test, {test.ranks} ranks)")


def _vote_only_suspect(batch: _BatchContext, rank: int, n_votes: int, share: float) -> tuple[float, Suspect] | None:
    """A rank without a time breakdown, named from slow_rank votes alone (at least ``vote_only_min_count`` votes
    and half of them): kind ``unknown``, evidence ``weak``."""
    if not (n_votes >= batch.settings.vote_only_min_count and share >= 0.5):
        return None
    ev: dict[str, Any] = {"slow_rank_votes": n_votes, "vote_share": round(share, 4), "strength": "weak",
                          "summary": f"slow_rank votes {n_votes}/{batch.total_votes}; no time breakdown"}
    score = min(1.0, batch.settings.vote_weight * share + 0.25)
    return score, Suspect(rank, round(score, 4), "unknown", batch.hostnames.get(rank), ev, batch.dirs.get(rank))


def _lead_signal(passed: set[str], pooled: Mapping[str, float]) -> str:
    """The signal a suspect is shown by: own work first, then its link (when at least its collective excess),
    then collectives, then peers' wait."""
    if "own" in passed:
        return "own"
    if "link" in passed and (pooled.get("link", 0.0) >= pooled.get("comm", 0.0) or "comm" not in passed):
        return "link"
    return "comm" if "comm" in passed else "late"


def _rank_evidence(batch: _BatchContext, rank: int, kind: SuspectKind, lead: str, z: Mapping[str, float],
                   z_needed: float, pooled: Mapping[str, float], standing: int, n_votes: int, share: float,
                   agree: float) -> dict[str, Any]:
    """A timed suspect's evidence dict (docs/verdicts.md): summary, strength, z per signal and threshold, pooled
    fractions, medians beside the peers', votes, whether late and the explaining signal agree."""
    table = batch.table
    n_steps = table.n_steps[rank]
    details = table.details(rank)
    pooled_lead = pooled.get(lead, 0.0)
    ev: dict[str, Any] = {
        "summary": _summary_text(pooled, details, kind, n_votes, batch.total_votes, standing, n_steps),
        "strength": _strength(n_steps, batch.settings, batch.short_window),
        "steps": n_steps,
        "steps_standing_out": standing,
        "signal": lead,
        "z": {name: round(v, 3) for name, v in z.items()},
        "threshold_z": round(z_needed, 3),
        "effect_frac": round(pooled_lead, 5),
        "pooled_frac": {name: round(v, 5) for name, v in pooled.items()},
        "noise_sigma_frac": round(batch.tests[lead].sigma, 6) if lead in batch.tests else None,
        "median_us": {m: round(v, 3) for m, v in details["median_us"].items()},
        "peer_median_us": {m: round(v, 3) for m, v in details["peer_median_us"].items()},
        "slow_rank_votes": n_votes,
        "vote_share": round(share, 4),
        "signals_agree": agree == 1.0,
    }
    if details["bandwidth_ratio"] is not None:
        ev["bandwidth_ratio"] = round(details["bandwidth_ratio"], 4)
    if rank in batch.folded:
        ev["slow_links"] = batch.folded[rank]
    if rank in table.unreliable:
        ev["wait_reliable"] = False
    return ev


def _order_by_impact(batch: _BatchContext, pending: list[tuple[float, Suspect]], timed: set[int],
                     sync: SyncOverhead | None) -> list[Suspect]:
    """Each suspect's impact (a folded link's saving on top of its own), then the first ``max_suspects`` by
    saving, score and rank."""
    impacts = single_rank_impacts(batch.table.by_step, timed, world_size=batch.world, overhead=sync)
    def tie_share(rank: int, noise_frac: float) -> float:
        """Per-rank share (fraction of the step) of fixing ``rank`` with the suspects whose mean own work is within
        ``noise_frac`` of a step of its own; 0 without such a tie."""
        by_step = batch.table.by_step
        if rank not in timed or not by_step or not batch.mean_step_us:
            return 0.0
        work: dict[int, list[float]] = {}
        for rows in by_step.values():
            for r, row in rows.items():
                if r in timed:
                    work.setdefault(r, []).append(own_work_us(row))
        mean = {r: sum(v) / len(v) for r, v in work.items() if v}
        if rank not in mean:
            return 0.0
        ties = {r for r, w in mean.items() if abs(w - mean[rank]) <= noise_frac * batch.mean_step_us}
        if len(ties) < 2:
            return 0.0
        together = impact_of(by_step, ties, world_size=batch.world, suspects=timed, overhead=sync)
        return (together.saving_pct_of_step / 100.0 / len(ties)) if together else 0.0

    named: list[tuple[float, float, Suspect]] = []
    for score, sus in pending:
        imp = impacts.get(sus.rank)
        if sus.rank in batch.folded and batch.mean_step_us:  # its links' cost comes on top of any own-work excess
            extra_us = batch.folded[sus.rank]["saving_us_per_step"] + (imp.saving_s_per_step * 1e6 if imp else 0.0)
            imp = to_impact(extra_us, batch.mean_step_us, batch.world)
        sus.impact = imp.to_json() if imp else None
        _strong_only_with_a_saving(sus, imp, batch.settings, functools.partial(tie_share, sus.rank))
        named.append((imp.saving_s_per_step if imp else 0.0, score, sus))
    named.sort(key=lambda t: (-t[0], -t[1], t[2].rank))
    return [s for _, _, s in named[: batch.settings.max_suspects]]


def _add_headline(verdict: Verdict, batch: _BatchContext, evidence: ClusterEvidence, timed: set[int],
                  sync: SyncOverhead | None) -> None:
    """The headline impact (every suspect and link fixed) and the verdict's strength (strong when any part is)."""
    extra = [(lk.impact or {}).get("saving_s_per_step", 0.0) * 1e6 for lk in verdict.links]
    extra += [batch.folded[s.rank]["saving_us_per_step"] for s in verdict.suspects if s.rank in batch.folded]
    by_step = batch.table.by_step
    fixed = {s.rank for s in verdict.suspects if s.impact is not None}
    head = impact_of(by_step, fixed, world_size=batch.world, extra_us_per_step=extra,
                     collectives_per_step=evidence.collectives_per_step,
                     overhead=sync if fixed == timed else None) if by_step else None
    verdict.impact = head.to_json() if head else None
    if not evidence.accelerator:  # a CPU job: its hours are the ranks' (processes'), not accelerators'
        imps: list[dict[str, Any] | None] = [verdict.impact, *(s.impact for s in verdict.suspects),
                                             *(lk.impact for lk in verdict.links)]
        for imp in imps:
            if imp is not None:
                imp["hours_unit"] = HOURS_UNITS[False]
    strengths = [s.evidence.get("strength") for s in verdict.suspects] + \
        [lk.evidence.get("strength") for lk in verdict.links]
    verdict.strength = "strong" if "strong" in strengths else "weak"


def rank_suspects(evidence: ClusterEvidence, *, hostnames: Mapping[int, str] | None = None,
                  rank_dirs: Mapping[int, str] | None = None,
                  settings: RankingSettings | None = None) -> list[Suspect]:
    """The suspects of :func:`judge_batch` (ordered by impact, then score; at most ``settings.max_suspects``)."""
    return judge_batch(evidence, hostnames=hostnames, rank_dirs=rank_dirs, settings=settings).suspects


def ranking_notes(evidence: ClusterEvidence, settings: RankingSettings | None = None) -> list[str]:
    """Data-quality notes the ranking saw (ignored rows, unusable wait data), for reports."""
    return measure_signals(evidence.summaries, _link_rows(evidence)).notes


def score_is_valid(x: float) -> bool:
    """True for a finite score in [0, 1] (used by tests and alert validation)."""
    return math.isfinite(x) and 0.0 <= x <= 1.0
