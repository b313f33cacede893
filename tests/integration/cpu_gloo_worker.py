"""One rank of a real 2-rank gloo job in lockstep (test helper script): ``n`` matmuls then one all-reduce per step,
``rankhook.step()`` after it, reports to the node endpoint given. Rank 1 does ``--factor`` x the matmuls.

Usage: ``python cpu_gloo_worker.py RANK PG_FILE ENDPOINT --steps 40 --matmuls 6 --factor 3 [--sample-s 0.02]``
(``--sample-s``: the hook's ``CPU_SAMPLE_S``, so a short run carries several CPU samples).
"""

from __future__ import annotations

import argparse


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("rank", type=int)
    ap.add_argument("pg_file")
    ap.add_argument("endpoint")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--matmuls", type=int, default=6)
    ap.add_argument("--factor", type=float, default=3.0)
    ap.add_argument("--sample-s", type=float, default=None)
    a = ap.parse_args()
    import torch
    import torch.distributed as dist

    import rankhook.hook as hook_mod
    from rankhook.backends.base import NoneBackend
    from rankhook.hook import Hook
    from rankhook.identity import resolve_identity
    from rankhook.publisher import Publisher

    if a.sample_s is not None:
        hook_mod.CPU_SAMPLE_S = a.sample_s
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{a.pg_file}", rank=a.rank, world_size=2)
    hook = Hook(resolve_identity("cpu-gloo", rank=a.rank, world_size=2), Publisher(a.endpoint), NoneBackend())
    w = torch.randn(256, 256)
    x = torch.randn(64, 256)
    buf = torch.zeros(256)
    n = int(round(a.matmuls * (a.factor if a.rank == 1 else 1.0)))
    for _ in range(a.steps):
        z = x
        for _ in range(n):
            z = torch.tanh(z @ w)
        buf[:] = z[0]
        dist.all_reduce(buf)
        hook.step()
    dist.barrier()
    hook.close()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
