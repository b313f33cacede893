"""CURVE key material (I/O): certificate files, the allowed-client key ring, and a client's keys.

Format: the files ``zmq.auth.create_certificates`` writes (ZeroMQ's "ZPL" text format: a ``metadata`` section, then
``curve`` with ``public-key`` / ``secret-key`` in Z85). Each client certificate carries ``name`` and ``role``
metadata; the name becomes the ZAP ``User-Id`` of its connections (``daemon/profwatch/adapters/zmq/curve.py``).
"""

from __future__ import annotations

import os
import stat
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
import zmq
import zmq.auth

from profwatch.adapters.fs.bounded_read import read_capped
from profwatch.core.access import Role
from profwatch.core.messages import node_id_ok

log = structlog.get_logger("profwatch.curve")

ROLES: tuple[Role, ...] = ("node", "read", "act")


class CurveSetupError(RuntimeError):
    """CURVE is required but cannot be set up (missing or unreadable key, libzmq without CURVE, failed self-test).
    The message says what to do; the daemons exit 2 on it."""


@dataclass(frozen=True, slots=True)
class ClientKey:
    """One allowed client: certificate ``name`` (a node's id for role ``node``), ``role``, Z85 public key."""

    name: str
    role: Role
    public_z85: bytes
    path: Path | None = None


@dataclass(frozen=True, slots=True)
class KeyPair:
    """A certificate with its secret part (Z85 bytes) and metadata."""

    public: bytes
    secret: bytes
    metadata: dict[str, str]


# -- certificate files --------------------------------------------------------------------------------------------
MAX_KEY_FILE_BYTES = 64 * 1024
"""Largest certificate file read (a ZeroMQ certificate is ~300 bytes): a key directory entry that is a device, a
FIFO or a large file is refused unread (``adapters/fs/bounded_read.py``)."""


def _certificate_keys(raw: bytes) -> tuple[bytes | None, bytes | None]:
    """``(public, secret)`` Z85 keys of a certificate's bytes, parsed as pyzmq's ``zmq.auth.load_certificate``
    does (lines ``public-key = "..."`` / ``secret-key = "..."``, ``#`` comments), from bytes already read."""
    public = secret = None
    for line in raw.splitlines():
        line = line.strip()
        if line.startswith(b"#"):
            continue
        if line.startswith(b"public-key") and b"=" in line:
            public = line.split(b"=", 1)[1].strip(b" \t'\"")
        if line.startswith(b"secret-key") and b"=" in line:
            secret = line.split(b"=", 1)[1].strip(b" \t'\"")
        if public and secret:
            break
    return public, secret


def read_certificate(path: Path) -> tuple[bytes, bytes | None, dict[str, str]]:
    """``(public_z85, secret_z85 or None, metadata)`` of a certificate file.

    Raises:
        CurveSetupError: missing or unreadable file, no valid public key.
    """
    try:
        raw = read_capped(path, MAX_KEY_FILE_BYTES, "certificate")
        text = raw.decode("utf-8")
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise CurveSetupError(f"cannot read certificate {path}: {exc}") from None
    public, secret = _certificate_keys(raw)
    if public is None:
        raise CurveSetupError(f"cannot read certificate {path}: no public key found")
    if len(public) != 40 or (secret is not None and len(secret) != 40):
        raise CurveSetupError(f"certificate {path} holds no 40-character Z85 key")
    meta: dict[str, str] = {}
    section = ""
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if not line[0].isspace():
            section = line.strip()
        elif section == "metadata" and "=" in line:
            k, v = line.split("=", 1)
            meta[k.strip()] = v.strip().strip('"')
    return public, secret, meta


def _check_secret_mode(path: Path) -> None:
    try:
        mode = path.stat().st_mode
    except OSError as exc:
        raise CurveSetupError(f"cannot read {path}: {exc}") from None
    if mode & stat.S_IROTH:
        raise CurveSetupError(f"secret key {path} is readable by every user (mode {stat.S_IMODE(mode):o}); "
                              f"run: chmod 600 {path}")


def load_keypair(path: Path, what: str, fix: str) -> KeyPair:
    """Load a secret certificate (``*.key_secret``). Raises :class:`CurveSetupError` naming ``what`` and ``fix``."""
    if not path.is_file():
        raise CurveSetupError(f"{what} {path} does not exist; {fix}")
    _check_secret_mode(path)
    public, secret, meta = read_certificate(path)
    if secret is None:
        raise CurveSetupError(f"{what} {path} has no secret-key (is it the public .key file?); {fix}")
    return KeyPair(public, secret, meta)


def load_public_key(path: Path, what: str, fix: str) -> bytes:
    """Load the public key of a certificate. Raises :class:`CurveSetupError`."""
    if not path.is_file():
        raise CurveSetupError(f"{what} {path} does not exist; {fix}")
    return read_certificate(path)[0]


def create_certificate(directory: Path, name: str, role: Role | None) -> tuple[Path, Path]:
    """Write ``<name>.key`` (public, mode 0644) and ``<name>.key_secret`` (mode 0600) into ``directory`` with
    ``zmq.auth.create_certificates``; metadata ``name`` and ``role`` (none for the server) in both files (pyzmq
    writes metadata into the secret file only; it is added to the public one in the same format). Refuses to
    overwrite.

    Raises:
        CurveSetupError: bad name or role, or the files exist.
    """
    if not node_id_ok(name):
        raise CurveSetupError(f"key name {name!r} must be 1-128 letters, digits or _ . : - (a node's key name is its node id)")
    if role is not None and role not in ROLES:
        raise CurveSetupError(f"role must be one of {', '.join(ROLES)}")
    directory.mkdir(parents=True, exist_ok=True)
    pub, sec = directory / f"{name}.key", directory / f"{name}.key_secret"
    for p in (pub, sec):
        if p.exists():
            raise CurveSetupError(f"{p} exists; remove it first to replace the key")
    meta = {"name": name} | ({"role": role} if role else {})
    old = os.umask(0o077)
    try:
        zmq.auth.create_certificates(directory, name, metadata=meta)
    finally:
        os.umask(old)
    text = pub.read_text(encoding="utf-8")
    meta_lines = "".join(f"    {k} = {v}\n" for k, v in meta.items())
    pub.write_text(text.replace("metadata\n", "metadata\n" + meta_lines, 1), encoding="utf-8")
    os.chmod(sec, 0o600)
    os.chmod(pub, 0o644)
    return pub, sec


RECHECK_S = 0.5
"""How often (at most) the key ring looks at its directory again (seconds): a removed or edited key stops
working on open connections within about this long plus one main-loop turn (README "Security")."""


def _signature(directory: Path) -> tuple[object, ...]:
    """What identifies the directory's current key files: the directory's mtime and each ``*.key`` file's name,
    inode, size and mtime (an edit in place changes the file, not the directory). Raises OSError."""
    entries = []
    with os.scandir(directory) as it:
        for e in it:
            if e.name.endswith(".key"):
                try:
                    st = e.stat()
                except OSError:
                    continue
                entries.append((e.name, st.st_ino, st.st_size, st.st_mtime_ns))
    return (directory.stat().st_mtime_ns, tuple(sorted(entries)))


class KeyRing:
    """The allowed client certificates of one directory (``*.key`` files with ``name``/``role`` metadata).

    Looked at again at most every :data:`RECHECK_S` seconds (the directory's mtime and every key file's inode,
    size and mtime, so a key edited in place counts too) and re-read when anything changed: ``profwatch keys add``
    takes effect without a restart, and a removed or changed key is no longer :meth:`admits`-ed, which the
    coordinator checks for every message of an open connection (``adapters/zmq/server_sockets.py``).
    ``generation`` counts the reloads that changed the admitted keys. Thread-safe (the ZAP thread reads it).
    """

    def __init__(self, directory: Path, recheck_s: float = RECHECK_S) -> None:
        self.directory = directory
        self.recheck_s = recheck_s
        self._lock = threading.Lock()
        self._by_key: dict[bytes, ClientKey] = {}
        self._by_name: dict[str, ClientKey] = {}
        self._probes: dict[bytes, ClientKey] = {}
        self._signature: tuple[object, ...] = ()
        self._checked = 0.0
        self.generation = 0
        self.problems: list[str] = []
        if not directory.is_dir():
            raise CurveSetupError(f"client key directory {directory} does not exist; run `profwatch keys init` "
                                  "and add clients with `profwatch keys add NAME --role node|read|act`")
        self._load()

    def _load(self) -> bool:
        """Re-read every key file; True when the admitted keys (key, name, role) changed."""
        by_key: dict[bytes, ClientKey] = {}
        by_name: dict[str, ClientKey] = {}
        problems = []
        try:
            signature = _signature(self.directory)
            files = sorted(self.directory.glob("*.key"))
        except OSError as exc:
            problems.append(f"{self.directory}: {exc}")
            files, signature = [], ()
        for f in files:
            try:
                public, _secret, meta = read_certificate(f)
            except CurveSetupError as exc:
                problems.append(str(exc))
                continue
            name, role = meta.get("name") or f.stem, meta.get("role", "")
            if role not in ROLES or not node_id_ok(name) or name in by_name:
                problems.append(f"{f}: needs metadata role = node|read|act and a unique name (got {name!r}, {role!r})")
                continue
            key = ClientKey(name, role, public, f)
            by_key[public] = key
            by_name[name] = key
        with self._lock:
            changed = {k: (v.name, v.role) for k, v in by_key.items()} != \
                {k: (v.name, v.role) for k, v in self._by_key.items()}
            self._by_key, self._by_name, self._signature = by_key, by_name, signature
            if changed:
                self.generation += 1
            self.problems = problems
        for p in problems:
            log.warning("client_key_ignored", problem=p)
        return changed

    def refresh(self, force: bool = False) -> None:
        """Reload when the directory or a key file changed (looked at once per ``recheck_s`` unless ``force``)."""
        now = time.monotonic()
        if not force and now - self._checked < self.recheck_s:
            return
        self._checked = now
        try:
            signature = _signature(self.directory)
        except OSError:
            signature = ()
        if signature != self._signature:
            changed = self._load()
            log.info("client_keys_reloaded", directory=str(self.directory), keys=len(self._by_key), changed=changed)

    def admits(self, public_z85: bytes, name: str | None, roles: frozenset[Role]) -> ClientKey | None:
        """The key ring's entry for ``public_z85`` when it is still there, under ``name`` (when given), with one
        of ``roles``; None when it was removed, renamed or given another role since."""
        key = self.lookup(public_z85)
        if key is None or key.role not in roles or (name is not None and key.name != name):
            return None
        return key

    def lookup(self, public_z85: bytes) -> ClientKey | None:
        self.refresh()
        with self._lock:
            return self._by_key.get(public_z85) or self._probes.get(public_z85)

    def by_name(self, name: str) -> ClientKey | None:
        self.refresh()
        with self._lock:
            return self._by_name.get(name)

    def __len__(self) -> int:
        return len(self._by_key)

    def names(self) -> list[str]:
        with self._lock:
            return list(self._by_name)

    def add_probe(self, key: ClientKey) -> None:
        """Admit an in-memory key (the self-test's probe)."""
        with self._lock:
            self._probes[key.public_z85] = key

    def remove_probe(self, public_z85: bytes) -> None:
        with self._lock:
            self._probes.pop(public_z85, None)


def client_keys(security: Any, endpoint: str) -> tuple[KeyPair, bytes] | None:
    """The client's key pair and the server's public key when ``endpoint`` uses CURVE, else None.

    ``security`` is the ``[security]`` settings (:class:`profwatch.core.access.SecuritySettings`).
    Raises:
        CurveSetupError: CURVE is required and a key is missing or unreadable (the message says how to fix it).
    """
    if not security.curve_for(endpoint):
        return None
    require_curve()
    keys = load_keypair(security.client_secret_path(), "client secret key",
                        "ask the coordinator's administrator for a certificate (`profwatch keys add NAME --role "
                        "node|read|act`) and install its .key_secret there (or set security.client_secret_key)")
    server = load_public_key(security.server_public_path(), "coordinator public key",
                             "copy the coordinator's server.key there (or set security.server_public_key)")
    return keys, server


def require_curve() -> None:
    if not zmq.has("curve"):
        raise CurveSetupError(f"this libzmq ({zmq.zmq_version()}) was built without CURVE; install pyzmq's wheel "
                              "(bundled libzmq with CURVE) or set security.insecure = true on a trusted network")
