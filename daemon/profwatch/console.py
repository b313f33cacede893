"""Console-script entry point of ``profwatch`` (standard library only, so it can explain a missing extra).

``pip install profwatch`` installs the rank hook (pyzmq) and this script; the command line itself needs the
``node`` extra (click, pydantic, pydantic-settings, structlog, ...), the coordinator and the offline analysis
commands the ``daemon``/``coordinator`` extras, the demo the ``torch`` extra. Whichever is missing, on whichever
install (hook only, node only), ``profwatch`` says which extra to install and exits 2
(``daemon/profwatch/exitcodes.py``) instead of printing an ImportError traceback: at start-up, when a command is
loaded (``profwatch.cli._LazyGroup``) and when a command imports lazily while it runs (the coordinator).

The ``daemon`` and ``coordinator`` extras need Python 3.11+ (watchdog 7; pyproject.toml gives their requirements
a ``python_version >= '3.11'`` marker, so on 3.10 they install nothing more than ``node``): on 3.10 the message
names the version needed.
"""

from __future__ import annotations

import sys

from profwatch.exitcodes import EXIT_USAGE

#: Top-level Python module -> the extra of pyproject.toml that installs it (its lowest extra).
EXTRA_OF_MODULE: dict[str, str] = {
    **dict.fromkeys(("click", "pydantic", "pydantic_settings", "pydantic_core", "structlog", "zmq",
                     "prometheus_client", "tomli"), "node"),
    **dict.fromkeys(("tenacity", "watchdog", "numpy", "ijson", "jinja2", "markupsafe", "plotly", "tqdm"), "daemon"),
    **dict.fromkeys(("msprof_analyze", "pandas", "sqlalchemy"), "coordinator"),
    "torch": "torch",
}
#: The lowest Python the ``daemon`` and ``coordinator`` extras install on (pyproject.toml's markers).
DAEMON_PYTHON = (3, 11)
#: Kept for callers of the earlier name: the modules whose absence is explained rather than raised.
DAEMON_EXTRA_MODULES = frozenset(EXTRA_OF_MODULE)


def missing_extra_message(command: str, exc: ImportError) -> str | None:
    """The lines (newline-terminated) that tell which extra ``command`` needs, given the ImportError it met;
    None when the missing module is none of our extras' (a real bug: the caller re-raises it)."""
    top = (getattr(exc, "name", None) or "").split(".")[0]
    extra = EXTRA_OF_MODULE.get(top)
    if extra is None:
        return None
    who = f"profwatch {command}".rstrip()
    text = (f"{who}: needs the '{extra}' extra (missing Python module {top!r}).\n"
            f"  install it with: pip install 'profwatch[{extra}]'"
            + ("   (the coordinator host: 'profwatch[coordinator]' -c constraints/coordinator.txt)\n"
               if extra in ("node", "daemon", "coordinator") else "\n"))
    if extra in ("daemon", "coordinator", "torch") and sys.version_info < DAEMON_PYTHON:
        text += (f"  the '{extra}' extra needs Python {DAEMON_PYTHON[0]}.{DAEMON_PYTHON[1]} or newer (this is "
                 f"Python {sys.version_info[0]}.{sys.version_info[1]}.{sys.version_info[2]}); on 3.10 only the "
                 "rank hook ('hook') and the node daemon ('node') install\n")
    return text


def command_of(argv: list[str]) -> str:
    """The subcommand named in ``argv`` (``sys.argv[1:]``), skipping the group's own options; '' when none."""
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--config":
            skip = True
        elif not arg.startswith("-"):
            return arg
    return ""


def main() -> None:
    """Run ``profwatch.cli``; on a missing dependency of one of our extras print how to install it, exit 2."""
    command = command_of(sys.argv[1:])
    try:
        from profwatch.cli import main as cli_main
    except ModuleNotFoundError as exc:
        text = missing_extra_message(command, exc)
        if text is None:
            raise
        if EXTRA_OF_MODULE.get((exc.name or "").split(".")[0]) == "node":
            text = text.replace(f"profwatch {command}: needs", "profwatch: the command line needs").replace(
                "profwatch: needs", "profwatch: the command line needs")
        sys.stderr.write(text)
        sys.exit(EXIT_USAGE)
    try:
        cli_main()
    except ModuleNotFoundError as exc:  # a command's lazy import (the coordinator's tenacity on a node install)
        text = missing_extra_message(command, exc)
        if text is None:
            raise
        sys.stderr.write(text)
        sys.exit(EXIT_USAGE)


if __name__ == "__main__":
    main()
