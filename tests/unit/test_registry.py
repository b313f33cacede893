"""Registry and step windows (pure): world-size conflicts, restarts, bounded windows, snapshot."""

from __future__ import annotations

import pytest

from profwatch.core.fleet.registry import Registry, RegistryError
from profwatch.core.fleet.step_window import StepWindow, median
from rankhook import wire


def hello(rank: int, world: int = 4, job: str = "j") -> wire.RankHello:
    return wire.RankHello(job_id=job, rank=rank, local_rank=rank % 2, world_size=world, hostname=f"h{rank // 2}",
                          pid=100 + rank, backend="torch", ts_unix_s=10.0 + rank, counters={"dropped": rank})


def step(rank: int, s: int, t: float = 0.1, job: str = "j") -> wire.StepReport:
    return wire.StepReport(job_id=job, rank=rank, step=s, step_time_s=t, ts_unix_s=100.0 + s)


def test_window_is_bounded_and_ordered() -> None:
    w = StepWindow(5)
    for s in range(12):
        w.append(s, s / 10)
    assert len(w) == 5
    assert [s for s, _ in w.items()] == [7, 8, 9, 10, 11]
    assert w.recent_times(2) == pytest.approx([1.0, 1.1])
    w.clear()
    assert w.items() == []
    assert median([3.0, 1.0, 2.0]) == 2.0 and median([]) is None


def test_a_lone_hello_of_another_world_size_is_held_and_changes_nothing() -> None:
    reg = Registry(window_steps=10)
    reg.hello(hello(0), "n0", 1.0)
    with pytest.raises(RegistryError) as ei:
        reg.hello(hello(1, world=8), "n0", 1.0)
    assert ei.value.reason == "generation_pending"  # a claim for a new generation, without a quorum
    assert reg.jobs["j"].world_size == 4 and reg.jobs["j"].generation == 0 and set(reg.jobs["j"].ranks) == {0}


def test_rank_outside_world_is_refused_and_unknown_job_ignored() -> None:
    reg = Registry()
    reg.hello(hello(0), "n0", 1.0)
    with pytest.raises(RegistryError):
        reg.step(step(7, 1), 2.0)
    assert reg.step(step(0, 1, job="other"), 2.0) == (None, None, False)


def test_steps_restart_and_snapshot() -> None:
    reg = Registry(window_steps=100)
    for r in range(4):
        reg.hello(hello(r), f"n{r // 2}", 1.0)
    for s in range(1, 21):
        for r in range(4):
            reg.step(step(r, s, 0.2 if r == 3 else 0.1), 2.0)
    job = reg.jobs["j"]
    assert job.furthest_step() == 20
    assert job.median_step_time_s() == pytest.approx(0.1, abs=1e-6)
    assert job.started_unix_s == 13.0
    _, rank, restarted = reg.step(step(2, 1), 3.0)
    assert rank is not None and rank.window is not None and restarted and len(rank.window) == 1
    snap = reg.snapshot(4.0)
    j = snap["jobs"][0]
    assert j["ranks_seen"] == 4 and j["rank_drops"] == 0 + 1 + 2 + 3
    assert {r["rank"]: r["node_id"] for r in j["ranks"]} == {0: "n0", 1: "n0", 2: "n1", 3: "n1"}


def test_gauge_rows_agree_with_the_status_snapshot_without_its_per_rank_rows() -> None:
    reg = Registry(window_steps=100)
    for node in ("n0", "n1"):
        reg.touch_node(node, node, 1.0)
    for r in range(4):
        reg.hello(hello(r), f"n{r // 2}", 1.0)
    for s in range(1, 11):
        for r in range(3):  # rank 3 never steps
            reg.step(step(r, s, 0.3 if r == 2 else 0.1 * (1 + s / 100)), 2.0)
    reg.bye(wire.RankBye(job_id="j", rank=1, step=10, ts_unix_s=3.0), 3.0, "n0")
    rows, snap = reg.gauge_rows(4.0, 10.0), reg.snapshot(4.0, 10.0)
    (g,), (j,) = rows["jobs"], snap["jobs"]
    assert g["ranks_live"] == sum(1 for r in j["ranks"] if not r["left"]) == 3  # rank 1 left
    assert (g["furthest_step"], g["rank_drops"], g["generation"]) == (j["furthest_step"], j["rank_drops"],
                                                                      j["generation"]) == (10, 6, 0)
    assert g["median_step_time_s"] == pytest.approx(0.11)  # median of the latest step times: 0.11, 0.11, 0.3
    assert [n["down"] for n in rows["nodes"]] == [n["down"] for n in snap["nodes"]] == [False, False]
    assert reg.gauge_rows(30.0, 10.0)["nodes"] == [{"node_id": "n0", "down": True}, {"node_id": "n1", "down": True}]


def test_batch_sequence_gaps_are_counted() -> None:
    reg = Registry()
    node, new = reg.touch_node("n0", "h", 1.0)
    assert new
    assert reg.note_batch_seq(node, 1) == 0
    assert reg.note_batch_seq(node, 5) == 3
    assert node.lost_batches == 3


def test_one_user_cannot_take_every_job_slot_of_a_node() -> None:
    """Adversarial finding: 20,000 hellos with distinct job ids from one user filled a node's 64 job slots, and a
    real job's hello was refused for 15 minutes. One attested uid gets ``max_jobs_per_node_per_uid`` of them."""
    from dataclasses import replace

    from profwatch.core.fleet.limits import LimitSettings

    reg = Registry(window_steps=10, limits=LimitSettings(max_jobs_per_node=8, max_jobs_per_node_per_uid=3))
    for i in range(3):
        reg.hello(replace(hello(0, world=1, job=f"flood{i}"), peer_uid=666), "n0", 1.0)
    with pytest.raises(RegistryError) as ei:
        reg.hello(replace(hello(0, world=1, job="flood3"), peer_uid=666), "n0", 1.0)
    assert ei.value.reason == "too_many_jobs_of_uid_on_node" and "flood3" not in reg.jobs
    reg.hello(replace(hello(0, world=1, job="flood3"), peer_uid=666), "n1", 1.0)  # per node: another node has room
    reg.hello(replace(hello(0, world=2, job="legit"), peer_uid=1000), "n0", 1.0)  # another user still fits
    reg.hello(replace(hello(1, world=2, job="legit"), peer_uid=1000), "n0", 1.0)
    assert set(reg.jobs["legit"].ranks) == {0, 1}
    for i in range(4, 8):  # the node's own bound still holds for everyone
        reg.hello(replace(hello(0, world=1, job=f"u{i}"), peer_uid=2000 + i), "n0", 1.0)
    with pytest.raises(RegistryError) as ei:
        reg.hello(replace(hello(0, world=1, job="late"), peer_uid=3000), "n0", 1.0)
    assert ei.value.reason == "too_many_jobs_on_node"


def test_step_run_records_the_common_reports_as_step_of_and_stops_before_the_others() -> None:
    """``Registry.step_run`` (the coordinator's hot path, issue 26) takes the reports ``step_of`` would take without
    a check, records them alike, and stops before a message that is not a step of the job, a rank not known yet or
    bound to another node, a rank beyond the world size and a step counter that went back."""
    def fresh() -> Registry:
        reg = Registry(window_steps=10)
        for r in (0, 1, 2):
            reg.hello(hello(r), "n0" if r < 2 else "n1", 1.0)
        reg.hello(hello(0, job="k"), "n0", 1.0)
        return reg

    msgs = [step(0, 5), step(1, 5), step(0, 6), step(3, 5),  # rank 3: not known yet
            step(1, 6), step(2, 6),  # rank 2: bound to node n1
            step(0, 7), step(9, 7),  # rank 9: beyond the world size
            step(1, 7), step(0, 2),  # rank 0: its counter went back
            step(1, 8), step(0, 1, job="k"),  # another job
            step(0, 8), hello(1)]  # not a step report
    reg, twin = fresh(), fresh()
    job = reg.jobs["j"]
    current: list[object] = []
    stops, i = [], 0
    while i < len(msgs):
        i = reg.step_run(job, msgs, i, 50.0, "n0", current)
        stops.append(i)
        i += 1
    assert stops == [3, 5, 7, 9, 11, 13]
    assert current == [m for k, m in enumerate(msgs) if k not in stops]
    for k, m in enumerate(msgs):
        if k not in stops:
            twin.step_of(twin.jobs["j"], m, 50.0, "n0")
    for r, rs in job.ranks.items():
        t = twin.jobs["j"].ranks[r]
        assert (rs.last_step, rs.last_step_time_s, rs.last_ts_unix_s, rs.seen_unix_s, rs.left, rs.window.items()) == \
            (t.last_step, t.last_step_time_s, t.last_ts_unix_s, t.seen_unix_s, t.left, t.window.items())
    assert job.ranks[0].last_step == 8 and job.ranks[1].last_step == 8 and 3 not in job.ranks


@pytest.mark.parametrize("capacity", [1, 2, 5, 7])
def test_recent_times_reads_the_ring_as_items_would(capacity: int) -> None:
    """``StepWindow.recent_times`` reads the last step times from the ring (not through ``items``): the same values,
    before the window is full, when it is just full, and at every position of the ring after."""
    w = StepWindow(capacity)
    for s in range(3 * capacity + 2):
        for n in range(1, capacity + 3):
            assert w.recent_times(n) == [t for _, t in w.items()[-n:]], (s, n)
        w.append(s, s / 8)  # exact in float32
    with pytest.raises(ValueError):
        w.recent_times(0)


def test_only_identity_changes_are_recorded_for_the_frequent_flush() -> None:
    """Hellos, byes, new ranks and nodes are changes the 2 s flush writes; step reports are not (the slow full flush
    writes their fields), so a steady job costs that flush nothing however many ranks it has."""
    from profwatch.core.fleet.registry_state import changed_rows

    reg = Registry(window_steps=100)
    reg.touch_node("n0", "h0", 1.0)
    for r in range(4):
        reg.hello(hello(r), "n0", 1.0)
    jobs, ranks, nodes = reg.take_changes()
    assert (jobs, ranks, nodes) == ({"j"}, {("j", r) for r in range(4)}, {"n0"})
    job = reg.jobs["j"]
    for s in range(1, 6):
        assert reg.step_run(job, [step(r, s) for r in range(4)], 0, 2.0 + s, "n0", []) == 4
    reg.touch_node("n0", "h0", 9.0)
    assert reg.take_changes() == (set(), set(), set())
    reg.bye(wire.RankBye(job_id="j", rank=2, step=5, ts_unix_s=9.0), 9.0, "n0")
    changed = reg.take_changes()
    assert changed == (set(), {("j", 2)}, set())
    job_rows, rank_rows, node_rows = changed_rows(reg.jobs, reg.nodes, changed, reset=())
    assert job_rows == [] and node_rows == [] and [(r[1], r[7], r[10]) for r in rank_rows] == [(2, 5, 1)]
    reg.step_run(job, [step(2, 6)], 0, 10.0, "n0", [])  # back after its bye: its row changes (left = 0)
    assert reg.take_changes() == (set(), {("j", 2)}, set())
    # a new generation replaces the job's rank rows: every rank of it is written
    _j, all_ranks, _n = changed_rows(reg.jobs, reg.nodes, (set(), set(), set()), reset=["j"])
    assert sorted(r[1] for r in all_ranks) == [0, 1, 2, 3]
    # records gone since (expired) are skipped
    assert changed_rows({}, {}, ({"j"}, {("j", 1)}, {"n0"}), reset=["j"]) == ([], [], [])


def test_gauge_fields_kept_on_ingest_follow_restarts_byes_and_returns() -> None:
    reg = Registry(window_steps=100)
    for r in range(4):
        reg.hello(hello(r), f"n{r // 2}", 1.0)
    job = reg.jobs["j"]
    for s in range(1, 11):
        reg.step_run(job, [step(r, s) for r in range(2)], 0, 2.0, "n0", [])
        reg.step_run(job, [step(r, s) for r in range(2, 4)], 0, 2.0, "n1", [])
    assert reg.gauge_rows(3.0)["jobs"][0]["furthest_step"] == 10 == job.furthest_step()
    assert job.last_heard_unix_s() == 2.0
    for r in range(4):  # every rank's counter goes back: the furthest step goes down with them
        reg.step(step(r, 1), 4.0, f"n{r // 2}")
    assert reg.gauge_rows(4.0)["jobs"][0]["furthest_step"] == 1 == job.furthest_step()
    reg.bye(wire.RankBye(job_id="j", rank=3, step=1, ts_unix_s=5.0), 5.0, "n1")
    assert reg.gauge_rows(5.0)["jobs"][0]["ranks_live"] == 3
    reg.step_run(job, [step(3, 2)], 0, 6.0, "n1", [])  # back after its bye
    g = reg.gauge_rows(6.0)["jobs"][0]
    assert (g["ranks_live"], g["furthest_step"]) == (4, 2) and job.last_heard_unix_s() == 6.0


def test_the_sampled_median_step_time_reads_a_bounded_sample_and_agrees() -> None:
    """The reference desk's once-a-second median reads at most GAUGE_SAMPLE ranks (evenly spaced), not every rank's
    window: on a job whose ranks all step alike it is the full median."""
    from profwatch.core.fleet.registry_state import GAUGE_SAMPLE

    world = 3 * GAUGE_SAMPLE
    reg = Registry(window_steps=50)
    reg.limits = reg.limits.model_copy(update={"max_ranks_per_node": world})
    for r in range(world):
        reg.hello(hello(r, world), "n0", 1.0)
    job = reg.jobs["j"]
    for s in range(1, 21):
        reg.step_run(job, [step(r, s, 0.1 + 0.001 * (r % 3)) for r in range(world)], 0, 2.0, "n0", [])
    full, sampled = job.median_step_time_s(), job.median_step_time_s(sampled=True)
    assert len(job.gauge_sample) <= GAUGE_SAMPLE and sampled == pytest.approx(full, abs=0.0011)


def test_the_snapshot_of_one_job_holds_only_its_rows() -> None:
    """``status`` for one job (or for an unknown one, as a bench polling counters asks) builds that job's rows only:
    each job's rows cost O(its ranks); the nodes are listed either way."""
    reg = Registry(window_steps=10)
    for job in ("a", "b"):
        for r in range(4):
            reg.hello(hello(r, job=job), "n0", 1.0)
            reg.step(step(r, 1, job=job), 2.0, "n0")
    full = reg.snapshot(3.0)
    assert [j["job_id"] for j in full["jobs"]] == ["a", "b"]
    one = reg.snapshot(3.0, 10.0, "b")
    assert one["jobs"] == [j for j in full["jobs"] if j["job_id"] == "b"] and one["nodes"] == full["nodes"]
    assert reg.snapshot(3.0, 10.0, "none")["jobs"] == [] and reg.snapshot(3.0, 10.0, "none")["nodes"] == full["nodes"]
