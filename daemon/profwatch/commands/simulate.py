"""``profwatch simulate``: SIMULATORS for trying profwatch and alert consumers without an NPU cluster.

- ``profwatch simulate tree OUT``: write an Ascend-format capture batch (the generator the tests use; the real
  msprof-analyze accepts it) with chosen slow ranks, for ``profwatch scan`` / ``profwatch analyze``.
- ``profwatch simulate job``: start simulated Ascend ranks (real processes, real gloo all-reduce, the fake
  ``torch_npu`` dynamic_profile protocol) that report to running node daemons and obey arms like real ones.
Nothing here is torch_npu; everything it writes says so in its metadata.
"""

from __future__ import annotations

import math
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal, get_args

import click

ExportType = Literal["db", "text", "both"]  # generate_cluster's export types = the --export-type choices
JOB_WIDE = {"compute": 1.2, "communication": 3.0, "host": 0.2}
"""``simulate tree --job-wide`` components and their default ``--factor``."""
MAX_FACTOR = 1000.0
"""Largest slowdown factor or host fraction the generator takes (larger ones overflow its integer durations)."""


def _factor_ok(f: float) -> bool:
    return math.isfinite(f) and 0.0 <= f <= MAX_FACTOR  # also false for NaN


@click.group()
def simulate() -> None:
    """Simulated Ascend captures and ranks (clearly labelled simulator; no NPU needed)."""


def _rank_values(spec: str | None, malformed: str, check: Callable[[float, str], None],
                 default: str | None = None) -> dict[int, float]:
    """``"2:1.5,5:2.0"`` -> {2: 1.5, 5: 2.0}: comma-separated ``rank:value`` parts (``default`` for a part without
    ``:`` when given), each value passed to ``check(value, its text)`` as it is read (it raises the usage error of
    a bad value); ``malformed`` is the usage error of a part that does not parse."""
    out: dict[int, float] = {}
    for part in (spec or "").split(","):
        part = part.strip()
        if not part:
            continue
        try:
            rank, text = part.split(":") if ":" in part or default is None else (part, default)
            out[int(rank)] = float(text)
        except ValueError:
            raise click.UsageError(malformed) from None
        check(out[int(rank)], text)
    return out


def _parse_factors(spec: str | None, what: str) -> dict[int, float]:
    def check(f: float, text: str) -> None:
        if not _factor_ok(f):
            raise click.UsageError(f"{what}: factor {text!r} must be a number from 0 to {MAX_FACTOR:g}")

    return _rank_values(spec, f"{what} must look like '2:1.5,5:2.0', got {spec!r}", check, default="1.5")


def _parse_clock(spec: str | None) -> dict[int, float]:
    """``--throttle 5:1200,7:1500`` -> {5: 1200.0, 7: 1500.0}; a usage error for anything else."""
    def check(mhz: float, text: str) -> None:
        if not 100.0 <= mhz <= 18000.0:
            raise click.UsageError(f"--throttle: {text!r} MHz must be a number from 100 to 18000")

    return _rank_values(spec, f"--throttle must look like '5:1200,7:1500' (rank:MHz), got {spec!r}", check)


@simulate.command()
@click.argument("out", type=click.Path(file_okay=False, path_type=Path))
@click.option("--world-size", default=4, show_default=True)
@click.option("--slow", "slow", help="slow ranks as rank:factor[,rank:factor] (compute slower), e.g. 2:1.5")
@click.option("--host-bound", help="rank:extra_free_fraction, e.g. 1:0.3")
@click.option("--slow-link", help="rank:factor for a slower link")
@click.option("--steps", type=click.IntRange(min=1), default=3, show_default=True)
@click.option("--export-type", type=click.Choice(get_args(ExportType)), default="db", show_default=True)
@click.option("--no-marker", is_flag=True, help="omit analyse.done (older torch_npu)")
@click.option("--capture-id", default=None)
@click.option("--seed", default=0, show_default=True)
@click.option("--job-wide", type=click.Choice(JOB_WIDE), default=None,
              help="slow every rank in one component: compute (x --factor), communication (every link x --factor), "
                   "host (extra free time, --factor as a fraction of a compute chunk)")
@click.option("--factor", type=click.FloatRange(min=0.0), default=None,
              help="for --job-wide (default: compute 1.2, communication 3.0, host 0.2)")
@click.option("--slow-op", "slow_op", default=None,
              help="one operator slower on every rank, OPTYPE:factor (MatMul or Add), e.g. MatMul:1.5")
@click.option("--pair", is_flag=True, help="write OUT/reference (healthy) and OUT/regressed (with the slowdowns asked "
                                          "for) from one seed: they differ only by that (for analyze --baseline)")
@click.option("--throttle", help="ranks whose AI Core clock ran slower, as rank:MHz[,rank:MHz] (nominal 1800), e.g. "
                                 "5:1200: their compute is 1800/MHz slower and AICORE_FREQ records the clock")
def tree(out: Path, world_size: int, slow: str | None, host_bound: str | None, slow_link: str | None, steps: int,
         export_type: ExportType, no_marker: bool, capture_id: str | None, seed: int, job_wide: str | None = None,
         factor: float | None = None, pair: bool = False, throttle: str | None = None,
         slow_op: str | None = None) -> None:
    """Write a simulated Ascend capture batch into OUT (or a healthy/regressed pair with --pair)."""
    from profwatch.simulate.ascend_tree import generate_cluster

    if world_size < 1:
        raise click.UsageError("--world-size must be >= 1")
    slow_f, host_f, link_f = (_parse_factors(slow, "--slow"), _parse_factors(host_bound, "--host-bound"),
                              _parse_factors(slow_link, "--slow-link"))
    clock = _parse_clock(throttle)
    bad = sorted(r for r in (*slow_f, *host_f, *link_f, *clock) if not 0 <= r < world_size)
    if bad:
        raise click.UsageError(f"ranks {bad} are outside 0..{world_size - 1} (--world-size {world_size})")
    if factor is not None and job_wide is None:
        raise click.UsageError("--factor needs --job-wide")
    if factor is not None and not _factor_ok(factor):
        raise click.UsageError(f"--factor {factor!r} must be a number from 0 to {MAX_FACTOR:g}")
    if job_wide is not None:
        f = JOB_WIDE[job_wide] if factor is None else factor
        bag = {"compute": slow_f, "communication": link_f, "host": host_f}[job_wide]
        bag.update({r: f for r in range(world_size)})
    ops: dict[str, float] = {}
    if slow_op:
        name, _, f_text = slow_op.partition(":")
        try:
            ops[name] = float(f_text or "1.5")
        except ValueError:
            raise click.UsageError(f"--slow-op {slow_op!r}: expected OPTYPE:factor, e.g. MatMul:1.5") from None
        if name not in ("MatMul", "Add") or not _factor_ok(ops[name]):
            raise click.UsageError(f"--slow-op {slow_op!r}: the operator is MatMul or Add, the factor 0 to "
                                   f"{MAX_FACTOR:g}")
    targets = [out / "reference", out / "regressed"] if pair else [out]
    for t in targets:
        if t.exists() and any(t.glob("*_ascend_pt")):
            raise click.UsageError(f"{t} already holds rank dirs; pick an empty or new folder (nothing was written)")
    cid = capture_id or f"sim-{int(time.time())}-{secrets.token_hex(3)}"  # two trees in one second differ
    if pair:
        generate_cluster(targets[0], world_size=world_size, steps=steps, export_type=export_type,
                         with_marker=not no_marker, capture_id=f"{cid}-reference", seed=seed)
    out.mkdir(parents=True, exist_ok=True)
    dirs = generate_cluster(targets[-1], world_size=world_size, slow_ranks=slow_f or None,
                            host_bound_ranks=host_f or None, slow_link_ranks=link_f or None, steps=steps,
                            export_type=export_type, with_marker=not no_marker, capture_id=cid, seed=seed,
                            throttled_ranks=clock or None, slow_ops=ops or None)
    if pair:
        click.echo(f"wrote {len(dirs)} healthy rank dirs under {targets[0]} and {len(dirs)} regressed ones under "
                   f"{targets[1]} (seed {seed})")
        if not (slow_f or host_f or link_f or clock or ops):
            click.echo("note: no slowdown was asked for (--slow, --host-bound, --slow-link, --job-wide, --throttle, "
                       "--slow-op): the two captures are the same job, a no-change pair", err=True)
    else:
        click.echo(f"wrote {len(dirs)} simulated rank dirs under {out}")


@simulate.command()
@click.option("--job-id", default="sim-job", show_default=True)
@click.option("--ranks", type=click.IntRange(min=1), default=4, show_default=True)
@click.option("--node-endpoint", "endpoints", multiple=True,
              help="node daemon endpoint(s); ranks are spread over them (default: PROFWATCH_NODE_ENDPOINT or the "
                   "standard runtime socket)")
@click.option("--config-dir", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="profiler_config_path of the simulated job (inside the daemons' allowed roots)")
@click.option("--prof-root", type=click.Path(file_okay=False, path_type=Path), required=True)
@click.option("--slow-rank", default="-1", show_default=True,
              help="the rank made slower at --at-step, or 'all' (every rank: a job-wide regression); -1: none")
@click.option("--slowdown", default=2.0, show_default=True)
@click.option("--at-step", default=40, show_default=True)
@click.option("--duration-s", default=300.0, show_default=True, help="the ranks stop by themselves after this")
@click.option("--stop-grace-s", default=30.0, show_default=True,
              help="on Ctrl-C / SIGTERM: how long the ranks get to stop together before their process group is "
                   "sent SIGTERM, then SIGKILL")
def job(job_id: str, ranks: int, endpoints: tuple[str, ...], config_dir: Path, prof_root: Path, slow_rank: str,
        slowdown: float, at_step: int, duration_s: float, stop_grace_s: float) -> None:
    """Run simulated Ascend ranks against running node daemons until --duration-s, Ctrl-C or SIGTERM.

    The ranks run in a process group of their own; stopping this command stops them (stop file first, so they
    leave together at an agreed step, then SIGTERM, then SIGKILL to that group). Exit 0 when every rank ended
    cleanly, 1 otherwise.
    """
    import signal
    import sys

    from profwatch.signals import handling
    from profwatch.simulate.launcher import ALL_RANKS, JobSpec, launch_job
    from rankhook.publisher import default_endpoint

    if not _factor_ok(slowdown):
        raise click.UsageError(f"--slowdown {slowdown!r} must be a number from 0 to {MAX_FACTOR:g}")
    if not (math.isfinite(duration_s) and duration_s > 0):
        raise click.UsageError(f"--duration-s {duration_s!r} must be a finite number of seconds > 0")
    if slow_rank.strip().lower() == "all":
        slow = ALL_RANKS
    else:
        try:
            slow = int(slow_rank)
        except ValueError:
            raise click.UsageError(f"--slow-rank must be a rank, -1 or 'all', got {slow_rank!r}") from None
        if not -1 <= slow < ranks:
            raise click.UsageError(f"--slow-rank {slow} is outside 0..{ranks - 1} (-1: none, 'all': every rank)")

    eps = list(endpoints) or [default_endpoint()]
    for ep in dict.fromkeys(eps):  # the ranks' own stderr goes to their logs: say it here, as a real rank says it
        if ep.startswith("ipc://") and not Path(ep[len("ipc://"):]).exists():
            click.echo(f"warning: the node socket {ep[len('ipc://'):]} does not exist (is the node daemon running on "
                       "this host? --node-endpoint names another); the simulated ranks' telemetry is queued, then dropped",
                       err=True)
    stop = config_dir.resolve() / f".{job_id}.stop"
    stop.unlink(missing_ok=True)
    spec = JobSpec(job_id=job_id, world_size=ranks, node_endpoints=eps, profiler_config_path=config_dir.resolve(),
                   prof_root=prof_root.resolve(), mode="ascend-sim", slow_rank=slow, slowdown=slowdown,
                   slow_at_step=at_step, max_seconds=duration_s, stop_file=stop)
    asked: dict[str, str] = {}

    def on_signal(signum: int, frame: object) -> None:
        asked.setdefault("by", signal.Signals(signum).name)

    with handling(on_signal):
        running = launch_job(spec)
        click.echo(f"simulated job {job_id}: {ranks} ranks (process group {running.pgid}) -> {', '.join(eps)}; "
                   f"config {config_dir}; runs {duration_s:g} s, Ctrl-C stops it", err=True)
        end = time.monotonic() + duration_s + 120
        while running.running() and "by" not in asked and time.monotonic() < end:
            time.sleep(0.2)
    if running.running():
        why = f"{asked['by']} received" if "by" in asked else "past --duration-s"
        click.echo(f"{why}: stopping the {running.running()} running ranks (up to {stop_grace_s:g} s to stop "
                   "together, then SIGTERM, then SIGKILL to their process group)", err=True)
    codes = running.stop(grace_s=stop_grace_s)
    stop.unlink(missing_ok=True)
    click.echo(f"ranks exited with {codes}", err=True)
    sys.exit(0 if all(c == 0 for c in codes) else 1)
