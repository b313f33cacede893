"""A command's signal handlers last as long as the command (daemon/profwatch/signals.py; issue 35: the suite
ignored SIGTERM and SIGINT once a command run in-process had installed its own)."""

from __future__ import annotations

import os
import signal

import pytest

from profwatch.signals import handling


def test_handlers_are_installed_for_the_block_and_put_back_after_it_even_on_error() -> None:
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    got: list[int] = []
    with handling(lambda signum, frame: got.append(signum)):
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGINT)
    assert got == [signal.SIGTERM, signal.SIGINT]
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before
    with pytest.raises(RuntimeError), handling(lambda signum, frame: None, signal.SIGTERM):
        raise RuntimeError("the command failed")
    assert signal.getsignal(signal.SIGTERM) == before[0]


def test_alerts_follow_and_the_daemons_use_the_scoped_handlers() -> None:
    """No command module installs a process-wide handler of its own any more (each goes through handling())."""
    from pathlib import Path

    import profwatch

    root = Path(profwatch.__file__).parent
    offenders = [str(p.relative_to(root)) for p in root.rglob("*.py")
                 if p.name != "signals.py" and "signal.signal(signal.SIGTERM" in p.read_text(encoding="utf-8")]
    assert offenders == []
