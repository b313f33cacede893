"""Liveness and readiness of a daemon, for ``/healthz`` and ``/readyz`` (pure: the caller passes the clock).

``/healthz`` (liveness): the process answers and its main loop turned within :data:`LOOP_STALE_S` (the loop
calls :meth:`Health.tick` where it pings systemd's watchdog; ``WatchdogSec=30s`` in the units, the same bound).
Before the first turn the daemon is starting: live (a restart would not help), not ready.

``/readyz`` (readiness): live, and every check the daemon reports holds: the coordinator's state db open, its
sockets bound and its analysis workers up; the node's coordinator reachable (an answer within the node's
``unanswered_after_s``). The body says each check with its detail, so a probe's log says why (docs/systemd.md).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping

LOOP_STALE_S = 30.0
"""A main loop that has not turned for this long is not live (the units' ``WatchdogSec``)."""

Check = tuple[bool, str]
"""``(holds, detail)`` of one readiness check."""


class Health:
    """The main loop's last turn (monotonic s) and the daemon's readiness checks (set once it is built)."""

    def __init__(self, stale_after_s: float = LOOP_STALE_S) -> None:
        if not stale_after_s > 0:
            raise ValueError("stale_after_s must be > 0")
        self.stale_after_s = stale_after_s
        self.last_tick: float | None = None
        self.checks: Callable[[], Mapping[str, Check]] | None = None

    def tick(self, now: float) -> None:
        """The main loop turned at ``now`` (monotonic s)."""
        self.last_tick = now

    def live(self, now: float) -> tuple[bool, dict[str, object]]:
        """``(live, body)`` for ``/healthz`` at ``now`` (monotonic s)."""
        if self.last_tick is None:
            return True, {"status": "ok", "loop": "starting: the main loop has not turned yet"}
        age = now - self.last_tick
        ok = age <= self.stale_after_s
        return ok, {"status": "ok" if ok else "fail",
                    "loop": f"turned {max(0.0, age):.1f} s ago (stale after {self.stale_after_s:g} s)"}

    def ready(self, now: float) -> tuple[bool, dict[str, object]]:
        """``(ready, body)`` for ``/readyz`` at ``now``: live, started, and every check holding."""
        live, body = self.live(now)
        checks: dict[str, dict[str, object]] = {"loop": {"ok": live and self.last_tick is not None,
                                                        "detail": body["loop"]}}
        if self.checks is None:
            checks["daemon"] = {"ok": False, "detail": "starting"}
        else:
            try:
                got = dict(self.checks())
            except Exception as exc:  # noqa: BLE001 - a probe must answer, with why it could not check
                got = {"checks": (False, f"could not be evaluated: {exc!r}")}
            for name, (ok, detail) in got.items():
                checks[name] = {"ok": bool(ok), "detail": detail}
        ready = all(c["ok"] for c in checks.values())
        return ready, {"status": "ok" if ready else "fail", "checks": checks}


def body_bytes(body: Mapping[str, object]) -> bytes:
    """The JSON body of a probe answer (one line, newline-terminated)."""
    return (json.dumps(body, sort_keys=True) + "\n").encode()
