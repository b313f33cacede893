"""Arming edges with a live coordinator (real sockets, the real config writer): a capture whose window lies
ahead when its job ends is cancelled (reason job ended) and its arm idled; an arm too far ahead is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from profwatch.adapters.zmq.control import ControlError, call
from tests.conftest import wait_for
from tests.integration.test_coordinator_captures import Harness


@pytest.fixture
def harness(short_tmp: Path):
    hs: list[Harness] = []

    def make(**kw: object) -> Harness:
        h = Harness(short_tmp, **kw)
        hs.append(h)
        return h

    yield make
    for h in hs:
        h.close()


def _config(cfg: Path) -> dict:
    try:
        return json.loads((cfg / "profiler_config.json").read_text())
    except (OSError, ValueError):
        return {}


def test_a_capture_whose_window_is_ahead_ends_with_its_job_and_a_far_arm_is_refused(harness, short_tmp: Path) -> None:
    h = harness(job_end_after_s=3.0)
    cfg, prof = short_tmp / "cfg" / "jobE", short_tmp / "prof"
    cfg.mkdir(parents=True)
    h.hellos("jobE", 2, cfg, prof)
    h.steps("jobE", 2, 12)
    wait_for(lambda: h.furthest("jobE") == 12, 20)
    # 0.5 s steps: one hour is 7200 steps ahead, more than 1000
    with pytest.raises(ControlError, match="would likely outlive the job"):
        call(h.control, "arm", {"job_id": "jobE", "start_step": 12 + 7201})
    with pytest.raises(ControlError, match="would likely outlive the job"):
        call(h.control, "arm", {"job_id": "jobE", "start_step": 12 + 7201, "dry_run": True})
    res = call(h.control, "arm", {"job_id": "jobE", "start_step": 12 + 7000})
    wait_for(lambda: _config(cfg).get("start_step") == 12 + 7000, 20, what="the arm written")
    # no rank reports any more: the job ends, the window was never reached
    cap = wait_for(lambda: (c := h.last_capture("jobE")) and c.get("state") == "cancelled" and c, 30,
                   what="the capture cancelled at job end")
    assert cap["capture_id"] == res["capture_id"] and "job ended" in cap["outcome"]
    wait_for(lambda: _config(cfg).get("start_step") == 0, 20, what="the idle config over the arm")
    evs = h.events("jobE")
    assert any(e["type"] == "io.profwatch.job_ended.v1" for e in evs)
    assert [e["data"]["reason"] for e in evs if e["type"] == "io.profwatch.capture.v1"
            and e["data"].get("event") == "cancelled"] == ["job ended"]
