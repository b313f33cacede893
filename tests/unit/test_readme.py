"""The README stays true of the code: its exit-code table is daemon/profwatch/exitcodes.py's, every command it runs exists,
and every docs page it links exists (tests/unit/test_repo_stands_alone.py checks that it stands alone)."""

from __future__ import annotations

import re

from click.testing import CliRunner

from profwatch import exitcodes
from profwatch.cli import cli
from tests.conftest import REPO_ROOT

README = (REPO_ROOT / "README.md").read_text()


def test_exit_code_table_is_the_one_table() -> None:
    section = README[README.index("## Exit codes"):README.index("## What the verdict says")]
    rows = re.findall(r"^\| (\d) \| ", section, flags=re.M)
    assert [int(r) for r in rows] == [exitcodes.EXIT_OK, exitcodes.EXIT_NOT_OK, exitcodes.EXIT_USAGE,
                                      exitcodes.EXIT_UNAVAILABLE]


def test_every_profwatch_command_in_the_readme_exists() -> None:
    code = "\n".join(line.split("#")[0] for block in re.findall(r"```bash\n(.*?)```", README, flags=re.S)
                     for line in block.splitlines())  # commands, not their comments
    commands = set(re.findall(r"`profwatch ([a-z]+)", README)) | set(re.findall(r"\bprofwatch ([a-z]+)", code))
    assert {"demo", "coordinator", "node", "status", "alerts", "simulate", "keys"} <= commands
    known = set(cli.list_commands(None))  # type: ignore[arg-type]
    assert commands <= known, commands - known
    for sub in ("tree", "job"):
        assert CliRunner().invoke(cli, ["simulate", sub, "--help"]).exit_code == 0
    for option in ("--duration-s", "--config-dir", "--prof-root", "--slow-rank"):
        assert option in CliRunner().invoke(cli, ["simulate", "job", "--help"]).output


def test_linked_docs_exist() -> None:
    links = re.findall(r"\]\((docs/[^)#]+)", README)
    assert len(links) >= 10
    for link in links:
        assert (REPO_ROOT / link).is_file(), link


def test_readme_commands_use_a_folder_of_their_own_and_free_ports() -> None:
    """The README's commands ran in fixed ``/tmp/tree`` and ``/tmp/pw`` folders and on the default ports 7711-7713,
    which collide with another user's on a shared box: every bash block now takes a ``mktemp -d`` folder and the
    by-hand coordinator three ports the kernel picked (the first two commands, run in the clone, are unchanged)."""
    blocks = re.findall(r"```bash\n(.*?)```", README, flags=re.S)
    code = "\n".join(blocks)
    assert "/tmp/" not in code and not re.search(r"\b771[1-3]\b", code), code
    by_hand = next(b for b in blocks if "profwatch coordinator" in b)
    assert by_hand.startswith("pw=$(mktemp -d)") and 'bind(("127.0.0.1", 0))' in by_hand
    assert "mktemp -d" in next(b for b in blocks if "simulate tree" in b)
    first = blocks[0]
    assert "pip install -e \".[coordinator]\" -c constraints/coordinator.txt && profwatch demo" in first
    assert "bash .ci/run" in first


def _github_anchors(markdown: str) -> set[str]:
    """The anchors of a markdown file on GitHub: its ``<a id="...">`` tags, and its headings' ids (lower case,
    punctuation but ``-`` and ``_`` dropped, spaces to ``-``, a repeated one suffixed ``-1``, ``-2``, ...:
    github/cmark-gfm's heading ids); fenced code holds neither."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    fenced = False
    for line in markdown.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        if not fenced:
            out.update(re.findall(r'<a (?:id|name)="([^"]+)"', line))  # an explicit anchor
        m = None if fenced else re.match(r"#{1,6} +(.*?) *#* *$", line)
        if m is None:
            continue
        slug = re.sub(r"[^\w\- ]", "", m.group(1).lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def test_links_to_a_section_name_an_anchor_that_exists() -> None:
    """Every ``(FILE.md#anchor)`` link of the README and docs/ names a heading or an ``<a id>`` of that file, so a
    reader lands on the section, not at the top of a long page (test_linked_docs_exist checks only the file)."""
    files = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
    broken, checked = [], 0
    for f in files:
        for target, anchor in re.findall(r"\]\(([\w./-]*\.md)#([^)\s]+)\)", f.read_text()):
            doc = (f.parent / target).resolve()
            checked += 1
            if not doc.is_file() or anchor not in _github_anchors(doc.read_text()):
                broken.append(f"{f.relative_to(REPO_ROOT)}: {target}#{anchor}")
    assert checked >= 10 and not broken, (checked, broken)


def test_the_torch_install_line_has_an_offline_hint() -> None:
    """Tried by a new user without network: the ``--index-url`` torch line retried for minutes, and the README said
    nothing about it. Its cost section says how to fail at once and how to install without the network."""
    first = README[README.index("## First two commands"):README.index("**The demo** takes")]
    assert "--index-url https://download.pytorch.org/whl/cpu" in first
    hint = first[first.index("**Offline**"):]
    assert "--retries 0" in hint and "--no-index --find-links" in hint
