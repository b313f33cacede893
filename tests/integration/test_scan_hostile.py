"""``profwatch scan`` / ``analyze`` on hostile or odd capture trees (adversarial review of the offline path): JSON
nested past the parser's depth, implausible world sizes, profwatch's own output folders inside the scanned tree,
an unwritable ``--out``, and the wording for unreadable / non-regular DBs and skipped rank dir links."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from profwatch.adapters.fs.rank_dir_fs import scan_tree
from profwatch.commands.analyze import analyze
from profwatch.commands.scan import scan
from profwatch.core.batches.completeness import rank_ranges
from profwatch.core.batches.prof_layout import OUTPUT_MARKER
from profwatch.core.messages import MAX_WORLD_SIZE
from profwatch.exitcodes import EXIT_NOT_OK, EXIT_OK, EXIT_USAGE
from profwatch.simulate.ascend_tree import generate_cluster, profiler_db_path

DEPTH = 100_000  # far past CPython's recursion limit (json's C scanner raises RecursionError)


def _clean_exit(res: Result, code: int) -> None:
    """Exited with ``code`` through SystemExit, never an uncaught exception (a traceback)."""
    assert res.exit_code == code, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    assert "Traceback" not in res.output


def _meta(d: Path) -> dict[str, object]:
    return dict(json.loads((d / "profiler_metadata.json").read_text()))


def _info(d: Path) -> Path:
    (info,) = d.glob("profiler_info*.json")
    return info


# --------------------------------------------------------------------------------------- 1. deeply nested JSON

DEEP = {
    "list": "[" * DEPTH + "]" * DEPTH,
    "object": '{"a":' * DEPTH + "1" + "}" * DEPTH,
    "inside an object": '{"config": ' + "[" * DEPTH + "]" * DEPTH + "}",
}


@pytest.mark.parametrize("which", ["profiler_info", "profiler_metadata"])
@pytest.mark.parametrize("shape", sorted(DEEP))
def test_deeply_nested_json_is_a_problem_not_a_crash(tmp_path: Path, which: str, shape: str) -> None:
    dirs = generate_cluster(tmp_path / "prof", world_size=2, capture_id="cap-deep")
    target = _info(dirs[1]) if which == "profiler_info" else dirs[1] / "profiler_metadata.json"
    target.write_text(DEEP[shape])
    res = CliRunner().invoke(scan, [str(tmp_path / "prof")])
    _clean_exit(res, EXIT_NOT_OK)
    assert f"{target.name}: not valid JSON (nested too deeply to decode)" in res.output
    res = CliRunner().invoke(analyze, [str(tmp_path / "prof"), "--json", "--no-advisor", "--no-html", "--quiet",
                                       "--out", str(tmp_path / "work")])
    _clean_exit(res, EXIT_NOT_OK)
    assert "nested too deeply" in json.loads(res.output.strip().splitlines()[-1])["detail"]


def test_deeply_nested_json_string_values_in_metadata(tmp_path: Path) -> None:
    """torch_npu stores distributed_args / parallel_group_info as JSON strings: a deep one is ignored, not fatal."""
    dirs = generate_cluster(tmp_path / "prof", world_size=2, capture_id="cap-deep")
    for d in dirs:
        meta = _meta(d)
        meta["parallel_group_info"] = "[" * DEPTH + "]" * DEPTH
        meta["distributed_args"] = json.dumps({"world_size": 2})
        (d / "profiler_metadata.json").write_text(json.dumps(meta))
    res = CliRunner().invoke(scan, [str(tmp_path / "prof")])
    _clean_exit(res, EXIT_OK)


# --------------------------------------------------------------------------------------- 2. world size bounds


def _claim_world(dirs: list[Path], world: int) -> None:
    for d in dirs:
        meta = _meta(d)
        meta.pop("parallel_group_info", None)  # its default_group length would win over distributed_args
        meta["distributed_args"] = json.dumps({"world_size": world})
        (d / "profiler_metadata.json").write_text(json.dumps(meta))


@pytest.mark.parametrize("world", [MAX_WORLD_SIZE + 1, 10_000_000, 10**18])
def test_implausible_world_size_from_metadata(tmp_path: Path, world: int) -> None:
    _claim_world(generate_cluster(tmp_path / "prof", world_size=4, capture_id="cap-big"), world)
    res = CliRunner().invoke(scan, [str(tmp_path / "prof")])
    _clean_exit(res, EXIT_NOT_OK)
    assert f"claimed world size {world} is implausible (more than {MAX_WORLD_SIZE} ranks)" in res.output
    assert "rank dir missing" not in res.output and len(res.output.splitlines()) < 20
    (batch,) = json.loads(CliRunner().invoke(scan, [str(tmp_path / "prof"), "--json"]).output)
    assert batch["status"] == "invalid" and batch["missing_ranks"] == [] and batch["ranks"] == [0, 1, 2, 3]


def test_implausible_rank_id_without_world_size(tmp_path: Path) -> None:
    """No world size recorded: it is assumed from the highest rank id, which a bogus profiler_info can inflate."""
    dirs = generate_cluster(tmp_path / "prof", world_size=2, capture_id="cap-rank")
    for d in dirs:
        meta = _meta(d)
        meta.pop("parallel_group_info"), meta.pop("distributed_args")
        (d / "profiler_metadata.json").write_text(json.dumps(meta))
    info = _info(dirs[1])
    data = json.loads(info.read_text())
    data["rank_id"] = 50_000_000
    info.unlink()
    (dirs[1] / "profiler_info_50000000.json").write_text(json.dumps(data))
    res = CliRunner().invoke(scan, [str(tmp_path / "prof")])
    _clean_exit(res, EXIT_NOT_OK)
    assert "world size 50000001 is implausible" in res.output and "rank dir missing" not in res.output


@pytest.mark.parametrize("command", [scan, analyze])
@pytest.mark.parametrize("world", [MAX_WORLD_SIZE + 1, 10_000_000])
def test_world_size_flag_is_bounded(tmp_path: Path, command: object, world: int) -> None:
    generate_cluster(tmp_path / "prof", world_size=2, capture_id="cap-flag")
    res = CliRunner().invoke(command, [str(tmp_path / "prof"), "--world-size", str(world)])  # type: ignore[arg-type]
    _clean_exit(res, EXIT_USAGE)
    assert "--world-size" in res.output and str(MAX_WORLD_SIZE) in res.output


def test_many_missing_ranks_are_summarised(tmp_path: Path) -> None:
    _claim_world(generate_cluster(tmp_path / "prof", world_size=4, capture_id="cap-many"), 5000)
    res = CliRunner().invoke(scan, [str(tmp_path / "prof")])
    _clean_exit(res, EXIT_NOT_OK)
    assert "missing ranks: 4-4999 (4996 ranks)" in res.output
    assert "problem: ranks 4-4999: rank dir missing after deadline (4996 ranks)" in res.output
    assert len(res.output.splitlines()) < 20
    (batch,) = scan_tree(tmp_path / "prof")
    assert len(batch.describe()) < 300
    (data,) = json.loads(CliRunner().invoke(scan, [str(tmp_path / "prof"), "--json"]).output)
    assert data["missing_ranks"] == list(range(4, 5000))  # the JSON stays complete (bounded by MAX_WORLD_SIZE)
    assert sum(p["reason"].startswith("rank dir missing") for p in data["problems"]) == 4996


def test_rank_ranges() -> None:
    assert rank_ranges([7, 0, 1, 2, 5, 8, 9]) == "0-2, 5, 7-9"
    assert rank_ranges(range(0, 100, 2), limit=3) == "0, 2, 4, ... and 47 more ranks"
    assert rank_ranges([]) == ""


# --------------------------------------------------------------------------------------- 3. own output folders


@pytest.mark.parametrize("layout", ["default", "inside", "capture_dir"])
def test_analysis_output_inside_the_tree_is_not_scanned(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        layout: str) -> None:
    cap = tmp_path / "cap"
    generate_cluster(cap, world_size=2, capture_id="cap-out", minimal=True)
    monkeypatch.chdir(cap)
    out = {"default": [], "inside": ["--out", "sub/work"], "capture_dir": ["--out", "."]}[layout]
    args = [".", "--no-advisor", "--no-html", "--quiet", "--json", *out]
    first = CliRunner().invoke(analyze, args)
    assert first.exception is None or isinstance(first.exception, SystemExit), repr(first.exception)
    work = {"default": cap / "profwatch-analysis", "inside": cap / "sub" / "work", "capture_dir": cap}[layout]
    staged = list((work / "staging").glob("*/*_ascend_pt"))
    assert len(staged) == 2, "the batch was staged inside the scanned tree"
    assert (work / "staging" / OUTPUT_MARKER).is_file()
    assert (work / OUTPUT_MARKER).is_file() == (layout != "capture_dir")  # never mark the capture data itself
    res = CliRunner().invoke(scan, ["."])
    _clean_exit(res, EXIT_OK)
    assert "claimed by two dirs" not in res.output
    again = CliRunner().invoke(analyze, args)
    assert again.exit_code == first.exit_code, again.output
    assert json.loads(again.output.strip().splitlines()[-1])["status"] == \
        json.loads(first.output.strip().splitlines()[-1])["status"]


def test_capture_dir_used_as_out_still_scans_from_its_parent(tmp_path: Path) -> None:
    cap = tmp_path / "jobs" / "cap"
    generate_cluster(cap, world_size=2, capture_id="cap-par", minimal=True)
    CliRunner().invoke(analyze, [str(cap), "--no-advisor", "--no-html", "--quiet", "--out", str(cap)])
    res = CliRunner().invoke(scan, [str(tmp_path / "jobs")])
    _clean_exit(res, EXIT_OK)
    assert "ranks 2/2" in res.output


# --------------------------------------------------------------------------------------- 4. unwritable --out


def test_out_under_a_regular_file_is_an_input_error(tmp_path: Path) -> None:
    generate_cluster(tmp_path / "prof", world_size=2, capture_id="cap-w")
    (tmp_path / "file").write_text("x")
    for as_json in ([], ["--json"]):
        res = CliRunner().invoke(analyze, [str(tmp_path / "prof"), "--no-advisor", "--no-html", *as_json,
                                           "--out", str(tmp_path / "file" / "out")])
        _clean_exit(res, EXIT_USAGE)
        assert "cannot write the output folder" in res.output and "verdict" not in res.output


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")
def test_out_without_write_permission_is_an_input_error(tmp_path: Path) -> None:
    generate_cluster(tmp_path / "prof", world_size=2, capture_id="cap-w")
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o500)
    try:
        for out in (ro, ro / "sub"):
            res = CliRunner().invoke(analyze, [str(tmp_path / "prof"), "--no-advisor", "--out", str(out)])
            _clean_exit(res, EXIT_USAGE)
            assert "cannot write the output folder" in res.output and "ermission denied" in res.output
    finally:
        ro.chmod(0o700)


# --------------------------------------------------------------------------------------- 5. wording


def test_fifo_in_place_of_a_db_is_not_a_regular_file(tmp_path: Path) -> None:
    dirs = generate_cluster(tmp_path / "prof", world_size=2, capture_id="cap-f", minimal=True)
    db = profiler_db_path(dirs[1])
    db.unlink()
    os.mkfifo(db)
    res = CliRunner().invoke(scan, [str(tmp_path / "prof")])
    _clean_exit(res, EXIT_NOT_OK)
    assert f"{db.name}: not a regular file" in res.output and "damaged" not in res.output


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_unreadable_db_says_permission_denied(tmp_path: Path) -> None:
    dirs = generate_cluster(tmp_path / "prof", world_size=2, capture_id="cap-p", minimal=True)
    db = profiler_db_path(dirs[1])
    db.chmod(0)
    try:
        res = CliRunner().invoke(scan, [str(tmp_path / "prof")])
        _clean_exit(res, EXIT_NOT_OK)
        assert f"{db.name}: unreadable (permission denied)" in res.output and "damaged" not in res.output
    finally:
        db.chmod(0o644)


def test_symlinked_rank_dir_is_named_when_skipped(tmp_path: Path) -> None:
    dirs = generate_cluster(tmp_path / "prof", world_size=2, capture_id="cap-l", minimal=True)
    elsewhere = tmp_path / "elsewhere" / dirs[1].name
    elsewhere.parent.mkdir()
    shutil.move(str(dirs[1]), elsewhere)
    dirs[1].symlink_to(elsewhere, target_is_directory=True)
    res = CliRunner().invoke(scan, [str(tmp_path / "prof")])
    _clean_exit(res, EXIT_NOT_OK)
    assert f"skipped {dirs[1]}: a symlink (-> {elsewhere})" in res.output
    assert "rank 1: rank dir missing" in res.output


def test_undecodable_rank_dir_name_is_scanned(tmp_path: Path) -> None:
    dirs = generate_cluster(tmp_path / "prof", world_size=2, capture_id="cap-u", minimal=True)
    name = os.fsencode(dirs[1].name)
    cut = name.index(b"_")
    os.rename(os.fsencode(dirs[1]), os.fsencode(dirs[1].parent) + b"/" + name[:cut] + b"\xff" + name[cut:])
    res = CliRunner().invoke(scan, [str(tmp_path / "prof")])
    _clean_exit(res, EXIT_OK)
    assert "ranks 2/2" in res.output
    (data,) = json.loads(CliRunner().invoke(scan, [str(tmp_path / "prof"), "--json"]).output)
    assert "\\xff" in data["rank_dirs"]["1"]
