"""Settings of the alert sinks: ``[alertmanager]`` and ``[webhook]`` with their TLS and Authorization options (pure).

Secrets never sit in the TOML file: the ``Authorization`` header value is read from a file
(``authorization_file``) or an environment variable (``authorization_env``) when the coordinator starts
(``daemon/profwatch/adapters/outputs/http_post.py: read_authorization``).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit, urlunsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from profwatch.core.keyed_error import KeysError

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_ALERTMANAGER_API = re.compile(r"/api/v[12]/alerts/?$")
_LABEL_VALUE_MAX = 256


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


def _check_http_url(url: str, section: str) -> str:
    if not url:
        return url
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        shown = f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}" if parts.netloc else f"{parts.scheme or '(none)'}:"
        raise ValueError(f"[{section}] url must be an http:// or https:// URL with a host, got one starting "
                         f"{shown!r} (its path and query, where a webhook's token may be, not shown)")
    if parts.username or parts.password:
        raise ValueError(f"[{section}] url must not carry credentials; use authorization_file or authorization_env")
    return url


class HttpClientSettings(_Strict):
    """TLS and authentication of one outgoing HTTP sink.

    ``ca_file``: PEM bundle to verify the server with (default: the system store). ``cert_file`` / ``key_file``:
    client certificate for mutual TLS (both or neither). ``verify = false`` turns certificate checks off (test
    setups only; logged as a warning). ``authorization_file`` / ``authorization_env``: where the whole
    ``Authorization`` header value comes from (e.g. ``Bearer <token>`` or ``Basic <base64>``); at most one.
    """

    timeout_s: float = Field(5.0, gt=0, le=300, description="per-request timeout")
    retries: int = Field(3, ge=0, le=20, description="extra attempts for connection errors, timeouts, 5xx and 429")
    backoff_s: float = Field(0.5, gt=0, le=60, description="first retry delay; doubles up to max_backoff_s")
    max_backoff_s: float = Field(10.0, gt=0, le=600, description="longest retry delay")
    queue_size: int = Field(1000, ge=1, le=100_000, description="pending requests kept; more are dropped and counted")
    ca_file: Path | None = Field(None, description=(
        "CA bundle the server's certificate must chain to (unset: the system store)"))
    cert_file: Path | None = Field(None, description="client certificate for mutual TLS (with key_file)")
    key_file: Path | None = Field(None, description="private key of cert_file")
    verify: bool = Field(True, description="verify the server's TLS certificate (false: warned at start)")
    authorization_file: Path | None = Field(None, description=(
        "file (mode 0600/0640) holding the whole Authorization header value, e.g. Bearer <token>"))
    authorization_env: str | None = Field(None, description=(
        "environment variable holding the whole Authorization header value (set by systemd Environment= or "
        "EnvironmentFile=)"))

    @field_validator("authorization_env")
    @classmethod
    def _env_name(cls, v: str | None) -> str | None:
        if v is not None and not _ENV_NAME.match(v):
            raise ValueError("authorization_env must name an environment variable (letters, digits, _), not hold "
                             "the value: the value itself never goes into the config file (not echoed here)")
        return v

    @model_validator(mode="after")
    def _pairs(self) -> HttpClientSettings:
        if (self.cert_file is None) != (self.key_file is None):
            raise KeysError(("cert_file", "key_file"), "cert_file and key_file go together (client certificate for "
                            "mutual TLS)")
        if self.authorization_file is not None and self.authorization_env is not None:
            raise KeysError(("authorization_file", "authorization_env"), "set authorization_file or "
                            "authorization_env, not both")
        return self


class AlertmanagerSettings(HttpClientSettings):
    """Alertmanager sink (off when ``url`` is empty): suspect ranks and capture problems become Alertmanager alerts.

    ``url`` is Alertmanager's base URL (``http://alertmanager:9093``); alerts are POSTed to ``<url>/api/v2/alerts``
    (a ``url`` that already ends in ``/api/v2/alerts`` is used as it is). Standing alerts are re-sent every
    ``resend_interval_s`` with ``endsAt`` = now + 4 x ``resend_interval_s``, so Alertmanager keeps them while
    profwatch runs and lets them expire by themselves if profwatch stops for good.
    """

    url: str = Field("", description="Alertmanager base URL (profwatch posts to <url>/api/v2/alerts); empty: sink off")
    cluster: str = Field("default", min_length=1, max_length=_LABEL_VALUE_MAX,
                         description="value of the 'cluster' label on every alert")
    resend_interval_s: float = Field(60.0, ge=0.2, le=3600, description=(
        "standing alerts are re-sent this often, each with endsAt = now + 4 x this"))
    max_suspects: int = Field(5, ge=1, le=100, description="alerts per suspect_ranks event (best first)")
    external_url: str = Field("", description="generatorURL of every alert (e.g. where reports are served); "
                                              "default: a file:// link to the batch report")

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        v = _check_http_url(v, "alertmanager")
        if re.search(r"/api/v1/alerts/?$", v):
            raise ValueError("[alertmanager] url: API v1 was removed in Alertmanager 0.27; give the base URL "
                             "(e.g. http://alertmanager:9093) and profwatch posts to /api/v2/alerts")
        return v

    def alerts_url(self) -> str:
        """The ``POST`` endpoint: ``<url>/api/v2/alerts``."""
        parts = urlsplit(self.url)
        path = parts.path.rstrip("/")
        if not path.endswith("/api/v2/alerts"):
            path += "/api/v2/alerts"
        return urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


class WebhookSettings(HttpClientSettings):
    """Generic webhook (off when ``url`` is empty): each event POSTed as one CloudEvent, HTTP binding, structured
    mode (``Content-Type: application/cloudevents+json``). ``events = "alerts"`` sends the alert types only,
    ``"all"`` also progress events (anomaly, arm, capture, batch, job_ended)."""

    url: str = Field("", description=(
        "webhook URL each event is POSTed to as a CloudEvent (structured mode); empty: sink off"))
    events: Literal["alerts", "all"] = Field("alerts", description=(
        "alerts (the alert types only) or all (also anomaly, arm, capture, batch, job_ended)"))

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        v = _check_http_url(v, "webhook")
        if _ALERTMANAGER_API.search(urlsplit(v).path):
            raise ValueError(
                f"[webhook] url {v!r} is Alertmanager's API, which does not accept webhook bodies: set "
                "[alertmanager] url = \"<scheme>://<host>:<port>\" instead (profwatch posts API v2 alerts there)")
        return v
