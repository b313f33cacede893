"""Targeted captures (daemon/profwatch/core/arming/targeting.py) and how arming and planning use them (pure: issue 13)."""

from __future__ import annotations

from profwatch.core.arming.policy import ArmHistory, ArmingPolicy, ArmingSettings, JobArmState, capture_request
from profwatch.core.arming.targeting import (
    JobTopology,
    TargetingSettings,
    estimate_capture_bytes,
    plan_follow_up,
    plan_targets,
)
from profwatch.core.capture.planner import CaptureSettings, JobProgress, plan_capture
from profwatch.core.capture.report import plan_notes
from profwatch.core.detection.job_detector import Anomaly

NOW = 10_000.0
HOSTS_4096 = {r: f"node{r // 8:03d}" for r in range(4096)}  # 512 nodes of 8 ranks
OUT = Anomaly("rank_outlier", "j1", 130, (1234,), 0.3, {})
REG = Anomaly("step_regression", "j1", 120, (), 0.25, {})


def test_a_small_job_is_captured_whole() -> None:
    t = plan_targets([3], JobTopology(64, {r: f"n{r // 8}" for r in range(64)}), TargetingSettings())
    assert t.rank_list is None and t.mode == "full" and "min_world_size 64" in t.detail
    assert plan_targets([3], JobTopology(4096, HOSTS_4096), TargetingSettings(enabled=False)).rank_list is None


def test_a_named_rank_brings_its_node_peers_and_references_spread_over_nodes() -> None:
    t = plan_targets([1234], JobTopology(4096, HOSTS_4096), TargetingSettings())
    assert t.mode == "targeted" and t.rank_list is not None and 1234 in t.rank_list
    roles = t.roles
    node = [r for r, role in roles.items() if role == "node_peer"]
    refs = [r for r, role in roles.items() if role == "reference"]
    assert len(node) == 2 and all(HOSTS_4096[r] == HOSTS_4096[1234] for r in node)
    assert len(refs) == 16 and len({HOSTS_4096[r] for r in refs}) == 16  # one per node, 16 nodes
    assert HOSTS_4096[1234] not in {HOSTS_4096[r] for r in refs}
    nodes = sorted(int(HOSTS_4096[r][4:]) for r in refs)
    assert nodes[0] < 32 and nodes[-1] > 480  # spread over the whole job, not clustered
    assert len(t.rank_list) == 19 and "16 reference ranks over 16 nodes" in t.detail
    assert "node locality stands in" in t.detail  # no capture of the job yet: groups unknown


def test_known_groups_add_peers_from_the_suspects_groups_but_not_the_world_group() -> None:
    # pipeline groups of 8 ranks across nodes: rank 1234's group is 1234 % 512 + k * 512 (k = 0..7)
    groups = {f"pp{i}": tuple(i + k * 512 for k in range(8)) for i in range(512)}
    groups["world"] = tuple(range(4096))
    t = plan_targets([1234], JobTopology(4096, HOSTS_4096, groups, groups_from="c-1"), TargetingSettings())
    peers = [r for r, role in t.roles.items() if role == "group_peer"]
    assert len(peers) == 2 and all(r in groups["pp210"] for r in peers)
    assert "groups from capture c-1" in t.detail and len(t.rank_list or ()) == 21


def test_a_job_wide_regression_captures_a_sample_covering_every_node() -> None:
    t = plan_targets([], JobTopology(4096, HOSTS_4096), TargetingSettings())
    assert t.mode == "sample" and t.rank_list is not None
    assert {HOSTS_4096[r] for r in t.rank_list} == set(HOSTS_4096.values())  # all 512 nodes
    assert len(t.rank_list) == 512 and t.nodes_covered == 512
    few_nodes = {r: f"n{r // 64}" for r in range(256)}  # 4 nodes: one each, then spread to 64 ranks
    s = plan_targets([], JobTopology(256, few_nodes), TargetingSettings(sample_ranks=64))
    assert s.rank_list is not None and len(s.rank_list) == 64 and {few_nodes[r] for r in s.rank_list} == {
        "n0", "n1", "n2", "n3"}
    unknown = plan_targets([], JobTopology(1000), TargetingSettings(sample_ranks=64))  # hosts unknown
    assert unknown.rank_list is not None and len(unknown.rank_list) == 1000  # each rank its own node: all


def test_the_policy_targets_and_counts_the_estimate_against_the_byte_budget() -> None:
    topo = JobTopology(4096, HOSTS_4096)
    policy = ArmingPolicy(ArmingSettings())
    d = policy.decide(OUT, JobArmState(), NOW, topo)
    assert d.action == "arm" and d.rank_list is not None and len(d.rank_list) == 19
    assert d.estimated_bytes == estimate_capture_bytes(19, 4, 16 * 2**20) == 19 * 4 * 16 * 2**20
    assert d.to_json()["targeting"]["mode"] == "targeted"
    # a full capture of the same job would not fit the hourly budget of 50 GiB: 4096 x 4 x 16 MiB = 256 GiB
    whole = ArmingPolicy(ArmingSettings(targeting=TargetingSettings(enabled=False))).decide(OUT, JobArmState(), NOW,
                                                                                              topo)
    assert (whole.action, whole.reason, whole.rank_list) == ("suppress", "larger_than_byte_cap", None)
    # the job's own bytes per rank and step (from its last capture) replace the default estimate
    learned = policy.decide(OUT, JobArmState(bytes_per_rank_step=2**20), NOW, topo)
    assert learned.estimated_bytes == 19 * 4 * 2**20
    # an explicit rank_list wins
    fixed = ArmingPolicy(ArmingSettings(rank_list=(1, 2))).decide(OUT, JobArmState(), NOW, topo)
    assert fixed.rank_list == (1, 2) and fixed.target is None


def test_a_stalled_rank_outside_the_targeted_ranks_does_not_stop_the_capture() -> None:
    topo = JobTopology(4096, HOSTS_4096)
    policy = ArmingPolicy(ArmingSettings())
    assert policy.decide(OUT, JobArmState(stalled_ranks=frozenset({4000})), NOW, topo).action == "arm"
    assert policy.decide(OUT, JobArmState(stalled_ranks=frozenset({1234})), NOW, topo).reason == \
        "stalled_rank_in_capture"


def test_history_reserves_the_estimate_until_the_capture_settles() -> None:
    h = ArmHistory()
    policy = ArmingPolicy(ArmingSettings(max_capture_bytes_per_hour=10 * 2**30))
    topo = JobTopology(4096, HOSTS_4096)
    h.reserve("c1", NOW, 9 * 2**30)
    assert h.state(NOW, capture_in_flight=False).bytes_last_hour == 9 * 2**30
    assert h.decide(policy, OUT, NOW + 1, capture_in_flight=False, topology=topo).reason == "byte_cap"
    h.settle("c1", NOW + 60, 19 * 4 * 2**20, ranks=19, active_steps=4)
    st = h.state(NOW + 61, capture_in_flight=False)
    assert st.bytes_last_hour == 19 * 4 * 2**20 and st.bytes_per_rank_step == 2**20
    assert h.decide(policy, OUT, NOW + 61, capture_in_flight=False, topology=topo).action == "arm"


def test_the_plan_lists_the_ranks_forces_async_parsing_and_says_why() -> None:
    d = ArmingPolicy(ArmingSettings()).decide(OUT, JobArmState(), NOW, JobTopology(4096, HOSTS_4096))
    req = capture_request(OUT, d, furthest_step=100, step_time_s=1.0, capture=CaptureSettings())
    progress = JobProgress(job_id="j1", world_size=4096, furthest_step=100, step_time_s=1.0, prof_root="/prof",
                           now_unix_s=NOW)
    # even with async_mode off in the settings: torch_npu parses listed ranks online only in async mode
    plan = plan_capture(req, progress, CaptureSettings(async_mode=False))
    cfg = plan.config.render()
    assert cfg["is_rank"] is True and cfg["rank_list"] == list(d.rank_list or ()) and cfg["async_mode"] is True
    assert plan.targeting is not None and plan.targeting["mode"] == "targeted"
    assert plan.targeting["estimated_bytes"] == d.estimated_bytes
    (note,) = plan_notes(plan, plan.rank_list or [], {}, {})
    assert note.startswith("targeted capture of 19 of 4096 ranks: suspects [1234]") and "estimated 1.19 GiB" in note
    assert set(plan.rank_deadlines_unix_s) == set(d.rank_list or ())


def test_a_follow_up_covers_the_ranks_the_last_capture_waited_for() -> None:
    topo = JobTopology(4096, HOSTS_4096)
    one = plan_follow_up([3000], topo, TargetingSettings())  # one named rank: planned as a suspect with its peers
    assert one.mode == "follow_up" and one.rank_list is not None and 3000 in one.rank_list
    assert one.roles[3000] == "suspect" and "follow-up" in one.detail and len(one.rank_list) == 19
    many = list(range(2048, 4096))  # not named: every uncaptured rank; a sample of them, plus references
    t = plan_follow_up(many, topo, TargetingSettings())
    assert t.mode == "follow_up" and t.rank_list is not None
    sampled = [r for r, role in t.roles.items() if role == "waited_for"]
    refs = [r for r, role in t.roles.items() if role == "reference"]
    assert len(sampled) == 64 and set(sampled) <= set(many) and len({HOSTS_4096[r] for r in sampled}) == 64
    assert len(refs) == 16 and all(r < 2048 for r in refs) and len(t.rank_list) == 64 + 16
    assert "a sample of 64 over 64 of their 256 nodes of the 2048 ranks the last capture waited for" in t.detail
    few = plan_follow_up(list(range(2048, 2068)), topo, TargetingSettings())  # 20: each of them
    assert {r for r, role in few.roles.items() if role == "waited_for"} == set(range(2048, 2068))
    assert "every one of the 20 ranks" in few.detail
    nine = plan_follow_up([5, 4096, -1, *range(100, 109)], topo, TargetingSettings(max_suspects=8))  # 10 in range
    assert nine.rank_list is not None and {5, *range(100, 109)} <= set(nine.rank_list) and 4096 not in nine.rank_list
    small = plan_follow_up([3], JobTopology(64, {}), TargetingSettings())  # a small job: captured whole
    assert small.rank_list is None and small.mode == "full"


def test_the_policy_plans_a_follow_up_over_the_waited_for_ranks_and_says_so() -> None:
    p = ArmingPolicy(ArmingSettings(max_capture_bytes_per_hour=None))
    topo = JobTopology(4096, HOSTS_4096)
    d = p.decide(REG, JobArmState(follow_ranks=(3000,)), NOW, topo)
    assert d.action == "arm" and d.target is not None and d.target.mode == "follow_up"
    assert d.rank_list is not None and 3000 in d.rank_list
    assert "follow-up of ranks 3000 its last capture waited for" in d.capture_reason
    fixed = ArmingPolicy(ArmingSettings(rank_list=(0, 1), max_capture_bytes_per_hour=None))
    assert fixed.decide(REG, JobArmState(follow_ranks=(3000,)), NOW, topo).rank_list == (0, 1)  # configured wins


def test_the_request_and_the_metadata_carry_the_ranks_the_anomaly_named() -> None:
    from profwatch.core.capture.planner import capture_metadata

    p = ArmingPolicy(ArmingSettings(max_capture_bytes_per_hour=None))
    d = p.decide(OUT, JobArmState(), NOW, JobTopology(4096, HOSTS_4096))
    req = capture_request(OUT, d, furthest_step=120, step_time_s=1.0, capture=CaptureSettings())
    assert req.named_ranks == [1234]
    job_wide = capture_request(REG, p.decide(REG, JobArmState(), NOW), furthest_step=120, step_time_s=1.0,
                               capture=CaptureSettings())
    assert job_wide.named_ranks is None
    meta = capture_metadata("c", "r", "j", None, 8, [0, 1, 2, 5])
    assert meta["profwatch_named_ranks"] == "0-2,5"
    assert "profwatch_named_ranks" not in capture_metadata("c", "r", "j", None, 8, None)
    assert "profwatch_named_ranks" not in capture_metadata("c", "r", "j", None, 9999, list(range(0, 9000, 2)))  # too long
