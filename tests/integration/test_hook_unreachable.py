"""Issue 33 #8: a training user not in the node socket's group got no telemetry and no message (ZeroMQ's connect
retries silently). The hook now says once on stderr why it cannot reach the node socket: permission (naming the
socket's group and the command to join it) or no socket at all. Real processes: a bound ``ipc://`` socket, and a
rank process run as another user (as root) or against a socket it may not write (as a user)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import zmq

REPO = Path(__file__).resolve().parents[2]
SENDS = """
import os, sys
import zmq, grp, pwd
from rankhook.publisher import Publisher
if sys.argv[2] == "nobody":  # imports first: the checkout need not be readable by nobody
    os.setgid(65534)
    os.setgroups([])
    os.setuid(65534)
p = Publisher(sys.argv[1])
for _ in range(3):
    p.send(b"profwatch.x", b"{}")
p.close()
"""


def _rank(endpoint: str, as_nobody: bool) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "daemon"), str(REPO)]))
    return subprocess.run([sys.executable, "-c", SENDS, endpoint, "nobody" if as_nobody else "me"], env=env,
                          capture_output=True, text=True, timeout=60)


def test_the_hook_says_once_why_it_cannot_reach_the_node_socket(short_tmp: Path) -> None:
    short_tmp.chmod(0o755)
    sock_path = short_tmp / "node.sock"
    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    pull.setsockopt(zmq.LINGER, 0)
    pull.bind(f"ipc://{sock_path}")
    try:
        os.chmod(sock_path, 0o660 if os.getuid() == 0 else 0o000)
        res = _rank(f"ipc://{sock_path}", as_nobody=os.getuid() == 0)
        lines = [x for x in res.stderr.splitlines() if "rankhook:" in x]
        assert res.returncode == 0 and len(lines) == 1, res.stderr
        group = __import__("grp").getgrgid(sock_path.stat().st_gid).gr_name
        assert "permission denied" in lines[0] and f"group {group!r}" in lines[0] and f"usermod -aG {group}" in lines[0]
    finally:
        pull.close(0)
        ctx.term()
    res = _rank(f"ipc://{short_tmp}/gone.sock", as_nobody=False)
    lines = [x for x in res.stderr.splitlines() if "rankhook:" in x]
    assert len(lines) == 1 and "does not exist" in lines[0], res.stderr
