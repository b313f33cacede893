"""Real CPU gloo job with torch.profiler, writing torch_pt rank dirs in the profwatch layout (test helper script).

Usage: ``python gloo_job.py OUT_DIR --world-size 4 --slow-rank 2 --extra-ms 40 --steps 5``. Each rank trains a
small MLP, all-reduces its gradients (gloo) every step and, if it is the slow rank, burns ``extra_ms`` of real
matmul compute before the allreduce. The capture covers steps ``[w + 2, w + 2 + active)`` (``ProfilerStep#N`` = step
N), ``w`` = ``--warmup-steps`` (0: the first window starts at step 2, still warming up: allocator, gloo buffers);
with ``--second-out DIR`` a second window of the same job follows it (the next ``2 + active`` steps), written
under ``DIR`` (two captures of one job: a reference and a later capture).
Layout per ``docs/architecture.md``: ``{host}_{pid}_{YYYYmmddHHMMSSfff}_torch_pt/`` with
``profiler_info_{rank}.json``, ``profiler_metadata.json``, ``{host}_{pid}.{ts_ms}.pt.trace.json`` and
``trace.done`` written last.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import socket
import time
from datetime import datetime


def _ts17(t: float) -> str:
    dt = datetime.fromtimestamp(t)
    return dt.strftime("%Y%m%d%H%M%S") + f"{dt.microsecond // 1000:03d}"


def _burn(ms: float) -> None:
    import torch

    a = torch.randn(192, 192)
    end = time.perf_counter() + ms / 1000.0
    while time.perf_counter() < end:
        a = torch.tanh(a @ a)


def worker(rank: int, args: argparse.Namespace) -> None:
    faulthandler.enable()  # an abort in a C++ thread (gloo, kineto) then shows where the Python threads were
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile, schedule

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{args.pg_file}", rank=rank, world_size=args.world_size)
    torch.manual_seed(rank)
    h = args.hidden
    model = torch.nn.Sequential(torch.nn.Linear(h, h), torch.nn.ReLU(), torch.nn.Linear(h, h))
    x = torch.randn(64, h)
    host, pid = socket.gethostname(), os.getpid()
    t_start = time.time()
    outs = [args.out] + ([args.second_out] if args.second_out else [])
    written: list[tuple[str, float]] = []  # (rank dir, its window's start) per capture

    def ready(p: profile) -> None:  # one call per capture window (repeat=len(outs))
        t = time.time()
        rank_dir = os.path.join(outs[len(written)], f"{host}_{pid}_{_ts17(t)}_torch_pt")
        os.makedirs(rank_dir, exist_ok=True)
        p.export_chrome_trace(os.path.join(rank_dir, f"{host}_{pid}.{int(t * 1000)}.pt.trace.json"))
        written.append((rank_dir, t))

    warm = 2
    sched = schedule(skip_first=args.warmup_steps, wait=warm - 1, warmup=1, active=args.steps, repeat=len(outs))
    with profile(activities=[ProfilerActivity.CPU], schedule=sched, on_trace_ready=ready) as prof:
        for _step in range(args.warmup_steps + (warm + args.steps) * len(outs) + 1):
            loss = model(x).square().mean()
            loss.backward()
            if rank == args.slow_rank:
                _burn(args.extra_ms)
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad = None
            prof.step()
    dist.barrier()
    for i, (rank_dir, _t) in enumerate(written):
        info = {"rank_id": rank, "world_size": args.world_size, "config": {"activities": ["CPU"]},
                "start_info": {"unix_s": t_start}, "end_info": {"unix_s": time.time()},
                "torch_version": torch.__version__}
        with open(os.path.join(rank_dir, f"profiler_info_{rank}.json"), "w") as fh:
            json.dump(info, fh)
        with open(os.path.join(rank_dir, "profiler_metadata.json"), "w") as fh:
            json.dump({"profwatch_capture_id": f"{args.capture_id}-{i}" if i else args.capture_id,
                       "profwatch_reason": "test", "profwatch_job_id": "gloo-test"}, fh)
        open(os.path.join(rank_dir, "trace.done"), "wb").close()
    dist.destroy_process_group()
    from profwatch.simulate.launcher import exit_rank

    exit_rank(0)  # not a return: a gloo thread can abort the interpreter's finalization (see exit_rank)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--world-size", type=int, default=4)
    ap.add_argument("--slow-rank", type=int, default=-1)
    ap.add_argument("--extra-ms", type=float, default=40.0)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--capture-id", default="cap-gloo-1")
    ap.add_argument("--hidden", type=int, default=256,
                    help="the MLP's width: 256 steps in ~1 ms of compute; 1024 makes compute dominate the step")
    ap.add_argument("--warmup-steps", type=int, default=0,
                    help="steps run before the first window (its steps then match the later window's warm state)")
    ap.add_argument("--second-out", default=None,
                    help="a second capture window of the same job, written under this dir (two captures of one job)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if args.second_out:
        os.makedirs(args.second_out, exist_ok=True)
    args.pg_file = os.path.join(args.out, ".pg_init")
    import torch.multiprocessing as mp

    mp.spawn(worker, args=(args,), nprocs=args.world_size, join=True)
    os.remove(args.pg_file) if os.path.exists(args.pg_file) else None


if __name__ == "__main__":
    main()
