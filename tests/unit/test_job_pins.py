"""Job id collisions at a node (pure): a second job with the same id is refused while the first's processes are
alive, under another uid always; a new run (every old process gone) re-pins."""

from __future__ import annotations

import pytest

from profwatch.core.fleet.job_pins import JobIdCollision, JobPins, alive_after_s

A = ("/cfg/a", "/prof")
B = ("/cfg/b", "/prof")


def pins() -> JobPins:
    return JobPins(expiry_s=900.0, rebind_after_s=30.0, max_jobs=8, max_pids=16)


def hello(p: JobPins, pid: int, now: float, paths: tuple[str, str] = A, uid: int = 1000, rank: int = 0) -> None:
    p.check("j", uid, pid, now, kind="hello", rank=rank, paths=paths)


def step(p: JobPins, pid: int, now: float, uid: int = 1000, step_time_s: float = 0.1) -> None:
    p.check("j", uid, pid, now, kind="step", rank=0, step_time_s=step_time_s)


def test_other_paths_while_the_first_job_is_alive_collide_and_every_later_message_is_refused() -> None:
    p = pins()
    hello(p, 10, 0.0)
    hello(p, 11, 0.0, rank=1)
    step(p, 10, 5.0)
    with pytest.raises(JobIdCollision) as ei:
        hello(p, 20, 6.0, B)
    c = ei.value
    assert c.new and c.reason == "job_id_collision" and c.collision.reason == "paths_changed"
    assert c.collision.owner_uid == 1000 and c.collision.owner_paths == A and c.collision.paths == B
    assert "give each job its own job id" in str(c)
    for n in range(3):  # its steps never pass: they would move the first job's counters
        with pytest.raises(JobIdCollision) as ei:
            step(p, 20, 7.0 + n)
        assert not ei.value.new and ei.value.collision.refused == 2 + n
    step(p, 10, 8.0)  # the first job goes on
    hello(p, 12, 8.0, A, rank=2)  # and so do its other processes


def test_another_uid_is_a_squatted_job_id() -> None:
    p = pins()
    hello(p, 10, 0.0)
    with pytest.raises(JobIdCollision) as ei:
        hello(p, 30, 1.0, A, uid=2000)
    assert ei.value.reason == "job_uid_mismatch" and ei.value.collision.reason == "uid_mismatch"
    assert ei.value.collision.owner_uid == 1000 and ei.value.collision.uid == 2000
    with pytest.raises(JobIdCollision):
        step(p, 30, 2.0, uid=2000)


def test_same_paths_same_uid_is_the_same_job() -> None:
    p = pins()
    hello(p, 10, 0.0)
    hello(p, 11, 1.0, rank=1)
    step(p, 11, 2.0)
    assert not p.colliders


@pytest.mark.parametrize(("step_time_s", "silent_s", "collides"), [
    (0.1, 29.0, True), (0.1, 31.0, False),  # the usual rule: 30 s of silence
    (20.0, 50.0, True), (20.0, 61.0, False),  # slow steps: 3 x the step time
])
def test_a_new_run_when_every_old_process_is_silent(step_time_s: float, silent_s: float, collides: bool) -> None:
    p = pins()
    hello(p, 10, 0.0)
    step(p, 10, 1.0, step_time_s=step_time_s)
    if collides:
        with pytest.raises(JobIdCollision):
            hello(p, 20, 1.0 + silent_s, B)
    else:
        hello(p, 20, 1.0 + silent_s, B)  # a requeue in another folder: re-pinned, not a collision
        assert p.pins["j"].paths == B
        with pytest.raises(JobIdCollision):
            hello(p, 10, 2.0 + silent_s, A)  # the old paths are the other job now


def test_a_bye_ends_a_process_at_once() -> None:
    p = pins()
    hello(p, 10, 0.0)
    p.check("j", 1000, 10, 1.0, kind="bye", rank=0)
    hello(p, 20, 2.0, B)
    assert p.pins["j"].paths == B


def test_bounded() -> None:
    p = JobPins(expiry_s=900.0, rebind_after_s=30.0, max_jobs=2, max_pids=2)
    hello(p, 10, 0.0)
    for pid in range(20, 30):
        with pytest.raises(JobIdCollision):
            hello(p, pid, 1.0, B)
    assert len(p.colliders) == 2
    for pid in range(40, 45):
        hello(p, pid, 1.0, A)
    assert len(p.pins["j"].pids) == 2
    for j in range(5):
        p.check(f"x{j}", 1000, 50 + j, 1.0, kind="hello", rank=0, paths=A)
    assert len(p.pins) == 2


def test_alive_rule() -> None:
    assert alive_after_s(30.0, 0.1) == 30.0 and alive_after_s(30.0, 40.0) == 120.0
