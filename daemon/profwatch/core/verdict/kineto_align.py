"""Put the steps of several ranks' torch.profiler traces side by side by time, not by label (pure).

Why: ``ProfilerStep#N`` numbers are per process. A rank whose counter started at 1, or resumed with another count,
labels the same wall-clock step differently, and matching by label compares different steps (``docs/verdicts.md``).
Hosts' clocks also differ by milliseconds, so raw timestamps cannot be compared either.

How: one reference rank (the one with most steps; lowest rank on ties). For every other rank its clock offset is
estimated from the ends of the collectives it shares with the reference: a synchronous collective ends at the same
moment on every member (the last arrival releases everyone; msprof-analyze's wait/transmit split rests on the
same fact), so ``end_rank - end_reference`` of matching instances is the clock offset. The offset with the most
matching ends (within a tolerance) wins, ties to the smallest offset, and is refined as the median difference of
the matched ends. Offsets are searched within ``max_skew_us`` (50 ms) and never beyond half the median step: a
training step repeats the same collectives, so a shift by whole steps would match as well as the true offset,
and a rank that recorded other steps would look like a skewed clock. Each step span, shifted by the offset, is
then paired with the reference step it overlaps most (at least half of the shorter span). A rank that shares
collectives with the reference but none of whose collective ends match within that window recorded other steps
(or its clock is off by more than the window): it is not aligned, with the reason. Only a rank without any
collective in common with the reference falls back to the armed window: every rank records the same armed steps,
so its k-th recorded step is the reference's k-th. Hosts whose clocks differ by seconds (2-30 s
without NTP) are matched by the order of their collectives instead (:func:`sequence_offset`): the same names in
the same order, every end off by one constant of at least 1 s and twice the capture window (method
``collective_sequence``, with a note); nearer, only when both recorded the armed steps (``armed_labels``: the same
dp step numbers, which profwatch's arms give every rank), since then "the next steps" is ruled out.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

FAR_SKEW_US = 1_000_000.0
"""An offset found from the order of collectives is taken as clock skew only from 1 s (and twice the reference's
capture window) on: nearer, a rank that recorded the next steps looks the same and is not aligned."""

Span = tuple[int, float, float]
"""``(label, start_us, end_us)`` of one ``ProfilerStep#label``."""


@dataclass(slots=True)
class Alignment:
    """How each rank's steps map onto the reference's.

    ``labels[rank][own label] = canonical step`` (the reference's label); ``methods[rank]``:
    ``"reference"``, ``"collective_ends"``, ``"collective_sequence"`` (clock seconds off: matched by the order of
    the collectives), ``"clock"`` (collective ends did not line up, the steps overlap on the clocks as they are)
    or ``"armed_window"``; ``offsets_us[rank]``: its clock minus the reference's (collective_ends and
    collective_sequence); ``unaligned[rank]``: why a rank could not be aligned; ``method``: the one
    method used by every aligned non-reference rank, else ``"mixed"``.
    """

    reference: int | None = None
    labels: dict[int, dict[int, int]] = field(default_factory=dict)
    methods: dict[int, str] = field(default_factory=dict)
    offsets_us: dict[int, float] = field(default_factory=dict)
    unaligned: dict[int, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def method(self) -> str:
        used = {m for r, m in self.methods.items() if r != self.reference}
        return used.pop() if len(used) == 1 else ("reference only" if not used else "mixed")

    def to_json(self) -> dict[str, Any]:
        return {"method": self.method, "reference": self.reference,
                "methods": {str(r): m for r, m in sorted(self.methods.items())},
                "offsets_us": {str(r): round(v, 1) for r, v in sorted(self.offsets_us.items())},
                "unaligned": {str(r): why for r, why in sorted(self.unaligned.items())}, "notes": list(self.notes)}


def _ends_by_name(colls: Sequence[tuple[str, float]]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = defaultdict(list)
    for name, end in colls:
        out[name].append(end)
    for v in out.values():
        v.sort()
    return out


def _near(sorted_vals: list[float], x: float, tol: float) -> float | None:
    """The value of ``sorted_vals`` closest to ``x`` if within ``tol``."""
    i = bisect_left(sorted_vals, x)
    best = None
    for j in (i - 1, i):
        if 0 <= j < len(sorted_vals) and abs(sorted_vals[j] - x) <= tol and (
                best is None or abs(sorted_vals[j] - x) < abs(best - x)):
            best = sorted_vals[j]
    return best


def estimate_offset(mine: Sequence[tuple[str, float]], ref: Sequence[tuple[str, float]], *, max_skew_us: float,
                    tol_us: float, min_matches: int = 2) -> tuple[float, int] | None:
    """Clock offset (µs, mine - reference) from collective ends ``(name, end_us)``, and how many ends matched.

    ``None`` when fewer than ``min_matches`` ends (and fewer than half of the smaller side) agree on any offset
    within ``max_skew_us``.
    """
    a, b = _ends_by_name(mine), _ends_by_name(ref)
    shared = [n for n in a if n in b]
    if not shared:
        return None
    anchor = max(shared, key=lambda n: min(len(a[n]), len(b[n])))
    cands: set[float] = set()
    grid = tol_us / 2
    for e in a[anchor][:8]:
        lo, hi = bisect_left(b[anchor], e - max_skew_us), bisect_left(b[anchor], e + max_skew_us)
        cands.update(round((e - f) / grid) * grid for f in b[anchor][lo:hi])
    best: tuple[int, float, list[float]] | None = None
    for d in sorted(cands, key=abs):
        diffs = []
        for n in shared:
            for e in a[n]:
                f = _near(b[n], e - d, tol_us)
                if f is not None:
                    diffs.append(e - f)
        if best is None or len(diffs) > best[0]:
            best = (len(diffs), d, diffs)
    if best is None:
        return None
    n_match, _, diffs = best
    smaller = min(sum(len(a[n]) for n in shared), sum(len(b[n]) for n in shared))
    if n_match < min_matches or n_match < smaller / 2:
        return None
    diffs.sort()
    mid = len(diffs) // 2
    return (diffs[mid] if len(diffs) % 2 else (diffs[mid - 1] + diffs[mid]) / 2), n_match


def sequence_offset(mine: Sequence[tuple[str, float]], ref: Sequence[tuple[str, float]], *,
                    tol_us: float) -> float | None:
    """Clock offset (µs, mine - reference) at any size, from the order of the collectives: when both ranks ran
    the same collectives in the same order (same count, same names), the k-th ends of the two sequences are the
    same instance, so ``end_k(mine) - end_k(ref)`` is the offset; it must be the same for every k within
    ``tol_us`` (else ``None``). Source of the fact: a synchronous collective ends at the same moment on every
    member (the module docstring)."""
    a, b = sorted(mine, key=lambda t: t[1]), sorted(ref, key=lambda t: t[1])
    if len(a) < 2 or len(a) != len(b) or any(x[0] != y[0] for x, y in zip(a, b, strict=True)):
        return None
    diffs = sorted(x[1] - y[1] for x, y in zip(a, b, strict=True))
    mid = diffs[len(diffs) // 2] if len(diffs) % 2 else (diffs[len(diffs) // 2 - 1] + diffs[len(diffs) // 2]) / 2
    return mid if diffs[-1] - diffs[0] <= 2 * tol_us else None


def _pair_spans(mine: Sequence[Span], ref: Sequence[Span], offset_us: float) -> dict[int, int]:
    """own label -> reference label by largest overlap (at least half of the shorter span) after the shift."""
    out: dict[int, int] = {}
    used: set[int] = set()
    for label, s0, e0 in mine:
        s, e = s0 - offset_us, e0 - offset_us
        best, best_ov = None, 0.0
        for rlabel, rs, re_ in ref:
            ov = min(e, re_) - max(s, rs)
            if ov > best_ov:
                best, best_ov = rlabel, ov
        if best is not None and best not in used:
            shorter = min(e - s, next(r[2] - r[1] for r in ref if r[0] == best))
            if shorter > 0 and best_ov >= 0.5 * shorter:
                out[label] = best
                used.add(best)
    return out


def align_steps(spans: Mapping[int, Sequence[Span]], collectives: Mapping[int, Sequence[tuple[str, float]]], *,
                max_skew_us: float = 50_000.0, tol_us: float = 200.0,
                armed_labels: frozenset[int] | None = None) -> Alignment:
    """Align every rank's step spans onto a reference rank's (see the module docstring).

    Args:
        spans: rank -> its ``(label, start_us, end_us)`` step spans (its own clock and labels).
        collectives: rank -> ``(name, end_us)`` of its collectives of one class present on every rank (the
            ``k``-th instance of a name within a trace is named ``name#k`` by the caller or not: only names and
            end times are used).
        max_skew_us: largest clock offset considered (50 ms; at most half the median step is used).
        armed_labels: the ``ProfilerStep#`` labels the capture was armed to record (profwatch's own arms: dp step
            numbers, the same on every rank). A rank whose labels and the reference's are the same armed labels
            recorded the same steps, so the order of their collectives pairs them at any clock offset, also
            between the skew window and 1 s where "the next steps" would otherwise look the same.
        tol_us: how close two ends must be to count as the same instance: at least 200 µs, up to a quarter of
            the median gap between the reference's collective ends (host collectives on a busy host end
            milliseconds apart), at most a quarter of the skew window.

    Returns:
        :class:`Alignment`; ranks without spans are ``unaligned``.
    """
    al = Alignment()
    have = {r: sorted(v, key=lambda t: t[1]) for r, v in spans.items() if v}
    for r in spans:
        if r not in have:
            al.unaligned[r] = "no ProfilerStep#N spans in the trace"
    if not have:
        return al
    ref = min(have, key=lambda r: (-len(have[r]), r))
    al.reference = ref
    window, tol = _window_and_tolerance(have, collectives.get(ref, ()), max_skew_us, tol_us)
    al.methods[ref] = "reference"
    al.labels[ref] = {lab: lab for lab, _, _ in have[ref]}
    for r in sorted(have):
        if r == ref:
            continue
        mine, theirs = collectives.get(r, ()), collectives.get(ref, ())
        shared = bool({n for n, _ in mine} & {n for n, _ in theirs})
        est = estimate_offset(mine, theirs, max_skew_us=window, tol_us=tol) if shared else None
        if shared and est is None:
            _align_unmatched(al, r, ref, have, mine, theirs, window, tol, armed_labels)
        elif est is not None:
            _align_by_ends(al, r, ref, have, est[0], armed_labels)
        else:
            _align_by_position(al, r, ref, have)
    relabeled = [r for r, m in al.labels.items() if r != ref and any(a != b for a, b in m.items())]
    if relabeled:
        al.notes.append(f"ranks {relabeled}: ProfilerStep numbers differ from rank {ref}'s for the same steps "
                        "(aligned by time)")
    return al


def _window_and_tolerance(have: Mapping[int, Sequence[Span]], ref_collectives: Sequence[tuple[str, float]],
                          max_skew_us: float, tol_us: float) -> tuple[float, float]:
    """The skew window (``max_skew_us``, at most half the median step) and the match tolerance (µs).

    Ranks leave a collective within microseconds on a device, within milliseconds for host collectives on a busy
    host: the tolerance grows with the spacing of the reference's collectives (a quarter of the median gap), never
    past a quarter of the skew window."""
    lengths = sorted(e - s for v in have.values() for _, s, e in v)
    window = min(max_skew_us, 0.5 * lengths[len(lengths) // 2]) if lengths else max_skew_us
    ref_ends = sorted(e for _, e in ref_collectives)
    gaps = sorted(b - a for a, b in zip(ref_ends, ref_ends[1:], strict=False) if b > a)
    spacing = gaps[len(gaps) // 2] if gaps else 0.0
    return window, min(window / 4, max(tol_us, spacing / 4))


def _align_unmatched(al: Alignment, r: int, ref: int, have: Mapping[int, Sequence[Span]],
                     mine: Sequence[tuple[str, float]], theirs: Sequence[tuple[str, float]], window: float,
                     tol: float, armed_labels: frozenset[int] | None) -> None:
    """Rank ``r`` shares collectives with the reference but no end matches within the window: trust the clocks
    when the steps overlap as they are, else pair by the order of the collectives (the same armed steps, or a
    clock seconds off), else leave it unaligned with why."""
    as_is = _pair_spans(have[r], have[ref], 0.0)
    if len(as_is) * 2 >= min(len(have[r]), len(have[ref])):
        # the collective ends do not line up (e.g. asynchronous collectives) but the steps overlap on the
        # clocks as they are: trust the clocks
        al.methods[r], al.labels[r], al.offsets_us[r] = "clock", as_is, 0.0
        return
    far = sequence_offset(mine, theirs, tol_us=tol)
    span_ref = have[ref][-1][2] - have[ref][0][1]
    own = [lab for lab, _, _ in have[r]]
    same_armed = (armed_labels is not None and own == [lab for lab, _, _ in have[ref]]
                  and set(own) <= armed_labels)
    if far is not None and same_armed:
        mapping = _pair_spans(have[r], have[ref], far)
        if mapping:
            al.offsets_us[r], al.methods[r], al.labels[r] = far, "collective_sequence", mapping
            al.notes.append(f"rank {r}: its clock is {far / 1e3:+.1f} ms off rank {ref}'s: both recorded the "
                            f"armed steps {own[0]}-{own[-1]} (the same step numbers), paired by the order of "
                            "their collectives")
            return
    if far is not None and abs(far) >= max(2.0 * span_ref, FAR_SKEW_US):
        mapping = _pair_spans(have[r], have[ref], far)
        if mapping:
            # hosts whose clocks differ by seconds (no NTP): the same collectives in the same order, all
            # ends off by one constant far beyond the window
            al.offsets_us[r], al.methods[r], al.labels[r] = far, "collective_sequence", mapping
            al.notes.append(f"rank {r}: its clock is {far / 1e6:+.3f} s off rank {ref}'s: steps paired by "
                            "the order of their collectives (the same collectives, each end off by that "
                            "much); a rank that recorded other steps far away would look the same")
            return
    al.unaligned[r] = (f"none of its collective ends matches rank {ref}'s within a clock offset of "
                       f"{window / 1e3:.1f} ms and its steps do not overlap rank {ref}'s: it recorded other "
                       "steps, or its clock is further off")


def _align_by_ends(al: Alignment, r: int, ref: int, have: Mapping[int, Sequence[Span]], offset: float,
                   armed_labels: frozenset[int] | None) -> None:
    """Rank ``r``'s steps paired with the reference's after correcting the clock offset its collective ends
    gave; a pairing of the same armed labels with other steps is noted (periodic collectives)."""
    mapping = _pair_spans(have[r], have[ref], offset)
    if not mapping:
        al.unaligned[r] = (f"its steps overlap none of rank {ref}'s after correcting a clock offset of "
                           f"{offset / 1e3:.1f} ms: it recorded other steps")
        return
    al.offsets_us[r], al.methods[r], al.labels[r] = offset, "collective_ends", mapping
    own = [lab for lab, _, _ in have[r]]
    if (armed_labels is not None and own == [lab for lab, _, _ in have[ref]] and set(own) <= armed_labels
            and any(a != b for a, b in mapping.items())):
        # periodic collectives: a clock offset near a whole number of steps matches as well as the truth
        al.notes.append(f"rank {r}: both it and rank {ref} recorded the armed steps {own[0]}-{own[-1]}, but "
                        f"its collective ends pair its steps with other steps of rank {ref} (a clock offset of "
                        f"{offset / 1e3:.1f} ms): either its step counter or its clock (by about whole steps) "
                        "is off; paired by the collective ends")
    if len(mapping) < len(have[r]):
        al.notes.append(f"rank {r}: {len(have[r]) - len(mapping)} of its {len(have[r])} steps fall outside "
                        f"rank {ref}'s window")


def _align_by_position(al: Alignment, r: int, ref: int, have: Mapping[int, Sequence[Span]]) -> None:
    """No collective shared with the reference: rank ``r``'s steps paired with the reference's by position in the
    armed window."""
    k = min(len(have[r]), len(have[ref]))
    al.methods[r] = "armed_window"
    al.labels[r] = {have[r][i][0]: have[ref][i][0] for i in range(k)}
    if len(have[r]) != len(have[ref]):
        al.notes.append(f"rank {r}: {len(have[r])} steps vs rank {ref}'s {len(have[ref])}; aligned the first {k} "
                        "by position in the armed window")
