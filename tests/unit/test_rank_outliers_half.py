"""Rank outliers when half the ranks or more are slow, one after another
(daemon/profwatch/core/detection/rank_outliers.py, ``outlying_ranks``' ``exclude``): a rank already named slow is not
a healthy peer, so it leaves the peers' reference; a second slow rank is named at once and the first stays named."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from profwatch.core.detection.rank_outliers import RankOutlierDetector, outlying_ranks
from profwatch.core.detection.settings import DetectionSettings
from profwatch.core.detection.types import FinalizedStep


def _drive(world: int, factor: Callable[[int, int], float], *, steps: int = 360, seed: int = 5,
           base: Callable[[int], float] = lambda r: 0.4, roles: list[str | None] | None = None,
           load: Callable[[int], float] = lambda k: 1.0) -> tuple[RankOutlierDetector, dict[int, int], list[set[int]]]:
    """Feed ``steps`` steps: rank ``r`` computes ``base(r) * load(k) * (1 + 0.01 N) * factor(r, k)`` (2 % job noise);
    returns the detector, the step each rank was first named at, and the reported ranks after every step."""
    rng = np.random.default_rng(seed)
    det = RankOutlierDetector("j", world, DetectionSettings(), roles)
    first: dict[int, int] = {}
    held: list[set[int]] = []
    for k in range(1, steps + 1):
        g = 1.0 + 0.02 * float(rng.standard_normal())
        comp = [base(r) * load(k) * g * (1.0 + 0.01 * float(rng.standard_normal())) * factor(r, k)
                for r in range(world)]
        st = max(comp) + 0.1 * load(k)
        for a in det.on_step(FinalizedStep(k, st, int(np.argmax(comp)), world, {"compute": comp}, None)):
            if a.kind == "rank_outlier":
                for r in a.ranks:
                    first.setdefault(r, k)
        held.append(set(det.reported_ranks))
    return det, first, held


@pytest.mark.parametrize("seed", [5, 6, 7])
def test_a_second_slow_rank_in_a_four_rank_job_is_named_and_the_first_stays_named(seed: int) -> None:
    """Rank 1 3x from step 60, rank 2 3x from step 150, then host load x1.3 on every rank from step 260: before,
    rank 2 was never named (median 0.8 s between 0.4 and 1.2, MAD 0.4 s: a robust z of 0.67) and rank 1 cleared."""
    det, first, held = _drive(4, lambda r, k: 3.0 if (r == 1 and k >= 60) or (r == 2 and k >= 150) else 1.0,
                              seed=seed, load=lambda k: 1.3 if k >= 260 else 1.0)
    assert 60 <= first[1] <= 60 + 12 and 150 <= first[2] <= 150 + 12, first
    assert all({1, 2} <= h for h in held[first[2]:]), "rank 1 or 2 cleared while slow"
    assert set(first) == {1, 2}


def test_three_of_six_slow_one_after_another_are_each_named_and_whole_job_load_names_nobody() -> None:
    slow_from = {1: 60, 4: 120, 5: 200}
    _, first, held = _drive(6, lambda r, k: 2.0 if k >= slow_from.get(r, 10**9) else 1.0,
                            load=lambda k: 1.35 if 150 <= k < 180 or k >= 300 else 1.0)
    assert set(first) == {1, 4, 5} and all(0 <= first[r] - slow_from[r] <= 12 for r in first), first
    assert held[-1] == {1, 4, 5}
    _, first, _ = _drive(6, lambda r, k: 1.0, load=lambda k: 1.35 if 150 <= k < 180 or k >= 300 else 1.0)
    assert first == {}


def test_with_declared_roles_a_second_slow_rank_of_a_stage_is_named_and_the_other_stage_never() -> None:
    """A pipeline of two stages (roles), ranks 0-3 at 0.4 s and 4-7 at 0.8 s: rank 1 then rank 2 of the first stage
    3x; the second stage's ranks are never named, and host load on every rank names nobody."""
    roles: list[str | None] = ["pp0"] * 4 + ["pp1"] * 4
    _, first, held = _drive(8, lambda r, k: 3.0 if (r == 1 and k >= 60) or (r == 2 and k >= 150) else 1.0,
                            base=lambda r: 0.4 if r < 4 else 0.8, roles=roles,
                            load=lambda k: 1.3 if k >= 260 else 1.0)
    assert set(first) == {1, 2} and first[2] - 150 <= 12, first
    assert held[-1] == {1, 2}


def test_the_excluded_ranks_leave_the_reference_only_while_two_peers_remain() -> None:
    s = DetectionSettings()
    vals = [0.40, 1.20, 1.20, 0.41]
    assert outlying_ranks(vals, s) == []  # the median sits between the slow and the healthy ranks
    assert [r for r, _ in outlying_ranks(vals, s, exclude=frozenset({1}))] == [1, 2]
    assert outlying_ranks(vals, s, exclude=frozenset({0, 1, 3})) == []  # one peer left: every rank again
    big = [0.4] * 300
    big[:150] = [1.2] * 150
    assert [r for r, _ in outlying_ranks(big, s, exclude=frozenset(range(140)))] == list(range(150))  # numpy path


def test_two_peers_left_that_disagree_are_no_reference_a_rank_faster_from_the_start_names_nobody() -> None:
    """Rank 0 25 % faster than its peers from the start (not normalised: a fast rank keeps the peers' median), then
    ranks 1 and 2 3x one after another: the two ranks left, 0.3 s and 0.4 s, disagree by more than
    ``outlier_min_effect``; their mean made rank 3 a +14 % outlier (named at step 165). Rank 2 is named while three
    peers are left; with two that disagree every rank is the reference again (a slow half: ranks 1 and 2 clear, as
    before); the healthy ranks are never named."""
    _, first, _ = _drive(4, lambda r, k: 3.0 if (r == 1 and k >= 60) or (r == 2 and k >= 150) else 1.0,
                         base=lambda r: 0.3 if r == 0 else 0.4)
    assert set(first) == {1, 2}, first
    assert _sound_refs() == (False, True, True)


def _sound_refs() -> tuple[bool, bool, bool]:
    from profwatch.core.detection.rank_outliers import _sound
    return _sound([0.3, 0.4], 0.1), _sound([0.4, 0.41], 0.1), _sound([0.3, 0.4, 0.9], 0.1)


@pytest.mark.xfail(strict=True, reason=(
    "a third slow rank of four clears the two named ones: ranks 1 and 2 3x (named at steps 67 and 157), then "
    "rank 3 1.5x from step 250: one healthy rank is left, fewer than MIN_REFERENCE_RANKS, so every rank is the "
    "reference again (median 2.25x the healthy step); ranks 1 and 2 clear at step 258 while still 3x and rank 3 "
    "is never named (seeds 5-7, rank 3 at 1.5x, 2x or 3x alike). Seeded sweep (3-32 ranks, 1 to half+1 slow one "
    "after another): 21 named ranks cleared while still slow in 10 of 120 jobs (5df09c5: 69 in 41), all with "
    "half or more of the ranks slow"))
def test_a_third_slow_rank_of_four_is_named_and_the_first_two_stay_named() -> None:
    _, first, held = _drive(4, lambda r, k: 3.0 if (r == 1 and k >= 60) or (r == 2 and k >= 150)
                            else (1.5 if r == 3 and k >= 250 else 1.0), steps=400)
    assert 250 <= first.get(3, 10**6) <= 250 + 12, first
    assert all({1, 2} <= h for h in held[first[2]:]), "rank 1 or 2 cleared while slow"


@pytest.mark.parametrize("seed", [5, 6, 7])
def test_half_the_ranks_slowing_at_once_beside_a_hot_rank_are_named_by_their_share_of_the_step(seed: int) -> None:
    """An MoE job of 8 ranks: rank 0 1.42x from step 100 (a hot expert: named), then ranks 4-7 (a node) 1.3x from
    step 250. Their compute is under rank 0's, so the step does not rise; among the peers they are half, so the
    median sits between the two halves. Before, they were never named (``bench/bench_corpus.py`` seed 36, ``moe``
    run 1); their share of the step rose against their own (``RankOutlierDetector._share_outlying``)."""
    _, first, held = _drive(8, lambda r, k: 1.42 if r == 0 and k >= 100 else 1.3 if r >= 4 and k >= 250 else 1.0,
                            seed=seed)
    assert 0 <= first[0] - 100 <= 12, first
    assert set(first) == {0, 4, 5, 6, 7}, first
    assert all(0 <= first[r] - 250 <= 12 for r in (4, 5, 6, 7)), first
    assert {4, 5, 6, 7} <= held[262]


def test_every_rank_slowing_with_a_fixed_wait_names_nobody() -> None:
    """Compute 3x on every rank from step 150 with the wait fixed: every rank's share of the step rises (0.8 to
    0.92), and the lower half's rise is the reference: a job-wide change, the step-time detector's to report."""
    _, first, _ = _drive(8, lambda r, k: 3.0 if k >= 150 else 1.0)
    assert first == {}


@pytest.mark.parametrize("seed", [5, 6, 7])
def test_a_whole_pipeline_stage_slowing_is_named_by_its_share_of_the_step(seed: int) -> None:
    """A pipeline of 4 declared stages of 4 ranks (roles), the last 1.2x by design: stage 1 (ranks 4-7, one node)
    1.3x from step 200. Its ranks are each other's only peers, so the peer test sees nothing, and the step rises
    only 7 % (the last stage set it). Before, never named; their share of the step rose 22 % while every other
    rank's fell 7 % together (the lower half's spread is its own, not its distance from 1)."""
    roles: list[str | None] = [f"pp{r // 4}" for r in range(16)]
    _, first, _ = _drive(16, lambda r, k: (1.2 if r >= 12 else 1.0) * (1.3 if 4 <= r < 8 and k >= 200 else 1.0),
                         seed=seed, roles=roles)
    assert set(first) == {4, 5, 6, 7} and all(0 <= first[r] - 200 <= 12 for r in first), first
