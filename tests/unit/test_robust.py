"""Robust statistics helpers (profwatch.core.verdict.robust): exact against brute force, candidates kept out of the noise."""

from __future__ import annotations

import random
import statistics

import pytest

from profwatch.core.verdict.robust import (
    loo_medians,
    mad_sigma,
    median,
    pooled_within_sigma,
    trimmed_pool,
    upper_outliers,
)


@pytest.mark.parametrize("seed", range(5))
def test_loo_medians_equal_brute_force_with_ties(seed: int):
    rng = random.Random(seed)
    for _ in range(400):
        n = rng.randint(1, 11)
        vals = [rng.choice([1.0, 2.0, 2.0, 3.0, rng.random()]) for _ in range(n)]
        expected = [statistics.median(vals[:i] + vals[i + 1:]) if n > 1 else None for i in range(n)]
        assert loo_medians(vals) == expected
    assert loo_medians([]) == []


def test_trimmed_pool_leaves_the_worst_step_out():
    assert trimmed_pool([1.0]) == 1.0
    assert trimmed_pool([5.0, 1.0]) == 1.0
    assert trimmed_pool([1.0, 9.0, 2.0, 3.0]) == pytest.approx(2.0)
    with pytest.raises(ValueError):
        trimmed_pool([])


def test_mad_sigma_and_pooled_within_sigma():
    rng = random.Random(1)
    xs = [rng.gauss(0, 2.0) for _ in range(20_000)]
    assert mad_sigma(xs) == pytest.approx(2.0, rel=0.05) and mad_sigma([3.0]) == 0.0
    series = [[rng.gauss(m, 0.5) for _ in range(5)] for m in range(200)]
    sigma, dof = pooled_within_sigma(series)
    assert sigma == pytest.approx(0.5, rel=0.08) and dof == 800
    assert pooled_within_sigma([[1.0]]) == (0.0, 0) and median([3, 1, 2]) == 2


def test_upper_outliers_keep_candidates_out_of_the_noise():
    rng = random.Random(2)
    values = {k: rng.gauss(0, 1.0) for k in range(8)}
    values[3], values[6] = 12.0, 7.0  # two outliers in 8: both would inflate a MAD taken over everyone
    t = upper_outliers(values, candidate_z=3.0)
    assert t.candidates == frozenset({3, 6}) and t.n_noise == 6
    assert t.z[3] > 6 and t.z[6] > 4 and max(z for k, z in t.z.items() if k not in (3, 6)) < 3


def test_upper_outliers_floor_and_small_groups():
    t = upper_outliers({0: 0.0, 1: 0.0, 2: 0.0, 3: 0.0, 4: 0.0, 5: 0.001}, candidate_z=3.0, sigma_floor=0.01)
    assert t.sigma == 0.01 and t.z[5] == pytest.approx(0.1)  # identical peers: the floor, not a zero MAD
    two_of_four = upper_outliers({0: 0.4, 1: -0.4, 2: -0.4, 3: 0.4}, candidate_z=3.0, sigma_floor=0.01)
    assert two_of_four.candidates == frozenset({0, 3}) and two_of_four.z[0] == pytest.approx(80.0)
    assert upper_outliers({}, candidate_z=3.0).z == {}


@pytest.mark.parametrize("seed", range(40))
def test_upper_outliers_array_is_upper_outliers(seed: int):
    """Issue 34: the array form (link pairs by the hundred thousand) decides as the dict form: the same center,
    scale, candidates and z, through the rounds, the floor, the MAD's minimum n and the majority rule."""
    import random

    import numpy as np

    from profwatch.core.verdict.robust import upper_outliers_array

    rng = random.Random(seed)
    n = rng.choice([0, 1, 3, 4, 5, 8, 30, 200])
    values = [rng.gauss(0, 0.05) for _ in range(n)]
    for i in rng.sample(range(n), min(n, rng.choice([0, 1, 3, n // 2 + 1]))):
        values[i] += rng.choice([0.5, 2.0, 10.0])
    floor = rng.choice([0.0, 0.01, 0.3])
    cz = rng.choice([1.0, 3.0])
    ref = upper_outliers(dict(enumerate(values)), candidate_z=cz, sigma_floor=floor)
    got = upper_outliers_array(np.array(values), candidate_z=cz, sigma_floor=floor)
    assert (got.center, got.sigma, got.sigma_between, got.n_noise) == pytest.approx(
        (ref.center, ref.sigma, ref.sigma_between, ref.n_noise), rel=1e-12, abs=1e-15)
    assert set(np.flatnonzero(got.candidates).tolist()) == set(ref.candidates)
    assert got.z.tolist() == pytest.approx([ref.z[i] for i in range(n)], rel=1e-9, abs=1e-12)
