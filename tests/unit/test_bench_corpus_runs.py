"""bench/bench_corpus.py runs end to end on a few drawn runs (its scoring reads settings by name: a renamed setting
crashed it after the whole corpus had replayed). Detection quality is the bench's to measure, not this test's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import python_env

ROOT = Path(__file__).resolve().parents[2]


def test_the_corpus_bench_scores_injected_changes_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "runs.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "bench_corpus.py"), "--runs", "8", "--classes", "steady",
         "--seed", "31", "--json", str(out)],
        env=python_env(), capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads(out.read_text())
    assert len(rows) == 8 and {r["class"] for r in rows} == {"steady"}
    changes = [c for r in rows for c in r["changes"]]
    assert changes, "seed 31 injects changes in steady runs 0-7"
    for c in changes:  # every scored change carries the capture's need and its outcome
        assert c["capture_steps"] > 0 and isinstance(c["captured"], bool) and isinstance(c["short"], bool)
    assert all(not r["violations"] for r in rows)
    assert "steady job's median delay" in proc.stdout
