"""msprof-analyze on a full disk (the real tool, a real full file system): it exits 0 and every recipe looks
empty; the status names the cause from the tool's log (``tool_error: no space left: ...``), and the same batch with
room is analysed (``ok``).

The output folder is a 64 KiB tmpfs filled with ``dd`` in a user and mount namespace of its own (``unshare -Urm``);
skipped where that is not allowed."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from profwatch.adapters.tools.msprof_runner import MsprofSettings, resolve_command
from profwatch.simulate import ascend_tree as at
from tests.conftest import PYTHON, python_env

pytestmark = pytest.mark.skipif(shutil.which(resolve_command(MsprofSettings().command)) is None,
                                reason="msprof-analyze is not installed (pip install -e '.[test]')")

CHILD = r"""
import json, sys
from pathlib import Path
from profwatch.adapters.tools.msprof_analysis import run_msprof_analysis
from profwatch.adapters.tools.msprof_runner import MsprofRunner, MsprofSettings
with MsprofRunner(MsprofSettings(advisor=False, timeout_s=180)) as runner:
    ev = run_msprof_analysis(Path(sys.argv[1]), Path(sys.argv[2]), runner=runner, world_size=4)
print(json.dumps({k: [v.status, v.detail] for k, v in ev.recipes.items()}))
"""


def _namespaces_ok(where: Path) -> bool:
    where.mkdir()
    try:
        res = subprocess.run(["unshare", "-Urm", "sh", "-c", f"mount -t tmpfs -o size=64k tmpfs '{where}'"],
                             capture_output=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return res.returncode == 0


def _analyse(tmp: Path, batch: Path, fill: bool) -> dict[str, list[str]]:
    out = tmp / ("full" if fill else "room")
    out.mkdir()
    (tmp / "child.py").write_text(CHILD)
    dd = f"dd if=/dev/zero of='{out}/fill' bs=4k count=100 2>/dev/null; " if fill else ""
    script = (f"mount -t tmpfs -o size=64k tmpfs '{out}' && {dd}"
              f"exec '{PYTHON}' '{tmp / 'child.py'}' '{batch}' '{out}/analysis'")
    res = subprocess.run(["unshare", "-Urm", "sh", "-c", script], capture_output=True, text=True, timeout=400,
                         env=python_env())
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_a_full_disk_is_named_from_the_tools_log_and_the_same_batch_with_room_is_analysed(tmp_path: Path) -> None:
    if not _namespaces_ok(tmp_path / "probe"):
        pytest.skip("cannot mount a tmpfs in a user namespace here (unshare -Urm)")
    batch = tmp_path / "batch"
    at.generate_cluster(batch, world_size=4, steps=2)
    full = _analyse(tmp_path, batch, fill=True)
    for name in ("cluster_time_summary", "slow_rank"):
        status, detail = full[name]
        assert status == "tool_error" and detail.startswith("no space left: "), (name, full)
        assert "free space under" in detail
    room = _analyse(tmp_path, batch, fill=False)
    assert room["cluster_time_summary"][0] == "ok" and room["slow_rank"][0] == "ok", room
