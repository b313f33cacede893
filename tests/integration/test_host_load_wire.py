"""The host's CPU load travels from a real node daemon to the coordinator in its heartbeats, over real ZeroMQ
sockets (daemon/profwatch/adapters/host_load.py -> rankhook/wire.py NodeHeartbeat -> core/fleet/host_load.py): the
coordinator keeps it per node and ``status`` shows it; a kernel without PSI is said so; an older node daemon's
heartbeat without the fields keeps working; a heartbeat with an impossible figure is refused and counted."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from profwatch.adapters.host_load import HostLoadSampler
from profwatch.core.status_text import render_nodes
from rankhook import wire
from tests.conftest import wait_for
from tests.integration.live_stack import Stack

PSI = "some avg10=42.50 avg60=40.00 avg300=10.00 total=1000\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"


def _proc(root: Path, running: int, psi: str | None) -> Path:
    root.mkdir()
    (root / "stat").write_text(f"cpu  1 2 3\nprocs_running {running}\nprocs_blocked 0\n")
    if psi is not None:
        (root / "pressure").mkdir()
        (root / "pressure" / "cpu").write_text(psi)
    return root


def _node(st: Stack, node_id: str) -> dict[str, Any] | None:
    return next((n for n in st.control("status").get("nodes", []) if n["node_id"] == node_id), None)


def test_host_load_reaches_the_coordinator_and_a_kernel_without_psi_is_said_so(short_tmp: Path) -> None:
    st = Stack(short_tmp)
    try:
        st.start()
        st.node("np", host_load=HostLoadSampler(_proc(short_tmp / "p1", running=9, psi=PSI), cores=4))
        st.node("nn", host_load=HostLoadSampler(_proc(short_tmp / "p2", running=3, psi=None), cores=2))
        with_psi = wait_for(lambda: (n := _node(st, "np")) and n["host_load"]["samples"] >= 2 and n, 30,
                            what="node np's host load")
        assert with_psi["host_load"]["runnable_per_core"] == 2.0  # (9 - the sampler) / 4 cores
        assert with_psi["host_load"]["cpu_psi_some_pct"] == 42.5 and with_psi["host_load"]["psi_available"] is True
        no_psi = wait_for(lambda: (n := _node(st, "nn")) and n["host_load"]["samples"] >= 2 and n, 30,
                          what="node nn's host load")
        assert no_psi["host_load"]["runnable_per_core"] == 1.0
        assert no_psi["host_load"]["cpu_psi_some_pct"] is None and no_psi["host_load"]["psi_available"] is False
        text = "\n".join(render_nodes([with_psi, no_psi], None))
        assert "host load: 2.00 runnable tasks per core; CPU pressure (PSI some avg10) 42.5 %" in text
        assert "CPU pressure: no PSI on this kernel" in text
    finally:
        st.close()


def test_an_older_heartbeat_keeps_working_and_an_impossible_figure_is_refused(short_tmp: Path) -> None:
    st = Stack(short_tmp)
    try:
        coord = st.start()
        dealer = st.dealer()
        old = {"kind": "node_heartbeat", "v": 2, "node_id": "old", "hostname": "old", "pid": 7,
               "ts_unix_s": 1.7e9, "started_unix_s": 1.7e9, "counters": {}}
        dealer.send(json.dumps(old).encode())  # a node daemon from before the host-load fields
        seen = wait_for(lambda: _node(st, "old"), 20, what="the older node's heartbeat")
        assert seen["host_load"]["runnable_per_core"] is None and seen["host_load"]["samples"] == 0
        for bad in ({"cpu_psi_some_pct": 250.0}, {"runnable_per_core": -3.0}, {"runnable_per_core": 1e9}):
            dealer.send(json.dumps({**old, **bad}).encode())
        wait_for(lambda: coord.metrics.registry.get_sample_value(
            "profwatch_rejected_total", {"reason": "bad_value"}) == 3, 20, what="three refused heartbeats")
        dealer.send(wire.encode(wire.NodeHeartbeat(node_id="old", hostname="old", pid=7, ts_unix_s=1.7e9,
                                                   started_unix_s=1.7e9, runnable_per_core=0.5,
                                                   cpu_psi_some_pct=3.0)))
        after = wait_for(lambda: (n := _node(st, "old")) and n["host_load"]["samples"] == 1 and n, 20,
                         what="the good heartbeat after the refused ones")
        assert after["host_load"]["runnable_per_core"] == 0.5 and after["host_load"]["cpu_psi_some_pct"] == 3.0
    finally:
        st.close()
