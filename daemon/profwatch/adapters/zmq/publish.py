"""Event/alert stream: a ZeroMQ PUB socket (I/O). Frames: ``[topic, cloudevent_json]``.

Topics: ``profwatch.alert.<job_id>`` for alerts, ``profwatch.event.<job_id>`` for the rest. PUB drops what
was sent before a subscriber joined (slow joiner): everything published is also stored, and ``profwatch alerts``
fetches what it missed over the control socket. ZeroMQ filters topics by prefix, so a subscription for job ``j1``
also receives ``j10``'s and ``j1.x``'s messages: :class:`Subscription` subscribes by prefix and then keeps only
the exact topics (job ids may contain ``.``, so no separator can make a prefix exact).
"""

from __future__ import annotations

import json
from typing import Any

import zmq

from profwatch.adapters.zmq.curve import make_client, make_server
from profwatch.adapters.zmq.keyfiles import KeyPair


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
        name = topic("alert" if is_alert else "event", event.get("subject"))
        try:
            self.sock.send_multipart([name.encode(), json.dumps(event, default=str).encode()], zmq.NOBLOCK)
            self.sent += 1
        except zmq.ZMQError:
            pass

    def close(self) -> None:
        self.sock.close(0)


def topic(kind: str, job_id: str | None) -> str:
    """The topic of an event of ``kind`` (``alert``/``event``) for ``job_id`` (``_`` when none)."""
    return f"profwatch.{kind}.{job_id or '_'}"


class Subscription:
    """A SUB socket for ``kinds`` (``alert``, ``event``) of one job (``job_id``) or of every job (None).

    :meth:`recv` returns the next CloudEvent whose topic is exactly one asked for, None on timeout; messages of
    other jobs that share the prefix are dropped here. ``curve``: the client key pair and the server's public key
    when the endpoint uses CURVE.
    """

    def __init__(self, ctx: zmq.Context, endpoint: str, kinds: list[str], job_id: str | None = None,
                 curve: tuple[KeyPair, bytes] | None = None) -> None:
        self.sock = subscribe(ctx, endpoint, [f"profwatch.{k}." + (job_id or "") for k in kinds], curve=curve)
        self._exact = {topic(k, job_id).encode() for k in kinds} if job_id is not None else None

    def recv(self, timeout_ms: int) -> dict[str, Any] | None:
        """Wait up to ``timeout_ms`` for one event of the subscription (None when none came in time)."""
        while self.sock.poll(timeout_ms):
            frames = self.sock.recv_multipart()
            if len(frames) != 2 or (self._exact is not None and frames[0] not in self._exact):
                timeout_ms = 0  # not ours: look at what else is queued, without waiting again
                continue
            try:
                ev = json.loads(frames[1])
            except ValueError:
                continue
            if isinstance(ev, dict):
                return ev
        return None

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
