"""A rank process for tests: rankhook telemetry only (no torch), a fixed compute time per step.

Usage: python rank_worker.py OUT_JSON STEPS STEP_S  (identity from RANK/WORLD_SIZE/LOCAL_RANK/PROFWATCH_JOB_ID,
endpoint from PROFWATCH_NODE_ENDPOINT; capture backend from PROFWATCH_BACKEND, ``none`` when unset). Writes {"steps", "max_step_call_s", "p99_step_call_s", "counters"} to OUT_JSON.
Runs forever when STEPS is 0 (until SIGTERM).
"""

import json
import os
import signal
import sys
import time

import rankhook

out, steps, step_s = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
stop = {"flag": False}
signal.signal(signal.SIGTERM, lambda *a: stop.__setitem__("flag", True))
hook = rankhook.init(backend=os.environ.get("PROFWATCH_BACKEND", "none"))
assert hook is not None
calls = []
i = 0


def dump() -> None:
    s = sorted(calls)
    with open(out + ".tmp", "w") as f:
        json.dump({"steps": i, "max_step_call_s": s[-1] if s else 0.0,
                   "p99_step_call_s": s[int(0.99 * (len(s) - 1))] if s else 0.0,
                   "counters": vars(hook.publisher.counters)}, f)

    os.replace(out + ".tmp", out)


while not stop["flag"] and (steps == 0 or i < steps):
    with rankhook.stage("compute"):
        time.sleep(step_s)  # the simulated step's work (not a test wait)
    t0 = time.perf_counter()
    rankhook.step()
    calls.append(time.perf_counter() - t0)
    i += 1
    if i % 10 == 0:
        dump()
dump()
rankhook.shutdown()
