"""Where each injected change's delay goes, per change of ``bench/bench_corpus.py`` (prints JSON lines; no
assertions): which detector first reported it (``first_kind`` and the report's ``pattern``: ``cusum``, ``level``
for a spike-held level change, ``learning`` when the baseline was still learning), the spike hold it carried
(``hold``, values: steps or blocks of fast steps), the seconds from the onset to the first report (``delay_s``),
to the first covering arm (``arm_s``: any wait for the budget is ``arm_s - delay_s``) and to that capture's
window (``win_s``: ``start_step + warmup`` reached; ``win_s - arm_s`` is the capture's lead and warm-up).

Usage: ``python bench/corpus_delay_sources.py SEED all RUNS [classes]`` (every run of each class with a scored
change, as ``bench_corpus --runs RUNS --seed SEED`` draws them) or ``python bench/corpus_delay_sources.py SEED
noisy:5 levels:1`` (single runs). Cost: one replay per run, as the bench.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "daemon"))

import bench_corpus as bc  # noqa: E402

from profwatch.commands.replay import ReplayConfig, replay_lines  # noqa: E402


def sources(cls: str, seed0: int, i: int) -> list[dict[str, Any]]:
    """One row per scored change of run ``i`` of class ``cls`` (seed ``[seed0, class index, i]``)."""
    run = bc.CLASSES[cls](cls, [seed0, list(bc.CLASSES).index(cls), i], True)
    res = replay_lines(run.lines, ReplayConfig())
    row = bc.score(run, res)
    gone = {w["capture_id"] for w in res.get("withdrawn") or ()}
    arms = [a for a in res["arms"] if a.get("capture_id") not in gone]
    out = []
    for c, sc in zip([c for c in run.changes if c.scored], row["changes"], strict=True):
        def names(a: dict[str, Any], c: bc.Change = c) -> bool:
            return not c.ranks or not a["ranks"] or bool(set(c.ranks) & set(a["ranks"]))

        hits = sorted((a for a in res["anomalies"] if a["kind"] in ("step_regression", "rank_outlier")
                       and a["at_unix_s"] >= c.onset_t and names(a)), key=lambda a: a["at_unix_s"])
        d: dict[str, Any] = {"seed": seed0, "cls": cls, "run": i, "kind": c.kind, "f": round(c.factor, 2),
                             "onset": c.onset, "epoch": c.epoch, **run.shape,
                             "delay_steps": sc["delay_steps"],
                             "delay_s": round(sc["delay_s"], 2) if math.isfinite(sc["delay_s"]) else None,
                             "captured": sc["captured"], "lasting": sc["lasting"], "detectable": sc["detectable"]}
        if hits:
            det = hits[0].get("detail") or {}
            d.update(first_kind=hits[0]["kind"], pattern=det.get("pattern"), report_step=hits[0]["step"],
                     hold=det.get("hold_steps"), learning=bool(det.get("learning")), first_step=det.get("first_step"))
        cov = [a for a in arms if names(a) and (c.onset_t <= a["at_unix_s"] <= c.end_t + bc.GRACE_S
                                                or bc._window_after_onset(run, c, a))]
        if cov:
            a = min(cov, key=lambda a: a["at_unix_s"])
            start = a.get("start_step")
            t = run.step_at.get((c.epoch, start + int(a.get("warmup") or 0))) if isinstance(start, int) else None
            d.update(arm_s=round(a["at_unix_s"] - c.onset_t, 2), arm_step=a.get("step"), start_step=start,
                     win_s=round(t - c.onset_t, 2) if t is not None else None)
        out.append(d)
    return out


def main(argv: list[str]) -> None:
    seed0 = int(argv[0])
    if argv[1] == "all":
        runs = int(argv[2])
        wanted = argv[3].split(",") if len(argv) > 3 else list(bc.CLASSES)
        for cls in wanted:
            for i in range(max(1, round(runs * bc.RUN_WEIGHT.get(cls, 1.0)))):
                run = bc.CLASSES[cls](cls, [seed0, list(bc.CLASSES).index(cls), i], True)
                if any(c.scored for c in run.changes):
                    for d in sources(cls, seed0, i):
                        print(json.dumps(d), flush=True)
        return
    for spec in argv[1:]:
        cls, i = spec.split(":")
        for d in sources(cls, seed0, int(i)):
            print(json.dumps(d), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
