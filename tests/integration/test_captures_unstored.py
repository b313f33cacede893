"""While the state store fails (issue 24 item 16), a capture armed meanwhile is shown by `status` and `captures`
(they read the store, and now the retry queue too), marked not yet stored; once the store takes writes again the
mark goes (a live coordinator; the file made to refuse writes from the coordinator's own loop thread)."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from profwatch.adapters.zmq.control import call
from profwatch.cli import cli
from tests.conftest import wait_for
from tests.integration.sink_support import CoordinatorHarness


def test_a_capture_armed_while_the_store_fails_is_shown_not_yet_stored(short_tmp: Path) -> None:
    (short_tmp / "cfg" / "j1").mkdir(parents=True)
    (short_tmp / "prof").mkdir()
    h = CoordinatorHarness(short_tmp, arming={"mode": "observe"})
    try:
        h.hellos("j1", 2, cfg=short_tmp / "cfg" / "j1", prof=short_tmp / "prof")
        h.steps("j1", 2, 1, 5)
        wait_for(lambda: any(j["job_id"] == "j1" for j in call(h.control, "status", {}, timeout_s=10)["jobs"]), 30,
                 what="job registered")
        h.on_main(lambda: h.coord.state.db.execute("PRAGMA query_only=1"))  # type: ignore[union-attr]
        armed = call(h.control, "arm", {"job_id": "j1", "in_steps": 50}, timeout_s=20)
        cid = armed["capture_id"]

        def shown(rows: list) -> dict:
            return next((c for c in rows if c["capture_id"] == cid), {})

        wait_for(lambda: shown(call(h.control, "captures", {"job_id": "j1"}, timeout_s=10)).get("stored") is False,
                 30, what="captures lists it, not yet stored")
        status = call(h.control, "status", {"job_id": "j1"}, timeout_s=10)
        assert shown(status["captures"]).get("stored") is False and status["state_store"]["pending"] >= 1
        cfg = short_tmp / "cli.toml"
        cfg.write_text(f'[coordinator]\ncontrol_bind = "{h.control}"\n')
        text = CliRunner().invoke(cli, ["status", "--job", "j1", "--config", str(cfg)]).output
        assert cid in text and "not yet stored" in text, text
        h.on_main(lambda: h.coord.state.db.execute("PRAGMA query_only=0"))  # type: ignore[union-attr]
        wait_for(lambda: "stored" not in shown(call(h.control, "captures", {"job_id": "j1"}, timeout_s=10)), 60,
                 what="stored after the retry")
    finally:
        h.close()
