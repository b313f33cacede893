"""docs/configuration.md and docs/detection.md's constants table are generated from the code and kept current.

A leaf settings key without a pydantic description, a numeric detection constant without a docstring, or a
reference that differs from what ``python -m profwatch.config_doc --write`` gives fails here (issue 30).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel, Field

from profwatch import config_doc
from profwatch.config import Settings
from profwatch.config_doc import (
    DETECTION_DOC_PATH,
    REFERENCE_PATH,
    MissingConstantDoc,
    MissingDescription,
    detection_constants,
    keys,
    render_reference,
    with_constants,
)


def _leaf_count(model: type[BaseModel]) -> int:
    n = 0
    for f in model.model_fields.values():
        sub = config_doc._submodel(f.annotation)
        n += _leaf_count(sub) if sub is not None else 1
    return n


def test_every_leaf_key_has_a_description_and_is_in_the_reference() -> None:
    found = keys()
    assert len(found) == _leaf_count(Settings) > 200
    text = REFERENCE_PATH.read_text(encoding="utf-8")
    for k in found:
        assert f"| `{k.name}` |" in text and f"## [{k.section}]" in text


def test_the_reference_is_current() -> None:
    assert REFERENCE_PATH.read_text(encoding="utf-8") == render_reference(), (
        "docs/configuration.md is out of date: python -m profwatch.config_doc --write")


def test_a_key_without_a_description_is_refused() -> None:
    class Inner(BaseModel):
        documented: int = Field(1, description="has one")
        bare: float = 2.0

    class Root(BaseModel):
        inner: Inner = Field(default_factory=Inner)

    with pytest.raises(MissingDescription, match=r"^inner\.bare$"):
        keys(Root)


def test_units_defaults_and_reach_are_rendered() -> None:
    by = {k.dotted: k for k in keys()}
    assert by["coordinator.node_timeout_s"].unit == "s"
    assert by["watch.retention_max_bytes"].unit == "bytes" and by["watch.retention_max_bytes"].default == "unset"
    assert by["detection.min_effect"].unit == "fraction" and by["detection.min_effect"].default == "0.1"
    assert by["limits.control_queue_bytes_per_peer"].default == "8388608 (8 MiB)"
    assert by["node.node_id"].default == "the hostname"  # not the build machine's name
    assert by["analysis.ranking.links.min_peers"].env == "PROFWATCH_ANALYSIS__RANKING__LINKS__MIN_PEERS"
    # what else a key moves (issue 30's examples)
    assert "period" in by["detection.min_effect"].reach
    for name in ("baseline_steps", "outlier_window_steps", "spike_event_gap_steps"):
        assert "blocks" in by[f"detection.{name}"].reach
    assert "**Also moves:**" in REFERENCE_PATH.read_text(encoding="utf-8")


def test_the_detection_constants_table_is_current() -> None:
    constants = detection_constants()
    assert len(constants) >= 50 and all(c.doc for c in constants)
    text = DETECTION_DOC_PATH.read_text(encoding="utf-8")
    assert text == with_constants(text, constants), (
        "docs/detection.md's constants table is out of date: python -m profwatch.config_doc --write")


def test_a_detection_constant_without_a_docstring_is_refused(tmp_path: Path) -> None:
    (tmp_path / "mod.py").write_text('A_LIMIT = 3\n"""documented."""\nTUNED = 2 * A_LIMIT\nNAME = "x"\n')
    with pytest.raises(MissingConstantDoc, match=r"^mod\.TUNED$"):
        detection_constants(tmp_path)


def test_check_mode_reports_a_stale_reference(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stale = tmp_path / "configuration.md"
    stale.write_text(render_reference().replace("| `window_steps` |", "| `window_step` |"))
    monkeypatch.setattr(config_doc, "REFERENCE_PATH", stale)
    assert config_doc.main(["--check"]) == 1
    assert config_doc.main(["--write"]) == 0 and config_doc.main(["--check"]) == 0
    assert stale.read_text() == render_reference()
