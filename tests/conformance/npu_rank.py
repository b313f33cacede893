"""Conformance test rank: real CPU torch (gloo) + rankhook's torch_npu backend over the REAL dynamic-profile monitor.

argv: job_id cfg_dir out_dir rank world_size step_time_s max_steps store_file node_endpoint
Environment (set by ``tests/conformance/conftest.py``): ``PYTHONPATH`` = the isolated monitor tree
(``real_torch_npu.build_tree``) + the repo; ``PROFWATCH_CONFORMANCE_SHM_TAG``; optionally
``PROFWATCH_CONFORMANCE_COVERAGE`` (a folder for coverage.py data files).

Writes in ``out_dir``: ``progress_{rank}`` (last finished step), ``steps_{rank}.jsonl`` (``{"step", "t_ns", "t_after_ns"}``:
unix ns before and after each ``rankhook.step()``), and stops when ``out_dir/stop`` exists (agreed on every rank through a gloo
all_reduce) or after max_steps. stdout/stderr are the monitor's stdout warnings (read by the tests).

Test isolation (not a stand-in for a native call): the monitor names its node-wide shared-memory block
``DynamicProfileNpuShm<YYYYMMDDHH>``; two test runs on one host in the same hour would share it (field case
FC-09). The module's ``datetime`` global is replaced by a subclass whose ``strftime`` appends the test's tag,
so each test job has its own block. The upstream file itself is unmodified.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import sys
import time


def _start_coverage() -> object | None:
    d = os.environ.get("PROFWATCH_CONFORMANCE_COVERAGE", "")
    if not d:
        return None
    import coverage

    cov = coverage.Coverage(config_file=os.path.join(d, "coveragerc"), auto_data=True)  # saved at exit
    cov.start()
    return cov


def _tag_shm_name() -> None:
    try:
        import torch_npu.profiler._dynamic_profiler._dynamic_profiler_monitor_shm as shm_mod
    except ImportError:  # profwatch's fake (daemon/profwatch/simulate/fake_torch_npu) has no shared memory
        return

    tag = os.environ.get("PROFWATCH_CONFORMANCE_SHM_TAG", "")

    class _TaggedDatetime(_dt.datetime):
        def strftime(self, fmt: str) -> str:
            return super().strftime(fmt) + tag

    shm_mod.datetime = _TaggedDatetime  # type: ignore[misc,assignment]


def main() -> None:
    job_id, cfg_dir, out_dir = sys.argv[1:4]
    rank, world = int(sys.argv[4]), int(sys.argv[5])
    step_time, max_steps = float(sys.argv[6]), int(sys.argv[7])
    store, endpoint = sys.argv[8], sys.argv[9]
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    os.environ.pop("PROF_CONFIG_PATH", None)
    cov = _start_coverage()
    import torch
    import torch.distributed as dist

    _tag_shm_name()
    import rankhook

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    hook = rankhook.init(job_id, backend="torch_npu", profiler_config_path=cfg_dir, endpoint=endpoint, rank=rank,
                         local_rank=rank, world_size=world)
    if hook is None or hook.backend.name != "torch_npu":
        raise SystemExit(f"rank {rank}: rankhook did not start the torch_npu backend")
    x = torch.ones(64, 64)
    prog = os.path.join(out_dir, f"progress_{rank}")
    steps_log = open(os.path.join(out_dir, f"steps_{rank}.jsonl"), "a", encoding="utf-8")  # noqa: SIM115
    stop = os.path.join(out_dir, "stop")
    for step in range(1, max_steps + 1):
        t0 = time.monotonic()
        y = x @ x
        dist.all_reduce(y)
        left = step_time - (time.monotonic() - t0)
        if left > 0:
            time.sleep(left)
        t_before = time.time_ns()
        rankhook.step()
        steps_log.write(json.dumps({"step": step, "t_ns": t_before, "t_after_ns": time.time_ns()}) + "\n")
        steps_log.flush()
        with open(prog + ".tmp", "w", encoding="utf-8") as f:
            f.write(str(step))
        os.replace(prog + ".tmp", prog)
        flag = torch.tensor([1.0 if os.path.exists(stop) else 0.0])
        dist.all_reduce(flag)
        if flag.item() > 0:
            break
    steps_log.close()
    rankhook.shutdown()
    dist.destroy_process_group()
    del cov  # coverage.py saves at exit, after torch_npu's own exit hooks (atexit runs last-registered first)


if __name__ == "__main__":
    main()
