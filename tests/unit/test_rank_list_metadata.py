"""A targeted capture's rank_list in the rank dirs' metadata (issue 22 item 3): ranges both ways, and metadata from
disk that is malformed or hostile is ignored rather than trusted (a huge range never expands)."""

from __future__ import annotations

import pytest

from profwatch.core.batches.prof_layout import (
    MAX_DECODED_RANKS,
    RANK_LIST_KEY,
    WORLD_SIZE_KEY,
    decode_rank_list,
    encode_rank_list,
    parse_profiler_metadata,
)


@pytest.mark.parametrize("ranks", [[0], [0, 1, 2, 3], [3, 1, 2, 9, 10, 11, 40], list(range(0, 4096, 3))])
def test_ranges_round_trip(ranks: list[int]) -> None:
    text = encode_rank_list(ranks, 1 << 20)
    assert text is not None and decode_rank_list(text) == tuple(sorted(set(ranks)))


def test_encoding_respects_the_limit_with_its_quotes() -> None:
    assert encode_rank_list([0, 1, 2, 3], 5) == "0-3" and encode_rank_list([0, 1, 2, 3], 4) is None


@pytest.mark.parametrize("bad", ["", "a", "3-1", "1,,2", "-1", "0-99999999", 7, None, [], [1, -2], [True],
                                 "1-2-3", "0-" + str(MAX_DECODED_RANKS)])
def test_malformed_or_hostile_lists_are_ignored(bad: object) -> None:
    assert decode_rank_list(bad) is None


def test_metadata_gives_rank_list_and_the_job_world_size() -> None:
    meta = parse_profiler_metadata({RANK_LIST_KEY: "0-3", WORLD_SIZE_KEY: 8})
    assert meta.rank_list == (0, 1, 2, 3) and meta.world_size == 8
    # the world group's members win over profwatch's stamp; a whole-job capture has no rank_list
    meta = parse_profiler_metadata({"distributed_args": {"world_size": 16}, WORLD_SIZE_KEY: 8})
    assert meta.world_size == 16 and meta.rank_list is None
