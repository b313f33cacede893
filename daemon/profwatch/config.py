"""The one validated configuration tree (pydantic-settings): a TOML file plus ``PROFWATCH_*`` env overrides.

Loaded once in ``daemon/profwatch/cli.py`` and passed down. Env overrides use ``__`` between levels, e.g.
``PROFWATCH_COORDINATOR__CONTROL_BIND=tcp://127.0.0.1:9712``. Unknown keys are errors (``extra="forbid"``).
Each feature's own settings model lives next to its logic, in a module importable without that logic's heavy
dependencies (``daemon/profwatch/core/<concern>/settings.py`` for detection, batches, alerts, arming and verdict;
``profwatch.core.capture.planner.CaptureSettings``, ``profwatch.core.changes.reference.ReferenceSettings``,
``profwatch.core.fleet.limits.LimitSettings``, ``profwatch.core.access.SecuritySettings``,
``profwatch.core.verdict.msprof_plan.MsprofSettings``), and is composed here: importing
this module (every ``profwatch`` command does) must not import numpy, pandas or the analysis stack
(``tests/unit/test_import_weight.py``). ``systemd/profwatch.toml`` is the annotated example; docs/configuration.md, generated from these models by
``python -m profwatch.config_doc --write``, is the reference of every key (each key's ``Field(description=...)``).
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict, TomlConfigSettingsSource

from profwatch.core.access import SecuritySettings, endpoint_problem, exposure_problems, is_loopback_endpoint
from profwatch.core.alerts.settings import AlertmanagerSettings, WebhookSettings
from profwatch.core.arming.settings import ArmingSettings
from profwatch.core.batches.settings import WatchSettings
from profwatch.core.capture.planner import CaptureSettings
from profwatch.core.changes.reference import ReferenceSettings
from profwatch.core.detection.settings import DetectionSettings
from profwatch.core.fleet.limits import LimitSettings
from profwatch.core.keyed_error import KeysError
from profwatch.core.verdict.settings import AnalysisSettings

DEFAULT_RUNTIME_DIR = "/run/profwatch"
DEFAULT_STATE_DIR = "/var/lib/profwatch"


class ConfigError(ValueError):
    """The configuration file or environment is invalid (message says which key and why)."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class MetricsEndpoint(_Strict):
    """The daemon's Prometheus ``/metrics`` endpoint (off while ``metrics_port`` is unset).

    ``metrics_addr`` defaults to loopback. Beyond loopback the endpoint is served over TLS
    (``metrics_tls_cert`` + ``metrics_tls_key``, PEM; with ``metrics_client_ca`` a scraper must present a client
    certificate signed by it: prometheus-client's ``start_http_server`` TLS options), or in plain HTTP only with
    ``metrics_insecure = true``, warned at every start (docs/security.md, "Metrics" says what they expose).
    """

    metrics_port: int | None = Field(None, ge=1, le=65535, description=(
        "port of the daemon's Prometheus /metrics endpoint; unset: no endpoint"))
    metrics_addr: str = Field("127.0.0.1", min_length=1, description="address the /metrics endpoint binds")
    metrics_tls_cert: Path | None = Field(None, description=(
        "PEM certificate of the /metrics endpoint (with metrics_tls_key: served over TLS)"))
    metrics_tls_key: Path | None = Field(None, description="PEM private key of metrics_tls_cert")
    metrics_client_ca: Path | None = Field(None, description="PEM CA a scraper's client certificate must chain to")
    metrics_insecure: bool = Field(False, description="serve /metrics beyond loopback without TLS (warned)")
    health_port: int | None = Field(None, ge=1, le=65535, description="with metrics off (no metrics_port): serve "
                                    "/healthz and /readyz alone on this port (with metrics on they are beside "
                                    "/metrics)")
    health_addr: str = Field("127.0.0.1", min_length=1, description="address the health_port endpoint binds; "
                             "beyond loopback the metrics_tls_* / metrics_insecure rules apply. Only with "
                             "health_port: set with metrics_port (the probes are then on metrics_addr) or without "
                             "health_port it is refused, never silently unused")

    def http_port(self) -> int | None:
        """The port of the daemon's HTTP endpoint: ``metrics_port`` (/metrics, /healthz, /readyz), else
        ``health_port`` (/healthz, /readyz), else None (no endpoint)."""
        return self.metrics_port if self.metrics_port is not None else self.health_port

    def http_addr(self) -> str:
        return self.metrics_addr if self.metrics_port is not None else self.health_addr

    @model_validator(mode="after")
    def _metrics_exposure(self) -> MetricsEndpoint:
        if self.health_port is not None and self.metrics_port is not None:
            raise KeysError(("health_port", "metrics_port"), "health_port is for a daemon without metrics: with "
                            "metrics_port set, /healthz and /readyz are served there; unset health_port")
        if "health_addr" in self.model_fields_set and self.health_port is None:
            why = ("with metrics_port set, /healthz and /readyz are served on metrics_addr" if self.metrics_port
                   is not None else "no health_port is set, so nothing binds it")
            raise KeysError(("health_addr", "metrics_port" if self.metrics_port is not None else "health_port"),
                            f"health_addr is used only with health_port (metrics off): {why}; unset health_addr")
        if (self.metrics_tls_cert is None) != (self.metrics_tls_key is None):
            raise KeysError(("metrics_tls_cert", "metrics_tls_key"), "metrics_tls_cert and metrics_tls_key go together")
        if self.metrics_client_ca is not None and self.metrics_tls_cert is None:
            raise KeysError(("metrics_client_ca", "metrics_tls_cert"), "metrics_client_ca needs metrics_tls_cert and "
                            "metrics_tls_key (client certificates are checked over TLS only)")
        if (self.http_port() is not None and not self.metrics_loopback() and self.metrics_tls_cert is None
                and not self.metrics_insecure):
            which = "metrics_addr" if self.metrics_port is not None else "health_addr"
            raise KeysError((which, "metrics_tls_cert", "metrics_insecure"), f"{which} {self.http_addr()!r} is beyond loopback: set metrics_tls_cert and "
                             "metrics_tls_key (and metrics_client_ca to require client certificates), or "
                             "metrics_insecure = true on a trusted network")
        return self

    def metrics_loopback(self) -> bool:
        """True when the HTTP endpoint in use (metrics, else health) binds a loopback address."""
        return is_loopback_endpoint(f"tcp://{self.http_addr()}:1")

    def metrics_plain_beyond_loopback(self) -> bool:
        """True when the HTTP endpoint is served in plain HTTP beyond loopback (``metrics_insecure``; warned)."""
        return self.http_port() is not None and not self.metrics_loopback() and self.metrics_tls_cert is None


def _checked_endpoint(v: str, bind: bool) -> str:
    """``v`` unchanged; ValueError with :func:`~profwatch.core.access.endpoint_problem`'s words when it is malformed
    (to bind when ``bind``, to connect to otherwise): the one check every endpoint field's validator runs."""
    problem = endpoint_problem(v, bind=bind)
    if problem:
        raise ValueError(problem)
    return v


class NodeSettings(MetricsEndpoint):
    """Node daemon (one per host)."""

    node_id: str = Field(default_factory=socket.gethostname, description="stable id of this node (default hostname)",
                         json_schema_extra={"default_doc": "the hostname"})
    runtime_dir: Path = Field(Path(DEFAULT_RUNTIME_DIR), description=(
        "systemd RuntimeDirectory; ranks connect to ipc://<runtime_dir>/node.sock unless bind is set"))
    bind: str | None = Field(None, description="rank endpoint; default ipc://<runtime_dir>/node.sock")
    socket_mode: int = Field(0o660, ge=0, le=0o777,
                             description="mode of the ipc socket file: owner and socket_group may connect")
    socket_group: str | None = Field(
        None, description="group of the ipc socket file (e.g. 'profwatch', which training users join); "
                          "None keeps the daemon's group")
    coordinator: str = Field("tcp://127.0.0.1:7711", description=(
        "the coordinator's ingest endpoint this node relays to (its [coordinator] ingest_bind: move both together)"))
    heartbeat_interval_s: float = Field(2.0, gt=0, le=3600, description=(
        "how often the node tells the coordinator it is alive (coordinator_unanswered once 3 of these or 10 s, the "
        "longer, go unanswered); each heartbeat carries the host's CPU load: above 20 s too few arrive to explain a "
        "job's move by host load ([arming] host_load_explains), and status says so"))
    batch_max_messages: int = Field(1000, ge=1, le=10_000, description=(
        "relay a batch to the coordinator when this many rank messages are waiting"))
    batch_max_delay_s: float = Field(0.05, gt=0, le=10, description=(
        "relay a batch when its oldest rank message has waited this long"))
    batch_max_bytes: int = Field(1024 * 1024, ge=64 * 1024, le=2 * 1024 * 1024,
                                 description="relay a batch before its bytes reach this")
    relay_hwm: int = Field(1000, ge=1, le=1_000_000, description="batches queued while the coordinator is unreachable")
    allowed_config_roots: list[Path] = Field(default_factory=list, description="folders this node may write configs in")
    dp_log_poll_s: float = Field(1.0, gt=0, le=3600, description=(
        "how often torch_npu's <config>/log/dp_*.log files are read (arm acknowledgements)"))
    stale_check_interval_s: float = Field(30.0, gt=0, le=86400, description="how often the node looks for stale "
                                          "torch_npu state (leftover shm segment, orphaned monitor)")
    shm_dir: Path = Field(Path("/dev/shm"), description="where torch_npu's DynamicProfileNpuShm* segments live")
    proc_dir: Path = Field(Path("/proc"), description="process table read to find orphaned DynMonitorProc monitors")

    def rank_endpoint(self) -> str:
        return self.bind or f"ipc://{self.runtime_dir}/node.sock"

    @field_validator("coordinator")
    @classmethod
    def _coordinator_endpoint(cls, v: str) -> str:
        """Refuse a malformed endpoint to connect to (:func:`~profwatch.core.access.endpoint_problem`)."""
        return _checked_endpoint(v, bind=False)

    @field_validator("bind")
    @classmethod
    def _rank_bind(cls, v: str | None) -> str | None:
        """Refuse a malformed endpoint to bind for the ranks (:func:`~profwatch.core.access.endpoint_problem`)."""
        return None if v is None else _checked_endpoint(v, bind=True)


_WILDCARDS = frozenset({"*", "0.0.0.0", "[::]", "::"})


class CoordinatorSettings(MetricsEndpoint):
    """Coordinator daemon (one per cluster or per job group)."""

    ingest_bind: str = Field("tcp://127.0.0.1:7711", description="node daemons connect here")
    control_bind: str = Field("tcp://127.0.0.1:7712", description=(
        "control socket: profwatch status, arm, cancel, alerts talk here"))
    pub_bind: str = Field("tcp://127.0.0.1:7713", description=(
        "event and alert stream (ZeroMQ PUB, topics profwatch.<kind>.<job_id>)"))
    state_db: Path = Field(Path(DEFAULT_STATE_DIR) / "state.db", description=(
        "SQLite state (jobs, ranks, captures, batches, events): survives restarts"))
    work_dir: Path = Field(Path(DEFAULT_STATE_DIR) / "work", description=(
        "staging folders, msprof-analyze outputs and reports"))
    window_steps: int = Field(1000, ge=10, le=100_000, description=(
        "per-rank step-time window kept in memory (8 bytes per step and rank, 20 with the hook's CPU samples; what "
        "profwatch telemetry dumps)"))
    node_timeout_s: float = Field(10.0, gt=0, le=86400, description=(
        "a node not heard from this long is shown down by status and the metrics"))
    tick_interval_s: float = Field(0.2, gt=0, le=10, description=(
        "period of the coordinator's tick: detectors' time-based checks, capture deadlines, job ends, alert re-sends"))
    registry_flush_s: float = Field(2.0, gt=0, le=3600, description="the registry rows whose identity changed (hello, "
                                    "bye, node) are stored this often")
    registry_full_flush_s: float = Field(
        60.0, gt=0, le=3600, description="every rank's per-step fields (last step, step time, last heard) are "
                                         "stored this often and on shutdown; a crash loses at most this much of them")
    allowed_prof_roots: list[Path] = Field(default_factory=list, description="where rank dirs may be read")
    allowed_config_roots: list[Path] = Field(default_factory=list, description="where the coordinator may write configs")
    config_writer: Literal["coordinator", "node"] = Field(
        "coordinator", description="who writes profiler_config.json: the coordinator (shared storage) or each node"
    )
    event_source: str = Field(default_factory=lambda: f"//profwatch/{socket.gethostname()}", description=(
        "CloudEvents source of every event (default //profwatch/<hostname>)"),
        json_schema_extra={"default_doc": "\"//profwatch/<hostname>\""})
    analysis_workers: int = Field(1, ge=1, le=8, description=(
        "batches analysed at once (threads; the enrich phase runs one capture at a time apart from them)"))
    ack_timeout_s: float = Field(60.0, gt=0, le=86400,
                                 description="arms not acknowledged by every rank by then are reported (at least "
                                             "3 x step time + torch_npu's poll interval)")
    job_end_after_s: float = Field(600.0, gt=0, le=30 * 86400,
                                   description="a job none of whose ranks reported this long has ended (job_ended "
                                               "event; its alerts resolve; its captures whose window has not started "
                                               "are cancelled); a job every rank of which said bye ends at once")
    job_startup_allowance_s: float = Field(1800.0, ge=0, le=30 * 86400,
                                           description="a job that has not reported its first step yet (model "
                                                       "loading, compilation) ends only after job_end_after_s plus "
                                                       "this much silence since its hello")

    def binds(self) -> dict[str, str]:
        """The three listening endpoints by socket name (``ingest``, ``control``, ``pub``)."""
        return {"ingest": self.ingest_bind, "control": self.control_bind, "pub": self.pub_bind}

    @field_validator("ingest_bind", "control_bind", "pub_bind")
    @classmethod
    def _bind_endpoint(cls, v: str) -> str:
        """Refuse a malformed endpoint to bind (:func:`~profwatch.core.access.endpoint_problem`)."""
        return _checked_endpoint(v, bind=True)

    @model_validator(mode="after")
    def _distinct_binds(self) -> CoordinatorSettings:
        """Refuse two listening sockets on one endpoint (the same ipc path, or one TCP port where the hosts are
        equal or either is a wildcard): the second bind would fail or, for ipc, silently take the first's path.
        Port ``0`` or ``*`` (ZeroMQ picks a free one) and ``ipc://*`` never clash."""
        seen: dict[tuple[str, str], tuple[str, str]] = {}
        for name, ep in self.binds().items():
            scheme, _, rest = ep.strip().partition("://")
            host, _, port = rest.rpartition(":") if scheme == "tcp" else ("", "", rest)
            if port in ("0", "*"):  # an ephemeral port (tcp) or a generated name (ipc): never another's
                continue
            key = (scheme, port)
            other = seen.get(key)
            if other is not None and (scheme != "tcp" or host == other[1] or {host, other[1]} & _WILDCARDS):
                raise KeysError((f"{name}_bind", f"{other[0]}_bind"), f"coordinator.{name}_bind {ep} is the endpoint "
                                f"of coordinator.{other[0]}_bind: each socket needs its own")
            seen.setdefault(key, (name, host))
        return self


class LoggingSettings(_Strict):
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field("INFO", description="lowest log level written")
    format: Literal["json", "console"] = Field("json", description=(
        "json (journald-friendly lines) or console (for a terminal)"))


class Settings(BaseSettings):
    """Root of the configuration tree (TOML file sections have the same names)."""

    model_config = SettingsConfigDict(env_prefix="PROFWATCH_", env_nested_delimiter="__", extra="forbid",
                                      allow_inf_nan=False)

    node: NodeSettings = Field(default_factory=NodeSettings)
    coordinator: CoordinatorSettings = Field(default_factory=CoordinatorSettings)
    detection: DetectionSettings = Field(default_factory=DetectionSettings)
    arming: ArmingSettings = Field(default_factory=ArmingSettings)
    reference: ReferenceSettings = Field(default_factory=ReferenceSettings)
    capture: CaptureSettings = Field(default_factory=CaptureSettings)
    watch: WatchSettings = Field(default_factory=WatchSettings)
    analysis: AnalysisSettings = Field(default_factory=AnalysisSettings)
    alertmanager: AlertmanagerSettings = Field(default_factory=AlertmanagerSettings)
    webhook: WebhookSettings = Field(default_factory=WebhookSettings)
    logging: LoggingSettings = Field(default_factory=LoggingSettings)
    security: SecuritySettings = Field(default_factory=SecuritySettings)
    limits: LimitSettings = Field(default_factory=LimitSettings)

    @model_validator(mode="before")
    @classmethod
    def _no_empty_paths(cls, data: Any) -> Any:
        """Refuse a path setting given as an empty string (``state_db = ""``): pydantic reads it as ``.``, the
        current folder, which the daemon would then use (or report as "a folder") instead of saying the key is
        empty."""
        empty = _empty_paths(cls, data) if isinstance(data, dict) else []
        if empty:
            raise KeysError(empty, "is empty: give a path (or leave the key out for its default)")
        return data

    @model_validator(mode="after")
    def _no_open_sockets(self) -> Settings:
        """Refuse a socket reachable beyond loopback without CURVE (unless ``security.insecure``)."""
        eps = {f"coordinator.{k}_bind": v for k, v in self.coordinator.binds().items()}
        eps["node.coordinator"] = self.node.coordinator
        eps["node.bind"] = self.node.rank_endpoint()
        problems = exposure_problems(eps, self.security)
        if problems:
            keys = [k for k in eps if any(p.startswith(f"{k}=") for p in problems)]
            raise KeysError(keys + ["security.curve", "security.insecure"], "; ".join(problems))
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        toml = _TOML_PATH.get("path")
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        if toml is not None:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=toml))
        return tuple(sources)


_TOML_PATH: dict[str, Path | None] = {"path": None}


def _empty_paths(model: type[BaseModel], data: dict[str, Any], prefix: str = "") -> list[str]:
    """Dotted keys of ``data`` (raw input of ``model``) whose field is a path (or a list of paths) and whose value
    is an empty or blank string."""
    out: list[str] = []
    for name, field in model.model_fields.items():
        if name not in data:
            continue
        value, ann = data[name], field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            if isinstance(value, dict):
                out += _empty_paths(ann, value, f"{prefix}{name}.")
        elif "Path" in str(ann):
            values = value if isinstance(value, list | tuple) else [value]
            if any(isinstance(v, str) and not v.strip() for v in values):
                out.append(f"{prefix}{name}")
    return out


MAX_CONFIG_BYTES = 1024 * 1024
"""Largest config file read (a full profwatch.toml is a few KiB): larger is a clear ``ConfigError``, never read."""


def unknown_env_sections(environ: Mapping[str, str]) -> list[str]:
    """``"NAME: why"`` for each env override (``PROFWATCH_<SECTION>__<KEY>``, any case, as pydantic-settings reads
    them) whose section is not one of :class:`Settings`' tables: pydantic-settings ignores such a variable, so a
    misspelled section (``PROFWATCH_COORDNATOR__WINDOW_STEPS``) would change nothing, silently. A variable without
    ``__`` is not an override of a key (``PROFWATCH_CONFIG``, the rank hook's ``PROFWATCH_JOB_ID``) and is left
    to :func:`unknown_env_variables` (a warning). An unknown key in a known section is refused by the model itself (``extra="forbid"``)."""
    sections = set(Settings.model_fields)
    out = []
    for name in sorted(environ):
        if not name.upper().startswith("PROFWATCH_") or "__" not in name:
            continue
        section = name[len("PROFWATCH_"):].split("__", 1)[0].lower()
        if section not in sections:
            out.append(f"{name}: no section {section!r} (an env override is PROFWATCH_<SECTION>__<KEY>, sections: "
                       f"{', '.join(sorted(sections))}); it would change nothing")
    return out


TOOLING_ENV_VARS = frozenset({
    "PROFWATCH_REQUIRE_REAL_TOOLS", "PROFWATCH_OFFLINE", "PROFWATCH_WHEEL_CACHE", "PROFWATCH_RESOLVE_CACHE",
    "PROFWATCH_CONFORMANCE_COVERAGE", "PROFWATCH_CONFORMANCE_SHM_TAG", "PROFWATCH_TORCH_NPU_VERSION",
    "PROFWATCH_TORCH_NPU_STANDIN_VERSION", "PROFWATCH_SHARED_DIR", "PROFWATCH_KEEP_TMP"})
"""``PROFWATCH_*`` variables of the project's own CI, tests and conformance runs (``.ci/run``, ``tests/``), not
settings: never warned about (``.ci/run`` exports ``PROFWATCH_REQUIRE_REAL_TOOLS``, and a warning on every
command's stderr failed the config tests under CI)."""


def unknown_env_variables(environ: Mapping[str, str]) -> list[str]:
    """``"NAME: why"`` for each ``PROFWATCH_*`` variable (any case) that is neither a key override
    (``PROFWATCH_<SECTION>__<KEY>``, two underscores: :func:`unknown_env_sections` checks those), a whole-table
    override (``PROFWATCH_<SECTION>``, JSON), ``PROFWATCH_CONFIG``, the rank hook's own variables
    (``rankhook.ENV_VARS``), the simulator's (``PROFWATCH_SIM_POLL_INTERVAL_S``) nor the project's tooling's
    (:data:`TOOLING_ENV_VARS`). pydantic-settings ignores such
    a variable, so ``PROFWATCH_WEBHOOK_URL`` (one underscore) would change nothing, silently. A warning, never an
    error: the prefix is shared with other tools' variables. The why names the ``__`` form it may have meant."""
    from profwatch.simulate.dynamic_profile_sim import POLL_ENV as SIM_POLL_ENV
    from rankhook import ENV_VARS as HOOK_ENV_VARS

    sections = set(Settings.model_fields)
    known = {"PROFWATCH_CONFIG", SIM_POLL_ENV, *HOOK_ENV_VARS, *TOOLING_ENV_VARS}
    out = []
    for name in sorted(environ):
        upper = name.upper()
        if not upper.startswith("PROFWATCH_") or "__" in name or upper in known:
            continue
        rest = name[len("PROFWATCH_"):].lower()
        if rest in sections:
            continue
        meant = next((f"PROFWATCH_{sec.upper()}__{rest[len(sec) + 1:].upper()}" for sec in sorted(sections, key=len,
                      reverse=True) if rest.startswith(sec + "_") and len(rest) > len(sec) + 1), None)
        hint = f" (did you mean {meant}?)" if meant else ""
        out.append(f"{name}: not a profwatch setting; an env override of a key is PROFWATCH_<SECTION>__<KEY>, with "
                   f"two underscores{hint}; it changes nothing")
    return out


def load_settings(path: str | Path | None = None, **overrides: Any) -> Settings:
    """Load the config file (optional) with env overrides; ``overrides`` win over both.

    Raises:
        ConfigError: unreadable file, bad TOML, unknown keys or invalid values, with the offending key, and the
            cross-key rules broken by the valid keys in the same message (``profwatch.config_passes.cross_key_lines``); an env
            override naming no section (:func:`unknown_env_sections`). A ``PROFWATCH_*`` variable that is no
            setting (:func:`unknown_env_variables`) is logged as a warning (logger ``profwatch.config``).
    """
    from pydantic import ValidationError

    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {p} does not exist or is not a file")
        from profwatch.adapters.fs.bounded_read import InputTooLarge, read_capped

        try:
            text = read_capped(p, MAX_CONFIG_BYTES, "config file").decode("utf-8")
        except (InputTooLarge, OSError) as exc:
            raise ConfigError(str(exc)) from None
        except UnicodeDecodeError:
            raise ConfigError(f"config file {p} is not UTF-8 text") from None
        try:
            try:
                import tomllib as _t
            except ModuleNotFoundError:  # Python 3.10
                import tomli as _t
            _t.loads(text)
        except Exception as exc:  # noqa: BLE001
            raise ConfigError(f"config file {p} is not valid TOML: {exc}") from None
    misspelled = unknown_env_sections(os.environ)
    if misspelled:
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(misspelled))
    for line in unknown_env_variables(os.environ):
        logging.getLogger("profwatch.config").warning("environment: %s", line)
    _TOML_PATH["path"] = Path(path) if path is not None else None
    from pydantic_settings import SettingsError

    try:
        return Settings(**overrides)
    except SettingsError as exc:
        raise ConfigError(f"invalid configuration from the environment: {exc}") from None
    except ValidationError as exc:
        from profwatch.config_passes import cross_key_lines

        # the cross-key rules pydantic did not run (a key of their model was invalid) run on the valid keys
        lines = error_lines(exc) + cross_key_lines(Settings, exc, overrides, error_lines)
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(lines)) from None
    finally:
        _TOML_PATH["path"] = None


def error_lines(exc: Any) -> list[str]:
    """One ``key: why`` line per error of a pydantic ``ValidationError`` of :class:`Settings`. A cross-key rule
    (:class:`~profwatch.core.keyed_error.KeysError`) names every key it involves, each with its section
    (``coordinator.metrics_tls_cert, coordinator.metrics_tls_key: ...``), never the section alone."""
    lines = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err.get("loc", ()))
        cause = (err.get("ctx") or {}).get("error")
        if isinstance(cause, KeysError):
            keys = ", ".join(f"{loc}.{k}" if loc else k for k in cause.keys)
            lines.append(f"{keys}: {cause.message}")
        elif err.get("type") == "extra_forbidden":
            lines.append(f"{loc}: {_unknown_key(tuple(str(x) for x in err.get('loc', ())))}")
        else:
            lines.append(f"{loc}: {_plain(err, secret=any(w in loc.lower() for w in _SECRET_WORDS))}")
    return lines


_PLAIN = {"path_type": "must be a path, written as a TOML string (\"/var/lib/profwatch\")",
          "int_parsing": "must be a whole number", "int_type": "must be a whole number",
          "int_from_float": "must be a whole number", "float_parsing": "must be a number",
          "float_type": "must be a number", "bool_parsing": "must be true or false", "bool_type": "must be true or false",
          "string_type": "must be a TOML string (in quotes)", "list_type": "must be a TOML list ([...])",
          "dict_type": "must be a TOML table", "model_type": "must be a TOML table ([section])"}


_SECRET_WORDS = ("secret", "token", "password", "authorization", "key", "url")
"""A key whose name holds one of these never has its value echoed in an error (a URL may carry a token in its
path or query)."""


def _plain(err: Mapping[str, Any], *, secret: bool = False) -> str:
    """One pydantic error as a config reader says it: what the key needs (:data:`_PLAIN` for a wrong type, else
    pydantic's own message, e.g. a range) and the value given (its repr, at most 60 characters; never for a
    ``secret`` key, nor after a validator's own message: it says what of the value it may)."""
    what = _PLAIN.get(str(err.get("type")), str(err.get("msg")))
    if err.get("type") == "value_error" and (err.get("ctx") or {}).get("error") is not None:
        what = str(err["ctx"]["error"])  # our validator's own words, without pydantic's "Value error, " prefix
    if secret or "input" not in err or isinstance(err["input"], Mapping) or err.get("type") == "value_error":
        return what  # a validator's own message says what of the value is safe to say (a URL's password is not)
    given = repr(err["input"])
    return f"{what} (got {given if len(given) <= 60 else given[:57] + '...'})"


def _unknown_key(loc: tuple[str, ...]) -> str:
    """Why ``loc`` (a key path) is refused: not a setting of its section (or not a section), with the closest known
    name when one is close (``difflib.get_close_matches``, cutoff 0.75)."""
    import difflib

    model: Any = Settings
    for part in loc[:-1]:
        field = getattr(model, "model_fields", {}).get(part)
        model = field.annotation if field is not None else None
    fields = getattr(model, "model_fields", {}) if model is not None else {}
    for name, field in fields.items():  # an old name read as well (AliasChoices): refused only when both are given
        alias = field.validation_alias
        if isinstance(alias, AliasChoices) and loc[-1] != name and loc[-1] in alias.choices:
            section = ".".join(loc[:-1])
            return f"the former name of {section}.{name}, which is given too: keep one of the two"
    known = list(fields)
    close = difflib.get_close_matches(loc[-1], known, n=1, cutoff=0.75)
    what = "not a setting of [" + ".".join(loc[:-1]) + "]" if len(loc) > 1 else "not a section"
    return what + (f" (did you mean {close[0]}?)" if close else "")
