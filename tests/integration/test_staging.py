"""stage_batch and retention on generated trees; msprof-analyze must discover every staged rank as DB input."""

from __future__ import annotations

import os
import re
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from profwatch.adapters.fs.rank_dir_fs import scan_tree
from profwatch.adapters.fs.retention import RetentionEntry, enforce_retention, plan_retention
from profwatch.adapters.fs.staging import (
    StagingError,
    fresh_staging_root,
    release_staging,
    stage_batch,
    staged_name,
    tool_safe,
)
from profwatch.core.batches.prof_layout import OUTPUT_MARKER
from profwatch.simulate import ascend_tree as gen

EARLY = gen.DEFAULT_TS_BASE_NS / 1e9 + 30


def _tree_state(root: Path) -> dict[str, tuple[int, int, int]]:
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for n in dirs + files:
            st = os.lstat(os.path.join(dirpath, n))
            out[os.path.join(dirpath, n)] = (st.st_size, st.st_mtime_ns, st.st_mode)
    return out


@pytest.fixture
def batch_and_dirs(tmp_path: Path):  # type: ignore[no-untyped-def]
    dirs = gen.generate_cluster(tmp_path / "prof", world_size=4, capture_id="cap/1", slow_ranks={2: 1.5})
    gen.add_prof_leftovers(dirs[0])  # raw PROF_* data must not be staged
    (batch,) = scan_tree(tmp_path / "prof", now=EARLY)
    return batch, dirs


def test_stage_layout_and_idempotence(tmp_path: Path, batch_and_dirs) -> None:  # type: ignore[no-untyped-def]
    batch, dirs = batch_and_dirs
    before = _tree_state(tmp_path / "prof")
    stage = stage_batch(batch, tmp_path / "staging")
    assert stage.parent == tmp_path / "staging" and "/" not in stage.name
    staged = sorted(p.name for p in stage.iterdir())
    assert staged == sorted(d.name for d in dirs)
    for d in dirs:
        s = stage / d.name
        assert s.is_dir() and not s.is_symlink()  # real rank dirs: DB discovery skips symlinked ones (docs/msprof-analyze.md#discovery)
        out = s / "ASCEND_PROFILER_OUTPUT"
        assert out.is_symlink() and os.readlink(out) == str(d / "ASCEND_PROFILER_OUTPUT")
        assert all(p.is_symlink() for p in s.iterdir())
        assert not any(p.name.startswith("PROF_") for p in s.iterdir())
    assert stage_batch(batch, tmp_path / "staging") == stage
    assert sorted(p.name for p in stage.iterdir()) == staged
    (stage / "stray_link").symlink_to(dirs[0])
    stage_batch(batch, tmp_path / "staging")
    assert not (stage / "stray_link").exists()
    assert _tree_state(tmp_path / "prof") == before  # originals untouched


ODD = "ранг_é_\udcff"  # Cyrillic, Latin-1 range, and the byte 0xFF (not UTF-8): msprof-analyze takes none


def _odd(path: Path, name: str) -> Path:
    return Path(os.fsdecode(os.fsencode(str(path)) + b"/" + os.fsencode(name)))


def test_odd_work_dir_and_rank_names_are_staged_on_a_tool_safe_root(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """``analyze --out`` under a name msprof-analyze cannot take, and rank dirs named so too: the batch is staged
    under a fresh folder of the system's temporary folder, each rank dir under a tool-safe name; releasing it
    removes our links and folders only, and the user's tree is as it was."""
    dirs = gen.generate_cluster(tmp_path / "prof", world_size=2, capture_id="cap1")
    odd_dirs = []
    for d in dirs:
        odd_dirs.append(_odd(d.parent, f"{ODD}_{d.name}"))
        d.rename(odd_dirs[-1])
    (batch,) = scan_tree(tmp_path / "prof", now=EARLY)
    assert sorted(batch.rank_dirs.values()) == sorted(map(str, odd_dirs))
    system_tmp = tmp_path / "system-tmp"
    system_tmp.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(system_tmp))
    before = _tree_state(tmp_path / "prof")
    assert fresh_staging_root(tmp_path / "ascii-out" / "staging") == (tmp_path / "ascii-out" / "staging", False)
    root, temporary = fresh_staging_root(_odd(tmp_path, ODD) / "staging")
    assert temporary and root.parent == system_tmp and tool_safe(root)
    stage = stage_batch(batch, root)
    for d in odd_dirs:
        name = staged_name(d)
        plain = d.name.split("\udcff_", 1)[1]  # the odd characters made "_", then stripped at the ends
        assert name.endswith("_ascend_pt") and re.fullmatch(plain.removesuffix("_ascend_pt") + r"_h[0-9a-f]{8}",
                                                            name.removesuffix("_ascend_pt"))
        s = stage / name
        assert tool_safe(s) and s.is_dir() and not s.is_symlink()
        assert os.readlink(s / "ASCEND_PROFILER_OUTPUT") == str(d / "ASCEND_PROFILER_OUTPUT")
    assert staged_name(dirs[0]) == dirs[0].name  # a name the tool takes is kept as it is
    release_staging(root)
    assert list(system_tmp.iterdir()) == []
    assert _tree_state(tmp_path / "prof") == before
    assert not _odd(tmp_path, ODD).exists()  # nothing made under the odd folder


def test_odd_rank_names_that_sanitise_alike_stage_apart(tmp_path: Path) -> None:
    """Two rank dirs whose names differ only in characters the tool does not take (``nodé_..``, ``nodè_..``)
    sanitise alike; each gets its own staged dir (a hash of the original name), keeping the ``_ascend_pt``
    suffix msprof-analyze looks for, and the batch stages."""
    dirs = gen.generate_cluster(tmp_path / "prof", world_size=2, capture_id="cap1")
    renamed = []
    for d, accent in zip(dirs, ("é", "è"), strict=True):
        renamed.append(d.parent / f"nod{accent}_4000_20260101120000000_ascend_pt")  # two hosts, one pid and time
        d.rename(renamed[-1])
    names = [staged_name(d) for d in renamed]
    assert names[0] != names[1] and all(n.endswith("_ascend_pt") and tool_safe(n) for n in names)
    assert staged_name(renamed[0]) == names[0]  # stable: the same rank dir always stages under one name
    (batch,) = scan_tree(tmp_path / "prof", now=EARLY)
    stage = stage_batch(batch, tmp_path / "staging")
    assert sorted(p.name for p in stage.iterdir()) == sorted(names)
    for d, n in zip(renamed, names, strict=True):
        assert os.readlink(stage / n / "ASCEND_PROFILER_OUTPUT") == str(d / "ASCEND_PROFILER_OUTPUT")


def test_stage_refuses_invalid_batch(tmp_path: Path) -> None:
    tls = gen.build_timelines(world_size=4)
    for tl in tls:
        gen.write_rank_dir(tmp_path / "p", tl)
    from dataclasses import replace

    gen.write_rank_dir(tmp_path / "p", replace(tls[0], pid=1, start_ns=tls[0].start_ns + 200_000_000))
    (batch,) = scan_tree(tmp_path / "p", now=EARLY)
    assert batch.status == "invalid"
    with pytest.raises(StagingError):
        stage_batch(batch, tmp_path / "staging")


def test_msprof_analyze_discovers_all_staged_ranks(tmp_path: Path, batch_and_dirs) -> None:  # type: ignore[no-untyped-def]
    exe = shutil.which("msprof-analyze", path=os.path.dirname(sys.executable))
    if exe is None:
        pytest.skip("msprof-analyze not installed")
    batch, dirs = batch_and_dirs
    # a stray newer copy of rank 1 beside the originals would win in msprof-analyze (newest ts, docs/msprof-analyze.md#discovery);
    # the staged folder shows it only the batch
    stray = dirs[1].with_name(dirs[1].name.replace("_4001_2026", "_9001_2027"))
    shutil.copytree(dirs[1], stray)
    stage = stage_batch(batch, tmp_path / "staging")
    out = tmp_path / "out"
    proc = subprocess.run([exe, "-m", "slow_rank", "-d", str(stage), "-o", str(out), "--force"],
                          check=False, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Multiple profiling paths" not in proc.stderr  # the stray copy never reached the tool
    con = sqlite3.connect(out / "cluster_analysis_output" / "cluster_analysis.db")
    try:
        rows = con.execute("SELECT rankId, slowAffectCount FROM SlowRank").fetchall()
    finally:
        con.close()
    assert rows and rows[0][0] == 2, (rows, proc.stderr[-2000:])


def test_retention_only_removes_analysed(tmp_path: Path) -> None:
    gen.generate_cluster(tmp_path / "p", world_size=2, capture_id="old")
    gen.generate_cluster(tmp_path / "p", world_size=2, capture_id="new", ts_base=gen.DEFAULT_TS_BASE_NS + 10**12)
    batches = scan_tree(tmp_path / "p", now=EARLY)
    by_id = {b.batch_id: b for b in batches}
    stage_batch(by_id["old"], tmp_path / "staging")
    assert enforce_retention(batches, analysed=set(), max_bytes=0, max_age_s=0, now_unix_s=1e12) == []
    removed = enforce_retention(batches, analysed={"old"}, max_bytes=0, max_age_s=None, now_unix_s=1e12,
                                staging_root=tmp_path / "staging")
    assert [(r.batch_id, r.reason) for r in removed] == [("old", "bytes")] and removed[0].size_bytes > 0
    assert not any(Path(p).exists() for p in by_id["old"].rank_dirs.values())
    assert all(Path(p).exists() for p in by_id["new"].rank_dirs.values())
    # only profwatch's output marker is left (scans skip the staging root by it)
    assert [p.name for p in (tmp_path / "staging").iterdir()] == [OUTPUT_MARKER]


def test_plan_retention_age_and_bytes() -> None:
    e = [RetentionEntry("a", (), 100, 10.0), RetentionEntry("b", (), 100, 20.0), RetentionEntry("c", (), 100, 30.0)]
    assert plan_retention(e, analysed={"a", "b"}, max_bytes=None, max_age_s=15, now_unix_s=30) == [(e[0], "age")]
    assert plan_retention(e, analysed={"a", "b", "c"}, max_bytes=150, max_age_s=None, now_unix_s=30) == [
        (e[0], "bytes"), (e[1], "bytes")]
    assert plan_retention(e, analysed=set(), max_bytes=0, max_age_s=0, now_unix_s=1e9) == []
