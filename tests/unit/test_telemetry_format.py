"""The telemetry record format shared by the coordinator's dump and replay (daemon/profwatch/core/fleet/telemetry.py)."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from profwatch.core.fleet.telemetry import TelemetryRecord, dump_jsonl, window_records


def test_window_records_rebuild_timestamps_backwards_and_round_trip() -> None:
    rows = window_records("j1", 3, [(10, 0.5), (11, 0.25), (12, 1.0)], last_ts_unix_s=100.0)
    assert [(r["step"], r["ts_unix_s"]) for r in rows] == [(12, 100.0), (11, 99.0), (10, 98.75)]
    text = dump_jsonl(sorted(rows, key=lambda r: r["step"]), world_size=4)
    recs = [TelemetryRecord.model_validate(json.loads(line)) for line in text.splitlines()]
    assert [(r.rank, r.step, r.step_time_s, r.world_size) for r in recs] == [(3, 10, 0.5, 4), (3, 11, 0.25, 4),
                                                                             (3, 12, 1.0, 4)]


def test_dump_keeps_only_record_keys_and_renders_bye() -> None:
    text = dump_jsonl([{"job_id": "j", "rank": 0, "step": 1, "step_time_s": 0.1, "ts_unix_s": 1.0, "v": 1,
                        "kind": "step", "flags": [], "capturing": False, "extra": "x"},
                       {"kind": "bye", "job_id": "j", "rank": 0, "step": 1, "ts_unix_s": 2.0, "v": 1}])
    a, b = (json.loads(line) for line in text.splitlines())
    assert a == {"job_id": "j", "rank": 0, "step": 1, "step_time_s": 0.1, "ts_unix_s": 1.0}
    assert b == {"kind": "bye", "job_id": "j", "rank": 0, "step": 1, "ts_unix_s": 2.0}
    with pytest.raises(ValueError):
        dump_jsonl([{"job_id": "j", "rank": 0, "step": 1, "step_time_s": float("nan"), "ts_unix_s": 1.0}])


def test_record_validation() -> None:
    with pytest.raises(ValidationError):
        TelemetryRecord.model_validate({"job_id": "j", "rank": 4, "world_size": 4, "step": 1, "step_time_s": 1,
                                        "ts_unix_s": 1})
    with pytest.raises(ValidationError):
        TelemetryRecord.model_validate({"job_id": "j", "rank": 0, "step": 1, "ts_unix_s": 1})
