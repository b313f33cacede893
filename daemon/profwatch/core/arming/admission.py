"""Whether a job can take an arm now: the refusal rules the capture shell applies before planning (pure; time
passed in).

An arm is refused, with a message that says what to fix, when the job announced no usable
``profiler_config_path`` or ``prof_root`` (missing, or refused by the path checks at its hello), when not every
rank of the job is live (a config written before a rank started is never loaded by it:
``docs/torch_npu-dynamic-profile.md``, the mtime rules), when a covered rank has no capture backend for a cause
no capture can get past (``core/arming/availability.py``: ``fatal``), when the torch_npu version of a covered
rank raises on the job's config path in ``dp.init`` (``core/capture/torch_npu_paths.py``), or, with
``config_writer = "node"``, when a node daemon that must write the config for a covered rank has not been heard
from within ``node_timeout_s``. What only may go wrong (ranks running telemetry-only, a path torch_npu warns
about) is a warning of the arm (:func:`arm_warnings`). Other refusals live with the
fact they rest on: a capture in flight (``lifecycle.blocking_capture``, torch_npu's one pending config slot) and
an unmeasured step time (the planner's ``CannotPlanCapture``: an absolute ``start_step`` cannot be placed
without it, and no step time is ever assumed).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from profwatch.core.arming.availability import Unavailable, unavailable
from profwatch.core.capture.torch_npu_paths import PathVerdict, check_config_path
from profwatch.core.fleet.registry import JobState, NodeState


def covered_unavailable(job: JobState, covered: Collection[int]) -> Unavailable | None:
    """The live ranks among ``covered`` that have no capture backend, with the cause (``availability.unavailable``;
    ``fatal``: no capture can reach them), or None when every one has a backend."""
    return unavailable((r.rank, r.hostname, r.backend, r.backend_error, job.profiler_config_path)
                       for r in job.ranks.values() if not r.left and r.rank in covered)


def torch_npu_path(job: JobState, covered: Collection[int], *, config_path_is_link: bool) -> PathVerdict | None:
    """torch_npu's verdict on the job's config path under the covered live ranks' versions, the raising one first
    (None: no problem, or no version known). ``config_path_is_link``: the path is a symbolic link (read by the
    caller: this module does no I/O)."""
    path = job.profiler_config_path
    versions = {r.torch_npu for r in job.ranks.values() if r.torch_npu and not r.left and r.rank in covered}
    if not path or not versions:
        return None
    verdicts = [v for v in (check_config_path(path, ver, config_path_is_link) for ver in sorted(versions)) if v]
    return min(verdicts, key=lambda v: v.severity != "raise", default=None)


def arm_warnings(job: JobState, covered: Collection[int], *, config_path_is_link: bool) -> list[str]:
    """What may go wrong with an arm of ``covered`` that is not refused (shown by the arm and its dry run): ranks
    without a capture backend of their own, a config path the ranks' torch_npu warns about."""
    partial = covered_unavailable(job, covered)
    path = torch_npu_path(job, covered, config_path_is_link=config_path_is_link)
    return ([partial.detail()] if partial is not None else []) + (
        [f"profiler_config_path {job.profiler_config_path!r}: {path.detail()}"] if path is not None else [])


def _path_hint(roots_key: str) -> str:
    """Where to look when a job's path is unusable: the hello's refusal is an alert of its own."""
    return (f" (none given, or refused at its hello, e.g. outside [coordinator] {roots_key}: the job's "
            "path_refused alert names the path and why)")


def arm_refusal(job: JobState, rank_list: Sequence[int] | None, nodes: Mapping[str, NodeState], now: float, *,
                config_writer: str, node_timeout_s: float, config_path_is_link: bool = False) -> str | None:
    """Why ``job`` cannot take an arm covering ``rank_list`` (None: every rank) at ``now`` (unix s), or None when
    it can. ``nodes``: the registry's node map (``last_seen_unix_s``); ``config_writer``: ``"coordinator"`` or
    ``"node"``; ``config_path_is_link``: the job's config path is a symbolic link (read by the caller). The rules
    are checked in the module doc's order and the first one that fails is named."""
    if not job.profiler_config_path:
        return f"job {job.job_id} announced no usable profiler_config_path{_path_hint('allowed_config_roots')}"
    if not job.prof_root:
        return f"job {job.job_id} announced no usable prof_root{_path_hint('allowed_prof_roots')}"
    live = [r for r in job.ranks.values() if not r.left]
    if not live:
        return f"job {job.job_id} has no live ranks (all {len(job.ranks)} left)"
    if len(live) < job.world_size:
        left = sorted(r.rank for r in job.ranks.values() if r.left)
        return (f"only {len(live)}/{job.world_size} ranks are live"
                + (f" (left: {left})" if left else " (the others have not started yet)")
                + "; torch_npu ignores configs written before every rank started")
    covered = set(rank_list) if rank_list else {r.rank for r in live}
    gone = covered_unavailable(job, covered)
    if gone is not None and gone.fatal:
        return gone.detail()
    path = torch_npu_path(job, covered, config_path_is_link=config_path_is_link)
    if path is not None and path.severity == "raise":
        return f"profiler_config_path {job.profiler_config_path!r}: {path.detail()}"
    if config_writer == "node":
        for node_id in sorted({r.node_id for r in live if r.rank in covered and r.node_id}):
            node = nodes.get(node_id)
            if node is None or now - node.last_seen_unix_s > node_timeout_s:
                heard = f"last heard {now - node.last_seen_unix_s:.0f} s ago" if node is not None else "never heard"
                return (f"node {node_id} is down ({heard}): it writes the config for its ranks "
                        "(config_writer = \"node\"); start its node daemon first")
    return None
