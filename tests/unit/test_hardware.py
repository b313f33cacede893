"""Tests of daemon/profwatch/core/changes/hardware.py (pure: AI Core clock summaries and findings)."""

from __future__ import annotations

import sqlite3
import tracemalloc
from pathlib import Path

import pytest

from profwatch.adapters.tools.own_tables_reader import read_aicore_freq, read_rank_aicore, read_rank_tables
from profwatch.core.changes.comparison import frequency_changes
from profwatch.core.changes.hardware import FreqSummary, below_peers, summarise_freq

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


def idling(busy_mhz: float, busy_s: float, idle_s: float) -> FreqSummary:
    """A clock at ``busy_mhz`` for ``busy_s`` and at the idle 800 MHz for ``idle_s``."""
    total = busy_s + idle_s
    return FreqSummary((busy_mhz * busy_s + 800.0 * idle_s) / total, 800.0 if idle_s else busy_mhz, total,
                       tuple(sorted(((busy_mhz, busy_s), (800.0, idle_s)), key=lambda x: -x[1])))


def test_a_rank_that_idled_more_than_its_peers_is_not_named_as_hardware() -> None:
    # every rank clocks down to the idle 800 MHz while it waits; rank 3 waited for a slow peer (or its data loader)
    # 40 % of the capture: its time-weighted mean is 1400 MHz, but its clock ran at 1800 MHz whenever it had work
    ranks = {r: idling(1800.0, 0.95, 0.05) for r in range(8)}
    ranks[3] = idling(1800.0, 0.6, 0.4)
    assert ranks[3].mean_mhz == pytest.approx(1400.0) and ranks[3].busy_mhz == 1800.0
    assert below_peers(ranks) == []
    ranks[6] = idling(1300.0, 0.9, 0.1)  # a throttled clock, with idle phases too, is still named
    (f,) = below_peers(ranks)
    assert (f["rank"], f["busy_mhz"], f["peers_mhz"]) == (6, 1300.0, 1800.0) and f["idle_s"] == pytest.approx(0.1)
    assert "idle 800 MHz" in f["text"]
    ranks[7] = steady(800.0)  # held at the idle clock through the steps: the clock itself is low
    assert [f["rank"] for f in below_peers(ranks)] == [7, 6]
    ranks[0] = FreqSummary(1250.0, 700.0, 1.0, ((700.0, 0.5), (1800.0, 0.5)))  # below idle is throttled, not idle
    assert ranks[0].idle_s == 0.0 and [f["rank"] for f in below_peers(ranks)] == [7, 0, 6]


def test_more_idle_time_than_the_reference_is_not_a_hardware_change() -> None:
    ref = {r: idling(1800.0, 0.9, 0.1) for r in range(4)}
    assert frequency_changes(ref, {r: idling(1800.0, 0.5, 0.5) for r in range(4)}) == []
    (c,) = frequency_changes(ref, {r: idling(1200.0, 0.5, 0.5) for r in range(4)})
    assert "1800 -> 1200 MHz" in str(c.detail)


def test_an_infinite_or_huge_timestamp_is_skipped_not_raised() -> None:
    s = summarise_freq([(0, 1800), (float("inf"), 1200), (1e300, 900), (float("-inf"), 100)], 0, S)
    assert s is not None and s.mean_mhz == 1800.0 and s.window_s == pytest.approx(1.0)


def _freq_db(rows: list[tuple[object, object, object]]) -> sqlite3.Connection:
    con = sqlite3.connect(":memory:")
    con.execute("CREATE TABLE AICORE_FREQ (deviceId INTEGER, timestampNs INTEGER, freq INTEGER)")
    con.executemany("INSERT INTO AICORE_FREQ VALUES (?, ?, ?)", rows)
    return con


def test_the_reader_skips_hostile_rows_and_reads_the_busiest_device() -> None:
    rows: list[tuple[object, object, object]] = [
        (0, 0, 1800), (0, 5e999, 1200), (0, None, 1000), (0, S // 2, None), (0, S // 4, "fast"),
        (0, S // 2, 1200), (0, S // 2, 1300),  # two samples at one time: the later in (time, MHz) order holds
        (1, 0, 500), (1, S, 500),  # a second device with fewer rows
        (0, 5 * S, 100),  # after the window
    ]
    s = read_aicore_freq(_freq_db(rows), 0, S)
    assert s is not None and dict(s.at) == pytest.approx({1800.0: 0.5, 1300.0: 0.5})
    assert read_aicore_freq(_freq_db([]), 0, S) is None
    assert read_aicore_freq(_freq_db([(0, 2 * S, 1800)]), 0, S) is None  # only samples after the window


def test_the_reader_streams_a_table_of_many_samples() -> None:
    n = 400_000  # 1 us apart; only the samples of the window are summed
    con = _freq_db([(0, i * 1000, 1800 if i % 4 else 800) for i in range(n)])
    tracemalloc.start()
    try:
        s = read_aicore_freq(con, 100_000_000, 200_000_000)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert s is not None and s.window_s == pytest.approx(0.1) and s.busy_mhz == pytest.approx(1800.0)
    assert s.mean_mhz == pytest.approx(1550.0, rel=1e-3)
    assert peak < 2_000_000  # a list of the rows would hold ~100,000 tuples (several MB)


@pytest.mark.parametrize("end", [1e30, float("inf"), "soon"], ids=["huge", "infinite", "text"])
def test_a_hostile_step_span_does_not_raise_out_of_the_rank_reads(tmp_path: Path, end: object) -> None:
    # a STEP_TIME endNs stored as REAL 1e30 (or Infinity, or text): the clock read raised OverflowError (the int
    # did not bind to SQLite, or int(inf)), failing the whole batch's analysis
    out = tmp_path / "rank0" / "ASCEND_PROFILER_OUTPUT"
    out.mkdir(parents=True)
    con = sqlite3.connect(out / "ascend_pytorch_profiler_0.db")
    con.execute("CREATE TABLE STEP_TIME (id INTEGER, startNs INTEGER, endNs)")
    con.execute("INSERT INTO STEP_TIME VALUES (1, 0, ?)", (end,))
    con.execute("CREATE TABLE AICORE_FREQ (deviceId INTEGER, timestampNs INTEGER, freq INTEGER)")
    con.executemany("INSERT INTO AICORE_FREQ VALUES (?, ?, ?)", [(0, 0, 1800), (0, S, 1200)])
    con.commit()
    con.close()
    got = read_rank_aicore(tmp_path / "rank0")
    assert got is None or got.min_mhz == 1200.0
    tables = read_rank_tables(0, tmp_path / "rank0")  # never raises for bad data: a note instead
    assert tables.aicore is None or tables.aicore.min_mhz == 1200.0
