"""``profwatch`` command line (composition root): daemons, status, alerts, arming and offline tools.

Exit codes: the one table in ``daemon/profwatch/exitcodes.py`` (0 ok, 1 judged but not ok, 2 usage/input/config error,
3 coordinator unavailable).
"""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path
from typing import Any

import click

from profwatch.commands.common import CoordinatorClient, config_option, load_or_exit
from profwatch.exitcodes import EXIT_NOT_OK, EXIT_USAGE
from profwatch.signals import handling

_LAZY_COMMANDS = {"scan": "scan", "analyze": "analyze", "replay": "replay", "simulate": "simulate", "demo": "demo",
                  "keys": "keys", "status": "status", "alerts": "alerts", "config": "configcmd"}
"""Commands implemented in ``daemon/profwatch/commands/<module>.py`` (command name -> module), imported only when used, so
``profwatch status`` and the daemons never pay for the analysis stack (numpy, msprof parsing, Kineto reader)."""
_LAZY_HELP = {
    "scan": "Check the capture batches under DIRECTORY.",
    "analyze": "Check which capture batches under DIR are complete, analyse them and rank suspect slow ranks.",
    "replay": "Replay recorded step telemetry FILE.jsonl through anomaly detection and the arming policy.",
    "simulate": "Simulated Ascend captures and ranks (clearly labelled simulator; no NPU needed).",
    "demo": "Run the end-to-end demo: real job, real daemons, real detection, capture, analysis and alert.",
    "keys": "Create and list CURVE certificates (coordinator key, allowed node and CLI keys).",
    "status": "Show jobs (ranks: last step, step times, state), nodes, captures (state, deadline, running recipe).",
    "alerts": "Print recent alerts, then (with --follow) new ones as they are published.",
    "config": "Validate a config file (check) or print the effective configuration with its sources (show).",
}
"""The short help of each lazy command (its docstring's first sentence; ``tests/unit/test_import_weight.py`` checks
they match), so ``profwatch --help`` and shell completion of the command names import no command module."""


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
            module = importlib.import_module(f"profwatch.commands.{_LAZY_COMMANDS[cmd_name]}")
            cmd: click.Command = getattr(module, cmd_name)
        except ImportError as exc:
            from profwatch.console import missing_extra_message

            cmd = _missing(cmd_name, missing_extra_message(cmd_name, exc) or f"{cmd_name}: {exc}\n")
        self.add_command(cmd, cmd_name)
        return cmd

    def _rows(self, ctx: click.Context, incomplete: str = "") -> list[tuple[str, str | None, click.Command | None]]:
        """``(name, short help of a lazy command not loaded, else None, the loaded command)`` of the visible
        commands starting with ``incomplete``; loads nothing."""
        rows: list[tuple[str, str | None, click.Command | None]] = []
        for name in self.list_commands(ctx):
            if not name.startswith(incomplete):
                continue
            if name in _LAZY_COMMANDS and name not in self.commands:
                rows.append((name, _LAZY_HELP[name], None))
            else:
                cmd = super().get_command(ctx, name)
                if cmd is not None and not cmd.hidden:
                    rows.append((name, None, cmd))
        return rows

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The command list of ``--help``, lazy commands by :data:`_LAZY_HELP` (click's layout and limit)."""
        rows = self._rows(ctx)
        if not rows:
            return
        limit = formatter.width - 6 - max(len(name) for name, _, _ in rows)
        lines: list[tuple[str, str]] = []
        for name, text, cmd in rows:
            if text is not None:
                lines.append((name, click.Command(name, help=text).get_short_help_str(limit)))
            elif cmd is not None:
                lines.append((name, cmd.get_short_help_str(limit)))
        with formatter.section("Commands"):
            formatter.write_dl(lines)

    def shell_complete(self, ctx: click.Context, incomplete: str) -> list[Any]:
        """Completion of the command names (and the group's options) without importing a lazy command."""
        from click.shell_completion import CompletionItem

        items = [CompletionItem(name, help=text if cmd is None else cmd.get_short_help_str())
                 for name, text, cmd in self._rows(ctx, incomplete)]
        return [*items, *click.Command.shell_complete(self, ctx, incomplete)]


def _print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    """``--version``: the distribution's version, looked up only when asked (``rankhook/version.py``)."""
    if not value or ctx.resilient_parsing:
        return
    import profwatch

    click.echo(f"profwatch, version {profwatch.__version__}")
    ctx.exit()


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_print_version,
              help="Show the version and exit.")
@click.option("--config", "config_path", type=click.Path(dir_okay=False, path_type=Path),
              help="TOML config file for every subcommand (a subcommand's own --config wins).")
def cli(config_path: Path | None) -> None:
    """profwatch: anomaly-triggered, same-batch-checked profiling for Ascend NPU and PyTorch clusters.

    Config file: the subcommand's --config, then this --config, then env PROFWATCH_CONFIG (empty: none), then
    /etc/profwatch/profwatch.toml when it exists, then built-in defaults."""


def _serve(label: str, endpoint: Any, build: Any) -> None:
    """Start one daemon: metrics endpoint, ``build(metrics, notifier)``, SIGTERM -> ``stop()``, ``run()`` until
    stopped. A daemon that cannot start (port in use, bad state file, endpoint held, unusable sink secret) exits 2
    with one line, no traceback. Under systemd (``Type=notify``) the daemon sends READY=1 once it serves and
    WATCHDOG=1 from its main loop; SIGHUP reloads nothing (restart is the reload path: docs/systemd.md)."""
    import os

    from profwatch.adapters.outputs.metrics import DaemonMetrics
    from profwatch.adapters.outputs.sd_notify import SdNotifier

    metrics = DaemonMetrics(label)
    notifier = SdNotifier(os.environ)
    if endpoint.metrics_plain_beyond_loopback():
        import structlog

        structlog.get_logger("profwatch").warning(
            "metrics_insecure", daemon=label, addr=endpoint.http_addr(), port=endpoint.http_port(),
            note="metrics_insecure = true: the HTTP endpoint is served in plain HTTP beyond loopback "
                 "(docs/security.md)")
    try:
        # /metrics, /healthz and /readyz on metrics_port; with metrics off, /healthz and /readyz on health_port
        metrics.serve(endpoint.http_port(), endpoint.http_addr(),
                      certfile=str(endpoint.metrics_tls_cert) if endpoint.metrics_tls_cert else None,
                      keyfile=str(endpoint.metrics_tls_key) if endpoint.metrics_tls_key else None,
                      client_cafile=str(endpoint.metrics_client_ca) if endpoint.metrics_client_ca else None,
                      health_only=endpoint.metrics_port is None)
        d = build(metrics, notifier)
        metrics.health.checks = d.ready_checks
    except Exception as exc:  # noqa: BLE001
        click.echo(f"profwatch {label}: cannot start: {exc}", err=True)
        metrics.close()
        sys.exit(EXIT_USAGE)

    def on_hup(signum: int, frame: Any) -> None:
        import structlog

        structlog.get_logger("profwatch").warning("reload_not_supported", daemon=label,
                                                  hint="systemctl restart reloads the config; state is kept")

    try:
        # SIGTERM/SIGINT stop the daemon, SIGHUP is logged; the process's own handlers come back after run()
        with handling(lambda signum, frame: d.stop()), handling(on_hup, signal.SIGHUP):
            d.run()
    finally:
        metrics.close()
        notifier.close()


@cli.command()
@config_option
def node(config_path: Path | None) -> None:
    """Run the node daemon (one per host): relay rank telemetry, write node-local configs, tail dp logs."""
    from profwatch.logsetup import configure_logging
    from profwatch.node import NodeDaemon

    s = load_or_exit(config_path)
    configure_logging(s.logging.level, s.logging.format)
    _serve("node", s.node,
           lambda metrics, notifier: NodeDaemon(s.node, metrics, s.security, s.limits, notifier))


@cli.command()
@config_option
def coordinator(config_path: Path | None) -> None:
    """Run the coordinator: ingest, detection, arming, completeness, analysis, alerts."""
    from profwatch.coordinator import Coordinator
    from profwatch.logsetup import configure_logging

    s = load_or_exit(config_path)
    configure_logging(s.logging.level, s.logging.format)
    _serve("coordinator", s.coordinator, lambda metrics, notifier: Coordinator(s, metrics, notifier))


@cli.command()
@config_option
@click.option("--job", "job_id", required=True)
@click.option("--in-steps", type=int, help="start this many steps after the furthest rank")
@click.option("--start-step", type=int, help="absolute start_step (must be ahead of every rank)")
@click.option("--active", type=int, help="steps recorded (default: the coordinator's [capture] manual_active, 4, or [arming] active "
                   "when larger)")
@click.option("--warmup", type=int, help="warm-up steps before recording (default: [capture] manual_warmup, 1)")
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
    s = load_or_exit(config_path)
    coord = CoordinatorClient(s)
    res = coord.call("arm", {"job_id": job_id, "in_steps": in_steps, "start_step": start_step, "active": active,
                           "warmup": warmup, "rank_list": rank_list, "reason": reason, "dry_run": dry_run},
                     refused="would refuse arm (dry run, nothing written)" if dry_run else None)
    if as_json:
        click.echo(json.dumps(res, indent=2))
    what = (f"capture {res['capture_id']} of job {res['job_id']}: start_step={res['start_step']} "
            f"warmup={res['warmup']} active={res['active']} ranks={res['rank_list'] or 'all'} -> {res['prof_dir']}")
    for warning in res.get("warnings") or []:
        click.echo(f"warning: {warning}", err=True)
    from profwatch.commands.arm_wait import window_line

    window = window_line(res, chosen=in_steps is None and start_step is None)
    if dry_run:
        if res.get("refused"):
            click.echo(f"dry run: would be refused: {res['refused']['message']}", err=as_json)
            sys.exit(EXIT_NOT_OK)
        if not as_json:
            click.echo(f"dry run (nothing written): {what}")
            click.echo(window)
        return
    who = (f"node daemon(s) {', '.join(res['nodes'])}" if res["writer"] == "node" else "the coordinator")
    if not as_json:
        click.echo(f"planned {what}; config write asked of {who}, not confirmed yet"
                   + ("" if wait else f" (see: profwatch status --job {job_id})"))
        click.echo(window)
    if wait:
        from profwatch.commands.arm_wait import wait_for_arm

        ack_s = max(s.coordinator.ack_timeout_s, 3 * float(res.get("step_time_s") or 0) + 50)  # lifecycle.ack_window_s
        bound = wait_s if wait_s is not None else s.capture.write_timeout_s + ack_s + 10
        ok = wait_for_arm(lambda: coord.call("capture", {"capture_id": res["capture_id"]}), bound, click.echo)
        sys.exit(0 if ok else EXIT_NOT_OK)


@cli.command()
@config_option
@click.option("--job", "job_id", required=True)
@click.option("--capture", "capture_id", help="this capture (default: every capture of the job in flight)")
@click.option("--json", "as_json", is_flag=True)
def cancel(config_path: Path | None, job_id: str, capture_id: str | None, as_json: bool) -> None:
    """Stop tracking a capture in flight so the job can be armed again. Its data is kept (whatever the ranks wrote
    stays in place). Before analysis the idle config (start_step 0) is written over the arm: ranks that have not
    started the window drop it; a window already running ends as armed."""
    s = load_or_exit(config_path)
    res = CoordinatorClient(s).call("cancel", {"job_id": job_id, "capture_id": capture_id})
    if as_json:
        click.echo(json.dumps(res, indent=2))
        return
    for cap in res:
        click.echo(f"cancelled capture {cap['capture_id']} of job {cap['job_id']} ({cap['outcome']}); data kept")
        if cap.get("idle_config"):
            click.echo("  the idle config (start_step 0) goes over the arm: ranks that have not started the window "
                       "drop it (see the capture's idle_config_* event)")


@cli.command()
@config_option
@click.option("--job", "job_id", required=True)
def telemetry(config_path: Path | None, job_id: str) -> None:
    """Dump a job's recent step telemetry (the coordinator's windows) as JSONL for ``profwatch replay``."""
    s = load_or_exit(config_path)
    click.echo(CoordinatorClient(s).call("dump_telemetry", {"job_id": job_id}, timeout_s=30), nl=False)


def _missing(name: str, why: str) -> click.Command:
    """A stand-in for a command whose module cannot be imported here: says ``why`` (which extra it needs, from
    ``profwatch.console.missing_extra_message``) for any arguments, ``--help`` included, and exits 2."""
    first = why.splitlines()[0] if why else name

    @click.command(name=name, add_help_option=False,
                   context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
                   help=f"(not available in this installation: {first})")
    def _cmd() -> None:
        click.echo(why.rstrip("\n"), err=True)
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
