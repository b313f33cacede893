"""Fixtures shared by the integration tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.integration.capture_harness import Harness


@pytest.fixture
def harness(short_tmp: Path) -> Iterator[Callable[..., Harness]]:
    """``harness(**settings)`` starts a :class:`~tests.integration.capture_harness.Harness` in ``short_tmp``;
    every one started is closed after the test."""
    hs: list[Harness] = []

    def make(**kw: object) -> Harness:
        h = Harness(short_tmp, **kw)  # type: ignore[arg-type]
        hs.append(h)
        return h

    yield make
    for h in hs:
        h.close()
