"""Registry bounds (pure, fake clock): pinned paths, ranks bound to their node, caps on jobs/ranks/nodes, lazy
rank records, expiry."""

from __future__ import annotations

import dataclasses

import pytest

from profwatch.core.fleet.limits import LimitSettings
from profwatch.core.fleet.registry import Registry, RegistryError
from rankhook import wire


def hello(rank: int = 0, job: str = "j", world: int = 4, cfg: str | None = "/cfg/j", prof: str | None = "/prof") -> wire.RankHello:
    return wire.RankHello(job_id=job, rank=rank, local_rank=rank, world_size=world, hostname="h", pid=100 + rank,
                          backend="torch", ts_unix_s=1.0, profiler_config_path=cfg, prof_root=prof)


def step(rank: int, s: int, job: str = "j") -> wire.StepReport:
    return wire.StepReport(job_id=job, rank=rank, step=s, step_time_s=0.1, ts_unix_s=10.0 + s)


@pytest.mark.parametrize(("cfg", "prof"), [("/evil/cfg", "/prof"), ("/cfg/j", "/evil"), (None, "/prof"),
                                           ("/cfg/j", None), (None, None)])
def test_paths_are_pinned_at_the_first_hello(cfg: str | None, prof: str | None) -> None:
    reg = Registry()
    reg.hello(hello(0), "n0", 1.0)
    with pytest.raises(RegistryError) as ei:
        reg.hello(hello(1, cfg=cfg, prof=prof), "n0", 2.0)
    assert ei.value.reason == "job_id_collision"  # rank 0 is alive: another job with this id
    job = reg.jobs["j"]
    assert (job.profiler_config_path, job.prof_root) == ("/cfg/j", "/prof") and set(job.ranks) == {0}
    reg.hello(hello(1), "n0", 2.0)  # the same paths: fine
    assert set(job.ranks) == {0, 1}


def test_other_paths_with_every_rank_gone_open_a_new_run_only_under_the_jobs_uid() -> None:
    """Not a collision: the rule for a new run decides (``docs/generations.md``). A new process of the job's uid
    re-pins the paths; another uid, or an old process speaking again, is refused as ``paths_changed``."""
    reg = Registry()
    reg.hello(dataclasses.replace(hello(0), peer_uid=1000, peer_pid=500), "n0", 1.0)
    gone = 1.0 + reg.limits.rank_rebind_after_s + 1
    for other in (dataclasses.replace(hello(1, cfg="/other"), peer_uid=1001, peer_pid=600),  # another user
                  dataclasses.replace(hello(0, cfg="/other"), peer_uid=1000, peer_pid=500)):  # the old process
        with pytest.raises(RegistryError) as ei:
            reg.hello(other, "n0", gone)
        assert ei.value.reason == "paths_changed"
    out = reg.admit_hello(dataclasses.replace(hello(1, cfg="/other"), peer_uid=1000, peer_pid=600), "n0", gone)
    assert out.opened is not None and out.opened.reason == "every_rank_gone"
    job = reg.jobs["j"]
    assert (job.pinned_paths, set(job.ranks), job.generation) == (("/other", "/prof"), {1}, 1)


def test_steps_of_unknown_ranks_from_a_node_where_the_id_collided_are_refused() -> None:
    reg = Registry()
    reg.hello(hello(0), "n0", 1.0)
    with pytest.raises(RegistryError):
        reg.hello(hello(1, cfg="/other"), "n1", 2.0)
    with pytest.raises(RegistryError) as ei:
        reg.step(step(1, 5), 3.0, "n1")
    assert ei.value.reason == "job_id_collision" and set(reg.jobs["j"].ranks) == {0}
    reg.step(step(0, 5), 3.0, "n0")  # the first job goes on


def test_restored_job_keeps_its_pins_and_an_unpinned_one_takes_the_next_hello() -> None:
    reg = Registry()
    reg.hello(hello(0), "n0", 1.0)
    job = reg.jobs.pop("j")
    fresh = Registry()
    job.pinned_paths = None
    fresh.restore(job)  # as read back from the state store: pinned from its stored paths
    with pytest.raises(RegistryError):
        fresh.hello(hello(1, cfg="/evil"), "n0", 2.0)
    job2 = dataclasses.replace(job, job_id="k", profiler_config_path=None, prof_root=None, pinned_paths=None, ranks={})
    fresh.restore(job2)
    fresh.hello(hello(0, job="k", cfg="/cfg/k"), "n0", 3.0)
    assert fresh.jobs["k"].pinned_paths == ("/cfg/k", "/prof")


def test_a_rank_belongs_to_its_node() -> None:
    reg = Registry(limits=LimitSettings(rank_rebind_after_s=30))
    reg.hello(hello(0), "nodeA", 100.0)
    reg.step(step(0, 1), 101.0, "nodeA")
    for call in (lambda: reg.step(step(0, 2), 102.0, "nodeB"),
                 lambda: reg.bye(wire.RankBye(job_id="j", rank=0, step=2, ts_unix_s=1.0), 102.0, "nodeB"),
                 lambda: reg.hello(hello(0), "nodeB", 102.0)):
        with pytest.raises(RegistryError) as ei:
            call()
        assert ei.value.reason == "rank_on_other_node"
    r = reg.jobs["j"].ranks[0]
    assert r.node_id == "nodeA" and r.last_step == 1 and not r.left
    reg.hello(hello(1), "nodeB", 102.0)  # another rank of the job on another node is fine
    reg.hello(hello(0), "nodeB", 131.5)  # silent for longer than rank_rebind_after_s: the job moved
    assert reg.jobs["j"].ranks[0].node_id == "nodeB"


def test_a_huge_world_size_costs_one_record_until_ranks_report() -> None:
    reg = Registry()
    reg.hello(hello(0, world=1 << 20), "n0", 1.0)
    assert reg.rank_count == 1 and len(reg.jobs["j"].ranks) == 1
    reg.step(step(5, 1), 2.0, "n0")
    assert reg.rank_count == 2


def test_caps() -> None:
    reg = Registry(limits=LimitSettings(max_jobs_total=3, max_jobs_per_node=2, max_ranks_total=5, max_nodes=2))
    reg.hello(hello(0, job="a"), "n0", 1.0)
    reg.hello(hello(0, job="b"), "n0", 1.0)
    with pytest.raises(RegistryError) as ei:
        reg.hello(hello(0, job="c"), "n0", 1.0)
    assert ei.value.reason == "too_many_jobs_on_node" and "c" not in reg.jobs
    reg.hello(hello(0, job="c"), "n1", 1.0)
    with pytest.raises(RegistryError) as ei:
        reg.hello(hello(0, job="d"), "n2", 1.0)
    assert ei.value.reason == "too_many_jobs"
    reg.hello(hello(1, job="c"), "n1", 1.0)
    reg.step(step(2, 1, job="c"), 1.0, "n1")
    with pytest.raises(RegistryError) as ei:
        reg.step(step(3, 1, job="c"), 1.0, "n1")
    assert ei.value.reason == "too_many_ranks" and reg.rank_count == 5
    reg.touch_node("n0", "h", 1.0)
    reg.touch_node("n1", "h", 1.0)
    with pytest.raises(RegistryError) as ei:
        reg.touch_node("n2", "h", 1.0)
    assert ei.value.reason == "too_many_nodes"


def test_silent_jobs_expire_and_free_their_slots() -> None:
    reg = Registry(limits=LimitSettings(job_expiry_s=60, max_jobs_per_node=1))
    reg.touch_node("n0", "h", 0.0)
    reg.hello(hello(0, job="old"), "n0", 0.0)
    reg.hello(hello(0, job="live", cfg=None), "n1", 0.0)
    reg.step(step(0, 1, job="live"), 50.0, "n1")
    assert reg.expire(59.0) == []
    assert reg.expire(61.0) == ["old"]
    assert set(reg.jobs) == {"live"} and reg.rank_count == 1 and "n0" not in reg.nodes
    reg.hello(hello(0, job="new"), "n0", 62.0)  # the node's job slot is free again
    assert reg.expire(200.0) == ["live", "new"] and reg.rank_count == 0


def test_ranks_per_node_are_capped_so_one_node_cannot_take_every_slot() -> None:
    reg = Registry(limits=LimitSettings(max_ranks_per_node=3, max_ranks_total=10))
    reg.hello(hello(0, world=1 << 20), "greedy", 1.0)
    reg.step(step(1, 1), 1.0, "greedy")
    reg.step(step(2, 1), 1.0, "greedy")
    with pytest.raises(RegistryError) as ei:
        reg.step(step(3, 1), 1.0, "greedy")
    assert ei.value.reason == "too_many_ranks_on_node"
    reg.hello(hello(0, job="other"), "honest", 1.0)  # other nodes still have room
    assert reg.rank_count == 4
    assert reg.expire(1e9) == ["j", "other"] and reg.rank_count == 0
    reg.hello(hello(0, world=1 << 20), "greedy", 2e9)  # the node's slots came back with the expiry


def test_a_refused_hello_leaves_no_empty_job_behind() -> None:
    reg = Registry(limits=LimitSettings(max_ranks_per_node=1))
    reg.hello(hello(0, job="a"), "n0", 1.0)
    with pytest.raises(RegistryError) as ei:
        reg.hello(hello(0, job="b"), "n0", 1.0)
    assert ei.value.reason == "too_many_ranks_on_node" and set(reg.jobs) == {"a"}
