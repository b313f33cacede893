"""Tests for parsing msprof-analyze results by column name (pure)."""

from __future__ import annotations

import json

from profwatch.core.verdict.msprof_results import (
    common_steps,
    parse_agent_stdout,
    parse_cluster_time_summary,
    parse_rank_device_map,
    parse_slow_op_stats,
    parse_slow_rank,
    summarize_advisor,
)


def test_cluster_time_summary_by_name_with_varied_types() -> None:
    rows = [
        {"step": "2", "rank": 1.0, "stepTime": "100.5", "computation": 60, "communication": 30.0,
         "communicationWaitStageTime": None, "communicationTransmitStageTime": 4.0, "free": float("nan"),
         "memory": 1.0},
        {"free": 3, "rank": 0, "step": 2, "stepTime": 100.5},
    ]
    out = parse_cluster_time_summary(rows)
    assert [(s.rank, s.step) for s in out] == [(0, 2), (1, 2)]
    assert out[1].step_time_us == 100.5 and out[1].wait_us == 0.0 and out[1].free_us == 0.0
    assert out[0].free_us == 3.0 and out[0].computation_us == 0.0
    assert common_steps(out) == [2]


def test_slow_rank_ops_and_rank_map() -> None:
    assert parse_slow_rank([{"rankId": "2", "slowAffectCount": 12.0}, {"rankId": 3, "slowAffectCount": 0}]) == {2: 12}
    ops = parse_slow_op_stats([{"SlowRank": "2,5", "OpName": "op", "GroupName": "g", "Timestamp": 9, "MeanNs": "4.5"}])
    assert ops[0]["slow_ranks"] == [2, 5] and ops[0]["MeanNs"] == 4.5 and ops[0]["SumNs"] == 0.0
    assert parse_rank_device_map([{"rankId": 1, "deviceId": 1, "profilePath": "/p"}]) == {1: "/p"}


def test_agent_stdout_and_advisor_summary() -> None:
    message = {
        "db_path": "x", "tables": ["ClusterCommunicationMatrix"],
        "problems": {"headers": ["category", "description"],
                     "data": [["slow rank", "Computing \n gap"],
                              ["Kernel compare of Rank2 Step3 and Rank0 Step1", ""]]},
        "slow rank": {"headers": ["step", "rank_id", "compute(us)"], "data": [[1, 0, 10.0], [1, 2, 30.0]]},
    }
    text = "+----+\n| table |\n" + json.dumps({"status": "success", "code": 0, "message": message, "log_path": "l"})
    agent = parse_agent_stdout(text)
    assert agent.found and agent.tables == ["ClusterCommunicationMatrix"] and agent.log_path == "l"
    assert not parse_agent_stdout("banner only").found
    summary = summarize_advisor(agent.message)
    assert summary["problems"][0] == {"category": "slow rank", "description": "Computing gap"}
    assert summary["max_compute_rank"] == 2 and summary["ranks_named"] == [0, 2]
    assert summary["sheets"] == ["problems", "slow rank"]
