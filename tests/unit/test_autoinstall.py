"""rankhook/autoinstall.py: torch_npu-style optimizer-step counting and the PROFWATCH=1 .pth path."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from rankhook.autoinstall import PTH_NAME, OptimizerStepCounter, install_pth, uninstall_pth
from tests.conftest import PYTHON, python_env


class _Opt:
    pass


def test_counter_one_step_per_iteration_and_new_optimizer_stall() -> None:
    c = OptimizerStepCounter()
    a, b = _Opt(), _Opt()
    steps = sum(c.on_optimizer_step(o) for _ in range(5) for o in (a, b))
    assert steps == 5  # two optimizers per iteration count once
    n = _Opt()  # a new optimizer instance restarts at 1: stalls until it passes the old maximum (docs/torch_npu-dynamic-profile.md#step-counting)
    assert [c.on_optimizer_step(n) for _ in range(7)] == [False] * 5 + [True, True]


def test_install_uninstall_pth(tmp_path: Path) -> None:
    p = install_pth(str(tmp_path))
    assert Path(p).name == PTH_NAME and "maybe_autoinstall" in Path(p).read_text()
    assert uninstall_pth(str(tmp_path)) and not uninstall_pth(str(tmp_path))


SCRIPT = r"""
import site, sys
site.addsitedir(sys.argv[1])          # what the interpreter does for site-packages at start-up
import rankhook
calls = []
rankhook.init = lambda *a, **k: calls.append("init")
rankhook.step = lambda: calls.append("step")
import torch
m = torch.nn.Linear(2, 2)
o1, o2 = torch.optim.SGD(m.parameters(), lr=0.1), torch.optim.SGD(m.parameters(), lr=0.1)
for _ in range(3):
    m(torch.ones(1, 2)).sum().backward()
    o1.step(); o2.step()
print(",".join(calls))
"""


@pytest.mark.parametrize(("flag", "expected"), [("1", "init,step,step,step"), ("0", "")])
def test_pth_autoinstall_steps_on_optimizer_hook(tmp_path: Path, flag: str, expected: str) -> None:
    pytest.importorskip("torch")
    install_pth(str(tmp_path))
    out = subprocess.run([PYTHON, "-c", SCRIPT, str(tmp_path)], env=python_env({"PROFWATCH": flag}),
                         capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip().splitlines()[-1:] == ([expected] if expected else [])
