"""Signal handlers a command installs for its own run only (standard library only).

A command's SIGTERM/SIGINT handler must not outlive the command: run in-process (click's ``CliRunner`` in the
tests, or an embedding program), a handler left behind replaced the process's own for good. That is why the
test suite ignored SIGTERM and SIGINT: ``profwatch analyze`` run in-process left SIGTERM raising
``SystemExit`` inside whichever test ran next (reported as that test's failure, and the run went on), the demo
left it raising its ``Stopped``, ``alerts --follow`` and ``simulate job`` left both signals only setting a flag
nobody read any more.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

Handler = Callable[[int, Any], Any]


@contextmanager
def handling(handler: Handler, *signums: int) -> Iterator[None]:
    """Install ``handler`` for ``signums`` (default SIGTERM and SIGINT) for the ``with`` block, then put back the
    handlers that were there before (also when the block raises). Main thread only (``signal.signal``'s rule)."""
    sigs = signums or (signal.SIGTERM, signal.SIGINT)
    before = {s: signal.getsignal(s) for s in sigs}
    for s in sigs:
        signal.signal(s, handler)
    try:
        yield
    finally:
        for s, h in before.items():
            signal.signal(s, h if h is not None else signal.SIG_DFL)
