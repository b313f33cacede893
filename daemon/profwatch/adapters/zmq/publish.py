"""Event/alert stream: a ZeroMQ PUB socket (I/O). Frames: ``[topic, cloudevent_json]``.

Topics: ``profwatch.alert.<job_id>`` for alerts, ``profwatch.event.<job_id>`` for the rest. PUB drops what
was sent before a subscriber joined (slow joiner): everything published is also stored, and ``profwatch alerts``
fetches what it missed over the control socket. ZeroMQ filters topics by prefix, so a subscription for job ``j1``
also receives ``j10``'s and ``j1.x``'s messages: :class:`Subscription` subscribes by prefix and then keeps only
the exact topics (job ids may contain ``.``, so no separator can make a prefix exact).

Revocation: a PUB socket cannot drop one subscriber, so the socket is an XPUB (``XPUB_VERBOSE``: every
subscription message is passed up) and under CURVE each subscription message tells which key subscribed (the
connection's metadata, ``adapters/zmq/curve.py``). When a key that subscribed since the last bind is no longer
admitted, :meth:`EventPublisher.rebind` closes the socket and binds the same endpoint again: every subscriber is
disconnected, the admitted ones reconnect by themselves (ZeroMQ reconnects and re-sends their subscriptions within
its reconnect interval, 100 ms by default), the revoked one is refused at its new handshake. Events published
during that gap are not lost: they are stored, and ``profwatch alerts`` fetches what it missed.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import zmq

from profwatch.adapters.zmq.curve import make_client, make_server, peer_key
from profwatch.adapters.zmq.keyfiles import KeyPair

REBIND_WAIT_S = 5.0
"""How long :meth:`EventPublisher.rebind` retries binding the endpoint again (the closed socket's listener is
released asynchronously by ZeroMQ's I/O thread)."""


class EventPublisher:
    """Bind an XPUB socket and publish CloudEvents. Never blocks (HWM drops for slow subscribers).

    ``curve``: the server key pair when the socket uses CURVE (ZAP domain ``pub``: ``read``/``act`` keys).
    ``sndhwm`` bounds the events queued per subscriber. ``subscribers`` holds the Z85 keys that subscribed since
    the last bind (at most one entry per admitted key: the key ring's size bounds it).
    Raises ``zmq.ZMQError`` when the endpoint cannot be bound."""

    def __init__(self, ctx: zmq.Context, endpoint: str, sndhwm: int = 1000, curve: KeyPair | None = None) -> None:
        self._ctx = ctx
        self._sndhwm = sndhwm
        self._curve = curve
        self.sock = self._bind(endpoint)
        self.endpoint = str(self.sock.getsockopt_string(zmq.LAST_ENDPOINT))
        self.subscribers: set[bytes] = set()
        self.sent = 0
        self.rebinds = 0

    def _bind(self, endpoint: str) -> zmq.Socket:
        sock = self._ctx.socket(zmq.XPUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, self._sndhwm)
        sock.setsockopt(zmq.XPUB_VERBOSE, 1)
        if endpoint.startswith("tcp://[") or "::" in endpoint:
            sock.setsockopt(zmq.IPV6, 1)
        if self._curve is not None:
            make_server(sock, "pub", self._curve)
        try:
            sock.bind(endpoint)
        except zmq.ZMQError:
            sock.close(0)
            raise
        return sock

    def publish(self, event: dict[str, Any], is_alert: bool) -> None:
        name = topic("alert" if is_alert else "event", event.get("subject"))
        try:
            self.sock.send_multipart([name.encode(), json.dumps(event, default=str).encode()], zmq.NOBLOCK)
            self.sent += 1
        except zmq.ZMQError:
            pass

    def drain_subscriptions(self) -> None:
        """Read pending subscription messages (never blocks) and note which key sent each (under CURVE)."""
        while True:
            try:
                frame = self.sock.recv(zmq.NOBLOCK, copy=False)
            except zmq.ZMQError:
                return
            if frame.bytes[:1] == b"\x01":
                key = peer_key(frame)
                if key is not None:
                    self.subscribers.add(key)

    def revoked_subscribers(self, admitted: Callable[[bytes], bool]) -> list[bytes]:
        """Keys that subscribed since the last bind and that ``admitted(key)`` no longer allows."""
        self.drain_subscriptions()
        return [k for k in self.subscribers if not admitted(k)]

    def rebind(self) -> None:
        """Close the socket and bind the same endpoint again (drops every subscriber; see the module doc).

        Raises:
            zmq.ZMQError: the endpoint could not be bound again within :data:`REBIND_WAIT_S`.
        """
        self.sock.close(0)
        self.subscribers = set()
        deadline = time.monotonic() + REBIND_WAIT_S
        while True:
            try:
                self.sock = self._bind(self.endpoint)
                break
            except zmq.ZMQError as exc:
                if exc.errno != zmq.EADDRINUSE or time.monotonic() > deadline:
                    raise
                time.sleep(0.01)
        self.rebinds += 1

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
