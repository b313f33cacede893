"""A reference that is odd (issue 32, bad input): operator names with HTML are compared and escaped where shown;
a reference of another job or world size is compared with the caveat in the headline."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from profwatch.adapters.tools.kineto_reader import write_torch_trace
from tests.conftest import PYTHON, python_env
from tests.unit.test_kineto_align import job_events

ODD = "<script>alert('x')</script>aten::mm&amp;<b>"


def _batch(root: Path, *, world: int, work: float, job: str, ts: str) -> None:
    events = job_events(world, work={r: work for r in range(world)}, steps=4)
    for r in range(world):
        d = root / f"node0_{4000 + r}_{ts}{r:03d}_torch_pt"
        d.mkdir(parents=True)
        (d / f"profiler_info_{r}.json").write_text(json.dumps({"rank_id": r, "world_size": world}))
        (d / "profiler_metadata.json").write_text(json.dumps({"profwatch_capture_id": f"cap-{ts}",
                                                              "profwatch_job_id": job}))
        for e in events[r]:
            if e["name"] == "aten::mm":
                e["name"] = ODD
        write_torch_trace(d / f"node0_{4000 + r}.1767268800000.pt.trace.json", r, world, events[r])
        (d / "trace.done").write_text("")


def _analyze(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PYTHON, "-m", "profwatch.cli", "analyze", *args], env=python_env(), cwd=cwd,
                          capture_output=True, text=True, timeout=300)


def test_html_names_are_compared_and_escaped_and_another_job_is_said(tmp_path: Path):
    _batch(tmp_path / "ref", world=2, work=1.0, job="train-a", ts="20260101120000")
    _batch(tmp_path / "now", world=4, work=1.5, job="train-b", ts="20260101130000")
    out = _analyze(str(tmp_path / "now"), "--baseline", str(tmp_path / "ref"), "--out", str(tmp_path / "w"),
                   "--json", cwd=tmp_path)
    assert out.returncode in (0, 1), out.stderr[-2000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    c = res["comparison"]
    assert c is not None and c["ranks_compared"] == [0, 1], c
    assert c["changes"][0]["component"] == "compute"
    assert c["headline"].endswith("[world size 2 -> 4; reference of another job (train-a)]"), c["headline"]
    assert any("another job" in n for n in c["notes"])
    detail = c["changes"][0]["detail"]
    assert detail[0]["name"] == ODD  # the data keeps the name as the trace wrote it
    html = Path(res["report"]).read_text()
    assert "<script>alert" not in html and "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;aten::mm&amp;amp;" in html
    human = _analyze(str(tmp_path / "now"), "--baseline", str(tmp_path / "ref"), "--out", str(tmp_path / "w2"),
                     cwd=tmp_path)
    assert "reference of another job (train-a)" in human.stdout and "aten::mm" in human.stdout, human.stdout
