"""The test suite ends on SIGTERM and on SIGINT, tearing its fixtures down, also when started the way .ci/run
starts it (in the background of a bash script that forwards CI's signals). Issue 35: pytest kept running after
SIGTERM and SIGINT."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT, python_env, wait_for

_INNER = '''
import os, time
from pathlib import Path
import pytest

@pytest.fixture
def marked():
    yield
    Path(os.environ["PW_TORN_DOWN"]).write_text("yes")

def test_runs_until_stopped(marked):
    Path(os.environ["PW_READY"]).write_text(str(os.getpid()))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        time.sleep(0.05)
'''


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_the_suite_ends_on_a_signal_and_tears_down(tmp_path: Path, sig: signal.Signals) -> None:
    (tmp_path / "test_inner.py").write_text(_INNER)
    ready, torn = tmp_path / "ready", tmp_path / "torn"
    env = python_env({"PW_READY": str(ready), "PW_TORN_DOWN": str(torn)})
    # as .ci/run does: pytest in the background of a non-interactive bash (which sets SIGINT to ignored in it)
    script = (f'cd {REPO_ROOT} && python -m pytest -q -p no:cacheprovider -p tests.conftest --rootdir {tmp_path} '
              f'-o addopts="" {tmp_path / "test_inner.py"} & wait $!')
    proc = subprocess.Popen(["bash", "-c", script], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        pid = int(wait_for(lambda: ready.exists() and ready.read_text(), timeout_s=120, what="the inner test"))
        t0 = time.monotonic()
        import os

        os.kill(pid, sig)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert time.monotonic() - t0 < 60
    assert proc.returncode != 0, out
    assert torn.read_text() == "yes", out  # the fixture's teardown ran
    assert "KeyboardInterrupt" in out, out[-2000:]
