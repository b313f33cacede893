"""The slow rank of a lockstep tensor-parallel pair in real Kineto traces of the live serving loop
(``tests/data/live_serving_tp``, see its SOURCES.md): the rank that never waits in the all-reduce is the slow one.

In a 2-rank group the ``late`` signal (peers' wait for a rank) of the two ranks is antisymmetric. A small group
(2-5 ranks) is judged step by step (``daemon/profwatch/core/verdict/paired.py``: a within-step permutation test whose
smallest p-value is 2^-steps for a pair). With 4 steps on a busy host the evidence is real but weak (best p 1/16;
the between-rank z about 2): the verdict names nobody, rightly. With 20 steps of the same loop the step-by-step test
names rank 1."""

from __future__ import annotations

from pathlib import Path

from profwatch.adapters.tools.kineto_reader import analyze_torch_batch
from profwatch.core.verdict.evidence import ClusterEvidence
from profwatch.core.verdict.ranking import RankingSettings, _noise_tests, judge_batch
from profwatch.core.verdict.signals import measure_signals
from tests.real_traces import layout

DATA = Path(__file__).parent.parent / "data" / "live_serving_tp"


def _evidence(tmp_path: Path, name: str) -> ClusterEvidence:
    dirs = layout(tmp_path, [DATA / name / "rank0.pt.trace.json.gz", DATA / name / "rank1.pt.trace.json.gz"])
    return analyze_torch_batch(dirs)


def test_twenty_steps_name_the_rank_that_never_waits(tmp_path: Path) -> None:
    ev = _evidence(tmp_path, "probe20")
    verdict = judge_batch(ev, settings=RankingSettings(min_effect_frac=0.08))
    assert [s.rank for s in verdict.suspects] == [1]
    top = verdict.suspects[0].evidence
    assert top["signal"] == "late" and top["z"]["late"] > 2 * top["threshold_z"]
    assert top["median_us"]["wait_us"] == 0.0 and top["peer_median_us"]["wait_us"] > 1000.0


def test_four_steps_point_the_same_way_below_the_threshold(tmp_path: Path) -> None:
    ev = _evidence(tmp_path, "probe4")
    settings = RankingSettings(min_effect_frac=0.08)
    assert judge_batch(ev, settings=settings).suspects == []
    tests = _noise_tests(measure_signals(ev.summaries), settings)
    late = tests["late"].z
    assert late[1] > 1.5 and late[0] == -late[1]  # rank 1 is the one peers wait for, antisymmetric in a pair
    assert max(late.values()) < settings.min_robust_z / 1.5  # far below 4: relaxing it would name healthy pairs
