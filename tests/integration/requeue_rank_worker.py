"""Test helper process: one rank of a job using the real rankhook (identity and node endpoint from the environment:
``RANK``, ``WORLD_SIZE``, ``PROFWATCH_JOB_ID``, ``PROFWATCH_NODE_ENDPOINT``, ...) whose steps take ``step_s`` and,
from step ``slow_from`` on, ``slow_s`` (a job-wide slowdown when every rank of the job does it).

argv: step_s slow_from slow_s stop_file. Runs until ``stop_file`` exists.
"""

from __future__ import annotations

import os
import sys
import time


def main() -> None:
    step_s, slow_from, slow_s, stop = float(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
    import rankhook

    hook = rankhook.init()
    if hook is None:
        sys.exit(3)
    t_next = time.monotonic()
    while not os.path.exists(stop):
        t_next += slow_s if hook.step_count + 1 >= slow_from else step_s
        left = t_next - time.monotonic()
        if left > 0:
            time.sleep(left)  # the simulated training work of this step (paced, so sleeps do not add up late)
        rankhook.step()


if __name__ == "__main__":
    main()
