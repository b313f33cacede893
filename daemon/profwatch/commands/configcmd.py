"""``profwatch config check`` and ``profwatch config show``: validate a config file before a restart, and print
the effective configuration with where each value comes from (CLI body).

``check`` validates what the daemons validate at start (TOML syntax, unknown keys, types, ranges and the
cross-key rules of ``daemon/profwatch/config.py``, all in one run: ``profwatch.config_passes.cross_key_lines``), then the path types: a path that names a file (the state db,
TLS and key files) must not be a directory, a folder setting must not be a file, and the files a daemon reads at
start (TLS certificates and keys, CA bundles, an authorization file) must exist; then what the coordinator refuses at
start (:func:`start_problems`): a ``state_db`` that is not profwatch's own db (a device, a FIFO, a file that is not
SQLite, a dangling symlink or a loop, another program's db) and an alert sink whose Authorization env var is unset
or empty or whose authorization file is empty. It does not try to bind the
sockets or the metrics port: the running daemon holds them. Exit 0 valid, 2 with each error and its key
(``daemon/profwatch/exitcodes.py``).

``show`` prints every key of the effective configuration as ``section.key = value  # source`` with source
``file`` (the TOML file), ``env PROFWATCH_...`` (an environment override) or ``default``; secrets are
printed as ``<redacted>``, by key (a key naming a secret, password, token, auth or credential) and by value (a
URL's userinfo, its secret-named query or fragment parameters, a webhook URL's secret path, a ``Bearer`` token):
:func:`redact`.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import click
from pydantic import AliasChoices, BaseModel

from profwatch.commands.common import config_option, resolve_config_path
from profwatch.exitcodes import EXIT_USAGE

#: Path settings that name a folder (the others name a file).
_DIR_KEYS = re.compile(r"(_dir|_dirs|_root|_roots)$")
#: File settings a daemon opens at start: when set, the file must exist.
_MUST_EXIST = re.compile(r"^(metrics_tls_cert|metrics_tls_key|metrics_client_ca|ca_file|cert_file|key_file|"
                         r"authorization_file)$")
_SECRET_WORDS = r"secret|password|passwd|pwd|passphrase|token|auth|credential|api_?key|access_?key|private_?key|session|cookie"
#: A key naming a secret (by its last part); a ``*_key``/``*_file``/``*_env`` setting names where the secret is
#: (a path, an env var name), not the secret, and is shown.
_SECRET_KEY = re.compile(rf"({_SECRET_WORDS})(?!.*(_key|_file|_env|_dir)$)", re.IGNORECASE)
#: A URL's userinfo (``scheme://user:pass@host``, ``//user@host``): everything up to the last ``@`` before the path
#: (a password may hold an ``@``).
_URL_CREDENTIALS = re.compile(r"(?P<scheme>(?:[a-z][a-z0-9+.-]*:)?//)[^/?#\s]*@", re.IGNORECASE)
#: A query, matrix or fragment parameter whose name says secret (``?token=``, ``#access_token=``, ``&auth=``,
#: ``X-Amz-Credential``, ``X-Amz-Signature``, ``sig``, ``key``, ``code``, ``?pwd=``, ``?password=``, and the
#: bare names ``pass`` / ``pw``).
_URL_SECRET_PARAM = re.compile(rf"(?P<name>[?&;#](?:[\w.-]*(?:{_SECRET_WORDS}|key|sig|signature|code)[\w.-]*"
                               r"|pass|pw)=)"
                               r"[^&;#\s]*", re.IGNORECASE)
#: Webhook URLs whose path is the secret: Slack (``hooks.slack.com/services/T../B../X..``, ``/workflows/``),
#: Discord (``/api/webhooks/<id>/<token>``), Mattermost and the like (``/hooks/<key>``), Microsoft Teams
#: (``outlook.office.com/webhook/<ids>``, ``<tenant>.webhook.office.com/webhookb2/<ids>``,
#: ``outlook.office365.com/webhook/``) and Telegram (``api.telegram.org/bot<id>:<token>/sendMessage``: the
#: rest of the path after ``/bot`` is hidden).
_URL_SECRET_PATH = re.compile(r"(?P<keep>(?:hooks\.slack\.com/(?:services|workflows|triggers)|/api/webhooks|"
                              r"/hooks|\.office(?:365)?\.com/webhook(?:b2)?)/|/bot(?=\d+:))[^?#\s\"']+",
                              re.IGNORECASE)
#: An HTTP credential written out (``Bearer abc``, ``Basic dXNlcjpwYXNz``, ``token abc``).
_AUTH_SCHEME = re.compile(r"(?P<scheme>\b(?:bearer|basic|token|digest)\s+)[A-Za-z0-9._~+/=:-]{8,}", re.IGNORECASE)
REDACTED = "<redacted>"


def leaves(model: BaseModel, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """``(dotted key, value)`` of every setting of ``model``, nested models walked (``arming.targeting.enabled``)."""
    for name in type(model).model_fields:
        value = getattr(model, name)
        key = f"{prefix}{name}"
        if isinstance(value, BaseModel):
            yield from leaves(value, key + ".")
        else:
            yield key, value


def _file_keys(data: Mapping[str, Any], prefix: str = "") -> set[str]:
    out: set[str] = set()
    for k, v in data.items():
        key = f"{prefix}{k}"
        out.add(key)
        if isinstance(v, Mapping):
            out |= _file_keys(v, key + ".")
    return out


def former_names(model: type[BaseModel], prefix: str = "") -> dict[str, str]:
    """Dotted former name -> dotted key, for a setting renamed that still reads its old name (a pydantic
    ``AliasChoices`` validation alias: ``capture.active`` -> ``capture.manual_active``)."""
    out: dict[str, str] = {}
    for name, field in model.model_fields.items():
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            out.update(former_names(ann, f"{prefix}{name}."))
        elif isinstance(field.validation_alias, AliasChoices):
            out.update({f"{prefix}{c}": f"{prefix}{name}" for c in field.validation_alias.choices
                        if isinstance(c, str) and c != name})
    return out


def source_of(key: str, file_keys: set[str], environ: Mapping[str, str], formerly: Iterable[str] = ()) -> str:
    """Where ``key``'s effective value comes from: ``env NAME`` (pydantic-settings: env wins over the file),
    ``file`` or ``default``. An env override of a whole table (``PROFWATCH_ARMING``, JSON) counts for its keys;
    ``formerly``: the key's former dotted names (:func:`former_names`), whose variables are still read."""
    upper = {k.upper(): k for k in environ}
    for dotted in (key, *formerly):
        parts = dotted.split(".")
        for n in range(len(parts), 0, -1):
            name = "PROFWATCH_" + "__".join(parts[:n]).upper()
            if name in upper:
                return f"env {upper[name]}"
    return "file" if key in file_keys else "default"


def redact(key: str, value: Any) -> Any:
    """``value`` for printing, redacted by key and by value: :data:`REDACTED` for a key naming a secret
    (``password``, ``token``, ``auth``, ``credential``, ``api_key``...; not ``*_key``/``*_file``/``*_env``, which name
    where a secret is); in any string (list items and mapping values too): a URL's userinfo, its secret-named query,
    matrix or fragment parameters (``?token=``, ``#access_token=``, ``auth=``, ``X-Amz-Credential=``,
    ``X-Amz-Signature=``), a webhook URL's secret path (Slack ``/services/...``, Discord ``/api/webhooks/...``,
    ``/hooks/...``, Teams ``.office.com/webhook/...``, Telegram ``/bot<token>/...``) and a written-out HTTP credential (``Bearer ...``)."""
    if value is None or value == "":
        return value
    if _SECRET_KEY.search(key.rsplit(".", 1)[-1]):
        return REDACTED
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, list | tuple):
        return type(value)(redact(key, v) for v in value)
    if isinstance(value, Mapping):
        return {k: redact(f"{key}.{k}", v) for k, v in value.items()}
    return value


def redact_text(text: str) -> str:
    """``text`` with every secret-looking part (see :func:`redact`) replaced by :data:`REDACTED`."""
    text = _URL_CREDENTIALS.sub(lambda m: f"{m.group('scheme')}{REDACTED}@", text)
    text = _URL_SECRET_PARAM.sub(lambda m: f"{m.group('name')}{REDACTED}", text)
    text = _URL_SECRET_PATH.sub(lambda m: f"{m.group('keep')}{REDACTED}", text)
    return _AUTH_SCHEME.sub(lambda m: f"{m.group('scheme')}{REDACTED}", text)


def path_keys(model: type[BaseModel], prefix: str = "") -> set[str]:
    """The dotted keys of ``model`` whose type is a path (or a list of paths)."""
    out: set[str] = set()
    for name, field in model.model_fields.items():
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            out |= path_keys(ann, f"{prefix}{name}.")
        elif "Path" in str(ann):
            out.add(f"{prefix}{name}")
    return out


def path_problems(items: Iterator[tuple[str, Any]] | list[tuple[str, Any]]) -> list[str]:
    """``"key: why"`` for each path setting of ``items`` (``(dotted key, value)``: a loaded tree's
    :func:`leaves`, or a file's raw path values) of the wrong type on this host (see the module docstring); no
    I/O beyond ``stat``."""
    out: list[str] = []
    for key, value in items:
        name = key.rsplit(".", 1)[-1]
        paths = value if isinstance(value, list | tuple) else [value]
        for p in paths:
            if isinstance(p, str) and p:
                p = Path(p)
            if not isinstance(p, Path):
                continue
            if _DIR_KEYS.search(name):
                if p.exists() and not p.is_dir():
                    out.append(f"{key}: {p} is not a folder")
            elif p.is_dir():
                out.append(f"{key}: {p} is a folder, a file is expected")
            elif _MUST_EXIST.match(name) and not p.is_file():
                out.append(f"{key}: {p} does not exist (the daemon reads it at start)")
    return out


def _toml(path: Path) -> dict[str, Any]:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    from profwatch.adapters.fs.bounded_read import read_capped
    from profwatch.config import MAX_CONFIG_BYTES

    return tomllib.loads(read_capped(path, MAX_CONFIG_BYTES, "config file").decode("utf-8"))


def check_errors(path: Path | None) -> tuple[list[str], Any]:
    """Every error of the configuration ``path`` (None: defaults and env) as ``"key: why"`` lines, and the
    settings when it loads (None otherwise)."""
    from profwatch.config import ConfigError, Settings, load_settings

    raw: dict[str, Any] = {}
    if path is not None:
        if not path.is_file():
            return [f"{path}: does not exist or is not a file"], None
        from profwatch.adapters.fs.bounded_read import InputTooLarge

        try:
            raw = _toml(path)
        except InputTooLarge as exc:
            return [f"{path}: cannot be read: {exc}"], None
        except (OSError, UnicodeDecodeError) as exc:
            return [f"{path}: cannot be read: {exc}"], None
        except ValueError as exc:  # tomllib.TOMLDecodeError: says the line and column
            return [f"{path}: TOML syntax: {exc}"], None
    try:
        settings = load_settings(path)
    except ConfigError as exc:
        text = str(exc)
        lines = [ln.strip() for ln in text.splitlines()[1:]] if text.startswith("invalid configuration:") else [text]
        # the file's own path values are checked too, so one run lists every error
        wanted = path_keys(Settings)
        flat = [(k, v) for k, v in _flat(raw) if k in wanted]
        return [ln for ln in lines if ln] + path_problems(flat), None
    errors = path_problems(leaves(settings))
    return errors + start_problems(settings, errors), settings


def start_problems(settings: Any, known: list[str]) -> list[str]:
    """``"key: why"`` for what the coordinator refuses at start beyond path types: CURVE binds without a usable
    server key (:func:`_curve_problems`); a ``state_db`` that is not
    profwatch's own (``state_open.check_own``: a device, a FIFO, a non-SQLite file, a dangling symlink or loop,
    another program's db) and an alert sink's Authorization that cannot be read (``http_post.read_authorization``:
    env var unset or empty, file empty or unreadable); a ``work_dir`` that cannot be created (a file on its way:
    ``coordinator.work_dir_problem``). Keys already in ``known`` are not checked twice. Reads the db's 100-byte
    header (read-only) and the Authorization file or env var; writes nothing."""
    from profwatch.adapters.outputs.http_post import SinkConfigError, read_authorization
    from profwatch.adapters.store.state_open import StateFileRefused, check_own

    out: list[str] = []
    if not any(k.startswith("coordinator.state_db:") for k in known) and str(settings.coordinator.state_db) != ":memory:":
        try:
            check_own(Path(settings.coordinator.state_db))
        except StateFileRefused as exc:
            out.append(f"coordinator.state_db: {exc}")
    if not any(k.startswith("coordinator.work_dir:") for k in known):
        from profwatch.coordinator import work_dir_problem

        why = work_dir_problem(Path(settings.coordinator.work_dir))
        if why is not None:
            out.append(f"coordinator.work_dir: {why}")
    out += _curve_problems(settings)
    for section in ("alertmanager", "webhook"):
        sink = getattr(settings, section)
        if not sink.url:
            continue
        key = "authorization_file" if sink.authorization_file is not None else "authorization_env"
        if any(k.startswith(f"{section}.{key}:") for k in known):
            continue
        try:
            read_authorization(sink, os.environ, section)
        except SinkConfigError as exc:
            out.append(f"{section}.{key}: {exc}")
    return out


def _curve_problems(settings: Any) -> list[str]:
    """What the coordinator refuses at start when its binds need CURVE (beyond loopback, ``security.curve`` not
    off): the server secret key missing or unreadable, libzmq without CURVE (``ServerSockets``, the same loads).
    Reads the key file; writes nothing. Names the binds that need it and the two ways out."""
    from profwatch.adapters.zmq.keyfiles import CurveSetupError
    from profwatch.adapters.zmq.server_sockets import load_server_keypair

    sec = settings.security
    need = [f"coordinator.{name}_bind" for name, ep in settings.coordinator.binds().items() if sec.curve_for(ep)]
    if not need:
        return []
    try:
        load_server_keypair(sec)
    except CurveSetupError as exc:
        return [f"{', '.join(need)}: beyond loopback these use CURVE (security.curve = {sec.curve!r}) and the "
                f"coordinator would refuse to start: {exc}; or bind 127.0.0.1"]
    return []


def _flat(data: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for k, v in data.items():
        if isinstance(v, Mapping):
            yield from _flat(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}", v


@click.group("config")
def config() -> None:
    """Validate a config file (check) or print the effective configuration with its sources (show)."""


@config.command("check")
@config_option
def check(config_path: Path | None) -> None:
    """Validate the configuration a daemon would load: TOML syntax, unknown keys, types, ranges, cross-key rules
    and path types (not whether the ports can be bound). Exit 0 when valid, 2 with each error and its key."""
    path = resolve_config_path(config_path)
    where = str(path) if path is not None else "built-in defaults (no config file)"
    errors, _settings = check_errors(path)
    overrides = sorted(k for k in os.environ if k.upper().startswith("PROFWATCH_") and "__" in k)
    env = f" with env overrides {', '.join(overrides)}" if overrides else ""
    if errors:
        click.echo(f"profwatch config check: {where}{env}: {len(errors)} error(s)", err=True)
        for e in errors:
            click.echo(f"  {e}", err=True)
        sys.exit(EXIT_USAGE)
    click.echo(f"profwatch config check: {where}{env}: valid")


def _toml_value(key: str, value: object) -> str:
    """One value as ``config show`` prints it: JSON text (valid TOML for our types), file modes in octal
    (``socket_mode = 0o660``, TOML 1.0's octal integer, as a mode is written) rather than decimal 432."""
    if key.endswith("_mode") and isinstance(value, int) and not isinstance(value, bool):
        return f"0o{value:o}"
    return json.dumps(value, default=str)


@config.command("show")
@config_option
@click.option("--json", "as_json", is_flag=True, help="a JSON object: key -> {value, source}")
def show(config_path: Path | None, as_json: bool) -> None:
    """Print the effective configuration, one ``section.key = value  # source`` line per setting (source: file,
    env PROFWATCH_..., default); secrets are redacted. Exit 2 when the configuration is invalid (as check)."""
    path = resolve_config_path(config_path)
    errors, settings = check_errors(path)
    if settings is None:
        click.echo(f"profwatch config show: {path}: invalid; run `profwatch config check`:", err=True)
        for e in errors:
            click.echo(f"  {e}", err=True)
        sys.exit(EXIT_USAGE)
    from profwatch.config import Settings

    renamed = former_names(Settings)
    file_keys = {renamed.get(k, k) for k in _file_keys(_toml(path))} if path is not None else set()
    formerly: dict[str, list[str]] = {}
    for old_name, new_name in renamed.items():
        formerly.setdefault(new_name, []).append(old_name)
    rows = {key: {"value": redact(key, value),
                  "source": source_of(key, file_keys, os.environ, formerly.get(key, ()))}
            for key, value in leaves(settings)}
    if as_json:
        click.echo(json.dumps(rows, indent=2, default=str))
        return
    click.echo(f"# effective configuration: {path if path is not None else 'no config file'}")
    for key, row in rows.items():
        click.echo(f"{key} = {_toml_value(key, row['value'])}  # {row['source']}")
    for e in errors:  # path problems do not stop show; check reports them as errors
        click.echo(f"# warning: {e}", err=True)
