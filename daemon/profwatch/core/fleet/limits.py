"""Memory bounds of the coordinator and the node daemon (pure): caps on jobs, ranks and nodes, job expiry, queued
bytes per peer, and the peak those bounds imply.

Per-rank state is allocated lazily: a hello naming a huge ``world_size`` creates one job record; a rank record
(and its step window) exists only once that rank reports, and a job's detector (per-rank tables of
``world_size`` entries) only once a step arrives and only while :attr:`LimitSettings.max_ranks_total` covers it.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from profwatch.core.fleet.step_window import CPU_S_STEP_BYTES, CPU_SAMPLE_STEP_BYTES, STEP_TIME_BYTES

MIB = 1024 * 1024

# Measured with tracemalloc (CPython 3.11, 64-bit): a rank record ~480 B, a full 1000-step window ~8.2 KB, detector
# tables 40 B per rank of world_size at creation (more while steps are open). Rounded up.
RANK_RECORD_BYTES = 1200
"""One rank record without its window (dataclass, dict slot, strings)."""
STEP_BYTES = STEP_TIME_BYTES + CPU_SAMPLE_STEP_BYTES + CPU_S_STEP_BYTES
"""One step in a rank's window at most without work or stages (24): int32 step + float32 time, the CPU sample rings
(int32 ``cpu_at_step`` + float64 ``cpu_total_s``) of a rank whose hook samples CPU time (the current one) and the
``cpu_s`` ring (float32) of a rank whose reports also carry an older hook's ``cpu_s`` (a rank sending both keeps
both; ``step_window``). Work and stage rings (4 bytes per step and series) come on top where ranks report them."""
DETECTOR_BYTES_PER_RANK = 200
"""Detector per-rank tables (five list slots, open-step entries) per rank of the job's ``world_size``."""
JOB_RECORD_BYTES = 16 * 1024
"""One job record and its detector's fixed state (windows of job step times, baselines)."""
NODE_RECORD_BYTES = 8 * 1024
"""One node record: 4 KB, and its host-load series (``core/fleet/host_load.py``: 180 buckets, about 3.3 KB)."""
CLAIM_BYTES = 1024
"""One held hello of a claimed job generation (pruned: no versions, counters or paths; ``generations.py``)."""


class LimitSettings(BaseModel):
    """``[limits]``: caps that bound memory under floods (a flood is refused and counted, never stored)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    max_jobs_total: int = Field(1024, ge=1, le=1_000_000, description="jobs the coordinator tracks at once")
    max_jobs_per_node: int = Field(64, ge=1, le=100_000, description="jobs with a rank on one node")
    max_jobs_per_node_per_uid: int = Field(16, ge=1, le=100_000,
                                           description="jobs of one user (attested uid) with a rank on one node")
    max_ranks_total: int = Field(65_536, ge=1, le=1 << 24,
                                 description="rank records, and (separately) world sizes of jobs with a detector")
    max_ranks_per_node: int = Field(1024, ge=1, le=1 << 24,
                                    description="rank records bound to one node (a node hosts a handful of ranks)")
    max_nodes: int = Field(4096, ge=1, le=1_000_000, description="node identities the coordinator tracks")
    job_expiry_s: float = Field(900.0, gt=0, le=30 * 86400,
                                description="a job none of whose ranks reported for this long is forgotten")
    rank_rebind_after_s: float = Field(
        30.0, ge=0, le=86400,
        description="a rank bound to one node may say hello from another only after this much silence (or a bye)")
    ingest_queue_bytes_per_peer: int = Field(
        16 * MIB, ge=MIB, le=1 << 34, description="bytes a node connection may have queued at the coordinator")
    control_queue_bytes_per_peer: int = Field(8 * MIB, ge=MIB, le=1 << 32, description=(
        "bytes a control connection may have queued at the coordinator"))
    rank_queue_bytes_per_peer: int = Field(
        16 * MIB, ge=MIB, le=1 << 32, description="bytes one rank connection may have queued at its node daemon")
    node_max_cached_hellos: int = Field(4096, ge=1, le=1_000_000,
                                        description="rank hellos a node keeps for re-registration (LRU)")
    state_retry_queue_bytes: int = Field(
        32 * MIB, ge=MIB, le=1 << 34,
        description="writes the coordinator keeps for a retry while its state store fails (disk full); beyond it "
                    "the oldest events are dropped, non-alerts first (counted)")
    state_retry_queue_items: int = Field(20_000, ge=100, le=10_000_000,
                                         description="writes kept for a retry while the state store fails")

    def hwm_for(self, queue_bytes: int, max_message_bytes: int) -> int:
        """ZeroMQ receive high-water mark (messages) that keeps a peer's queue under ``queue_bytes``."""
        return max(1, queue_bytes // max_message_bytes)

    def coordinator_peak_bytes(self, window_steps: int, max_batch_bytes: int, control_request_bytes: int,
                               expected_peers: int = 64) -> dict[str, int]:
        """The coordinator's state bound in bytes, by part, for ``window_steps`` per rank.

        ``queues`` counts ``expected_peers`` node connections at their full ingest queue plus one control client;
        ``parse`` is one batch being decoded (about 12x its bytes as Python objects). Interpreter, libraries and
        the SQLite cache come on top (about 120 MiB measured at start).
        """
        ingest_hwm = self.hwm_for(self.ingest_queue_bytes_per_peer, max_batch_bytes)
        control_hwm = self.hwm_for(self.control_queue_bytes_per_peer, control_request_bytes)
        parts = {
            "ranks": min(self.max_ranks_total, self.max_ranks_per_node * self.max_nodes)
            * (RANK_RECORD_BYTES + STEP_BYTES * window_steps),
            "detectors": self.max_ranks_total * DETECTOR_BYTES_PER_RANK,
            "jobs": self.max_jobs_total * JOB_RECORD_BYTES,
            "nodes": self.max_nodes * NODE_RECORD_BYTES,
            "queues": expected_peers * ingest_hwm * max_batch_bytes + control_hwm * control_request_bytes,
            "parse": 12 * max_batch_bytes,
            "claims": (64 * self.max_jobs_total + 2 * self.max_ranks_total) * CLAIM_BYTES,
            "store_retry": self.state_retry_queue_bytes,
        }
        parts["total"] = sum(parts.values())
        return parts
