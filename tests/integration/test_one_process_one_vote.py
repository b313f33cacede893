"""One process is one vote for a new generation, live: real node daemon, real ipc sockets, real processes. Four
rank processes said hello and stepped; then one other process, with no hello, sends step counters going back for
two ranks (a quorum of 4 is 2). Before wire version 2 those reports were credited to the two ranks' hello
processes and opened a generation; the node now stamps each report with its sender's attested pid."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from rankhook import wire
from tests.conftest import wait_for
from tests.integration.live_stack import Stack, hello, job_view, rank_view, step

RANK = textwrap.dedent("""
    import sys, time, zmq
    ctx = zmq.Context()
    s = ctx.socket(zmq.PUSH)
    s.setsockopt(zmq.LINGER, 2000)
    s.connect(sys.argv[1])
    for payload in sys.argv[2:]:
        s.send_multipart([b"t", payload.encode()])
    s.close()
    ctx.term()
""")


def _as_process(endpoint: str, *msgs: object) -> None:
    """Send ``msgs`` from a process of their own (its pid is what the node attests)."""
    subprocess.run([sys.executable, "-c", RANK, endpoint, *(wire.encode(m).decode() for m in msgs)], check=True,
                   timeout=60)


def test_one_process_moving_two_counters_back_opens_no_generation(short_tmp: Path) -> None:
    st = Stack(short_tmp)
    st.start()
    try:
        st.node("n0")
        ep = f"ipc://{short_tmp}/n0.sock"
        wait_for(lambda: Path(f"{short_tmp}/n0.sock").exists(), 20)
        for r in range(4):
            _as_process(ep, hello("jv", r, world=4), *(step("jv", r, s) for s in range(1, 21)))
        wait_for(lambda: len(rank_view(st.control("status"), "jv")) == 4
                 and min(x["last_step"] for x in rank_view(st.control("status"), "jv").values()) == 20, 30)
        _as_process(ep, step("jv", 0, 1), step("jv", 1, 1))  # one process, no hello, two ranks back
        wait_for(lambda: {x["rank"]: x["last_step"] for x in job_view(st.control("status"), "jv")["ranks"]}
                 == {0: 1, 1: 1, 2: 20, 3: 20}, 30)
        assert job_view(st.control("status"), "jv")["generation"] == 0
        _as_process(ep, step("jv", 2, 1))  # a second process: the quorum
        wait_for(lambda: job_view(st.control("status"), "jv")["generation"] == 1, 30, what="the generation")
    finally:
        st.close()
