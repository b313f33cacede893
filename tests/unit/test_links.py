"""Slow-link verdicts (profwatch.core.verdict.links, and their place in profwatch.core.verdict.ranking.judge_batch): pure, on
ClusterCommunicationMatrix-shaped rows (issue 11 item 9). The real tool on generated trees: tests/integration."""

from __future__ import annotations

import random

import pytest

from profwatch.core.verdict.evidence import ClusterEvidence
from profwatch.core.verdict.links import LinkSettings, find_slow_links, parse_matrix_rows
from profwatch.core.verdict.ranking import judge_batch
from profwatch.simulate.ascend_tree import build_timelines, cluster_time_summary


def matrix_rows(world: int, *, slow_pairs: dict[tuple[int, int], float] | None = None,
                slow_ranks: dict[int, float] | None = None, steps: int = 3, noise: float = 0.02, seed: int = 0,
                group: str = "123", kind: str = "total") -> list[dict]:
    """``Total Op Info`` rows (or op rows) for a full mesh: 4 ops x 2 MB per pair and step, 1 ms each, a slow pair
    or a slow rank's every link ``factor`` x slower."""
    rng = random.Random(seed)
    slow_pairs = {(min(a, b), max(a, b)): f for (a, b), f in (slow_pairs or {}).items()}
    slow_ranks = slow_ranks or {}
    rows = []
    for s in range(1, steps + 1):
        for a in range(world):
            for b in range(world):
                if a == b:
                    continue
                f = slow_pairs.get((min(a, b), max(a, b)), 1.0) * slow_ranks.get(a, 1.0)
                t = 4.0 * f * (1 + noise * rng.gauss(0, 1))
                name = "Total Op Info" if kind == "total" else "hcom_allReduce__12_0_1"
                rows.append({"step": f"step{s}", "hccl_op_name": name, "group_name": group, "src_rank": float(a),
                             "dst_rank": float(b), "transport_type": "HCCS", "transit_size": 8.0,
                             "transit_time": t, "bandwidth": 8.0 / t})
    return rows


def test_one_slow_pair_is_one_link_verdict_with_its_numbers():
    found = find_slow_links(matrix_rows(8, slow_pairs={(2, 5): 3.0}), world_size=8, step_time_us=70_000)
    assert [lk.ranks for lk in found.links] == [(2, 5)] and not found.folded_ranks
    lk = found.links[0]
    assert lk.group == "123" and lk.transport == "HCCS"
    assert lk.bandwidth_gbps == pytest.approx(2.0 / 3, rel=0.05) and lk.peer_median_gbps == pytest.approx(2.0, rel=0.05)
    # one direction's extra transit per step: 4 ms x 2 = 8 ms
    assert lk.impact["saving_s_per_step"] == pytest.approx(0.008, rel=0.1)
    assert lk.evidence["strength"] == "strong" and lk.evidence["z"] >= 4
    j = lk.to_json()
    assert j["ranks"] == [2, 5] and j["bandwidth_ratio"] == pytest.approx(1 / 3, rel=0.05)
    assert set(j) >= {"ranks", "group", "bandwidth_gbps", "peer_median_gbps", "impact"}


@pytest.mark.parametrize("seed", range(5))
def test_balanced_links_name_nothing(seed: int):
    assert find_slow_links(matrix_rows(16, noise=0.05, seed=seed), world_size=16).links == []


def test_a_mildly_slower_link_below_min_drop_is_not_named():
    found = find_slow_links(matrix_rows(8, slow_pairs={(1, 2): 1.1}, noise=0.005), world_size=8)
    assert found.links == []


def test_a_rank_with_every_link_slow_is_a_rank_problem_not_seven_links():
    found = find_slow_links(matrix_rows(8, slow_ranks={3: 2.5}), world_size=8, step_time_us=70_000)
    assert found.links == [] and set(found.folded_ranks) == {3}


def test_two_slow_pairs_both_found():
    found = find_slow_links(matrix_rows(8, slow_pairs={(0, 1): 2.0, (4, 6): 3.0}), world_size=8, step_time_us=7e4)
    assert [lk.ranks for lk in found.links] == [(4, 6), (0, 1)]  # by saving


def test_op_rows_are_summed_when_there_is_no_total_and_statistics_rows_are_ignored():
    rows = matrix_rows(8, slow_pairs={(2, 5): 3.0}, kind="op")
    rows += [dict(r, hccl_op_name="hcom_allReduce_-top1", transit_time=1.0) for r in rows[:10]]
    samples = parse_matrix_rows(rows)
    assert all(s.time_ms > 2 for s in samples.values())  # the -top1 rows (1 ms) were not added in
    assert [lk.ranks for lk in find_slow_links(rows, world_size=8).links] == [(2, 5)]


def test_too_few_pairs_to_compare_are_noted_not_judged():
    found = find_slow_links(matrix_rows(2, slow_pairs={(0, 1): 3.0}), world_size=2)
    assert found.links == [] and any("too few" in n for n in found.notes)
    assert find_slow_links(matrix_rows(3), world_size=3, settings=LinkSettings(min_peers=2)).pairs_judged == 3


def test_link_verdict_in_judge_batch_replaces_the_endpoint_ranks_and_adds_to_the_headline():
    tls = build_timelines(world_size=8, steps=3, seed=1, noise=0.02, slow_links={(2, 5): 3.0})
    ev = ClusterEvidence(kind="ascend_pt", summaries=cluster_time_summary(tls),
                         link_rows=matrix_rows(8, slow_pairs={(2, 5): 3.0}))
    # the advisor's per-rank sheet sees both endpoints slower: they must not come out as two suspect ranks
    ev.advisor = {"slow_link": [{"step": s, "rank_id": r, "SDMA size(mb)": 512,
                                 "SDMA time(ms)": 8 * (3.0 if r in (2, 5) else 1.0)}
                                for s in (1, 2, 3) for r in range(8)]}
    v = judge_batch(ev, world_size=8)
    assert v.suspects == [] and [lk.ranks for lk in v.links] == [(2, 5)]
    assert v.impact is not None and v.impact["saving_s_per_step"] == pytest.approx(0.008, rel=0.1)
    assert v.strength == "strong"


def test_slow_link_ranks_fold_into_a_communication_suspect():
    ev = ClusterEvidence(kind="ascend_pt",
                         summaries=cluster_time_summary(build_timelines(world_size=8, steps=3, seed=2, noise=0.02)),
                         link_rows=matrix_rows(8, slow_ranks={3: 2.5}))
    v = judge_batch(ev)
    assert [s.rank for s in v.suspects] == [3] and v.suspects[0].kind == "communication"
    assert v.suspects[0].evidence["slow_links"]["slow_links"] == 7 and v.links == []
    # its links are 2.5x slower: 1.5 x 4 ms more per step in one direction
    assert v.suspects[0].impact["saving_s_per_step"] == pytest.approx(0.006, rel=0.15)
    assert v.impact["saving_s_per_step"] == pytest.approx(0.006, rel=0.15)


def _findings(found) -> tuple:
    return ([(lk.ranks, lk.group, lk.transport, round(lk.bandwidth_gbps, 9), round(lk.peer_median_gbps, 9),
              lk.evidence, lk.impact) for lk in found.links], found.folded_ranks, found.pairs_judged, found.notes)


@pytest.mark.parametrize("chunk", [1, 7, 64])
def test_pairs_summed_in_chunks_give_the_findings_of_one_pass(chunk: int, monkeypatch: pytest.MonkeyPatch):
    """Issue 34: the pair table is summed in bounded chunks (a step, a range of lower ranks); whatever the chunk
    size, both directions of every pair meet and the findings (links, folded ranks, their numbers) are those of
    one pass over all rows."""
    import profwatch.core.verdict.links as links_mod

    rows = matrix_rows(12, slow_pairs={(2, 9): 3.0, (4, 5): 2.0}, slow_ranks={7: 2.5}, steps=4, seed=3)
    rows += [dict(r, group_name="456", transport_type="RDMA") for r in matrix_rows(6, slow_pairs={(0, 1): 3.0})]
    whole = _findings(find_slow_links(rows, world_size=12, step_time_us=50_000))
    assert {lk[0] for lk in whole[0]} == {(2, 9), (4, 5), (0, 1)} and set(whole[1]) == {7}
    monkeypatch.setattr(links_mod, "PAIR_CHUNK_ROWS", chunk)
    assert _findings(find_slow_links(rows, world_size=12, step_time_us=50_000)) == whole


@pytest.mark.parametrize("chunk", [7, 262_144])
def test_a_negative_rank_in_the_matrix_is_judged_not_a_crash(chunk: int, monkeypatch: pytest.MonkeyPatch):
    """A matrix whose rows name rank -1 (ranks numbered from -1: odd input, read as numbers as before the chunked
    pair table) gives the findings of the same matrix numbered from 0, shifted (before: the chunk numbers went
    negative and ``np.bincount`` raised ValueError, losing every link finding of the capture)."""
    import profwatch.core.verdict.links as links_mod

    monkeypatch.setattr(links_mod, "PAIR_CHUNK_ROWS", chunk)
    rows = matrix_rows(8, slow_pairs={(2, 5): 3.0})
    shifted = [dict(r, src_rank=r["src_rank"] - 3, dst_rank=r["dst_rank"] - 3) for r in rows]
    assert [lk.ranks for lk in find_slow_links(rows, world_size=8).links] == [(2, 5)]
    found = find_slow_links(shifted, world_size=8)
    assert [lk.ranks for lk in found.links] == [(-1, 2)] and found.pairs_judged == 28


@pytest.mark.parametrize("as_columns", [False, True])
def test_a_rank_id_beyond_any_world_size_is_left_out_and_counted_not_a_crash(as_columns: bool):
    """Matrix rows naming rank 1e30 or -2**40 (a corrupt export) are left out like rows without a rank, and the
    findings say how many (before: ``array('q').append`` raised OverflowError on 1e30 and every link finding of the
    capture was lost); the rest of the matrix is judged as without them."""
    from profwatch.core.verdict.link_rows import LinkRows

    rows = matrix_rows(8, slow_pairs={(2, 5): 3.0})
    bad = [dict(rows[0], src_rank=1e30), dict(rows[1], dst_rank=-(2.0 ** 40)), dict(rows[2], src_rank="x")]
    given = LinkRows.from_rows(rows + bad) if as_columns else rows + bad
    found = find_slow_links(given, world_size=8)
    assert [lk.ranks for lk in found.links] == [(2, 5)] and found.pairs_judged == 28
    assert any(n.startswith("3 matrix row(s) without a step or a rank id") for n in found.notes), found.notes
    assert len(parse_matrix_rows(rows + bad)) == len(parse_matrix_rows(rows))


@pytest.mark.parametrize("as_columns", [False, True])
@pytest.mark.parametrize("rank", [2.5, "2.5", 0.5])
def test_a_fractional_rank_id_is_left_out_and_counted_not_cut_to_a_rank(as_columns: bool, rank: object):
    """Matrix rows naming rank 2.5 (a corrupt export) are no rank's: before, the id was cut to 2 and 40 rows of
    other pairs were summed into rank 2's, which hid the slow (2, 5) link and judged a 29th pair, silently."""
    from profwatch.core.verdict.link_rows import LinkRows

    rows = matrix_rows(8, slow_pairs={(2, 5): 3.0})
    bad = [dict(r, src_rank=rank) for r in rows[:40]]
    given = LinkRows.from_rows(rows + bad) if as_columns else rows + bad
    found = find_slow_links(given, world_size=8)
    assert [lk.ranks for lk in found.links] == [(2, 5)] and found.pairs_judged == 28
    assert any(n.startswith("40 matrix row(s) without a step or a rank id") for n in found.notes), found.notes
    assert len(parse_matrix_rows(rows + bad)) == len(parse_matrix_rows(rows))
