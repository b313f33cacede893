"""The standard-library .xlsx reader of msprof-analyze compare's workbook (``profwatch.changes.msprof_compare.read_xlsx``):
a well-formed workbook, and hostile ones (a zip bomb, cell references that allocate millions of empty cells, bad
row numbers) refused with WorkbookError in bounded memory."""

from __future__ import annotations

import tracemalloc
import zipfile
from pathlib import Path

import pytest

from profwatch.changes.msprof_compare import MAX_XLSX_UNPACKED_BYTES, WorkbookError, read_xlsx

NS = "http://schemas.openxmlformats.org/spreadsheetml/2006/main"
RELS = ('<Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships">'
        '<Relationship Id="rId1" Target="worksheets/sheet1.xml"/></Relationships>')
BOOK = (f'<workbook xmlns="{NS}" xmlns:r="http://schemas.openxmlformats.org/officeDocument/2006/relationships">'
        '<sheets><sheet name="KernelCompare" sheetId="1" r:id="rId1"/></sheets></workbook>')
SHARED = f'<sst xmlns="{NS}"><si><t>Kernel</t></si><si><r><t>Mat</t></r><r><t>Mul</t></r></si></sst>'


def workbook(path: Path, sheet_data: str, *, rels: str = RELS, book: str = BOOK) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("xl/_rels/workbook.xml.rels", rels)
        z.writestr("xl/workbook.xml", book)
        z.writestr("xl/sharedStrings.xml", SHARED)
        z.writestr("xl/worksheets/sheet1.xml", f'<worksheet xmlns="{NS}"><sheetData>{sheet_data}'
                                               "</sheetData></worksheet>")
    return path


def test_a_workbook_reads_its_cells(tmp_path: Path) -> None:
    rows = ('<row r="1"><c r="A1" t="s"><v>0</v></c><c r="C1" t="inlineStr"><is><t>x</t></is></c></row>'
            '<row r="3"><c r="A3" t="s"><v>1</v></c><c r="B3"><v>2.5</v></c><c t="b"><v>1</v></c>'
            '<c r="E3" t="s"><v>9</v></c></row>')
    assert read_xlsx(workbook(tmp_path / "w.xlsx", rows)) == {
        "KernelCompare": [["Kernel", None, "x"], [], ["MatMul", 2.5, True, None, None]]}


@pytest.mark.parametrize("rows", [
    '<row r="x"><c r="A1"><v>1</v></c></row>',  # a row number that is not one
    '<row r="0"><c r="A1"><v>1</v></c></row>',
    '<row r="1048577"><c r="A1"><v>1</v></c></row>',  # past the sheet's last row
    '<row r="1"><c r="AAAA1"><v>1</v></c></row>',  # past column XFD
    '<row r="1"><c r="A1" t="s"><v>first</v></c></row>',  # a shared-string index that is not one
    "".join(f'<row r="{r}"><c r="XFD{r}"><v>1</v></c></row>' for r in range(1, 200)),  # 3.3M padded cells
])
def test_hostile_cell_data_is_a_workbook_error(tmp_path: Path, rows: str) -> None:
    with pytest.raises(WorkbookError):
        read_xlsx(workbook(tmp_path / "w.xlsx", rows))


def test_a_zip_bomb_is_refused_before_it_unpacks(tmp_path: Path) -> None:
    rels = RELS.replace("</Relationships>",
                        '<Relationship Id="rId2" Target="worksheets/sheet2.xml"/></Relationships>')
    book = BOOK.replace("</sheets>", '<sheet name="Bomb" sheetId="2" r:id="rId2"/></sheets>')
    path = workbook(tmp_path / "bomb.xlsx", "", rels=rels, book=book)
    with zipfile.ZipFile(path, "a", zipfile.ZIP_DEFLATED) as z, z.open("xl/worksheets/sheet2.xml", "w") as f:
        f.write(f'<worksheet xmlns="{NS}"><sheetData>'.encode())
        chunk = b" " * 2**20
        for _ in range(MAX_XLSX_UNPACKED_BYTES // len(chunk) + 1):
            f.write(chunk)
        f.write(b"</sheetData></worksheet>")
    assert path.stat().st_size < 2 * 2**20
    tracemalloc.start()
    try:
        with pytest.raises(WorkbookError, match="unpack"):
            read_xlsx(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 * 2**20
