"""Job id collisions at a node daemon (pure; time passed in as ``now``): which local processes own a job id, and
which are another job that happens to use the same id.

A job id is pinned on a node by the first process that speaks for it: its uid (the ipc peer credentials) and the
paths of its first hello (``profiler_config_path``, ``prof_root``). Another process then claims the same id

- under another uid while the pin holds: a collision, reason ``uid_mismatch`` (a squatted job id,
  ``docs/security.md``);
- with other paths while a process that said hello with the pinned paths is still *alive*: a collision, reason
  ``paths_changed`` (two jobs started with one id, e.g. the same ``SLURM_JOB_ID`` in two folders).

Every later message of a colliding process is refused and counted, so the two jobs never mix: its steps never
reach the coordinator, where they would move the first job's step counters back and open generations. When every
pinned process is gone (said bye, or silent for longer than :func:`alive_after_s`), a hello with other paths under
the same uid re-pins the job instead: that is a new run of the job (``docs/generations.md``), not a collision.

Notes:
    A pinned process is alive while it was heard within ``max(rank_rebind_after_s, 3 x its last step time)`` and
    did not say bye: the same silence after which a rank may move to another node, stretched for slow steps.
    Memory is bounded: ``max_jobs`` pins (LRU), ``max_pids`` processes per pin and ``max_jobs`` colliding
    processes (LRU); a process forgotten at a bound is judged again at its next hello.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Literal

from profwatch.core.messages import MessageRejected

CollisionReason = Literal["paths_changed", "uid_mismatch"]
Paths = tuple[str | None, str | None]


@dataclass(slots=True)
class _Process:
    last_seen: float
    step_time_s: float = 0.0
    left: bool = False


@dataclass(slots=True)
class JobPin:
    """Who owns a job id on this node: the uid, the paths of the first hello and the processes that said it."""

    uid: int
    paths: Paths | None
    last_seen: float
    pids: OrderedDict[int, _Process] = field(default_factory=OrderedDict)


@dataclass(frozen=True, slots=True)
class Collision:
    """A process that claims a job id another job owns on this node (``job_id_collision``).

    ``owner_uid``/``owner_paths``: the pinned job's; ``uid``/``pid``/``rank``/``paths``: the claimant's (``paths``
    from its hello; ``(None, None)`` when its first message was not a hello). ``refused``: its messages refused so
    far (this one included)."""

    job_id: str
    reason: CollisionReason
    owner_uid: int
    owner_paths: Paths | None
    uid: int
    pid: int | None
    rank: int
    paths: Paths
    since: float
    refused: int = 1

    def detail(self) -> str:
        """One line saying what collided, with whom, and what was done."""
        if self.reason == "uid_mismatch":
            what = f"runs as uid {self.owner_uid} here; process {self.pid} (rank {self.rank}) runs as uid {self.uid}"
        else:
            owner = self.owner_paths or (None, None)
            what = (f"was started with profiler_config_path={owner[0]!r} prof_root={owner[1]!r}; process {self.pid} "
                    f"(rank {self.rank}, uid {self.uid}) says {self.paths[0]!r} {self.paths[1]!r} while the first "
                    "job's processes are alive")
        return (f"job id collision: job {self.job_id} {what}. The second job's messages are refused "
                f"({self.refused} so far); give each job its own job id (PROFWATCH_JOB_ID)")


class JobIdCollision(MessageRejected):
    """A message of a colliding process was refused; ``new`` is True the first time this process collided (report
    it). ``reason`` (the counter label): ``job_uid_mismatch`` or ``job_id_collision`` (paths)."""

    def __init__(self, collision: Collision, new: bool) -> None:
        super().__init__("job_uid_mismatch" if collision.reason == "uid_mismatch" else "job_id_collision",
                         collision.detail())
        self.collision = collision
        self.new = new


def alive_after_s(rebind_after_s: float, step_time_s: float) -> float:
    """Silence (s) after which a pinned process counts as gone: ``max(rebind_after_s, 3 x step_time_s)``."""
    return max(rebind_after_s, 3.0 * step_time_s)


class JobPins:
    """The job id pins of one node daemon.

    Args:
        expiry_s: a pin whose processes were all silent this long lapses (``limits.job_expiry_s``).
        rebind_after_s: base of :func:`alive_after_s` (``limits.rank_rebind_after_s``).
        max_jobs: pins and colliding processes kept (each an LRU).
        max_pids: processes remembered per pin.
    """

    def __init__(self, expiry_s: float, rebind_after_s: float, max_jobs: int, max_pids: int = 1024) -> None:
        self.expiry_s = expiry_s
        self.rebind_after_s = rebind_after_s
        self.max_jobs = max_jobs
        self.max_pids = max_pids
        self.pins: OrderedDict[str, JobPin] = OrderedDict()
        self.colliders: OrderedDict[tuple[str, int], Collision] = OrderedDict()

    def check(self, job_id: str, uid: int, pid: int | None, now: float, *, kind: str, rank: int,
              paths: Paths | None = None, step_time_s: float = 0.0) -> None:
        """Admit one message of process ``pid`` (uid ``uid``) for ``job_id``, or raise.

        Args:
            kind: the message kind (``hello`` carries ``paths``; ``bye`` marks the process gone; ``step`` carries
                ``step_time_s``).
        Raises:
            JobIdCollision: the process collides (now or since an earlier message); nothing is pinned for it.
        """
        key = (job_id, pid) if pid is not None else None
        known = self.colliders.get(key) if key is not None else None
        if known is not None:
            known = _bump(known)
            self.colliders[key] = known  # type: ignore[index]
            self.colliders.move_to_end(key)  # type: ignore[arg-type]
            raise JobIdCollision(known, new=False)
        pin = self.pins.get(job_id)
        if pin is not None and pin.last_seen < now - self.expiry_s:
            pin = None  # lapsed: the job id is free again
        if pin is None:
            self._pin(job_id, JobPin(uid=uid, paths=paths if kind == "hello" else None, last_seen=now))
            pin = self.pins[job_id]
        elif pin.uid != uid:
            self._collide(Collision(job_id, "uid_mismatch", pin.uid, pin.paths, uid, pid, rank,
                                    paths or (None, None), now))
        elif kind == "hello" and paths is not None and pin.paths is not None and paths != pin.paths \
                and pid not in pin.pids:
            if self._alive(pin, now):
                self._collide(Collision(job_id, "paths_changed", pin.uid, pin.paths, uid, pid, rank, paths, now))
            pin.paths, pin.pids = paths, OrderedDict()  # every pinned process is gone: a new run of the job
        elif kind == "hello" and pin.paths is None:
            pin.paths = paths
        pin.last_seen = now
        self.pins.move_to_end(job_id)
        if pid is not None:
            proc = pin.pids.get(pid) or _Process(now)
            proc.last_seen, proc.left = now, kind == "bye"
            if kind == "step" and step_time_s > 0:
                proc.step_time_s = step_time_s
            pin.pids[pid] = proc
            pin.pids.move_to_end(pid)
            while len(pin.pids) > self.max_pids:
                pin.pids.popitem(last=False)

    def _alive(self, pin: JobPin, now: float) -> bool:
        return any(not p.left and now - p.last_seen < alive_after_s(self.rebind_after_s, p.step_time_s)
                   for p in pin.pids.values())

    def _pin(self, job_id: str, pin: JobPin) -> None:
        self.pins[job_id] = pin
        self.pins.move_to_end(job_id)
        while len(self.pins) > self.max_jobs:
            self.pins.popitem(last=False)

    def _collide(self, c: Collision) -> None:
        if c.pid is not None:
            self.colliders[(c.job_id, c.pid)] = c
            while len(self.colliders) > self.max_jobs:
                self.colliders.popitem(last=False)
        raise JobIdCollision(c, new=True)


def _bump(c: Collision) -> Collision:
    return Collision(c.job_id, c.reason, c.owner_uid, c.owner_paths, c.uid, c.pid, c.rank, c.paths, c.since,
                     c.refused + 1)
