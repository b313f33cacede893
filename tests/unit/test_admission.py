"""The arm refusal rules (pure, ``core/arming/admission.py``) on a real registry with a fake clock."""

from __future__ import annotations

from dataclasses import replace

from profwatch.core.arming.admission import arm_refusal, arm_warnings, covered_unavailable
from profwatch.core.fleet.registry import Registry
from rankhook import wire

T0 = 1_800_000_000.0


def _registry(world: int = 4, hellos: int | None = None, nodes: tuple[str, ...] = ("n1", "n2"),
              config: str = "/cfg/j1", prof_root: str = "/prof") -> Registry:
    reg = Registry()
    for n in nodes:
        reg.heartbeat(wire.NodeHeartbeat(node_id=n, hostname=n, pid=1, ts_unix_s=T0, started_unix_s=T0), T0)
    for r in range(world if hellos is None else hellos):
        node = nodes[r % len(nodes)]
        reg.hello(wire.RankHello(job_id="j1", rank=r, local_rank=r, world_size=world, hostname=node, pid=100 + r,
                                 backend="torch_npu", ts_unix_s=T0, profiler_config_path=config,
                                 prof_root=prof_root), node, T0)
    return reg


def _refusal(reg: Registry, rank_list: list[int] | None = None, now: float = T0, writer: str = "node") -> str | None:
    return arm_refusal(reg.jobs["j1"], rank_list, reg.nodes, now, config_writer=writer, node_timeout_s=10.0)


def test_a_ready_job_can_take_an_arm() -> None:
    assert _refusal(_registry()) is None
    assert _refusal(_registry(), writer="coordinator") is None


def test_paths_the_job_did_not_announce_usably_refuse_the_arm() -> None:
    reg = _registry()
    job = reg.jobs["j1"]
    job.profiler_config_path = None  # refused by the path checks at its hello
    # the status line "arm failed (refused: ...)" is what a user sees first: it points at the refusal's alert
    assert _refusal(reg) == ("job j1 announced no usable profiler_config_path (none given, or refused at its hello, "
                             "e.g. outside [coordinator] allowed_config_roots: the job's path_refused alert names "
                             "the path and why)")
    job.profiler_config_path, job.prof_root = "/cfg/j1", None
    why = _refusal(reg)
    assert why is not None and why.startswith("job j1 announced no usable prof_root (") and "allowed_prof_roots" in why


def test_ranks_not_all_live_refuse_the_arm_and_say_which() -> None:
    why = _refusal(_registry(hellos=3))
    assert why is not None and why.startswith("only 3/4 ranks are live (the others have not started yet)")
    reg = _registry()
    reg.bye(wire.RankBye(job_id="j1", rank=2, step=5, ts_unix_s=T0 + 1), T0 + 1, "n1")
    why = _refusal(reg)
    assert why is not None and "only 3/4 ranks are live (left: [2])" in why and "torch_npu" in why
    for r in (0, 1, 3):
        reg.bye(wire.RankBye(job_id="j1", rank=r, step=5, ts_unix_s=T0 + 1), T0 + 1, ("n1", "n2")[r % 2])
    assert _refusal(reg) == "job j1 has no live ranks (all 4 left)"


def test_a_silent_node_refuses_a_node_written_arm_only_when_it_covers_one_of_its_ranks() -> None:
    reg = _registry()
    reg.nodes["n2"] = replace(reg.nodes["n2"], last_seen_unix_s=T0 - 60)  # ranks 1 and 3 run on n2
    why = _refusal(reg)
    assert why is not None and why.startswith("node n2 is down (last heard 60 s ago)")
    assert _refusal(reg, rank_list=[0, 2]) is None  # n2 writes nothing for this arm
    assert _refusal(reg, writer="coordinator") is None  # the coordinator writes the shared config itself
    del reg.nodes["n2"]
    assert "node n2 is down (never heard)" in (_refusal(reg, rank_list=[1]) or "")
    assert _refusal(_registry(), now=T0 + 11) is not None  # the heartbeat ages with the clock


def test_a_covered_rank_no_capture_can_reach_refuses_the_arm_a_telemetry_only_one_warns() -> None:
    reg = _registry()
    rank3 = reg.jobs["j1"].ranks[3]
    rank3.backend, rank3.backend_error = "none", "ModuleNotFoundError: No module named 'torch_npu'"
    why = _refusal(reg)
    assert why is not None and "cannot be imported" in why
    assert _refusal(reg, rank_list=[0, 1]) is None  # rank 3 is not covered
    rank3.backend_error = ""  # telemetry-only by choice: not fatal, the arm goes on (the shell warns)
    assert _refusal(reg) is None
    gone = covered_unavailable(reg.jobs["j1"], {0, 3})
    assert gone is not None and gone.ranks == (3,) and not gone.fatal
    assert covered_unavailable(reg.jobs["j1"], {0, 1}) is None


def test_a_config_path_the_covered_ranks_torch_npu_raises_on_refuses_the_arm_one_it_warns_about_warns() -> None:
    reg = _registry(config="/cfg/j1$")  # "$" is outside dp.init's allowed characters
    job = reg.jobs["j1"]
    assert _refusal(reg) is None  # no torch_npu version known: nothing to judge
    job.ranks[1].torch_npu = "2.6.0"  # raises in every release
    why = _refusal(reg)
    assert why is not None and why.startswith("profiler_config_path '/cfg/j1$'") and "raises" in why
    assert _refusal(reg, rank_list=[0, 2]) is None  # rank 1 is not covered
    job.ranks[1].torch_npu = "2.13.0"  # only warns from then on
    assert _refusal(reg) is None
    (warning,) = arm_warnings(job, {0, 1, 2, 3}, config_path_is_link=False)
    assert warning.startswith("profiler_config_path '/cfg/j1$'") and "2.13.0" in warning
    assert arm_warnings(_registry().jobs["j1"], {0, 1}, config_path_is_link=False) == []
