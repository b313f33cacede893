"""The repository stands on its own: no tracked file points into the research notes that do not ship with it.

Product code and docs cite ``docs/`` pages (``docs/msprof-analyze.md``, ``docs/torch_npu-dynamic-profile.md``,
``docs/rank-dirs.md``, ``docs/field-cases.md``, ``docs/paths.md``) or public upstream sources. Tests may read
sample data from ``../shared/data`` (skipping when it is absent), nothing else from there.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from tests.conftest import REPO_ROOT

FORBIDDEN = re.compile(r"\.\./shared|/work/shared|shared/docs")
TESTS_ALLOWED = re.compile(r"(\.\./shared|/work/shared)/data\b")
#: Files allowed to keep such a citation for now: empty, and it stays empty (the test fails when a listed file is
#: already clean, so the list can only shrink).
PENDING: frozenset[str] = frozenset()


SELF = "tests/unit/test_repo_stands_alone.py"  # spells the patterns it looks for


def _tracked_files() -> list[str]:
    """Tracked files (git ls-files), this test's own file left out."""
    if shutil.which("git") is None or not (REPO_ROOT / ".git").exists():
        pytest.skip("not a git checkout: the tracked-file list is unknown (this check runs in CI on a clone)")
    out = subprocess.run(["git", "-C", str(REPO_ROOT), "ls-files", "-z"], capture_output=True, check=True, timeout=60)
    return [p for p in out.stdout.decode("utf-8", "surrogateescape").split("\0") if p and p != SELF]


def _offending_lines(rel: str) -> list[str]:
    try:
        text = (REPO_ROOT / rel).read_text(encoding="utf-8")
    except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
        return []  # binary or deleted in the work tree
    bad = []
    for n, line in enumerate(text.splitlines(), start=1):
        if not FORBIDDEN.search(line):
            continue
        if rel.startswith("tests/") and not FORBIDDEN.search(TESTS_ALLOWED.sub("", line)):
            continue
        bad.append(f"{rel}:{n}: {line.strip()[:120]}")
    return bad


def test_no_tracked_file_points_into_shared() -> None:
    offenders = {rel: lines for rel in _tracked_files() if (lines := _offending_lines(rel))}
    new = {rel: lines for rel, lines in offenders.items() if rel not in PENDING}
    assert not new, "cite docs/ or a public upstream source instead:\n" + "\n".join(
        line for lines in new.values() for line in lines)
    cleaned = sorted(PENDING - set(offenders))
    assert not cleaned, f"already clean, remove from PENDING: {cleaned}"


CITATION = re.compile(r"(?<![\w/.])docs/([\w.-]+\.md)(?:#([\w-]+))?")


def test_every_docs_citation_resolves() -> None:
    """``docs/page.md`` and ``docs/page.md#anchor`` in tracked files name a page and an anchor that exist
    (anchors are explicit ``<a id="...">`` tags or headings' GitHub slugs)."""
    anchors: dict[str, set[str]] = {}
    for page in (REPO_ROOT / "docs").glob("*.md"):
        text = page.read_text(encoding="utf-8")
        ids = set(re.findall(r'<a id="([\w-]+)"></a>', text))
        ids |= {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
                for h in re.findall(r"^#+ (.+)$", text, flags=re.M)}
        anchors[page.name] = ids
    broken = []
    for rel in _tracked_files():
        try:
            text = (REPO_ROOT / rel).read_text(encoding="utf-8")
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue
        for line in text.splitlines():
            if FORBIDDEN.search(line):
                continue  # a citation of the research notes: the other test reports those
            for m in CITATION.finditer(line):
                name, anchor = m.group(1), m.group(2)
                if name not in anchors or (anchor and anchor not in anchors[name]):
                    broken.append(f"{rel}: {m.group(0)}")
    assert not broken, "citations of missing docs pages or anchors:\n" + "\n".join(sorted(set(broken)))


KILL_BY_NAME = re.compile(r"""(["'\[(]|^|\s)(pkill|killall)(["',\s]|$)""")


def test_no_script_or_test_kills_processes_by_name() -> None:
    """Tests and scripts end only the processes they started, by PID or process group: ``pkill``/``killall`` can
    end processes that are not theirs (issue 10). Docs may mention them (upstream advice), code may not run them."""
    offenders = []
    for rel in _tracked_files():
        if not rel.endswith((".py", ".sh")) and not rel.startswith(".ci/"):
            continue
        try:
            text = (REPO_ROOT / rel).read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        for n, line in enumerate(text.splitlines(), 1):
            code = line.split("#", 1)[0] if rel.endswith(".sh") or rel.startswith(".ci/") else line
            if KILL_BY_NAME.search(code) and "``" not in line:
                offenders.append(f"{rel}:{n}: {line.strip()}")
    assert not offenders, "end processes by PID or process group instead:\n" + "\n".join(offenders)


TRACKER = re.compile(r"\b[Ii]ssue \d+\b")


def test_product_code_and_docs_cite_docs_pages_not_tracker_numbers() -> None:
    """daemon/, rankhook/, docs/ and README.md say where a rule is written down (a docs/ page), not which tracker
    item asked for it: the tracker is not shipped (tests/ and bench/ may name the item they measure)."""
    shipped = [p for p in _tracked_files() if p.startswith(("daemon/", "rankhook/", "docs/")) or p == "README.md"]
    hits = []
    for rel in shipped:
        try:
            text = (REPO_ROOT / rel).read_text(encoding="utf-8")
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue
        hits += [f"{rel}:{n}: {line.strip()[:120]}" for n, line in enumerate(text.splitlines(), start=1)
                 if TRACKER.search(line)]
    assert not hits, "cite a docs/ page instead:\n" + "\n".join(hits)
