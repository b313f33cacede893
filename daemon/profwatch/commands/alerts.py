"""``profwatch alerts``: stored recent alerts, then (``--follow``) new ones as they are published (CLI body).

Online: the coordinator's ``events`` command, and with ``--follow`` its PUB socket (subscribed *before* the
history is fetched, then deduplicated by event id, so nothing published in between is lost: ZeroMQ PUB drops
what was sent before a SUB connected). Offline (the coordinator does not answer): the same stored events read
from its state db, read-only and as far as the file's permissions allow this user
(``daemon/profwatch/adapters/store/state_reader.py``), with a note on stderr that they come from the store.

Exit codes (``daemon/profwatch/exitcodes.py``): 0 alerts shown (online, or offline from the store); 2 bad config;
3 the coordinator is unavailable and its store cannot be read, or ``--follow`` while it is down.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import click

from profwatch.commands.common import (
    CoordinatorClient,
    client_keys_or_exit,
    config_option,
    connectable_or_exit,
    load_or_exit,
    unavailable_hint,
)
from profwatch.core.alerts.alertmanager import VERDICT_TYPES
from profwatch.core.alerts.event_types import (
    ANOMALY_TYPES,
    TYPE_ANALYSIS_ENRICHED,
    TYPE_ARM,
    TYPE_ARM_DECISION,
    TYPE_BATCH,
    TYPE_BATCH_INCOMPLETE,
    TYPE_CAPTURE,
    TYPE_CULPRIT_ROTATES,
    TYPE_EPISODE_CLOSED,
    TYPE_EPISODE_OPENED,
    TYPE_EPISODE_UPDATED,
    TYPE_JOB_ENDED,
    TYPE_SUSPECT_RANKS,
    display_name,
)
from profwatch.core.messages import CONTROL_RE
from profwatch.core.status_text import wait_phrase
from profwatch.exitcodes import EXIT_UNAVAILABLE
from profwatch.signals import handling


def _saving(impact: Any) -> str:
    """``", saves 12.3 ms/step (8.1% of the mean step)"`` from a suspect's ``impact`` (empty when it has none)."""
    if not isinstance(impact, dict) or not isinstance(impact.get("saving_s_per_step"), (int, float)):
        return ""
    pct = impact.get("saving_pct_of_step")
    return f", saves {1e3 * impact['saving_s_per_step']:.1f} ms/step" + (
        f" ({pct:.1f}% of the mean step)" if isinstance(pct, (int, float)) else "")


def _suspects(d: dict[str, Any]) -> str:
    """The verdict part of a line: status, then each suspect with its kind, score, host, saving and rank dir (the
    same facts as the JSON's ``suspects[i]``), or the detail when nobody is named."""
    sus = d.get("suspects")
    status = d.get("status", "")
    if not sus:
        what = "cannot judge" if status == "not_applicable" else "no suspect"
        return f" {status}: {what}" + (f" ({d['detail']})" if d.get("detail") else "")
    return f" {status}: suspects " + ", ".join(
        f"rank {x['rank']} ({x['kind']}, score {x['score']:.2f}, {x.get('hostname') or 'host unknown'}"
        f"{_saving(x.get('impact'))}" + (f", dir {x['rank_dir']}" if x.get("rank_dir") else "") + ")" for x in sus) + (
        f" ({d['detail']})" if status == "weak" and d.get("detail") else  # why the evidence is weak
        f" ({_armed_for(str(d.get('detail') or ''))})" if _armed_for(str(d.get("detail") or "")) else "")


def _armed_for(detail: str) -> str:
    """The part of an ``ok`` detail from ``"armed for"`` on: the capture names none of the ranks detection armed it
    for (``profwatch.analysis.result.named_elsewhere_note``); ``""`` when the detail has none."""
    at = detail.find("; armed for ")
    return detail[at + 2:] if at >= 0 else ""


def _episode_text(t: str, d: dict[str, Any]) -> str:
    """What an ``episode_opened``/``_updated``/``_closed`` line says after its job: the episode, its ranks or
    job-wide, its size and step; a follow-up's text; how a closed one ended and whether it was captured."""
    ranks = f"ranks={d.get('ranks')}" if d.get("ranks") else "job-wide"
    out = f" {d.get('episode_id')} {d.get('kind')} {ranks} {float(d.get('magnitude') or 0):+.0%} step {d.get('step')}"
    if t == TYPE_EPISODE_UPDATED and d.get("reason") == "follow_up":
        out += f": {d.get('text')}"
    if t == TYPE_EPISODE_CLOSED:
        caps = [c for c in d.get("captures") or [] if isinstance(c, dict)]
        tried = ", ".join(f"{c.get('capture_id')} ({c.get('status') or 'in flight'})" for c in caps)
        out += f" closed ({d.get('reason')}): " + (
            "captured" if d.get("captured") else f"no capture analysed (captures: {tried})" if caps else
            "never captured" + (f" ({wait_phrase(str(d['waited_for']), past=True)})" if d.get("waited_for") else ""))
    return out


def _job_ended_text(d: dict[str, Any]) -> str:
    """What a ``job_ended`` line says after its job: the generation and why, in words (``core/fleet/job_end.py``)."""
    if d.get("reason") == "all_ranks_left":
        return f" generation {d.get('generation')}: every rank said bye"
    silent = d.get("silent_s")
    return f" generation {d.get('generation')}: no rank reported" + (
        f" (silent {float(silent):.0f} s)" if isinstance(silent, (int, float)) else "")


def render_event(ev: dict[str, Any]) -> str:
    """One line for one CloudEvent: time, short type name (``core/alerts/event_types.py``), job, then what matters for
    that type."""
    d = ev.get("data") or {}
    t = str(ev.get("type", ""))
    line = f"{ev.get('time', '')} {display_name(t)} job={ev.get('subject')}"
    if t in (TYPE_SUSPECT_RANKS, TYPE_ANALYSIS_ENRICHED):
        if t == TYPE_ANALYSIS_ENRICHED:
            line += f" capture {d.get('capture_id')} follow-up:"
        line += _suspects(d)
        comparison = d.get("comparison")
        if isinstance(comparison, dict) and comparison.get("headline"):  # the verdict's what-changed headline
            line += f"; what changed: {comparison['headline']}"  # (core/changes/comparison.py headline_line)
        if d.get("pending_recipes"):
            line += f" (follow-up pending: {', '.join(d['pending_recipes'])})"
        if d.get("report"):
            line += f" report={d['report']}"
    elif t == TYPE_BATCH_INCOMPLETE:
        line += f" capture {d.get('capture_id')}: missing_ranks={d.get('missing_ranks')} " \
                f"problems={len(d.get('problems') or [])}"
    elif t in ANOMALY_TYPES:
        line += (f" {d.get('kind')} at step {d.get('step')} ranks={d.get('ranks')} "
                 f"+{100 * float(d.get('magnitude') or 0):.0f}%")
    elif t == TYPE_ARM_DECISION:
        line += f" {d.get('action')} ({d.get('reason')}) for {d.get('anomaly')} at step {d.get('step')}"
        if d.get("episode_id"):
            line += f" episode {d['episode_id']}" + (" (queued)" if d.get("queued") else "")
    elif t in (TYPE_EPISODE_OPENED, TYPE_EPISODE_UPDATED, TYPE_EPISODE_CLOSED):
        line += _episode_text(t, d)
    elif t == TYPE_CULPRIT_ROTATES:
        line += f" {d.get('episode_id')}: {d.get('detail')}"
    elif t == TYPE_ARM:
        line += (f" capture {d.get('capture_id')} {d.get('status')} start_step={d.get('start_step')} "
                 f"warmup={d.get('warmup')} active={d.get('active')} config={d.get('path') or d.get('error', '')}")
    elif t in (TYPE_CAPTURE, TYPE_BATCH):
        line += f" capture {d.get('capture_id')} {d.get('event')}" + (f" ranks={d['ranks']}" if "ranks" in d else "")
    elif t == TYPE_JOB_ENDED:
        line += _job_ended_text(d)
    else:  # the other alerts (collision, capture unavailable, path refused, ...) say it in detail or problems
        text = d.get("detail") or "; ".join(str(p) for p in d.get("problems") or [])
        line += (f" {d['reason']}:" if d.get("reason") else "") + (f" {str(text)[:1000]}" if text else
                                                                   " " + json.dumps(d)[:200])
    if t in VERDICT_TYPES and d.get("job_ended") is True:
        line += " (after the job ended: information, no alert)"
    # a peer's words (hostnames, details) are shown with their control characters escaped: no terminal escapes
    return CONTROL_RE.sub(lambda m: f"\\x{ord(m.group()):02x}", line)


def _echo(ev: dict[str, Any], as_json: bool) -> None:
    click.echo(json.dumps(ev) if as_json else render_event(ev))


def _offline(s: Any, coord: CoordinatorClient, args: dict[str, Any], follow: bool, as_json: bool) -> None:
    """Show the stored events from the state db; exit 3 when it cannot be read or ``--follow`` was asked."""
    from profwatch.adapters.store.state_reader import StateUnreadable, read_events

    db = s.coordinator.state_db
    click.echo(f"profwatch: no coordinator answers at {coord.endpoint}; reading its state db {db} offline "
               "(what it stored until it stopped)", err=True)
    try:
        got = read_events(db, job_id=args["job_id"], alerts_only=args["alerts_only"], limit=args["limit"])
    except StateUnreadable as exc:
        click.echo(f"profwatch: {exc}\n{unavailable_hint()}", err=True)
        sys.exit(EXIT_UNAVAILABLE)
    for note in got.notes:
        click.echo(f"profwatch: note: {note}", err=True)
    for _seq, ev in got.rows:
        _echo(ev, as_json)
    if not got.rows:
        click.echo("profwatch: the store holds no " + ("alert" if args["alerts_only"] else "event")
                   + (f" of job {args['job_id']}" if args["job_id"] else ""), err=True)
    if follow:
        click.echo(f"profwatch: cannot --follow while the coordinator is down\n{unavailable_hint()}", err=True)
        sys.exit(EXIT_UNAVAILABLE)


FOLLOW_CHECK_S = 15.0
"""``--follow`` pings the coordinator after this long without an event, so a stopped coordinator is noticed."""


@click.command("alerts")
@config_option
@click.option("--job", "job_id", help="only this job")
@click.option("--follow", "-f", is_flag=True, help="keep listening for new alerts (Ctrl-C stops)")
@click.option("--all-events", is_flag=True, help="also anomalies, arm decisions and capture progress")
@click.option("--limit", type=click.IntRange(1, 10_000), default=20, show_default=True,
              help="recent alerts fetched first")
@click.option("--json", "as_json", is_flag=True, help="one CloudEvent JSON per line")
@click.option("--check-s", type=click.FloatRange(min=0.5), default=FOLLOW_CHECK_S, show_default=True,
              help="with --follow: ping the coordinator after this many seconds without an event")
def alerts(config_path: Path | None, job_id: str | None, follow: bool, all_events: bool, limit: int,
           as_json: bool, check_s: float) -> None:
    """Print recent alerts, then (with --follow) new ones as they are published.

    When the coordinator does not answer, the stored alerts are read from its state db (read-only, if this user
    may read the file) and a note on stderr says so. Progress lines go to stderr; stdout carries only alerts.
    """
    s = load_or_exit(config_path)
    args = {"job_id": job_id, "limit": limit, "alerts_only": not all_events}
    coord = CoordinatorClient(s)
    if follow:  # the stream's endpoint is checked before anything is printed (bind-only forms: exit 2)
        connectable_or_exit("pub_bind", s.coordinator.pub_bind)
    if not coord.reachable():
        _offline(s, coord, args, follow, as_json)
        return
    sub = None
    if follow:  # subscribe first, then fetch history, then dedup by id: no gap between the two
        import zmq

        from profwatch.adapters.zmq.publish import Subscription

        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        sub = Subscription(ctx, s.coordinator.pub_bind, ["alert", "event"] if all_events else ["alert"], job_id,
                           curve=client_keys_or_exit(s, s.coordinator.pub_bind))
    seen: set[str] = set()
    try:
        rows = coord.call("events", args)
        for row in rows:
            seen.add(str(row["event"]["id"]))
            _echo(row["event"], as_json)
        if not rows:
            _say_why_empty(coord, job_id, all_events)
        if sub is None:
            return
        stop = {"flag": False}

        def on_signal(signum: int, frame: Any) -> None:
            stop["flag"] = True

        # SIGTERM and SIGINT set the flag instead of raising, so --follow ends with exit 0; installed before saying
        # "listening" (a Ctrl-C right after that line stops cleanly), and only for the follow (profwatch.signals)
        with handling(on_signal):
            what = "events" if all_events else "alerts"
            click.echo(f"profwatch: listening on {s.coordinator.pub_bind} for {what} of "
                       f"{f'job {job_id}' if job_id else 'every job'} (Ctrl-C stops)", err=True)
            _follow(sub, seen, as_json, stop, coord, args, check_s)
    finally:
        if sub is not None:
            sub.close()


def _say_why_empty(coord: CoordinatorClient, job_id: str | None, all_events: bool) -> None:
    """No stored alert: say so on stderr, and whether ``--job`` names a job the coordinator knows (a typo looks
    like a quiet job otherwise). The exit code stays 0: an empty history is an answer."""
    what = "event" if all_events else "alert"
    if job_id is None:
        click.echo(f"profwatch: no {what} stored yet", err=True)
        return
    known = any(j.get("job_id") == job_id for j in coord.call("status", {"job_id": job_id}).get("jobs", []))
    click.echo(f"profwatch: no {what} stored for job {job_id!r}" + (
        "" if known else " (the coordinator knows no such job now: check the id with `profwatch status`)"), err=True)


def _follow(sub: Any, seen: set[str], as_json: bool, stop: dict[str, bool], coord: CoordinatorClient,
            args: dict[str, Any], check_s: float = 15.0) -> None:
    """Print new events until SIGINT/SIGTERM. After ``check_s`` of quiet, ping the coordinator: say once on
    stderr when it stops answering (PUB is silent then, like a quiet job) and when it answers again; then fetch
    the stored alerts again, so nothing published around its restart is missed (ids already shown are skipped)."""
    quiet_since = time.monotonic()
    down = False
    while not stop["flag"]:
        ev = sub.recv(500)
        if ev is not None:
            quiet_since = time.monotonic()
            if str(ev.get("id")) not in seen:
                seen.add(str(ev.get("id")))
                _echo(ev, as_json)
                sys.stdout.flush()
            continue
        if time.monotonic() - quiet_since < check_s:
            continue
        quiet_since = time.monotonic()
        up = coord.reachable()
        if up == down:  # changed
            down = not up
            click.echo(f"profwatch: the coordinator at {coord.endpoint} "
                       + ("answers again" if up else "stopped answering; still listening (Ctrl-C stops)"), err=True)
            if up:
                for row in coord.call("events", args):
                    if str(row["event"]["id"]) not in seen:
                        seen.add(str(row["event"]["id"]))
                        _echo(row["event"], as_json)
                sys.stdout.flush()
