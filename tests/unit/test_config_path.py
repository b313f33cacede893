"""Which config file a command reads (issue 24 item 8): subcommand --config, then the group's --config, then
PROFWATCH_CONFIG (empty: none), then /etc/profwatch/profwatch.toml when it exists, then built-in defaults; real
click parsing of `profwatch --config FILE status`."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from profwatch.cli import cli
from profwatch.commands import common
from profwatch.commands.common import config_path_for
from profwatch.simulate.launcher import free_port


def test_precedence(tmp_path: Path) -> None:
    default = tmp_path / "etc.toml"
    sub, group, env = Path("sub.toml"), Path("group.toml"), "env.toml"
    assert config_path_for(sub, group, {"PROFWATCH_CONFIG": env}, default) == sub
    assert config_path_for(None, group, {"PROFWATCH_CONFIG": env}, default) == group
    assert config_path_for(None, None, {"PROFWATCH_CONFIG": env}, default) == Path(env)
    assert config_path_for(None, None, {}, default) is None  # the default file does not exist
    default.write_text("")
    assert config_path_for(None, None, {}, default) == default
    assert config_path_for(None, None, {"PROFWATCH_CONFIG": ""}, default) is None  # set but empty: no file




def _cfg(path: Path, port: int) -> Path:
    path.write_text(f'[coordinator]\ncontrol_bind = "tcp://127.0.0.1:{port}"\n')
    return path


@pytest.mark.parametrize("where", ["group", "subcommand", "env", "default"])
def test_the_cli_reads_the_file_each_way(where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`status` against a control port nothing listens on: the refusal names the endpoint of the file it read."""
    port = free_port()
    cfg = _cfg(tmp_path / "p.toml", port)
    other = _cfg(tmp_path / "other.toml", free_port())
    monkeypatch.setattr(common, "DEFAULT_CONFIG_PATH", other if where != "default" else cfg)
    args = {"group": ["--config", str(cfg), "status"], "subcommand": ["status", "--config", str(cfg)],
            "env": ["status"], "default": ["status"]}[where]
    if where == "env":
        monkeypatch.setenv("PROFWATCH_CONFIG", str(cfg))
    else:
        monkeypatch.delenv("PROFWATCH_CONFIG", raising=False)
    res = CliRunner().invoke(cli, args)
    assert f"127.0.0.1:{port}" in res.output, res.output
    # the subcommand's flag beats the group's
    res = CliRunner().invoke(cli, ["--config", str(other), "status", "--config", str(cfg)])
    assert f"127.0.0.1:{port}" in res.output, res.output


def test_tests_never_read_the_host_default(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[coordinator]\nno_such_key = 1\n")
    monkeypatch.setattr(common, "DEFAULT_CONFIG_PATH", bad)  # as if the host had a broken /etc file
    res = CliRunner().invoke(cli, ["status"])  # conftest: PROFWATCH_CONFIG="" -> no file at all
    assert "no_such_key" not in res.output


@pytest.mark.parametrize(("key", "endpoint", "args"), [
    ("control_bind", "tcp://*:{port}", ["status"]),
    ("control_bind", "tcp://127.0.0.1:*", ["arm", "--job", "j", "--in-steps", "5"]),
    ("control_bind", "tcp://127.0.0.1:0", ["status"]),
    ("pub_bind", "tcp://*:{port}", ["alerts", "--follow"]),
])
def test_a_bind_only_endpoint_is_a_clear_usage_error_not_a_traceback(
        key: str, endpoint: str, args: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The coordinator may bind ``tcp://*:PORT`` or a port ZeroMQ picks (``:*``, ``:0``); the CLI connects to the
    same key and ZeroMQ refused it with ``Invalid argument``, a traceback (``:0`` read "nothing is listening", as
    if the coordinator were down). Now exit 2 naming the key, why and the fix."""
    ep = endpoint.format(port=free_port())
    cfg = tmp_path / "p.toml"
    cfg.write_text(f'[coordinator]\n{key} = "{ep}"\nstate_db = "{tmp_path}/s.db"\n[security]\ninsecure = true\n')
    monkeypatch.setenv("PROFWATCH_CONFIG", str(cfg))
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 2, (res.output, res.exception)
    assert f"the CLI cannot connect to [coordinator] {key}: {ep!r}" in res.output, res.output
    assert "tcp://0.0.0.0:PORT rather than tcp://*:PORT" in res.output and "Traceback" not in res.output


def test_free_port_never_hands_out_a_port_twice() -> None:
    """Test configs take three ports in a row; the kernel may give back the port it just released, and CI once got
    pub_bind == control_bind from two calls. 300 calls: 300 distinct ports, each bindable when handed out."""
    import socket

    ports = [free_port() for _ in range(300)]
    assert len(set(ports)) == 300
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports[-1]))
