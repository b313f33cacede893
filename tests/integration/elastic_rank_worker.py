"""Test helper process: one worker of a torchrun-elastic job using the real rankhook, configured by the environment
torchrun gives its workers (``TORCHELASTIC_RUN_ID``, ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
``TORCHELASTIC_RESTART_COUNT``) plus ``PROFWATCH_NODE_ENDPOINT`` / ``PROFWATCH_PROFILER_CONFIG_PATH`` /
``PROFWATCH_PROF_ROOT`` / ``PROFWATCH_BACKEND``.

argv: step_time_s stop_file. Calls ``rankhook.step()`` every ``step_time_s`` until ``stop_file`` exists.
"""

from __future__ import annotations

import os
import sys
import time


def main() -> None:
    step_time, stop = float(sys.argv[1]), sys.argv[2]
    import rankhook

    if rankhook.init() is None:
        sys.exit(3)
    while not os.path.exists(stop):
        time.sleep(step_time)  # the simulated training work of this step
        rankhook.step()


if __name__ == "__main__":
    main()
