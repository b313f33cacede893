"""Helpers shared by the ``profwatch`` commands that talk to the coordinator (CLI layer: config, keys, calls).

Every failure ends the command with one line on stderr and an exit code of the one table in
``daemon/profwatch/exitcodes.py``: 2 for a bad config or key setup, 3 when the coordinator cannot be reached or refuses us,
1 when it answered but refused the request.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import click

from profwatch.exitcodes import EXIT_NOT_OK, EXIT_UNAVAILABLE, EXIT_USAGE

PING_TIMEOUT_S = 3.0
"""Bound of the first exchange of a command with the coordinator (``ping``). A coordinator that does not answer
a ping within it is reported at once instead of after the command's own, longer timeout; a port nothing listens
on is reported as soon as the connection is refused (milliseconds)."""

DEFAULT_CONFIG_PATH = Path("/etc/profwatch/profwatch.toml")
"""The config file every command reads when none is named (README "Configuration": precedence)."""

config_option = click.option(
    "--config", "config_path", type=click.Path(dir_okay=False, path_type=Path),
    help="TOML config file. Without it: profwatch --config FILE, then env PROFWATCH_CONFIG (empty: no file), then "
         "/etc/profwatch/profwatch.toml when it exists, then the built-in defaults; PROFWATCH_<SECTION>__<KEY> env "
         "vars override the file.",
)


def config_path_for(flag: Path | None, group_flag: Path | None, environ: Mapping[str, str],
                    default: Path = DEFAULT_CONFIG_PATH) -> Path | None:
    """The config file a command reads, first found of: the subcommand's ``--config``, the group's
    (``profwatch --config FILE status``), ``PROFWATCH_CONFIG`` (set but empty: no file, built-in defaults), the
    default file when it exists; None: built-in defaults only."""
    if flag is not None:
        return flag
    if group_flag is not None:
        return group_flag
    env = environ.get("PROFWATCH_CONFIG")
    if env is not None:
        return Path(env) if env.strip() else None
    return default if default.is_file() else None


def resolve_config_path(flag: Path | None) -> Path | None:
    """:func:`config_path_for` with the current click context's group option and ``os.environ``."""
    ctx = click.get_current_context(silent=True)
    group = ctx.find_root().params.get("config_path") if ctx is not None else None
    return config_path_for(flag, group, os.environ, DEFAULT_CONFIG_PATH)


def load_or_exit(config_path: Path | None) -> Any:
    """The settings tree from the config file :func:`resolve_config_path` picks for the subcommand's ``--config``
    (and the env); exit 2 with the reason when it is invalid."""
    from profwatch.config import ConfigError, load_settings

    try:
        return load_settings(resolve_config_path(config_path))
    except ConfigError as exc:
        click.echo(f"profwatch: {exc}", err=True)
        sys.exit(EXIT_USAGE)


def client_keys_or_exit(s: Any, endpoint: str) -> Any:
    """CURVE client keys for ``endpoint`` (None when it does not use CURVE); exit 2 with the fix when missing."""
    from profwatch.adapters.zmq.keyfiles import CurveSetupError, client_keys

    try:
        return client_keys(s.security, endpoint)
    except CurveSetupError as exc:
        click.echo(f"profwatch: {exc}", err=True)
        sys.exit(EXIT_USAGE)


def connectable_or_exit(key: str, endpoint: str) -> str:
    """``endpoint`` (``[coordinator] <key>``, where the coordinator listens) when the CLI can connect to it; exit 2
    with why and the fix when it cannot: a bind-only form such as ``tcp://*:7712`` or a port ZeroMQ picks at each
    start (``:*``, ``:0``), which ZeroMQ's connect refuses with ``Invalid argument`` (a traceback before)."""
    from profwatch.core.access import endpoint_problem

    problem = endpoint_problem(endpoint, bind=False)
    if problem:
        click.echo(f"profwatch: the CLI cannot connect to [coordinator] {key}: {problem}\n"
                   f"  the coordinator listens at {key} and the CLI connects there: write tcp://0.0.0.0:PORT rather "
                   "than tcp://*:PORT (it listens the same) with a fixed port, or pass this command a config "
                   f"(--config) whose {key} names the coordinator's host and port", err=True)
        sys.exit(EXIT_USAGE)
    return endpoint


def unavailable_hint() -> str:
    """Where the CLI looks for the coordinator and how to point it elsewhere (the second line of an exit 3)."""
    return ("  is the coordinator running there? The CLI finds it through [coordinator] control_bind (and pub_bind "
            "for --follow) of --config / PROFWATCH_CONFIG / /etc/profwatch/profwatch.toml; default tcp://127.0.0.1:7712.\n"
            "  start one with `profwatch coordinator --config FILE` (systemd: profwatch-coordinator.service); a demo's "
            "daemons answer with --config <its workdir>/run-*/profwatch.toml while it runs.")


class CoordinatorClient:
    """The coordinator as one command sees it: the first call is a short ``ping`` (fail fast), later calls use
    their own timeouts. ``call`` exits the command on failure (codes above) unless ``exit_on_unavailable`` is off,
    in which case :class:`~profwatch.adapters.zmq.control.ControlUnavailable` is raised to the caller."""

    def __init__(self, settings: Any) -> None:
        self.s = settings
        self.endpoint: str = connectable_or_exit("control_bind", settings.coordinator.control_bind)
        self._curve = client_keys_or_exit(settings, self.endpoint)
        self._pinged = False
        self.unavailable = ""  # why the last reachable() found it unavailable (the control call's message)
        self.refused = False  # ... and whether nothing listened there (connection refused: not running)

    def _raw(self, cmd: str, args: dict[str, Any] | None, timeout_s: float) -> Any:
        from profwatch.adapters.zmq.control import call

        if not self._pinged:
            call(self.endpoint, "ping", None, timeout_s=min(PING_TIMEOUT_S, timeout_s), curve=self._curve)
            self._pinged = True
        return call(self.endpoint, cmd, args, timeout_s=timeout_s, curve=self._curve)

    def reachable(self) -> bool:
        """True when the coordinator answers a ping; False when it is unavailable. Exits 3 when it refuses our
        key (an authentication failure is a setup problem, never "offline")."""
        from profwatch.adapters.zmq.control import ControlAuthFailed, ControlUnavailable, call

        try:
            call(self.endpoint, "ping", None, timeout_s=PING_TIMEOUT_S, curve=self._curve)
            self._pinged = True
            return True
        except ControlAuthFailed as exc:
            click.echo(f"profwatch: {exc.message}", err=True)
            sys.exit(EXIT_UNAVAILABLE)
        except ControlUnavailable as exc:
            self.unavailable, self.refused = exc.message, exc.refused
            return False

    def call(self, cmd: str, args: dict[str, Any] | None = None, timeout_s: float = 10.0, *,
             refused: str | None = None) -> Any:
        """Run ``cmd`` and return its result; on failure print one line (and the hint) and exit. ``refused``: how a
        refusal is said (default ``refused <cmd>``; a dry run says ``would refuse``)."""
        from profwatch.adapters.zmq.control import ControlAuthFailed, ControlError, ControlUnavailable

        try:
            return self._raw(cmd, args, timeout_s)
        except ControlAuthFailed as exc:
            click.echo(f"profwatch: {exc.message}", err=True)
            sys.exit(EXIT_UNAVAILABLE)
        except ControlUnavailable as exc:
            click.echo(f"profwatch: {exc.message}\n{unavailable_hint()}", err=True)
            sys.exit(EXIT_UNAVAILABLE)
        except ControlError as exc:
            click.echo(f"profwatch: coordinator {refused or f'refused {cmd}'}: [{exc.code}] {exc.message}", err=True)
            sys.exit(EXIT_NOT_OK)
