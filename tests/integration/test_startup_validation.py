"""Issue 33 #6: a coordinator that cannot start says so in one line and exits 2, never a silent hang (systemd
would wait for its start timeout): two sockets on one endpoint, an endpoint another process holds, a state_db that
is a FIFO. Real ``profwatch coordinator`` processes, each with a 60 s bound."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.live_stack import free_port

REPO = Path(__file__).resolve().parents[2]


def _start(tmp: Path, **over: str) -> subprocess.CompletedProcess[str]:
    ports = {k: free_port() for k in ("ingest", "control", "pub", "metrics")}
    keys = {"ingest_bind": f"tcp://127.0.0.1:{ports['ingest']}", "control_bind": f"tcp://127.0.0.1:{ports['control']}",
            "pub_bind": f"tcp://127.0.0.1:{ports['pub']}", "state_db": str(tmp / "state.db"),
            "work_dir": str(tmp / "w")} | over
    cfg = tmp / "c.toml"
    cfg.write_text("[coordinator]\n" + "".join(f'{k} = "{v}"\n' for k, v in keys.items())
                   + f"metrics_port = {ports['metrics']}\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "daemon"), str(REPO)]))
    return subprocess.run([sys.executable, "-m", "profwatch.cli", "coordinator", "--config", str(cfg)], env=env,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("scheme", ["tcp", "ipc"])
def test_two_sockets_on_one_endpoint_exit_2_naming_both(short_tmp: Path, scheme: str) -> None:
    ep = f"tcp://127.0.0.1:{free_port()}" if scheme == "tcp" else f"ipc://{short_tmp}/one.sock"
    res = _start(short_tmp, ingest_bind=ep, control_bind=ep)
    assert res.returncode == 2, res.stderr[-800:]
    assert f"coordinator.control_bind {ep} is the endpoint of coordinator.ingest_bind" in res.stderr + res.stdout


def test_an_endpoint_held_by_another_process_exits_2_naming_it(short_tmp: Path) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        ep = f"tcp://127.0.0.1:{held.getsockname()[1]}"
        res = _start(short_tmp, control_bind=ep)
    out = res.stderr + res.stdout
    assert res.returncode == 2 and f"coordinator.control_bind {ep}: cannot bind" in out, out[-800:]
    assert len([x for x in res.stderr.splitlines() if "cannot start" in x]) == 1


def test_a_state_db_that_is_a_fifo_exits_2_at_once(short_tmp: Path) -> None:
    fifo = short_tmp / "state.db"
    os.mkfifo(fifo)
    res = _start(short_tmp)
    assert res.returncode == 2 and f"state_db {fifo} is a FIFO" in res.stderr, res.stderr[-800:]


def test_ephemeral_ports_never_clash() -> None:
    from profwatch.config import CoordinatorSettings

    s = CoordinatorSettings(ingest_bind="tcp://127.0.0.1:0", control_bind="tcp://127.0.0.1:0",
                            pub_bind="tcp://127.0.0.1:*")
    assert s.binds()["control"] == "tcp://127.0.0.1:0"
    with pytest.raises(ValueError, match="is the endpoint of coordinator.ingest_bind"):
        CoordinatorSettings(ingest_bind="tcp://*:7711", control_bind="tcp://127.0.0.1:7711")
