"""The repository stands on its own: no tracked file points into the research notes that do not ship with it.

Product code and docs cite ``docs/`` pages (``docs/msprof-analyze.md``, ``docs/torch_npu-dynamic-profile.md``,
``docs/rank-dirs.md``, ``docs/field-cases.md``, ``docs/paths.md``) or public upstream sources. Tests may read
sample data from ``../shared/data`` (skipping when it is absent), nothing else from there.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

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


# -- the docs name what exists ----------------------------------------------------------------------------------------
# docs/, README.md and every module docstring of daemon/ and rankhook/ may name a file of the repository, a module of
# profwatch or the rank hook, or an event type: each must exist (a moved module fails here, not in a reader's hands).

REPO_PATH = re.compile(r"(?<![\w./*<>{}$-])((?:[\w.-]+/)+[\w-][\w.-]*\.(?:py|md|toml|json|txt|sh|service|timer|conf|rules|"
                       r"j2|yml|yaml|html|cfg))\b")
BARE_PY = re.compile(r"(?<![\w./*<>{}$-])([A-Za-z_]\w*\.py)\b")
DOTTED = re.compile(r"(?<![\w.])((?:profwatch|rankhook)(?:\.[A-Za-z_]\w*)+)")
EVENT = re.compile(r"(?<![\w.])(?:io\.profwatch\.)?([a-z][a-z_]*)\.v1\b")
ROOTS = ("daemon", "rankhook", "tests", "bench", "docs", "systemd", "dashboards", "constraints", ".ci")
"""A path whose first folder is one of these, or a folder of the profwatch package (``core/...``, ``fs/...``), is a
file of this repository: it must exist (as written, or under ``daemon/profwatch/`` or another folder)."""
UPSTREAM_PATHS = frozenset({  # torch_npu's documentation tree (Ascend/pytorch), cited by its own paths
    "docs/en/ascend_pytorch_profiler/ascend_pytorch_profiler_user_guide.md",
    "docs/zh/ascend_pytorch_profiler/ascend_pytorch_profiler_user_guide.md",
    "docs/en/environment_variable_reference/PROF_CONFIG_PATH.md", "docs/en/support/faq.md"})
UPSTREAM_PY = frozenset({  # torch_npu, msprof-analyze and plotly sources the docs cite by file name
    "_dynamic_profiler_config_context.py", "_dynamic_profiler_monitor_shm.py", "_dynamic_profiler_utils.py",
    "_non_intrusive_profile.py", "_profiler_action_controller.py", "_profiler_path_creator.py",
    "data_preprocessor.py", "experimental_config.py", "plotly.py", "prof_data_allocate.py", "profiler.py",
    "profiler_interface.py", "scheduler.py"})
MODULE_ATTR = re.compile(r"(?<=`)([a-z][a-z0-9]*_[a-z0-9_]*)\.([A-Za-z_]\w*)")
"""```snake_module.name``` at the start of a code span: a module of ours by its short name (``admission.arm_refusal``)."""
FILE_EXTS = frozenset({"py", "json", "db", "csv", "v1", "yml", "yaml", "toml", "md", "txt", "html", "j2", "xlsx", "log"})
"""``name.ext`` in a code span is a file name (checked as a file where it is ours), ``name.v1`` an event type."""
NOT_OUR_MODULES = frozenset({"distributed_args", "end_info", "tls_config", "profwatch_sim"})
"""``snake.name`` code spans that are keys of a JSON file or of the settings, or a metric prefix, not modules."""
NOT_MODULES = frozenset({"alert", "event", "toml", "conf", "pth", "fish"})
"""``profwatch.<word>`` that are topics (``profwatch.alert.<job_id>``) or file names (``profwatch.toml``)."""


def _texts() -> list[tuple[str, str]]:
    """(where, text): docs pages, README.md, and each module docstring of daemon/ and rankhook/."""
    import ast

    files = _tracked_files()
    out = [(rel, (REPO_ROOT / rel).read_text(encoding="utf-8")) for rel in files
           if (rel.startswith("docs/") and rel.endswith(".md")) or rel == "README.md"]
    for rel in files:
        if rel.startswith(("daemon/", "rankhook/")) and rel.endswith(".py") and (REPO_ROOT / rel).is_file():
            doc = ast.get_docstring(ast.parse((REPO_ROOT / rel).read_text(encoding="utf-8")))
            if doc:
                out.append((rel, doc))
    return out


def _module_file(parts: list[str]) -> Path | None:
    base = REPO_ROOT / "daemon" if parts[0] == "profwatch" else REPO_ROOT
    path = base.joinpath(*parts)
    if (path / "__init__.py").is_file():
        return path / "__init__.py"
    if path.with_suffix(".py").is_file():
        return path.with_suffix(".py")
    return None


def _top_names(path: Path) -> set[str]:
    import ast

    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def _dotted_exists(name: str) -> bool:
    """``profwatch.a.b[.Attr[.member]]``: the longest module prefix exists and defines the next name."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        f = _module_file(parts[:n])
        if f is None:
            continue
        rest = parts[n:]
        if not rest:
            return True
        if f.name == "__init__.py" and _module_file([*parts[:n], rest[0]]) is not None:
            return True
        return rest[0] in _top_names(f)
    return False


def test_docs_and_docstrings_name_files_modules_and_event_types_that_exist() -> None:
    from profwatch.core.alerts.event_types import BY_NAME

    tracked = set(_tracked_files()) | {SELF}
    basenames = {p.rsplit("/", 1)[-1] for p in tracked}
    packages = {part for t in tracked for part in t.split("/")[:-1]}
    ours = set(ROOTS) | {part for t in tracked if t.startswith("daemon/profwatch/") and "fake_torch_npu" not in t
                         for part in t.split("/")[2:-1]} | {"backends"}
    wrong = []
    for where, text in _texts():
        for m in REPO_PATH.finditer(text):
            p = m.group(1)
            if p.split("/", 1)[0] in ours and p not in UPSTREAM_PATHS and p not in tracked \
                    and not any(t.endswith("/" + p) for t in tracked):
                wrong.append(f"{where}: file {p}")
        for m in BARE_PY.finditer(text):
            if m.group(1) not in basenames and m.group(1) not in UPSTREAM_PY:
                wrong.append(f"{where}: file {m.group(1)}")
        for m in DOTTED.finditer(text):
            name = m.group(1)
            if name.split(".")[1] not in NOT_MODULES and not _dotted_exists(name):
                wrong.append(f"{where}: module or name {name}")
        for m in MODULE_ATTR.finditer(text):
            if m.group(2) in FILE_EXTS or m.group(1) in NOT_OUR_MODULES:
                continue
            if m.group(1) + ".py" not in basenames and m.group(1) not in packages:
                wrong.append(f"{where}: module {m.group(1)} (of {m.group(0)})")
        for m in EVENT.finditer(text):
            if m.group(1) not in BY_NAME:
                wrong.append(f"{where}: event type {m.group(0)}")
    assert not wrong, "names that do not exist:\n" + "\n".join(sorted(set(wrong)))


def test_the_architecture_page_lists_every_event_type_and_anomaly_kind() -> None:
    """``docs/architecture.md`` names every event type of the table and every anomaly kind (each in backticks)."""
    from typing import get_args

    from profwatch.core.alerts.event_types import TABLE
    from profwatch.core.detection.types import AnomalyKind

    text = (REPO_ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    missing = [e.name for e in TABLE if f"`{e.name}`" not in text and f"`{e.type}`" not in text]
    missing += [k for k in get_args(AnomalyKind) if f"`{k}`" not in text]
    assert len(TABLE) >= 24 and len(get_args(AnomalyKind)) >= 7
    assert not missing, f"docs/architecture.md does not list: {missing}"
