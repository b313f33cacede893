"""``profwatch config check`` (exit 0 valid, 2 with each error and its key) and ``profwatch config show`` (the
effective configuration with the source of each key, secrets redacted), run as an operator runs them."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from profwatch.commands.configcmd import redact, source_of
from tests.conftest import PYTHON, REPO_ROOT, python_env


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    e = python_env(env)
    e = {k: v for k, v in e.items() if not (k.startswith("PROFWATCH_") and "__" in k)} | (env or {})
    e["PROFWATCH_CONFIG"] = ""
    return subprocess.run([PYTHON, "-m", "profwatch.cli", "config", *args], env=e, capture_output=True, text=True,
                          timeout=120)


def test_the_shipped_example_is_valid_and_so_are_the_defaults() -> None:
    res = _cli("check", "--config", str(REPO_ROOT / "systemd" / "profwatch.toml"))
    assert res.returncode == 0 and res.stdout.strip().endswith(": valid"), res.stderr
    res = _cli("check")
    assert res.returncode == 0 and "built-in defaults (no config file)" in res.stdout, res.stderr


def test_every_error_is_listed_with_its_key_and_exit_2(tmp_path: Path) -> None:
    folder = tmp_path / "a-folder"
    folder.mkdir()
    cfg = tmp_path / "bad.toml"
    cfg.write_text(f'[coordinator]\nwindow_steps = 5\nanalysis_workers = "two"\nstate_db = "{folder}"\n'
                   f'metrics_tls_cert = "{tmp_path / "missing.pem"}"\n'
                   f'[node]\nruntime_dir = "{cfg}"\n[detection]\nbogus = 1\n')
    res = _cli("check", "--config", str(cfg))
    assert res.returncode == 2, res.stdout + res.stderr
    lines = res.stderr.splitlines()
    assert lines[0].endswith("error(s)") and "Traceback" not in res.stderr
    for key in ("coordinator.window_steps", "coordinator.analysis_workers", "detection.bogus",  # ranges, types, keys
                "coordinator.state_db", "coordinator.metrics_tls_cert", "node.runtime_dir"):  # path types
        assert any(line.strip().startswith(f"{key}: ") for line in lines), (key, res.stderr)


def test_syntax_and_cross_key_rules_are_errors(tmp_path: Path) -> None:
    cfg = tmp_path / "syntax.toml"
    cfg.write_text("[coordinator\n")
    res = _cli("check", "--config", str(cfg))
    assert res.returncode == 2 and "TOML syntax" in res.stderr and "line 1" in res.stderr
    cfg.write_text('[coordinator]\nmetrics_port = 9100\nmetrics_addr = "0.0.0.0"\n')  # beyond loopback, no TLS
    res = _cli("check", "--config", str(cfg))
    assert res.returncode == 2 and "coordinator.metrics_addr, coordinator.metrics_tls_cert" in res.stderr, res.stderr
    assert _cli("check", "--config", str(tmp_path / "nope.toml")).returncode == 2


def test_show_gives_each_key_its_source_and_redacts_secrets(tmp_path: Path) -> None:
    cfg = tmp_path / "pw.toml"
    cfg.write_text('[coordinator]\nwindow_steps = 500\n[alertmanager]\n'
                   'url = "https://am.example:9093/?token=s3cr3t&x=1"\n')
    res = _cli("show", "--config", str(cfg), env={"PROFWATCH_ARMING__MODE": "observe"})
    assert res.returncode == 0, res.stderr
    lines = dict(line.split(" = ", 1) for line in res.stdout.splitlines() if " = " in line)
    assert lines["coordinator.window_steps"] == "500  # file"
    assert lines["arming.mode"] == '"observe"  # env PROFWATCH_ARMING__MODE'
    assert lines["coordinator.tick_interval_s"] == "0.2  # default"
    assert "arming.targeting.enabled" in lines and "s3cr3t" not in res.stdout
    assert lines["alertmanager.url"].startswith('"https://am.example:9093/?token=<redacted>&x=1"')
    assert lines["node.socket_mode"] == "0o660  # default"  # a mode in octal (valid TOML), not decimal 432
    doc = json.loads(_cli("show", "--config", str(cfg), "--json").stdout)
    assert doc["coordinator.window_steps"] == {"value": 500, "source": "file"}


def test_show_names_the_env_variable_of_a_former_name(tmp_path: Path) -> None:
    """A setting read from the environment under its former name (``PROFWATCH_CAPTURE__ACTIVE``, read as
    ``capture.manual_active``) is shown with that variable as its source, not as a default that it is not (as the
    file's former names are)."""
    res = _cli("show", env={"PROFWATCH_CAPTURE__ACTIVE": "7"})
    assert res.returncode == 0, res.stderr
    lines = dict(line.split(" = ", 1) for line in res.stdout.splitlines() if " = " in line)
    assert lines["capture.manual_active"] == "7  # env PROFWATCH_CAPTURE__ACTIVE"
    assert lines["capture.manual_warmup"] == "1  # default"


def test_redaction_and_sources_rules() -> None:
    assert redact("alertmanager.url", "https://bob:pw@host/") == "https://<redacted>@host/"
    assert redact("x.api_token", "abc") == "<redacted>" and redact("x.password", "p") == "<redacted>"
    assert redact("security.server_secret_key", Path("/k")) == Path("/k")  # a path to a key is not the key
    assert source_of("arming.targeting.enabled", set(), {"PROFWATCH_ARMING": "{}"}) == "env PROFWATCH_ARMING"
    assert source_of("a.b", {"a.b"}, {}) == "file" and source_of("a.c", {"a.b"}, {}) == "default"


def test_redaction_by_key_and_by_value_covers_every_kind_of_secret() -> None:
    """Each kind of secret an operator may put in a URL or a setting is hidden; the rest of the value is kept."""
    cases = {
        "https://am/x#token=abc": "https://am/x#token=<redacted>",  # fragment (OAuth implicit flow)
        "https://am/x#access_token=abc&state=1": "https://am/x#access_token=<redacted>&state=1",
        "https://am/x?auth=abc&y=1": "https://am/x?auth=<redacted>&y=1",
        "https://b.s3/o?X-Amz-Credential=AKIA%2F1&X-Amz-Signature=ff&X-Amz-Date=1":
            "https://b.s3/o?X-Amz-Credential=<redacted>&X-Amz-Signature=<redacted>&X-Amz-Date=1",
        "https://hooks.slack.com/services/T0/B0/XXXXXXXX": "https://hooks.slack.com/services/<redacted>",
        "https://discord.com/api/webhooks/123/abc?wait=1": "https://discord.com/api/webhooks/<redacted>?wait=1",
        "https://chat.example/hooks/xyz": "https://chat.example/hooks/<redacted>",
        "https://outlook.office.com/webhook/a1b2@c3d4/IncomingWebhook/e5f6/g7h8":  # Teams (legacy)
            "https://outlook.office.com/webhook/<redacted>",
        "https://contoso.webhook.office.com/webhookb2/a1b2@c3d4/IncomingWebhook/e5f6/g7h8":  # Teams
            "https://contoso.webhook.office.com/webhookb2/<redacted>",
        "https://api.telegram.org/bot123456:AAH-xyz_Tok/sendMessage?chat_id=1":  # Telegram bot token
            "https://api.telegram.org/bot<redacted>?chat_id=1",
        "https://pan.example/s/1abc?pwd=x7y8": "https://pan.example/s/1abc?pwd=<redacted>",
        "https://db.example/q?user=u&password=hunter2&db=1": "https://db.example/q?user=u&password=<redacted>&db=1",
        "https://h.example/q?pass=hunter2&bypass_cache=1": "https://h.example/q?pass=<redacted>&bypass_cache=1",
        "https://api.example/robots/bot/status": "https://api.example/robots/bot/status",  # no token: unchanged
        "https://bob:p@ss@host:9/p": "https://<redacted>@host:9/p",  # an @ inside the password
        "//bob:pw@host/p": "//<redacted>@host/p",  # scheme-relative
        "Bearer abcdefghijkl": "Bearer <redacted>",
        "https://am.example:9093/api/v2": "https://am.example:9093/api/v2",  # nothing secret: unchanged
    }
    for value, shown in cases.items():
        assert redact("webhook.url", value) == shown, value
    for key in ("x.auth", "x.credentials", "x.api_key", "x.access_key", "x.session_cookie", "x.passphrase"):
        assert redact(key, "s3cr3t") == "<redacted>", key
    for key in ("webhook.authorization_env", "security.client_secret_key", "webhook.authorization_file"):
        assert redact(key, "AM_AUTH") == "AM_AUTH", key  # where a secret is, not the secret
    assert redact("x.urls", ["https://u:p@h/"]) == ["https://<redacted>@h/"]
    assert redact("x.headers", {"Authorization": "Basic dXNlcjpwYXNz", "X": "1"}) == {
        "Authorization": "<redacted>", "X": "1"}


def _errors(res: subprocess.CompletedProcess[str]) -> list[str]:
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stdout + res.stderr
    return [line.strip() for line in res.stderr.splitlines()[1:]]


def test_cross_key_errors_name_the_offending_keys(tmp_path: Path) -> None:
    """A rule over several keys names each of them with its section, never the section alone."""
    cfg = tmp_path / "cross.toml"
    cfg.write_text('[node]\nmetrics_port = 9100\nmetrics_tls_cert = "/c.pem"\n'
                   '[coordinator]\ningest_bind = "tcp://127.0.0.1:7000"\ncontrol_bind = "tcp://127.0.0.1:7000"\n'
                   '[detection]\nmin_baseline_steps = 500\nbaseline_steps = 100\n'
                   '[webhook]\nauthorization_env = "A"\nauthorization_file = "/a"\n')
    lines = _errors(_cli("check", "--config", str(cfg)))
    for keys in ("node.metrics_tls_cert, node.metrics_tls_key: ",
                 "coordinator.control_bind, coordinator.ingest_bind: ",
                 "detection.min_baseline_steps, detection.baseline_steps: ",
                 "webhook.authorization_file, webhook.authorization_env: "):
        assert any(line.startswith(keys) for line in lines), (keys, lines)
    assert not any(line.split(":")[0] in ("node", "coordinator", "detection", "webhook", "") for line in lines), lines
    cfg.write_text('[security]\ncurve = "off"\n[coordinator]\ningest_bind = "tcp://0.0.0.0:7711"\n')
    lines = _errors(_cli("check", "--config", str(cfg)))
    assert lines[0].startswith("coordinator.ingest_bind, security.curve, security.insecure: "), lines


def test_health_addr_is_refused_where_nothing_would_bind_it(tmp_path: Path) -> None:
    """health_addr is only for health_port (metrics off): with metrics on, or with no health_port, it would be
    silently unused, so it is refused naming both keys; with health_port it is valid."""
    cfg = tmp_path / "h.toml"
    cfg.write_text('[coordinator]\nmetrics_port = 9100\nhealth_addr = "10.0.0.1"\n[node]\nhealth_addr = "::1"\n')
    lines = _errors(_cli("check", "--config", str(cfg)))
    assert any(line.startswith("coordinator.health_addr, coordinator.metrics_port: ") and "metrics_addr" in line
               for line in lines), lines
    assert any(line.startswith("node.health_addr, node.health_port: ") for line in lines), lines
    cfg.write_text('[node]\nhealth_port = 9813\nhealth_addr = "::1"\n')
    assert _cli("check", "--config", str(cfg)).returncode == 0


def test_an_empty_path_is_named_empty(tmp_path: Path) -> None:
    """``state_db = ""`` (file or env) is an empty key, not "``.`` is a folder"."""
    cfg = tmp_path / "e.toml"
    cfg.write_text('[coordinator]\nstate_db = ""\nallowed_prof_roots = ["/data", " "]\n')
    lines = _errors(_cli("check", "--config", str(cfg), env={"PROFWATCH_NODE__RUNTIME_DIR": ""}))
    assert len(lines) == 1 and lines[0].startswith(
        "node.runtime_dir, coordinator.state_db, coordinator.allowed_prof_roots: is empty"), lines
    assert "folder" not in "\n".join(lines)


def test_an_env_override_with_a_misspelled_section_is_refused_naming_it() -> None:
    lines = _errors(_cli("check", env={"PROFWATCH_COORDNATOR__WINDOW_STEPS": "50", "PROFWATCH_JOB_ID": "j1"}))
    assert len(lines) == 1 and lines[0].startswith("PROFWATCH_COORDNATOR__WINDOW_STEPS: no section 'coordnator'"), lines
    assert "coordinator" in lines[0]  # the sections it could have meant


def test_a_profwatch_variable_that_is_no_setting_is_warned_naming_the_two_underscore_form() -> None:
    """``PROFWATCH_WEBHOOK_URL`` (one underscore) is ignored by pydantic-settings: a warning names it and the
    ``__`` form; the hook's own variables, ``PROFWATCH_CONFIG`` and a whole-table override are not warned."""
    res = _cli("check", env={"PROFWATCH_WEBHOOK_URL": "https://x", "PROFWATCH_TYPO": "1", "PROFWATCH_JOB_ID": "j1",
                             "PROFWATCH_RUNTIME_DIR": "/run/p", "PROFWATCH_POLL_INTERVAL_S": "2",
                             "PROFWATCH_ARMING": "{}"})
    assert res.returncode == 0 and res.stdout.strip().endswith(": valid"), res.stdout + res.stderr
    warned = [line for line in res.stderr.splitlines() if "PROFWATCH_" in line]
    assert len(warned) == 2, res.stderr
    assert "PROFWATCH_WEBHOOK_URL: not a profwatch setting" in warned[1] and "PROFWATCH_<SECTION>__<KEY>" in warned[1]
    assert "did you mean PROFWATCH_WEBHOOK__URL?" in warned[1], warned
    assert warned[0].startswith("environment: PROFWATCH_TYPO: ") and "did you mean" not in warned[0], warned


def test_the_hook_variables_list_names_every_profwatch_variable_the_hook_reads() -> None:
    """``rankhook.ENV_VARS`` (what the config warning leaves alone) holds each ``PROFWATCH_*`` name in rankhook/."""
    import re

    import rankhook

    names = set()
    for path in (REPO_ROOT / "rankhook").rglob("*.py"):
        names |= set(re.findall(r"PROFWATCH_[A-Z][A-Z0-9_]*[A-Z0-9]", path.read_text(encoding="utf-8")))
    assert names and names == set(rankhook.ENV_VARS), names ^ set(rankhook.ENV_VARS)


def test_check_of_a_huge_file_reads_only_the_cap(tmp_path: Path) -> None:
    """A 300 MB file (sparse: no disk used) is refused at the config cap with a clear error, never read whole
    (it was read whole: 657 MB RSS; the bounded read, adapters/fs/bounded_read.py, since dd7c274)."""
    big = tmp_path / "huge.toml"
    with big.open("wb") as f:
        f.truncate(300 * 2**20)
    lines = _errors(_cli("check", "--config", str(big)))
    assert len(lines) == 1 and "over the 1048576-byte cap" in lines[0] and "not read" in lines[0], lines


def test_the_projects_own_ci_and_test_variables_are_never_warned_about() -> None:
    """``.ci/run`` exports ``PROFWATCH_REQUIRE_REAL_TOOLS`` for the whole suite: warned about, it put a line on
    every command's stderr and failed the config tests under CI. Every ``PROFWATCH_*`` name in ``.ci/`` and the
    tests' conftest files is a setting, the hook's, or :data:`profwatch.config.TOOLING_ENV_VARS`."""
    import re

    from profwatch.config import unknown_env_variables

    files = [p for p in (REPO_ROOT / ".ci").iterdir() if p.is_file()] + list((REPO_ROOT / "tests").rglob("conftest.py"))
    names = set()
    for path in files:
        names |= {n for n in re.findall(r"PROFWATCH_[A-Z][A-Z0-9_]*[A-Z0-9]", path.read_text(encoding="utf-8"))
                  if "__" not in n}
    assert "PROFWATCH_REQUIRE_REAL_TOOLS" in names
    assert unknown_env_variables(dict.fromkeys(names, "1")) == []


def test_the_readme_by_hand_config_is_valid_in_a_folder_of_its_own(tmp_path: Path) -> None:
    """The README's by-hand block, up to the config it writes, run as written (bash, its ``mktemp -d`` under this
    test's TMPDIR, its free ports): ``profwatch config check`` says valid, and nothing names ``/tmp/pw``."""
    import re

    readme = (REPO_ROOT / "README.md").read_text()
    block = next(b for b in re.findall(r"```bash\n(.*?)```", readme, flags=re.S) if "profwatch coordinator" in b)
    setup = block[:block.index("profwatch coordinator")]  # the folder, the ports, the config and its export
    script = setup + f'{PYTHON} -m profwatch.cli config check && cat "$PROFWATCH_CONFIG"\n'
    env = python_env({"TMPDIR": str(tmp_path), "PATH": f"{Path(PYTHON).parent}:/usr/bin:/bin"})
    env = {k: v for k, v in env.items() if k != "PROFWATCH_CONFIG" and not (k.startswith("PROFWATCH_") and "__" in k)}
    res = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and ": valid" in res.stdout, res.stdout + res.stderr
    assert f'state_db = "{tmp_path}/' in res.stdout and "/tmp/pw" not in res.stdout
    ports = re.findall(r'tcp://127\.0\.0\.1:(\d+)"', res.stdout)
    assert len(ports) == 4 and len(set(ports[:3])) == 3 and ports[3] == ports[0], ports  # node -> ingest


def test_a_work_dir_under_a_file_is_an_error_of_check_as_it_is_of_the_coordinators_start(tmp_path: Path) -> None:
    """``config check`` said "valid" for a work_dir the coordinator then refused at start (a file on its way)."""
    afile = tmp_path / "afile"
    afile.write_text("x")
    cfg = tmp_path / "wd.toml"
    cfg.write_text(f'[coordinator]\nwork_dir = "{afile / "work"}"\nstate_db = "{tmp_path / "s.db"}"\n')
    res = _cli("check", "--config", str(cfg))
    assert res.returncode == 2 and f"coordinator.work_dir: {afile / 'work'}: {afile} is not a folder" in res.stderr, \
        res.stdout + res.stderr
    cfg.write_text(f'[coordinator]\nwork_dir = "{tmp_path / "new" / "work"}"\nstate_db = "{tmp_path / "s.db"}"\n')
    res = _cli("check", "--config", str(cfg))
    assert res.returncode == 0, res.stdout + res.stderr  # not there yet, creatable: the coordinator creates it
