"""Who this rank is: job_id, rank, local_rank, world_size, hostname, pid (stdlib only; reads env).

Sources, in order: explicit arguments; the standard launcher env (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE`` as set
by torchrun, torch_npu_run, Slurm's ``SLURM_PROCID``/``SLURM_LOCALID``/``SLURM_NTASKS``); then
``torch.distributed`` if it is already initialised. job_id: ``PROFWATCH_JOB_ID``, torchrun's
``TORCHELASTIC_RUN_ID`` (unless it is the default ``none``), ``SLURM_JOB_ID``, else ``"default"``. restart_count:
torchrun's ``TORCHELASTIC_RESTART_COUNT`` (the elastic agent's count of worker-group restarts; None when unset).
"""

from __future__ import annotations

import os
import socket
import sys
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Identity:
    """One rank's identity. ``pid`` is the process id at init (a forked child gets none: see publisher)."""

    job_id: str
    rank: int
    local_rank: int
    world_size: int
    hostname: str
    pid: int
    restart_count: int | None = None


def _env_int(env: dict[str, str] | os._Environ[str], *names: str) -> int | None:
    for name in names:
        val = env.get(name)
        if val is not None and val.strip().lstrip("-").isdigit():
            return int(val)
    return None


def _torch_dist() -> tuple[int, int] | None:
    """(rank, world_size) from torch.distributed if torch is already imported and initialised."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            return int(dist.get_rank()), int(dist.get_world_size())
    except Exception:  # noqa: BLE001 - identity must never raise into training
        return None
    return None


def job_id_from_env(env: dict[str, str] | os._Environ[str] | None = None) -> str:
    """Return the job id from ``PROFWATCH_JOB_ID``, ``TORCHELASTIC_RUN_ID``, ``SLURM_JOB_ID`` or ``"default"``."""
    env = os.environ if env is None else env
    for name in ("PROFWATCH_JOB_ID", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID"):
        val = env.get(name, "").strip()
        if val and val != "none":
            return val
    return "default"


def resolve_identity(
    job_id: str | None = None,
    rank: int | None = None,
    local_rank: int | None = None,
    world_size: int | None = None,
    env: dict[str, str] | os._Environ[str] | None = None,
) -> Identity:
    """Resolve this process's :class:`Identity`; unknown rank falls back to 0 of a world of 1."""
    env = os.environ if env is None else env
    if rank is None:
        rank = _env_int(env, "RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK")
    if world_size is None:
        world_size = _env_int(env, "WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE")
    if local_rank is None:
        local_rank = _env_int(env, "LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK")
    if rank is None or world_size is None:
        td = _torch_dist()
        if td is not None:
            rank = td[0] if rank is None else rank
            world_size = td[1] if world_size is None else world_size
    rank = 0 if rank is None else rank
    world_size = max(1, world_size if world_size is not None else 1)
    return Identity(
        job_id=job_id or job_id_from_env(env),
        rank=rank,
        local_rank=rank if local_rank is None else local_rank,
        world_size=world_size,
        hostname=socket.gethostname(),
        pid=os.getpid(),
        restart_count=restart_count_from_env(env),
    )


def restart_count_from_env(env: dict[str, str] | os._Environ[str] | None = None) -> int | None:
    """``TORCHELASTIC_RESTART_COUNT`` as a non-negative int (torchrun sets it in every worker: 0 at the first start,
    +1 per restart of the worker group), or None when unset or not a number."""
    env = os.environ if env is None else env
    val = env.get("TORCHELASTIC_RESTART_COUNT", "").strip()
    return int(val) if val.isdigit() and len(val) < 10 else None
