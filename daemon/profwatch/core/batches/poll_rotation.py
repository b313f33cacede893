"""Which rank dirs a bounded poll re-lists by rotation (pure: no I/O, no clock).

The polling observer (``adapters/fs/poll_listing.py``) re-lists at most ``per_poll`` rank dirs of one watched tree
per poll by rotation; the others are served from their cached listing. Each rank dir has a *slot*, a dense
number given when it is first seen; with ``slots`` slots the period is ``ceil(slots / per_poll)`` polls and a
rank dir is due when ``(poll + slot) % period == 0``. Every residue class of the period holds at most
``ceil(slots / period) <= per_poll`` slots, so rotation alone re-lists at most ``per_poll`` rank dirs a poll, and
each rank dir is re-listed at least once every ``period`` polls (round-robin; a new period after the tree grew
holds again within that many polls). Re-lists forced by evidence of a change (the observer's) come on top.
"""

from __future__ import annotations

__all__ = ["relist_period", "rotation_due"]


def relist_period(slots: int, per_poll: int) -> int:
    """Polls between two rotation re-lists of one rank dir: ``ceil(slots / per_poll)``, at least 1.

    Raises:
        ValueError: ``per_poll`` < 1 or ``slots`` < 0.
    """
    if per_poll < 1 or slots < 0:
        raise ValueError(f"per_poll must be >= 1 and slots >= 0 (got {per_poll}, {slots})")
    return max(1, -(-slots // per_poll))


def rotation_due(poll: int, slot: int, period: int) -> bool:
    """Whether the rank dir in ``slot`` is re-listed by rotation in poll number ``poll`` (``period`` from
    :func:`relist_period`)."""
    return (poll + slot) % period == 0
