"""What a node daemon accepts from the ranks on its host (pure; time passed in as ``now``).

One call per message: strict UTF-8 JSON validation (``daemon/profwatch/core/messages.py``), the size limit, the job's uid
pin, and the re-encoded bytes to relay (never the rank's raw bytes: what reaches the coordinator is what was
validated). Hellos are kept for re-registration after a coordinator restart; both tables are bounded LRUs. A hello
of a new shape of its job (another ``world_size`` or ``restart_count``: an elastic restart, ``docs/generations.md``)
drops the job's cached hellos of older or unknown restart counts, so a re-registration never replays the old shape.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from typing import Any

from profwatch.core.fleet.job_pins import JobPins
from profwatch.core.fleet.limits import LimitSettings
from profwatch.core.messages import MessageRejected, parse_rank_message
from rankhook import wire


class RankIntake:
    """Validation state of one node daemon.

    A job is pinned to the uid and paths of the first process that spoke for it on this node (the ipc peer
    credentials; :class:`~profwatch.core.fleet.job_pins.JobPins`): a message for that job from another uid is
    refused (``job_uid_mismatch``) until the pin lapses after ``limits.job_expiry_s`` without messages, and a
    process whose hello names other paths while the job's processes are alive is another job with the same id:
    it and every later message of it are refused (``job_id_collision``). Both raise
    :class:`~profwatch.core.fleet.job_pins.JobIdCollision`. Where the transport gives no uid (tcp), nothing is
    pinned.

    Args:
        limits: ``node_max_cached_hellos`` bounds the hello cache and the pin table; ``max_jobs_per_node`` the
            torch_npu jobs whose dp logs are tailed.
    """

    def __init__(self, limits: LimitSettings | None = None) -> None:
        self.limits = limits or LimitSettings.model_validate({})
        self.hellos: OrderedDict[tuple[str, int], bytes] = OrderedDict()
        self._shapes: dict[tuple[str, int], tuple[int, int | None]] = {}  # (world_size, restart_count) per hello
        self._job_shape: dict[str, tuple[int, int | None]] = {}  # the shape of each job's latest hello
        self.pins = JobPins(self.limits.job_expiry_s, self.limits.rank_rebind_after_s,
                            self.limits.node_max_cached_hellos)
        self.dp_jobs: dict[str, str] = {}  # job_id -> profiler_config_path (torch_npu jobs)

    def accept(self, payload: bytes, uid: int | None, now: float, pid: int | None = None) -> tuple[Any, bytes]:
        """Validate one rank message; return ``(typed message, bytes to relay)``. ``uid``/``pid``: the sending
        process's credentials from the transport (None where it gives none); a hello carries them as
        ``peer_uid``/``peer_pid``, a step report as ``peer_pid`` (the process its step counter is credited to),
        whatever the rank wrote there.

        Raises:
            JobIdCollision: the sending process claims a job id another job owns here (its ``collision`` says
                how; ``new`` the first time for that process).
            MessageRejected: ``oversize`` (over ``wire.MAX_MESSAGE_BYTES``), or any reason of
                :func:`profwatch.core.messages.parse_rank_message`.
        """
        if len(payload) > wire.MAX_MESSAGE_BYTES:
            raise MessageRejected("oversize", f"{len(payload)} bytes > {wire.MAX_MESSAGE_BYTES} (uid {uid})")
        msg = parse_rank_message(payload, peer_pid=pid)
        if msg.kind == "step" and msg.peer_pid != pid:  # a version-1 report, or a rank that wrote one itself
            msg = dataclasses.replace(msg, peer_pid=pid)
        if uid is not None:
            paths = (msg.profiler_config_path, msg.prof_root) if msg.kind == "hello" else None
            self.pins.check(msg.job_id, uid, pid, now, kind=msg.kind, rank=msg.rank, paths=paths,
                            step_time_s=msg.step_time_s if msg.kind == "step" else 0.0)
        if msg.kind == "hello":
            msg = dataclasses.replace(msg, peer_uid=uid, peer_pid=pid)
        data = wire.encode(msg)
        if msg.kind == "hello":
            self._cache_hello(msg, data)
        return msg, data

    def _cache_hello(self, msg: wire.RankHello, data: bytes) -> None:
        key = (msg.job_id, msg.rank)
        shape = (msg.world_size, msg.restart_count)
        if self._job_shape.get(msg.job_id, shape) != shape:
            self._drop_older_shapes(msg.job_id, shape)
        self._job_shape[msg.job_id] = shape
        self.hellos[key] = data
        self._shapes[key] = shape
        self.hellos.move_to_end(key)
        while len(self.hellos) > self.limits.node_max_cached_hellos:
            self._shapes.pop(self.hellos.popitem(last=False)[0], None)
        if len(self._job_shape) > 2 * self.limits.node_max_cached_hellos:  # amortised O(1)
            live = {k[0] for k in self.hellos}
            self._job_shape = {j: s for j, s in self._job_shape.items() if j in live}
        if msg.backend == "torch_npu" and msg.profiler_config_path:
            if msg.job_id in self.dp_jobs or len(self.dp_jobs) < self.limits.max_jobs_per_node:
                self.dp_jobs[msg.job_id] = msg.profiler_config_path

    def _drop_older_shapes(self, job_id: str, shape: tuple[int, int | None]) -> None:
        """Forget the job's cached hellos of another shape whose restart count is not newer than ``shape``'s."""
        rc = shape[1]
        for key, old in list(self._shapes.items()):
            if key[0] == job_id and old != shape and (old[1] is None or rc is None or old[1] <= rc):
                self.hellos.pop(key, None)
                del self._shapes[key]
