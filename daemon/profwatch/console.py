"""Console-script entry point of ``profwatch`` (standard library only, so it can explain a missing extra).

``pip install profwatch`` installs the rank hook (pyzmq) and this script; the command line itself needs the
``node`` extra (click, pydantic, pydantic-settings, structlog, ...). Without it, ``profwatch`` says which
extra to install and exits 2 (``daemon/profwatch/exitcodes.py``) instead of printing an ImportError traceback.
"""

from __future__ import annotations

import sys

from profwatch.exitcodes import EXIT_USAGE

#: Top-level modules the command line imports at start-up, from the ``node`` extra (and ``daemon``'s for the
#: coordinator's commands).
DAEMON_EXTRA_MODULES = frozenset({"click", "pydantic", "pydantic_settings", "pydantic_core", "structlog", "zmq",
                                  "tenacity", "watchdog", "prometheus_client", "ijson", "tomli"})


def main() -> None:
    """Run ``profwatch.cli``; on a missing dependency of the ``node`` extra print how to install it, exit 2."""
    try:
        from profwatch.cli import main as cli_main
    except ModuleNotFoundError as exc:
        top = (exc.name or "").split(".")[0]
        if top not in DAEMON_EXTRA_MODULES:
            raise
        sys.stderr.write(f"profwatch: the command line needs the 'node' extra (missing Python module {top!r}).\n"
                         "  install it with: pip install 'profwatch[node]'   (the coordinator host: "
                         "'profwatch[coordinator]' -c constraints/coordinator.txt)\n")
        sys.exit(EXIT_USAGE)
    cli_main()


if __name__ == "__main__":
    main()
