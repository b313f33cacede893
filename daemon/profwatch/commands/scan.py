"""``profwatch scan DIR``: report the capture batches under a folder and whether each is complete (CLI body).

File names are printed as the OS gives them, decoded as UTF-8 with undecodable bytes as backslash-x escapes
(``daemon/profwatch/core/display.py``), under any locale. Exit codes (``daemon/profwatch/exitcodes.py``, the same as ``analyze``):
0 when at least one batch was found and every batch is ``complete``; 1 when a batch is
``incomplete``/``invalid``/``parsing``; 2 when DIR holds no batch, cannot be read, or the arguments are wrong.
"""

from __future__ import annotations

import json
import os
import time

import click

from profwatch.adapters.fs.rank_dir_fs import TreeUnavailable, describe_unsupported, find_unsupported, scan_tree
from profwatch.core.batches.completeness import BatchState, rank_summary, summarise_problems
from profwatch.core.batches.prof_layout import parse_rank_dir_name
from profwatch.core.batches.settings import WatchSettings
from profwatch.core.display import display_str, printable
from profwatch.core.messages import MAX_WORLD_SIZE
from profwatch.exitcodes import EXIT_NOT_OK, EXIT_OK, EXIT_USAGE


def render_table(batches: list[BatchState]) -> str:
    """Readable report: one header line per batch, then its problems and notes."""
    lines = []
    for b in batches:
        lines.append(f"{b.batch_id}  {b.status.upper()}  kind={b.kind}  ranks {len(b.ranks)}/"
                     f"{len(b.expected_ranks)}  steps={b.steps or '-'}  dir={b.prof_dir}")
        if b.missing_ranks:
            lines.append(f"  missing ranks: {rank_summary(b.missing_ranks)}")
        lines += [f"  problem: {text}" for text in summarise_problems(b.problems, with_paths=True)]
        lines += [f"  note: {n}" for n in b.notes]
    return display_str("\n".join(lines))


RANK_DIRS_LOOK_LIKE = ("a rank dir is one rank's profiler output folder, {worker}_{pid}_{timestamp}_ascend_pt "
                       "(torch_npu) or ..._torch_pt (a Kineto trace folder: *.pt.trace.json); a capture's rank dirs "
                       "are under its prof_dir, which `profwatch arm` prints after '->'")
"""What ``scan`` adds when it finds no rank dir: what one looks like (docs/rank-dirs.md) and where captures are."""


def render_one_rank(root: str, batches: list[BatchState]) -> str | None:
    """The report of a scan whose DIR is itself one rank dir (``root``, absolute): that rank's own state, steps and
    problems, what batch it belongs to, and that its peers were not looked for (never "rank dir missing" for them:
    they sit beside DIR, not under it). None when no batch holds a rank dir at ``root``."""
    lines = []
    for b in batches:
        for rank, rd in sorted(b.ranks.items()):
            if os.path.abspath(rd.path) != root:
                continue
            steps = f"steps={list(rd.steps)}" if rd.steps else "steps=-"
            lines.append(f"{root}: one rank dir: rank {rank} of batch {b.batch_id} ({len(b.expected_ranks)} ranks "
                         f"expected), kind={b.kind}, {rd.state.upper()}, {steps}")
            lines += [f"  problem: {p.reason}" for p in b.problems if p.rank == rank]
            lines += [f"  note: {n}" for n in rd.notes]
    return display_str("\n".join(lines)) if lines else None


def one_rank_dir_note(directory: str | os.PathLike[str], *, peers_missing: bool = True) -> str | None:
    """The note for a DIR that is itself one rank dir, naming the parent to pass instead; None for any other
    folder. Shared by ``scan`` (``peers_missing`` False: it shows that rank alone) and ``analyze`` (its peers then
    count as missing)."""
    root = os.path.abspath(directory)
    if parse_rank_dir_name(os.path.basename(root)) is None:
        return None
    peers = ("so its peers count as missing above" if peers_missing
             else "so only that rank was checked (its peers sit beside it and were not looked for)")
    return display_str(f"note: {root} is one rank dir, {peers}; pass its parent "
                       f"({os.path.dirname(root)}) to check the whole batch")


def one_rank_lead(directory: str | os.PathLike[str], batches: list[BatchState]) -> str | None:
    """What ``analyze`` says, instead of analysing, for a DIR that is itself one rank dir of a batch that is not
    complete: first the parent to pass (:func:`one_rank_dir_note`), then that rank's own state
    (:func:`render_one_rank`, as ``scan`` shows it). None for any other folder (or when no batch holds that rank
    dir), which ``analyze`` then analyses as usual."""
    note = one_rank_dir_note(directory, peers_missing=False)
    one = render_one_rank(os.path.abspath(directory), batches) if note else None
    if note is None or one is None or all(b.status == "complete" for b in batches):
        return None
    return f"{note}\n{one}\nnot analysed: a batch is analysed with all its ranks"


@click.command("scan")
@click.argument("directory", type=click.Path(file_okay=False, path_type=str))
@click.option("--world-size", type=click.IntRange(min=1, max=MAX_WORLD_SIZE), default=None,
              help=f"Expected number of ranks, at most {MAX_WORLD_SIZE} (default: from profiler_metadata.json).")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of batches instead of a table.")
@click.option("--quiet-period-s", type=click.FloatRange(min=0), default=None,
              help="Older torch_npu without analyse.done: seconds outputs must be unchanged.")
def scan(directory: str, world_size: int | None, as_json: bool, quiet_period_s: float | None) -> None:
    """Check the capture batches under DIRECTORY.

    Exit 0 when every batch found is complete, 1 when one is not, 2 when DIRECTORY holds no batch or cannot be
    read. A DIRECTORY that is one rank dir (``*_ascend_pt``, ...) shows that rank's own state and names its parent
    to pass for the whole batch (exit 1: the batch is not shown complete).
    """
    settings = WatchSettings() if quiet_period_s is None else WatchSettings(quiet_period_s=quiet_period_s)
    try:
        batches = scan_tree(directory, world_size=world_size, now=time.time(), settings=settings)
    except TreeUnavailable as exc:
        click.echo(display_str(f"error: {exc}"), err=True)
        raise SystemExit(EXIT_USAGE) from exc
    other = describe_unsupported(find_unsupported(directory, max_depth=settings.scan_max_depth))
    one = None
    if as_json:
        click.echo(json.dumps(printable([b.to_json() for b in batches]), indent=2, default=str))
    elif batches:
        root = os.path.abspath(directory)
        one = render_one_rank(root, batches) if parse_rank_dir_name(os.path.basename(root)) else None
        click.echo(one or render_table(batches))
    else:
        click.echo(display_str(f"no rank dirs found under {directory}" + (f"; {other}" if other else "")
                               + f" ({RANK_DIRS_LOOK_LIKE})"), err=True)
    if other and (batches or as_json):
        click.echo(display_str(f"note: {other}"), err=True)
    note = one_rank_dir_note(directory, peers_missing=as_json or one is None)
    if note:  # last, so it is what the user reads: the other ranks were not looked for
        click.echo(note, err=True)
    if not batches:
        raise SystemExit(EXIT_USAGE)
    raise SystemExit(EXIT_OK if all(b.status == "complete" for b in batches) else EXIT_NOT_OK)
