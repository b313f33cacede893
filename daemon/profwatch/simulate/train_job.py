"""A real, small PyTorch training job for the demo and tests (SIMULATED WORKLOAD, real torch + gloo + DDP).

One process per rank (identity from ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``; rendezvous at ``MASTER_ADDR``/
``MASTER_PORT``), an MLP on generated data, DDP gradient all-reduce over gloo on the CPU, rankhook telemetry with
per-stage timing. From ``--slow-at-step`` on, ``--slow-rank`` (-2: every rank) does ``--slowdown`` times its normal forward compute
(extra real matrix multiplications), so every rank's step time rises (the others wait in the all-reduce).

Backends: ``--mode torch`` uses rankhook's ``torch`` backend (torch.profiler); ``--mode ascend-sim`` uses the
``torch_npu`` backend over the clearly labelled fake ``torch_npu`` package in ``daemon/profwatch/simulate/fake_torch_npu``
(the dynamic_profile protocol simulator), feeding it the measured compute and all-reduce timings so the rank dirs
it writes carry this run's real timing.

Stops after ``--max-steps``, after ``--max-seconds``, or when the ``--stop-file`` exists.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path


def _args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=["torch", "ascend-sim"], default="torch")
    p.add_argument("--slow-rank", type=int, default=-1, help="-1: none; -2: every rank (a job-wide regression)")
    p.add_argument("--slowdown", type=float, default=2.0, help="slow rank's compute factor from --slow-at-step")
    p.add_argument("--slow-at-step", type=int, default=40)
    p.add_argument("--burst-at-step", type=int, default=-1, help="first step of a job-wide load burst (-1: none)")
    p.add_argument("--burst-steps", type=int, default=0)
    p.add_argument("--burst-factor", type=float, default=1.5, help="every rank's compute factor during the burst")
    p.add_argument("--max-steps", type=int, default=2000)
    p.add_argument("--max-seconds", type=float, default=600.0)
    p.add_argument("--stop-file", type=Path)
    p.add_argument("--slow-file", type=Path, help="the slowdown starts at the first step from --slow-at-step at which "
                                                  "this file exists (then stays)")
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--inner", type=int, default=6, help="forward passes per step (base compute)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = _args(argv)
    if a.mode == "ascend-sim":
        fake = Path(__file__).resolve().parent / "fake_torch_npu"
        sys.path.insert(0, str(fake))
        os.environ.setdefault("PROFWATCH_BACKEND", "torch_npu")
    else:
        os.environ.setdefault("PROFWATCH_BACKEND", "torch")
    import torch
    import torch.distributed as dist

    import rankhook

    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=__import__("datetime").timedelta(seconds=120))
    hook = rankhook.init()
    dp_fake = sys.modules.get("torch_npu.profiler.dynamic_profile") if a.mode == "ascend-sim" else None
    torch.manual_seed(1234 + rank)
    layers = []
    for _ in range(a.layers):
        layers += [torch.nn.Linear(a.hidden, a.hidden), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(a.hidden, 10))
    ddp = torch.nn.parallel.DistributedDataParallel(model) if a.mode == "torch" else model
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(a.batch, a.hidden)
    y = torch.randint(0, 10, (a.batch,))
    extra = torch.randn(a.hidden, a.hidden)
    t_start = time.monotonic()
    step = 0
    flat = None
    stop_flag = torch.zeros(1)
    slow_file_seen = a.slow_file is None
    while step < a.max_steps:
        if step % 5 == 0:
            # Agree on stopping: a rank that left alone would break its peers' next collective.
            stop_flag.fill_(1.0 if (a.stop_file is not None and a.stop_file.exists())
                            or time.monotonic() - t_start > a.max_seconds else 0.0)
            dist.all_reduce(stop_flag, op=dist.ReduceOp.MAX)
            if stop_flag.item() > 0:
                break
        slow = (rank == a.slow_rank or a.slow_rank == -2) and step + 1 >= a.slow_at_step
        if slow and not slow_file_seen:
            slow = slow_file_seen = a.slow_file is not None and a.slow_file.exists()
        burst = 0 <= a.burst_at_step <= step + 1 < a.burst_at_step + a.burst_steps
        c0 = time.time_ns()
        with rankhook.stage("data"):
            xb = x + 0.01 * torch.randn_like(x)
        with rankhook.stage("forward"):
            loss = None
            for _ in range(a.inner):
                out = ddp(xb) if a.mode == "torch" else model(xb)
                loss = torch.nn.functional.cross_entropy(out, y) if loss is None else loss + torch.nn.functional.cross_entropy(out, y)
            for factor in ([a.slowdown] if slow else []) + ([a.burst_factor] if burst else []):
                # the injected slowdown (one rank) or load burst (every rank): real extra compute. Forward +
                # backward cost about 3 matmuls per layer and pass: scale that by (factor - 1)
                z = xb
                n_extra = max(1, int(round((factor - 1.0) * 3 * a.inner * (a.layers + 1))))
                for _ in range(n_extra):
                    z = torch.tanh(z @ extra)
        with rankhook.stage("backward"):
            opt.zero_grad(set_to_none=True)
            assert loss is not None  # at least one inner micro-batch ran (a.inner >= 1)
            loss.backward()
        c1 = time.time_ns()
        if a.mode == "ascend-sim":
            with rankhook.stage("communication"):
                grads = [p.grad for p in model.parameters() if p.grad is not None]
                flat = torch.cat([g.reshape(-1) for g in grads])
                s0 = time.time_ns()
                dist.all_reduce(flat)
                s1 = time.time_ns()
                # the transfer took the shortest duration any rank saw (the last arrival's); the rest of this
                # rank's duration was waiting (msprof-analyze's own definition of wait,
                # docs/msprof-analyze.md#cluster-time-summary)
                shortest = torch.tensor([float(s1 - s0)], dtype=torch.float64)
                dist.all_reduce(shortest, op=dist.ReduceOp.MIN)
                wait_ns = max(0, (s1 - s0) - int(shortest.item()))
            if dp_fake is not None and hasattr(dp_fake, "record_segment"):
                # Simulated device time: the whole wall time of the compute section. On a loaded host the CPU
                # time is less than the wall time, and a rank doing 3x the work loses about 3x the wall time to
                # the scheduler: booked as free time, that loss made an injected compute slowdown read as `host`
                # (docs/verdicts.md, the kinds). As kernel time it stays with the work that caused it, so the kind is
                # `compute` on an idle and on a loaded box.
                busy = max(1, c1 - c0)
                dp_fake.record_segment("compute", c1 - busy, c1, name="aclnnMatMul_MatMulKernel")
                dp_fake.record_segment("collective", s0, s1, name=f"hcom_allReduce__{step % 1000}_0_1",
                                       wait_ns=wait_ns)
        with rankhook.stage("optimizer"):
            opt.step()
        step += 1
        rankhook.step()
    rankhook.shutdown()
    try:
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - peers may already be gone at the end of a demo
        pass
    del hook, flat
    return 0


if __name__ == "__main__":
    from profwatch.simulate.launcher import exit_rank

    exit_rank(main())  # not sys.exit: a gloo thread can abort the interpreter's finalization (exit_rank)
