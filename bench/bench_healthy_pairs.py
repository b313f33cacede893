"""How often "what changed" names a change between two windows of one healthy, live job (issue 32).

Each pair is a real 2-rank CPU gloo job (``tests/integration/gloo_job.py``: torch.profiler, ``--warmup-steps``
unprofiled steps first) whose two capture windows of ``--steps`` steps are compared as reference and capture
(``core/changes/comparison.compare_captures`` on the Kineto breakdown of ``core/verdict/kineto.py``). Nothing
changes in the job between its windows, so every change named is a false one. For each pair the comparison is
made twice: with the rule as it is (a change must exceed the reference capture's robust step-to-step spread, at
least the floor) and with the floor alone (the rule before issue 32's second stop), so one run shows both rates on
the same traces. ``--hogs N`` runs N busy-loop processes beside the jobs (a shared, loaded host). Prints a row per
pair and the totals; nothing is asserted.

Usage: python bench/bench_healthy_pairs.py [--pairs 20] [--steps 6] [--warmup-steps 20] [--hogs 0]
"""

from __future__ import annotations

import argparse
import glob
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "daemon"), str(REPO)]


def _hog(stop_at: float) -> None:  # a busy loop: one CPU's worth of load until ``stop_at``
    while time.time() < stop_at:
        pass


def _rows(cap_dir: str):  # -> list[RankStepSummary]
    from profwatch.adapters.tools.kineto_reader import read_rank_trace, summarize_traces

    files = sorted(glob.glob(os.path.join(cap_dir, "*", "*.pt.trace.json")))
    return summarize_traces({i: read_rank_trace(Path(f), rank=i) for i, f in enumerate(files)}).summaries


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=20)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup-steps", type=int, default=20)
    ap.add_argument("--hogs", type=int, default=0)
    args = ap.parse_args()
    import profwatch.core.changes.comparison as comparison

    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "daemon"), str(REPO)]),
               TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    hogs = [multiprocessing.Process(target=_hog, args=(time.time() + 3600,), daemon=True) for _ in range(args.hogs)]
    for h in hogs:
        h.start()
    named = {"rule": 0, "floor only": 0}
    stepped = {"rule": 0, "floor only": 0}
    cpu0 = os.times()
    try:
        print(f"{'pair':>4} {'step ms':>8} {'delta ms':>9} {'effect ms':>9}  rule: named            floor only: named")
        for i in range(args.pairs):
            with tempfile.TemporaryDirectory(prefix="pwhp") as tmp:
                a, b = os.path.join(tmp, "a"), os.path.join(tmp, "b")
                proc = subprocess.run([sys.executable, str(REPO / "tests" / "integration" / "gloo_job.py"), a,
                                       "--second-out", b, "--world-size", "2", "--steps", str(args.steps),
                                       "--warmup-steps", str(args.warmup_steps)],
                                      env=env, capture_output=True, text=True, timeout=600, check=False)
                if proc.returncode != 0:
                    print(f"{i:>4} job failed: {proc.stderr[-300:]}")
                    continue
                ref, now = _rows(a), _rows(b)
            out = {}
            spread = comparison.robust_spread
            for mode in ("rule", "floor only"):
                if mode == "floor only":
                    comparison.robust_spread = lambda values: 0.0  # the floor alone decides
                try:
                    out[mode] = comparison.compare_captures(ref, now)
                finally:
                    comparison.robust_spread = spread
                named[mode] += bool([c for c in out[mode].changes if c.delta_s_per_step is not None])
                stepped[mode] += out[mode].step_time_changed
            c = out["rule"]
            rule_note = next((n for n in c.notes if n.startswith("a change counts when")), "")
            effect = rule_note.split("exceeds ", 1)[-1].split(" ms/step", 1)[0] if rule_note else "?"

            def say(cmp) -> str:
                parts = [f"{x.component} {1e3 * (x.delta_s_per_step or 0):+.1f}" for x in cmp.changes]
                return ("step " if cmp.step_time_changed else "") + (", ".join(parts) or "-")

            print(f"{i:>4} {1e3 * (c.step_time_baseline_s or 0):>8.1f} {1e3 * (c.step_delta_s or 0):>+9.1f} "
                  f"{effect:>9}  {say(c):<22} {say(out['floor only'])}")
    finally:
        for h in hogs:
            h.terminate()
            h.join(5)
    cpu = os.times()
    n = args.pairs
    print(f"\npairs {n}, {args.steps} vs {args.steps} steps, hogs {args.hogs}, "
          f"load average {os.getloadavg()[0]:.1f}, CPU s (children) {cpu.children_user - cpu0.children_user:.1f}")
    for mode in ("rule", "floor only"):
        print(f"  {mode:<10}: a component named in {named[mode]} of {n} healthy pairs, "
              f"the step time called changed in {stepped[mode]} of {n}")


if __name__ == "__main__":
    main()
