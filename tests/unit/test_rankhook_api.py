"""rankhook without a node daemon: never raises, never blocks; endpoint checks; identity from env."""

from __future__ import annotations

import os

import pytest

import rankhook
from rankhook.identity import job_id_from_env, resolve_identity
from rankhook.publisher import EndpointError, Publisher, check_endpoint, default_endpoint


def test_api_is_safe_before_init() -> None:
    rankhook.step()
    with rankhook.stage("forward"):
        pass
    rankhook.flag_step("checkpoint")
    rankhook.shutdown()
    assert rankhook.current() is None


def test_ipc_path_length_is_checked() -> None:
    with pytest.raises(EndpointError, match="107"):
        check_endpoint("ipc:///" + "x" * 200)
    with pytest.raises(EndpointError):
        check_endpoint("udp://1.2.3.4:5")
    assert check_endpoint("tcp://127.0.0.1:5555")


def test_default_endpoint_from_env() -> None:
    assert default_endpoint({"PROFWATCH_NODE_ENDPOINT": "tcp://127.0.0.1:1"}) == "tcp://127.0.0.1:1"
    assert default_endpoint({"PROFWATCH_RUNTIME_DIR": "/tmp/rt/"}) == "ipc:///tmp/rt/node.sock"
    assert default_endpoint({}) == "ipc:///run/profwatch/node.sock"


def test_identity_from_env() -> None:
    env = {"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "TORCHELASTIC_RUN_ID": "none", "SLURM_JOB_ID": "77"}
    ident = resolve_identity(env=env)
    assert (ident.rank, ident.local_rank, ident.world_size, ident.job_id) == (5, 1, 8, "77")
    assert job_id_from_env({"PROFWATCH_JOB_ID": "mine", "SLURM_JOB_ID": "1"}) == "mine"
    assert resolve_identity(env={}).world_size == 1


def test_steps_with_daemon_down_drop_and_count(short_tmp) -> None:
    """Per-call cost (never blocking) is measured by bench/bench_step.py, not asserted here."""
    ep = f"ipc://{short_tmp}/absent.sock"
    hook = rankhook.init("unit-job", backend="none", endpoint=ep, rank=0, world_size=1)
    try:
        assert hook is not None
        for _ in range(30_000):  # beyond SNDHWM: drops, counted
            with rankhook.stage("forward"):
                pass
            rankhook.step()
        c = hook.publisher.counters
        assert c.sent + c.dropped == 30_001  # + the hello
        assert c.dropped > 0 and c.errors == 0
        assert hook.step_count == 30_000
    finally:
        rankhook.shutdown()
    assert rankhook.current() is None


def test_publisher_in_forked_child_uses_its_own_context(short_tmp) -> None:
    pub = Publisher(f"ipc://{short_tmp}/x.sock")
    assert pub.send(b"t", b"p")
    pid = os.fork()
    if pid == 0:  # child: must not touch the parent's socket; exits 0 only if the send worked
        ok = pub.send(b"t", b"child") and pub._pid == os.getpid()
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0
    assert pub.send(b"t", b"parent again")
    pub.close()


def test_bad_stage_names_are_made_safe_and_set_step_never_raises(short_tmp) -> None:
    hook = rankhook.init("unit-job2", backend="none", endpoint=f"ipc://{short_tmp}/x.sock", rank=0, world_size=1)
    try:
        with rankhook.stage("forward pass é/x" + "y" * 100):
            pass
        for i in range(40):
            with rankhook.stage(f"s{i}"):
                pass
        names = set(hook._stages)
        assert len(names) <= 32 and "other" in names
        from profwatch.core.messages import STAGE_NAME_RE

        assert all(STAGE_NAME_RE.match(n) for n in names)  # what the daemons accept
        for bad in ("abc", None, -3, 1.5e300):
            rankhook.set_step(bad)  # type: ignore[arg-type]
        assert hook.step_count == 0
        rankhook.set_step(41)
        assert hook.step_count == 41
    finally:
        rankhook.shutdown()
