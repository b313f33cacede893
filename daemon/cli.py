"""``profwatch`` command line (composition root): daemons, status, alerts, arming and offline tools.

Exit codes: the one table in ``daemon/exitcodes.py`` (0 ok, 1 judged but not ok, 2 usage/input/config error,
3 coordinator unavailable).
"""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

import click

from daemon import __version__
from daemon.exitcodes import EXIT_NOT_OK as EXIT_PROBLEM
from daemon.exitcodes import EXIT_UNAVAILABLE as EXIT_UNREACHABLE
from daemon.exitcodes import EXIT_USAGE

_config_option = click.option(
    "--config", "config_path", type=click.Path(dir_okay=False, path_type=Path), envvar="PROFWATCH_CONFIG",
    help="TOML config file (env PROFWATCH_CONFIG); PROFWATCH_<SECTION>__<KEY> env vars override it.",
)


def _load(config_path: Path | None) -> Any:
    from daemon.config import ConfigError, load_settings

    try:
        return load_settings(config_path)
    except ConfigError as exc:
        click.echo(f"profwatch: {exc}", err=True)
        sys.exit(EXIT_USAGE)


def _install_sigterm(stop: Any) -> None:
    def handler(signum: int, frame: Any) -> None:
        stop()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


_LAZY_COMMANDS = {"scan": "scan", "analyze": "analyze", "replay": "replay", "simulate": "simulate", "demo": "demo",
                  "keys": "keys"}
"""Commands implemented in ``daemon/commands/<module>.py`` (command name -> module), imported only when used, so
``profwatch status`` and the daemons never pay for the analysis stack (numpy, msprof parsing, Kineto reader)."""


class _LazyGroup(click.Group):
    """A click group that imports the commands of :data:`_LAZY_COMMANDS` on first use (click's documented
    lazy-loading pattern: https://click.palletsprojects.com/en/stable/complex/#lazily-loading-subcommands).
    A command whose module cannot be imported (a missing optional dependency) answers with why, exit 2."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *_LAZY_COMMANDS])

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in _LAZY_COMMANDS or cmd_name in self.commands:
            return super().get_command(ctx, cmd_name)
        import importlib

        try:
            module = importlib.import_module(f"daemon.commands.{_LAZY_COMMANDS[cmd_name]}")
            cmd: click.Command = getattr(module, cmd_name)
        except ImportError as exc:
            cmd = _missing(cmd_name, str(exc))
        self.add_command(cmd, cmd_name)
        return cmd


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="profwatch")
def cli() -> None:
    """profwatch: anomaly-triggered, same-batch-checked profiling for Ascend NPU and PyTorch clusters."""


def _serve(label: str, metrics_port: int | None, build: Any) -> None:
    """Start one daemon: metrics endpoint, ``build(metrics, notifier)``, SIGTERM -> ``stop()``, ``run()`` until
    stopped. A daemon that cannot start (port in use, bad state file, endpoint held, unusable sink secret) exits 2
    with one line, no traceback. Under systemd (``Type=notify``) the daemon sends READY=1 once it serves and
    WATCHDOG=1 from its main loop; SIGHUP reloads nothing (restart is the reload path: docs/systemd.md)."""
    import os

    from daemon.adapters.metrics import DaemonMetrics
    from daemon.adapters.sd_notify import SdNotifier

    metrics = DaemonMetrics(label)
    notifier = SdNotifier(os.environ)
    try:
        metrics.serve(metrics_port)
        d = build(metrics, notifier)
    except Exception as exc:  # noqa: BLE001
        click.echo(f"profwatch {label}: cannot start: {exc}", err=True)
        metrics.close()
        sys.exit(EXIT_USAGE)
    _install_sigterm(d.stop)

    def on_hup(signum: int, frame: Any) -> None:
        import structlog

        structlog.get_logger("profwatch").warning("reload_not_supported", daemon=label,
                                                  hint="systemctl restart reloads the config; state is kept")

    signal.signal(signal.SIGHUP, on_hup)
    try:
        d.run()
    finally:
        metrics.close()
        notifier.close()


@cli.command()
@_config_option
def node(config_path: Path | None) -> None:
    """Run the node daemon (one per host): relay rank telemetry, write node-local configs, tail dp logs."""
    from daemon.logsetup import configure_logging
    from daemon.node import NodeDaemon

    s = _load(config_path)
    configure_logging(s.logging.level, s.logging.format)
    _serve("node", s.node.metrics_port,
           lambda metrics, notifier: NodeDaemon(s.node, metrics, s.security, s.limits, notifier))


@cli.command()
@_config_option
def coordinator(config_path: Path | None) -> None:
    """Run the coordinator: ingest, detection, arming, completeness, analysis, alerts."""
    from daemon.coordinator import Coordinator
    from daemon.logsetup import configure_logging

    s = _load(config_path)
    configure_logging(s.logging.level, s.logging.format)
    _serve("coordinator", s.coordinator.metrics_port, lambda metrics, notifier: Coordinator(s, metrics, notifier))


def _client_keys(s: Any, endpoint: str) -> Any:
    """CURVE client keys for ``endpoint`` (None when it does not use CURVE); exit 2 with the fix when missing."""
    from daemon.adapters.keyfiles import CurveSetupError, client_keys

    try:
        return client_keys(s.security, endpoint)
    except CurveSetupError as exc:
        click.echo(f"profwatch: {exc}", err=True)
        sys.exit(EXIT_USAGE)


def _call(s: Any, cmd: str, args: dict[str, Any] | None = None, timeout_s: float = 5.0) -> Any:
    from daemon.adapters.control import ControlAuthFailed, ControlError, ControlUnavailable, call

    endpoint = s.coordinator.control_bind
    try:
        return call(endpoint, cmd, args, timeout_s=timeout_s, curve=_client_keys(s, endpoint))
    except ControlAuthFailed as exc:
        click.echo(f"profwatch: {exc.message}", err=True)
        sys.exit(EXIT_UNREACHABLE)
    except ControlUnavailable as exc:
        click.echo(f"profwatch: {exc.message}\n  is the coordinator running? The CLI finds it through [coordinator] "
                   "control_bind of --config / PROFWATCH_CONFIG (default tcp://127.0.0.1:7712).", err=True)
        sys.exit(EXIT_UNREACHABLE)
    except ControlError as exc:
        click.echo(f"profwatch: coordinator refused {cmd}: [{exc.code}] {exc.message}", err=True)
        sys.exit(EXIT_PROBLEM)


def _echo_generation(job: dict[str, Any]) -> None:
    """The job's generation (elastic restarts and resizes, docs/generations.md) and claims still short of a quorum."""
    gen, rc = job.get("generation") or 0, job.get("restart_count")
    if gen or rc is not None:
        click.echo(f"  generation {gen} (restart count {'-' if rc is None else rc}, since "
                   f"{time.strftime('%H:%M:%S', time.localtime(job.get('generation_since_unix_s') or 0))})")
    for c in job.get("pending_generations") or []:
        click.echo(f"  claimed: world_size={c['world_size']} restart count {c['restart_count']}: "
                   f"{c['agreeing_through_job_nodes']} of {c['quorum']} ranks agree through the job's nodes "
                   f"({c['ranks']} held); no new generation yet")


@cli.command()
@_config_option
@click.option("--job", "job_id", help="only this job")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def status(config_path: Path | None, job_id: str | None, as_json: bool) -> None:
    """Show jobs, ranks (last step, step time), nodes, drops and captures."""
    s = _load(config_path)
    snap = _call(s, "status", {"job_id": job_id} if job_id else {})
    if job_id and not snap["jobs"]:
        click.echo(f"profwatch: the coordinator knows no job {job_id!r} (no rank of it has said hello)", err=True)
        sys.exit(EXIT_PROBLEM)
    if as_json:
        click.echo(json.dumps(snap, indent=2))
        return
    for job in snap["jobs"]:
        mst = job["median_step_time_s"]
        click.echo(f"job {job['job_id']}  world_size={job['world_size']} ranks_seen={job['ranks_seen']} "
                   f"backend={job['backend'] or '-'} furthest_step={job['furthest_step']} "
                   f"median_step_time={f'{mst:.3f}s' if mst else '-'} rank_drops={job.get('rank_drops', 0)}")
        _echo_generation(job)
        for rank, err in sorted((job.get("backend_errors") or {}).items(), key=lambda kv: int(kv[0])):
            click.echo(f"  rank {rank}: capture backend not in use: {err}")
        click.echo(f"  {'rank':>5} {'host':<20} {'last_step':>9} {'step_time_s':>11} {'age_s':>7}  state")
        for r in job["ranks"]:
            st = "left" if r["left"] else ("capturing" if r["capturing"] else "")
            age = f"{r['age_s']:.1f}" if r["age_s"] is not None else "-"
            click.echo(f"  {r['rank']:>5} {r['hostname'][:20]:<20} {r['last_step']:>9} {r['step_time_s']:>11.4f} {age:>7}  {st}")
    click.echo("nodes:")
    for n in snap["nodes"]:
        c = n.get("counters", {})
        down = " DOWN" if n.get("down") else ""
        click.echo(f"  {n['node_id']:<20}{down} age={n['age_s']:.1f}s received={c.get('received', 0)} "
                   f"rejected={c.get('rejected', 0)} dropped={c.get('dropped', 0)} lost_batches={n['lost_batches']}")
        if n.get("stale_state"):
            click.echo(f"    stale torch_npu state: {n['stale_state']}")
    if snap.get("captures"):
        click.echo("captures:")
        for cap in snap["captures"]:
            _print_capture(cap)
    cnt = snap["counters"]
    click.echo(f"coordinator: received={cnt['received']} rejected={cnt['rejected']} lost_batches={cnt['lost_batches']}")


def _print_capture(cap: dict[str, Any]) -> None:
    """One capture of ``status``: state, how long in it, its deadline, acknowledgements, outcome."""
    left = cap.get("deadline_in_s")
    deadline = "" if left is None else (f" deadline in {left:.0f}s" if left >= 0 else f" deadline passed {-left:.0f}s ago")
    click.echo(f"  {cap['capture_id']:<32} {cap['state']:<12} for {cap.get('in_state_s', 0):.0f}s{deadline} "
               f"start_step={cap['start_step']} acked={cap.get('acknowledged_ranks')}/{cap.get('expected_ranks')} "
               f"reason={cap['reason']}")
    if cap.get("running") is not None:
        click.echo(f"    running: {', '.join(cap['running']) or 'staging, ranking or the Kineto analyzer'}")
    if cap.get("outcome"):
        click.echo(f"    {cap['outcome']}")


def _print_alert(ev: dict[str, Any], as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(ev))
        return
    d = ev.get("data", {})
    line = f"{ev.get('time', '')} {ev.get('type', '')} job={ev.get('subject')}"
    sus = d.get("suspects")
    if sus is not None:
        if sus:
            line += " suspects: " + ", ".join(
                f"rank {x['rank']} ({x['kind']}, score {x['score']:.2f}, {x.get('hostname') or '?'})" for x in sus)
        else:
            line += " no suspect (balanced)"
        if d.get("report"):
            line += f" report={d['report']}"
    elif d.get("missing_ranks") is not None:
        line += f" missing_ranks={d['missing_ranks']} problems={len(d.get('problems') or [])}"
    elif ev.get("type") == "io.profwatch.anomaly.v1":
        line += (f" {d.get('kind')} at step {d.get('step')} ranks={d.get('ranks')} "
                 f"+{100 * float(d.get('magnitude') or 0):.0f}%")
    elif ev.get("type") == "io.profwatch.arm_decision.v1":
        line += f" {d.get('action')} ({d.get('reason')}) for {d.get('anomaly')} at step {d.get('step')}"
    elif ev.get("type") == "io.profwatch.arm.v1":
        line += (f" capture {d.get('capture_id')} {d.get('status')} start_step={d.get('start_step')} "
                 f"warmup={d.get('warmup')} active={d.get('active')} config={d.get('path') or d.get('error', '')}")
    elif ev.get("type") in ("io.profwatch.capture.v1", "io.profwatch.batch.v1"):
        line += f" capture {d.get('capture_id')} {d.get('event')}" + (f" ranks={d['ranks']}" if "ranks" in d else "")
    else:
        line += " " + json.dumps(d)[:200]
    click.echo(line)


@cli.command()
@_config_option
@click.option("--job", "job_id", help="only this job")
@click.option("--follow", "-f", is_flag=True, help="keep listening for new alerts")
@click.option("--all-events", is_flag=True, help="also anomalies, arm decisions and capture progress")
@click.option("--limit", default=20, show_default=True, help="recent alerts fetched first")
@click.option("--json", "as_json", is_flag=True, help="one CloudEvent JSON per line")
def alerts(config_path: Path | None, job_id: str | None, follow: bool, all_events: bool, limit: int, as_json: bool) -> None:
    """Print recent alerts, then (with --follow) new ones as they are published.

    Missed alerts are fetched from the coordinator's store first, so nothing published before the subscriber
    joined is lost (ZeroMQ PUB drops what was sent before a SUB connected).
    """
    import zmq

    from daemon.adapters.publish import Subscription

    s = _load(config_path)
    args = {"job_id": job_id, "limit": limit, "alerts_only": not all_events}
    sub = None
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    if follow:  # subscribe first, then fetch history, then dedup by id: no gap between the two
        sub = Subscription(ctx, s.coordinator.pub_bind, ["alert", "event"] if all_events else ["alert"], job_id,
                           curve=_client_keys(s, s.coordinator.pub_bind))
    seen: set[str] = set()
    last_seq = 0
    for row in _call(s, "events", args):
        seen.add(row["event"]["id"])
        last_seq = max(last_seq, row["seq"])
        _print_alert(row["event"], as_json)
    if sub is None:
        return
    stop = {"flag": False}
    _install_sigterm(lambda: stop.__setitem__("flag", True))
    try:
        while not stop["flag"]:
            ev = sub.recv(500)
            if ev is not None and str(ev.get("id")) not in seen:
                seen.add(str(ev.get("id")))
                _print_alert(ev, as_json)
                sys.stdout.flush()
    finally:
        sub.close()


@cli.command()
@_config_option
@click.option("--job", "job_id", required=True)
@click.option("--in-steps", type=int, help="start this many steps after the furthest rank")
@click.option("--start-step", type=int, help="absolute start_step (must be ahead of every rank)")
@click.option("--active", type=int, help="steps recorded (default from config: [arming] active, 4)")
@click.option("--warmup", type=int, help="warm-up steps before recording (default 1)")
@click.option("--ranks", help="comma-separated rank ids (default: all ranks)")
@click.option("--reason", default="manual", show_default=True)
@click.option("--dry-run", is_flag=True, help="plan and print, write nothing")
@click.option("--wait", "wait", is_flag=True, help="wait for the config write and every rank's acknowledgement")
@click.option("--wait-s", type=float, help="bound for --wait (default: write timeout + ack timeout + 10 s)")
@click.option("--json", "as_json", is_flag=True, help="the full plan and rendered config as JSON")
def arm(config_path: Path | None, job_id: str, in_steps: int | None, start_step: int | None, active: int | None,
        warmup: int | None, ranks: str | None, reason: str, dry_run: bool, wait: bool, wait_s: float | None,
        as_json: bool) -> None:
    """Arm a capture window on a job through the coordinator (same planner as automatic arming).

    Prints what was planned and who was asked to write the config; nothing is confirmed until the writer and
    the ranks say so (--wait). Exit 1 when the arm is refused (or would be, with --dry-run), the write fails, or
    a rank has not acknowledged by the end of --wait.
    """
    if in_steps is not None and start_step is not None:
        raise click.UsageError("--in-steps and --start-step are exclusive")
    try:
        rank_list = [int(x) for x in ranks.split(",")] if ranks else None
    except ValueError:
        raise click.UsageError(f"--ranks must be comma-separated integers, got {ranks!r}") from None
    s = _load(config_path)
    res = _call(s, "arm", {"job_id": job_id, "in_steps": in_steps, "start_step": start_step, "active": active,
                           "warmup": warmup, "rank_list": rank_list, "reason": reason, "dry_run": dry_run})
    if as_json:
        click.echo(json.dumps(res, indent=2))
    what = (f"capture {res['capture_id']} of job {res['job_id']}: start_step={res['start_step']} "
            f"warmup={res['warmup']} active={res['active']} ranks={res['rank_list'] or 'all'} -> {res['prof_dir']}")
    if dry_run:
        if res.get("refused"):
            click.echo(f"dry run: would be refused: {res['refused']['message']}", err=as_json)
            sys.exit(EXIT_PROBLEM)
        if not as_json:
            click.echo(f"dry run (nothing written): {what}")
        return
    who = (f"node daemon(s) {', '.join(res['nodes'])}" if res["writer"] == "node" else "the coordinator")
    if not as_json:
        click.echo(f"planned {what}; config write asked of {who}, not confirmed yet"
                   + ("" if wait else f" (see: profwatch status --job {job_id})"))
    if wait:
        from daemon.commands.arm_wait import wait_for_arm

        bound = wait_s if wait_s is not None else s.capture.write_timeout_s + s.coordinator.ack_timeout_s + 10
        ok = wait_for_arm(lambda: _call(s, "capture", {"capture_id": res["capture_id"]}), bound, click.echo)
        sys.exit(0 if ok else EXIT_PROBLEM)


@cli.command()
@_config_option
@click.option("--job", "job_id", required=True)
@click.option("--capture", "capture_id", help="this capture (default: every capture of the job in flight)")
@click.option("--json", "as_json", is_flag=True)
def cancel(config_path: Path | None, job_id: str, capture_id: str | None, as_json: bool) -> None:
    """Stop tracking a capture in flight so the job can be armed again. Its data is kept; a config already
    delivered may still fire on the ranks (whatever they write stays in place)."""
    s = _load(config_path)
    res = _call(s, "cancel", {"job_id": job_id, "capture_id": capture_id})
    if as_json:
        click.echo(json.dumps(res, indent=2))
        return
    for cap in res:
        click.echo(f"cancelled capture {cap['capture_id']} of job {cap['job_id']} ({cap['outcome']}); data kept")


@cli.command()
@_config_option
@click.option("--job", "job_id", required=True)
def telemetry(config_path: Path | None, job_id: str) -> None:
    """Dump a job's recent step telemetry (the coordinator's windows) as JSONL for ``profwatch replay``."""
    s = _load(config_path)
    click.echo(_call(s, "dump_telemetry", {"job_id": job_id}, timeout_s=30), nl=False)


def _missing(name: str, why: str) -> click.Command:
    @click.command(name=name, context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
                   help=f"(not available in this installation: {why})")
    def _cmd() -> None:
        click.echo(f"profwatch {name}: not available in this installation ({why})", err=True)
        sys.exit(EXIT_USAGE)

    return _cmd


def _escape_unencodable_output() -> None:
    """Print what the terminal's encoding cannot show as backslash escapes instead of dying on it: file names are
    bytes, shown as the OS gives them (undecodable bytes arrive as surrogate escapes), and under a C/ASCII locale
    without UTF-8 mode even a valid non-ASCII name cannot be encoded (docs/paths.md)."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            try:
                reconfigure(errors="backslashreplace")
            except (ValueError, OSError):  # a closed or exotic stream: leave it as it is
                pass


def main() -> None:
    """Console-script entry point."""
    _escape_unencodable_output()
    cli(prog_name="profwatch")


if __name__ == "__main__":
    main()
