"""``profwatch keys init|add|install|list``: create, install and list the CURVE certificates of a deployment (CLI body).

Layout (``[security] keys_dir``, default ``/etc/profwatch/keys``), files as ``zmq.auth.create_certificates``
writes them::

    server.key  server.key_secret     the coordinator's certificate (init); copy server.key to every client
    clients/<name>.key                one public certificate per allowed client, metadata name + role (add)
    issued/<name>.key + .key_secret   the client's own pair (add): install the .key_secret on the client host as
                                      <keys_dir>/client.key_secret (mode 600), then delete it here

systemd: the units start without keys (a single-host install needs none); ``init`` (coordinator host) and ``install``
(a node or CLI host that received its ``.key_secret``) write the drop-in ``<unit>.d/50-profwatch-curve.conf`` that
hands the secret key to the service with ``LoadCredential=`` (systemd.exec(5), "Credentials") and points
``PROFWATCH_SECURITY__*_SECRET_KEY`` at the copy in ``%d``; ``systemctl daemon-reload`` then picks it up.

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

from profwatch.adapters.fs.whole_file import replace_whole
from profwatch.exitcodes import EXIT_USAGE


def _keys_dir(config_path: Path | None, keys_dir: Path | None) -> tuple[Path, Path]:
    """``(keys_dir, client_keys_dir)`` from ``--dir`` or the config's ``[security]``."""
    if keys_dir is not None:
        return keys_dir, keys_dir / "clients"
    from profwatch.commands.common import resolve_config_path
    from profwatch.config import ConfigError, load_settings

    try:
        s = load_settings(resolve_config_path(config_path))
    except ConfigError as exc:
        click.echo(f"profwatch keys: {exc}", err=True)
        sys.exit(EXIT_USAGE)
    return s.security.keys_dir, s.security.client_keys_path()


DROPIN_NAME = "50-profwatch-curve.conf"
SYSTEMD_DIR = Path("/etc/systemd/system")


def dropin_text(command: str, credential: str, secret: Path, env_var: str) -> str:
    """The drop-in that hands ``secret`` to a unit as credential ``credential`` (systemd.exec(5) ``LoadCredential=``,
    ``%d`` = the service's credentials directory) and names the copy in ``env_var``."""
    return (f"# written by `profwatch keys {command}`: the secret key stays root-only in {secret.parent}; systemd\n"
            f"# hands a copy to this service alone. Remove this file (and daemon-reload) to run without CURVE.\n"
            f"[Service]\nLoadCredential={credential}:{secret.resolve()}\nEnvironment={env_var}=%d/{credential}\n")


def write_dropin(systemd_dir: Path | None, unit: str, text: str) -> None:
    """Write ``<systemd_dir>/<unit>.d/50-profwatch-curve.conf`` (mode 644, replaced whole); say what to do when
    ``systemd_dir`` does not exist or cannot be written (then the text is printed instead). None: skip."""
    if systemd_dir is None:
        return
    if not systemd_dir.is_dir():
        click.echo(f"no {systemd_dir}: not writing the systemd drop-in for {unit} (--systemd-dir to choose)")
        return
    folder = systemd_dir / f"{unit}.d"
    target = folder / DROPIN_NAME
    try:
        folder.mkdir(exist_ok=True)
        replace_whole(target, text.encode("utf-8"), 0o644)
    except OSError as exc:
        click.echo(f"cannot write {target} ({exc.strerror}); put this there yourself:\n{text}", err=True)
        return
    click.echo(f"systemd: wrote {target}; run `systemctl daemon-reload` (then restart {unit})")


def _fail(msg: str) -> None:
    click.echo(f"profwatch keys: {msg}", err=True)
    sys.exit(EXIT_USAGE)


_options = [
    click.option("--config", "config_path", type=click.Path(dir_okay=False, path_type=Path),
                 help="TOML config file whose [security] keys_dir / client_keys_dir are used (default: as every "
                      "command: profwatch --config, PROFWATCH_CONFIG, /etc/profwatch/profwatch.toml)."),
    click.option("--dir", "keys_dir", type=click.Path(file_okay=False, path_type=Path),
                 help="Key directory (overrides the config's security.keys_dir)."),
]


def _with_options(f: Any) -> Any:
    for opt in reversed(_options):
        f = opt(f)
    return f


_systemd_options = [
    click.option("--systemd-dir", type=click.Path(file_okay=False, path_type=Path), default=SYSTEMD_DIR,
                 show_default=True, help="Where the unit's credential drop-in is written."),
    click.option("--no-systemd", is_flag=True, help="Do not write a systemd drop-in."),
]


def _with_systemd_options(f: Any) -> Any:
    for opt in reversed(_systemd_options):
        f = opt(f)
    return f


@click.group("keys")
def keys() -> None:
    """Create and list CURVE certificates (coordinator key, allowed node and CLI keys)."""


@keys.command("init")
@_with_options
@_with_systemd_options
def init(config_path: Path | None, keys_dir: Path | None, systemd_dir: Path, no_systemd: bool) -> None:
    """Create the coordinator's certificate and the empty client key directory; write the coordinator unit's
    credential drop-in."""
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
    write_dropin(None if no_systemd else systemd_dir, "profwatch-coordinator.service",
                 dropin_text("init", "server.key_secret", sec, "PROFWATCH_SECURITY__SERVER_SECRET_KEY"))


@keys.command("install")
@_with_options
@_with_systemd_options
@click.argument("secret", type=click.Path(dir_okay=False, exists=True, path_type=Path))
@click.option("--server-key", type=click.Path(dir_okay=False, exists=True, path_type=Path), required=True,
              help="The coordinator's public server.key, copied from the coordinator host.")
@click.option("--unit", default="profwatch-node.service", show_default=True,
              help="The unit whose drop-in hands it the key (a CLI-only host: --no-systemd).")
def install(config_path: Path | None, keys_dir: Path | None, systemd_dir: Path, no_systemd: bool, secret: Path,
            server_key: Path, unit: str) -> None:
    """On a node or CLI host: install SECRET (the .key_secret `keys add` issued for it) as
    <keys_dir>/client.key_secret (mode 600) and the coordinator's public key as <keys_dir>/server.key, then write
    the node unit's credential drop-in."""
    from profwatch.adapters.fs.bounded_read import read_capped
    from profwatch.adapters.zmq.keyfiles import MAX_KEY_FILE_BYTES, CurveSetupError, read_certificate

    kd, _clients = _keys_dir(config_path, keys_dir)
    try:
        public, sec_z85, meta = read_certificate(secret)
        if sec_z85 is None:
            raise CurveSetupError(f"{secret} has no secret-key: give the .key_secret file `keys add` issued")
        read_certificate(server_key)
        kd.mkdir(parents=True, exist_ok=True)
        for src, name, mode in ((secret, "client.key_secret", 0o600), (server_key, "server.key", 0o644)):
            replace_whole(kd / name, read_capped(src, MAX_KEY_FILE_BYTES, "key file"), mode)
    except (CurveSetupError, OSError, ValueError) as exc:  # ValueError: InputTooLarge
        _fail(str(exc))
        return
    name = meta.get("name", "?")
    click.echo(f"installed {kd / 'client.key_secret'} (key {name!r}, role {meta.get('role', '?')}) and "
               f"{kd / 'server.key'}")
    if meta.get("role") == "node":
        click.echo(f"this node must run with node.node_id = {name!r}")
    write_dropin(None if no_systemd else systemd_dir, unit,
                 dropin_text("install", "client.key_secret", kd / "client.key_secret",
                             "PROFWATCH_SECURITY__CLIENT_SECRET_KEY"))


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
        # appears whole: the coordinator reloads the directory when it changes
        replace_whole(target, pub.read_bytes(), 0o644)
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
