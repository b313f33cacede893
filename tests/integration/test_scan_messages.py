"""What ``profwatch scan`` / ``analyze`` say about folders that are not a complete PyTorch batch (issue 14 items 2
and 13): never ``rank ?``, ``rank None`` or ``missing ranks []``; a single rank dir gets "pass its parent" from
both; MindSpore rank dirs and other outputs profwatch does not analyse are named as found and not supported."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from profwatch.adapters.fs.rank_dir_fs import find_unsupported, scan_tree
from profwatch.commands.analyze import analyze
from profwatch.commands.scan import scan
from profwatch.simulate.ascend_tree import generate_cluster
from profwatch.simulate.msmonitor_db import generate_msmonitor_batch

BAD = ("rank ?", "rank None", "missing ranks []")


def _no_bad_words(text: str) -> None:
    for bad in BAD:
        assert bad not in text, f"{bad!r} in {text!r}"


@pytest.fixture
def unknown_world(tmp_path: Path) -> Path:
    """A 2-rank batch whose metadata carries no world size (as torch_npu writes it without HCCL, e.g. gloo)."""
    dirs = generate_cluster(tmp_path / "prof", world_size=2, capture_id="cap-w")
    for d in dirs:
        meta = json.loads((d / "profiler_metadata.json").read_text())
        meta.pop("parallel_group_info"), meta.pop("distributed_args")
        (d / "profiler_metadata.json").write_text(json.dumps(meta))
    return tmp_path / "prof"


def test_unknown_world_size_messages_name_no_fake_rank(unknown_world: Path) -> None:
    res = CliRunner().invoke(scan, [str(unknown_world)])
    assert res.exit_code == 1
    assert "world size unknown" in res.output and "--world-size" in res.output
    _no_bad_words(res.output)
    (batch,) = scan_tree(unknown_world)
    _no_bad_words(batch.describe())
    assert CliRunner().invoke(scan, [str(unknown_world), "--world-size", "2"]).exit_code == 0


def test_analyze_detail_of_an_incomplete_batch(unknown_world: Path, tmp_path: Path) -> None:
    res = CliRunner().invoke(analyze, [str(unknown_world), "--json", "--no-advisor", "--no-html", "--out",
                                       str(tmp_path / "work")])
    assert res.exit_code == 1, res.output
    out = json.loads(res.output.strip().splitlines()[-1])
    assert out["status"] == "incomplete" and "world size unknown" in out["detail"]
    _no_bad_words(out["detail"])


def test_scan_of_one_rank_dir_says_to_pass_its_parent(tmp_path: Path) -> None:
    dirs = generate_cluster(tmp_path / "prof", world_size=4, capture_id="cap-1")
    res = CliRunner().invoke(scan, [str(dirs[2])])
    assert f"pass its parent ({dirs[2].parent})" in res.output
    assert res.exit_code == 1  # one rank of four: not complete
    _no_bad_words(res.output)
    assert "pass its parent" not in CliRunner().invoke(scan, [str(dirs[2].parent)]).output


def test_scan_of_one_rank_dir_shows_that_rank_not_its_peers_as_missing(tmp_path: Path) -> None:
    """Tried by a new user: ``scan <one rank's *_ascend_pt dir>`` led with "rank dir missing after deadline" for
    each peer (offline, no deadline meant anything). Now it shows that rank's own state and where to point."""
    dirs = generate_cluster(tmp_path / "prof", world_size=4, capture_id="cap-1")
    res = CliRunner().invoke(scan, [str(dirs[2])])
    first = res.output.splitlines()[0]
    assert first.startswith(f"{dirs[2]}: one rank dir: rank 2 of batch cap-1 (4 ranks expected)"), res.output
    assert "PARSED" in first and "steps=[1, 2, 3]" in first
    assert "missing" not in res.output and "only that rank was checked" in res.output
    assert res.exit_code == 1  # the batch is not shown complete
    assert "missing" in CliRunner().invoke(scan, [str(dirs[2]), "--json"]).output  # the JSON stays the batch's


def test_analyze_of_one_rank_dir_says_to_pass_its_parent(tmp_path: Path) -> None:
    """`profwatch demo` prints one rank dir to drill into; `analyze` on it must not leave the user believing the
    batch is missing ranks."""
    dirs = generate_cluster(tmp_path / "prof", world_size=4, capture_id="cap-1")
    args = ["--no-advisor", "--no-html", "--out", str(tmp_path / "work")]
    res = CliRunner().invoke(analyze, [str(dirs[2]), *args])
    assert res.exit_code == 1, res.output  # one rank of four: incomplete
    # a new user's trial: it printed "incomplete - batch is parsing: missing ranks [1, 2, 3]; rank 1: rank dir
    # missing (not seen yet)"; now it says first what to pass, then that rank's own state as scan shows it
    lines = res.output.splitlines()
    assert lines[0].endswith(f"pass its parent ({dirs[2].parent}) to check the whole batch"), res.output
    assert lines[1].startswith(f"{dirs[2]}: one rank dir: rank 2 of batch cap-1 (4 ranks expected)"), res.output
    assert "missing" not in res.output and "not analysed" in res.output
    whole = CliRunner().invoke(analyze, [str(dirs[2].parent), *args])
    assert whole.exit_code == 0, whole.output
    assert "pass its parent" not in whole.output


@pytest.mark.parametrize(
    ("names", "what"),
    [
        ([f"node0_{4000 + r}_2026010112000000{r}_ascend_ms" for r in range(4)], "MindSpore profiler rank dirs"),
        (["PROF_000001_20260101120000000_ABCDEFGH"], "msprof command-line captures (PROF_*)"),
    ],
)
def test_outputs_profwatch_does_not_analyse_are_named(tmp_path: Path, names: list[str], what: str) -> None:
    root = tmp_path / "run"
    for n in names:
        (root / "sub" / n / "ASCEND_PROFILER_OUTPUT").mkdir(parents=True)
        (root / "sub" / n / "ASCEND_PROFILER_OUTPUT" / "ascend_mindspore_profiler_0.db").write_bytes(b"")
    res = CliRunner().invoke(scan, [str(root)])
    assert res.exit_code == 2  # no batch profwatch analyses: the same input error as analyze
    assert f"found {len(names)} {what}" in res.output and "not supported" in res.output, res.output
    res = CliRunner().invoke(analyze, [str(root), "--json"])
    assert res.exit_code == 2
    detail = json.loads(res.output.strip().splitlines()[-1])["detail"]
    assert what in detail and "not supported" in detail
    found = find_unsupported(root)
    assert [len(v) for v in found.values()] == [len(names)]


def test_loose_traces_next_to_a_batch_get_a_note(tmp_path: Path) -> None:
    dirs = generate_cluster(tmp_path / "prof", world_size=2, capture_id="cap-2")
    shutil.copy(Path(__file__), tmp_path / "prof" / "host_1.1767268800000.pt.trace.json")
    res = CliRunner().invoke(scan, [str(tmp_path / "prof")])
    assert res.exit_code == 0, res.output  # the batch itself is complete
    assert "found 1 torch.profiler traces outside a profwatch *_torch_pt rank dir" in res.output
    assert str(dirs[0].parent) in res.output


@pytest.mark.slow
def test_msmonitor_lightweight_dbs_are_named_with_what_to_do_and_that_works(tmp_path: Path) -> None:
    """msMonitor's flat ``msmonitor_{pid}_{ts}_{rank}.db`` files (generated from what msprof-analyze's reader
    expects: ``profwatch.simulate.msmonitor_db``): ``scan`` and ``analyze`` name them and say what to run, and what
    they say to run (the real msprof-analyze slow_rank on the same files) names the slow rank."""
    import shutil
    import subprocess

    root = tmp_path / "run"
    files = generate_msmonitor_batch(root / "monitor", world_size=4, slow_ranks={2: 1.6})
    assert [f.name.split("_")[-1] for f in files] == ["0.db", "1.db", "2.db", "3.db"]
    res = CliRunner().invoke(scan, [str(root)])
    assert res.exit_code == 2, res.output
    assert "found 4 msMonitor lightweight DBs" in res.output and "msprof-analyze -m slow_rank -d" in res.output
    res = CliRunner().invoke(analyze, [str(root), "--json"])
    assert res.exit_code == 2 and "msMonitor lightweight DBs" in json.loads(res.output.strip().splitlines()[-1])["detail"]
    tool = shutil.which("msprof-analyze")
    if tool is None:
        pytest.skip("msprof-analyze is not installed")
    out = tmp_path / "out"
    run = subprocess.run([tool, "-m", "slow_rank", "-d", str(root / "monitor"), "-o", str(out), "--force"],
                         capture_output=True, text=True, timeout=300)
    said = run.stdout + run.stderr
    assert run.returncode == 0 and "profiling type: msmonitor" in said, said[-2000:]  # read as msMonitor data
    import sqlite3

    db = out / "cluster_analysis_output" / "cluster_analysis.db"
    with sqlite3.connect(db) as con:
        votes = dict(con.execute("SELECT rankId, slowAffectCount FROM SlowRank").fetchall())
    assert max(votes, key=votes.__getitem__) == 2, votes


def test_a_missing_folder_is_said_once_without_the_errno_prefix(tmp_path: Path) -> None:
    """``scan`` of a folder that does not exist said ``error: [Errno 2] cannot list scan root ...: ENOENT: No such
    file or directory`` (the errno twice); now the message alone, exit 2."""
    gone = tmp_path / "no-such-prof"
    res = CliRunner().invoke(scan, [str(gone)])
    assert res.exit_code == 2, res.output
    assert f"cannot list scan root {gone}: ENOENT: No such file or directory" in res.output, res.output
    assert "[Errno" not in res.output


def test_a_trace_inside_the_torch_rank_dir_scanned_is_not_called_outside_one(tmp_path: Path) -> None:
    """`scan` of one *_torch_pt rank dir (as a user drilling into the demo's capture does) said its own trace was
    "outside a profwatch *_torch_pt rank dir": the walk starts inside the rank dir it never descends into."""
    rank_dir = tmp_path / "prof" / "vm_26057_20261207053420155_torch_pt"
    rank_dir.mkdir(parents=True)
    (rank_dir / "vm_26057.1796621660164.pt.trace.json").write_text("{}")
    assert find_unsupported(rank_dir) == {}
    res = CliRunner().invoke(scan, [str(rank_dir)])
    assert "outside a profwatch" not in res.output, res.output
    loose = tmp_path / "prof" / "vm_1.1796621660164.pt.trace.json"
    loose.write_text("{}")
    assert list(find_unsupported(tmp_path / "prof")) == [
        "torch.profiler traces outside a profwatch *_torch_pt rank dir (*.pt.trace.json)"]
