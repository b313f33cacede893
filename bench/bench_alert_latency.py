"""Time to alert (issue 13): batch complete -> first alert -> enriched alert, beside each recipe alone.

Sections (each prints numbers; nothing is asserted):

0. **First verdict** at each ``--first-sizes`` (default 16, 64, 256, 1024; minimal trees, one rank 1.5x slow): the
   ranks' parse-done markers land over ``--spread-s`` seconds; from the last one, the first verdict judged on the
   ranks' own tables (``pre``: each rank's tables read as its marker landed, the coordinator's path; ``read``: all
   read at completion by 4 threads), beside msprof-analyze cluster_time_summary alone on the same batch,
   interleaved pre, read, alone, alone, read, pre. Goal: <= 1 s at 1024 ranks and <= 0.5x cluster_time_summary
   alone at every size (docs/msprof-analyze.md#own-tables).

1. **Latency** at each ``--sizes`` (default 16, 64, 256, 512, 1024 generated ranks, minimal trees: one kernel per
   chunk, 3 steps, one rank 1.5x slow):
   the batch is found complete by ``scan_tree``; then ``analyze_batch(enrich=False)`` (stage, cluster_time_summary
   and slow_rank concurrently, rank, report) = first alert, and ``enrich_analysis`` (communication matrix, the
   advisor under its size rule, report rewritten) = enriched alert; then cluster_time_summary and slow_rank each
   run alone on the same staged batch with the same runner settings. Peak RSS is the sum over the bench process
   and all its descendants (the msprof-analyze process trees), polled every 0.2 s. Goal: first alert <= 1.2 x the
   slower of the two recipes alone.
2. **Advisor at its cap**: ``--cap-ranks`` ranks (default 512; full generated trees, not minimal ones, as in the
   issue's measurement) with the size rule off (the advisor reads every
   rank), the tools capped at ``--cap-mib`` (default 1024 MiB, watchdog): the advisor's status (``oom``), its peak,
   and the suspect alert published before it.
3. **Targeted vs full capture** of a 4096-rank job (8 ranks per node) with one slow rank: ranks, files and bytes,
   from the files and bytes of generated rank dirs (full, not minimal, 5 active steps) scaled to the rank count.
4. **The 30 s budget** of a 1000-rank job at 1 s per step, from the figures above (``--budget-alert-s`` overrides
   the measured first alert of the largest size run).
5. ``--scan``: the scan benchmark (``bench/scan_tree_bench.py``).

Run from the repo root: ``python bench/bench_alert_latency.py [--first-sizes 16,1024] [--only-first] [--sizes 16,64,256]
[--no-cap] [--scan]``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any

from profwatch.adapters.fs import staging
from profwatch.adapters.fs.rank_dir_fs import scan_tree
from profwatch.adapters.tools.msprof_runner import MsprofRunner
from profwatch.adapters.tools.own_tables_reader import TablePrefetcher
from profwatch.analysis.facade import AnalysisSettings, analyze_batch, enrich_analysis
from profwatch.core.arming.settings import ArmingSettings
from profwatch.core.arming.targeting import JobTopology, TargetingSettings, estimate_capture_bytes, plan_targets
from profwatch.core.batches.completeness import BatchState
from profwatch.core.capture.planner import CaptureSettings, lead_steps, poll_interval_s
from profwatch.core.verdict.msprof_plan import MsprofSettings
from profwatch.simulate.ascend_tree import generate_cluster

MiB = 2**20
PAGE = os.sysconf("SC_PAGE_SIZE")


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        kids.setdefault(int(fields[1]), []).append(int(name))
    return kids


def tree_rss_bytes(root: int) -> int:
    """Resident bytes of ``root`` and all its descendants (``/proc/<pid>/statm``; shared pages counted per process)."""
    kids, total, todo = _children(), 0, [root]
    while todo:
        pid = todo.pop()
        todo.extend(kids.get(pid, ()))
        try:
            with open(f"/proc/{pid}/statm") as f:
                total += int(f.read().split()[1]) * PAGE
        except (OSError, IndexError, ValueError):
            continue
    return total


class PeakRss:
    """Polls :func:`tree_rss_bytes` of this process in a thread; ``peak`` in bytes."""

    def __init__(self, interval_s: float = 0.2) -> None:
        self.peak = 0
        self._stop = threading.Event()
        self._interval = interval_s
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, tree_rss_bytes(os.getpid()))
            self._stop.wait(self._interval)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _batch(root: Path, world: int) -> BatchState:
    (batch,) = scan_tree(root, world_size=world)
    if batch.status != "complete":
        raise SystemExit(f"generated batch of {world} ranks is {batch.status}: {batch.describe()}")
    return batch


def _settings(**msprof: Any) -> AnalysisSettings:
    settings = AnalysisSettings()
    settings.msprof = MsprofSettings(**{"memory_limit": "watchdog", "retries": 0, "timeout_s": 1800, **msprof})
    return settings


def latency_row(work: Path, n: int, settings: AnalysisSettings) -> dict[str, Any]:
    """One size of section 1; returns the figures (seconds, bytes)."""
    root = work / f"batch{n}"
    shutil.rmtree(work, ignore_errors=True)
    t = time.monotonic()
    generate_cluster(root, world_size=n, slow_ranks={n // 3: 1.5}, steps=3, minimal=True)
    gen_s = time.monotonic() - t
    batch = _batch(root, n)
    row: dict[str, Any] = {"ranks": n, "gen_s": gen_s}
    with MsprofRunner(settings.msprof) as runner, PeakRss() as rss:
        t0 = time.monotonic()
        result = analyze_batch(batch, work_dir=work / "w", settings=settings, runner=runner, enrich=False)
        row["alert_s"] = time.monotonic() - t0
        first = result.alert_data()
        follow = result.followup
        enrich_analysis(result, runner=runner)
        session = follow.session if follow is not None else None  # made by the enrich phase after a first verdict
        row["enriched_s"] = time.monotonic() - t0
        after = result.alert_data()
        row["peak_rss"] = rss.peak
        row["concurrency"] = runner.concurrency
        alone: dict[str, float] = {}
        if session is not None:
            for c in session.plan.phase("alert"):
                run = runner.run(c.name, c.args, work / "w" / "alone", phase="alert")
                alone[c.name] = run.duration_s if run.returncode == 0 else float("nan")
    row["alone"] = alone
    row["suspects"] = [s["rank"] for s in first.get("suspects", [])][:3]
    row["status"] = first.get("status")
    row["recipes"] = {k: (v.get("status"), v.get("duration_s")) for k, v in after.get("recipes", {}).items()}
    shutil.rmtree(work, ignore_errors=True)
    return row


def section_latency(work: Path, sizes: list[int], concurrency: int) -> list[dict[str, Any]]:
    print("== 1. batch complete -> first alert -> enriched alert (generated batches, 3 steps, one slow rank) ==")
    print(f"cores: {os.cpu_count()}; alert recipes at once: {concurrency or 'auto (both on 2+ CPUs)'}; "
          "tools under the watchdog; advisor size rule at its default "
          f"(advisor_max_ranks {MsprofSettings().advisor_max_ranks}, above it: subset)")
    print(f"{'ranks':>6} {'alert s':>8} {'enriched s':>10} {'cts alone':>9} {'slow_rank alone':>15} "
          f"{'alert/max alone':>15} {'peak RSS MiB':>12}  suspects  recipes (status, s)")
    rows = []
    for n in sizes:
        row = latency_row(work, n, _settings(max_concurrent_runs=concurrency))
        a = row["alone"]
        slowest = max(a.get("cluster_time_summary", float("nan")), a.get("slow_rank", float("nan")))
        print(f"{n:>6} {row['alert_s']:>8.1f} {row['enriched_s']:>10.1f} "
              f"{a.get('cluster_time_summary', float('nan')):>9.1f} {a.get('slow_rank', float('nan')):>15.1f} "
              f"{row['alert_s'] / slowest:>15.2f} {row['peak_rss'] / MiB:>12.0f}  {row['suspects']} (slow {n // 3}) "
              + ", ".join(f"{k} {s} {d if d is None else round(d, 1)}" for k, (s, d) in row["recipes"].items()),
              flush=True)
        rows.append(row)
    print("goal: alert/max alone <= 1.2\n")
    return rows


def _loadavg() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def evict(root: Path) -> int:
    """Drop the page cache of every file under ``root`` (``fdatasync`` then ``posix_fadvise(POSIX_FADV_DONTNEED)``
    per file: a cold cache without root); returns the files evicted."""
    n = 0
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            try:
                fd = os.open(os.path.join(dirpath, name), os.O_RDONLY | os.O_NONBLOCK)
            except OSError:
                continue
            try:
                os.fdatasync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                n += 1
            except OSError:
                pass
            finally:
                os.close(fd)
    return n


def first_verdict_row(work: Path, n: int, spread_s: float, cold: bool = False, minimal: bool = True
                      ) -> dict[str, Any]:
    """Section 0 at ``n`` ranks, interleaved pre, read, alone, alone, read, pre: the first verdict after the last
    rank's completion with each rank's tables read as its marker landed (``pre``: the coordinator's path,
    ``TablePrefetcher``) and with every rank read at completion (``read``), beside cluster_time_summary alone.
    ``cold``: the batch's files are evicted from the page cache (:func:`evict`) before the scan and before each
    ``read`` and ``alone`` run (``pre`` reads as the markers land, warm by nature); each cold ``read`` run scans the
    tree again first (``scan_tree``: every rank DB checked cold) and its time includes that scan (``scan``)."""
    root = work / f"first{n}"
    shutil.rmtree(work, ignore_errors=True)
    dirs = generate_cluster(root, world_size=n, slow_ranks={n // 3: 1.5}, steps=3, minimal=minimal, with_marker=False)
    settings = _settings()
    fetcher = TablePrefetcher(settings.own_tables_workers)
    # the ranks complete over a parse-time window (their markers land spread out); timing starts at the last one
    for rank, d in enumerate(dirs):
        (d / "ASCEND_PROFILER_OUTPUT" / "analyse.done").touch(mode=0o640)  # torch_npu's parse-done marker
        fetcher.submit("p0", {rank: str(d)})
        if spread_s and rank < len(dirs) - 1:
            time.sleep(spread_s / len(dirs))
    if cold:
        evict(root)
    last_done = time.monotonic()
    batch = _batch(root, n)
    scan_s = time.monotonic() - last_done
    out: dict[str, list[float]] = {"pre": [], "read": [], "alone": [], "scan": []}
    suspects: list[int] = []
    with MsprofRunner(settings.msprof) as runner:
        cts_args: tuple[str, ...] = ()
        for turn, what in enumerate(("pre", "read", "alone", "alone", "read", "pre")):
            if what != "alone":
                pre = None
                if what == "pre" and turn:
                    fetcher.submit(f"p{turn}", batch.rank_dirs)  # again, as if read while the ranks parsed
                    time.sleep(spread_s)
                if what == "pre":
                    t0 = time.monotonic()
                    pre = fetcher.take(f"p{turn}")
                else:
                    if cold:
                        evict(root)
                    t0 = time.monotonic()
                    if cold:  # a cold first verdict checks the rank dirs cold too: the scan is part of it
                        batch = _batch(root, n)
                        out["scan"].append(time.monotonic() - t0)
                res = analyze_batch(batch, work_dir=work / f"w{turn}", settings=settings, runner=runner, enrich=False,
                                    prefetched=pre)
                out[what].append(time.monotonic() - t0)
                suspects = [s.rank for s in res.suspects][:3]
                assert res.verdict_source == "own_tables", (res.verdict_source, res.notes)
            else:
                if not cts_args:
                    from profwatch.adapters.tools.msprof_db import inspect_inputs
                    from profwatch.core.verdict.msprof_plan import plan_recipes

                    staged = staging.stage_batch(batch, work / "staging-alone")  # the tool reads a staging
                    plan = plan_recipes(inspect_inputs(staged), runner.settings, str(staged))
                    cts_args = next(c.args for c in plan.phase("alert") if c.name == "cluster_time_summary")
                if cold:
                    evict(root)
                run = runner.run("cluster_time_summary", cts_args, work / f"alone{turn}", phase="alert")
                out["alone"].append(run.duration_s if run.returncode == 0 else float("nan"))
    fetcher.close()
    shutil.rmtree(work, ignore_errors=True)
    return {"ranks": n, **out, "scan_s": scan_s, "suspects": suspects, "load": _loadavg()}


def section_first_verdict(work: Path, sizes: list[int], spread_s: float, cold: bool = False,
                          minimal: bool = True) -> None:
    print("== 0. last rank complete -> first verdict (own tables) vs cluster_time_summary alone "
          "(interleaved: pre, read, alone, alone, read, pre) ==")
    print(f"cores: {os.cpu_count()}; ranks' markers land over {spread_s:g} s; first verdict = analyze_batch(enrich="
          "False): each rank's tables (pre: read as its marker landed; read: all read at completion, 4 threads), "
          "combine, judge, report.json + report.html; scan = scan_tree after the last marker (cold: before each "
          "read run, and counted in it)")
    print(f"{'ranks':>6} {'scan s (cold: in read)':>13} {'pre s (2 runs)':>15} {'read s (2 runs)':>16} {'cts alone s (2)':>16} "
          f"{'pre/cts':>8} {'read/cts':>8}  {'load after':>14}  suspects")
    for n in sizes:
        r = first_verdict_row(work, n, spread_s, cold, minimal)
        p, f, a = sorted(r["pre"]), sorted(r["read"]), sorted(r["alone"])
        cts = sum(a) / len(a)
        scans = sorted(r["scan"]) or [r["scan_s"]]
        print(f"{n:>6} {scans[0]:>7.2f} {scans[-1]:>5.2f} {p[0]:>7.2f} {p[-1]:>7.2f} {f[0]:>8.2f} {f[-1]:>7.2f} {a[0]:>8.1f} "
              f"{a[-1]:>7.1f} {sum(p) / len(p) / cts:>8.3f} {sum(f) / len(f) / cts:>8.3f}  {r['load']:>14}  "
              f"{r['suspects']} (slow {n // 3})", flush=True)
    print(f"page cache: {'cold (posix_fadvise DONTNEED per file before the scan, read and alone runs)' if cold else 'warm'}; "
          f"trees: {'minimal' if minimal else 'full'}")
    print("goal: first verdict <= 1 s after completion at 1024 ranks; ratio <= 0.5 at every size\n")


def section_cap(work: Path, n: int, cap_mib: int) -> None:
    print(f"== 2. a {n}-rank advisor at a cap of {cap_mib} MiB (size rule off: the advisor reads every rank; "
          "generated trees with 6 kernels per chunk) ==")
    settings = _settings(memory_limit_bytes=cap_mib * MiB, advisor_max_ranks=max(n, 2), communication_matrix=False)
    root = work / f"cap{n}"
    shutil.rmtree(work, ignore_errors=True)
    generate_cluster(root, world_size=n, slow_ranks={n // 3: 1.5}, steps=3)  # full trees: 6 kernels per chunk
    batch = _batch(root, n)
    with MsprofRunner(settings.msprof) as runner, PeakRss() as rss:
        t0 = time.monotonic()
        result = analyze_batch(batch, work_dir=work / "w", settings=settings, runner=runner, enrich=False)
        alert_s = time.monotonic() - t0
        first = result.alert_data()
        enrich_analysis(result, runner=runner)
        enriched_s = time.monotonic() - t0
    after = result.alert_data()
    adv = after.get("recipes", {}).get("advisor", {})
    print(f"first alert {alert_s:.1f} s: status {first.get('status')}, suspects "
          f"{[s['rank'] for s in first.get('suspects', [])][:3]} (slow {n // 3})")
    print(f"advisor: status {adv.get('status')}, {adv.get('duration_s')} s, peak "
          f"{(adv.get('peak_rss_bytes') or 0) / MiB:.0f} MiB; detail: {str(adv.get('detail', ''))[:160]}")
    print(f"enriched alert {enriched_s:.1f} s: status {after.get('status')}, suspects "
          f"{[s['rank'] for s in after.get('suspects', [])][:3]}; bench tree peak RSS {rss.peak / MiB:.0f} MiB\n")
    shutil.rmtree(work, ignore_errors=True)


def _tree_size(root: Path) -> tuple[int, int]:
    files = size = 0
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            files += 1
            size += os.lstat(os.path.join(dirpath, name)).st_size
    return files, size


def section_targeted(work: Path, world: int = 4096, per_node: int = 8, active: int = 5) -> None:
    print(f"== 3. capture of a {world}-rank job ({per_node} ranks per node) with one slow rank: full vs targeted ==")
    sample = 8
    shutil.rmtree(work, ignore_errors=True)
    generate_cluster(work / "t", world_size=sample, slow_ranks={3: 1.5}, steps=active)
    files, size = _tree_size(work / "t")
    shutil.rmtree(work, ignore_errors=True)
    hosts = {r: f"node{r // per_node}" for r in range(world)}
    ts = TargetingSettings()
    for label, ranks in (("rank outlier", [1234]), ("job-wide regression", [])):
        target = plan_targets(ranks, JobTopology(world, hosts), ts)
        k = len(target.rank_list) if target.rank_list is not None else world
        print(f"{label}: {target.detail}")
        print(f"{'':>4}{'capture':<10} {'ranks':>6} {'files':>9} {'generated bytes':>16} "
              f"{'estimate (16 MiB/rank/step)':>28}")
        for name, count in (("full", world), ("targeted" if ranks else "sample", k)):
            est = estimate_capture_bytes(count, active, ts.bytes_per_rank_step)
            print(f"{'':>4}{name:<10} {count:>6} {files * count // sample:>9} "
                  f"{size * count / sample / MiB:>14.0f} M {est / 2**30:>26.1f} G")
    print(f"(generated rank dir: {files // sample} files, {size / sample / MiB:.2f} MiB for {active} steps of the "
          "generator's small timeline; real captures are larger, hence the estimate column)\n")


def section_budget(alert_s: float, source: str, step_s: float = 1.0) -> None:
    print(f"== 4. the 30 s budget: a 1000-rank job at {step_s:g} s per step ==")
    arming, cap = ArmingSettings(), CaptureSettings()
    furthest = 100
    detect = 6 * step_s
    lead = lead_steps(furthest, step_s, cap) * step_s
    window = (arming.warmup + arming.active) * step_s
    completion = 1.0
    parts = [("detection (about 6 steps, docs/verdicts.md)", detect),
             (f"arm lead (poll {poll_interval_s(furthest, step_s):g} s + margin {cap.margin_s:g} s, "
              f"+{cap.margin_steps} steps)", lead),
             (f"window (warmup {arming.warmup} + active {arming.active} steps)", window),
             ("ranks' own parse", 0.0),
             ("batch complete noticed (inotify; bench_completion.py)", completion),
             (f"batch complete -> first alert ({source})", alert_s)]
    for what, s in parts:
        print(f"  {what:<62} {s:>6.1f} s" + ("   (excluded)" if what.startswith("ranks'") else ""))
    total = sum(s for _w, s in parts)
    print(f"  {'total':<62} {total:>6.1f} s   (goal 30 s; first alert goal <= 10 s)\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="16,64,256,512,1024")
    ap.add_argument("--cap-ranks", type=int, default=512)
    ap.add_argument("--cap-mib", type=int, default=1024)
    ap.add_argument("--concurrency", type=int, default=0, help="max_concurrent_runs (0 = the default rule)")
    ap.add_argument("--no-cap", action="store_true", help="skip section 2")
    ap.add_argument("--budget-alert-s", type=float, default=None)
    ap.add_argument("--scan", action="store_true", help="also run bench/scan_tree_bench.py at 1024,4096,16384")
    ap.add_argument("--work", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "profwatch-bench-alert")
    ap.add_argument("--first-sizes", default="16,64,256,1024",
                    help="section 0: first verdict (own tables) vs cluster_time_summary alone; '' skips it")
    ap.add_argument("--spread-s", type=float, default=2.0, help="section 0: window over which the ranks complete")
    ap.add_argument("--only-first", action="store_true", help="run section 0 only")
    ap.add_argument("--cold", action="store_true", help="section 0 with the batch evicted from the page cache")
    ap.add_argument("--full-trees", action="store_true", help="section 0 on full generated trees, not minimal ones")
    a = ap.parse_args()
    first_sizes = [int(x) for x in a.first_sizes.split(",") if x]
    if first_sizes:
        section_first_verdict(a.work, first_sizes, a.spread_s, a.cold, not a.full_trees)
    if a.only_first:
        shutil.rmtree(a.work, ignore_errors=True)
        return
    sizes = [int(x) for x in a.sizes.split(",") if x]
    rows = section_latency(a.work, sizes, a.concurrency) if sizes else []
    if not a.no_cap:
        section_cap(a.work, a.cap_ranks, a.cap_mib)
    section_targeted(a.work)
    if a.budget_alert_s is not None:
        section_budget(a.budget_alert_s, "given")
    elif rows:
        last = max(rows, key=lambda r: r["ranks"])
        section_budget(last["alert_s"], f"measured at {last['ranks']} ranks")
    if a.scan:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import scan_tree_bench

        scan_tree_bench.run(a.work / "scan", [1024, 4096, 16384])
    shutil.rmtree(a.work, ignore_errors=True)


if __name__ == "__main__":
    main()
