"""``scan`` and ``analyze`` on file names that are not ASCII or not even valid UTF-8, under a C locale without UTF-8
mode and under a UTF-8 locale, with ``--out`` relative to the working directory (issue 10 faults: a
UnicodeEncodeError traceback; every msprof-analyze recipe ``tool_error`` because the tool runs elsewhere).
Real msprof-analyze on a generated tree; the CLI runs as a subprocess with the locale under test."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from profwatch.adapters.tools.msprof_runner import resolve_command
from profwatch.simulate import ascend_tree as at
from tests.conftest import PYTHON, python_env

NAME = "данные_é_\udcff"  # Cyrillic, Latin-1 range, and the byte 0xFF, which is not UTF-8
SHOWN = "данные_é_\\xff"  # how profwatch prints it under any locale
LOCALES = {
    # PEP 538 coercion and PEP 540 UTF-8 mode off: the file system encoding is ASCII; every non-ASCII byte of a
    # name arrives as a surrogate escape, and stdout is ASCII
    "c_locale": {"LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"},
    "utf8_locale": {"LC_ALL": "C.UTF-8", "LANG": "C.UTF-8", "PYTHONUTF8": "0"},
}


def _env(locale: str) -> dict[str, str]:
    env = python_env(LOCALES[locale])
    env.pop("PYTHONIOENCODING", None)
    return env


def _profwatch(args: list[str], locale: str, cwd: Path, timeout_s: float = 600,
               extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([PYTHON, "-m", "profwatch.cli", *args], env={**_env(locale), **(extra_env or {})}, cwd=cwd,
                          capture_output=True, timeout=timeout_s)


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("names")
    top = Path(os.fsdecode(os.fsencode(str(root)) + b"/" + os.fsencode(NAME)))
    at.generate_cluster(top / "prof", world_size=4, capture_id="cap1", slow_ranks={2: 1.5})
    assert os.fsencode(NAME) in os.listdir(os.fsencode(str(root)))
    return root


@pytest.mark.parametrize("locale", sorted(LOCALES))
def test_fs_encoding_under_test(locale: str) -> None:
    out = subprocess.run([PYTHON, "-c", "import sys; print(sys.getfilesystemencoding(), sys.stdout.encoding)"],
                         env=_env(locale), capture_output=True, text=True, check=True)
    assert out.stdout.split() == (["ascii", "ascii"] if locale == "c_locale" else ["utf-8", "utf-8"])


@pytest.mark.parametrize("locale", sorted(LOCALES))
def test_scan_prints_names_with_escapes(tree: Path, locale: str) -> None:
    res = _profwatch(["scan", str(tree)], locale, tree)
    out, err = res.stdout.decode("utf-8"), res.stderr.decode("utf-8", "replace")
    assert res.returncode == 0 and "Traceback" not in err, err[-3000:]
    assert f"{SHOWN}/prof" in out and "cap1  COMPLETE" in out
    res = _profwatch(["scan", str(tree), "--json"], locale, tree)
    assert res.returncode == 0, res.stderr[-3000:]
    batches = json.loads(res.stdout)
    assert batches[0]["prof_dir"] == f"{tree}/{SHOWN}/prof" and batches[0]["status"] == "complete"


@pytest.mark.skipif(shutil.which(resolve_command("msprof-analyze")) is None,
                    reason="msprof-analyze is not installed (pip install -e '.[test]')")
def test_analyze_with_relative_out_under_c_locale(tree: Path) -> None:
    work = tree / "cwd"
    work.mkdir()
    res = _profwatch(["analyze", str(tree), "--no-advisor", "--json", "--out", "rel-out"], "c_locale", work)
    err = res.stderr.decode("utf-8", "replace")
    assert res.returncode == 0 and "Traceback" not in err, err[-3000:]
    result = json.loads(res.stdout.decode("utf-8").strip().splitlines()[-1])
    assert result["status"] == "ok", result
    # the first verdict, its confirmation and the drill-down: msprof-analyze compare wrote a workbook without
    # sheets on this tree's path (a byte that is not UTF-8); it now reads links under the ASCII work folder
    assert result["recipes"] == {"own_tables": "ok", "cluster_time_summary": "ok", "communication_matrix": "ok",
                                 "slow_rank": "ok", "advisor": "skipped", "suspect_compare": "ok"}
    assert result["suspects"][0]["rank"] == 2 and f"/{SHOWN}/prof/" in result["suspects"][0]["rank_dir"]
    drill = result["op_compare"][0]
    assert drill["rank"] == 2 and drill["source"] == "msprof-analyze compare" and drill["ops"], drill
    assert drill["ops"][0]["excess_us_per_step"] > 0
    report = work / "rel-out" / "results" / "cap1" / "report.html"
    assert Path(result["report"]) == report and SHOWN in report.read_text(encoding="utf-8")


def _snapshot(top: Path) -> list[tuple[bytes, int, float]]:
    """Every entry under ``top`` with its mode and mtime (not following links): what the compare must not change."""
    out = []
    for folder, dirs, files in os.walk(os.fsencode(str(top))):
        for n in [*dirs, *files]:
            st = os.lstat(os.path.join(folder, n))
            out.append((os.path.join(folder, n), st.st_mode, st.st_mtime))
    return sorted(out)


@pytest.mark.skipif(shutil.which(resolve_command("msprof-analyze")) is None,
                    reason="msprof-analyze is not installed (pip install -e '.[test]')")
@pytest.mark.parametrize("out_name", ["ascii-out", NAME])
def test_compare_reads_rank_dirs_on_any_path(tree: Path, tmp_path: Path, out_name: str,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """``msprof-analyze compare`` (drill-down and reference comparison) on rank dirs under a name that is not ASCII
    nor UTF-8: it wrote a workbook without sheets; now it reads links under our work folder (or, when that is not
    safe for it either, under the system's temporary folder), and the user's tree is left as it was."""
    from profwatch.adapters.tools.msprof_runner import MsprofRunner
    from profwatch.changes.msprof_compare import compare_rank
    from profwatch.core.changes.detail import entries_from_compare
    from profwatch.core.verdict.msprof_plan import MsprofSettings

    prof = tree / NAME / "prof"
    dirs = {int(p.name.split("_")[1]) - 4000: p for p in prof.iterdir()}
    system_tmp = tmp_path / "system-tmp"
    system_tmp.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(system_tmp))
    out_root = Path(os.fsdecode(os.fsencode(str(tmp_path)) + b"/" + os.fsencode(out_name)))
    before = _snapshot(tree / NAME)
    with MsprofRunner(MsprofSettings(timeout_s=300)) as runner:
        sheets, status = compare_rank(runner, dirs[2], dirs[0], out_root, name="odd_path_compare")
    assert status.status == "ok" and sheets is not None, (status.detail, status.log_tail)
    entries = {e.name: e for e in entries_from_compare(sheets, steps_baseline=1, steps_now=1)}
    # rank 2 is 1.5x slower in compute: its matmul takes about 1.5x the peer's
    assert 1.3 < entries["aten::matmul"].now_s_per_step / entries["aten::matmul"].baseline_s_per_step < 1.7
    assert _snapshot(tree / NAME) == before
    # our links are gone; only the tool's own output folder and logs remain
    assert not [p for p in (out_root.iterdir()) if p.name.startswith("tool-input-")]
    assert list(system_tmp.iterdir()) == []


@pytest.mark.skipif(shutil.which(resolve_command("msprof-analyze")) is None,
                    reason="msprof-analyze is not installed (pip install -e '.[test]')")
def test_analyze_with_odd_out_and_odd_rank_dir_names(tmp_path: Path) -> None:
    """``analyze --out`` a folder whose name is not ASCII nor UTF-8, on rank dirs named so too, under the C locale:
    cluster_time_summary, slow_rank and communication_matrix each failed with "exit code 1" (msprof-analyze
    printing its output path, which held the byte 0xFF, raised UnicodeEncodeError). Now the batch is staged and
    each run made under the system's temporary folder (TMPDIR here), the outputs moved into --out, the links
    removed after; the user's tree is left as it was."""
    prof = tmp_path / "prof"
    for d in at.generate_cluster(prof, world_size=4, capture_id="cap1", slow_ranks={2: 1.5}):
        d.rename(Path(os.fsdecode(os.fsencode(str(prof)) + b"/" + os.fsencode(f"{NAME}_{d.name}"))))
    system_tmp = tmp_path / "system-tmp"
    system_tmp.mkdir()
    out = Path(os.fsdecode(os.fsencode(str(tmp_path)) + b"/" + os.fsencode(NAME)))
    before = _snapshot(prof)
    res = _profwatch(["analyze", str(prof), "--no-advisor", "--json", "--out", str(out)], "c_locale", tmp_path,
                     extra_env={"TMPDIR": str(system_tmp)})
    err = res.stderr.decode("utf-8", "replace")
    assert res.returncode == 0 and "Traceback" not in err, err[-3000:]
    result = json.loads(res.stdout.decode("utf-8").strip().splitlines()[-1])
    assert result["recipes"] == {"own_tables": "ok", "cluster_time_summary": "ok", "communication_matrix": "ok",
                                 "slow_rank": "ok", "advisor": "skipped", "suspect_compare": "ok"}, err[-3000:]
    assert result["status"] == "ok" and result["suspects"][0]["rank"] == 2
    assert f"/{SHOWN}_node0_4002_" in result["suspects"][0]["rank_dir"]
    assert result["agreement"]["agree"] is True, result["agreement"]  # msprof-analyze confirmed the first verdict
    # the tool's outputs are where --out says, each run's result database and log; nothing left in TMPDIR
    runs = {p.name.split("-")[0]: p for p in (out / "results" / "cap1" / "msprof").iterdir() if p.name != "logs"}
    assert sorted(runs) == ["cluster_time_summary", "communication_matrix", "slow_rank"]
    assert all((p / "cluster_analysis_output" / "cluster_analysis.db").is_file() for p in runs.values())
    assert len(list((out / "results" / "cap1" / "msprof" / "logs").iterdir())) == 3
    assert "staging" not in result["paths"]  # the temporary staging is gone: not shown
    assert list(system_tmp.iterdir()) == []
    assert _snapshot(prof) == before
