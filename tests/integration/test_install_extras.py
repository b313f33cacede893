"""Every command on every install (hook only, node only) says which extra it needs and exits 2, never a traceback
(issue 35, finding 5: the coordinator on a node-only install died with ``ModuleNotFoundError: tenacity``, exit 1,
which systemd's transient class restarted five times).

The installs are made real by an import blocker placed first on ``sys.meta_path`` of a child ``profwatch``
process: the modules of the extras the install lacks cannot be imported, exactly as in a venv without them
(``importlib`` raises the same ModuleNotFoundError with the same ``name``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import click
import pytest

from profwatch.cli import cli
from profwatch.console import EXTRA_OF_MODULE, missing_extra_message
from tests.conftest import PYTHON, python_env

_RUN = """
import sys
BLOCK = set(sys.argv[1].split(","))
class Blocker:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name.split(".")[0] in BLOCK:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, Blocker)
sys.argv = ["profwatch", *sys.argv[2:]]
from profwatch.console import main
main()
"""

NOT_ON_NODE = sorted(m for m, e in EXTRA_OF_MODULE.items() if e != "node")
NOT_ON_HOOK = sorted(m for m in EXTRA_OF_MODULE if m != "zmq")


def _profwatch(block: list[str], args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PYTHON, "-c", _RUN, ",".join(block), *args], env=python_env(), cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def _config(tmp_path: Path) -> Path:
    cfg = tmp_path / "pw.toml"
    cfg.write_text(f'[coordinator]\nstate_dir = "{tmp_path / "state"}"\n', encoding="utf-8")
    return cfg


@pytest.mark.parametrize(("args", "extra"), [
    (["coordinator"], "daemon"),
    (["analyze", "."], "daemon"),
    (["replay", "x.jsonl"], "daemon"),
    (["replay", "--help"], "daemon"),
    (["demo"], "torch"),
])
def test_a_node_only_install_names_the_extra_and_exits_2(tmp_path: Path, args: list[str], extra: str) -> None:
    res = _profwatch(NOT_ON_NODE, [*args[:1], *(["--config", str(_config(tmp_path))] if args == ["coordinator"]
                                                else []), *args[1:]], tmp_path)
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr + res.stdout
    assert f"profwatch {args[0]}: needs the '{extra}' extra" in res.stderr
    assert f"pip install 'profwatch[{extra}]'" in res.stderr


def test_every_command_on_a_hook_only_install_names_the_node_extra(tmp_path: Path) -> None:
    commands = cli.list_commands(click.Context(cli))
    assert {"coordinator", "node", "status", "arm"} <= set(commands)
    for name in commands:
        res = _profwatch(NOT_ON_HOOK, [name], tmp_path)
        assert res.returncode == 2, (name, res.stderr)
        assert "Traceback" not in res.stderr and "pip install 'profwatch[node]'" in res.stderr, (name, res.stderr)


def test_on_an_older_python_the_message_names_the_version_the_daemon_extras_need(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import profwatch.console as console

    exc = ModuleNotFoundError("No module named 'tenacity'", name="tenacity")
    assert "needs Python" not in (missing_extra_message("coordinator", exc) or "")
    monkeypatch.setattr(console, "DAEMON_PYTHON", (sys.version_info[0], sys.version_info[1] + 1))
    text = console.missing_extra_message("coordinator", exc) or ""
    assert f"the 'daemon' extra needs Python {sys.version_info[0]}.{sys.version_info[1] + 1} or newer" in text
    assert missing_extra_message("x", ModuleNotFoundError("No module named 'nope'", name="nope")) is None


def test_the_daemon_extras_carry_the_python_marker_and_the_hook_and_node_extras_do_not() -> None:
    from packaging.requirements import Requirement

    from tests.integration.test_packaging import PYPROJECT

    extras = PYPROJECT["project"]["optional-dependencies"]
    for name in ("daemon", "coordinator"):
        for req in extras[name]:
            r = Requirement(req)
            if r.name != "profwatch":
                assert r.marker is not None and "3.11" in str(r.marker), (name, req)
                assert not r.marker.evaluate({"python_version": "3.10"}) and r.marker.evaluate({"python_version": "3.11"})
    for name in ("hook", "node"):  # nothing of theirs is left out on 3.10 (tomli is added there)
        for req in extras[name]:
            marker = Requirement(req).marker
            assert marker is None or marker.evaluate({"python_version": "3.10"}), (name, req)
