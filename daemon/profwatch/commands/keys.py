"""``profwatch keys init|add|list``: create and list the CURVE certificates of a deployment (CLI body).

Layout (``[security] keys_dir``, default ``/etc/profwatch/keys``), files as ``zmq.auth.create_certificates``
writes them::

    server.key  server.key_secret     the coordinator's certificate (init); copy server.key to every client
    clients/<name>.key                one public certificate per allowed client, metadata name + role (add)
    issued/<name>.key + .key_secret   the client's own pair (add): install the .key_secret on the client host as
                                      <keys_dir>/client.key_secret (mode 600), then delete it here

Roles: ``node`` (a node daemon; its name is its ``node.node_id``), ``read`` (status, events, captures,
telemetry, the event stream), ``act`` (read plus arm, set_thresholds, cancel).

Exit codes: 0 done; 2 usage or file errors (an existing key is never overwritten).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import click

from profwatch.exitcodes import EXIT_USAGE


def _keys_dir(config_path: Path | None, keys_dir: Path | None) -> tuple[Path, Path]:
    """``(keys_dir, client_keys_dir)`` from ``--dir`` or the config's ``[security]``."""
    if keys_dir is not None:
        return keys_dir, keys_dir / "clients"
    from profwatch.config import ConfigError, load_settings

    try:
        s = load_settings(config_path)
    except ConfigError as exc:
        click.echo(f"profwatch keys: {exc}", err=True)
        sys.exit(EXIT_USAGE)
    return s.security.keys_dir, s.security.client_keys_path()


def _fail(msg: str) -> None:
    click.echo(f"profwatch keys: {msg}", err=True)
    sys.exit(EXIT_USAGE)


_options = [
    click.option("--config", "config_path", type=click.Path(dir_okay=False, path_type=Path), envvar="PROFWATCH_CONFIG",
                 help="TOML config file whose [security] keys_dir / client_keys_dir are used."),
    click.option("--dir", "keys_dir", type=click.Path(file_okay=False, path_type=Path),
                 help="Key directory (overrides the config's security.keys_dir)."),
]


def _with_options(f: Any) -> Any:
    for opt in reversed(_options):
        f = opt(f)
    return f


@click.group("keys")
def keys() -> None:
    """Create and list CURVE certificates (coordinator key, allowed node and CLI keys)."""


@keys.command("init")
@_with_options
def init(config_path: Path | None, keys_dir: Path | None) -> None:
    """Create the coordinator's certificate and the empty client key directory."""
    from profwatch.adapters.zmq.keyfiles import CurveSetupError, create_certificate

    kd, clients = _keys_dir(config_path, keys_dir)
    try:
        kd.mkdir(parents=True, exist_ok=True)
        os.chmod(kd, 0o750)
        pub, sec = create_certificate(kd, "server", None)
        clients.mkdir(parents=True, exist_ok=True)
    except (CurveSetupError, OSError) as exc:
        _fail(str(exc))
        return
    click.echo(f"coordinator certificate: {sec} (secret, mode 600) and {pub} (public)")
    click.echo(f"allowed client keys go in {clients}/ (profwatch keys add NAME --role node|read|act)")
    click.echo(f"copy {pub} to every node and CLI host as <keys_dir>/server.key")


@keys.command("add")
@_with_options
@click.argument("name")
@click.option("--role", type=click.Choice(["node", "read", "act"]), required=True,
              help="node: a node daemon (NAME is its node_id); read: status/events/stream; act: read + arm, "
                   "set_thresholds, cancel.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path),
              help="Where the client's own certificate pair is written (default <keys_dir>/issued).")
def add(config_path: Path | None, keys_dir: Path | None, name: str, role: str, out_dir: Path | None) -> None:
    """Create a client certificate NAME with ROLE and allow it (its public key goes into the client directory)."""
    from profwatch.adapters.zmq.keyfiles import CurveSetupError, create_certificate

    kd, clients = _keys_dir(config_path, keys_dir)
    out = out_dir or kd / "issued"
    target = clients / f"{name}.key"
    if target.exists():
        _fail(f"{target} exists: a client named {name!r} is already allowed (remove its file to replace it)")
    try:
        out.mkdir(parents=True, exist_ok=True)
        os.chmod(out, 0o700)
        pub, sec = create_certificate(out, name, role)  # type: ignore[arg-type]
        clients.mkdir(parents=True, exist_ok=True)
        tmp = clients / f".{name}.key.tmp"
        tmp.write_bytes(pub.read_bytes())
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)  # appears whole: the coordinator reloads the directory when it changes
    except (CurveSetupError, OSError) as exc:
        _fail(str(exc))
        return
    click.echo(f"allowed {name!r} with role {role}: {target}")
    click.echo(f"install {sec} on the client host as <keys_dir>/client.key_secret (mode 600), together with "
               f"{kd / 'server.key'} as <keys_dir>/server.key; then delete {sec} here")
    if role == "node":
        click.echo(f"that node must run with node.node_id = {name!r}")


@keys.command("list")
@_with_options
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def list_keys(config_path: Path | None, keys_dir: Path | None, as_json: bool) -> None:
    """List the coordinator's certificate and every allowed client (name, role, public key)."""
    from profwatch.adapters.zmq.keyfiles import CurveSetupError, KeyRing, read_certificate

    kd, clients = _keys_dir(config_path, keys_dir)
    server: dict[str, Any] = {"path": str(kd / "server.key"), "public_key": None}
    try:
        server["public_key"] = read_certificate(kd / "server.key")[0].decode()
    except CurveSetupError as exc:
        server["problem"] = str(exc)
    try:
        ring = KeyRing(clients)
    except CurveSetupError as exc:
        _fail(str(exc))
        return
    rows = sorted((ring.by_name(n) for n in ring.names()), key=lambda k: k.name if k else "")
    entries = [{"name": k.name, "role": k.role, "public_key": k.public_z85.decode(), "path": str(k.path)}
               for k in rows if k is not None]
    if as_json:
        click.echo(json.dumps({"server": server, "clients": entries, "problems": ring.problems}, indent=2))
        return
    click.echo(f"server  {server['public_key'] or '-'}  {server['path']}" + (f"  ({server['problem']})"
                                                                            if "problem" in server else ""))
    for e in entries:
        click.echo(f"{e['role']:<6}  {e['public_key']}  {e['name']}  {e['path']}")
    for p in ring.problems:
        click.echo(f"ignored: {p}")
    if not entries:
        click.echo(f"no client keys in {clients}")
