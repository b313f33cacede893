"""scan_tree and `profwatch scan` on generated Ascend trees (daemon/profwatch/simulate/ascend_tree.py)."""

from __future__ import annotations

import errno
import json
import os
import shutil
import time
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from profwatch.adapters.fs import rank_dir_fs
from profwatch.adapters.fs.rank_dir_fs import RankDirReader, TreeUnavailable, find_rank_dirs, scan_tree
from profwatch.commands.scan import scan
from profwatch.core.batches.settings import WatchSettings
from profwatch.simulate import ascend_tree as gen

BASE_S = gen.DEFAULT_TS_BASE_NS / 1e9
EARLY = BASE_S + 30  # before every default deadline
LATE = BASE_S + 100_000  # after every default deadline


def _one(root: Path, now: float = EARLY, **kw: object) -> rank_dir_fs.BatchState:
    out = scan_tree(root, now=now, **kw)  # type: ignore[arg-type]
    assert len(out) == 1, [b.to_json() for b in out]
    return out[0]


@pytest.fixture
def cluster(tmp_path: Path) -> list[Path]:
    return gen.generate_cluster(tmp_path / "prof", world_size=4, capture_id="cap-1")


def test_complete(cluster: list[Path]) -> None:
    b = _one(cluster[0].parent)
    assert b.status == "complete", b.to_json()
    assert b.batch_id == "cap-1" and b.steps == [1, 2, 3] and b.rank_dirs == {r: str(p) for r, p in enumerate(cluster)}


def test_one_rank_missing(cluster: list[Path]) -> None:
    shutil.rmtree(cluster[2])
    assert _one(cluster[0].parent).status == "parsing"
    b = _one(cluster[0].parent, now=LATE)
    assert b.status == "incomplete" and b.missing_ranks == [2]


def test_rank_still_parsing(cluster: list[Path]) -> None:
    gen.remove_marker(cluster[1])
    gen.add_prof_leftovers(cluster[1])
    b = _one(cluster[0].parent)
    assert b.status == "parsing" and b.ranks[1].state == "parsing"


def test_older_torch_npu_without_marker_completes_after_quiet_period(cluster: list[Path]) -> None:
    for d in cluster:
        gen.remove_marker(d)
    settings = WatchSettings(quiet_period_s=30)
    early = _one(cluster[0].parent, now=time.time(), settings=settings)
    assert {s.state for s in early.ranks.values()} == {"parsing"}  # outputs changed within the quiet period
    b = _one(cluster[0].parent, now=time.time() + 31, settings=settings, world_size=4)
    assert b.status == "complete" and any("no analyse.done" in n for n in b.notes)


def test_rank_reparsed(cluster: list[Path]) -> None:
    gen.remove_output(cluster[3])
    b = _one(cluster[0].parent)
    assert b.status == "parsing" and b.ranks[3].state == "raw_complete"


def test_duplicate_rank_hand_armed(tmp_path: Path) -> None:
    tls = gen.build_timelines(world_size=4)
    for tl in tls:
        gen.write_rank_dir(tmp_path, tl)
    dup = gen.write_rank_dir(tmp_path, replace(tls[1], pid=9001, start_ns=tls[1].start_ns + 300_000_000))
    b = _one(tmp_path)
    assert b.status == "invalid"
    assert any(str(dup) in p.reason and p.rank == 1 for p in b.problems)


def test_two_captures_in_one_folder(tmp_path: Path) -> None:
    gen.generate_cluster(tmp_path, world_size=4)
    gen.generate_cluster(tmp_path, world_size=4, ts_base=gen.DEFAULT_TS_BASE_NS + 3600 * 10**9, seed=1)
    gen.generate_cluster(tmp_path, world_size=2, capture_id="c-a", ts_base=gen.DEFAULT_TS_BASE_NS + 7200 * 10**9)
    out = scan_tree(tmp_path, now=EARLY)
    assert sorted((b.status, len(b.ranks)) for b in out) == [("complete", 2), ("complete", 4), ("complete", 4)]
    assert len({p for b in out for p in b.rank_dirs.values()}) == 10


def test_text_only_export(tmp_path: Path) -> None:
    gen.generate_cluster(tmp_path, world_size=2, export_type="text")
    b = _one(tmp_path)
    assert b.status == "incomplete" and all("text-only" in p.reason for p in b.problems)


def test_truncated_db(cluster: list[Path]) -> None:
    gen.truncate_db(cluster[0])
    b = _one(cluster[0].parent)
    assert b.status == "incomplete" and b.problems[0].rank == 0 and b.problems[0].path == str(cluster[0])


def test_wrong_rank_inside_db(cluster: list[Path]) -> None:
    gen.set_rank_device_map(cluster[1], 3)
    b = _one(cluster[0].parent)
    assert b.status == "incomplete" and "RANK_DEVICE_MAP.rankId is 3" in b.problems[0].reason


def test_no_step_time(cluster: list[Path]) -> None:
    for d in cluster:
        gen.drop_step_time(d)
    b = _one(cluster[0].parent)
    assert b.status == "complete" and b.steps == [] and any("no step boundaries" in n for n in b.notes)


def test_level0_no_communication(tmp_path: Path) -> None:
    gen.generate_cluster(tmp_path, world_size=4, level="Level0")
    b = _one(tmp_path)
    assert b.status == "complete" and any("no communication data" in n for n in b.notes)


def test_deep_tree(tmp_path: Path) -> None:
    dirs = gen.generate_cluster(tmp_path / "flat", world_size=4, capture_id="deep")
    for r, d in enumerate(dirs):
        dest = tmp_path / "root" / f"node{r // 2}" / "job" / "prof"
        dest.mkdir(parents=True, exist_ok=True)
        d.rename(dest / d.name)
    assert _one(tmp_path / "root").status == "complete"
    too_deep = tmp_path / "root" / "node1" / "a" / "b" / "c" / "d" / "e"
    too_deep.mkdir(parents=True)
    moved = next((tmp_path / "root" / "node1" / "job" / "prof").iterdir())
    moved.rename(too_deep / moved.name)
    assert len(find_rank_dirs(str(tmp_path / "root"))[0]) == 3  # msprof-analyze walks 5 levels too (docs/msprof-analyze.md#discovery)


def test_1024_ranks(tmp_path_factory: pytest.TempPathFactory) -> None:
    root = tmp_path_factory.mktemp("big")
    gen.generate_cluster(root, world_size=1024, minimal=True, capture_id="big")
    reader = RankDirReader()
    t0 = time.monotonic()
    b = _one(root, reader=reader)
    first_s = time.monotonic() - t0
    t0 = time.monotonic()
    assert _one(root, reader=reader).status == "complete"
    print(f"scan 1024 ranks: first {first_s:.2f}s, cached {time.monotonic() - t0:.2f}s")
    assert b.status == "complete" and len(b.ranks) == 1024


def test_unreadable_rank_dir_is_unknown(cluster: list[Path], monkeypatch: pytest.MonkeyPatch) -> None:
    real_scandir = os.scandir
    victim = str(cluster[1])

    def flaky(path: object = ".") -> object:
        if os.fspath(path) == victim:  # type: ignore[arg-type]
            raise OSError(errno.ESTALE, "Stale file handle")
        return real_scandir(path)  # type: ignore[arg-type]

    reader = RankDirReader()
    assert _one(cluster[0].parent, reader=reader).status == "complete"
    monkeypatch.setattr(rank_dir_fs.os, "scandir", flaky)
    # a reader that saw the rank before keeps its identity: the rank is unknown, not deleted (docs/field-cases.md#fc-15)
    b = _one(cluster[0].parent, reader=reader)
    assert b.status == "parsing" and b.ranks[1].state == "unknown" and b.missing_ranks == []
    # a fresh reader cannot tell the rank, but still does not call the batch incomplete before the deadline
    b = _one(cluster[0].parent)
    assert b.status == "parsing" and b.missing_ranks == [1] and b.unassigned[0].state == "unknown"


def test_vanished_root_is_unavailable(tmp_path: Path) -> None:
    with pytest.raises(TreeUnavailable):
        scan_tree(tmp_path / "gone")
    assert RankDirReader().read(str(tmp_path / "node0_1_20260101120000000_ascend_pt")) is None


def test_cli_exit_codes_and_json(cluster: list[Path]) -> None:
    runner = CliRunner()
    res = runner.invoke(scan, [str(cluster[0].parent), "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data[0]["status"] == "complete" and data[0]["expected_ranks"] == [0, 1, 2, 3]
    res = runner.invoke(scan, [str(cluster[0].parent), "--world-size", "8"])
    assert res.exit_code == 1 and "missing ranks: [4, 5, 6, 7]" in res.output
    assert runner.invoke(scan, [str(cluster[0].parent / "nope")]).exit_code == 2  # unreadable: input error


def test_unknown_world_size_is_never_complete(cluster: list[Path]) -> None:
    """Without parallel_group_info / distributed_args / --world-size, missing top ranks cannot be ruled out."""
    for d in cluster:
        meta = d / "profiler_metadata.json"
        data = json.loads(meta.read_text())
        data.pop("parallel_group_info", None)
        data.pop("distributed_args", None)
        meta.write_text(json.dumps(data))
    shutil.rmtree(cluster[3])
    b = _one(cluster[0].parent)
    assert b.status != "complete", b.to_json()
    assert any("world size unknown" in p.reason for p in b.problems)
    assert _one(cluster[0].parent, world_size=4).missing_ranks == [3]


def test_special_files_do_not_hang_or_exhaust_the_scan(cluster: list[Path]) -> None:
    info = next(cluster[1].glob("profiler_info_*.json"))
    info.unlink()
    os.mkfifo(info)  # a reader that blocked on it would hang the scan forever
    info3 = next(cluster[3].glob("profiler_info_*.json"))
    info3.unlink()
    info3.symlink_to("/dev/zero")  # an unbounded read would eat memory
    b = _one(cluster[0].parent, world_size=4)
    assert b.status != "complete"
    reasons = " ".join(p.reason for p in b.problems)
    assert "not a regular file" in reasons, reasons


@pytest.mark.parametrize(("export_type", "drop_analysis", "reason"), [
    ("text", False, "text export: re-export as db"),  # old torch_npu, text-only: no DB at all
    ("db", True, "analysis.db missing"),  # old torch_npu whose analysis.db was never written
])
def test_old_torch_npu_without_marker_names_the_real_reason_after_the_quiet_period(
        tmp_path: Path, export_type: str, drop_analysis: bool, reason: str) -> None:
    dirs = gen.generate_cluster(tmp_path / "prof", world_size=2, export_type=export_type, with_marker=False)  # type: ignore[arg-type]
    if drop_analysis:
        for d in dirs:
            (d / "ASCEND_PROFILER_OUTPUT" / "analysis.db").unlink()
    settings = WatchSettings(quiet_period_s=30)
    early = _one(tmp_path / "prof", now=time.time(), settings=settings, world_size=2)
    assert {s.state for s in early.ranks.values()} == {"parsing"}  # outputs changed within the quiet period
    assert all("not both DBs yet" in p.reason for p in early.problems if p.rank is not None)
    months = _one(tmp_path / "prof", now=time.time() + 90 * 86400, settings=settings, world_size=2)
    assert months.status == "incomplete" and {s.state for s in months.ranks.values()} == {"failed"}
    assert all(reason in p.reason for p in months.problems), months.to_json()


def test_a_batch_mixing_torch_npu_and_cann_versions_says_so(tmp_path: Path) -> None:
    dirs = gen.generate_cluster(tmp_path / "prof", world_size=4, capture_id="cap-m")
    for d in dirs[2:]:
        (info,) = d.glob("profiler_info_*.json")
        data = json.loads(info.read_text())
        data["torch_npu_version"], data["cann_version"] = "2.1.0.post17", "8.0.RC3"
        info.write_text(json.dumps(data))
    b = _one(tmp_path / "prof")
    assert b.status == "complete"  # a remark, not a refusal: the recipes may still read both
    torch_note = next(n for n in b.notes if n.startswith("mixed torch_npu versions"))
    assert "2.1.0.post17 on ranks 2-3" in torch_note and f"{gen.TORCH_NPU_VERSION} on ranks 0-1" in torch_note
    assert any(n.startswith("mixed CANN versions") and "8.0.RC3 on ranks 2-3" in n for n in b.notes)
    same = gen.generate_cluster(tmp_path / "one", world_size=2, capture_id="cap-o")
    assert not [n for n in _one(same[0].parent).notes if n.startswith("mixed")]


def test_rank_dirs_read_by_several_threads_give_the_batches_of_one(tmp_path: Path) -> None:
    """Issue 34: scan_tree reads rank dirs by ``SCAN_READ_WORKERS`` threads (a cold page cache's waits overlap);
    the batches, every rank's state and every problem are those of one thread reading them in turn."""
    dirs = gen.generate_cluster(tmp_path / "prof", world_size=12, capture_id="cap-t", minimal=True)
    gen.remove_marker(dirs[3])
    gen.add_prof_leftovers(dirs[3])
    shutil.rmtree(dirs[5])
    db = next((dirs[7] / "ASCEND_PROFILER_OUTPUT").glob("ascend_pytorch_profiler_*.db"))
    db.write_bytes(db.read_bytes()[:200])  # an interrupted copy: the header says more pages
    assert rank_dir_fs.SCAN_READ_WORKERS > 1
    many = [b.to_json() for b in scan_tree(tmp_path / "prof", now=LATE)]
    one = [b.to_json() for b in scan_tree(tmp_path / "prof", now=LATE, workers=1)]
    assert many == one
    (b,) = many
    assert b["missing_ranks"] == [5] and b["status"] == "incomplete"
    states = b["rank_states"]
    assert "truncated" in json.dumps(b["problems"]) and states["3"] != "parsed", b
    assert {int(r) for r, v in states.items() if v == "parsed"} >= set(range(12)) - {3, 5, 7}
