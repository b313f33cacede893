"""Which torch_npu leftovers a node reports as stale (pure judgement over a scanned DpState)."""

from __future__ import annotations

from profwatch.core.fleet.node_checks import stale_dp_findings
from rankhook.backends.dp_state import DpState, MonitorProc, ShmBlock

T = 1_800_000_000.0


def test_an_orphaned_monitor_and_its_segment_are_stale_whatever_their_age() -> None:
    st = DpState((ShmBlock("/dev/shm/DynamicProfileNpuShm2027011508", T - 5, 5.0),),
                 (MonitorProc(4242, 1, True), MonitorProc(77, 300, False)))
    text = stale_dp_findings(st, T)
    assert "orphaned DynMonitorProc pid 4242" in text and "DynamicProfileNpuShm2027011508" in text
    assert "pid 77" not in text  # a monitor with a live parent belongs to a running job


def test_a_segment_older_than_the_nodes_torch_npu_ranks_is_stale() -> None:
    old = ShmBlock("/dev/shm/DynamicProfileNpuShm2027011507", T - 3600, 3600.0)
    fresh = ShmBlock("/dev/shm/DynamicProfileNpuShm2027011508", T - 60, 60.0)
    assert "Shm2027011507 (last written 3600 s ago)" in stale_dp_findings(DpState((old, fresh)), T - 100)
    assert "Shm2027011508" not in stale_dp_findings(DpState((old, fresh)), T - 100)
    assert stale_dp_findings(DpState((fresh,)), T - 100) == ""  # the running job's own segment
    assert stale_dp_findings(DpState((old,)), None) == ""  # no torch_npu rank here: another job's business
    assert stale_dp_findings(DpState(), T) == ""
