"""Ingest identity binding (pure): a node id is the key's name under CURVE; a newer connection for a node replaces
the old one, which is told to reconnect; a connection keeps its node id; node ids are capped."""

from __future__ import annotations

from profwatch.core.fleet.peers import NodeRoutes


def test_key_decides_the_node_id() -> None:
    r = NodeRoutes()
    assert r.admit(b"c1", "nodeA", "nodeA").action == "accept"
    bad = r.admit(b"c2", "nodeA", "nodeB")  # key B claims node A
    assert bad.action == "refuse" and bad.reason == "node_id_mismatch"
    assert r.route("nodeA") == b"c1"  # the real node keeps its route: commands still reach it


def test_same_key_new_connection_replaces_and_names_the_old_one() -> None:
    r = NodeRoutes()
    r.admit(b"old", "nodeA", "nodeA")
    v = r.admit(b"new", "nodeA", "nodeA")
    assert v.action == "replace" and v.old_route == b"old"
    assert r.route("nodeA") == b"new" and r.node(b"old") is None
    assert r.admit(b"new", "nodeA", "nodeA").action == "accept"


def test_without_keys_a_connection_keeps_its_first_id() -> None:
    r = NodeRoutes()
    r.admit(b"c1", "nodeA", None)
    v = r.admit(b"c1", "nodeB", None)
    assert v.action == "refuse" and v.reason == "node_id_changed"
    assert r.route("nodeB") is None


def test_node_ids_are_capped_and_forgettable() -> None:
    r = NodeRoutes(max_nodes=2)
    assert r.admit(b"1", "a", None).action == "accept"
    assert r.admit(b"2", "b", None).action == "accept"
    v = r.admit(b"3", "c", None)
    assert v.action == "refuse" and v.reason == "too_many_nodes"
    r.forget("a")
    assert r.admit(b"3", "c", None).action == "accept" and len(r) == 2 and sorted(r.node_ids()) == ["b", "c"]
