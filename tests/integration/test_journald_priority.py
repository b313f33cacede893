"""Log lines under journald (issue 24 item 9): a real daemon process whose stderr is the file ``$JOURNAL_STREAM``
names (as systemd sets it) starts each line with its syslog priority (``<4>`` warning, ``<6>`` info), which
journald turns into PRIORITY; with stderr elsewhere the lines stay clean JSON."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

from tests.conftest import PYTHON, python_env, wait_for
from tests.integration.sink_support import free_port


def _run(root: Path, log: Path, journal: bool) -> list[str]:
    cfg = root / "node.toml"
    cfg.write_text(f'[node]\nnode_id = "n-journal"\nbind = "ipc://{root}/node.sock"\n'
                   f'coordinator = "tcp://127.0.0.1:{free_port()}"\nmetrics_port = {free_port()}\n'
                   'metrics_addr = "0.0.0.0"\nmetrics_insecure = true\n')  # a warning at every start
    with open(log, "wb") as out:
        st = os.fstat(out.fileno())
        env = python_env({"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"} if journal else {"JOURNAL_STREAM": "1:2"})
        p = subprocess.Popen([PYTHON, "-m", "profwatch.cli", "node", "--config", str(cfg)], env=env,
                             stdout=subprocess.DEVNULL, stderr=out)
    try:
        wait_for(lambda: "node_started" in log.read_text(), 60, what="node started")
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(30)
    return [ln for ln in log.read_text().splitlines() if ln.strip()]


def test_priority_prefixes_only_when_stderr_is_the_journal(short_tmp: Path) -> None:
    lines = _run(short_tmp, short_tmp / "journal.log", journal=True)
    by_event = {json.loads(ln[3:])["event"]: ln[:3] for ln in lines}
    assert by_event["metrics_insecure"] == "<4>" and by_event["node_started"] == "<6>", lines
    assert all(ln[:3] in ("<2>", "<3>", "<4>", "<6>", "<7>") for ln in lines), lines
    plain = _run(short_tmp, short_tmp / "plain.log", journal=False)  # JOURNAL_STREAM names another file
    events = [json.loads(ln) for ln in plain]  # clean JSON, no prefix
    assert {"metrics_insecure", "node_started"} <= {e["event"] for e in events}
    assert {e["level"] for e in events if e["event"] == "metrics_insecure"} == {"warning"}
