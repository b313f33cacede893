"""The verdict explains where msprof-analyze's slow_rank votes and profwatch disagree (issue 22 item 6), and says
nothing when they agree or slow_rank did not run."""

from __future__ import annotations

from profwatch.core.verdict.evidence import ClusterEvidence, RecipeStatus
from profwatch.core.verdict.ranking import judge_batch
from profwatch.simulate.ascend_tree import build_timelines, cluster_time_summary


def _notes(votes: dict[int, int], status: str | None = "ok", **kw: object) -> tuple[list[int], list[str]]:
    ev = ClusterEvidence(kind="ascend_pt", slow_rank_votes=votes, summaries=cluster_time_summary(
        build_timelines(world_size=8, steps=4, seed=1, noise=0.03, **kw)))  # type: ignore[arg-type]
    if status is not None:
        ev.recipes["slow_rank"] = RecipeStatus("slow_rank", status)
    v = judge_batch(ev)
    return [s.rank for s in v.suspects], [n for n in v.notes if "slow_rank" in n]


def test_a_named_rank_without_votes_is_explained() -> None:
    named, notes = _notes({}, slow_ranks={3: 1.06})
    assert named == [3] and len(notes) == 1
    assert notes[0].startswith("slow_rank gave rank 3 no vote (0 vote(s) in all)") and "pools" in notes[0]


def test_votes_for_a_rank_that_is_not_named_give_its_figures() -> None:
    named, notes = _notes({6: 3}, slow_ranks={3: 1.3})
    assert named == [3]
    (why,) = [n for n in notes if "rank 6" in n]
    assert "slow_rank voted for rank 6 (3 of 3 votes) but profwatch does not name it" in why
    assert "% of the step (needs 1.5%)" in why and "(needs 4.0)" in why


def test_agreement_or_no_slow_rank_run_says_nothing() -> None:
    assert _notes({3: 5}, slow_ranks={3: 1.3}) == ([3], [])
    assert _notes({}, status=None, slow_ranks={3: 1.3}) == ([3], [])
    assert _notes({})[1] == []  # balanced, no vote: nothing to explain
    named, notes = _notes({}, status="timeout", slow_ranks={3: 1.3})
    assert named == [3] and notes == ["slow_rank did not vote (status timeout): the suspects rest on the time "
                                      "breakdown alone"]
