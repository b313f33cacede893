"""A capture backend that fails to open is reported as such: the hello says ``backend="none"`` with the failure,
and ``status`` (the registry snapshot) shows the backend in use, not the requested one (real ZeroMQ socket)."""

from __future__ import annotations

from pathlib import Path

import zmq

import rankhook
from profwatch.core.fleet.registry import Registry
from profwatch.core.messages import parse_rank_message
from tests.conftest import wait_for


def test_a_backend_that_fails_to_open_is_reported_with_its_failure(short_tmp: Path) -> None:
    ep = f"ipc://{short_tmp}/node.sock"
    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    pull.setsockopt(zmq.LINGER, 0)
    pull.bind(ep)
    hellos = []

    def hello_without_backend() -> bool:
        while pull.poll(0):
            msg = parse_rank_message(pull.recv_multipart()[1])  # what a node daemon accepts
            if msg.kind == "hello":
                hellos.append(msg)
        return any(h.backend == "none" for h in hellos)

    cfg = short_tmp / "cfg"
    cfg.mkdir()
    try:
        # torch_npu is not installed here (it must never be, see the README): its backend cannot open
        hook = rankhook.init("jb", backend="torch_npu", profiler_config_path=str(cfg), endpoint=ep, rank=0,
                             world_size=2)
        assert hook is not None and hook.backend.name == "none"
        wait_for(hello_without_backend, 20, what="a hello with the backend in use")
    finally:
        rankhook.shutdown()
        pull.close()
        ctx.term()
    assert hellos[0].backend == "torch_npu"  # what was asked, sent before the backend opened
    last = hellos[-1]
    assert last.backend == "none" and last.backend_error.startswith("torch_npu failed to open:")
    reg = Registry()
    for h in hellos:
        reg.hello(h, "n1", 1.0)
    job = reg.snapshot(2.0)["jobs"][0]
    assert job["backend"] == "none"
    assert job["backend_errors"] == {"0": last.backend_error}
    assert job["ranks"][0]["backend"] == "none"
