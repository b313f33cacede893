"""Configuration: defaults, TOML + env overrides, and clear errors for everything a person can get wrong."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from profwatch.config import ConfigError, load_settings


def test_defaults_are_loopback_and_valid() -> None:
    s = load_settings(None)
    assert s.coordinator.control_bind.startswith("tcp://127.0.0.1")
    assert s.node.rank_endpoint() == "ipc:///run/profwatch/node.sock"


def test_env_overrides_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "c.toml"
    f.write_text('[coordinator]\nwindow_steps = 500\n[node]\nheartbeat_interval_s = 3.0\n')
    monkeypatch.setenv("PROFWATCH_COORDINATOR__WINDOW_STEPS", "700")
    s = load_settings(f)
    assert s.coordinator.window_steps == 700 and s.node.heartbeat_interval_s == 3.0


@pytest.mark.parametrize(
    ("toml", "env", "needle"),
    [
        ("[coordinator\n", {}, "not valid TOML"),
        ("[coordinator]\nbogus = 1\n", {}, "coordinator.bogus: not a setting of [coordinator]\n"),
        ("[coordinator]\ningest_bnd = 1\n", {}, "coordinator.ingest_bnd: not a setting of [coordinator] (did you "
                                                 "mean ingest_bind?)"),
        ("[nodee]\nbind = 1\n", {}, "nodee: not a section (did you mean node?)"),
        ("[coordinator]\nstate_db = 5\n", {}, "coordinator.state_db: must be a path, written as a TOML string "
                                              "(\"/var/lib/profwatch\") (got 5)\n"),
        ("[detection]\nwarmup_steps = \"x\"\n", {}, "detection.warmup_steps: must be a whole number (got 'x')\n"),
        ("[coordinator]\ncontrol_bind = \"tcp://0.0.0.0:7712\"\n[security]\ncurve = \"off\"\n", {}, "without CURVE"),
        ("[node]\nbind = \"tcp://0.0.0.0:7700\"\n", {}, "ranks cannot use CURVE"),
        # a malformed endpoint: said by config check, not first by the daemon at start (or a port taken modulo
        # 65536: 99999 listened on 34463), and not misread as "beyond loopback" for lack of tcp://
        ("[coordinator]\ningest_bind = \"tcp://127.0.0.1:99999\"\n", {},
         "coordinator.ingest_bind: 'tcp://127.0.0.1:99999': the port '99999' must be a number from 1 to 65535"),
        ("[coordinator]\npub_bind = \"tcp://localhost:abc\"\n", {}, "coordinator.pub_bind: 'tcp://localhost:abc'"),
        ("[node]\ncoordinator = \"127.0.0.1:7711\"\n", {},
         "node.coordinator: '127.0.0.1:7711' names no transport: write tcp://HOST:PORT\n"),
        ("[node]\ncoordinator = \"tcp://127.0.0.1:*\"\n", {}, "node.coordinator: 'tcp://127.0.0.1:*': the port"),
        ("[node]\nbind = \"tcp://127.0.0.1\"\n", {}, "node.bind: 'tcp://127.0.0.1' needs a host and a port"),
        ("", {"PROFWATCH_COORDINATOR__CONTROL_BIND": "tcp://127.0.0.1:70000"}, "coordinator.control_bind: "),
        ("", {"PROFWATCH_COORDINATOR__TICK_INTERVAL_S": "inf"}, "finite"),
        ("", {"PROFWATCH_NODE__BATCH_MAX_DELAY_S": "1e308"}, "less than or equal"),
        ("", {"PROFWATCH_COORDINATOR": "garbage"}, "environment"),
        ("", {"PROFWATCH_COORDINATOR__WINDOW_STEPS": "abc"}, "window_steps"),
    ],
)
def test_bad_configs_fail_clearly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, toml: str, env: dict,
                                  needle: str) -> None:
    f = tmp_path / "c.toml"
    f.write_text(toml)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ConfigError) as ei:
        load_settings(f)
    assert needle in str(ei.value) + "\n"


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(tmp_path / "nope.toml")


@pytest.mark.parametrize("toml", [
    '[webhook]\nurl = "https://user:hunter2@hooks.example.com/x"\n',
    '[alertmanager]\nurl = "https://ops:hunter2@am.example.com"\n',
    '[webhook]\nauthorization_env = "Bearer hunter2"\n',
    '[alertmanager]\nauthorization_env = "Basic hunter2"\n',
    '[webhook]\nurl = "hooks.example.com/services/T0/B0/hunter2"\n',  # no scheme: a Slack-style token in the path
    '[webhook]\nurl = "ftp://hooks.example.com/hunter2?token=hunter2"\n',
])
def test_a_secret_in_a_bad_value_is_never_echoed(tmp_path: Path, toml: str) -> None:
    """A URL with a password, or the Authorization value written where its variable's name goes, is refused with
    the key and why, never the value (before: ``(got 'https://user:hunter2@...')`` appended to the validator's
    message, and ``got 'Bearer hunter2'`` in it)."""
    f = tmp_path / "c.toml"
    f.write_text(toml)
    with pytest.raises(ConfigError) as ei:
        load_settings(f)
    assert "hunter2" not in str(ei.value) and (".url:" in str(ei.value) or ".authorization_env:" in str(ei.value))


def test_config_check_refuses_curve_binds_without_the_server_key_as_the_coordinator_does(tmp_path: Path) -> None:
    """A coordinator bind beyond loopback uses CURVE; without the server secret key the coordinator exits 2 at
    start, so ``config check`` says so (before: "valid", then the coordinator refused the same file)."""
    import os

    import zmq.auth

    from profwatch.commands.configcmd import check_errors

    keys = tmp_path / "keys"
    keys.mkdir()
    f = tmp_path / "c.toml"
    f.write_text(f'[coordinator]\npub_bind = "tcp://0.0.0.0:39713"\nstate_db = "{tmp_path}/s.db"\n'
                 f'work_dir = "{tmp_path}"\n[security]\nkeys_dir = "{keys}"\n')
    errors, _ = check_errors(f)
    assert [e for e in errors if e.startswith("coordinator.pub_bind: beyond loopback these use CURVE")
            and "server secret key" in e and "profwatch keys init" in e], errors
    _, secret = zmq.auth.create_certificates(str(keys), "server")
    os.chmod(secret, 0o600)
    (keys / "clients").mkdir()
    errors, _ = check_errors(f)
    assert not [e for e in errors if "CURVE" in e], errors


def test_config_check_lists_field_and_cross_key_errors_in_one_pass(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """pydantic runs a model's cross-key rules only when its fields are valid: a file with a bad value listed its
    cross-key errors only once that value was fixed. Now the rules run again on the valid keys (the invalid ones
    left out): both kinds in one run, and no rule reported that only a left-out key would break."""
    from profwatch.commands.configcmd import check_errors

    for k in [k for k in os.environ if k.upper().startswith("PROFWATCH_")]:
        monkeypatch.delenv(k)
    f = tmp_path / "both.toml"
    f.write_text('[coordinator]\nwindow_steps = 5\ningest_bind = "tcp://127.0.0.1:7000"\n'
                 'control_bind = "tcp://127.0.0.1:7000"\npub_bind = "tcp://0.0.0.0:7799"\n'
                 '[node]\nmetrics_port = 9100\nmetrics_tls_cert = 5\nmetrics_tls_key = "/k.pem"\n'
                 '[detection]\nmin_baseline_steps = 500\nbaseline_steps = 100\n[security]\ncurve = "off"\n')
    errors, settings = check_errors(f)
    assert settings is None
    for start in ("coordinator.window_steps: ", "node.metrics_tls_cert: ",  # field errors
                  "detection.min_baseline_steps, detection.baseline_steps: ",  # a rule of a valid section
                  "coordinator.control_bind, coordinator.ingest_bind: ",  # a rule of a section with a bad value
                  "coordinator.pub_bind, security.curve, security.insecure: "):  # a rule across sections
        assert sum(e.startswith(start) for e in errors) == 1, (start, errors)
    # metrics_tls_cert was left out for the second look, so "cert and key go together" would be its artefact
    assert not [e for e in errors if e.startswith("node.metrics_tls_cert, node.metrics_tls_key")], errors


def test_the_manual_capture_window_and_the_armed_one_have_distinct_names(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """``[arming] active`` (the captures detection arms) and ``[capture] active`` (a manual arm's) shared a name;
    the manual one is ``manual_active`` / ``manual_warmup`` now, and a config written with the old names still
    loads with the same meaning."""
    from profwatch.commands.configcmd import leaves

    for k in [k for k in os.environ if k.upper().startswith("PROFWATCH_")]:
        monkeypatch.delenv(k)
    f = tmp_path / "c.toml"
    f.write_text("[arming]\nactive = 6\n[capture]\nmanual_active = 3\nmanual_warmup = 2\n")
    s = load_settings(f)
    assert (s.arming.active, s.capture.manual_active, s.capture.manual_warmup) == (6, 3, 2)
    keys = {k for k, _ in leaves(s)}
    assert {"arming.active", "capture.manual_active", "capture.manual_warmup"} <= keys
    assert "capture.active" not in keys and "capture.warmup" not in keys
    f.write_text("[capture]\nactive = 5\nwarmup = 0\n")  # the old names
    s = load_settings(f)
    assert (s.capture.manual_active, s.capture.manual_warmup, s.arming.active) == (5, 0, 4)
    from profwatch.commands.configcmd import former_names
    from profwatch.config import Settings
    assert former_names(Settings) == {"capture.active": "capture.manual_active",
                                      "capture.warmup": "capture.manual_warmup"}
    monkeypatch.setenv("PROFWATCH_CAPTURE__MANUAL_ACTIVE", "7")
    assert load_settings(None).capture.manual_active == 7
    # both names at once: said so, not "not a setting" / pydantic's "Extra inputs are not permitted"
    f.write_text("[capture]\nwarmup = 2\nmanual_warmup = 3\n")
    with pytest.raises(ConfigError) as err:
        load_settings(f)
    assert "capture.warmup: the former name of capture.manual_warmup, which is given too: keep one" in str(err.value)


def test_the_heartbeat_key_says_when_a_node_warns_as_the_node_does() -> None:
    """The key's description said "unanswered after 3 of these" (6 s at the default 2 s); the node warns after
    max(10 s, 3 heartbeats): a new user watching node.log for the warning waited past the documented time."""
    from profwatch.config import NodeSettings
    from profwatch.node import UNANSWERED_MIN_S

    text = NodeSettings.model_fields["heartbeat_interval_s"].description or ""
    assert f"3 of these or {UNANSWERED_MIN_S:g} s, the longer" in text, text
