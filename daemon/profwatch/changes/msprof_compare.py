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
``daemon/profwatch/core/changes/detail.py``.
"""

from __future__ import annotations

import re
import time
import zipfile
import zlib
from pathlib import Path
from typing import IO, Any
from xml.etree import ElementTree as ET

from profwatch.adapters.fs.staging import tool_safe_dirs
from profwatch.adapters.tools.msprof_runner import MsprofRunner, RunTicket, SpawnFailed
from profwatch.core.changes.detail import Sheets
from profwatch.core.verdict.evidence import RecipeState, RecipeStatus

COMPARE_FLAGS = ("--enable_operator_compare", "--enable_communication_compare", "--enable_kernel_compare",
                 "--enable_profiling_compare", "--disable_details", "--disable_module", "--force")
"""The flags of every compare run (module docstring)."""
RESULT_GLOB = "performance_comparison_result_*.xlsx"
MAX_XLSX_BYTES = 64 * 2**20
"""A workbook above this is not read (the summary sheets of one rank pair are a few hundred KB)."""
MAX_XLSX_UNPACKED_BYTES = 256 * 2**20
"""The parts read from a workbook may unpack to this much in all (sizes from the zip directory, which also bound
what is decompressed): a small zip that unpacks to gigabytes (a zip bomb) is refused before it is read."""
MAX_XLSX_CELLS = 2_000_000
"""Cells a workbook's sheets may hold in all, counting the empty cells and rows its cell references skip to: a
reference such as ``XFD1048576`` in a tiny sheet would otherwise allocate millions of them."""
MAX_ROW = 1_048_576
MAX_COL = 16_384
"""A worksheet's rows and columns (ECMA-376 Part 1 section 18.3.1.73 and 18.3.1.4 reference ranges: rows 1 to
1,048,576, columns A to XFD)."""
_NS = "{http://schemas.openxmlformats.org/spreadsheetml/2006/main}"
_REL_NS = "{http://schemas.openxmlformats.org/officeDocument/2006/relationships}"
_CELL_RE = re.compile(r"^([A-Z]+)(\d+)$")


class WorkbookError(ValueError):
    """The file is not a readable .xlsx workbook."""


def _col_index(ref: str) -> int:
    m = _CELL_RE.match(ref or "")
    if not m:
        raise WorkbookError(f"bad cell reference {ref!r}")
    if len(m.group(1)) > 3:
        raise WorkbookError(f"cell reference {ref!r} beyond column XFD")
    n = 0
    for ch in m.group(1):
        n = n * 26 + (ord(ch) - 64)
    if n > MAX_COL:
        raise WorkbookError(f"cell reference {ref!r} beyond column XFD")
    return n - 1


class _Budget:
    """Cells left to allocate over a workbook's sheets (:data:`MAX_XLSX_CELLS`)."""

    def __init__(self) -> None:
        self.left = MAX_XLSX_CELLS

    def take(self, n: int) -> None:
        self.left -= n
        if self.left < 0:
            raise WorkbookError(f"more than {MAX_XLSX_CELLS} cells (empty ones included)")


def read_xlsx(path: Path) -> dict[str, list[list[Any]]]:
    """Every sheet of an .xlsx workbook: sheet name -> rows (from row 1, empty rows as []), each row its cells from
    column A (None where empty; numbers as float, shared and inline strings as str, booleans as bool). Sheets are
    parsed as they unpack (``iterparse``, each row cleared once read): memory follows the cells, not the XML.

    Raises:
        WorkbookError: not a zip, a missing part, malformed XML or cell data, above :data:`MAX_XLSX_BYTES`, parts
            unpacking to more than :data:`MAX_XLSX_UNPACKED_BYTES`, or more than :data:`MAX_XLSX_CELLS` cells.
        OSError: the file cannot be read.
    """
    if Path(path).stat().st_size > MAX_XLSX_BYTES:
        raise WorkbookError(f"{path}: larger than {MAX_XLSX_BYTES} bytes")
    try:
        with zipfile.ZipFile(path) as z:
            unpacked = [0]

            def part(name: str) -> IO[bytes]:
                unpacked[0] += z.getinfo(name).file_size  # zipfile stops a member's output at this size
                if unpacked[0] > MAX_XLSX_UNPACKED_BYTES:
                    raise WorkbookError(f"{path}: its parts unpack to more than {MAX_XLSX_UNPACKED_BYTES} bytes")
                return z.open(name)

            names = set(z.namelist())
            budget = _Budget()
            shared: list[str] = []
            if "xl/sharedStrings.xml" in names:
                with part("xl/sharedStrings.xml") as f:
                    for _, si in ET.iterparse(f):
                        if si.tag == f"{_NS}si":
                            budget.take(1)
                            shared.append("".join(t.text or "" for t in si.iter(f"{_NS}t")))
                            si.clear()
            with part("xl/_rels/workbook.xml.rels") as f:
                rels = {r.get("Id"): r.get("Target", "") for r in ET.parse(f).getroot()}
            with part("xl/workbook.xml") as f:
                sheets = [(str(sh.get("name")), rels.get(sh.get(f"{_REL_NS}id"), ""))
                          for sh in ET.parse(f).getroot().iter(f"{_NS}sheet")]
            out: dict[str, list[list[Any]]] = {}
            for name, target in sheets:
                member = target.lstrip("/") if target.startswith("/") else f"xl/{target}"
                with part(member) as f:
                    out[name] = _sheet_rows(f, shared, budget)
            return out
    except (zipfile.BadZipFile, KeyError, ET.ParseError, ValueError, EOFError,
            NotImplementedError, RuntimeError, zlib.error) as exc:
        if isinstance(exc, WorkbookError):
            raise
        raise WorkbookError(f"{path}: {exc}") from exc


def _sheet_rows(f: IO[bytes], shared: list[str], budget: _Budget) -> list[list[Any]]:
    rows: list[list[Any]] = []
    parent: ET.Element | None = None
    for event, row in ET.iterparse(f, events=("start", "end")):
        if event == "start":
            if row.tag == f"{_NS}sheetData":
                parent = row
            continue
        if row.tag != f"{_NS}row":
            continue
        r = int(row.get("r") or len(rows) + 1)
        if not 1 <= r <= MAX_ROW:
            raise WorkbookError(f"row {r} outside 1..{MAX_ROW}")
        budget.take(max(0, r - 1 - len(rows)) + 1)
        while len(rows) < r - 1:
            rows.append([])
        cells: list[Any] = []
        for c in row.iter(f"{_NS}c"):
            ref = c.get("r")
            i = _col_index(ref) if ref else len(cells)  # r is optional: the next column
            budget.take(max(0, i + 1 - len(cells)))
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
        row.clear()
        if parent is not None and len(parent) and parent[0] is row:
            parent.remove(row)  # read: the tree keeps no rows
    return rows


def compare_rank(runner: MsprofRunner, now_dir: Path, reference_dir: Path, out_root: Path, *, name: str,
                 ticket: RunTicket | None = None) -> tuple[Sheets | None, RecipeStatus]:
    """One ``msprof-analyze compare`` of ``now_dir`` against ``reference_dir`` (two rank dirs) in the enrich
    phase of ``runner`` (its timeout, memory cap and lower priority), output under ``out_root``. Returns the
    workbook's sheets (None when the run left none) and the run's status (``ok``, ``timeout``, ``cancelled``, ``oom``,
    ``tool_error`` with the log tail). A rank dir whose path the tool cannot take (not ASCII, a byte that is not
    UTF-8: it wrote a workbook without sheets) is given to it as links under ``out_root``
    (``staging.tool_safe_dirs``), the user's files untouched. Never raises for tool failures."""
    t0 = time.monotonic()
    try:
        with tool_safe_dirs([now_dir, reference_dir], out_root) as (now_in, ref_in):
            run = runner.run(name, ["compare", "-d", str(now_in), "-bp", str(ref_in), *COMPARE_FLAGS], out_root,
                             ticket=ticket, phase="enrich")
    except SpawnFailed as exc:
        return None, RecipeStatus(name, "tool_error", f"cannot start msprof-analyze: {exc}", phase="enrich",
                                  duration_s=round(time.monotonic() - t0, 3))
    except OSError as exc:
        return None, RecipeStatus(name, "tool_error", f"cannot link the rank dirs for msprof-analyze: {exc}",
                                  phase="enrich", duration_s=round(time.monotonic() - t0, 3))
    def status(state: RecipeState, detail: str, *, tables: list[str] | None = None, rows: int = 0) -> RecipeStatus:
        return RecipeStatus(name, state, detail, tables=tables or [], rows=rows, output_dir=str(run.output_dir),
                            log_tail="" if state == "ok" else run.log_tail(), duration_s=round(run.duration_s, 3),
                            returncode=run.returncode, phase="enrich", peak_rss_bytes=run.peak_rss_bytes or None)

    if run.oom:
        return None, status("oom", run.oom_detail)
    if run.cancelled:
        return None, status("cancelled", run.cancel_reason or "cancelled")
    if run.timed_out:
        return None, status("timeout", f"timed out after {runner.settings.timeout_s:g} s")
    found = sorted(run.output_dir.glob(RESULT_GLOB))
    if not found:
        return None, status("tool_error", "msprof-analyze compare wrote no result workbook")
    try:
        sheets = read_xlsx(found[-1])
    except (WorkbookError, OSError) as exc:
        return None, status("tool_error", f"unreadable result workbook: {exc}")
    return sheets, status("ok", f"{found[-1].name}: sheets {', '.join(sheets)}", tables=list(sheets),
                          rows=sum(len(r) for r in sheets.values()))
