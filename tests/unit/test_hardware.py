"""Tests of daemon/profwatch/core/verdict/hardware.py (pure: AI Core clock summaries and findings)."""

from __future__ import annotations

import pytest

from profwatch.core.verdict.hardware import FreqSummary, below_peers, frequency_changes, summarise_freq

S = 1_000_000_000  # ns per second


def steady(mhz: float, seconds: float = 1.0) -> FreqSummary:
    return FreqSummary(mhz, mhz, seconds, ((mhz, seconds),))


def test_each_sample_holds_until_the_next_and_the_one_in_force_at_the_start_counts() -> None:
    rows = [(0, 1800), (10 * S, 1200), (12 * S, 1800)]  # the first sample is long before the window
    s = summarise_freq(rows, 9 * S, 14 * S)
    assert s is not None and s.window_s == pytest.approx(5.0) and s.min_mhz == 1200
    assert dict(s.at) == pytest.approx({1800.0: 3.0, 1200.0: 2.0}) and s.at[0][0] == 1800.0  # most time first
    assert s.mean_mhz == pytest.approx((1800 * 3 + 1200 * 2) / 5)
    assert s.seconds_below(1700) == pytest.approx(2.0)
    late = summarise_freq([(11 * S, 1500)], 10 * S, 12 * S)  # no sample before: the window starts at the first
    assert late is not None and late.window_s == pytest.approx(1.0) and late.mean_mhz == 1500


@pytest.mark.parametrize("rows", [[], [(20 * S, 1800)], [("x", 1800), (S, "fast"), (S, -5), (S, float("nan"))]])
def test_no_usable_sample_in_or_before_the_window_gives_none(rows: list) -> None:
    assert summarise_freq(rows, 0, 10 * S) is None


def test_an_empty_window_gives_none_and_string_encoded_values_are_read() -> None:
    assert summarise_freq([(0, 1800)], 5 * S, 5 * S) is None
    s = summarise_freq([("0", "1800"), (str(2 * S), "900.5")], 0, 4 * S)
    assert s is not None and s.mean_mhz == pytest.approx((1800 + 900.5) / 2)


def test_a_rank_below_its_peers_is_named_with_how_long_and_the_others_are_not() -> None:
    ranks = {r: steady(1800.0) for r in range(8)}
    ranks[5] = FreqSummary(1400.0, 1200.0, 1.0, ((1200.0, 0.5), (1600.0, 0.5)))
    ranks[2] = steady(1750.0)  # 2.8 % below: a small step, not named
    (f,) = below_peers(ranks)
    assert f["rank"] == 5 and f["kind"] == "hardware" and f["peers_mhz"] == 1800.0 and f["mean_mhz"] == 1400.0
    assert f["seconds_below"] == pytest.approx(1.0) and "1200 MHz for 0.5 s" in f["text"]
    assert below_peers({r: steady(1800.0) for r in range(64)}) == []  # every rank at the same clock
    assert below_peers({0: steady(1800.0), 1: steady(900.0)}) == []  # two ranks: no peer majority


def test_a_whole_rack_throttled_shows_only_against_the_reference() -> None:
    ref = {r: steady(1800.0) for r in range(16)}
    now = {r: steady(1400.0 if r < 8 else 1800.0) for r in range(16)}
    now[12] = steady(1000.0)
    changes = frequency_changes(ref, now)
    assert [c.component for c in changes] == ["hardware", "hardware"] and all(c.delta_s_per_step is None
                                                                              for c in changes)
    assert "rank 12: 1800 -> 1000 MHz" in str(changes[0].detail)  # the largest drop first
    assert "ranks 0, 1, 2, 3, 4, 5, 6, 7: 1800 -> 1400 MHz" in str(changes[1].detail)
    assert frequency_changes(ref, now, ranks=[9, 10]) == []  # restricted to ranks that did not change
    assert frequency_changes(ref, {r: steady(1750.0) for r in range(16)}) == []  # within 5 %
    assert frequency_changes(ref, {99: steady(800.0)}) == []  # no rank in both captures
