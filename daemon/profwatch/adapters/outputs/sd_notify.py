"""systemd service notifications (I/O): ``READY=1``, ``WATCHDOG=1``, ``STOPPING=1`` over ``$NOTIFY_SOCKET``.

Protocol (sd_notify(3), https://www.freedesktop.org/software/systemd/man/latest/sd_notify.html): one
newline-separated ``KEY=VALUE`` datagram on the ``AF_UNIX`` ``SOCK_DGRAM`` socket named by ``$NOTIFY_SOCKET``
(a leading ``@`` names an abstract socket). The watchdog period is ``$WATCHDOG_USEC`` microseconds, meant for
the process ``$WATCHDOG_PID`` when set; sd_watchdog_enabled(3) advises pinging at half that period. A tiny
adapter on the stdlib: the maintained library (``systemd-python``) needs libsystemd headers to build, and the
pure-Python ``sdnotify`` package has had no release since 2017.

Without ``$NOTIFY_SOCKET`` (not under systemd, or ``Type=simple``) every call is a no-op. A failed send is
logged once and never raised: notifications must not stop a daemon. Sends never block (``SOCK_NONBLOCK``): a
notify socket whose queue is full fails the send (the next watchdog ping tries again).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping

import structlog

log = structlog.get_logger("profwatch.sd_notify")


class SdNotifier:
    """Sends service notifications for one daemon process.

    Args:
        environ: the process environment (``NOTIFY_SOCKET``, ``WATCHDOG_USEC``, ``WATCHDOG_PID``).
        pid: this process id (to honour ``WATCHDOG_PID``).
    """

    def __init__(self, environ: Mapping[str, str], pid: int | None = None) -> None:
        addr = environ.get("NOTIFY_SOCKET", "")
        self.address = ("\0" + addr[1:]) if addr.startswith("@") else addr
        pid = os.getpid() if pid is None else pid
        self.watchdog_interval_s: float | None = None
        usec = environ.get("WATCHDOG_USEC", "")
        wd_pid = environ.get("WATCHDOG_PID", "")
        if self.address and usec.isdigit() and int(usec) > 0 and (not wd_pid or wd_pid == str(pid)):
            self.watchdog_interval_s = int(usec) / 1e6 / 2
        self._next_ping = 0.0
        self._sock: socket.socket | None = None
        self._warned = False

    @property
    def enabled(self) -> bool:
        return bool(self.address)

    def send(self, *fields: str) -> bool:
        """Send ``KEY=VALUE`` fields as one datagram; ``False`` when disabled or the send failed."""
        if not self.address:
            return False
        try:
            if self._sock is None:
                # non-blocking: a notify socket nobody reads (a full datagram queue) fails the send, never stalls
                # the daemon's main loop
                self._sock = socket.socket(socket.AF_UNIX,
                                           socket.SOCK_DGRAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK)
            self._sock.sendto("\n".join(fields).encode(), self.address)
            return True
        except OSError as exc:
            if not self._warned:
                self._warned = True
                log.warning("sd_notify_failed", socket=self.address.replace("\0", "@"), error=str(exc))
            return False

    def ready(self, status: str = "") -> bool:
        """``READY=1``: the daemon serves (sockets bound, main loop about to run)."""
        return self.send("READY=1", *([f"STATUS={status}"] if status else []))

    def watchdog(self, now_mono_s: float) -> bool:
        """``WATCHDOG=1`` when half the watchdog period has passed since the last ping; call it from the main loop
        only, so a loop that hangs stops the pings and systemd restarts the daemon."""
        if self.watchdog_interval_s is None or now_mono_s < self._next_ping:
            return False
        self._next_ping = now_mono_s + self.watchdog_interval_s
        return self.send("WATCHDOG=1")

    def stopping(self) -> bool:
        """``STOPPING=1``: an ordered shutdown has begun."""
        return self.send("STOPPING=1")

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
