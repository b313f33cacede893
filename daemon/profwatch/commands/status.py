"""``profwatch status``: jobs, ranks, nodes and captures as the coordinator sees them now (CLI body).

Text from ``daemon/profwatch/core/status_text.py``. When the coordinator does not answer, its last recorded state is
read from its state db (read-only, within the file's permissions: ``adapters/store/state_reader.py``), headed by a
line that says the coordinator is not running and when that state was recorded (as ``profwatch alerts`` reads its
stored alerts). Exit codes (``daemon/profwatch/exitcodes.py``): 0 shown; 1 ``--job`` names a job the coordinator
does not know; 2 bad config; 3 coordinator unavailable (also when its last recorded state was shown instead).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import click

from profwatch.commands.common import CoordinatorClient, config_option, load_or_exit, unavailable_hint
from profwatch.exitcodes import EXIT_NOT_OK, EXIT_UNAVAILABLE


def _offline(s: Any, coord: CoordinatorClient, job_id: str | None, as_json: bool) -> None:
    """Show the last recorded state from the state db and exit 3 (the coordinator is unavailable either way)."""
    from profwatch.adapters.store.state_reader import StateUnreadable, read_status
    from profwatch.core.status_text import render_offline_status

    try:
        got = read_status(s.coordinator.state_db, job_id=job_id)
    except StateUnreadable as exc:
        click.echo(f"profwatch: {coord.unavailable}; and {exc}\n{unavailable_hint()}", err=True)
        sys.exit(EXIT_UNAVAILABLE)
    if as_json:
        click.echo(f"profwatch: {coord.unavailable}; its last recorded state, from its state db {got.path}", err=True)
        click.echo(json.dumps(got.to_json(), indent=2))
    else:
        for line in render_offline_status(coord.unavailable, got.to_json(), time.time(),
                                          refused=coord.refused):
            click.echo(line)
    sys.exit(EXIT_UNAVAILABLE)


@click.command("status")
@config_option
@click.option("--job", "job_id", help="only this job")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def status(config_path: Path | None, job_id: str | None, as_json: bool) -> None:
    """Show jobs (ranks: last step, step times, state), nodes, captures (state, deadline, running recipe).

    When the coordinator does not answer, its last recorded state is read from its state db (read-only, if this
    user may read the file), headed by when it was recorded; the exit code is 3 either way.
    """
    from profwatch.core.status_text import render_status

    s = load_or_exit(config_path)
    coord = CoordinatorClient(s)
    if not coord.reachable():
        _offline(s, coord, job_id, as_json)
    snap = coord.call("status", {"job_id": job_id} if job_id else {})
    if job_id and not snap["jobs"]:
        click.echo(f"profwatch: the coordinator knows no job {job_id!r} (no rank has said hello, "
                   "or its hellos were refused: see the coordinator's log and profwatch_rejected_total)", err=True)
        sys.exit(EXIT_NOT_OK)
    if as_json:
        click.echo(json.dumps(snap, indent=2))
        return
    for line in render_status(snap):
        click.echo(line)
