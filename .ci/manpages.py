"""Write the ``profwatch`` man pages (section 1: ``profwatch.1``, ``profwatch-<command>.1``, and one per
subcommand, e.g. ``profwatch-config-check.1``) from the command line's own click definitions, with click-man
(https://github.com/click-contrib/click-man; the ``test`` extra): the pages say what ``--help`` says, so they
cannot drift from it. Commands loaded lazily by ``profwatch.cli`` are loaded first so each gets its page.

Run: ``python .ci/manpages.py OUT_DIR`` (packagers: install the pages under ``share/man/man1``;
``man -l OUT_DIR/profwatch.1`` reads one in place).
"""

from __future__ import annotations

import sys
from pathlib import Path

import click
from click_man.core import write_man_pages

from profwatch import __version__
from profwatch.cli import cli


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python .ci/manpages.py OUT_DIR", file=sys.stderr)
        return 2
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    ctx = click.Context(cli, info_name="profwatch")
    for name in cli.list_commands(ctx):  # the lazy group: load every command so it has a page
        cli.get_command(ctx, name)
    write_man_pages("profwatch", cli, version=__version__, target_dir=str(out))
    pages = sorted(p.name for p in out.glob("profwatch*.1"))
    print(f"wrote {len(pages)} man pages to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
