"""Which connection speaks for which node (pure): the ingest socket's identity binding.

ZeroMQ gives every connection to the coordinator's ROUTER its own routing id; the node daemon no longer chooses
it (a chosen id let any connection take over a node's route, ``ROUTER_HANDOVER``, and the real node froze).
:class:`NodeRoutes` decides for each message whether its connection may speak for the node id it claims:

- with CURVE, the node id is the name of the certificate the connection authenticated with (the ZAP
  ``User-Id``); a claim of any other id is refused (``node_id_mismatch``), whatever the message says;
- a connection keeps the first node id it spoke for (``node_id_changed`` otherwise);
- a second connection for a node id (same key under CURVE) replaces the first: commands go to the newest, and
  the old connection is told to reconnect, so no live node is left talking into a connection nobody reads;
- at most ``max_nodes`` node ids are routed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True, slots=True)
class Admission:
    """The verdict for one message: ``accept``, ``replace`` (accepted; ``old_route`` must be told to reconnect)
    or ``refuse`` (``reason`` is a counter label, ``detail`` a log line)."""

    action: Literal["accept", "replace", "refuse"]
    reason: str = ""
    detail: str = ""
    old_route: bytes | None = None


ACCEPT = Admission("accept")
"""The verdict of the common message (its connection already speaks for its node): one object, not one per message."""


class NodeRoutes:
    """Bidirectional map node id <-> routing id, with the admission rules above.

    Args:
        max_nodes: node ids routed at once; a new one beyond it is refused (``too_many_nodes``).
    """

    def __init__(self, max_nodes: int = 4096) -> None:
        self.max_nodes = max_nodes
        self._route_of: dict[str, bytes] = {}
        self._node_of: dict[bytes, str] = {}

    def admit(self, route: bytes, claimed: str, key_name: str | None) -> Admission:
        """Decide whether connection ``route`` may speak for node ``claimed``.

        ``key_name`` is the authenticated certificate name (CURVE), or None without authentication.
        """
        if key_name is not None and claimed != key_name:
            return Admission("refuse", "node_id_mismatch",
                             f"a connection authenticated as {key_name!r} claimed node id {claimed!r}")
        bound = self._node_of.get(route)
        if bound is not None and bound != claimed:
            return Admission("refuse", "node_id_changed", f"a connection of node {bound!r} claimed node id {claimed!r}")
        cur = self._route_of.get(claimed)
        if cur == route:
            return ACCEPT
        if cur is None:
            if len(self._route_of) >= self.max_nodes:
                return Admission("refuse", "too_many_nodes", f"{len(self._route_of)} nodes routed (limits.max_nodes)")
            self._route_of[claimed] = route
            self._node_of[route] = claimed
            return ACCEPT
        self._route_of[claimed] = route
        self._node_of[route] = claimed
        del self._node_of[cur]
        return Admission("replace", "node_connection_replaced",
                         f"a new connection for node {claimed!r} replaced the previous one", old_route=cur)

    def route(self, node_id: str) -> bytes | None:
        """The routing id commands for ``node_id`` go to (None when the node has no connection)."""
        return self._route_of.get(node_id)

    def node(self, route: bytes) -> str | None:
        """The node id a connection speaks for."""
        return self._node_of.get(route)

    def forget(self, node_id: str) -> None:
        """Drop a node's route (e.g. when its record expires)."""
        route = self._route_of.pop(node_id, None)
        if route is not None:
            self._node_of.pop(route, None)

    def node_ids(self) -> list[str]:
        """Every routed node id."""
        return list(self._route_of)

    def __len__(self) -> int:
        return len(self._route_of)
