"""Job generations (pure): who may open one, what opening does to the registry, what stays pinned."""

from __future__ import annotations

import dataclasses

import pytest

from profwatch.core.fleet.generations import CLAIM_WINDOW_S, MAX_SHAPES, Shape, classify, quorum
from profwatch.core.fleet.job_end import EndedJobs, JobEndTracker
from profwatch.core.fleet.limits import LimitSettings
from profwatch.core.fleet.registry import GenerationPending, Registry, RegistryError
from profwatch.core.fleet.registry_state import RankState
from rankhook import wire

CFG, PROF = "/cfg/j", "/prof"


def hello(rank: int, world: int, rc: int | None = 0, job: str = "j", **kw: object) -> wire.RankHello:
    fields: dict = {"job_id": job, "rank": rank, "local_rank": rank % 4, "world_size": world, "hostname": f"h{rank}",
                    "pid": 1000 + rank, "backend": "torch", "ts_unix_s": 10.0, "profiler_config_path": CFG,
                    "prof_root": PROF, "restart_count": rc, "versions": {"torch": "2.13.0"}}
    fields.update(kw)
    return wire.RankHello(**fields)


def step(rank: int, s: int, job: str = "j") -> wire.StepReport:
    return wire.StepReport(job_id=job, rank=rank, step=s, step_time_s=0.1, ts_unix_s=100.0 + s)


def job_of(world: int, nodes: int, rc: int | None = 0, t: float = 1.0) -> Registry:
    """A registry with one job of ``world`` ranks spread over ``nodes`` nodes (n0, n1, ...), each at step 50."""
    reg = Registry(window_steps=100)
    per = world // nodes
    for r in range(world):
        reg.hello(hello(r, world, rc), f"n{r // per}", t)
        for s in range(1, 51):
            reg.step(step(r, s), t, f"n{r // per}")
    return reg


def test_quorum_is_a_majority_of_the_smaller_shape_and_at_least_two() -> None:
    assert [quorum(8, 4), quorum(4, 8), quorum(64, 64), quorum(3, 3), quorum(2, 8), quorum(1, 8)] == [2, 2, 32, 2, 2, 1]


def test_classify_shapes() -> None:
    cur = Shape(8, 1)
    assert classify(cur, Shape(8, 1)) == "same"
    assert classify(cur, Shape(4, 2)) == "claim" and classify(cur, Shape(8, 2)) == "claim"
    assert classify(cur, Shape(4, 0)) == "stale" and classify(cur, Shape(8, 0)) == "stale"
    assert classify(cur, Shape(4, 1)) == "conflict"  # torchrun never resizes without a restart
    assert classify(Shape(8, None), Shape(4, None)) == "claim" and classify(Shape(8, None), Shape(8, None)) == "same"


def test_scale_down_8_to_4_opens_a_generation_once_two_ranks_agree_through_the_jobs_nodes() -> None:
    reg = job_of(8, 2)  # n0: ranks 0-3, n1: ranks 4-7
    with pytest.raises(GenerationPending):
        reg.hello(hello(0, 4, rc=1), "n0", 5.0)
    job = reg.jobs["j"]
    assert (job.world_size, job.generation, len(job.ranks)) == (8, 0, 8)  # one hello changes nothing
    out = reg.admit_hello(hello(1, 4, rc=1), "n1", 5.5)
    g = out.opened
    assert g is not None and (g.generation, g.old_generation, g.world_size, g.old_world_size) == (1, 0, 4, 8)
    assert (g.restart_count, g.old_restart_count, g.reason) == (1, 0, "world_size")
    assert g.ranks == (0, 1) and g.nodes == ("n0", "n1") and g.admitted == (0, 1) and not g.refused
    assert (job.world_size, job.generation, job.restart_count, sorted(job.ranks)) == (4, 1, 1, [0, 1])
    assert reg.rank_count == 2 and all(r.last_step == -1 and r.gen == 1 for r in job.ranks.values())
    assert job.pinned_paths == (CFG, PROF) and job.versions  # paths stay pinned; versions kept
    reg.hello(hello(2, 4, rc=1), "n1", 6.0)  # the rest of the new shape registers as usual
    reg.hello(hello(3, 4, rc=1), "n1", 6.0)
    assert sorted(job.ranks) == [0, 1, 2, 3] and reg.rank_count == 4
    with pytest.raises(RegistryError) as ei:  # a step of an old rank beyond the new world size
        reg.step(step(6, 51), 6.0, "n1")
    assert ei.value.reason == "bad_rank"
    with pytest.raises(RegistryError) as ei:  # a late hello of the old generation
        reg.hello(hello(6, 8, rc=0), "n1", 6.0)
    assert ei.value.reason == "stale_generation" and job.world_size == 4
    g2 = reg.snapshot(7.0)["jobs"][0]
    assert (g2["generation"], g2["world_size"], g2["restart_count"], g2["pending_generations"]) == (1, 4, 1, [])


def test_scale_up_4_to_8_counts_only_the_jobs_nodes_and_admits_the_new_nodes_ranks_when_it_opens() -> None:
    reg = job_of(4, 2)  # n0: ranks 0-1, n1: ranks 2-3
    for r in range(4, 8):  # ranks on a node the job does not run on (yet): held, not counted
        with pytest.raises(GenerationPending):
            reg.hello(hello(r, 8, rc=1), "n2", 5.0)
    job = reg.jobs["j"]
    assert job.world_size == 4 and job.generation == 0
    pending = reg.snapshot(5.0)["jobs"][0]["pending_generations"]
    assert pending == [{"world_size": 8, "restart_count": 1, "ranks": 4, "agreeing_through_job_nodes": 0, "quorum": 2,
                        "age_s": 0.0}]
    with pytest.raises(GenerationPending) as ei:  # a step of a new rank before the generation opened
        reg.step(step(6, 1), 5.0, "n2")
    assert "claimed generation" in str(ei.value)
    with pytest.raises(GenerationPending):
        reg.hello(hello(0, 8, rc=1), "n0", 5.1)
    g = reg.admit_hello(hello(2, 8, rc=1), "n1", 5.2).opened
    assert g is not None and (g.world_size, g.old_world_size, g.generation) == (8, 4, 1)
    assert g.ranks == (0, 2) and g.admitted == (0, 2, 4, 5, 6, 7)
    assert {r: job.ranks[r].node_id for r in job.ranks} == {0: "n0", 2: "n1", 4: "n2", 5: "n2", 6: "n2", 7: "n2"}
    reg.step(step(6, 1), 5.3, "n2")
    assert job.ranks[6].last_step == 1


def test_a_lone_spoofed_hello_never_opens_a_generation_and_its_claim_lapses() -> None:
    reg = job_of(4, 2)
    with pytest.raises(GenerationPending):
        reg.hello(hello(0, 8, rc=7), "n0", 5.0)
    for _ in range(3):  # the same rank again and again is still one rank
        with pytest.raises(GenerationPending):
            reg.hello(hello(0, 8, rc=7), "n0", 6.0)
    job = reg.jobs["j"]
    assert (job.world_size, job.generation, job.restart_count) == (4, 0, 0)
    reg.expire(5.0 + CLAIM_WINDOW_S + 1)
    assert job.claims.claims == {} and reg.snapshot(200.0)["jobs"][0]["pending_generations"] == []


def test_one_process_speaking_for_several_ranks_counts_once() -> None:
    """Adversarial finding: one process on the job's node sent hellos for ranks 0 and 1 with world_size 2**20 and
    opened a generation (quorum 2). Where the node attests the sender (``peer_pid``), one process is one vote."""
    reg = job_of(4, 1)
    for r in range(4):  # any number of ranks from one process: still one vote, nothing opens
        with pytest.raises(GenerationPending):
            reg.hello(hello(r, 2**20, rc=1, peer_pid=4242), "n0", 5.0 + r)
    job = reg.jobs["j"]
    assert (job.world_size, job.generation) == (4, 0)
    assert reg.snapshot(10.0)["jobs"][0]["pending_generations"][0]["agreeing_through_job_nodes"] == 1
    # a real worker group: one process per rank, so two distinct processes open it
    with pytest.raises(GenerationPending):
        reg.hello(hello(0, 8, rc=1, peer_pid=5000), "n0", 20.0)
    out = reg.admit_hello(hello(1, 8, rc=1, peer_pid=5001), "n0", 20.5)
    assert out.opened is not None and (job.world_size, job.generation) == (8, 1)


def test_hellos_through_nodes_the_job_does_not_run_on_never_open_a_generation() -> None:
    reg = job_of(4, 2)
    for r in range(4):
        with pytest.raises(GenerationPending):
            reg.hello(hello(r, 4, rc=1), "intruder", 5.0)
    assert reg.jobs["j"].world_size == 4 and reg.jobs["j"].generation == 0


def test_a_claim_with_other_paths_is_refused_paths_stay_pinned_across_generations() -> None:
    reg = job_of(4, 2)
    for r in (0, 1):
        with pytest.raises(RegistryError) as ei:
            reg.hello(hello(r, 2, rc=1, prof_root="/elsewhere"), "n0", 5.0)
        assert ei.value.reason == "job_id_collision"  # the old ranks are alive: another job with this id
    assert reg.jobs["j"].generation == 0 and reg.jobs["j"].claims.claims == {}


def test_same_restart_count_with_another_world_size_is_a_conflict() -> None:
    reg = job_of(4, 2, rc=3)
    with pytest.raises(RegistryError) as ei:
        reg.hello(hello(0, 8, rc=3), "n0", 5.0)
    assert ei.value.reason == "world_size_conflict" and not isinstance(ei.value, GenerationPending)


def test_a_restart_at_the_same_size_opens_a_generation_by_restart_count() -> None:
    reg = job_of(4, 2, rc=0)
    with pytest.raises(GenerationPending):
        reg.hello(hello(1, 4, rc=1, pid=5001), "n0", 5.0)
    g = reg.admit_hello(hello(3, 4, rc=1, pid=5003), "n1", 5.0).opened
    assert g is not None and g.reason == "restart_count" and g.world_size == g.old_world_size == 4
    assert sorted(reg.jobs["j"].ranks) == [1, 3] and reg.jobs["j"].ranks[1].pid == 5001


def _restart(reg: Registry, rank: int, now: float, node: str) -> tuple[RankState, bool]:
    """One step report at step 1 (the rank's counter went back); the rank's record and whether it restarted."""
    _j, r, restarted = reg.step(step(rank, 1), now, node)
    assert r is not None
    return r, restarted


def test_step_counters_going_back_on_a_quorum_open_a_generation_without_restart_counts() -> None:
    reg = job_of(4, 2, rc=None)
    job = reg.jobs["j"]
    r0, restarted = _restart(reg, 0, 5.0, "n0")
    assert restarted and reg.note_restart(job, r0, 5.0) is None  # one rank: a process restart, not a generation
    r2, restarted = _restart(reg, 2, 5.5, "n1")
    g = reg.note_restart(job, r2, 5.5)
    assert g is not None and g.reason == "steps_went_back" and g.ranks == (0, 2) and job.generation == 1
    assert (job.ranks[0].gen, job.ranks[1].gen, job.ranks[2].gen) == (1, 0, 1)  # rank 1 has not restarted yet
    r1, restarted = _restart(reg, 1, 6.0, "n0")
    assert restarted and reg.note_restart(job, r1, 6.0) is None and r1.gen == 1  # joins, opens nothing
    r3, restarted = _restart(reg, 3, 6.0, "n1")
    assert reg.note_restart(job, r3, 6.0) is None and job.generation == 1


def test_restarts_spread_beyond_the_claim_window_open_nothing() -> None:
    reg = job_of(4, 2, rc=None)
    job = reg.jobs["j"]
    r0, _ = _restart(reg, 0, 5.0, "n0")
    reg.note_restart(job, r0, 5.0)
    r2, _ = _restart(reg, 2, 5.0 + CLAIM_WINDOW_S + 1, "n1")
    assert reg.note_restart(job, r2, 5.0 + CLAIM_WINDOW_S + 1) is None and job.generation == 0


def test_held_claims_are_bounded_per_job() -> None:
    reg = job_of(4, 2)
    job = reg.jobs["j"]
    for rc in range(1, MAX_SHAPES + 3):  # more shapes than kept: the oldest go
        with pytest.raises(GenerationPending):
            reg.hello(hello(0, 1000, rc=rc), "intruder", 5.0 + rc)
    assert len(job.claims.claims) == MAX_SHAPES
    for r in range(500):  # many ranks of one claimed shape: at most 64 + 2 x ranks known are held
        with pytest.raises(GenerationPending):
            reg.hello(hello(r, 1000, rc=99), "intruder", 20.0)
    assert job.claims.held() <= 64 + 2 * len(job.ranks)
    held = next(iter(job.claims.claims.values())).hellos
    assert all(not h.versions and h.prof_root is None for _n, h in held.values())  # pruned copies


def test_limits_refuse_held_ranks_at_opening_without_losing_the_generation() -> None:
    reg = Registry(window_steps=10, limits=LimitSettings(max_ranks_per_node=3))
    for r in range(2):
        reg.hello(hello(r, 2), "n0", 1.0)
    for r in range(2, 6):  # four ranks on a new node that takes three
        with pytest.raises(GenerationPending):
            reg.hello(hello(r, 6, rc=1), "n1", 2.0)
    with pytest.raises(GenerationPending):
        reg.hello(hello(0, 6, rc=1), "n0", 2.0)
    g = reg.admit_hello(hello(1, 6, rc=1), "n0", 2.0).opened
    assert g is not None and g.world_size == 6 and len(g.refused) == 1
    assert dict(g.refused) == {5: "too_many_ranks_on_node"} and reg.rank_count == 5


def test_generation_event_data_and_ids() -> None:
    reg = job_of(4, 2)
    with pytest.raises(GenerationPending):
        reg.hello(hello(0, 2, rc=1), "n0", 5.0)
    g = reg.admit_hello(hello(1, 2, rc=1), "n0", 5.0).opened
    assert g is not None
    d = g.to_json()
    assert d["old_world_size"] == 4 and d["world_size"] == 2 and d["ranks"] == [0, 1] and d["refused"] == {}
    assert d["nodes"] == ["n0"] and d["reason"] == "world_size" and d["generation"] == 1
    assert g.event_id() == "job_generation-j-1-5"
    assert dataclasses.replace(g, opened_unix_s=99.0).event_id() != g.event_id()


def test_a_job_found_ended_opens_a_generation_of_the_same_shape_at_its_next_report_once() -> None:
    reg = job_of(4, 2)
    job = reg.jobs["j"]
    assert reg.resume_after_end(job, 700.0, 0, "n0") is None  # not ended: nothing
    reg.note_ended("j", 700.0)
    g = reg.resume_after_end(job, 900.0, 2, "n1")
    assert g is not None and (g.reason, g.generation, g.old_generation, g.world_size) == ("resumed_after_end", 1, 0, 4)
    assert (g.ranks, g.nodes) == ((2,), ("n1",)) and job.ended_unix_s is None
    assert {r.gen for r in job.ranks.values()} == {1}  # every rank's reports are judged in the new generation
    assert reg.resume_after_end(job, 901.0, 3, "n1") is None  # once per end


def test_steps_going_back_are_credited_to_the_sending_process_not_to_the_ranks_hellos() -> None:
    """Adversarial finding: one process, sending no hello, moved the step counters of ranks 0 and 1 back and opened
    a generation, because each report was credited to its rank's last hello (two processes). A report carries the
    process the node attested for its connection (``peer_pid``): one process is one vote, with or without a
    hello; a second process makes the quorum."""
    reg = job_of(4, 1)
    job = reg.jobs["j"]
    for r in (0, 1, 3):
        _rank, restarted = reg.step_of(job, dataclasses.replace(step(r, 1), peer_pid=4242), 60.0, "n0")
        assert restarted and reg.note_restart(job, job.ranks[r], 60.0, 4242) is None
    assert job.generation == 0
    _rank, restarted = reg.step_of(job, dataclasses.replace(step(2, 1), peer_pid=5000), 61.0, "n0")
    g = reg.note_restart(job, job.ranks[2], 61.0, 5000)
    assert g is not None and g.reason == "steps_went_back" and job.generation == 1
    # without an attested sender (tcp, a version-1 node) the rank's hello process stands in, as before
    reg2 = job_of(4, 1)
    job2 = reg2.jobs["j"]
    for r in (0, 1):
        reg2.step_of(job2, step(r, 1), 60.0, "n0")
        opened = reg2.note_restart(job2, job2.ranks[r], 60.0, None)
    assert opened is not None and job2.generation == 1


def test_a_bye_after_the_jobs_end_never_makes_it_live_again() -> None:
    """Adversarial finding: a rank's bye after ``job_ended`` advanced the job's newest report, so the coordinator's
    observe pass revived the ended generation (a late verdict paged again) and the job ended a second time. The
    coordinator's own pieces, in its order (``_tick_jobs_and_sinks``): a bye is no report."""
    reg = job_of(4, 2)
    job = reg.jobs["j"]
    tracker, ended = JobEndTracker(after_s=60.0), EndedJobs()
    (end,) = tracker.check({"j": job.heard_unix_s}, 100.0)
    ended.mark("j", job.generation, end.last_report_unix_s)
    reg.note_ended("j", 100.0)
    for r in range(4):
        reg.bye(wire.RankBye(job_id="j", rank=r, step=50, ts_unix_s=120.0), 120.0, f"n{r // 2}")
    assert job.ended_unix_s is not None and job.heard_unix_s < 100.0  # a bye is no report: the job stays ended
    assert ended.ended("j", job.generation)  # a late verdict stays information, never a page
    assert tracker.check({"j": job.heard_unix_s}, 500.0) == []  # ended once
    # a step does make it live: a new generation (resumed_after_end), which the ended mark does not cover
    g = reg.resume_after_end(job, 600.0, 0, "n0")
    assert g is not None and not ended.ended("j", job.generation)


def test_one_requeue_after_the_end_opens_one_generation_without_attested_senders() -> None:
    """Adversarial finding: a requeue after ``job_ended`` (no ``peer_pid``: a tcp rank socket or a version-1 node)
    opened two generations: ``resumed_after_end`` at its first step, then ``steps_went_back`` because the new run's
    steps from its checkpoint were below the old run's counters. The resumed run counts its steps afresh."""
    reg = job_of(4, 2, rc=None)
    job = reg.jobs["j"]
    reg.note_ended("j", 700.0)
    g = reg.resume_after_end(job, 900.0, 0, "n0")
    assert g is not None and g.reason == "resumed_after_end" and job.generation == 1
    for r in range(4):
        for s in (20, 21):  # from the checkpoint at step 20 (the old run reached 50)
            rank, restarted = reg.step_of(job, step(r, s), 900.0 + s, f"n{r // 2}")
            if restarted:  # what the coordinator does with a counter that went back (_ingest_steps)
                reg.note_restart(job, rank, 900.0 + s, None)
            assert rank.gen == job.generation
    assert job.generation == 1 and job.furthest_step() == 21
