"""display_str / printable: file names as the OS gives them, shown under any locale (pure)."""

from __future__ import annotations

import json

import pytest

from profwatch.core.display import display_str, printable


def test_display_str_restores_and_escapes_bytes() -> None:
    assert display_str("plain/ascii") == "plain/ascii"
    assert display_str("µs and 数据") == "µs and 数据"  # real characters pass unchanged
    assert display_str("bad_\udcff") == "bad_\\xff"  # an undecodable byte becomes a visible escape
    # UTF-8 bytes of "дé" read under an ASCII file-system encoding arrive as surrogate escapes: decoded back
    assert display_str("/p/" + "дé".encode().decode("ascii", "surrogateescape")) == "/p/дé"
    assert display_str("mixed µ \udcff") == "mixed µ \\xff"
    assert display_str("\ud800 lone") == "\\ud800 lone"  # not an escaped byte: escaped as itself, no error


def test_printable_walks_json_like_values() -> None:
    value = {"paths": ["a_\udcff", ("b",)], "n": 3, "k_\udcfe": {"x": None}}
    out = printable(value)
    assert out == {"paths": ["a_\\xff", ["b"]], "n": 3, "k_\\xfe": {"x": None}}
    json.dumps(out).encode("utf-8")  # encodable: what scan --json and report.json write


@pytest.mark.parametrize("width", [2, 3, 10, 37, 100, 110])
def test_clip_fits_the_width_and_keeps_what_fits(width):
    from profwatch.core.display import clip

    for text in ("", "ok", "slow_rank failed: returncode 1 (msprof-analyze: no ascend_pytorch_profiler_3.db in "
                 "/prof/c-1/node0_4003_ascend_pt)", "/a/very/long/path/without/any/spaces/at/all" * 3, "x " * 80):
        out = clip(text, width)
        assert len(out) <= max(2, width)
        if len(text) <= width:
            assert out == text
        else:
            assert out.endswith("…") and text.startswith(out[:-1])


def test_clip_cuts_at_a_word_when_one_is_in_reach():
    from profwatch.core.display import clip

    assert clip("slow_rank failed: returncode 1", 20) == "slow_rank failed:…"
    assert clip("/a/very/long/path/without/spaces", 12) == "/a/very/lon…"
