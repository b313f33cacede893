"""A path swapped for a symlink after the check (issue 12, "faults that lose data"): every mkdir, scan, write and
delete re-checks the path and never follows a link below its allowed root. Real file systems, real symlinks."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import profwatch.adapters.fs.config_writer as cw
from profwatch.adapters.fs.config_writer import ConfigPathSymlink, ConfigWriter
from profwatch.adapters.fs.paths import PathRefused, check_inside, make_dirs, open_dir, remove_tree
from profwatch.adapters.fs.rank_dir_fs import scan_tree
from profwatch.adapters.fs.retention import enforce_retention
from profwatch.captures.ports import RankDirScanner
from profwatch.core.batches.completeness import CaptureHint
from profwatch.core.batches.settings import WatchSettings
from profwatch.simulate import ascend_tree as gen

EARLY = gen.DEFAULT_TS_BASE_NS / 1e9 + 30


def _listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def _swap(path: Path, target: Path) -> None:
    """Replace the folder ``path`` with a symlink to ``target`` (what an attacker with write access does)."""
    os.rename(path, path.with_name(path.name + ".moved"))
    path.symlink_to(target)


@pytest.fixture
def roots(tmp_path: Path) -> tuple[Path, Path]:
    root, outside = tmp_path / "prof", tmp_path / "outside"
    (root / "jobA").mkdir(parents=True)
    outside.mkdir()
    (outside / "keep.txt").write_text("not yours")
    return root, outside


def test_check_inside_refuses_a_link_below_the_root_and_accepts_a_linked_root(tmp_path: Path, roots) -> None:
    root, outside = roots
    assert check_inside(root / "jobA" / "not" / "yet", [root]) == root / "jobA" / "not" / "yet"
    (root / "link").symlink_to(outside)
    with pytest.raises(PathRefused, match="symlink below the allowed root"):
        check_inside(root / "link" / "x", [root])
    (root / "inner").symlink_to(root / "jobA")  # a link that stays inside is refused too: it could be re-pointed
    with pytest.raises(PathRefused):
        check_inside(root / "inner", [root])
    with pytest.raises(PathRefused, match="outside the allowed roots"):
        check_inside(outside, [root])
    with pytest.raises(PathRefused, match="relative"):
        check_inside("prof/jobA", [root])
    (tmp_path / "alias").symlink_to(root)  # the operator's root may itself be a link
    assert check_inside(tmp_path / "alias" / "jobA", [tmp_path / "alias"]) == tmp_path / "alias" / "jobA"
    assert check_inside(root / "jobA", [tmp_path / "alias"]) == root / "jobA"  # announced as the real path


def test_mkdir_after_a_swap_is_refused_and_creates_nothing_outside(roots) -> None:
    root, outside = roots
    checked = check_inside(root / "jobA" / "cap1", [root])
    make_dirs(checked, [root])
    assert (root / "jobA" / "cap1").is_dir()
    _swap(root / "jobA", outside)
    with pytest.raises(PathRefused, match="symlink"):
        make_dirs(root / "jobA" / "cap2" / "deep", [root])
    assert _listing(outside) == ["keep.txt"]
    with pytest.raises(PathRefused):
        os.close(open_dir(root / "jobA", [root]))


def test_mkdir_makes_a_missing_allowed_root_as_configured_but_only_a_root(tmp_path: Path) -> None:
    """The allowed root is the operator's path: made when missing (as ``mkdir -p`` did), links above it allowed;
    without ``create`` a missing root is an error, not a refusal."""
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "linked").symlink_to(real)
    root = tmp_path / "linked" / "prof"
    with pytest.raises(FileNotFoundError):
        os.close(open_dir(root / "jobA", [root]))
    make_dirs(root / "jobA" / "cap1", [root])
    assert (real / "prof" / "jobA" / "cap1").is_dir()


def test_scan_after_a_swap_is_refused(roots) -> None:
    root, outside = roots
    gen.generate_cluster(root / "jobA" / "cap1", world_size=2, capture_id="cap1")
    scanner = RankDirScanner(WatchSettings(), allowed_roots=[root])
    hint = CaptureHint(world_size=2)
    assert len(scanner.scan(str(root / "jobA" / "cap1"), world_size=2, capture_id="cap1", hint=hint)) == 1
    gen.generate_cluster(outside / "cap1", world_size=2, capture_id="cap1")  # what the link would show
    _swap(root / "jobA", outside)
    with pytest.raises(PathRefused):
        scanner.scan(str(root / "jobA" / "cap1"), world_size=2, capture_id="cap1", hint=hint)
    unchecked = RankDirScanner(WatchSettings())  # without roots (profwatch scan) it reads what is there
    assert len(unchecked.scan(str(root / "jobA" / "cap1"), world_size=2, capture_id="cap1", hint=hint)) == 1


def test_config_write_refuses_a_component_swapped_between_the_check_and_the_open(tmp_path: Path, monkeypatch) -> None:
    root, outside = tmp_path / "cfg", tmp_path / "outside"
    (root / "jobA" / "c").mkdir(parents=True)
    (outside / "c").mkdir(parents=True)
    real_check = cw.check_config_dir

    def check_then_swap(config_dir: str, allowed_roots):  # type: ignore[no-untyped-def]
        d = real_check(config_dir, allowed_roots)
        _swap(root / "jobA", outside)  # the race the check alone cannot see
        return d

    monkeypatch.setattr(cw, "check_config_dir", check_then_swap)
    cfg = {"start_step": 5, "warmup": 1, "active": 2}
    with pytest.raises(ConfigPathSymlink):
        ConfigWriter(max_wait_s=1.0).write(str(root / "jobA" / "c"), cfg, not_before_unix_s=0,
                                           allowed_roots=[str(root)])
    assert _listing(outside) == ["c"]  # no profiler_config.json written through the link


def test_config_write_works_through_the_descriptor_path(tmp_path: Path) -> None:
    d = tmp_path / "cfg" / "jobA"
    d.mkdir(parents=True)
    res = ConfigWriter(max_wait_s=3.0).write(str(d), {"start_step": 5, "warmup": 1, "active": 2},
                                             not_before_unix_s=0, allowed_roots=[str(tmp_path / "cfg")])
    assert json.loads((d / "profiler_config.json").read_text())["start_step"] == 5
    assert int((d / "profiler_config.json").stat().st_mtime) == res.mtime_s


def test_delete_after_a_swap_is_refused_and_leaves_the_target_alone(roots) -> None:
    root, outside = roots
    dirs = gen.generate_cluster(root / "jobA" / "cap1", world_size=2, capture_id="cap1")
    (batch,) = scan_tree(root / "jobA" / "cap1", now=EARLY)
    victim = outside / "cap1"
    gen.generate_cluster(victim, world_size=2, capture_id="cap1")
    before = _listing(outside)
    _swap(root / "jobA", outside)  # the batch's rank dirs now resolve into the victim's folder
    removed = enforce_retention([batch], analysed={batch.batch_id}, max_bytes=0, max_age_s=None, now_unix_s=1e12,
                                allowed_roots=[root])
    assert len(removed) == 1 and len(removed[0].errors) == 2 and all("symlink" in e for e in removed[0].errors)
    assert _listing(outside) == before
    os.unlink(root / "jobA")
    os.rename(root / "jobA.moved", root / "jobA")
    removed = enforce_retention([batch], analysed={batch.batch_id}, max_bytes=0, max_age_s=None, now_unix_s=1e12,
                                allowed_roots=[root])
    assert removed[0].errors == () and not any(d.exists() for d in dirs)


def test_delete_refuses_a_symlinked_rank_dir_and_removes_links_inside_without_following(roots) -> None:
    root, outside = roots
    (root / "jobA" / "rd").mkdir()
    (root / "jobA" / "rd" / "to_outside").symlink_to(outside)
    (root / "jobA" / "rd" / "sub").mkdir()
    (root / "jobA" / "rd" / "sub" / "f").write_text("x")
    (root / "jobA" / "linked_rd").symlink_to(outside)
    with pytest.raises(PathRefused, match="symlink"):
        remove_tree(root / "jobA" / "linked_rd", [root])
    remove_tree(root / "jobA" / "rd", [root])
    assert not (root / "jobA" / "rd").exists() and _listing(outside) == ["keep.txt"]
    with pytest.raises(PathRefused, match="allowed root itself"):
        remove_tree(root, [root])
    remove_tree(root / "jobA" / "gone", [root])  # nothing there: nothing to do
    assert (outside / "keep.txt").read_text() == "not yours"


def test_retention_without_roots_still_never_follows_a_swapped_rank_dir(roots) -> None:
    root, outside = roots
    gen.generate_cluster(root / "jobA" / "cap1", world_size=2, capture_id="cap1")
    (batch,) = scan_tree(root / "jobA" / "cap1", now=EARLY)
    rd = Path(batch.ranks[0].path)
    os.rename(rd, rd.with_name("moved"))
    rd.symlink_to(outside)
    removed = enforce_retention([batch], analysed={batch.batch_id}, max_bytes=0, max_age_s=None, now_unix_s=1e12)
    assert any("symlink" in e for e in removed[0].errors) and _listing(outside) == ["keep.txt"]
