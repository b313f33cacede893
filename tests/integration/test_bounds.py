"""Bounded coordinator state under floods, with a live coordinator: huge world sizes cost nothing until ranks
report, jobs are capped per node and in total, silent jobs expire (from memory and the store), queued bytes per
peer are bounded, a job's paths are pinned (a change is refused and alerted), a bad batch is split."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import zmq

from profwatch.coordinator import Coordinator
from rankhook import wire
from tests.conftest import wait_for
from tests.integration.live_stack import Stack, batch, hello, job_view, rank_view, step

LIMITS = {"max_jobs_per_node": 8, "max_jobs_total": 12, "max_ranks_total": 4096}


@pytest.fixture
def stack(short_tmp: Path):
    st = Stack(short_tmp, limits=LIMITS)
    st.start()
    yield st
    st.close()


@pytest.fixture
def expiring_stack(short_tmp: Path):
    """Jobs expire 5 s after their last rank was heard: short enough to watch, long enough for a loaded box."""
    st = Stack(short_tmp, limits=LIMITS | {"job_expiry_s": 5.0})
    st.start()
    yield st
    st.close()


def _coord(st: Stack) -> Coordinator:
    assert st.coord is not None
    return st.coord


def test_a_flood_of_huge_jobs_is_capped_and_costs_no_per_rank_state(expiring_stack: Stack) -> None:
    stack = expiring_stack
    coord = _coord(stack)
    honest = stack.dealer()
    honest.send(batch("honest", hello("jobH", 0), hello("jobH", 1)))
    flood = stack.dealer()
    for i in range(0, 500, 50):  # 500 new jobs, each claiming 2**20 ranks, and a step for each
        msgs = [m for j in range(i, i + 50) for m in (hello(f"f{j}", 0, world=1 << 20), step(f"f{j}", 7, 1))]
        flood.send(batch("flooder", *msgs, seq=i // 50 + 1))
    wait_for(lambda: coord.metrics.registry.get_sample_value("profwatch_rejected_total",
                                                             {"reason": "too_many_jobs_on_node"}) == 492, 30)
    flood_jobs = [j for j in coord.registry.jobs if j.startswith("f")]
    assert len(flood_jobs) == LIMITS["max_jobs_per_node"]
    assert coord.registry.rank_count == 2 + 2 * len(flood_jobs)  # one record per rank that reported, not 2**20
    assert not any(j.startswith("f") for j in coord.detectors)  # over limits.max_ranks_total: no detector tables
    for s in range(1, 4):
        honest.send(batch("honest", step("jobH", 0, s), step("jobH", 1, s), seq=1 + s))
    wait_for(lambda: rank_view(stack.control("status"), "jobH").get(1, {}).get("last_step") == 3, 20)
    assert "jobH" in coord.detectors  # the honest job on another node is tracked and analysed
    # the flood stops; its jobs expire (the honest job keeps reporting) and leave the store too
    seqs = iter(range(10, 100_000))

    def flood_expired() -> bool:
        s = next(seqs)
        honest.send(batch("honest", step("jobH", 0, s), step("jobH", 1, s), seq=s))
        return {j["job_id"] for j in stack.control("status")["jobs"]} == {"jobH"}

    wait_for(flood_expired, 30, interval_s=0.2, what="flood jobs expired")
    assert coord.registry.rank_count == 2 and set(coord.detectors) == {"jobH"}
    stack.stop_coordinator()
    fresh = stack.start()
    assert set(fresh.registry.jobs) == {"jobH"}


def test_queued_bytes_per_peer_are_bounded(stack: Stack) -> None:
    coord = _coord(stack)
    ing, ctl = coord.ingest, coord.control_sock
    assert ing.getsockopt(zmq.RCVHWM) * ing.getsockopt(zmq.MAXMSGSIZE) <= stack.settings.limits.ingest_queue_bytes_per_peer
    assert ctl.getsockopt(zmq.RCVHWM) * ctl.getsockopt(zmq.MAXMSGSIZE) <= stack.settings.limits.control_queue_bytes_per_peer
    big = stack.dealer()  # a 15 MB batch (the flood) is over the limit: ZeroMQ drops it unread
    big.send(b'{"kind":"node_batch","v":1,"node_id":"big","hostname":"h","seq":1,"ts_unix_s":1,"messages":[' +
             b",".join([json.dumps(wire.to_dict(step("jobX", 0, 1))).encode()] * 100_000) + b"]}")
    ok = stack.dealer()
    ok.send(batch("ok", hello("jobB", 0, world=1)))
    wait_for(lambda: job_view(stack.control("status"), "jobB") is not None, 20)
    assert coord.counters["received"] == 1 and "big" not in coord.registry.nodes


def test_paths_are_pinned_live_and_a_change_is_alerted(stack: Stack, short_tmp: Path) -> None:
    (short_tmp / "cfg" / "jobP").mkdir(parents=True)
    node = stack.dealer()
    node.send(batch("n1", hello("jobP", 0, root=short_tmp)))
    wait_for(lambda: job_view(stack.control("status"), "jobP") is not None, 20)
    other = stack.dealer()
    moved = {"profiler_config_path": str(short_tmp / "cfg" / "other"), "prof_root": str(short_tmp / "prof" / "x")}
    other.send(batch("n2", hello("jobP", 1, root=short_tmp, **moved), hello("jobP", 1, root=short_tmp,
                                                                             profiler_config_path=None)))

    def alerts() -> list[dict]:
        rows = stack.control("events", {"job_id": "jobP", "alerts_only": True})
        return [r["event"] for r in rows if r["event"]["data"].get("reason") == "paths_changed"]

    evs = wait_for(lambda: len(alerts()) == 2 and alerts(), 20, what="two path-change alerts")
    assert {e["data"]["node_id"] for e in evs} == {"n2"}
    job = job_view(stack.control("status"), "jobP")
    assert job is not None and job["profiler_config_path"] == str(short_tmp / "cfg" / "jobP")
    assert job["prof_root"] == str(short_tmp / "prof") and job["ranks_seen"] == 1
    other.send(batch("n2", hello("jobP", 1, root=short_tmp, **moved), seq=2))  # again: counted, not re-alerted
    wait_for(lambda: _coord(stack).metrics.registry.get_sample_value("profwatch_rejected_total",
                                                                     {"reason": "job_id_collision"}) == 3, 20)
    assert len(alerts()) == 2
    # rank 1 from its own node; a step time measured (an arm is refused before one is: no step time is assumed)
    node.send(batch("n1", hello("jobP", 1, root=short_tmp), step("jobP", 0, 1), step("jobP", 1, 1), seq=2))
    wait_for(lambda: job_view(stack.control("status"), "jobP")["ranks_seen"] == 2, 20)
    wait_for(lambda: rank_view(stack.control("status"), "jobP").get(1, {}).get("last_step") == 1, 20)
    plan = stack.control("arm", {"job_id": "jobP", "dry_run": True})  # arming uses the pinned paths
    assert plan["profiler_config_path"] == str(short_tmp / "cfg" / "jobP")
    assert plan["prof_dir"].startswith(str(short_tmp / "prof") + "/") and "/x/" not in plan["prof_dir"]


def test_a_bad_batch_at_the_coordinator_is_split(stack: Stack) -> None:
    old_node = stack.dealer()  # an old node daemon that relays raw rank bytes
    good = [json.dumps(wire.to_dict(step("jobS", 0, s))).encode() for s in range(1, 201)]
    poison = json.dumps(wire.to_dict(step("jobS", 0, 999))).encode("utf-16")
    head = json.dumps({"kind": "node_batch", "v": 1, "node_id": "old", "hostname": "h", "seq": 2, "ts_unix_s": 1.0})
    old_node.send(batch("old", hello("jobS", 0, world=1)))
    old_node.send(head[:-1].encode() + b',"messages":[' + b",".join(good[:100] + [poison] + good[100:]) + b"]}")
    wait_for(lambda: rank_view(stack.control("status"), "jobS").get(0, {}).get("last_step") == 200, 20)
    jsonl = stack.control("dump_telemetry", {"job_id": "jobS"})
    assert sorted(json.loads(x)["step"] for x in jsonl.splitlines() if '"step"' in x) == list(range(1, 201))
