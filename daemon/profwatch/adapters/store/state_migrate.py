"""In-place migrations of the state database's captures (I/O: sqlite3; run once at open): version 1 to typed
rows, and version 3's rows to the ``idle_owed`` column.

Version 1 kept each capture as ``captures(capture_id, job_id, state, reason, created_unix_s, updated_unix_s,
plan JSON, detail JSON)``. The migration renames that table to ``captures_v1`` (kept, nothing is deleted), creates
the typed tables and converts every row in one transaction: plan keys become columns, the covered ranks become
``capture_ranks`` rows (with the version-1 acknowledgement time when there was one), node writes become
``capture_nodes`` rows. Legacy state names: ``refused`` (an arm that could not be written) becomes the failed
state, ``capturing`` the collecting state, anything unknown the failed state with the old name in ``outcome``.
Deadlines of migrated in-flight captures come from the default :class:`~profwatch.core.capture.lifecycle.LifecycleSettings`
and the plan's deadline.

Rows written before version 4 do not say whether their ending asked for the idle config; :func:`legacy_idle_owed`
derives it from what they stored, as the transitions decided it.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import replace
from typing import Any

from profwatch.adapters.store.capture_rows import CAPTURE_SCHEMA, write_capture
from profwatch.core.capture.lifecycle import (
    IDLE_ENDINGS,
    WINDOW_PENDING,
    Capture,
    CaptureState,
    LifecycleSettings,
    NodeWrite,
    RankProgress,
    deadline_for,
)

_LEGACY = {"refused": CaptureState.FAILED, "capturing": CaptureState.COLLECTING}


def _json(text: Any) -> dict[str, Any]:
    try:
        v = json.loads(text or "{}")
    except (TypeError, ValueError):
        return {}
    return v if isinstance(v, dict) else {}


def _num(v: Any, default: float) -> float:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else default


def legacy_idle_owed(state: CaptureState, analysis_status: str | None, batch_id: str | None, outcome: str) -> bool:
    """Whether a capture stored before version 4 owes the idle config, from its stored fields: superseded; failed
    before any analysis (no ``analysis_status``: the write failed or expired); cancelled while its window could
    still be pending (the state its ``outcome`` names: "cancelled by B while S", as ``lifecycle.cancel`` writes
    it; a capture resumed from analysing and cancelled while collecting keeps its ``batch_id`` and still owes
    it), or, when the outcome names no state (a version-1 row), cancelled before it had a batch (no
    ``batch_id``)."""
    if state not in IDLE_ENDINGS:
        return False
    if state is CaptureState.CANCELLED:
        was = outcome.rsplit(" while ", 1)[1].strip() if " while " in outcome else ""
        try:
            return CaptureState(was) in WINDOW_PENDING
        except ValueError:
            return batch_id is None
    return state is CaptureState.SUPERSEDED or analysis_status is None


def add_idle_owed(db: sqlite3.Connection) -> int:
    """Version 3 -> 4 in one transaction: add ``captures.idle_owed`` and set it on the rows that owe the idle config
    (:func:`legacy_idle_owed`). Returns how many rows were marked."""
    with db:
        db.execute("BEGIN IMMEDIATE")
        db.execute("ALTER TABLE captures ADD COLUMN idle_owed INTEGER NOT NULL DEFAULT 0")
        states = [s.value for s in IDLE_ENDINGS]
        rows = db.execute(f"SELECT capture_id, state, analysis_status, batch_id, outcome FROM captures WHERE state IN "
                          f"({','.join('?' * len(states))})", states).fetchall()
        owed = [(cid,) for cid, state, status, batch, outcome in rows
                if legacy_idle_owed(CaptureState(state), status, batch, outcome or "")]
        db.executemany("UPDATE captures SET idle_owed=1 WHERE capture_id=?", owed)
    return len(owed)


def convert_v1_row(row: tuple[Any, ...], parse_allowance_s: float) -> Capture:
    """One version-1 ``captures`` row -> a :class:`Capture` (never raises for odd JSON: unknown parts default)."""
    capture_id, job_id, old_state, reason, created, updated, plan_text, detail_text = row
    plan, detail = _json(plan_text), _json(detail_text)
    created = _num(created, 0.0)
    try:
        state = CaptureState(old_state)
        outcome = "migrated from state db schema 1"
    except ValueError:
        state = _LEGACY.get(str(old_state), CaptureState.FAILED)
        outcome = f"migrated from state db schema 1 (state {old_state!r})"
    if detail.get("error"):
        outcome += f": {detail['error']}"
    rank_list = plan.get("rank_list")
    rank_list = tuple(int(r) for r in rank_list) if isinstance(rank_list, list) and rank_list else None
    world = int(_num(plan.get("world_size"), len(rank_list or ()) or 1))
    window_end = _num(plan.get("deadline_unix_s"), created + 600.0)
    acked = detail.get("acknowledged")
    acked = float(acked) if isinstance(acked, (int, float)) else None
    covered = list(rank_list) if rank_list is not None else list(range(world))
    step_time = plan.get("step_time_s")
    ranks = {r: RankProgress(rank=r, step_at_plan=int(_num(plan.get("furthest_step"), -1)),
                             step_time_s=float(step_time) if isinstance(step_time, (int, float)) else None,
                             window_end_unix_s=window_end, hook_seen_unix_s=acked, tool_seen_unix_s=acked)
             for r in covered}
    total = int(_num(detail.get("total_bytes"), 0))
    if total and covered:  # version 1 kept one total per capture: it goes on the first rank
        ranks[covered[0]] = replace(ranks[covered[0]], total_bytes=total)
    nodes = {str(n): NodeWrite(str(n), f"w-{capture_id}-{n}", created,
                               ok=None if state is CaptureState.PLANNED else True)
             for n in (plan.get("nodes") or []) if isinstance(n, str)}
    written: dict[str, Any] = detail["written"] if isinstance(detail.get("written"), dict) else {}
    config: dict[str, Any] = plan["config"] if isinstance(plan.get("config"), dict) else {}
    cap = Capture(
        capture_id=str(capture_id), job_id=str(job_id), reason=str(reason or plan.get("reason") or ""), state=state,
        created_unix_s=created, state_since_unix_s=_num(updated, created), deadline_unix_s=None,
        start_step=int(_num(plan.get("start_step"), 0)), warmup=int(_num(plan.get("warmup"), 0)),
        active=int(_num(plan.get("active"), 0)), rank_list=rank_list, world_size=world,
        prof_dir=str(plan.get("prof_dir") or ""), profiler_config_path=str(plan.get("profiler_config_path") or ""),
        writer=str(plan.get("writer") or "coordinator"),
        step_time_s=float(step_time) if isinstance(step_time, (int, float)) else None,
        judge_unix_s=window_end + parse_allowance_s, config=config, ranks=ranks, nodes=nodes, written_unix_s=detail.get("written_unix_s"),
        config_mtime_s=int(written["mtime_s"]) if isinstance(written.get("mtime_s"), (int, float)) else None,
        batch_id=detail.get("batch_id"), analysis_status=detail.get("analysis_status"), outcome=outcome)
    cap = replace(cap, idle_owed=legacy_idle_owed(state, cap.analysis_status, cap.batch_id, ""))
    return replace(cap, deadline_unix_s=deadline_for(cap, state, cap.state_since_unix_s, LifecycleSettings()))


def migrate_v1_captures(db: sqlite3.Connection, parse_allowance_s: float) -> int:
    """Convert the version-1 ``captures`` table in one transaction; return how many captures were migrated."""
    with db:
        db.execute("BEGIN IMMEDIATE")
        db.execute("ALTER TABLE captures RENAME TO captures_v1")
        for stmt in CAPTURE_SCHEMA.split(";"):
            if stmt.strip():
                db.execute(stmt)
        rows = db.execute("SELECT capture_id, job_id, state, reason, created_unix_s, updated_unix_s, plan, detail "
                          "FROM captures_v1 ORDER BY created_unix_s").fetchall()
        for row in rows:
            write_capture(db, convert_v1_row(row, parse_allowance_s))
    return len(rows)
