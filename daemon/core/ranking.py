"""Suspect-rank ranking: turn one batch's ``ClusterEvidence`` into an ordered list of ``Suspect`` (pure).

Inputs are the per-(rank, step) time breakdowns (msprof-analyze ``ClusterTimeSummary`` or the Kineto analyzer,
both in microseconds) and, when present, msprof-analyze ``slow_rank`` votes. The output is ordered by score,
highest first; an empty list means "no rank stands out", never "analysis failed".
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from statistics import median
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from daemon.core.evidence import ClusterEvidence, RankStepSummary, Suspect, SuspectKind


class RankingSettings(BaseModel):
    """Thresholds of :func:`rank_suspects` (fractions are of the step's median step time)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    min_effect_frac: float = Field(0.025, gt=0, lt=1)
    """Smallest excess, as a fraction of step time, that can make a rank a suspect."""
    min_consistency: float = Field(0.5, ge=0, le=1)
    """Fraction of analysed steps in which the rank's excess must reach ``min_effect_frac``."""
    min_robust_z: float = Field(4.0, ge=0)
    """With ``robust_min_ranks`` or more ranks, the excess must also be this many robust sigmas
    (1.4826 x MAD across ranks of the same signal) above zero: rejects noise in large clusters."""
    robust_min_ranks: int = Field(6, ge=3)
    vote_weight: float = Field(0.25, ge=0, le=1)
    """Weight of the msprof-analyze slow_rank vote share in the score (only when any vote was cast)."""
    agreement_weight: float = Field(0.15, ge=0, le=1)
    """Weight of "two independent signals agree" (peers wait for the rank AND it has an explaining excess)."""
    vote_only_min_count: int = Field(2, ge=1)
    """A rank without usable time data is still named when slow_rank gave it at least this many votes
    and at least half of all votes."""
    vote_effect_relief: float = Field(0.5, gt=0, le=1)
    """A rank holding at least half of all slow_rank votes needs only this fraction of ``min_effect_frac``."""
    max_suspects: int = Field(8, ge=1)


@dataclass(slots=True)
class RankSignals:
    """Per-rank signals aggregated over steps (fractions of step time; medians across steps)."""

    rank: int
    steps: int = 0
    late_frac: float | None = None
    computation_excess_frac: float = 0.0
    free_excess_frac: float = 0.0
    communication_excess_frac: float = 0.0
    link_excess_frac: float | None = None
    bandwidth_ratio: float | None = None
    consistency: float = 0.0
    noise_floor_frac: float = 0.0
    medians_us: dict[str, float] = field(default_factory=dict)
    peer_medians_us: dict[str, float] = field(default_factory=dict)
    wait_reliable: bool = True

    @property
    def effect_frac(self) -> float:
        """Largest excess signal (can be negative for a rank that is faster than its peers)."""
        vals = [self.computation_excess_frac, self.free_excess_frac, self.communication_excess_frac]
        if self.link_excess_frac is not None:
            vals.append(self.link_excess_frac)
        if self.late_frac is not None:
            vals.append(self.late_frac)
        return max(vals)


_METRICS = ("step_time_us", "computation_us", "communication_us", "wait_us", "transmit_us", "free_us")


def _loo_median(values: Mapping[int, float], skip: int) -> float | None:
    """Median of ``values`` without the entry ``skip`` (leave-one-out), ``None`` when nothing is left."""
    rest = [v for k, v in values.items() if k != skip]
    return median(rest) if rest else None


def _robust_scale(values: Iterable[float]) -> float:
    """1.4826 x median absolute deviation (a sigma estimate that ignores a minority of outliers)."""
    vals = list(values)
    if len(vals) < 2:
        return 0.0
    m = median(vals)
    return 1.4826 * median(abs(v - m) for v in vals)


def _valid_rows(summaries: Sequence[RankStepSummary]) -> tuple[dict[int, dict[int, RankStepSummary]], list[str]]:
    """Group rows by step, dropping rows that cannot carry a signal. Returns ``(step -> rank -> row, notes)``."""
    by_step: dict[int, dict[int, RankStepSummary]] = defaultdict(dict)
    notes: list[str] = []
    dropped = 0
    for row in summaries:
        busy = row.computation_us + row.communication_us + row.free_us
        if row.step < 0 or (row.step_time_us <= 0 and busy <= 0) or (row.computation_us <= 0 and
                                                                        row.communication_us <= 0):
            dropped += 1  # msprof-analyze zero-fills a rank whose sources are missing (step -1 rows, zeros)
            continue
        by_step[row.step][row.rank] = row
    if dropped:
        notes.append(f"ignored {dropped} zero-filled or negative-step summary rows")
    return {s: r for s, r in by_step.items() if len(r) >= 2}, notes


_DIGITS = re.compile(r"-?\d+")


def _num(value: Any) -> float:
    try:
        x = float(value)
    except (TypeError, ValueError):
        return 0.0
    return x if math.isfinite(x) else 0.0


def parse_link_rows(rows: Iterable[Mapping[str, Any]]) -> dict[int, dict[int, tuple[float, float]]]:
    """msprof-analyze advisor "slow link" sheet rows -> ``step -> rank -> (link_time_us, bandwidth_GBps)``.

    Columns (advisor ``-l en``, msprof-analyze.md section 8): ``step, rank_id, RDMA bandwidth(GB/s), RDMA size(mb),
    RDMA time(ms), SDMA bandwidth(GB/s), SDMA size(mb), SDMA time(ms)``. Time is RDMA + SDMA time; bandwidth is
    total size / total time. Rows without a parseable step/rank or with zero time are skipped.
    """
    out: dict[int, dict[int, tuple[float, float]]] = defaultdict(dict)
    for row in rows:
        step_m = _DIGITS.search(str(row.get("step", "")))
        rank_m = _DIGITS.search(str(row.get("rank_id", "")))
        if not step_m or not rank_m:
            continue
        t_ms = _num(row.get("RDMA time(ms)")) + _num(row.get("SDMA time(ms)"))
        size_mb = _num(row.get("RDMA size(mb)")) + _num(row.get("SDMA size(mb)"))
        if t_ms <= 0:
            continue
        out[int(step_m.group())][int(rank_m.group())] = (t_ms * 1e3, size_mb / 1024 / (t_ms / 1e3))
    return dict(out)


def measure_signals(summaries: Sequence[RankStepSummary], settings: RankingSettings,
                    link_rows: Sequence[Mapping[str, Any]] = ()) -> tuple[dict[int, RankSignals], list[str]]:
    """Compute every rank's excess signals from per-(rank, step) summaries.

    Returns ``(rank -> RankSignals, notes)``. Steps with fewer than two valid ranks are skipped. All signals are
    leave-one-out: a rank is compared with the median of the *other* ranks, so a slow rank does not pull its own
    reference (this matters for 2- and 3-rank groups and for two simultaneous slow ranks). See
    :func:`rank_suspects` ``Notes`` for the definitions.
    """
    by_step, notes = _valid_rows(summaries)
    links = parse_link_rows(link_rows)
    per_rank: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    floors: dict[int, list[float]] = defaultdict(list)
    unreliable: set[int] = set()
    acc_bw: dict[int, list[float]] = defaultdict(list)
    for step, rows in sorted(by_step.items()):
        ranks = sorted(rows)
        t_step = median(r.step_time_us if r.step_time_us > 0 else
                        r.computation_us + r.communication_us + r.free_us for r in rows.values())
        if t_step <= 0:
            continue
        # wait/transmit zero while communicating and peers have transmit time = missing wait data, not "late"
        any_tx = any(r.transmit_us > 0 for r in rows.values())
        reliable = {k for k, r in rows.items() if not (any_tx and r.communication_us > 0 and r.wait_us <= 0
                                                       and r.transmit_us <= 0)}
        unreliable.update(set(ranks) - reliable)
        own = {k: r.computation_us + r.free_us for k, r in rows.items()}
        last_arrival = max(own.values())
        # non-overlapped collective time (msprof: stepTime = computation + comm not overlapped + free), so that
        # DDP-style overlap differences between ranks do not look like slow communication
        excl = {k: min(r.communication_us, max(0.0, r.step_time_us - r.computation_us - r.free_us))
                if r.step_time_us > 0 else r.communication_us for k, r in rows.items()}
        unexplained = {k: excl[k] - (last_arrival - own[k]) for k in rows}
        comp = {k: r.computation_us for k, r in rows.items()}
        free = {k: r.free_us for k, r in rows.items()}
        wait = {k: rows[k].wait_us for k in reliable}
        sig: dict[str, dict[int, float]] = {"comp": {}, "free": {}, "comm": {}, "late": {}, "link": {}}
        link_t = {k: v[0] for k, v in links.get(step, {}).items() if k in rows}
        link_bw = {k: v[1] for k, v in links.get(step, {}).items() if k in rows}
        for k in ranks:
            sig["comp"][k] = (comp[k] - (_loo_median(comp, k) or 0.0)) / t_step
            sig["free"][k] = (free[k] - (_loo_median(free, k) or 0.0)) / t_step
            sig["comm"][k] = (unexplained[k] - (_loo_median(unexplained, k) or 0.0)) / t_step
            ref = _loo_median(wait, k) if k in reliable else None
            if ref is not None:
                sig["late"][k] = (ref - wait[k]) / t_step
            ref = _loo_median(link_t, k) if k in link_t else None
            if ref is not None:
                sig["link"][k] = min(1.0, (link_t[k] - ref) / t_step)
                ref_bw = _loo_median(link_bw, k)
                if ref_bw:
                    acc_bw[k].append(link_bw[k] / ref_bw)
        for k, v in list(sig["comm"].items()):
            # another rank late by at least this much explains k's longer collectives (waiting, not a slow link)
            if v > 0 and any(late >= v for j, late in sig["late"].items() if j != k):
                sig["comm"][k] = 0.0
        scales = {name: _robust_scale(vals.values()) for name, vals in sig.items()}
        for k in ranks:
            acc = per_rank[k]
            for name in ("comp", "free", "comm", "late", "link"):
                if k in sig[name]:
                    acc[name].append(sig[name][k])
            best = max(sig[n][k] for n in sig if k in sig[n])
            acc["best"].append(best)
            best_name = max((n for n in sig if k in sig[n]), key=lambda n: sig[n][k])
            floors[k].append(settings.min_robust_z * scales[best_name] if len(ranks) >= settings.robust_min_ranks
                             else 0.0)
            row = rows[k]
            for m in _METRICS:
                acc[m].append(float(getattr(row, m)))
            for m, vals in (("computation_us", comp), ("free_us", free), ("wait_us", wait)):
                ref = _loo_median(vals, k)
                if ref is not None:
                    acc["peer_" + m].append(ref)
    out: dict[int, RankSignals] = {}
    for k, acc in per_rank.items():
        floor = median(floors[k]) if floors[k] else 0.0
        threshold = max(settings.min_effect_frac, floor)
        out[k] = RankSignals(
            rank=k,
            steps=len(acc["best"]),
            late_frac=median(acc["late"]) if acc["late"] else None,
            computation_excess_frac=median(acc["comp"]),
            free_excess_frac=median(acc["free"]),
            communication_excess_frac=median(acc["comm"]),
            link_excess_frac=median(acc["link"]) if acc["link"] else None,
            bandwidth_ratio=median(acc_bw[k]) if acc_bw.get(k) else None,
            consistency=sum(1 for b in acc["best"] if b >= threshold) / len(acc["best"]),
            noise_floor_frac=floor,
            medians_us={m: median(acc[m]) for m in _METRICS},
            peer_medians_us={m: median(acc["peer_" + m]) for m in ("computation_us", "free_us", "wait_us")
                             if acc["peer_" + m]},
            wait_reliable=k not in unreliable,
        )
    if unreliable:
        notes.append(f"wait time unusable (zero-filled) for ranks {sorted(unreliable)}")
    return out, notes


def _kind(sig: RankSignals, threshold: float) -> tuple[SuspectKind, float]:
    """The excess that explains the rank's slowness: ``(kind, its size as a fraction of step time)``."""
    kinds: list[tuple[SuspectKind, float]] = [
        ("compute", sig.computation_excess_frac),
        ("host", sig.free_excess_frac),
        ("communication", max(sig.communication_excess_frac, sig.link_excess_frac or 0.0)),
    ]
    kind, size = max(kinds, key=lambda kv: kv[1])
    if size < 0.5 * threshold:
        return "unknown", size
    return kind, size


def _summary_text(sig: RankSignals, kind: SuspectKind, votes: int, total_votes: int) -> str:
    """One human line for the alert and the report, e.g. ``computation +31% of step vs peers ...``."""
    med, peer = sig.medians_us, sig.peer_medians_us
    parts: list[str] = []
    if kind == "compute" and "computation_us" in peer:
        parts.append(f"computation {med['computation_us'] / 1e3:.1f} ms vs peers {peer['computation_us'] / 1e3:.1f} ms"
                     f" (+{100 * sig.computation_excess_frac:.0f}% of step)")
    elif kind == "host" and "free_us" in peer:
        parts.append(f"idle/host time {med['free_us'] / 1e3:.1f} ms vs peers {peer['free_us'] / 1e3:.1f} ms"
                     f" (+{100 * sig.free_excess_frac:.0f}% of step)")
    elif kind == "communication" and (sig.link_excess_frac or 0.0) > sig.communication_excess_frac:
        bw = f" (bandwidth {100 * sig.bandwidth_ratio:.0f}% of peers)" if sig.bandwidth_ratio is not None else ""
        parts.append(f"slow link: link time +{100 * (sig.link_excess_frac or 0.0):.0f}% of step vs peers{bw}")
    elif kind == "communication":
        parts.append(f"collectives {100 * sig.communication_excess_frac:.0f}% of step longer than peers, "
                     "not explained by waiting")
    if sig.late_frac is not None and sig.late_frac > 0 and "wait_us" in peer:
        parts.append(f"peers wait {peer['wait_us'] / 1e3:.1f} ms/step in collectives, it waits "
                     f"{med['wait_us'] / 1e3:.1f} ms")
    if total_votes:
        parts.append(f"slow_rank votes {votes}/{total_votes}")
    parts.append(f"{round(sig.consistency * sig.steps)}/{sig.steps} steps")
    return "; ".join(parts)


def rank_suspects(evidence: ClusterEvidence, *, hostnames: Mapping[int, str] | None = None,
                  rank_dirs: Mapping[int, str] | None = None,
                  settings: RankingSettings | None = None) -> list[Suspect]:
    """Rank the suspect slow ranks of one batch.

    Args:
        evidence: summaries (µs) and optional slow_rank votes of one batch.
        hostnames: rank -> hostname (missing ranks get ``None``).
        rank_dirs: rank -> rank dir path; falls back to ``evidence.rank_paths``.
        settings: thresholds (defaults when ``None``).

    Returns:
        ``Suspect`` list ordered by ``score`` (in [0, 1]) descending, at most ``settings.max_suspects``; empty when
        no rank's excess reaches the thresholds (a balanced cluster is never given a forced name).

    Notes:
        Algorithm (per step ``s`` with >= 2 valid ranks; ``T`` = median step time of the step; ``ref(x)`` = median
        of ``x`` over the *other* ranks, i.e. leave-one-out):

        * ``late = (ref(wait) - wait) / T``: msprof-analyze's wait is own collective time minus the shortest
          duration of the same collective instance, so the rank the others wait for has wait ~0 while its peers
          wait a lot (msprof-analyze.md section 5). Skipped for a rank whose wait/transmit are zero-filled.
        * ``computation excess = (comp - ref(comp)) / T`` -> kind ``compute``.
        * ``free excess = (free - ref(free)) / T`` -> kind ``host`` (dispatch-bound or data-loading gaps).
        * ``communication excess``: collective time *not explained by waiting*. With own work ``W = comp + free``
          a rank that arrives early must wait ``max(W) - W``; with ``C`` the non-overlapped collective time
          (``min(comm, step - comp - free)``), ``U = C - (max(W) - W)`` and the signal is ``(U - ref(U)) / T``
          -> kind ``communication``. It is zeroed in a step where another rank's ``late`` is at least as large:
          then the longer collectives are waiting for that rank.
        * ``link excess = (link_time - ref(link_time)) / T`` from the advisor "slow link" sheet (RDMA + SDMA
          time per rank and step, ``ClusterEvidence.advisor["slow_link"]``) -> kind ``communication``. In a
          synchronous collective everyone leaves together, so a slow link lengthens every rank's collective and
          ClusterTimeSummary cannot name it; only per-rank link time / bandwidth can.

        Per rank each signal is the median over steps. A rank is a candidate when its largest signal reaches
        ``threshold = max(min_effect_frac, min_robust_z * 1.4826 * MAD)`` (the MAD term only with
        ``robust_min_ranks`` or more ranks; it rejects noise maxima in large clusters) and it did so in at least
        ``min_consistency`` of the steps. A rank holding at least half of the slow_rank votes needs only
        ``vote_effect_relief x threshold``; a rank with no usable time data is named from votes alone when it has
        ``vote_only_min_count`` votes and at least half of them.

        The kind is the largest of the three explaining excesses (``unknown`` when none reaches half the
        threshold: peers wait for the rank but the breakdown does not say why).

        Score, in [0, 1]: ``e = effect / (effect + threshold) * consistency`` (0.5 at the threshold, -> 1 for large
        effects), ``a`` = 1 when ``late`` and the explaining excess both reach the threshold (two independent
        views agree), 0.5 when one does; ``v`` = the rank's share of all slow_rank votes. ``score = (w_e e + w_a a
        + w_v v)`` with ``w_v = vote_weight`` only when at least one vote was cast (slow_rank is silent for groups
        of <= 3 ranks and usually for two simultaneous slow ranks, so its silence is not held against a rank),
        ``w_a = agreement_weight``, ``w_e = 1 - w_a - w_v``.

        Blind spots covered relative to slow_rank alone: groups of 2-3 ranks, several simultaneous slow ranks,
        host-bound and slow-link ranks (slow_rank only finds the rank with the shortest collective), and
        balanced clusters (no table vs. "nobody"). Assumes synchronous data-parallel-style collectives in which
        every rank of a step takes part; pipeline stages with different work per rank will look like compute
        excess.
    """
    settings = settings or RankingSettings()
    hostnames = hostnames or {}
    dirs: dict[int, str] = dict(evidence.rank_paths)
    dirs.update(rank_dirs or {})
    signals, notes = measure_signals(evidence.summaries, settings, _link_rows(evidence))
    votes = {int(k): int(v) for k, v in evidence.slow_rank_votes.items() if v > 0}
    total_votes = sum(votes.values())
    w_v = settings.vote_weight if total_votes else 0.0
    w_a = settings.agreement_weight
    w_e = max(0.0, 1.0 - w_v - w_a)

    suspects: list[tuple[float, float, Suspect]] = []
    for rank in sorted(set(signals) | set(votes)):
        n_votes = votes.get(rank, 0)
        share = n_votes / total_votes if total_votes else 0.0
        sig = signals.get(rank)
        if sig is None or sig.steps == 0:
            if n_votes >= settings.vote_only_min_count and share >= 0.5:
                ev: dict[str, Any] = {"slow_rank_votes": n_votes, "vote_share": round(share, 4),
                                      "summary": f"slow_rank votes {n_votes}/{total_votes}; no time breakdown"}
                score = min(1.0, settings.vote_weight * share + 0.25)
                suspects.append((score, 0.0, Suspect(rank, round(score, 4), "unknown", hostnames.get(rank),
                                                     ev, dirs.get(rank))))
            continue
        threshold = max(settings.min_effect_frac, sig.noise_floor_frac)
        needed = threshold * (settings.vote_effect_relief if share >= 0.5 and n_votes > 0 else 1.0)
        effect = sig.effect_frac
        consistency = sig.consistency
        if share >= 0.5 and n_votes > 0 and effect >= needed:
            consistency = max(consistency, settings.min_consistency)
        if effect < needed or consistency < settings.min_consistency:
            continue
        kind, kind_size = _kind(sig, threshold)
        late_ok = sig.late_frac is not None and sig.late_frac >= needed
        agree = 1.0 if (late_ok and kind_size >= needed) else 0.5 if (late_ok or kind_size >= needed) else 0.0
        e = effect / (effect + threshold) * consistency
        score = min(1.0, max(0.0, w_e * e + w_a * agree + w_v * share))
        ev = {
            "summary": _summary_text(sig, kind, n_votes, total_votes),
            "steps": sig.steps,
            "consistency": round(consistency, 4),
            "effect_frac": round(effect, 4),
            "threshold_frac": round(threshold, 4),
            "late_frac": None if sig.late_frac is None else round(sig.late_frac, 4),
            "computation_excess_frac": round(sig.computation_excess_frac, 4),
            "free_excess_frac": round(sig.free_excess_frac, 4),
            "communication_excess_frac": round(sig.communication_excess_frac, 4),
            "link_excess_frac": None if sig.link_excess_frac is None else round(sig.link_excess_frac, 4),
            "bandwidth_ratio": None if sig.bandwidth_ratio is None else round(sig.bandwidth_ratio, 4),
            "median_us": {k: round(v, 3) for k, v in sig.medians_us.items()},
            "peer_median_us": {k: round(v, 3) for k, v in sig.peer_medians_us.items()},
            "slow_rank_votes": n_votes,
            "vote_share": round(share, 4),
            "signals_agree": agree == 1.0,
        }
        if not sig.wait_reliable:
            ev["wait_reliable"] = False
        suspects.append((score, effect, Suspect(rank, round(score, 4), kind, hostnames.get(rank), ev,
                                                dirs.get(rank))))
    suspects.sort(key=lambda t: (-t[0], -t[1], t[2].rank))
    out = [s for _, _, s in suspects[: settings.max_suspects]]
    if out and notes:
        out[0].evidence.setdefault("notes", notes)
    return out


def _link_rows(evidence: ClusterEvidence) -> list[Mapping[str, Any]]:
    rows = evidence.advisor.get("slow_link") if isinstance(evidence.advisor, Mapping) else None
    return [r for r in rows if isinstance(r, Mapping)] if isinstance(rows, list) else []


def ranking_notes(evidence: ClusterEvidence, settings: RankingSettings | None = None) -> list[str]:
    """Data-quality notes :func:`rank_suspects` saw (ignored rows, unusable wait data), for reports."""
    _, notes = measure_signals(evidence.summaries, settings or RankingSettings(), _link_rows(evidence))
    return notes


def score_is_valid(x: float) -> bool:
    """True for a finite score in [0, 1] (used by tests and alert validation)."""
    return math.isfinite(x) and 0.0 <= x <= 1.0
