"""daemon/profwatch/adapters/fs/config_writer.py on a real file system: in-place edits, no torn file, fresh mtimes, refusals."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from profwatch.adapters.fs.config_writer import (
    ConfigDirMissing,
    ConfigDirNotAllowed,
    ConfigDirReadOnly,
    ConfigPathSymlink,
    ConfigWriter,
    ConfigWriteTooEarly,
    write_profiler_config,
)
from profwatch.core.capture.planner import InvalidProfilerConfig, ProfilerConfig
from rankhook.profconfig import TEMPLATE
from tests.conftest import PYTHON, finish_process, python_env, wait_for

READER = r"""
import json, os, sys, time
path, stop, ready = sys.argv[1], sys.argv[2], sys.argv[3]
reads = missing = empty = torn = settled_bad = 0
docs = set()
open(ready, "w").close()
while not os.path.exists(stop):
    try:
        with open(path, "rb") as f:
            before = os.fstat(f.fileno()).st_mtime_ns
            data = f.read()
            after = os.fstat(f.fileno()).st_mtime_ns
    except FileNotFoundError:
        missing += 1
        continue
    reads += 1
    if not data.strip():
        empty += 1
        continue
    try:
        docs.add(json.loads(data).get("start_step"))
    except ValueError:
        # the writer's bump sets a whole-second mtime once the content is complete; a write under way shows the
        # write's own (sub-second) mtime. A bad read with the same whole-second mtime before and after is a
        # finished file that is torn: that must never happen
        if before == after and before % 1_000_000_000 == 0:
            settled_bad += 1
        else:
            torn += 1
print(json.dumps({"reads": reads, "missing": missing, "empty": empty, "torn": torn, "settled_bad": settled_bad,
                  "docs": sorted(docs)}))
"""


def _cfg(start_step: int, pad: int = 0) -> dict:
    return ProfilerConfig(start_step=start_step, metadata={"pad": "x" * pad}).render()


def test_in_place_edits_fresh_mtimes_no_torn_file_once_written(tmp_path: Path) -> None:
    """A reader racing the in-place writes never finds the file missing, empty, or torn once a write finished (its
    mtime bumped). A read during a write may see a mix: Linux does not make a read atomic against a write, which is
    why the writer bumps the mtime after the content is complete, so torch_npu's monitor reads it again whole
    (docs/torch_npu-dynamic-profile.md, config polling)."""
    d = tmp_path / "cfg"
    d.mkdir()
    t_start = time.time()
    w = ConfigWriter()
    first = w.write(str(d), _cfg(10, pad=3000), not_before_unix_s=t_start, allowed_roots=[str(tmp_path)])
    assert first.created
    path = d / "profiler_config.json"
    os.chmod(path, 0o604)
    os.chown(path, 1234, 2345)
    stop, ready = tmp_path / "stop", tmp_path / "ready"
    reader = subprocess.Popen([PYTHON, "-c", READER, str(path), str(stop), str(ready)], stdout=subprocess.PIPE,
                              text=True, env=python_env())
    try:
        wait_for(ready.exists, 30, what="the reader looping")  # every write below races a live reader
        results = [first]
        # alternate long and short documents so padding and truncation are both exercised
        for i, pad in enumerate((0, 3000, 10, 2000)):
            results.append(w.write(str(d), _cfg(20 + i, pad=pad), not_before_unix_s=t_start,
                                   allowed_roots=[str(tmp_path)]))
            assert results[-1].mtime_s <= time.time()
    finally:
        stop.touch()
        out = finish_process(reader, 30)
    stats = json.loads(out)
    assert stats["reads"] > 100
    assert stats["settled_bad"] == 0 and stats["missing"] == 0 and stats["empty"] == 0, stats
    assert set(stats["docs"]) <= {0, 10, 20, 21, 22, 23}
    assert len({r.inode for r in results}) == 1
    mtimes = [r.mtime_s for r in results]
    assert all(b > a for a, b in itertools.pairwise(mtimes)), mtimes
    assert mtimes[0] > int(t_start)
    st = os.stat(path)
    assert int(st.st_mtime) == mtimes[-1] and st.st_mtime == float(mtimes[-1])
    assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (1234, 2345, 0o604)
    assert json.loads(path.read_text())["start_step"] == 23
    assert path.read_bytes() == json.dumps(_cfg(23, pad=2000), indent=4).encode()


def test_template_created_once_with_mode_0640(tmp_path: Path) -> None:
    d = tmp_path / "c"
    d.mkdir()
    w = ConfigWriter(max_wait_s=5)
    dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        w._ensure_file(dfd, str(d / "profiler_config.json"))
    finally:
        os.close(dfd)
    p = d / "profiler_config.json"
    assert json.loads(p.read_text()) == TEMPLATE
    assert p.stat().st_mode & 0o777 == 0o640
    r = w.write(str(d), _cfg(5), not_before_unix_s=0, allowed_roots=[str(tmp_path)])
    assert not r.created and r.replaced_problem is None
    assert r.mtime_s > int(p.stat().st_ctime) - 2


def test_not_before_is_respected(tmp_path: Path) -> None:
    d = tmp_path / "c"
    d.mkdir()
    nb = time.time() + 1.2
    r = write_profiler_config(str(d), _cfg(5), not_before_unix_s=nb, allowed_roots=[str(tmp_path)])
    assert r.mtime_s > int(nb) and r.mtime_s <= time.time()
    with pytest.raises(ConfigWriteTooEarly):
        write_profiler_config(str(d), _cfg(6), not_before_unix_s=time.time() + 30, allowed_roots=[str(tmp_path)])


def test_hand_edit_reported_and_last_good_kept(tmp_path: Path) -> None:
    d = tmp_path / "c"
    d.mkdir()
    w = ConfigWriter()
    good = _cfg(5)
    w.write(str(d), good, not_before_unix_s=0, allowed_roots=[str(tmp_path)])
    p = d / "profiler_config.json"
    with open(p, "r+") as f:  # an operator's broken in-place edit
        f.write('{"start_step": 0, "active": ')
    r = w.write(str(d), _cfg(9), not_before_unix_s=0, allowed_roots=[str(tmp_path)])
    assert r.replaced_problem and "not JSON" in r.replaced_problem
    assert (w.last_content(str(d)) or {})["start_step"] == 9
    p.write_text(json.dumps({"start_step": 0}))
    r2 = ConfigWriter().write(str(d), _cfg(11), not_before_unix_s=0, allowed_roots=[str(tmp_path)])
    assert r2.replaced_problem and "start_step" in r2.replaced_problem


def test_refusals(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "c").mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    roots = [str(root)]
    w = ConfigWriter(max_wait_s=0.5)
    with pytest.raises(ConfigDirNotAllowed):
        w.write(str(outside), _cfg(5), not_before_unix_s=0, allowed_roots=roots)
    with pytest.raises(ConfigDirNotAllowed):
        w.write("relative/dir", _cfg(5), not_before_unix_s=0, allowed_roots=roots)
    (root / "link").symlink_to(outside)
    with pytest.raises(ConfigPathSymlink):
        w.write(str(root / "link"), _cfg(5), not_before_unix_s=0, allowed_roots=roots)
    (outside / "sub").mkdir()
    with pytest.raises(ConfigPathSymlink):
        w.write(str(root / "link" / "sub"), _cfg(5), not_before_unix_s=0, allowed_roots=roots)
    with pytest.raises(ConfigDirMissing):
        w.write(str(root / "gone"), _cfg(5), not_before_unix_s=0, allowed_roots=roots)
    ro = root / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    with pytest.raises(ConfigDirReadOnly):
        w.write(str(ro), _cfg(5), not_before_unix_s=0, allowed_roots=roots)
    (root / "c" / "profiler_config.json").symlink_to(outside / "x.json")
    with pytest.raises(ConfigPathSymlink):
        w.write(str(root / "c"), _cfg(5), not_before_unix_s=0, allowed_roots=roots)
    with pytest.raises(InvalidProfilerConfig):
        w.write(str(root / "c"), {**_cfg(5), "NPU_MONITOR_START": True}, not_before_unix_s=0, allowed_roots=roots)
    assert not (outside / "x.json").exists()


def test_write_after_a_future_mtime_goes_beyond_it(tmp_path: Path) -> None:
    """torch_npu ranks that accepted a future mtime ignore every edit not beyond it (docs/conformance.md): the
    writer sets the mtime past it instead of refusing or waiting for the clock, and keeps counting up."""
    fut = tmp_path / "fut"
    fut.mkdir()
    (fut / "profiler_config.json").write_text(json.dumps(TEMPLATE))
    t = int(time.time()) + 3600
    os.utime(fut / "profiler_config.json", (t, t))
    w = ConfigWriter()
    t0 = time.monotonic()
    r1 = w.write(str(fut), _cfg(5), not_before_unix_s=0, allowed_roots=[str(tmp_path)])
    r2 = w.write(str(fut), _cfg(6), not_before_unix_s=0, allowed_roots=[str(tmp_path)])
    assert time.monotonic() - t0 < 30  # no waiting for a clock an hour behind (3600 s)
    assert t < r1.mtime_s < r2.mtime_s <= t + 10
    assert int((fut / "profiler_config.json").stat().st_mtime) == r2.mtime_s
    assert json.loads((fut / "profiler_config.json").read_text())["start_step"] == 6
    r3 = ConfigWriter().write(str(fut), _cfg(7), not_before_unix_s=0, allowed_roots=[str(tmp_path)])  # restarted
    assert r3.mtime_s > r2.mtime_s


def test_symlinked_root_is_allowed(tmp_path: Path) -> None:
    real = tmp_path / "real"
    (real / "c").mkdir(parents=True)
    (tmp_path / "alias").symlink_to(real)
    r = ConfigWriter().write(str(tmp_path / "alias" / "c"), _cfg(5), not_before_unix_s=0,
                             allowed_roots=[str(tmp_path / "alias")])
    assert Path(r.path).read_text().startswith("{")
    wait_for(lambda: (real / "c" / "profiler_config.json").exists(), 1.0)
