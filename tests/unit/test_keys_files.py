"""``profwatch keys`` writes its key files and drop-ins through a temp file of its own (mkstemp beside the target,
then ``os.replace``): a file or link already at the old fixed ``.<name>.tmp`` name, another writer's, is neither
written through nor renamed into place."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from click.testing import CliRunner

from profwatch.commands.keys import DROPIN_NAME, keys


def _run(*args: str) -> str:
    res = CliRunner().invoke(keys, list(args))
    assert res.exit_code == 0, res.output
    return res.output


def _plant(folder: Path, names: list[str], victim: Path) -> None:
    """A link at each old fixed temp name, to a file that must stay as it is (another writer's temp file)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / f".{name}.tmp").symlink_to(victim)


def _regular(path: Path, mode: int) -> None:
    st = os.lstat(path)
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == mode, (path, oct(st.st_mode))


def test_install_add_and_the_drop_in_never_write_through_a_file_at_the_old_temp_name(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    coord, node, units = tmp_path / "coord", tmp_path / "node", tmp_path / "units"
    units.mkdir()
    _run("init", "--dir", str(coord), "--no-systemd")
    _plant(coord / "clients", ["node7.key"], victim)
    _run("add", "node7", "--role", "node", "--dir", str(coord))
    _plant(node, ["client.key_secret", "server.key"], victim)
    _plant(units / "profwatch-node.service.d", [DROPIN_NAME], victim)
    _run("install", str(coord / "issued" / "node7.key_secret"), "--server-key", str(coord / "server.key"),
         "--dir", str(node), "--systemd-dir", str(units))
    assert victim.read_text() == "keep me"
    _regular(coord / "clients" / "node7.key", 0o644)
    _regular(node / "client.key_secret", 0o600)
    _regular(node / "server.key", 0o644)
    _regular(units / "profwatch-node.service.d" / DROPIN_NAME, 0o644)
    assert b"secret-key" in (node / "client.key_secret").read_bytes()
    assert (node / "server.key").read_bytes() == (coord / "server.key").read_bytes()
    assert "LoadCredential=client.key_secret:" in (units / "profwatch-node.service.d" / DROPIN_NAME).read_text()
    # nothing of ours is left beside them: only the planted links
    for folder in (coord / "clients", node, units / "profwatch-node.service.d"):
        assert all(not p.name.endswith(".tmp") or p.is_symlink() for p in folder.iterdir()), list(folder.iterdir())
