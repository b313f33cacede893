"""Line coverage of the real torch_npu files that the conformance suite ran (coverage.py; prints numbers).

Usage::

    PROFWATCH_CONFORMANCE_COVERAGE=/tmp/pw-cov python -m pytest tests/conformance
    python -m tests.conformance.coverage_report /tmp/pw-cov

Each rank process, its forked monitor and the config probe write coverage data under that folder (only the
isolated ``torch_npu`` tree is measured). This script combines them and prints, for the monitor files of
``real_torch_npu.MONITOR_FILES``, statements, missed and percent, then the total over every upstream file that
ran. Needs ``pip install coverage`` (not a test dependency).
"""

from __future__ import annotations

import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    import coverage

    from tests.conformance.real_torch_npu import MONITOR_FILES, STANDINS

    d = Path(argv[1] if len(argv) > 1 else "/tmp/pw-cov")
    site = Path((d / "site.txt").read_text().strip())
    cov = coverage.Coverage(data_file=str(d / ".coverage"))
    cov.combine([str(d)], keep=True)
    cov.save()
    data = cov.get_data()
    rows = []
    total_run = total_stmts = 0
    for measured in sorted(data.measured_files()):
        rel = str(Path(measured).relative_to(site))
        if rel in STANDINS:
            continue
        _, statements, _, missing, _ = cov.analysis2(measured)
        run = len(statements) - len(missing)
        total_run += run
        total_stmts += len(statements)
        if rel in MONITOR_FILES:
            rows.append((rel, len(statements), len(missing), 100.0 * run / max(1, len(statements))))
    print(f"{'upstream file (torch-npu, unmodified)':<72} {'stmts':>6} {'miss':>6} {'cover':>6}")
    for rel, n, miss, pct in rows:
        print(f"{rel:<72} {n:>6} {miss:>6} {pct:>5.1f}%")
    print(f"{'all ' + str(len(data.measured_files()) - len(STANDINS)) + ' upstream files that ran':<72} "
          f"{total_stmts:>6} {total_stmts - total_run:>6} {100.0 * total_run / max(1, total_stmts):>5.1f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
