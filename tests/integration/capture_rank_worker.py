"""Test helper process: one training rank driving a rankhook capture backend directly (no node daemon).

argv: backend cfg_dir out_dir rank world_size step_time_s max_steps [gloo_store_file]
Writes ``out_dir/progress_{rank}`` (current step), ``out_dir/events_{rank}.jsonl`` (CaptureEvents) and stops when
``out_dir/stop`` exists or after max_steps. With a store file it runs a real gloo allreduce per step.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from dataclasses import asdict


def main() -> None:
    backend_name, cfg_dir, out_dir = sys.argv[1:4]
    rank, world, step_time, max_steps = int(sys.argv[4]), int(sys.argv[5]), float(sys.argv[6]), int(sys.argv[7])
    store = sys.argv[8] if len(sys.argv) > 8 else None
    os.environ["RANK"] = str(rank)
    os.environ["WORLD_SIZE"] = str(world)
    from rankhook.backends import select_backend
    from rankhook.identity import Identity

    torch = None
    if store:
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
        x = torch.ones(64, 64)
    lock = threading.Lock()
    ev_path = os.path.join(out_dir, f"events_{rank}.jsonl")

    def emit(ev: object) -> None:
        with lock, open(ev_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(asdict(ev)) + "\n")  # type: ignore[call-overload]

    ident = Identity(job_id="j1", rank=rank, local_rank=rank, world_size=world, hostname="hostA", pid=os.getpid())
    be = select_backend(backend_name, cfg_dir, None)
    be.open(ident, emit)
    prog = os.path.join(out_dir, f"progress_{rank}")
    stop = os.path.join(out_dir, "stop")
    for step in range(1, max_steps + 1):
        t0 = time.monotonic()
        if torch is not None:
            y = x @ x
            torch.distributed.all_reduce(y)
        if be.name == "torch_npu":
            from torch_npu.profiler import dynamic_profile as dp

            t = time.time_ns()
            dp.record_segment("compute", t, t + 1_000_000)
        left = step_time - (time.monotonic() - t0)
        if left > 0:
            time.sleep(left)  # the simulated training work of this step
        be.after_step(step)
        with open(prog + ".tmp", "w") as f:
            f.write(str(step))
        os.replace(prog + ".tmp", prog)
        want_stop = os.path.exists(stop)
        if torch is not None:  # stop on the same step on every rank, or the peer's collective fails
            flag = torch.tensor([1.0 if want_stop else 0.0])
            torch.distributed.all_reduce(flag)
            want_stop = bool(flag.item() > 0)
        if want_stop:
            break
    be.close()
    if torch is not None:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
    from profwatch.simulate.launcher import exit_rank

    exit_rank(0)  # not a plain return: a gloo thread can abort the interpreter's finalization (see exit_rank)
