"""display_str / printable: file names as the OS gives them, shown under any locale (pure)."""

from __future__ import annotations

import json

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
