"""Unit tests for daemon.core.ranking on synthetic evidence (pure; no I/O)."""

from __future__ import annotations

import random

import pytest
from pydantic import ValidationError

from daemon.core.evidence import ClusterEvidence, RankStepSummary
from daemon.core.ranking import RankingSettings, rank_suspects, score_is_valid


def make_evidence(world: int, *, slow: dict[int, float] | None = None, host: dict[int, float] | None = None,
                  link: dict[int, float] | None = None, steps: int = 3, noise: float = 0.02, seed: int = 0,
                  votes: dict[int, int] | None = None, comp_us: float = 40_000.0, free_us: float = 500.0,
                  tx_us: float = 4_000.0) -> ClusterEvidence:
    """Synchronous-collective model in msprof-analyze's terms.

    Own work ``W = comp + free``; everyone leaves the step's collective together, so a rank waits
    ``max(W) - W``; ``wait`` = own collective duration minus the shortest one; ``transmit`` = that shortest one.
    ``link`` adds extra collective time on one rank only (its link is slow; nobody is late).
    """
    rng = random.Random(seed)
    slow, host, link = slow or {}, host or {}, link or {}
    rows: list[RankStepSummary] = []
    for step in range(1, steps + 1):
        comp = {r: comp_us * slow.get(r, 1.0) * (1 + noise * rng.gauss(0, 1)) for r in range(world)}
        free = {r: free_us * (1 + noise * rng.gauss(0, 1)) + host.get(r, 0.0) * comp_us for r in range(world)}
        own = {r: comp[r] + free[r] for r in range(world)}
        last = max(own.values())
        dur = {r: last - own[r] + tx_us + link.get(r, 0.0) * comp_us for r in range(world)}
        shortest = min(dur.values())
        step_time = max(own[r] + dur[r] for r in range(world))
        for r in range(world):
            rows.append(RankStepSummary(r, step, step_time, comp[r], dur[r], dur[r] - shortest, shortest, free[r]))
    return ClusterEvidence(kind="ascend_pt", summaries=rows, slow_rank_votes=dict(votes or {}))


def _ranks(suspects):
    return [s.rank for s in suspects]


def test_one_slow_compute_rank_is_top_with_compute_kind():
    ev = make_evidence(8, slow={5: 1.5}, votes={5: 12})
    sus = rank_suspects(ev, hostnames={5: "node1"}, rank_dirs={5: "/p/node1_5_x_ascend_pt"})
    assert _ranks(sus) == [5]
    top = sus[0]
    assert top.kind == "compute" and top.hostname == "node1" and top.rank_dir == "/p/node1_5_x_ascend_pt"
    assert 0.8 < top.score <= 1.0
    assert top.evidence["slow_rank_votes"] == 12 and top.evidence["signals_agree"] is True
    assert "computation" in top.evidence["summary"]


def test_one_slow_rank_without_votes_still_found_but_scores_lower_than_voted():
    no_votes = rank_suspects(make_evidence(4, slow={2: 1.3}))
    voted = rank_suspects(make_evidence(4, slow={2: 1.3}, votes={2: 12}))
    assert _ranks(no_votes) == [2] and _ranks(voted) == [2]
    assert all(score_is_valid(s.score) for s in no_votes + voted)


def test_two_simultaneous_slow_ranks_both_found_without_votes():
    ev = make_evidence(8, slow={1: 1.6, 6: 1.3})  # slow_rank casts no vote here (two low outliers)
    sus = rank_suspects(ev)
    assert _ranks(sus) == [1, 6]
    assert all(s.kind == "compute" for s in sus)
    assert sus[0].score >= sus[1].score


def test_two_equal_slow_ranks_in_four():
    sus = rank_suspects(make_evidence(4, slow={0: 1.4, 3: 1.4}, seed=3))
    assert sorted(_ranks(sus)) == [0, 3]


@pytest.mark.parametrize("world", [2, 3, 4, 8, 64])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_balanced_cluster_yields_no_suspect(world: int, seed: int):
    # 1 % per-step compute jitter per rank (the generator's 2-3 % per-kernel jitter averages to less)
    assert rank_suspects(make_evidence(world, seed=seed, noise=0.01)) == []


def test_balanced_cluster_with_a_spurious_single_vote_yields_no_suspect():
    assert rank_suspects(make_evidence(8, votes={3: 1}, noise=0.01)) == []


def test_host_bound_rank_high_free_time():
    sus = rank_suspects(make_evidence(8, host={3: 0.25}))
    assert _ranks(sus) == [3]
    assert sus[0].kind == "host"
    assert sus[0].evidence["free_excess_frac"] > 0.1


def test_slow_link_rank_is_communication_kind():
    sus = rank_suspects(make_evidence(8, link={4: 0.3}))
    assert _ranks(sus) == [4]
    assert sus[0].kind == "communication"


@pytest.mark.parametrize("world", [2, 3])
def test_small_groups_without_votes(world: int):
    sus = rank_suspects(make_evidence(world, slow={world - 1: 1.25}))
    assert _ranks(sus) == [world - 1]
    assert sus[0].kind == "compute"


def test_votes_only_when_no_summaries():
    ev = ClusterEvidence(kind="ascend_pt", slow_rank_votes={2: 9, 1: 1})
    sus = rank_suspects(ev, rank_dirs={2: "/x"})
    assert _ranks(sus) == [2] and sus[0].kind == "unknown" and sus[0].rank_dir == "/x"


def test_zero_filled_rank_is_not_named_late():
    ev = make_evidence(4, noise=0.01)
    rows = [RankStepSummary(r.rank, r.step, r.step_time_us, r.computation_us, r.communication_us, 0.0, 0.0,
                            r.free_us) if r.rank == 1 else r for r in ev.summaries]
    rows.append(RankStepSummary(1, -1, 0, 0, 0, 0, 0, 0))
    ev.summaries = rows
    assert rank_suspects(ev) == []


def test_consistency_one_noisy_step_does_not_name():
    ev = make_evidence(8, steps=3, noise=0.01)
    rows = list(ev.summaries)
    # one step with a big spike on rank 2 only: 1/3 of steps -> below min_consistency, median ignores it
    rows = [RankStepSummary(r.rank, r.step, r.step_time_us, r.computation_us * (1.5 if r.step == 2 and r.rank == 2
                                                                                else 1.0),
                            r.communication_us, r.wait_us, r.transmit_us, r.free_us) for r in rows]
    ev.summaries = rows
    assert rank_suspects(ev) == []


def test_rank_dirs_fall_back_to_evidence_rank_paths_and_settings_forbid_extra():
    ev = make_evidence(4, slow={1: 2.0})
    ev.rank_paths = {1: "/from/tool"}
    assert rank_suspects(ev)[0].rank_dir == "/from/tool"
    with pytest.raises(ValidationError):
        RankingSettings(bogus=1)  # type: ignore[call-arg]


def test_max_suspects_and_order():
    ev = make_evidence(16, slow={1: 1.9, 2: 1.6, 3: 1.3})
    sus = rank_suspects(ev, settings=RankingSettings(max_suspects=2))
    assert _ranks(sus) == [1, 2]


def _link_sheet(world: int, slow: dict[int, float], steps: int = 3) -> list[dict]:
    """advisor "slow link" sheet rows (-l en), as summarize_advisor keeps them."""
    return [{"step": s, "rank_id": r, "RDMA bandwidth(GB/s)": 0, "RDMA size(mb)": 0, "RDMA time(ms)": 0,
             "SDMA bandwidth(GB/s)": 64.0 / slow.get(r, 1.0), "SDMA size(mb)": 512, "SDMA time(ms)": 8 * slow.get(r, 1.0)}
            for s in range(1, steps + 1) for r in range(world)]


def test_slow_link_from_advisor_sheet_when_collectives_end_together():
    # a slow link stretches every rank's collective equally (transmit x3 for all): the time summary is balanced,
    # only the per-rank link time / bandwidth names the rank
    ev = make_evidence(8, tx_us=12_000.0, noise=0.01)
    ev.advisor = {"slow_link": _link_sheet(8, {3: 3.0})}
    sus = rank_suspects(ev)
    assert _ranks(sus) == [3] and sus[0].kind == "communication"
    assert sus[0].evidence["bandwidth_ratio"] == pytest.approx(1 / 3, rel=0.01)
    assert "slow link" in sus[0].evidence["summary"]
    ev.advisor = {"slow_link": _link_sheet(8, {})}
    assert rank_suspects(ev) == []
