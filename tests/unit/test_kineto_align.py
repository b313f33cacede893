"""Step alignment of torch.profiler traces by time (profwatch.core.verdict.kineto_align, profwatch.core.verdict.kineto) and the reader's
notes and unusable ranks (profwatch.adapters.tools.kineto_reader): issue 11 items 2 and 5b."""

from __future__ import annotations

from pathlib import Path

import pytest

from profwatch.adapters.tools.kineto_reader import analyze_torch_batch, find_trace_files, write_torch_trace
from profwatch.core.verdict.evidence import ClusterEvidence
from profwatch.core.verdict.kineto import RankTrace, summarize_traces
from profwatch.core.verdict.kineto_align import align_steps, estimate_offset
from profwatch.core.verdict.ranking import judge_batch

CHUNKS = 3


def job_events(world: int, *, steps: int = 5, work: dict[int, float] | None = None, label0: dict[int, int] | None = None,
               skew_us: dict[int, float] | None = None, hiccup: tuple[int, float] | None = None,
               start_step: dict[int, int] | None = None) -> dict[int, list[dict]]:
    """Chrome-trace events of a synchronous host-only job: per step 3 chunks of ``aten::mm`` (10 ms x
    ``work[rank]``, small deterministic jitter) each followed by ``gloo:all_reduce`` that everyone leaves together.
    ``label0``: a rank's first ProfilerStep number (default 1); ``skew_us``: added to a rank's clock;
    ``hiccup``: (step index, us) extra work on every rank in that step; ``start_step``: step index at which a
    rank's trace starts (its window is offset in time)."""
    work, label0, skew_us, start_step = work or {}, label0 or {}, skew_us or {}, start_step or {}
    ev: dict[int, list[dict]] = {r: [] for r in range(world)}
    t = 10_000.0
    for s in range(steps + max(start_step.values(), default=0)):
        start = t
        for c in range(CHUNKS):
            extra = hiccup[1] if hiccup and hiccup[0] == s and c == 0 else 0.0
            arrive = {r: t + 10_000.0 * work.get(r, 1.0) * (1 + 0.004 * ((r * 7 + s * 3 + c) % 5)) + extra
                      for r in range(world)}
            end = max(arrive.values()) + 80.0
            for r in range(world):
                if not (start_step.get(r, 0) <= s < start_step.get(r, 0) + steps):
                    continue
                k = skew_us.get(r, 0.0)
                ev[r].append({"ph": "X", "name": "aten::mm", "cat": "cpu_op", "ts": t + k, "dur": arrive[r] - t,
                              "pid": 1, "tid": 1})
                ev[r].append({"ph": "X", "name": "gloo:all_reduce", "cat": "user_annotation", "ts": arrive[r] + k,
                              "dur": end - arrive[r], "pid": 1, "tid": 2})
            t = end + 10.0
        for r in range(world):
            if start_step.get(r, 0) <= s < start_step.get(r, 0) + steps:
                ev[r].append({"ph": "X", "name": f"ProfilerStep#{label0.get(r, 1) + s - start_step.get(r, 0)}",
                              "cat": "user_annotation", "ts": start + skew_us.get(r, 0.0), "dur": t - start,
                              "pid": 1, "tid": 1})
        t += 30.0
    return ev


def traces_of(events: dict[int, list[dict]]) -> dict[int, RankTrace]:
    out = {}
    for r, evs in events.items():
        tr = RankTrace(r)
        for e in evs:
            tr.add_event(e["name"], e["cat"], e["ts"], e["dur"])
        out[r] = tr
    return out


def verdict(events: dict[int, list[dict]]):
    brk = summarize_traces(traces_of(events))
    return brk, judge_batch(ClusterEvidence(kind="torch_pt", summaries=brk.summaries))


def test_offset_labels_do_not_hide_the_slow_rank():
    """The slow rank's ProfilerStep numbers are offset so that no number overlaps its peers' (was no_suspect)."""
    brk, v = verdict(job_events(4, work={3: 1.3}, label0={3: 101}))
    assert [s.rank for s in v.suspects] == [3] and v.suspects[0].kind == "compute"
    assert brk.alignment.methods[3] == "collective_ends" and brk.alignment.labels[3][101] == 1
    assert {s.step for s in brk.summaries} == {1, 2, 3, 4, 5}


def test_offset_labels_and_a_shared_hiccup_name_nobody():
    """Nobody slow, a shared 5 ms hiccup at one step, one rank's labels offset by one (was: compute suspect 0.90)."""
    _, v = verdict(job_events(4, label0={2: 2}, hiccup=(2, 5000.0)))  # steps of ~30 ms
    assert v.suspects == []


@pytest.mark.parametrize("skew_ms", [-7.0, 3.0, 12.0])
def test_clock_skew_of_several_ms_is_estimated_from_collective_ends(skew_ms: float):
    brk, v = verdict(job_events(4, work={1: 1.25}, skew_us={1: skew_ms * 1000, 2: -skew_ms * 500}))
    assert brk.alignment.offsets_us[1] == pytest.approx(skew_ms * 1000, abs=50)
    assert brk.alignment.offsets_us[2] == pytest.approx(-skew_ms * 500, abs=50)
    assert [s.rank for s in v.suspects] == [1]


def test_window_offset_by_one_step_keeps_the_overlapping_steps():
    """A rank whose counter ran one step ahead started its capture one step early: 4 of its 5 steps overlap."""
    brk, v = verdict(job_events(4, work={0: 1.3}, start_step={1: 0, 0: 1, 2: 1, 3: 1}))
    assert len(brk.alignment.labels[1 if brk.alignment.reference != 1 else 0]) >= 4
    assert [s.rank for s in v.suspects] == [0]
    assert any("outside" in n for n in brk.notes)


def test_disjoint_windows_cannot_be_aligned_and_say_so():
    brk, _ = verdict(job_events(2, start_step={1: 5}))
    assert 1 in brk.alignment.unaligned and "recorded other steps" in brk.alignment.unaligned[1]
    assert {s.rank for s in brk.summaries} == {0}


def test_without_shared_collectives_the_armed_window_is_used():
    al = align_steps({0: [(1, 0.0, 10.0), (2, 10.0, 20.0)], 1: [(7, 500.0, 510.0), (8, 510.0, 520.0)]}, {})
    assert al.methods[1] == "armed_window" and al.labels[1] == {7: 1, 8: 2} and al.method == "armed_window"
    assert estimate_offset([("a", 1.0)], [("b", 1.0)], max_skew_us=1e6, tol_us=200) is None


def _write(root: Path, rank: int, events: list[dict], *, header_rank: int | None = None) -> Path:
    d = root / f"node0_{4000 + rank}_20260101120000{rank:03d}_torch_pt"
    d.mkdir(parents=True)
    write_torch_trace(d / f"node0_{4000 + rank}.1767268800000.pt.trace.json", header_rank if header_rank is not None
                      else rank, 4, events)
    (d / "trace.done").write_text("")
    return d


def test_reader_names_unparseable_ranks_and_header_mismatch(tmp_path: Path):
    events = job_events(4, work={2: 1.4})
    dirs = {r: _write(tmp_path, r, events[r], header_rank=0 if r == 1 else None) for r in range(4)}
    trace = find_trace_files(dirs[3])[0]
    trace.write_bytes(trace.read_bytes()[:500])
    ev = analyze_torch_batch(dirs)
    assert ev.recipes["kineto_breakdown"].status == "ok"
    assert set(ev.unusable_ranks) == {3} and "cannot be parsed" in ev.unusable_ranks[3]
    assert any("trace header says rank 0" in n for n in ev.notes)
    assert ev.alignment["method"] == "collective_ends"
    assert [s.rank for s in judge_batch(ev).suspects] == [2]


@pytest.mark.parametrize("skew_s", [2.0, -5.0, 30.0])
def test_clocks_seconds_apart_are_matched_by_the_order_of_collectives(skew_s: float):
    """Issue 22 item 4: hosts whose clocks differ by 2-30 s captured the same steps: every rank is judged."""
    brk, v = verdict(job_events(4, work={1: 1.25}, skew_us={1: skew_s * 1e6, 3: -skew_s * 0.5e6}))
    al = brk.alignment
    assert al.unaligned == {} and al.methods[1] == "collective_sequence" == al.methods[3]
    assert al.offsets_us[1] == pytest.approx(skew_s * 1e6, abs=200) and al.offsets_us[2] == pytest.approx(0, abs=200)
    assert any("s off rank" in n and "order of their collectives" in n for n in brk.notes)
    assert [s.rank for s in v.suspects] == [1]


def test_below_one_second_a_disjoint_rank_is_not_taken_for_a_skewed_clock():
    """0.3 s off and the next steps, adjacent in time, look alike to the order of collectives: neither is aligned
    by it (the 50 ms window and the steps' overlap decide there), and the reason names both possibilities."""
    for events in (job_events(2, skew_us={1: 300_000.0}), job_events(2, start_step={1: 5})):
        brk, _ = verdict(events)
        assert brk.alignment.methods.get(1) is None and "clock is further off" in brk.alignment.unaligned[1]


@pytest.mark.parametrize("skew_ms", [140.0, 300.0, -600.0])
def test_between_the_window_and_one_second_the_armed_steps_pair_ranks_by_their_collectives(skew_ms: float):
    """Clocks 140-600 ms apart: beyond the 50 ms window, under 1 s. When both ranks recorded exactly the armed steps
    (profwatch's arms label them with dp step numbers), the order of their collectives pairs them; without the
    armed steps they stay unaligned (the next steps would look the same)."""
    events = job_events(4, work={2: 1.3}, skew_us={2: skew_ms * 1e3})
    armed = frozenset(range(1, 6))
    brk = summarize_traces(traces_of(events), armed_labels=armed)
    al = brk.alignment
    assert al.unaligned == {} and al.methods[2] == "collective_sequence"
    assert al.offsets_us[2] == pytest.approx(skew_ms * 1e3, abs=300)
    assert any("armed steps 1-5" in n for n in brk.notes)
    assert [s.rank for s in judge_batch(ClusterEvidence(kind="torch_pt", summaries=brk.summaries)).suspects] == [2]
    assert 2 in summarize_traces(traces_of(events)).alignment.unaligned  # not known to be the armed steps


def test_a_rank_that_recorded_the_next_steps_is_not_paired_by_the_armed_steps():
    """Rank 1 recorded steps 6-10 (its dp step numbers say so) while the capture was armed for 1-5: its collectives
    look the same in order, but its labels are not the armed ones, so it is not aligned."""
    brk, _ = verdict(job_events(2, start_step={1: 5}, label0={1: 6}))
    assert brk.alignment.methods.get(1) is None
    brk = summarize_traces(traces_of(job_events(2, start_step={1: 5}, label0={1: 6})), armed_labels=frozenset(range(1, 6)))
    assert brk.alignment.methods.get(1) is None and 1 in brk.alignment.unaligned


def test_armed_steps_that_contradict_the_collective_ends_are_said():
    """80 ms off with ~30 ms steps: the collective ends match at a shift of whole steps; with the armed steps known
    (the same on both ranks) the contradiction is a note, never silent."""
    brk = summarize_traces(traces_of(job_events(4, skew_us={2: 80_000.0})), armed_labels=frozenset(range(1, 6)))
    assert brk.alignment.methods[2] == "collective_ends"
    assert any(n.startswith("rank 2: both it and rank") and "step counter or its clock" in n for n in brk.notes)
