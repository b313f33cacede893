"""Event/alert stream: a ZeroMQ PUB socket (I/O). Frames: ``[topic, cloudevent_json]``.

Topics: ``profwatch.alert.<job_id>`` for alerts, ``profwatch.event.<job_id>`` for the rest. PUB drops what
was sent before a subscriber joined (slow joiner, FC-20): everything published is also stored, and
``profwatch alerts`` fetches what it missed over the control socket.
"""

from __future__ import annotations

import json
from typing import Any

import zmq


class EventPublisher:
    """Bind a PUB socket and publish CloudEvents. Never blocks (HWM drops for slow subscribers)."""

    def __init__(self, ctx: zmq.Context, endpoint: str, sndhwm: int = 10_000) -> None:
        self.sock = ctx.socket(zmq.PUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.SNDHWM, sndhwm)
        self.sock.bind(endpoint)
        self.sent = 0

    def publish(self, event: dict[str, Any], is_alert: bool) -> None:
        kind = "alert" if is_alert else "event"
        topic = f"profwatch.{kind}.{event.get('subject') or '_'}"
        try:
            self.sock.send_multipart([topic.encode(), json.dumps(event, default=str).encode()], zmq.NOBLOCK)
            self.sent += 1
        except zmq.ZMQError:
            pass

    def close(self) -> None:
        self.sock.close(0)


def subscribe(ctx: zmq.Context, endpoint: str, prefixes: list[str]) -> zmq.Socket:
    """Return a SUB socket connected to ``endpoint`` and subscribed to the topic ``prefixes``."""
    sock = ctx.socket(zmq.SUB)
    sock.setsockopt(zmq.LINGER, 0)
    for p in prefixes:
        sock.setsockopt(zmq.SUBSCRIBE, p.encode())
    sock.connect(endpoint)
    return sock
