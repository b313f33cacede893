"""profwatch's profiler_config.json rules against torch_npu's REAL config parsing (torch-npu 2.13.0).

Each case is a config that torch_npu resets, ignores or fails on. ``config_probe.py`` runs the real
``ConfigContext``, ``_ExperimentalConfig``, ``_ProfInterface`` checks and ``add_metadata_json`` on it (as
``dynamic_profile`` does before a capture, rank 0) and reports torch_npu's own messages. The test then asserts:

* torch_npu really says the quoted reason (so the table below is true for this release),
* profwatch's model (``daemon/profwatch/core/capture/profiler_config.py``) refuses the config and its message carries the same
  reason,
* rankhook's torch_npu mirror (``rankhook/backends/torch_npu_config.py``) predicts the values torch_npu uses.

And the other way round: configs profwatch writes (the planner's) are taken by torch_npu as they are, without a
single reset.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest

from profwatch.core.capture.planner import CaptureRequest, CaptureSettings, JobProgress, plan_capture
from profwatch.core.capture.profiler_config import (
    AIC_NEEDS_LEVEL,
    ANALYSE_CLOSED,
    DOMAINS_BOTH,
    DOMAINS_NEED_MSTX,
    EXPERIMENTAL_NEEDS_NPU,
    GC_NEEDS_CPU,
    LEVEL_NONE_NEEDS_MSTX,
    NOT_EFFECTIVE,
    NOT_IN_RANK_LIST,
    OP_ATTR_NEEDS_DB,
    InvalidProfilerConfig,
    ProfilerConfig,
)
from rankhook.backends.torch_npu_backend import analyse_effective
from rankhook.backends.torch_npu_config import torch_npu_reading
from tests.conformance.real_torch_npu import MonitorTree
from tests.conftest import PYTHON, REPO_ROOT, python_env

BASE = ProfilerConfig(start_step=7, warmup=1, active=2, prof_dir="/tmp/profwatch-probe-never-created").render()
_EXP = "experimental_config"
NON_RESET_WARNINGS = ("Profiler won't be using warmup", EXPERIMENTAL_NEEDS_NPU, "it will collect all gc events")
"""torch_npu messages that do not change a value: a warmup of 0; the (default) experimental_config of a CPU-only
capture (profwatch always renders one; it refuses non-default settings there); gc_detect_threshold 0 (all GC
events, as asked)."""

# (id, overrides of BASE (``_EXP`` merges into experimental_config), torch_npu's reason, the key in our message)
CASES: list[tuple[str, dict[str, Any], str | None, str]] = [
    ("start_step-str", {"start_step": "5"}, "Start step is not valid, will be reset to 0.", "start_step"),
    ("start_step-neg", {"start_step": -3}, "Start step is not valid, will be reset to 0.", "start_step"),
    ("start_step-float", {"start_step": 2.5}, "Start step is not valid, will be reset to 0.", "start_step"),
    ("start_step-zero", {"start_step": 0}, None, NOT_EFFECTIVE),
    ("active-zero", {"active": 0}, "Invalid parameter active, reset it to 1.", "active"),
    ("active-str", {"active": "2"}, "Invalid parameter active, reset it to 1.", "active"),
    ("warmup-neg", {"warmup": -1}, "Invalid parameter warmup, reset it to 0.", "warmup"),
    ("is_rank-str", {"is_rank": "yes", "rank_list": [0]}, "Set is_rank failed, is_rank must be bool!", "is_rank"),
    ("rank_list-str", {"is_rank": True, "rank_list": "0,1"}, "Set rank_list failed, rank_list must be list!",
     "rank_list"),
    ("rank_list-empty", {"is_rank": True, "rank_list": []}, NOT_IN_RANK_LIST, "rank_list"),
    ("rank_list-analyse-sync", {"is_rank": True, "rank_list": [0], "analyse": True, "async_mode": False},
     ANALYSE_CLOSED, "async_mode"),
    ("activities-gpu", {"activities": ["CPU", "GPU"]}, "Set activity failed, activity must be CPU OR NPU!",
     "activities"),
    ("activities-int", {"activities": [1]}, None, "Call step failed"),
    ("record_shapes-str", {"record_shapes": "yes"}, "Parameter record_shapes is of boolean type, reset it to False.",
     "record_shapes"),
    ("with_stack-int", {"with_stack": 1}, "Parameter with_stack is of boolean type, reset it to False.", "with_stack"),
    ("analyse-str", {"analyse": "true"}, None, "read as false"),
    ("async_mode-int", {"analyse": True, "async_mode": 1}, None, "read as false"),
    ("prof_dir-empty", {"prof_dir": ""}, "Invalid parameter dir_name, reset it to default.", "prof_dir"),
    ("metadata-long", {"metadata": {"k": "x" * 5000}}, "Invalid input key or value. Skip this metadata.",
     "metadata"),
    ("level-unknown", {_EXP: {"profiler_level": "Level3"}},
     "Invalid parameter profiler_level, reset it to ProfilerLevel.Level0.", "profiler_level"),
    ("aic-unknown", {_EXP: {"profiler_level": "Level1", "aic_metrics": "Foo"}},
     "Invalid parameter aic_metrics, reset it to default.", "aic_metrics"),
    ("aic-level0", {_EXP: {"profiler_level": "Level0", "aic_metrics": "PipeUtilization"}}, AIC_NEEDS_LEVEL,
     "aic_metrics"),
    ("l2_cache-str", {_EXP: {"l2_cache": "no"}},
     "Invalid parameter l2_cache, which must be of bool type, reset it to False.", "l2_cache"),
    ("op_attr-str", {_EXP: {"op_attr": "y"}},
     "Invalid parameter op_attr, which must be of bool type, reset it to False.", "op_attr"),
    ("msprof_tx-str", {_EXP: {"msprof_tx": "y"}},
     "Invalid parameter msprof_tx, which must be of bool type, reset it to False.", "msprof_tx"),
    ("mstx-str", {_EXP: {"mstx": "y"}}, "Invalid parameter mstx, which must be of bool type, reset it to False.",
     "mstx"),
    ("record_op_args-int", {_EXP: {"record_op_args": 1}},
     "Invalid parameter record_op_args, which must be of bool type, reset it to False.", "record_op_args"),
    ("sys_io-str", {_EXP: {"sys_io": "y"}},
     "Invalid parameter sys_io, which must be of bool type, reset it to False.", "sys_io"),
    ("sys_interconnection-str", {_EXP: {"sys_interconnection": "y"}},
     "Invalid parameter sys_interconnection, which must be of bool type, reset it to False.", "sys_interconnection"),
    ("data_simplification-str", {_EXP: {"data_simplification": "x"}},
     "Invalid parameter data_simplification, which must be of bool type, reset it to default.",
     "data_simplification"),
    ("export-unknown", {_EXP: {"export_type": ["pdf"]}}, "Invalid parameter export_type, reset it to text.",
     "export_type"),
    ("export-empty", {_EXP: {"export_type": []}}, "reset it to text.", "export_type"),
    ("gc-negative", {_EXP: {"gc_detect_threshold": -1}},
     "Parameter gc_detect_threshold can not be negative, reset it to default.", "gc_detect_threshold"),
    ("gc-str", {_EXP: {"gc_detect_threshold": "5"}},
     "Parameter gc_detect_threshold is not int or float type, reset it to default.", "gc_detect_threshold"),
    ("host_sys-unknown", {_EXP: {"host_sys": ["cpu", "gpu"]}}, "Invalid parameter host_sys, reset it to empty.",
     "host_sys"),
    ("level_none-no-mstx", {_EXP: {"profiler_level": "Level_none"}}, LEVEL_NONE_NEEDS_MSTX, "mstx"),
    ("domains-no-mstx", {_EXP: {"mstx_domain_include": ["a"]}}, DOMAINS_NEED_MSTX, "mstx"),
    ("domains-both", {_EXP: {"mstx": True, "mstx_domain_include": ["a"], "mstx_domain_exclude": ["b"]}},
     DOMAINS_BOTH, "mstx_domain"),
    ("domains-not-str", {_EXP: {"mstx": True, "mstx_domain_include": [1]}},
     "Invalid parameter mstx_domain_include, which contents must be of str type, reset it to default.",
     "mstx_domain_include"),
    ("op_attr-text", {_EXP: {"op_attr": True, "export_type": ["text"]}}, OP_ATTR_NEEDS_DB, "op_attr"),
    ("exp-without-npu", {"activities": ["CPU"], _EXP: {"profiler_level": "Level1"}}, EXPERIMENTAL_NEEDS_NPU,
     "NPU activity"),
    ("gc-without-cpu", {"activities": ["NPU"], _EXP: {"gc_detect_threshold": 1.0}}, GC_NEEDS_CPU, "CPU activity"),
    ("dyno-command", {"NPU_MONITOR_START": True}, None, "NPU_MONITOR_START"),
]


def _with(overrides: dict[str, Any]) -> dict[str, Any]:
    cfg = json.loads(json.dumps(BASE))
    for k, v in overrides.items():
        if k == _EXP:
            cfg[_EXP].update(v)
        else:
            cfg[k] = v
    return cfg


def _probe(tree: MonitorTree, configs: list[Any]) -> list[dict[str, Any]]:
    env = python_env({"PYTHONPATH": f"{tree.site}:{REPO_ROOT}", "RANK": "0",
                      "PROFWATCH_TORCH_NPU_STANDIN_VERSION": tree.version})
    env.pop("TORCH_NPU_WARNING_DISABLE", None)
    proc = subprocess.run([PYTHON, "-m", "tests.conformance.config_probe"], input=json.dumps(configs), env=env,
                          capture_output=True, text=True, timeout=300, cwd=str(REPO_ROOT), check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def probed(monitor_tree: MonitorTree) -> dict[str, dict[str, Any]]:
    configs = [_with(o) for _, o, _, _ in CASES] + [[1, 2]]
    results = _probe(monitor_tree, configs)
    ids = [c[0] for c in CASES] + ["not-an-object"]
    return dict(zip(ids, results, strict=True))


@pytest.mark.parametrize(("cid", "overrides", "reason", "ours"), CASES, ids=[c[0] for c in CASES])
def test_refused_with_torch_npus_reason(probed: dict[str, dict[str, Any]], monitor_tree: MonitorTree, cid: str,
                                        overrides: dict[str, Any], reason: str | None, ours: str) -> None:
    real = probed[cid]
    said = "\n".join(real["messages"])
    if reason is not None:
        assert reason in said, f"torch_npu {monitor_tree.version} no longer says {reason!r}: {real}"
    cfg = _with(overrides)
    with pytest.raises(InvalidProfilerConfig) as ei:
        ProfilerConfig.parse(cfg)
    msg = str(ei.value)
    assert ours in msg, msg
    if reason is not None:
        assert reason in msg, f"profwatch refuses {cid} but does not give torch_npu's reason {reason!r}: {msg}"
    # rankhook's torch_npu mirror predicts what torch_npu does with it
    mirror, _notes = torch_npu_reading(cfg)
    if real.get("error") or real.get("dyno_monitor"):
        assert mirror is None, (cid, real, mirror)
        return
    if real["start_step"] == 0:
        assert mirror is None, (cid, real, mirror)
        return
    assert mirror is not None, (cid, real)
    assert (mirror["start_step"], mirror["active"], mirror["warmup"]) == (
        real["start_step"], real["active"], real["warmup"]), (cid, real, mirror)
    selected = (not mirror["is_rank"]) or 0 in mirror["rank_list"]
    assert selected == real["valid"], (cid, real, mirror)
    if selected:
        assert analyse_effective(mirror) == real["analyse"], (cid, real, mirror)


def test_special_outcomes_are_real(probed: dict[str, dict[str, Any]], monitor_tree: MonitorTree) -> None:
    """The refusals whose reason torch_npu does not log as such."""
    assert probed["start_step-zero"]["start_step"] == 0
    assert NOT_EFFECTIVE in monitor_tree.path_of("torch_npu/profiler/dynamic_profile.py").read_text()
    assert "has no attribute 'upper'" in probed["activities-int"]["error"]
    assert probed["analyse-str"]["analyse"] is False
    assert probed["async_mode-int"]["async_mode"] is False
    assert "k" not in probed["metadata-long"]["metadata_kept"]
    assert probed["dyno-command"]["dyno_monitor"] is True
    assert probed["not-an-object"]["error"].startswith("load json failed")
    with pytest.raises(InvalidProfilerConfig, match="load json failed"):
        ProfilerConfig.parse([1, 2])


def _planned(**req: Any) -> dict[str, Any]:
    job = JobProgress(job_id="j1", world_size=4, furthest_step=100, step_time_s=0.5, prof_root="/prof",
                      now_unix_s=1_800_000_000.0)
    return plan_capture(CaptureRequest(job_id="j1", reason="conformance", **req), job, CaptureSettings()).config.render()


ACCEPTED: list[dict[str, Any]] = [
    _planned(),
    _planned(rank_list=[0, 2]),
    _planned(warmup=0, active=5),
    ProfilerConfig(start_step=-1, analyse=True, async_mode=True, activities=["CPU"]).render(),
    ProfilerConfig.parse({"start_step": 9, "warmup": 1, "experimental_config": {
        "profiler_level": "Level2", "aic_metrics": "PipeUtilization", "l2_cache": True, "op_attr": True,
        "export_type": ["text", "db"], "gc_detect_threshold": 0, "host_sys": ["cpu", "mem"], "mstx": True,
        "mstx_domain_include": ["train"], "sys_io": True, "sys_interconnection": True, "record_op_args": True,
        "data_simplification": False}}).render(),
    ProfilerConfig.parse({"start_step": 4, "warmup": 2, "record_shapes": True, "with_stack": True,
                          "profile_memory": True, "with_flops": True, "with_modules": True,
                          "metadata": {"profwatch_capture_id": "c-1", "nested": {"a": [1, 2]}}}).render(),
    ProfilerConfig.parse({"start_step": 12, "warmup": 1, "experimental_config": {
        "profiler_level": "Level_none", "mstx": True}}).render(),
]


def test_what_profwatch_writes_torch_npu_takes_as_is(monitor_tree: MonitorTree) -> None:
    results = _probe(monitor_tree, ACCEPTED)
    for cfg, real in zip(ACCEPTED, results, strict=True):
        assert real["error"] is None, real
        resets = [m for m in real["messages"] if not m.startswith("Start step will be set to")
                  and m != "Set is_rank success!" and not any(w in m for w in NON_RESET_WARNINGS)]
        assert not resets, (cfg, resets)
        assert (real["start_step"], real["active"], real["warmup"]) == (cfg["start_step"], cfg["active"],
                                                                        cfg["warmup"])
        assert real["valid"] == ((not cfg["is_rank"]) or 0 in cfg["rank_list"])
        if real["valid"]:
            assert real["analyse"] == cfg["analyse"] and real["async_mode"] == cfg["async_mode"]
        assert sorted(real["metadata_kept"]) == sorted(cfg["metadata"])
        mirror, notes = torch_npu_reading(cfg)
        assert mirror is not None and not notes, (cfg, notes)
