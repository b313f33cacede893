"""Event/alert stream: a ZeroMQ PUB socket (I/O). Frames: ``[topic, cloudevent_json]``.

Topics: ``profwatch.alert.<job_id>`` for alerts, ``profwatch.event.<job_id>`` for the rest. PUB drops what
was sent before a subscriber joined (slow joiner, FC-20): everything published is also stored, and
``profwatch alerts`` fetches what it missed over the control socket.
"""

from __future__ import annotations

import json
from typing import Any

import zmq

from daemon.adapters.curve import make_client, make_server
from daemon.adapters.keyfiles import KeyPair


class EventPublisher:
    """Bind a PUB socket and publish CloudEvents. Never blocks (HWM drops for slow subscribers).

    ``curve``: the server key pair when the socket uses CURVE (ZAP domain ``pub``: ``read``/``act`` keys).
    ``sndhwm`` bounds the events queued per subscriber."""

    def __init__(self, ctx: zmq.Context, endpoint: str, sndhwm: int = 1000, curve: KeyPair | None = None) -> None:
        self.sock = ctx.socket(zmq.PUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.SNDHWM, sndhwm)
        if curve is not None:
            make_server(self.sock, "pub", curve)
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


def subscribe(ctx: zmq.Context, endpoint: str, prefixes: list[str],
              curve: tuple[KeyPair, bytes] | None = None) -> zmq.Socket:
    """Return a SUB socket connected to ``endpoint`` and subscribed to the topic ``prefixes``
    (``curve``: the client key pair and the server's public key when the endpoint uses CURVE)."""
    sock = ctx.socket(zmq.SUB)
    sock.setsockopt(zmq.LINGER, 0)
    if curve is not None:
        make_client(sock, curve[0], curve[1])
    for p in prefixes:
        sock.setsockopt(zmq.SUBSCRIBE, p.encode())
    sock.connect(endpoint)
    return sock
