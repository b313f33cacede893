"""Incremental completeness (pure): RankDirTracker's counts, its decisions against a full assessment of the same
states, the reconcile pass plan, and rank_dir_of (which rank dir an event's path belongs to)."""

from __future__ import annotations

from profwatch.core.batches.completeness import CaptureHint, RankDirState, assess_batches, evaluate_rank_dir
from profwatch.core.batches.prof_layout import RankDirObservation, rank_dir_of
from profwatch.core.batches.tracker import RankDirTracker, expected_count
from tests.unit.test_completeness import NOW, SETTINGS, obs


def _state(o: RankDirObservation) -> RankDirState:
    return evaluate_rank_dir(o, now_unix_s=NOW, settings=SETTINGS)


def _tracker(observations: list[RankDirObservation]) -> RankDirTracker:
    t = RankDirTracker()
    for o in observations:
        t.update(o.path, _state(o))
    return t


def _same(tracker_batches: list, observations: list[RankDirObservation], **kw: object) -> None:
    full = assess_batches(observations, now_unix_s=NOW, settings=SETTINGS, **kw)  # type: ignore[arg-type]
    assert [b.to_json() for b in tracker_batches] == [b.to_json() for b in full]


def test_ready_only_when_every_expected_rank_has_a_finished_dir() -> None:
    t = _tracker([obs(r) for r in range(3)])
    assert t.count("cap") == 3 and not t.ready("cap", 4)  # rank 3 missing
    late = obs(3, stage="parsing")
    t.update(late.path, _state(late))
    assert not t.ready("cap", 4)  # present but still parsing
    done = obs(3)
    t.update(done.path, _state(done))  # the same dir read again: replaced, not counted twice
    assert t.count("cap") == 4 and t.ready("cap", 4)
    (batch,) = t.batch_of("cap", now_unix_s=NOW, settings=SETTINGS, world_size=4)
    assert batch.status == "complete"
    t.update(done.path, None)  # vanished (a re-parse deleted it, or it moved away)
    assert t.count("cap") == 3 and not t.ready("cap", 4) and len(t) == 3


def test_decisions_equal_a_full_assessment_of_the_same_states() -> None:
    cases = [
        [obs(r) for r in range(4)],  # complete
        [obs(0), obs(1), obs(1, pid=9), obs(2), obs(3)],  # rank 1 twice: invalid, both paths named
        [obs(0), obs(1), obs(2), obs(3, db_error="file is not a database")],  # finished, one failed
        [obs(0), obs(1), obs(2), obs(3), obs(4, stage="appearing", offset_s=1)],  # a dir without metadata joins
        [obs(r, capture_id=None) for r in range(4)],  # hand-armed: unstamped
    ]
    for observations in cases:
        t = _tracker(observations)
        _same(t.batches(now_unix_s=NOW, settings=SETTINGS, world_size=4), observations, world_size=4)
        cid = observations[0].metadata.capture_id if observations[0].metadata else None
        hint = CaptureHint(world_size=4)
        picked = t.batch_of(cid, now_unix_s=NOW, settings=SETTINGS, world_size=4, hint=hint)
        full = assess_batches(observations, now_unix_s=NOW, settings=SETTINGS, world_size=4,
                              hints={cid: hint} if cid else None)
        want = [b.to_json() for b in full if cid is None or b.capture_id == cid]
        assert want and [b.to_json() for b in picked if cid is None or b.capture_id == cid] == want


def test_expected_count_sources() -> None:
    assert expected_count(8, CaptureHint(rank_list=(1, 3, 3))) == 2
    assert expected_count(8, None) == 8
    assert expected_count(None, CaptureHint(world_size=4)) == 4
    assert expected_count(None, None) is None


def test_pass_reads_gone_new_pending_then_least_recently_read() -> None:
    a, b, c, d = (obs(r) for r in range(4))
    pending = obs(4, stage="parsing")
    t = RankDirTracker()
    for o in (c, a, b, pending):  # read order: c oldest, then a, b
        t.update(o.path, _state(o))
    assert t.begin_pass([a.path, b.path, c.path, pending.path, d.path]) == 5
    order = []
    while (p := t.next_to_read()) is not None:
        order.append(p)
        t.update(p, _state(next(o for o in (a, b, c, d, pending) if o.path == p)))
    assert order == [d.path, pending.path, c.path, a.path, b.path]  # new, pending, then oldest read first
    t.end_pass()
    assert not t.reconciling
    t.begin_pass([a.path, b.path])  # c, d and pending not found by the walk: read first (gone, or unlistable)
    first = [t.next_to_read() for _ in range(3)]
    assert set(first) == {c.path, d.path, pending.path}


def test_pass_skips_dirs_read_since_it_began_and_resumes() -> None:
    dirs = [obs(r) for r in range(6)]
    t = RankDirTracker()
    t.begin_pass([o.path for o in dirs])
    assert t.reconciling and t.pass_left == 6
    got = [t.next_to_read(), t.next_to_read()]
    for p in got:
        t.update(p, _state(next(o for o in dirs if o.path == p)))  # type: ignore[arg-type]
    t.update(dirs[5].path, _state(dirs[5]))  # an event read the last one meanwhile
    rest = []
    while (p := t.next_to_read()) is not None:
        rest.append(p)
        t.update(p, _state(next(o for o in dirs if o.path == p)))
    assert sorted([*got, *rest]) == sorted(o.path for o in dirs[:5])  # each once; the event's read not repeated
    assert t.reads == 6 and t.reconciling  # open until the reader ends it
    t.end_pass()
    assert t.ready("cap", 4)


def test_rank_dir_of() -> None:
    rd = "host_12_20260101120000000_ascend_pt"
    assert rank_dir_of("/p", f"/p/{rd}/ASCEND_PROFILER_OUTPUT/analyse.done", 5) == f"/p/{rd}"
    assert rank_dir_of("/p", f"/p/node1/{rd}", 5) == f"/p/node1/{rd}"
    assert rank_dir_of("/p/", f"/p/{rd}/x", 5) == f"/p/{rd}"
    assert rank_dir_of("/p", f"/p/a/b/c/{rd}/x", 3) is None  # deeper than the walk goes
    assert rank_dir_of("/p", f"/p/{rd}/inner_1_20260101120000000_torch_pt/x", 5) == f"/p/{rd}"  # not descended
    assert rank_dir_of("/p", "/p/node1/file.txt", 5) is None
    assert rank_dir_of("/p", f"/other/{rd}", 5) is None
    assert rank_dir_of("/p", f"/px/{rd}", 5) is None
    assert rank_dir_of(f"/p/{rd}", f"/p/{rd}/PROF_1/x", 5) == f"/p/{rd}"  # the root itself is a rank dir


def test_random_reads_keep_decisions_equal_to_a_full_assessment() -> None:
    """Dirs added, re-read in another state, re-stamped, claimed twice, without a rank and removed, in random order:
    after every read the tracker's kept orders and its decisions equal a full assessment of the same states."""
    import random

    from profwatch.core.batches.completeness import BY_PATH, BY_TIME_PATH

    rng = random.Random(25)
    stages = ("appearing", "raw_complete", "parsing", "parsed", "parsed", "parsed")
    current: dict[str, RankDirObservation] = {}
    t = RankDirTracker()
    for step in range(400):
        rank, pid = rng.randrange(6), rng.choice((None, None, None, 7))
        kw: dict[str, object] = {"capture_id": rng.choice(("cap", "cap", "cap", "other", None))}
        if rng.random() < 0.1:
            kw["info"] = None  # no profiler_info: no rank
        o = obs(rank, pid=pid, stage=rng.choice(stages), world=rng.choice((6, 6, 6, 5)),
                steps=rng.choice(((1, 2, 3), (1, 2), None)),
                offset_s=rng.choice((0.0, 0.0, 1.0)), **kw)  # type: ignore[arg-type]
        if rng.random() < 0.2 and current:
            gone = rng.choice(sorted(current))
            del current[gone]
            t.update(gone, None)
        else:
            current.pop(o.path, None)  # the tracker's order: a re-read dir moves last
            current[o.path] = o
            t.update(o.path, _state(o))
        for tally in t._tallies.values():
            assert tally.by_time == sorted(tally.members.values(), key=BY_TIME_PATH)
            assert tally.by_path == sorted(tally.members.values(), key=BY_PATH)
        observations = list(current.values())
        if not observations:
            continue
        _same(t.batches(now_unix_s=NOW, settings=SETTINGS, world_size=6), observations, world_size=6)
        if step % 5 == 0:
            picked = t.batch_of("cap", now_unix_s=NOW, settings=SETTINGS, world_size=6)
            full = assess_batches(observations, now_unix_s=NOW, settings=SETTINGS, world_size=6)
            assert [b.to_json() for b in picked if b.capture_id == "cap"] == \
                [b.to_json() for b in full if b.capture_id == "cap"]
