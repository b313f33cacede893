"""profwatch's fake torch_npu (``daemon/profwatch/simulate``) against the real monitor: the same job, the same arms, the
same observable result (dp log lines, rank dir files, ``profiler_info`` shape, acknowledgements).

Both jobs run 2 real CPU ranks under rankhook's torch_npu backend; one imports the real monitor (the isolated
torch-npu tree), the other the fake. Known, documented differences that are left on purpose
(``docs/conformance.md``): the fake runs one monitor per process, so each rank logs "shared memory is created" and
its own monitor log, where torch_npu elects one creator per node ("... is connected", "no need to create
process"); the fake's parse writes simulated DBs where the real parse (without CANN data) writes a
framework-only DB; version strings differ.
"""

from __future__ import annotations

import json
import re
from typing import Any

from profwatch.adapters.fs.config_writer import ConfigWriter
from tests.conformance.conftest import NpuJob
from tests.conformance.helpers import plan, rank_dir_of, wait_hook_events, wait_stopped, window_end

_TS = re.compile(r"^\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2},\d{3} \[(\w+)\] \[\d+\] (\S+): ")
_ELECTION = ("shared memory is created.", "shared memory is connected.", "no need to create process.",
             "Dynamic monitor process has been created", "Create profiler_config.json default.", "unlink shm")
"""Lines about the per-node monitor election (the fake has one monitor per process; see the module doc)."""
_PARSE_LINES = ("Set is_rank", "rank_list", "Set rank_list", "Invalid parameter", "Set activity", "async_mode will not")
"""Lines torch_npu logs while parsing a delivered config (after "Start step will be set to")."""


def _collapse_redeliveries(items: list[Any], starts: Any, follows: Any) -> list[Any]:
    """Drop a config delivery (an item where ``starts(item)`` and the items after it where ``follows(item)``)
    identical to the delivery before: the writer's mtime bump delivers a generation once or twice, depending on
    when the monitor polls."""
    out: list[Any] = []
    last: list[Any] = []
    i = 0
    while i < len(items):
        if not starts(items[i]):
            out.append(items[i])
            i += 1
            continue
        j = i + 1
        while j < len(items) and follows(items[j]):
            j += 1
        block = items[i:j]
        if block != last:
            out += block
        last, i = block, j
    return out


def _log_delivery(line: str) -> bool:
    return "Start step will be set to" in line


def _log_parse_line(line: str) -> bool:
    return any(p in line for p in _PARSE_LINES)


def _run(job: NpuJob) -> dict[str, Any]:
    """Arm everyone, then only rank 1 (async parse); return what both implementations must agree on."""
    job.wait_steps(14, 180)
    roots = [str(job.root / "cfg")]
    writer = ConfigWriter()
    pa = plan(job)
    writer.write(str(job.cfg), pa.config.render(), not_before_unix_s=job.not_before(), allowed_roots=roots)
    wait_stopped(job, window_end(pa), [0, 1])
    pb = plan(job, rank_list=[1])
    writer.write(str(job.cfg), pb.config.render(), not_before_unix_s=job.not_before(), allowed_roots=roots)
    wait_stopped(job, window_end(pb), [1])
    wait_hook_events(job, "completed", pb.capture_id, [1])
    wait_hook_events(job, "completed", pa.capture_id, [0, 1])
    job.stop()
    out: dict[str, Any] = {"logs": {}, "files": {}, "info": {}, "acks": {}}
    labels = {str(pa.start_step): "S_A", str(window_end(pa)): "E_A", str(pb.start_step): "S_B",
              str(window_end(pb)): "E_B"}

    def label(n: re.Match[str]) -> str:
        return labels.get(n[0], n[0])

    for r in (0, 1):
        lines = []
        for ln in job.dp_log(r):
            m = _TS.match(ln)
            assert m, f"not torch_npu's log format: {ln!r}"
            msg = ln[m.end():]
            if not any(e in msg for e in _ELECTION):
                msg = re.sub(r"\b\d+\b", label, msg)
                msg = re.sub(r"change to \d+s", "change to Ns", msg)
                lines.append(f"{m[1]} {m[2]}: {msg}")
        out["logs"][r] = _collapse_redeliveries(lines, _log_delivery, _log_parse_line)
        rd = rank_dir_of(job, pa.prof_dir, r)
        out["files"][r] = sorted(str(p.relative_to(rd)) for p in rd.rglob("*") if p.is_file()
                                 and p.parent.name != "logs" and "FRAMEWORK" not in p.parts)
        info = json.loads((rd / f"profiler_info_{r}.json").read_text())
        out["info"][r] = {k: sorted(v) if isinstance(v, dict) else type(v).__name__ for k, v in info.items()
                          if k != "profwatch_sim"}
        out["info"][r]["rank_id"] = info["rank_id"]
        meta = json.loads((rd / "profiler_metadata.json").read_text())
        # parallel_group_info: torch_npu adds it for HCCL process groups only; these CPU ranks use gloo, the fake
        # plays an NPU job on HCCL (that is where the world size comes from)
        out["info"][r]["metadata_keys"] = sorted(k for k in meta if k != "parallel_group_info")
        out["info"][r]["group_ranks"] = [g["global_ranks"] for g in meta.get("parallel_group_info", {}).values()]
        acks = [(e.event, labels.get(str(e.start_step), e.start_step), labels.get(str(e.step), e.step))
                for e in job.coord.captures("dp_log") if e.rank == r]
        out["acks"][r] = _collapse_redeliveries(acks, lambda a: a[0] == "arm_seen", lambda a: a[0] == "arm_rejected")
    return out


def test_fake_and_real_monitor_agree(npu_job) -> None:
    real = _run(npu_job(world=2, job_id="jreal"))
    fake = _run(npu_job(world=2, job_id="jfake", fake=True))
    for r in (0, 1):
        assert fake["logs"][r] == real["logs"][r], "\n".join(
            [f"rank {r} dp log, fake:", *fake["logs"][r], "real:", *real["logs"][r]])
        assert fake["info"][r].pop("group_ranks") == [[0, 1]] and real["info"][r].pop("group_ranks") == []
        assert fake["info"][r] == real["info"][r], (r, fake["info"][r], real["info"][r])
        real_files = [f for f in real["files"][r] if not f.endswith(".db")]
        fake_files = [f for f in fake["files"][r] if not f.endswith(".db") and not f.endswith(".csv")
                      and not f.endswith(".json") or f in real_files]
        assert fake_files == real_files, (r, fake["files"][r], real["files"][r])
        assert f"ASCEND_PROFILER_OUTPUT/ascend_pytorch_profiler_{r}.db" in fake["files"][r]
        assert fake["acks"][r] == real["acks"][r], (r, fake["acks"][r], real["acks"][r])
