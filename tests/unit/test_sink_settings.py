"""Config sections of the alert sinks: clear errors, the Alertmanager-API refusal for [webhook], secrets never inline;
Authorization values from a file or an env var; job end tracking (pure)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from profwatch.adapters.outputs.http_post import SinkConfigError, read_authorization
from profwatch.config import ConfigError, load_settings
from profwatch.core.alerts.settings import AlertmanagerSettings, WebhookSettings
from profwatch.core.fleet.job_end import JobEndTracker


def _load(tmp_path: Path, text: str):
    p = tmp_path / "c.toml"
    p.write_text(text)
    return load_settings(p)


@pytest.mark.parametrize("url", ["http://alertmanager:9093/api/v1/alerts", "http://am:9093/api/v2/alerts",
                                 "https://am.example/api/v2/alerts/"])
def test_webhook_pointing_at_alertmanager_is_refused_with_a_hint(tmp_path: Path, url: str):
    with pytest.raises(ConfigError) as ei:
        _load(tmp_path, f'[webhook]\nurl = "{url}"\n')
    msg = str(ei.value)
    assert "webhook.url" in msg and "[alertmanager] url" in msg


@pytest.mark.parametrize(("text", "words"), [
    ('[alertmanager]\nurl = "ftp://x"\n', "http:// or https://"),
    ('[alertmanager]\nurl = "http://am:9093/api/v1/alerts"\n', "API v1 was removed"),
    ('[alertmanager]\nurl = "http://user:pw@am:9093"\n', "must not carry credentials"),
    ('[webhook]\nurl = "http://h/x"\nauthorization = "Bearer x"\n', "authorization"),
    ('[webhook]\nurl = "http://h/x"\nauthorization_env = "Bearer abc"\n', "name an environment variable"),
    ('[webhook]\nurl = "https://h/x"\ncert_file = "/c.pem"\n', "cert_file and key_file go together"),
    ('[alertmanager]\nurl = "http://am"\nauthorization_env = "A"\nauthorization_file = "/f"\n', "not both"),
    ('[alertmanager]\nurl = "http://am"\nresend_interval_s = 0\n', "resend_interval_s"),
    ('[coordinator]\njob_end_after_s = -1\n', "job_end_after_s"),
])
def test_bad_sink_sections_give_clear_errors(tmp_path: Path, text: str, words: str):
    with pytest.raises(ConfigError) as ei:
        _load(tmp_path, text)
    assert words in str(ei.value)


def test_alertmanager_endpoint_and_defaults(tmp_path: Path):
    s = _load(tmp_path, '[alertmanager]\nurl = "http://am:9093"\ncluster = "prod"\n')
    assert s.alertmanager.alerts_url() == "http://am:9093/api/v2/alerts"
    assert AlertmanagerSettings(url="http://am:9093/").alerts_url() == "http://am:9093/api/v2/alerts"
    assert AlertmanagerSettings(url="http://am:9093/api/v2/alerts").alerts_url() == "http://am:9093/api/v2/alerts"
    # behind a reverse proxy with a path prefix, with a query string
    assert AlertmanagerSettings(url="https://gw/alertmanager?tenant=a").alerts_url() == \
        "https://gw/alertmanager/api/v2/alerts?tenant=a"
    assert s.alertmanager.cluster == "prod" and s.webhook.url == "" and s.coordinator.job_end_after_s == 600


def test_authorization_from_file_or_env(tmp_path: Path):
    f = tmp_path / "auth"
    f.write_text("Bearer s3cret\n")
    os.chmod(f, 0o600)
    assert read_authorization(WebhookSettings(url="http://h/x", authorization_file=f), {}, "webhook") == "Bearer s3cret"
    s = WebhookSettings(url="http://h/x", authorization_env="PW_AUTH")
    assert read_authorization(s, {"PW_AUTH": "Basic YTpi"}, "webhook") == "Basic YTpi"
    assert read_authorization(WebhookSettings(url="http://h/x"), {}, "webhook") is None
    with pytest.raises(SinkConfigError, match="PW_AUTH is empty or unset"):
        read_authorization(s, {}, "webhook")
    with pytest.raises(SinkConfigError, match="cannot be read"):
        read_authorization(WebhookSettings(url="http://h/x", authorization_file=tmp_path / "nope"), {}, "webhook")
    f.write_text("Bearer a\nX-Injected: 1\n")
    with pytest.raises(SinkConfigError, match="one line"):
        read_authorization(WebhookSettings(url="http://h/x", authorization_file=f), {}, "webhook")


def test_job_end_tracker_reports_each_silence_once():
    t = JobEndTracker(after_s=100)
    last = {"a": 1000.0, "b": 1050.0, "never": 0.0}
    assert t.check(last, 1099) == []
    ended = t.check(last, 1100)
    assert [e.job_id for e in ended] == ["a"] and ended[0].silent_s == 100
    assert t.check(last, 1200)[0].job_id == "b"
    assert t.check(last, 5000) == []
    # the job reports again, then falls silent again: a new end
    last["a"] = 6000.0
    assert t.check(last, 6050) == []
    again = t.check(last, 6100)
    assert [e.job_id for e in again] == ["a"] and again[0].event_id() != ended[0].event_id()
    with pytest.raises(ValueError):
        JobEndTracker(0)


def test_a_job_before_its_first_step_gets_the_startup_allowance() -> None:
    """Issue 33 #8: a job whose start-up (model loading) took longer than job_end_after_s was declared ended before
    its first step."""
    t = JobEndTracker(after_s=100, startup_allowance_s=900)
    hello = {"loading": 1000.0, "running": 1000.0}
    assert [e.job_id for e in t.check(hello, 1200.0, before_first_step={"loading"})] == ["running"]
    assert t.check(hello, 1999.0, before_first_step={"loading"}) == []  # 999 s of start-up: still within 100 + 900
    (end,) = t.check(hello, 2000.0, before_first_step={"loading"})
    assert end.job_id == "loading" and end.silent_s == 1000.0
    with pytest.raises(ValueError):
        JobEndTracker(10, startup_allowance_s=-1)
