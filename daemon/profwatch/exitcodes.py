"""The one exit-code table of every ``profwatch`` command and daemon (pure constants).

| code | name | meaning |
| --- | --- | --- |
| 0 | ``EXIT_OK`` | done; a verdict on complete data (``ok`` with suspects, or ``no_suspect``); every batch complete; daemon stopped cleanly |
| 1 | ``EXIT_NOT_OK`` | the command ran and judged, but the result is not complete or not ok: an incomplete or ``partial`` batch, an analysis that failed or could not judge, a missed slow rank in the demo; for a daemon: a runtime failure worth a restart (systemd restarts it with back-off) |
| 2 | ``EXIT_USAGE`` | usage, input or configuration error: bad arguments, an unreadable or invalid config, a folder with no rank dirs, a security setting that refuses to start; permanent, so systemd does not restart on it (``RestartPreventExitStatus=2``) |
| 3 | ``EXIT_UNAVAILABLE`` | the coordinator could not be reached or refused us (no reply, authentication failed) |

Every command documents which of these it returns; README.md carries the same table.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_NOT_OK = 1
EXIT_USAGE = 2
EXIT_UNAVAILABLE = 3
