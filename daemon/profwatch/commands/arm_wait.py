"""``profwatch arm --wait``: follow one capture until its arm is settled and say what happened (CLI body)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from profwatch.core.display import when_text


def wait_for_arm(fetch: Callable[[], dict[str, Any]], bound_s: float, echo: Callable[[str], None],
                 sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> bool:
    """Poll ``fetch()`` (the coordinator's ``capture`` view) every 0.5 s until the arm is settled (the config
    write and every covered rank's acknowledgement are in, or the capture moved on) or ``bound_s`` passed.

    Prints who wrote the config (and its mtime in UTC and its age against ``wall()``), then how many ranks acknowledged and, for each one that did not,
    what it said and the known cause. Returns True only when the config was written and every rank acknowledged.
    """
    end = clock() + bound_s
    view = fetch()
    said_written = False
    while True:
        if not said_written and view.get("written_unix_s") is not None:
            nodes = sorted(n for n, v in (view.get("node_writes") or {}).items() if v == "ok")
            by = f"node daemon(s) {', '.join(nodes)}" if nodes else "the coordinator"
            echo(f"config written by {by}: {view['profiler_config_path']}/profiler_config.json "
                 f"(modified {when_text(view.get('config_mtime_s'), wall())})")
            said_written = True
        if view.get("arm_settled") or clock() >= end:
            break
        sleep(0.5)
        view = fetch()
    if view.get("written_unix_s") is None:
        echo(f"config not written: {view.get('outcome') or f'no writer confirmed it within {bound_s:g} s'}")
        return False
    got, want = view.get("acknowledged_ranks", 0), view.get("expected_ranks", 0)
    if want and got == want:
        echo(f"acknowledged by all {want} ranks; capture {view['capture_id']} is {view['state']}, "
             f"window from step {view['start_step']}")
        return True
    still = "" if view.get("arm_settled") else f" after {bound_s:g} s"
    echo(f"acknowledged by {got}/{want} ranks{still}; not by:")
    for line in (view.get("unacknowledged") or [])[:16]:
        echo(f"  {line}")
    return False


def window_line(res: dict[str, Any], chosen: bool) -> str:
    """The capture window an arm planned, in steps and in time: ``res`` is the coordinator's ``arm`` answer
    (``start_step``, ``warmup``, ``active``, ``furthest_step``, ``step_time_s`` in seconds or None); ``chosen``:
    the planner chose the start (no ``--in-steps`` / ``--start-step``), said so, since nothing else would tell
    the operator when a real capture will run."""
    start, warmup, active = int(res["start_step"]), int(res.get("warmup") or 0), int(res.get("active") or 0)
    first, last = start + warmup, start + warmup + active - 1
    furthest = res.get("furthest_step")
    ahead = start - int(furthest) if isinstance(furthest, int) else None
    step_s = res.get("step_time_s")
    when = ""
    if ahead is not None:
        when = f", {ahead} steps ahead of the furthest rank (step {furthest})"
        if isinstance(step_s, (int, float)) and step_s > 0:
            when += (f": recording starts in about {max(0, ahead + warmup) * step_s:.0f} s and lasts about "
                     f"{active * step_s:.0f} s at {step_s:.3g} s/step")
    who = "the planner chose" if chosen else "asked for"
    return (f"window ({who}): warm-up from step {start}, recording steps {first}-{last} "
            f"(warmup {warmup}, active {active}){when}")
