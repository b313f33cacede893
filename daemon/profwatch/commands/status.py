"""``profwatch status``: jobs, ranks, nodes and captures as the coordinator sees them now (CLI body).

Text from ``daemon/profwatch/core/status_text.py``. Exit codes (``daemon/profwatch/exitcodes.py``): 0 shown; 1 ``--job`` names a job
the coordinator does not know; 2 bad config; 3 coordinator unavailable.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from profwatch.commands.common import CoordinatorClient, config_option, load_or_exit
from profwatch.exitcodes import EXIT_NOT_OK


@click.command("status")
@config_option
@click.option("--job", "job_id", help="only this job")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def status(config_path: Path | None, job_id: str | None, as_json: bool) -> None:
    """Show jobs (ranks: last step, step times, state), nodes, captures (state, deadline, running recipe)."""
    from profwatch.core.status_text import render_status

    s = load_or_exit(config_path)
    snap = CoordinatorClient(s).call("status", {"job_id": job_id} if job_id else {})
    if job_id and not snap["jobs"]:
        click.echo(f"profwatch: the coordinator knows no job {job_id!r} (no rank of it has said hello, "
                   "or its hellos were refused: see the coordinator's log and profwatch_rejected_total)", err=True)
        sys.exit(EXIT_NOT_OK)
    if as_json:
        click.echo(json.dumps(snap, indent=2))
        return
    for line in render_status(snap):
        click.echo(line)
