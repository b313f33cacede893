"""Parse msprof-analyze 26.2.0 outputs (cluster_analysis.db rows, ``--agent`` JSON) into evidence (pure).

Callers read the tables (``daemon/profwatch/adapters/tools/msprof_db.py``, read-only) and pass rows as mappings keyed by column
name. Everything is parsed **by column name**, never by position or declared type: recipe tables come from
pandas ``to_sql`` so column types vary between runs (docs/msprof-analyze.md#result-tables).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from profwatch.core.verdict.evidence import RankStepSummary

#: columns of ClusterTimeSummary (µs) -> RankStepSummary field (docs/msprof-analyze.md#cluster-time-summary)
CLUSTER_TIME_SUMMARY_COLUMNS: dict[str, str] = {
    "stepTime": "step_time_us",
    "computation": "computation_us",
    "communication": "communication_us",
    "communicationWaitStageTime": "wait_us",
    "communicationTransmitStageTime": "transmit_us",
    "free": "free_us",
}
SLOW_OP_STAT_COLUMNS = ("Count", "MeanNs", "StdNs", "MinNs", "Q1Ns", "MedianNs", "Q3Ns", "MaxNs", "SumNs")
_ADVISOR_MAX_ROWS = 256
_ADVISOR_TEXT_CHARS = 600
_RANK_IN_TITLE = re.compile(r"Rank\s*(\d+)", re.IGNORECASE)


class ResultParseError(ValueError):
    """A result table or agent message lacks what msprof-analyze 26.2.0 always writes (e.g. a key column)."""


def _num(value: Any, default: float = 0.0) -> float:
    """Tolerant float: None/NaN/'' -> ``default``; numeric strings accepted (pandas-inferred TEXT columns)."""
    if value is None or value == "":
        return default
    try:
        out = float(value)
    except (TypeError, ValueError):
        return default
    return default if math.isnan(out) else out


def _int(value: Any) -> int:
    out = _num(value, default=math.nan)
    if math.isnan(out):
        raise ResultParseError(f"not an integer: {value!r}")
    return int(out)


def parse_cluster_time_summary(rows: Iterable[Mapping[str, Any]]) -> list[RankStepSummary]:
    """ClusterTimeSummary rows -> RankStepSummary list (µs), sorted by (rank, step).

    Source: docs/msprof-analyze.md#cluster-time-summary (all values µs; missing sources are zero-filled by the tool, so a
    missing column here is read as 0). Raises ResultParseError if ``rank`` or ``step`` is missing or not an int.
    """
    out: list[RankStepSummary] = []
    for row in rows:
        if "rank" not in row or "step" not in row:
            raise ResultParseError(f"ClusterTimeSummary row without rank/step: {sorted(row)}")
        values = {dst: _num(row.get(src)) for src, dst in CLUSTER_TIME_SUMMARY_COLUMNS.items()}
        out.append(RankStepSummary(rank=_int(row["rank"]), step=_int(row["step"]), **values))
    out.sort(key=lambda s: (s.rank, s.step))
    return out


def parse_slow_rank(rows: Iterable[Mapping[str, Any]]) -> dict[int, int]:
    """SlowRank rows (``rankId``, ``slowAffectCount``) -> {rank: votes}; only ranks with >= 1 vote
    (docs/msprof-analyze.md#slow-rank)."""
    votes: dict[int, int] = {}
    for row in rows:
        if "rankId" not in row:
            raise ResultParseError(f"SlowRank row without rankId: {sorted(row)}")
        count = int(_num(row.get("slowAffectCount")))
        if count > 0:
            rank = _int(row["rankId"])
            votes[rank] = votes.get(rank, 0) + count
    return votes


def parse_slow_op_stats(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """SlowOpStats rows -> dicts keeping msprof-analyze's column names.

    ``SlowRank`` (TEXT, comma-joined) becomes ``slow_ranks: list[int]``; the ``*Ns`` columns are kept as named
    but hold **µs** (unit bug, docs/msprof-analyze.md#result-tables); ``Timestamp`` is ns. Rows sorted by Timestamp.
    """
    out: list[dict[str, Any]] = []
    for row in rows:
        ranks_text = str(row.get("SlowRank", "") or "")
        item: dict[str, Any] = {
            "slow_ranks": [int(p) for p in re.split(r"[,\s]+", ranks_text.strip("()[] ")) if p.strip().isdigit()],
            "OpName": str(row.get("OpName", "")),
            "GroupName": str(row.get("GroupName", "")),
            "Timestamp": int(_num(row.get("Timestamp"))),
        }
        item.update({col: _num(row.get(col)) for col in SLOW_OP_STAT_COLUMNS})
        out.append(item)
    out.sort(key=lambda r: r["Timestamp"])
    return out


def parse_rank_device_map(rows: Iterable[Mapping[str, Any]]) -> dict[int, str]:
    """RankDeviceMap rows (``rankId``, ``profilePath``) -> {rank: rank dir the tool used}
    (docs/msprof-analyze.md#result-tables)."""
    return {_int(r["rankId"]): str(r.get("profilePath", "")) for r in rows if "rankId" in r}


@dataclass(frozen=True, slots=True)
class AgentMessage:
    """The one JSON line ``--agent`` prints on stdout (docs/msprof-analyze.md#agent-json). ``found`` is False when none parsed."""

    found: bool
    status: str = ""
    code: int | None = None
    message: dict[str, Any] = field(default_factory=dict)
    log_path: str = ""

    @property
    def tables(self) -> list[str]:
        tables = self.message.get("tables")
        return [str(t) for t in tables] if isinstance(tables, list) else []

    @property
    def error(self) -> str:
        err = self.message.get("err")
        return str(err) if err else ""


def parse_agent_stdout(stdout: str) -> AgentMessage:
    """Find the last JSON object line with a ``status`` key in ``stdout`` (advisor also prints a table).

    Source: docs/msprof-analyze.md#agent-json (keys status, code, message, suggestion, log_path). Never raises: no JSON ->
    ``AgentMessage(found=False)``.
    """
    for line in reversed(stdout.splitlines()):
        line = line.strip()
        if not (line.startswith("{") and line.endswith("}")):
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict) and "status" in obj:
            msg = obj.get("message")
            code = obj.get("code")
            return AgentMessage(found=True, status=str(obj.get("status", "")),
                                code=int(code) if isinstance(code, (int, float)) else None,
                                message=msg if isinstance(msg, dict) else {}, log_path=str(obj.get("log_path", "")))
    return AgentMessage(found=False)


def _sheet(message: Mapping[str, Any], *names: str) -> dict[str, Any] | None:
    for name in names:
        sheet = message.get(name)
        if isinstance(sheet, dict) and isinstance(sheet.get("headers"), list):
            return sheet
    return None


def _sheet_rows(sheet: Mapping[str, Any]) -> list[dict[str, Any]]:
    headers = [str(h) for h in sheet.get("headers", [])]
    data = sheet.get("data") or []
    return [dict(zip(headers, row, strict=False)) for row in data[:_ADVISOR_MAX_ROWS] if isinstance(row, list)]


def summarize_advisor(message: Mapping[str, Any]) -> dict[str, Any]:
    """Compact ``advisor all --agent`` message (sheets ``{name: {headers, data}}``,
    docs/msprof-analyze.md#agent-json and #advisor).

    Returns ``{"problems": [{"category", "description"}], "slow_rank": [{step, rank_id, compute(us), ...}],
    "slow_link": [...], "comparisons": [sheet/problem titles naming ranks], "max_compute_rank": int | None,
    "ranks_named": [ranks named in problem titles], "sheets": [all sheet names]}``. English (``-l en``) and
    Chinese sheet names are both accepted; descriptions are cut to 600 characters; tables to 256 rows.
    ``max_compute_rank`` is the rank with the largest summed ``compute(us)`` in the slow-rank sheet, the rank
    advisor picks for its computation deep dive.
    """
    sheets = sorted(k for k, v in message.items() if isinstance(v, dict) and "headers" in v)
    problems_sheet = _sheet(message, "problems", "问题综述")
    problems: list[dict[str, str]] = []
    if problems_sheet:
        for row in _sheet_rows(problems_sheet):
            values = list(row.values())
            category = str(row.get("category", values[0] if values else ""))
            desc = str(row.get("description", values[1] if len(values) > 1 else ""))
            problems.append({"category": " ".join(category.split()),
                             "description": " ".join(desc.split())[:_ADVISOR_TEXT_CHARS]})
    slow_rank_sheet = _sheet(message, "slow rank", "慢卡分析")
    slow_rank = _sheet_rows(slow_rank_sheet) if slow_rank_sheet else []
    slow_link_sheet = _sheet(message, "slow link", "慢链路分析")
    compute: dict[int, float] = {}
    for row in slow_rank:
        vals = list(row.values())
        rank = row.get("rank_id", vals[1] if len(vals) > 1 else None)
        value = row.get("compute(us)", vals[2] if len(vals) > 2 else None)
        if rank is not None:
            try:
                compute[int(rank)] = compute.get(int(rank), 0.0) + _num(value)
            except (TypeError, ValueError):
                continue
    titles = [p["category"] for p in problems if "compare" in p["category"].lower()]
    titles += [s for s in sheets if s.lower().startswith(("api compare", "kernel compare"))]
    named = sorted({int(m) for p in problems for m in _RANK_IN_TITLE.findall(p["category"])})
    return {
        "problems": problems,
        "slow_rank": slow_rank,
        "slow_link": _sheet_rows(slow_link_sheet) if slow_link_sheet else [],
        "comparisons": sorted(set(titles)),
        "max_compute_rank": max(compute, key=lambda r: compute[r]) if compute else None,
        "ranks_named": named,
        "sheets": sheets,
    }


def common_steps(summaries: Iterable[RankStepSummary]) -> list[int]:
    """Steps present for every rank in ``summaries`` (docs/field-cases.md#fc-12), sorted; -1 (no STEP_TIME) included if common."""
    by_rank: dict[int, set[int]] = {}
    for s in summaries:
        by_rank.setdefault(s.rank, set()).add(s.step)
    if not by_rank:
        return []
    return sorted(set.intersection(*by_rank.values()))
