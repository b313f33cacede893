"""What changed since the reference capture (``core/changes/comparison.py``) on generated healthy/regressed pairs."""

from __future__ import annotations

from typing import Any

import pytest

from profwatch.core.changes.comparison import (
    compare_captures,
    headline,
    headline_line,
    impact_hours_per_day,
    robust_spread,
)
from profwatch.core.verdict.evidence import RankStepSummary, usable_row
from profwatch.simulate.ascend_tree import build_timelines, cluster_time_summary

WORLD = 8
CHUNK_MS = 15.0  # the generator's compute per chunk
COLLECTIVES = 4
LINK_MS = 1.0  # the generator's transmit per collective


def rows(seed: int, steps: int = 5, **slow: Any) -> list[RankStepSummary]:
    return cluster_time_summary(build_timelines(world_size=WORLD, steps=steps, seed=seed,
                                                collectives_per_step=COLLECTIVES, **slow))


def everyone(f: float) -> dict[int, float]:
    return {r: f for r in range(WORLD)}


CASES = [
    # (name, regression kwargs, {component: injected ms/step})
    ("communication", {"slow_link_ranks": everyone(3.0)}, {"communication": COLLECTIVES * LINK_MS * 2.0}),
    ("compute", {"slow_ranks": everyone(1.2)}, {"compute": COLLECTIVES * CHUNK_MS * 0.2}),
    ("host", {"host_bound_ranks": everyone(0.2)}, {"host": COLLECTIVES * CHUNK_MS * 0.2}),
    ("mixed", {"slow_ranks": everyone(1.1), "slow_link_ranks": everyone(4.0)},
     {"compute": COLLECTIVES * CHUNK_MS * 0.1, "communication": COLLECTIVES * LINK_MS * 3.0}),
]


@pytest.mark.parametrize(("name", "slow", "injected"), CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("steps", [3, 5, 8])
def test_the_leading_change_is_the_injected_component(name: str, slow: dict[str, Any], injected: dict[str, float],
                                                     steps: int) -> None:
    cmp = compare_captures(rows(1, steps), rows(2, steps, **slow))
    lead = max(injected, key=lambda k: injected[k])
    assert cmp.changes and cmp.changes[0].component == lead, (name, [c.to_json() for c in cmp.changes])
    for comp, ms in injected.items():
        got = next(c for c in cmp.changes if c.component == comp)
        assert got.delta_s_per_step is not None
        assert abs(1e3 * got.delta_s_per_step - ms) <= 0.15 * ms, (comp, got, ms)
    assert cmp.step_time_changed and cmp.ranks_compared == list(range(WORLD))
    assert {c.component for c in cmp.changes} <= set(injected) | {"host", "communication"}
    assert headline(cmp).startswith("+") and lead in headline(cmp)


@pytest.mark.parametrize("seeds", [(1, 2), (3, 4), (5, 6), (7, 8)])
@pytest.mark.parametrize("steps", [3, 5])
def test_no_change_gives_nothing_above_noise(seeds: tuple[int, int], steps: int) -> None:
    cmp = compare_captures(rows(seeds[0], steps), rows(seeds[1], steps))
    assert cmp.changes == [], [c.to_json() for c in cmp.changes]
    assert not cmp.step_time_changed
    assert "within noise" in headline(cmp)


def test_only_ranks_in_both_are_compared_and_it_is_said() -> None:
    ref = [r for r in rows(1) if r.rank < 4]
    now = [r for r in rows(2, slow_ranks=everyone(1.2)) if r.rank >= 2]
    cmp = compare_captures(ref, now)
    assert cmp.ranks_compared == [2, 3] and cmp.ranks_only_now == [4, 5, 6, 7] and cmp.ranks_only_baseline == [0, 1]
    assert any("only now: 4-7" in n and "only in the reference: 0-1" in n for n in cmp.notes), cmp.notes
    assert cmp.changes[0].component == "compute"
    none = compare_captures([r for r in rows(1) if r.rank == 0], [r for r in rows(2) if r.rank == 1])
    assert none.changes == [] and none.step_delta_s is None and "no rank is in both" in none.notes[-1]
    assert headline(none).startswith("no comparison")


def test_named_ranks_missing_from_the_reference_are_named() -> None:
    ref = [r for r in rows(1) if r.rank != 5]
    cmp = compare_captures(ref, rows(2), ranks=[5, 6])
    assert cmp.ranks_compared == [6] and any("[5]" in n for n in cmp.notes)


def test_software_versions_and_world_size() -> None:
    cmp = compare_captures(rows(1), rows(1), baseline_versions={"torch_npu": "2.6.0", "cann": "8.0", "msprof_analyze": "1"},
                           now_versions={"torch_npu": "2.7.1", "cann": "8.0", "msprof_analyze": "2"},
                           baseline_world_size=8, now_world_size=16)
    assert [c.to_json()["detail"] for c in cmp.changes] == ["torch_npu 2.6.0 -> 2.7.1"]
    assert cmp.changes[0].component == "software" and cmp.changes[0].delta_s_per_step is None
    assert any("world size changed: 8" in n for n in cmp.notes)
    assert headline(cmp).endswith("[world size 8 -> 16]"), headline(cmp)
    other = compare_captures(rows(1), rows(1), baseline_job="train-a", now_job="train-b")
    assert headline(other).endswith("[reference of another job (train-a)]") and "another job" in other.notes[0]
    assert compare_captures(rows(1), rows(1), baseline_job="a", now_job="a").caveats == []
    assert "torch_npu 2.6.0 -> 2.7.1" in headline(cmp)


def test_telemetry_mismatch_and_one_step_captures() -> None:
    ref, now = rows(1, steps=1), rows(2, steps=1, slow_ranks=everyone(1.3))
    step_s = sum(r.step_time_us for r in ref) / len(ref) / 1e6
    cmp = compare_captures(ref, now, telemetry_baseline_step_s=step_s * 1.5)
    assert any("differs from the telemetry baseline" in n for n in cmp.notes)
    assert any("one step per capture" in n for n in cmp.notes)
    assert cmp.changes and cmp.changes[0].component == "compute"  # the floor decides: a 30 % change still counts
    ok = compare_captures(ref, now, telemetry_baseline_step_s=step_s * 1.1)
    assert not any("telemetry" in n for n in ok.notes)


def test_impact_in_accelerator_hours() -> None:
    cmp = compare_captures(rows(1), rows(2, slow_ranks=everyone(1.2)))
    hours = impact_hours_per_day(cmp, WORLD)
    assert hours is not None and cmp.step_delta_s is not None and cmp.step_time_now_s is not None
    assert hours == pytest.approx(WORLD * 24 * cmp.step_delta_s / cmp.step_time_now_s)
    assert impact_hours_per_day(compare_captures([], []), WORLD) is None


def test_bad_thresholds_are_refused() -> None:
    with pytest.raises(ValueError):
        compare_captures([], [], alpha=-1)


def test_the_terminal_line_says_since_the_reference_once() -> None:
    """`analyze --baseline` and the demo print ``headline_line``: the headline's "since the reference" once, even
    with a hardware change (its detail says "reference -> now", not the phrase again)."""
    cmp = compare_captures(rows(1, 5), rows(2, 5, slow_ranks=everyone(1.2)))
    data = cmp.to_json()
    data["reference"] = {"path": "/ref/capture"}
    line = headline_line(data)
    assert line.startswith("what changed (reference /ref/capture): +") and line.count("since the reference") == 1
    assert headline_line({"headline": data["headline"]}).startswith("what changed: +")


def _pair_rows(host_ms: float, comm_ms: list[float]) -> list[RankStepSummary]:
    """Two ranks, one row per step: compute 2 ms, communication as given (the spread), host ``host_ms`` plus a
    microsecond-sized wobble (so each step differs)."""
    out = []
    for step, comm in enumerate(comm_ms):
        for rank in (0, 1):
            free = 1e3 * host_ms + 7.0 * step + rank
            comp, com = 2000.0, 1e3 * comm
            out.append(RankStepSummary(rank, step, comp + com + free, comp, com, 0.0, com, free, 0.0))
    return out


@pytest.mark.parametrize(("host_now_ms", "named"), [(2.8, False), (4.9, False), (0.5, True), (7.0, True)])
def test_a_change_smaller_than_the_healthy_steps_spread_is_not_named(host_now_ms: float, named: bool) -> None:
    """Two windows of a real 2-rank gloo job (CI, 6 and 6 steps): host time 2.0 -> 0.8 ms in every step, complete
    separation (p 0.001), while the healthy steps themselves varied by ~3 ms: not a change. A shift beyond the
    reference's spread, either way, is one."""
    comm = [3.0, 6.0, 9.0, 4.0, 7.0, 5.0]  # ms: the reference's robust spread 1.4826 x MAD = 2.2 ms (2.23 with the wobble)
    ref = _pair_rows(4.0, comm)
    cmp = compare_captures(ref, _pair_rows(host_now_ms, comm))
    host = next(c for c in cmp.components if c.component == "host")
    assert host.p_value is not None and host.p_value <= 0.0011  # the test alone would call it a change
    assert any(c.component == "host" for c in cmp.changes) is named, [c.to_json() for c in cmp.changes]
    rule = next(n for n in cmp.notes if n.startswith("a change counts when"))
    assert "exceeds 2.23 ms/step (the reference's own step-to-step spread" in rule, rule


def _steps_rows(step_ms: list[float], *, extra_compute_ms: float = 0.0) -> list[RankStepSummary]:
    """Two ranks, one row per step of ``step_ms``: communication 10 ms, host 5 ms, compute the rest (plus
    ``extra_compute_ms``, which lengthens the step by as much), a microsecond-sized wobble per step."""
    out = []
    for step, ms in enumerate(step_ms):
        for rank in (0, 1):
            com, free = 10e3, 5e3 + 3.0 * (step % 5) + rank
            comp = 1e3 * (ms + extra_compute_ms) - com - 5e3
            out.append(RankStepSummary(rank, step, comp + com + free, comp, com, 0.0, com, free, 0.0))
    return out


def test_robust_spread_measures_noise_not_a_repeating_cycle_nor_two_steps() -> None:
    """Gradient accumulation alternates 100/200 ms steps: the MAD of that is half the mode gap (74 ms), structure,
    not noise; the residuals from each phase's median are the noise. Two steps are no estimate of noise at all."""
    wobble = [0.0, 1.0, -1.0, 0.5, -0.5, 1.5, -1.5, 0.0, 1.0, -1.0] * 2  # ms
    bimodal = [(100.0 if i % 2 == 0 else 200.0) + w for i, w in enumerate(wobble)]
    assert robust_spread(bimodal) < 2.0
    assert robust_spread([100.0, 200.0, 400.0] * 6) < 1e-9  # a 3-step cycle
    assert robust_spread([100.0, 1000.0]) == 0.0  # plain MAD: 450 x 1.4826 = 667 ms
    assert robust_spread([3.0, 6.0, 9.0, 4.0, 7.0, 5.0]) == pytest.approx(2.2239)  # no cycle: the plain MAD


def test_a_regression_on_a_gradient_accumulation_job_is_named() -> None:
    """Steps alternate 100/200 ms in the reference; now every step is 50 ms longer (+50 % on the short steps). The
    two-mode reference's MAD (74 ms) hid it ("+50.0 ms/step (within noise)"): now the step time changed and the
    rule's bound is not the mode gap."""
    ref = _steps_rows([100.0, 200.0] * 10)
    cmp = compare_captures(ref, _steps_rows([100.0, 200.0] * 10, extra_compute_ms=50.0))
    assert cmp.step_time_changed, cmp.notes
    assert "within noise" not in headline(cmp)
    rule = next(n for n in cmp.notes if n.startswith("a change counts when"))
    assert "exceeds 0.75 ms/step" in rule, rule  # 0.5 % of the 150 ms median reference step


def test_a_two_step_reference_does_not_make_its_difference_the_noise() -> None:
    """Reference [100, 1000] ms: its MAD made 667 ms the smallest change; with under 5 steps only the floor
    bounds a change, said in the notes."""
    cmp = compare_captures(_steps_rows([100.0, 1000.0]), _steps_rows([100.0, 1000.0], extra_compute_ms=300.0))
    rule = next(n for n in cmp.notes if n.startswith("a change counts when"))
    assert "exceeds 2.75 ms/step (the floor" in rule, rule
    assert any("too few to measure the healthy step-to-step spread" in n for n in cmp.notes), cmp.notes


def test_one_huge_reference_step_neither_raises_the_floor_nor_hides_a_regression() -> None:
    """9 x 100 ms and one 1,000 s step, now 10 x 150 ms: the mean made the floor 500 ms and the headline
    "-99940.0 ms/step (within noise)". The floor is a share of the median step, the decision is on the typical
    step's shift (Hodges-Lehmann), and the headline says both."""
    ref = _steps_rows([100.0] * 9 + [1e6])
    cmp = compare_captures(ref, _steps_rows([150.0] * 10))
    assert cmp.step_time_shift_s == pytest.approx(0.050)
    assert cmp.step_time_changed, cmp.notes
    text = headline(cmp)
    assert text.startswith("+50.0 ms/step since the reference for the typical step (the mean -99940.0 ms/step"), text
    assert "within noise" not in text
    rule = next(n for n in cmp.notes if n.startswith("a change counts when"))
    assert "exceeds 0.50 ms/step" in rule, rule


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_a_non_finite_field_drops_its_row_not_the_comparison(bad: float) -> None:
    """A NaN or infinite field made the whole comparison "+nan us/step (within noise)": such a row is unusable
    (``usable_row``), the other steps are compared."""
    ref = _steps_rows([100.0] * 10)
    ref[0] = RankStepSummary(0, 0, 100e3, 85e3, 10e3, 0.0, 10e3, bad, 0.0)
    ref[3] = RankStepSummary(1, 1, bad, 85e3, 10e3, 0.0, 10e3, 5e3, 0.0)
    assert not usable_row(ref[0]) and not usable_row(ref[3])
    cmp = compare_captures(ref, _steps_rows([150.0] * 10))
    text = headline(cmp)
    assert "nan" not in text and "inf" not in text, text
    assert cmp.step_time_changed and text.startswith("+50.0 ms/step since the reference: compute +50.0 ms"), text
