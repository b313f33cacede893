"""The rows of msprof-analyze's ``ClusterCommunicationMatrix`` table held as compact columns (pure, no numpy).

One row per (step, op, group, source rank, destination rank) of every directed pair: ``N x (N - 1)`` rows per step
and op kind at ``N`` ranks, so 1,047,552 rows per step at 1024 ranks. Held as one dict per row they took about
470 MiB per step (`bench/bench_links_memory.py`); here each column is an ``array.array`` of 4-byte codes into its distinct values
(text columns and ranks: a few distinct values each, interned) or of 8-byte floats (sizes, times, bandwidths):
about 52 bytes per row.

Columns kept (the ones ``links.find_slow_links`` and the chunk merge read, named as the tool writes them,
``msprof_analyze/cluster_analyse/recipes/communication_matrix_sum``): :data:`CODED_COLUMNS` (``step``,
``hccl_op_name``, ``group_name``, ``transport_type``, ``op_name``, ``src_rank``, ``dst_rank``: each value kept as
read, type included) and :data:`NUMBER_COLUMNS` (``transit_size`` MB, ``transit_time`` ms, ``bandwidth`` GB/s:
read as floats, NaN where missing, infinite or not a number, which is how every reader of them took them). Other
columns of the table are not kept. A row read back (iteration, indexing) is a dict of the columns the table had.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, overload

__all__ = ["CODED_COLUMNS", "COLUMNS", "NUMBER_COLUMNS", "CodedColumn", "LinkRows"]

CODED_COLUMNS: tuple[str, ...] = ("step", "hccl_op_name", "group_name", "transport_type", "op_name", "src_rank",
                                  "dst_rank")
"""Columns held as codes into their distinct values (each value as read: ``str``, ``int``, ``float`` or None)."""
NUMBER_COLUMNS: tuple[str, ...] = ("transit_size", "transit_time", "bandwidth")
"""Columns held as 8-byte floats (NaN: missing, infinite or not a number)."""
COLUMNS: tuple[str, ...] = CODED_COLUMNS + NUMBER_COLUMNS
_NAN = math.nan  # one NaN object: NaNs read as keys are all this one (a NaN is not equal to itself)


def _float(value: Any) -> float:
    """``float(value)`` when finite, else NaN (the links module's ``_num``)."""
    try:
        x = float(value)
    except (TypeError, ValueError, OverflowError):
        return _NAN
    return x if math.isfinite(x) else _NAN


def _floats(values: list[Any]) -> array[float]:
    """``values`` through :func:`_float` (all finite floats or ints: in bulk)."""
    if set(map(type, values)) <= {float, int}:
        try:
            out = array("d", values)
        except OverflowError:
            pass
        else:
            if all(map(math.isfinite, out)):
                return out
    return array("d", map(_float, values))


class CodedColumn:
    """One column as ``codes`` (``array('i')``, one per row) into ``values`` (distinct values in first-seen order).

    Values equal under ``==`` but of another type (``1`` and ``1.0``, whose ``str`` differ) get their own code, so
    every value reads back exactly as it was given; NaN floats share one code. Raises TypeError for an unhashable
    value."""

    __slots__ = ("_by_type", "_index", "codes", "values")

    def __init__(self) -> None:
        self.codes = array("i")
        self.values: list[Any] = []
        self._index: dict[Any, int] = {}
        self._by_type: dict[tuple[type, Any], int] = {}

    def code(self, value: Any) -> int:
        """The code of ``value``, added when new."""
        if isinstance(value, float) and value != value:
            value = _NAN
        code = self._index.get(value)
        if code is not None and type(self.values[code]) is type(value):
            return code
        key = (type(value), value)
        code = self._by_type.get(key)
        if code is None:
            code = len(self.values)
            self.values.append(value)
            self._by_type[key] = code
            self._index.setdefault(value, code)
        return code

    def extend(self, values: Iterable[Any]) -> None:
        """Append one code per value (values of one type without NaN, the usual case, are looked up in bulk)."""
        values = values if isinstance(values, list) else list(values)
        kinds = set(map(type, values))
        if len(kinds) == 1:
            kind = kinds.pop()
            distinct = set(values)
            codes = [self.code(v) for v in distinct]
            if all(type(self.values[c]) is kind and self._index.get(v) == c for v, c in zip(distinct, codes,
                                                                                               strict=True)):
                self.codes.extend(map(self._index.__getitem__, values))
                return
        self.codes.extend(map(self.code, values))

    def __getitem__(self, i: int) -> Any:
        return self.values[self.codes[i]]


class LinkRows(Sequence[dict[str, Any]]):
    """``ClusterCommunicationMatrix`` rows as columns (module docstring); a read-only sequence of row dicts.

    Built empty and filled with :meth:`extend_tuples` (rows as tuples in the order of ``names``, as an SQLite cursor
    gives them), :meth:`extend_rows` (mappings) or :meth:`concat`. ``coded[name]`` / ``numbers[name]`` hold the
    columns the rows had (a column the table lacks is absent, and absent from the rows read back). Equal to another
    sequence of mappings holding the same rows (``rows == []`` when empty). Memory: 4 bytes per row per coded column,
    8 per number column, plus the distinct values.
    """

    __slots__ = ("_n", "coded", "numbers")

    def __init__(self) -> None:
        self.coded: dict[str, CodedColumn] = {}
        self.numbers: dict[str, array[float]] = {}
        self._n = 0

    @classmethod
    def from_rows(cls, rows: Iterable[Mapping[str, Any]]) -> LinkRows:
        """The rows of ``rows`` (mappings, e.g. dicts by column name) as columns; ``rows`` itself when already so."""
        if isinstance(rows, LinkRows):
            return rows
        out = cls()
        out.extend_rows(rows)
        return out

    @classmethod
    def concat(cls, parts: Iterable[LinkRows]) -> LinkRows:
        """One table of every part's rows, in order (a column missing from some parts reads as None there)."""
        parts = [p for p in parts if len(p)]
        out = cls()
        for name in CODED_COLUMNS:
            if any(name in p.coded for p in parts):
                col = out.coded[name] = CodedColumn()
                for p in parts:
                    own = p.coded.get(name)
                    if own is None:
                        col.codes.extend(array("i", [col.code(None)]) * len(p))
                    else:
                        remap = [col.code(v) for v in own.values]
                        col.codes.extend(remap[c] for c in own.codes)
        for name in NUMBER_COLUMNS:
            if any(name in p.numbers for p in parts):
                nums = out.numbers[name] = array("d")
                for p in parts:
                    nums.extend(p.numbers.get(name) or array("d", [_NAN]) * len(p))
        out._n = sum(len(p) for p in parts)
        return out

    def extend_tuples(self, names: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        """Append ``rows`` (each a tuple of values in the order of ``names``; columns not in :data:`COLUMNS` are
        left out). The first call decides the columns; a later call must name the same kept columns (ValueError)."""
        where = {n: i for i, n in enumerate(names) if n in COLUMNS}
        if self._n == 0 and not self.coded and not self.numbers:
            self.coded = {n: CodedColumn() for n in CODED_COLUMNS if n in where}
            self.numbers = {n: array("d") for n in NUMBER_COLUMNS if n in where}
        elif set(where) != set(self.coded) | set(self.numbers):
            raise ValueError(f"columns {sorted(where)} differ from the table's {sorted(self.coded) + sorted(self.numbers)}")
        if not rows:
            return
        for name, col in self.coded.items():
            i = where[name]
            col.extend(r[i] for r in rows)
        for name, nums in self.numbers.items():
            i = where[name]
            nums.extend(_floats([r[i] for r in rows]))
        self._n += len(rows)

    def extend_rows(self, rows: Iterable[Mapping[str, Any]], chunk: int = 8192) -> None:
        """Append mappings by column name (a kept column missing from a row reads as None there; the columns are
        those of the first row)."""
        batch: list[Mapping[str, Any]] = []
        for row in rows:
            batch.append(row)
            if len(batch) >= chunk:
                self._extend_mappings(batch)
                batch = []
        self._extend_mappings(batch)

    def _extend_mappings(self, rows: list[Mapping[str, Any]]) -> None:
        if not rows:
            return
        names = [n for n in COLUMNS if n in self.coded or n in self.numbers] if self._n else \
            [n for n in COLUMNS if n in rows[0]]
        self.extend_tuples(names, [tuple(r.get(n) for n in names) for r in rows])

    def ranks(self) -> set[int]:
        """Every rank named as a source or destination (values that read as a finite number, as ints)."""
        out: set[int] = set()
        for name in ("src_rank", "dst_rank"):
            col = self.coded.get(name)
            if col is None:
                continue
            used = set(col.codes)
            out |= {int(x) for x in (_float(col.values[c]) for c in used) if x == x}
        return out

    def pair_count(self) -> int:
        """Distinct ``(src_rank, dst_rank)`` values, as a set of the rows' value pairs counts them (``1 == 1.0``;
        every NaN counts as one value)."""
        if not self._n:
            return 0

        def ids(name: str) -> tuple[Sequence[int], int]:
            col = self.coded.get(name)
            if col is None:
                return array("i", [0]) * self._n, 1
            same: dict[Any, int] = {}
            canon = [same.setdefault(v, len(same)) for v in col.values]
            return [canon[c] for c in col.codes], len(canon)

        (s, _), (d, width) = ids("src_rank"), ids("dst_rank")
        return len({a * width + b for a, b in zip(s, d, strict=True)})

    def __len__(self) -> int:
        return self._n

    def _row(self, i: int) -> dict[str, Any]:
        row = {n: c[i] for n, c in self.coded.items()}
        row.update((n, x if x == x else _NAN) for n, x in ((n, v[i]) for n, v in self.numbers.items()))
        return {n: row[n] for n in COLUMNS if n in row}

    @overload
    def __getitem__(self, i: int) -> dict[str, Any]: ...

    @overload
    def __getitem__(self, i: slice) -> list[dict[str, Any]]: ...

    def __getitem__(self, i: int | slice) -> dict[str, Any] | list[dict[str, Any]]:
        if isinstance(i, slice):
            return [self._row(j) for j in range(*i.indices(self._n))]
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError("link row index out of range")
        return self._row(i)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return (self._row(i) for i in range(self._n))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str | bytes):
            return NotImplemented
        return len(other) == self._n and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"LinkRows({self._n} rows, columns {[n for n in COLUMNS if n in self.coded or n in self.numbers]})"
