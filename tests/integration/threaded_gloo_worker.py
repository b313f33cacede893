"""Test helper process: one rank of a real CPU gloo job (rankhook with the torch.profiler backend) whose
``rankhook.step()`` is called from several threads: the training loop in the main thread and ``side`` threads that
also call ``step()`` (a mistaken metrics or prefetch thread). Issue 20, item 8.

argv: stop_file step_time_s side_threads. Environment: ``RANK``, ``WORLD_SIZE``, ``PROFWATCH_*`` (node endpoint,
job id, config path, prof root, backend) and ``PG_FILE`` (the gloo file store). Runs until ``stop_file`` exists (the
ranks agree on the stop step through an allreduce), then prints ``{"step_count", "foreign_steps"}`` as JSON.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time


def main() -> None:
    stop, step_s, n_side = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
    import torch
    import torch.distributed as dist

    import rankhook

    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", init_method=f"file://{os.environ['PG_FILE']}", rank=rank, world_size=world)
    hook = rankhook.init()
    if hook is None:
        sys.exit(3)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64))
    x = torch.randn(16, 64)

    def train_step() -> None:
        with rankhook.stage("forward"):
            loss = model(x).square().mean()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad = None

    train_step()
    rankhook.step()  # the main thread calls step() first: it owns the step counter
    done = threading.Event()

    def side() -> None:
        y = torch.randn(8, 8)
        while not done.is_set():
            with rankhook.stage("side"):
                y = torch.tanh(y @ y)
            rankhook.step()  # wrong thread: dropped, never drives the profiler
            time.sleep(0.002)

    threads = [threading.Thread(target=side, name=f"side-{i}") for i in range(n_side)]
    for t in threads:
        t.start()
    while True:
        t0 = time.monotonic()
        train_step()
        left = step_s - (time.monotonic() - t0)
        if left > 0:
            time.sleep(left)
        rankhook.step()
        flag = torch.tensor([1.0 if os.path.exists(stop) else 0.0])
        dist.all_reduce(flag)  # stop on the same step on every rank, or the peer's collective fails
        if flag.item() > 0:
            break
    done.set()
    for t in threads:
        t.join(10)
    print(json.dumps({"step_count": hook.step_count, "foreign_steps": hook.foreign_steps}), flush=True)
    rankhook.shutdown()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    from profwatch.simulate.launcher import exit_rank

    exit_rank(0)  # not a plain return: a gloo thread can abort the interpreter's finalization (see exit_rank)
