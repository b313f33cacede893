"""One rule for a new run under the same job id (pure, fake clock; ``docs/generations.md``): every old rank gone,
or step counters going back on a quorum of distinct processes. A lone process opens nothing."""

from __future__ import annotations

import dataclasses

import pytest

from profwatch.core.fleet.generations import is_new_process, process_key
from profwatch.core.fleet.registry import GenerationPending, Registry, RegistryError
from rankhook import wire

CFG, PROF = "/cfg/j", "/prof"
UID = 1000


def hello(rank: int, world: int, pid: int, *, uid: int = UID, **kw: object) -> wire.RankHello:
    fields: dict = {"job_id": "j", "rank": rank, "local_rank": rank, "world_size": world, "hostname": "h", "pid": pid,
                    "backend": "torch", "ts_unix_s": 10.0, "profiler_config_path": CFG, "prof_root": PROF,
                    "peer_uid": uid, "peer_pid": pid}
    fields.update(kw)
    return wire.RankHello(**fields)


def step(rank: int, s: int) -> wire.StepReport:
    return wire.StepReport(job_id="j", rank=rank, step=s, step_time_s=0.1, ts_unix_s=100.0 + s)


def job_of(world: int = 4, nodes: int = 2, t: float = 1.0) -> Registry:
    """A registry with one job of ``world`` ranks (one process each, pid 1000 + rank) over ``nodes`` nodes, at step
    50; every rank last heard at ``t``."""
    reg = Registry(window_steps=100)
    per = world // nodes
    for r in range(world):
        reg.hello(hello(r, world, 1000 + r), f"n{r // per}", t)
        for s in range(1, 51):
            reg.step(step(r, s), t, f"n{r // per}")
    return reg


GONE = 1.0 + 31.0  # past rank_rebind_after_s (30 s) with 0.1 s steps: every old rank is silent long enough


def test_process_keys_prefer_the_attested_pid_and_match_either_pid() -> None:
    assert process_key("n0", 77, 5) == ("n0", 77) and process_key("n0", None, 5) == ("n0", 5)
    old = [("n0", 77, 5), ("n1", None, 9)]
    assert not is_new_process("n0", None, 77, old)  # a restored rank knows only one pid: still the same process
    assert not is_new_process("n1", 123, 9, old)
    assert is_new_process("n2", 77, 5, old)  # the same pid on another node is another process
    assert is_new_process("n0", 78, 6, old)


def test_a_lone_process_moving_several_counters_back_opens_nothing() -> None:
    """Found in issue 20: one process said hello for several ranks and sent steps going back for each; that opened a
    ``steps_went_back`` generation (two ranks are a quorum of 4). One process is one vote."""
    reg = job_of(4, 1)
    job = reg.jobs["j"]
    for r in range(4):  # the same shape and paths: ordinary hellos, all from process 4242
        reg.hello(hello(r, 4, 4242), "n0", 5.0)
    for r in range(4):
        _j, rank, restarted = reg.step(step(r, 1), 5.5, "n0")
        assert restarted and rank is not None
        assert reg.note_restart(job, rank, 5.5) is None
    assert job.generation == 0
    assert reg.snapshot(6.0)["jobs"][0]["pending_generations"][0]["agreeing_through_job_nodes"] == 1


def test_steps_going_back_on_a_quorum_of_distinct_processes_open_a_run() -> None:
    """A requeue at the same size on the same nodes (no restart count): new pids, steps from the checkpoint."""
    reg = job_of(4, 2)
    job = reg.jobs["j"]
    opened = []
    for r in (0, 2):
        node = f"n{r // 2}"
        reg.hello(hello(r, 4, 5000 + r), node, 5.0)
        _j, rank, restarted = reg.step(step(r, 1), 5.0, node)
        assert restarted and rank is not None
        opened.append(reg.note_restart(job, rank, 5.0))
    assert opened[0] is None and opened[1] is not None
    g = opened[1]
    assert (g.reason, g.ranks, g.nodes, job.generation) == ("steps_went_back", (0, 2), ("n0", "n1"), 1)


def test_every_old_rank_gone_opens_a_run_with_fewer_ranks_on_another_node() -> None:
    """The requeue of issue 20, item 5: 4 ranks on n0/n1 killed (no bye), 2 ranks come back on n5."""
    reg = job_of(4, 2)
    job = reg.jobs["j"]
    out = reg.admit_hello(hello(0, 2, 7000), "n5", GONE)
    g = out.opened
    assert g is not None and (g.reason, g.old_world_size, g.world_size, g.generation) == ("every_rank_gone", 4, 2, 1)
    assert (g.ranks, g.nodes, g.admitted) == ((0,), ("n5",), (0,))
    assert reg.admit_hello(hello(1, 2, 7001), "n5", GONE + 0.1).opened is None  # the run's next rank: a hello
    for r in (0, 1):
        _j, rank, restarted = reg.step(step(r, 1), GONE + 0.2, "n5")  # not rank_on_other_node
        assert rank is not None and rank.node_id == "n5" and rank.gen == 1 and not restarted
    assert (job.world_size, sorted(job.ranks)) == (2, [0, 1])
    assert reg.snapshot(GONE + 1)["jobs"][0]["pending_generations"] == []


def test_while_one_old_rank_is_alive_nothing_opens_and_held_hellos_join_the_run_later() -> None:
    reg = job_of(4, 2)
    job = reg.jobs["j"]
    for r in (0, 1, 2):
        reg.bye(wire.RankBye(job_id="j", rank=r, step=50, ts_unix_s=2.0), 2.0, f"n{r // 2}")
    reg.step(step(3, 51), 20.0, "n1")  # rank 3 is alive
    with pytest.raises(GenerationPending):  # the requeue's rank 1 on a new node: held, changes nothing
        reg.hello(hello(1, 2, 7001), "n5", 20.0)
    with pytest.raises(RegistryError) as ei:
        reg.step(step(0, 1), 20.0, "n5")
    assert ei.value.reason == "rank_on_other_node" and job.generation == 0
    out = reg.admit_hello(hello(0, 2, 7000), "n5", 20.0 + 31.0)  # rank 3 silent now: every old rank gone
    assert out.opened is not None and out.opened.admitted == (0, 1) and sorted(job.ranks) == [0, 1]


def test_a_bye_from_every_rank_lets_the_next_run_open_at_once() -> None:
    reg = job_of(2, 1)
    lasts = [reg.bye(wire.RankBye(job_id="j", rank=r, step=50, ts_unix_s=2.0), 2.0, "n0") for r in (0, 1, 1)]
    assert lasts == [False, True, False]  # the last rank's bye ends the generation, once (a repeated bye: no)
    out = reg.admit_hello(hello(0, 2, 8000), "n0", 2.5)
    assert out.opened is not None and out.opened.reason == "every_rank_gone" and out.opened.world_size == 2


def test_the_last_bye_counts_the_ranks_of_the_current_generation_only() -> None:
    reg = job_of(4, 2)
    bye = [reg.bye(wire.RankBye(job_id="j", rank=r, step=50, ts_unix_s=2.0), 2.0, f"n{r // 2}") for r in (0, 1, 2)]
    assert bye == [False, False, False]  # rank 3 is still running
    reg.note_ended("j", 3.0)  # found ended by its silence before its last bye: not ended a second time
    assert reg.bye(wire.RankBye(job_id="j", rank=3, step=50, ts_unix_s=4.0), 4.0, "n1") is False
    reg2 = job_of(4, 2)
    del reg2.jobs["j"].ranks[3]  # a rank never heard: the job is not known to have left
    assert [reg2.bye(wire.RankBye(job_id="j", rank=r, step=50, ts_unix_s=2.0), 2.0, f"n{r // 2}")
            for r in (0, 1, 2)] == [False, False, False]


def test_an_old_process_speaking_again_another_uid_or_a_stale_worker_opens_nothing() -> None:
    reg = job_of(4, 2)
    job = reg.jobs["j"]
    assert reg.admit_hello(hello(0, 4, 1000), "n0", GONE).opened is None  # its node was away: the same process
    assert (job.generation, job.ranks[0].seen_unix_s) == (0, GONE)
    reg2 = job_of(4, 2)
    with pytest.raises(GenerationPending):  # another user: not this job's run (a claim of another shape, held)
        reg2.hello(hello(0, 2, 7000, uid=UID + 1), "n5", GONE)
    with pytest.raises(RegistryError) as ei:  # and it cannot re-pin the paths either
        reg2.hello(hello(0, 4, 7000, uid=UID + 1, prof_root="/elsewhere"), "n5", GONE)
    assert ei.value.reason == "paths_changed" and reg2.jobs["j"].generation == 0
    reg3 = Registry()
    reg3.hello(hello(0, 4, 1000, restart_count=3), "n0", 1.0)
    with pytest.raises(RegistryError) as ei:
        reg3.hello(hello(1, 4, 9000, restart_count=2), "n0", GONE)
    assert ei.value.reason == "stale_generation" and reg3.jobs["j"].generation == 0


def test_a_new_run_may_re_pin_the_paths_under_the_jobs_uid() -> None:
    reg = job_of(4, 2)
    out = reg.admit_hello(dataclasses.replace(hello(0, 4, 7000), prof_root="/prof/requeue"), "n0", GONE)
    job = reg.jobs["j"]
    assert out.opened is not None and job.pinned_paths == (CFG, "/prof/requeue") and job.prof_root == "/prof/requeue"


def test_status_says_how_many_processes_moved_their_counters_back() -> None:
    from profwatch.core.status_text import render_generation

    reg = job_of(4, 2)
    job = reg.jobs["j"]
    _j, rank, _restarted = reg.step(step(0, 1), 5.0, "n0")
    assert rank is not None and reg.note_restart(job, rank, 5.0) is None
    view = reg.snapshot(6.0)["jobs"][0]
    assert "  steps went back: 1 of 2 processes (1 ranks); no new run yet" in render_generation(view)
