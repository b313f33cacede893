"""bench/bench_corpus.py runs end to end on a few drawn runs (its scoring reads settings by name: a renamed setting
crashed it after the whole corpus had replayed). Detection quality is the bench's to measure, not this test's; a few
drawn runs that were lost are replayed here as deterministic inputs of the fix that found them."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from profwatch.commands.replay import ReplayConfig, replay_lines
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


def _corpus() -> ModuleType:
    """bench/bench_corpus.py as a module (its generators and scoring; nothing runs on import)."""
    spec = importlib.util.spec_from_file_location("bench_corpus", ROOT / "bench" / "bench_corpus.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_corpus"] = mod
    spec.loader.exec_module(mod)
    return mod


def _scored(bc: ModuleType, cls: str, seed: int, run: int) -> dict[str, Any]:
    r = bc.CLASSES[cls](cls, [seed, list(bc.CLASSES).index(cls), run])
    return bc.score(r, replay_lines(r.lines, ReplayConfig()))


def test_a_serving_change_before_the_changed_units_first_step_is_unseen_not_lost() -> None:
    """Seed 31, serving_work runs 0 and 6: 1.3x job-wide at 36 s and 22 s, the one replica's first step at 40 s and
    26 s: it never ran at the old level, so nothing can tell the change from its level. Scored as not detectable,
    shown apart (``unseen``); seed 32 run 2 (the replica ran 50 s before its 3x change) stays scored."""
    bc = _corpus()
    for run in (0, 6):
        (c,) = _scored(bc, "serving_work", 31, run)["changes"]
        assert c["unseen"] and not c["detectable"], c
    (c,) = _scored(bc, "serving_work", 32, 2)["changes"]
    assert not c["unseen"] and c["detectable"] and c["lasting"], c


def test_a_3x_change_in_a_serving_units_first_minute_is_captured() -> None:
    """Seed 32, serving_work run 2: one TP-2 replica with ``work``, 3x job-wide 50 s after its first step, inside
    its first level block. The unit level's new bands learned their offsets against a level the change was still
    moving, took part of it into the offsets and passed it on: every later block read 1.2-1.5x, never reported.
    Bands now learn only against a level that is not moving (``UnitLevel._steady``): reported (about +185 %) and
    captured, with no false arm."""
    row = _scored(_corpus(), "serving_work", 32, 2)
    (c,) = row["changes"]
    assert c["captured"] and row["false_arms"] == 0 and not row["violations"], row


def test_a_serving_units_noise_is_measured_on_its_healthy_steps() -> None:
    """Detectable = at least 2x the unit's noise: a serving unit's is measured on its steps before the onset, of
    what its comparison sees (``_unit_noise``), never below the drawn per-step noise. Seed 31 serving_nowork run 1:
    job-wide 1.3x on a unit without ``work``, whose steps follow the batch (nothing measures it) and the host load:
    noise ~0.29 in log against the drawn 3.4 %, so the change is under 2x its noise: scored as not detectable (the
    drawn-noise verdict kept beside it). A replica (seed 31 serving_dp run 7, 1.15x) is seen through its peers,
    who share the host load: its noise stays the per-step jitter, and the change stays scored."""
    bc = _corpus()
    (c,) = _scored(bc, "serving_nowork", 31, 1)["changes"]
    assert c["kind"] == "job" and c["noise_used"] >= 0.2 and not c["detectable"] and c["detectable_drawn"], c
    run = bc.CLASSES["serving_dp"]("serving_dp", [31, list(bc.CLASSES).index("serving_dp"), 7])
    (ch,) = run.changes
    assert ch.kind == "replica" and 0.01 <= ch.unit_noise <= 0.04, ch


def test_the_healthy_hours_mode_draws_healthy_runs_from_its_own_stream_and_bounds_the_rate() -> None:
    """``--healthy-hours``: runs without an injected change, round-robin over the seed list, from a seed stream
    apart from the injected runs' (a healthy run is never an injected run with its change left out), until the
    class's healthy hours reach H; the rate's bound is Garwood's exact one-sided 95 % bound (0 events: 3.0, the
    rule of three; 1 event: 4.74)."""
    bc = _corpus()
    assert abs(bc.poisson_upper(0) - 2.9957) < 1e-3 and abs(bc.poisson_upper(1) - 4.7439) < 1e-3
    rows = bc._healthy_corpus(["steady"], 0.5, [31, 32], 300.0, 0.0)
    assert sum(r["healthy_h"] for r in rows) >= 0.5
    assert [r["seed_list"] for r in rows[:2]] == [31, 32] and [r["seed"] for r in rows[:2]] == [0, 0]
    assert all(not r["changes"] for r in rows)
    injected = bc.CLASSES["steady"]("steady", [31, 0, 0])
    healthy = bc.CLASSES["steady"]("steady", [31, 0, bc.HEALTHY_STREAM, 0], False)
    assert injected.shape != healthy.shape


def test_an_arm_whose_window_lies_past_the_runs_end_captured_nothing() -> None:
    """Seed 40, requeue run 0: rank 1 3x from step 103 of the requeued generation (635 steps), reported at step 384
    and armed with a window at step 866, past the run's last step. The window never profiled the change: lost, not
    captured (it was counted captured before)."""
    bc = _corpus()
    (c,) = _scored(bc, "requeue", 40, 0)["changes"]
    assert c["lasting"] and c["detectable"] and c["delay_steps"] > 0, c
    assert not c["captured"], c


def test_a_healthy_serving_unit_whose_work_mix_moved_between_bands_learned_apart_does_not_arm() -> None:
    """``--healthy-hours`` seed 103 serving_work healthy run 1 (TP-4 with ``work``, 52 minutes): the unit's level
    split +27 % at z 5.58 when its batch moved from 1-20 to 15-30, while the bands that both parts used changed
    +15 % (their offsets learned in a chain, each against the level of the bands before it: ``UnitLevel._within``),
    and armed. It does not now (a healthy run: every arm is false)."""
    bc = _corpus()
    run = bc.CLASSES["serving_work"]("serving_work", [103, list(bc.CLASSES).index("serving_work"), bc.HEALTHY_STREAM,
                                                      1], False)
    row = bc.score(run, replay_lines(run.lines, ReplayConfig()))
    assert row["false_arms"] == 0 and not row["violations"], row["false_arm_at"]


def test_a_healthy_serving_unit_whose_references_froze_while_the_host_load_drifted_does_not_arm() -> None:
    """``--healthy-hours`` seed 104 serving_work healthy run 2 (one TP-2 unit with ``work``, 53 minutes): the load
    bands stopped learning while the regression detector gathered evidence of a rise (``UnitPipeline._follow_blocks``)
    for 19 blocks, cutoff held at step 2091 while the unit ran to step 7308. The references were learned on steps
    71-2091 (93-768 s) at a mean host load of 1.19; steps 3987-7308 (1462-2879 s) ran at 1.27 (+6.5 %), and with the
    bands the batch then visited the block ratios read 1.02-1.27 (about +12 %) for all 19 blocks: a false +17 %
    ``step_regression`` at step 7308 (a healthy run: every arm is false). The same error runs the other way in
    tests/unit/test_serving_rescale.py seed 2: its real +30 % (from 1200 s) reads +17 % after 25 frozen blocks
    (1233-2767 s), so neither a cap on frozen blocks nor on their wall time tells the two apart; the references'
    host-load sampling error (a band's window spans a few 20-90 s load periods) has to shrink instead: band windows
    of ``serving.BAND_WINDOW`` = 512 values, not 128."""
    bc = _corpus()
    run = bc.CLASSES["serving_work"]("serving_work", [104, list(bc.CLASSES).index("serving_work"), bc.HEALTHY_STREAM,
                                                      2], False)
    row = bc.score(run, replay_lines(run.lines, ReplayConfig()))
    assert row["false_arms"] == 0 and not row["violations"], row["false_arm_at"]
