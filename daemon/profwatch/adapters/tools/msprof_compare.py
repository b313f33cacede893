"""Run ``msprof-analyze compare`` on one rank of a capture against the same rank of its reference and read its
result workbook (I/O: subprocess through :class:`MsprofRunner`, files).

Command (msprof-analyze 26.2.0 ``cli/compare_cli.py``; docs/msprof-analyze.md#compare)::

    msprof-analyze compare -d NOW_RANK_DIR -bp REFERENCE_RANK_DIR --enable_operator_compare
        --enable_communication_compare --enable_kernel_compare --enable_profiling_compare
        --disable_details --disable_module --force -o OUT

``--disable_details`` leaves out the per-instance sheets (one row per operator call: the large part of the
workbook), ``--disable_module`` keeps the operator-level statistic when the capture has Python stacks (else it
would give per-module sheets instead). The tool exits 0 even when it fails (it logs the error); the outcome is
whether ``OUT/performance_comparison_result_*.xlsx`` exists. The workbook (written by xlsxwriter) is read with the
standard library (zipfile + ElementTree: Office Open XML SpreadsheetML, ECMA-376 Part 1 section 18): no
spreadsheet package is needed. The interpretation of its sheets is pure:
``daemon/profwatch/core/verdict/change_detail.py``.
"""

from __future__ import annotations

import re
import time
import zipfile
from pathlib import Path
from typing import Any
from xml.etree import ElementTree as ET

from profwatch.adapters.tools.msprof_runner import MsprofRunner, RunTicket, SpawnFailed
from profwatch.core.verdict.change_detail import Sheets
from profwatch.core.verdict.evidence import RecipeState, RecipeStatus

COMPARE_FLAGS = ("--enable_operator_compare", "--enable_communication_compare", "--enable_kernel_compare",
                 "--enable_profiling_compare", "--disable_details", "--disable_module", "--force")
"""The flags of every compare run (module docstring)."""
RESULT_GLOB = "performance_comparison_result_*.xlsx"
MAX_XLSX_BYTES = 64 * 2**20
"""A workbook above this is not read (the summary sheets of one rank pair are a few hundred KB)."""
_NS = "{http://schemas.openxmlformats.org/spreadsheetml/2006/main}"
_REL_NS = "{http://schemas.openxmlformats.org/officeDocument/2006/relationships}"
_CELL_RE = re.compile(r"^([A-Z]+)(\d+)$")


class WorkbookError(ValueError):
    """The file is not a readable .xlsx workbook."""


def _col_index(ref: str) -> int:
    m = _CELL_RE.match(ref or "")
    if not m:
        raise WorkbookError(f"bad cell reference {ref!r}")
    n = 0
    for ch in m.group(1):
        n = n * 26 + (ord(ch) - 64)
    return n - 1


def read_xlsx(path: Path) -> dict[str, list[list[Any]]]:
    """Every sheet of an .xlsx workbook: sheet name -> rows (from row 1, empty rows as []), each row its cells from
    column A (None where empty; numbers as float, shared and inline strings as str, booleans as bool).

    Raises:
        WorkbookError: not a zip, a missing part, malformed XML, or above :data:`MAX_XLSX_BYTES`.
        OSError: the file cannot be read.
    """
    if Path(path).stat().st_size > MAX_XLSX_BYTES:
        raise WorkbookError(f"{path}: larger than {MAX_XLSX_BYTES} bytes")
    try:
        with zipfile.ZipFile(path) as z:
            names = set(z.namelist())
            shared: list[str] = []
            if "xl/sharedStrings.xml" in names:
                for si in ET.fromstring(z.read("xl/sharedStrings.xml")).iter(f"{_NS}si"):
                    shared.append("".join(t.text or "" for t in si.iter(f"{_NS}t")))
            rels = {r.get("Id"): r.get("Target", "") for r in ET.fromstring(z.read("xl/_rels/workbook.xml.rels"))}
            out: dict[str, list[list[Any]]] = {}
            for sheet in ET.fromstring(z.read("xl/workbook.xml")).iter(f"{_NS}sheet"):
                target = rels.get(sheet.get(f"{_REL_NS}id"), "")
                part = target.lstrip("/") if target.startswith("/") else f"xl/{target}"
                out[str(sheet.get("name"))] = _sheet_rows(z.read(part), shared)
            return out
    except (zipfile.BadZipFile, KeyError, ET.ParseError) as exc:
        raise WorkbookError(f"{path}: {exc}") from exc


def _sheet_rows(xml: bytes, shared: list[str]) -> list[list[Any]]:
    rows: list[list[Any]] = []
    for row in ET.fromstring(xml).iter(f"{_NS}row"):
        r = int(row.get("r") or len(rows) + 1)
        while len(rows) < r - 1:
            rows.append([])
        cells: list[Any] = []
        for c in row.iter(f"{_NS}c"):
            i = _col_index(c.get("r") or "")
            cells.extend([None] * (i + 1 - len(cells)))
            t, v = c.get("t"), c.find(f"{_NS}v")
            if t == "inlineStr":
                cells[i] = "".join(x.text or "" for x in c.iter(f"{_NS}t"))
            elif v is None or v.text is None:
                cells[i] = None
            elif t == "s":
                k = int(v.text)
                cells[i] = shared[k] if 0 <= k < len(shared) else None
            elif t == "b":
                cells[i] = v.text == "1"
            elif t in ("str", "e"):
                cells[i] = v.text
            else:
                try:
                    cells[i] = float(v.text)
                except ValueError:
                    cells[i] = v.text
        rows.append(cells)
    return rows


def compare_rank(runner: MsprofRunner, now_dir: Path, reference_dir: Path, out_root: Path, *, name: str,
                 ticket: RunTicket | None = None) -> tuple[Sheets | None, RecipeStatus]:
    """One ``msprof-analyze compare`` of ``now_dir`` against ``reference_dir`` (two rank dirs) in the enrich
    phase of ``runner`` (its timeout, memory cap and lower priority), output under ``out_root``. Returns the
    workbook's sheets (None when the run left none) and the run's status (``ok``, ``timeout``, ``oom``,
    ``tool_error`` with the log tail). Never raises for tool failures."""
    t0 = time.monotonic()
    args = ["compare", "-d", str(Path(now_dir).absolute()), "-bp", str(Path(reference_dir).absolute()),
            *COMPARE_FLAGS]
    try:
        run = runner.run(name, args, out_root, ticket=ticket, phase="enrich")
    except SpawnFailed as exc:
        return None, RecipeStatus(name, "tool_error", f"cannot start msprof-analyze: {exc}", phase="enrich",
                                  duration_s=round(time.monotonic() - t0, 3))
    def status(state: RecipeState, detail: str, *, tables: list[str] | None = None, rows: int = 0) -> RecipeStatus:
        return RecipeStatus(name, state, detail, tables=tables or [], rows=rows, output_dir=str(run.output_dir),
                            log_tail="" if state == "ok" else run.log_tail(), duration_s=round(run.duration_s, 3),
                            returncode=run.returncode, phase="enrich", peak_rss_bytes=run.peak_rss_bytes or None)

    if run.oom:
        return None, status("oom", run.oom_detail)
    if run.timed_out:
        return None, status("timeout", run.cancel_reason or f"timed out after {runner.settings.timeout_s:g} s")
    found = sorted(run.output_dir.glob(RESULT_GLOB))
    if not found:
        return None, status("tool_error", "msprof-analyze compare wrote no result workbook")
    try:
        sheets = read_xlsx(found[-1])
    except (WorkbookError, OSError) as exc:
        return None, status("tool_error", f"unreadable result workbook: {exc}")
    return sheets, status("ok", f"{found[-1].name}: sheets {', '.join(sheets)}", tables=list(sheets),
                          rows=sum(len(r) for r in sheets.values()))
