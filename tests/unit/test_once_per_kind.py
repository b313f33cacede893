"""``OncePerKind`` stays bounded when peers choose the kinds (adversarial finding: a claimed world size or restart
count per hello made one log line and one remembered key each, without limit)."""

from __future__ import annotations

from profwatch.logsetup import OncePerKind


def test_each_kind_logs_once_while_below_the_bound() -> None:
    once = OncePerKind(max_kinds=3)
    assert [once.first(k) for k in ("a", "b", "a", "c", "b")] == [True, True, False, True, False]


def test_beyond_the_bound_new_kinds_get_one_line_per_interval_and_memory_stays_bounded() -> None:
    once = OncePerKind(max_kinds=100, overflow_interval_s=3600.0)
    lines = sum(once.first(f"claim:job:{i}") for i in range(100_000))
    assert lines == 100 + 1  # the first 100 kinds, then one overflow line within the interval
    assert len(once._seen) == 100 and once.suppressed == 100_000 - 101
    assert not once.first("claim:job:5")  # remembered kinds stay quiet


def test_the_overflow_line_comes_back_after_its_interval() -> None:
    once = OncePerKind(max_kinds=1, overflow_interval_s=0.0)
    assert once.first("a") and once.first("b") and once.first("c")  # interval 0: every overflow kind may log
