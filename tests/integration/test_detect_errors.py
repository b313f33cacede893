"""A failure while acting on one anomaly does not hide the anomalies after it in the same node batch (a real
coordinator object with its real sockets; the detector is a stand-in that reports an anomaly on chosen reports)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from profwatch.config import load_settings
from profwatch.coordinator import Coordinator
from tests.integration.live_stack import free_port, loopback_coordinator


class _Detector:
    """``observe_many`` as the job detector's contract: up to and including the first report with an anomaly."""

    def __init__(self, anomalous: set[int], fail_at: int | None = None) -> None:
        self.anomalous, self.fail_at, self.seen = anomalous, fail_at, []

    def observe_many(self, reports: list[Any], now: float, start: int = 0) -> tuple[int, list[str]]:
        for i in range(start, len(reports)):
            if i == self.fail_at:
                raise RuntimeError("detector broke")
            self.seen.append(reports[i].step)
            if reports[i].step in self.anomalous:
                return i + 1, [f"anomaly@{reports[i].step}"]
        return len(reports), []


def _coordinator(root: Path) -> Coordinator:
    ports = {k: free_port() for k in ("ingest", "control", "pub")}
    return Coordinator(load_settings(None, coordinator=loopback_coordinator(root, ports)))


def _reports(n: int) -> list[SimpleNamespace]:
    return [SimpleNamespace(kind="step", job_id="j", rank=0, step=s) for s in range(1, n + 1)]


def test_an_anomaly_whose_handling_fails_does_not_stop_the_batch(tmp_path: Path) -> None:
    coord = _coordinator(tmp_path)
    try:
        det = _Detector({2, 4, 6})
        coord.detectors["j"] = det  # type: ignore[assignment]
        handled: list[str] = []

        def on_anomaly(an: str, now: float) -> None:
            if an == "anomaly@2":
                raise RuntimeError("arming failed")
            handled.append(an)

        coord._on_anomaly = on_anomaly  # type: ignore[method-assign]
        coord._detect(SimpleNamespace(job_id="j", world_size=1), _reports(7), "n0", 1.0)  # type: ignore[arg-type]
        assert det.seen == [1, 2, 3, 4, 5, 6, 7]  # every report judged once
        assert handled == ["anomaly@4", "anomaly@6"]
        assert coord.counters["internal_errors"] == 1
    finally:
        coord.close()


def test_a_detector_that_fails_stops_judging_the_batch_without_judging_a_report_twice(tmp_path: Path) -> None:
    coord = _coordinator(tmp_path)
    try:
        det = _Detector({2}, fail_at=3)
        coord.detectors["j"] = det  # type: ignore[assignment]
        handled: list[str] = []
        coord._on_anomaly = lambda an, now: handled.append(an)  # type: ignore[method-assign]
        coord._detect(SimpleNamespace(job_id="j", world_size=1), _reports(6), "n0", 1.0)  # type: ignore[arg-type]
        assert det.seen == [1, 2, 3] and handled == ["anomaly@2"]
        assert coord.counters["internal_errors"] == 1
    finally:
        coord.close()
