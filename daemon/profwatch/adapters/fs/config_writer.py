"""Writes ``profiler_config.json`` in place for torch_npu's dynamic_profile monitor (I/O adapter).

Rules (``docs/torch_npu-dynamic-profile.md#writer-rules`` items 2, 3, 7 and ``#mtime-rules``; ``docs/field-cases.md#fc-14``; verified against
the real monitor in ``docs/conformance.md``):

* **In place, same inode**: no delete (the monitor logs "cfg json not exists" while absent), no copy-over or
  rename (owner/mode/ACL of the rank user's file stay as they are; symlinks are refused). The config dir is opened
  from its allowed root one component at a time without following links (``profwatch.adapters.fs.paths.open_dir``) and
  every file operation is relative to that descriptor (``openat`` semantics, ``O_NOFOLLOW``), so a component
  swapped for a symlink after the check is refused, never followed. The new JSON goes in
  with **one** ``pwrite`` at offset 0 that is at least as long as the old content (padded with trailing spaces,
  which JSON allows), then the file is truncated to a length >= the new JSON. At no point does the file hold
  fewer bytes than a complete document, so a concurrent reader sees the old document, the new one, or (only if
  the kernel interleaves a read with the page copy, which Linux does not exclude) a mix; it never sees an empty
  or cut-off file.
* **Fresh whole-second mtime**: the write lands in a second strictly later than the previous edit (ours, per
  path, kept in memory, and the file's own mtime, e.g. a hand edit) and than ``not_before_unix_s`` (the ranks'
  start: their acceptance is strictly-newer than their init second); if needed the writer waits for the next
  second (bounded).
* **After a future mtime**: when the file's mtime (or our previous one) is ahead of the clock (``touch -d``, a
  skewed NFS server), ranks may already have accepted it, and torch_npu then ignores every edit whose mtime is
  not beyond it (verified against torch-npu 2.13.0, ``docs/conformance.md``). The writer does not wait for the
  clock then: it sets the new content's mtime to the second after that future one (``os.utime``) and logs
  ``config_mtime_ahead_of_clock``. Later writes keep counting up from there until the clock catches up.
* **Re-read after a torn read**: the mtime is then bumped by one more second with ``os.utime`` (once the clock
  reached that second, or at once when it is already ahead of the clock) so a monitor that read mid-write (and
  keyed the bad read to the write's second) reads the complete content again. The returned ``mtime_s`` is the
  final one. Both generations carry the same content, so an absolute ``start_step`` makes the double delivery
  harmless (a ``-1`` would not be).
"""

from __future__ import annotations

import fcntl
import json
import os
import stat
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import structlog

from profwatch.adapters.fs.paths import PathRefused, open_dir
from profwatch.core.capture.planner import InvalidProfilerConfig, ProfilerConfig
from profwatch.core.capture.profiler_config import check_idle_config
from rankhook.profconfig import CONFIG_FILE, TEMPLATE

log = structlog.get_logger("profwatch.config_writer")

MAX_WAIT_S = 3.0
"""Longest the writer waits for an acceptable mtime second before refusing (ConfigWriteTooEarly)."""


class ConfigWriteError(RuntimeError):
    """Base of every refusal of :class:`ConfigWriter`; the message names the path and the reason."""


class ConfigDirNotAllowed(ConfigWriteError):
    """The config dir is not inside any allowed root (or reaches it only through a symlink)."""


class ConfigDirMissing(ConfigWriteError):
    """The config dir does not exist (vanished) or is not a directory."""


class ConfigDirReadOnly(ConfigWriteError):
    """The config dir or file is not writable (read-only mount, no write permission bits)."""


class ConfigPathSymlink(ConfigWriteError):
    """The config dir, a component below the allowed root, or ``profiler_config.json`` is a symlink."""


class ConfigWriteTooEarly(ConfigWriteError):
    """A strictly newer second than the previous edit / ``not_before_unix_s`` is more than MAX_WAIT_S away."""


class ConfigIdleNotNeeded(ConfigWriteError):
    """An idle write found the file no longer holding the arm it was to take back (another arm, a hand edit, or
    the idle config already): nothing was written."""


def _held_capture(raw: bytes) -> str | None:
    """``metadata.profwatch_capture_id`` of a config file's bytes (None for anything else, never raises)."""
    try:
        meta = json.loads(raw).get("metadata")
        cid = meta.get("profwatch_capture_id") if isinstance(meta, dict) else None
    except (ValueError, AttributeError, RecursionError):
        return None
    return cid if isinstance(cid, str) else None


@dataclass(frozen=True, slots=True)
class WriteResult:
    """``path`` written, its final whole-second ``mtime_s``, its ``inode``; ``created`` if the template was
    created first; ``replaced_problem`` describes an invalid hand-edited config that was in the file."""

    path: str
    mtime_s: int
    inode: int
    created: bool = False
    replaced_problem: str | None = None


class ConfigWriter:
    """Edits ``profiler_config.json`` files; remembers per path the last mtime and content it wrote.

    Args:
        clock: wall clock in seconds (``time.time``); sleep: ``time.sleep``. Both injectable for tests.
        max_wait_s: bound for waiting on a fresh second.
    """

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
        max_wait_s: float = MAX_WAIT_S,
    ) -> None:
        self._clock = clock
        self._sleep = sleep
        self._max_wait_s = max_wait_s
        self._last_mtime: dict[str, int] = {}
        self._last_content: dict[str, dict[str, Any]] = {}

    def last_content(self, config_dir: str) -> dict[str, Any] | None:
        """The last valid content this writer wrote to ``config_dir`` (kept even if the file was hand-edited)."""
        return self._last_content.get(os.path.join(os.path.abspath(config_dir), CONFIG_FILE))

    def write(
        self,
        config_dir: str,
        content: dict[str, Any],
        *,
        not_before_unix_s: float,
        allowed_roots: Sequence[str],
        idle_for: str | None = None,
    ) -> WriteResult:
        """Write ``content`` (validated as :class:`ProfilerConfig`) into ``<config_dir>/profiler_config.json``.

        ``idle_for="<capture id>"``: ``content`` is the idle config (start_step 0, checked by
        :func:`profwatch.core.capture.profiler_config.check_idle_config`) that takes that capture's arm back; it is written
        only while the file still holds that arm (``metadata.profwatch_capture_id``), so a late or repeated idle
        write never replaces a newer arm or a hand edit (:class:`ConfigIdleNotNeeded` otherwise).
        An idle write for a dir this writer could never have written (missing, outside the roots, through a link)
        is :class:`ConfigIdleNotNeeded` too: no arm of that capture can be there.
        Writers of one file take turns (``flock`` on it, held from the check to the mtime bump), so two writers,
        e.g. node daemons sharing a config dir on shared storage, never interleave.
        Blocks up to ~``max_wait_s`` + 1 s (fresh second, then the mtime bump). Raises
        :class:`InvalidProfilerConfig` for bad content and a :class:`ConfigWriteError` subclass for refusals.
        """
        if idle_for is not None:
            check_idle_config(content)
        else:
            ProfilerConfig.parse(content)
        data = json.dumps(content, indent=4).encode()
        try:
            d = check_config_dir(config_dir, allowed_roots)
            path = os.path.join(d, CONFIG_FILE)
            try:
                dfd = open_dir(d, allowed_roots)
            except PathRefused as exc:
                raise ConfigPathSymlink(str(exc)) from None
            except FileNotFoundError:
                raise ConfigDirMissing(f"{d} does not exist") from None
        except (ConfigDirMissing, ConfigDirNotAllowed, ConfigPathSymlink) as exc:
            if idle_for is None:
                raise
            raise ConfigIdleNotNeeded(f"no arm of capture {idle_for} can be there: {exc}") from None
        try:
            return self._write_in(dfd, d, path, content, data, not_before_unix_s, idle_for)
        finally:
            os.close(dfd)

    def _write_in(self, dfd: int, d: str, path: str, content: dict[str, Any], data: bytes,
                  not_before_unix_s: float, idle_for: str | None = None) -> WriteResult:
        """The write itself, every file operation relative to the config dir's descriptor ``dfd``."""
        created = self._ensure_file(dfd, path)
        try:
            fd = os.open(CONFIG_FILE, os.O_RDWR | os.O_NOFOLLOW, dir_fd=dfd)
        except PermissionError as exc:
            raise ConfigDirReadOnly(f"cannot open {path} for writing: {exc}") from None
        except OSError as exc:  # ELOOP: replaced by a symlink since the check
            raise ConfigPathSymlink(f"cannot open {path} without following links: {exc}") from None
        try:
            st0 = os.fstat(fd)
            if not stat.S_ISREG(st0.st_mode):
                raise ConfigWriteError(f"{path} is not a regular file")
            fcntl.flock(fd, fcntl.LOCK_EX)  # one writer at a time from here to the mtime bump (released by close)
            if idle_for is not None:
                self._check_held(fd, path, idle_for)
            st0 = os.fstat(fd)  # another writer may have been before us
            problem = self._check_current(fd, path, st0.st_size)
            ahead = self._wait_for_fresh_second(path, st0, not_before_unix_s)
            if idle_for is not None:
                self._check_held(fd, path, idle_for)  # again, right before the write
            padded = data + b" " * max(0, st0.st_size - len(data))
            n = os.pwrite(fd, padded, 0)
            while n < len(padded):  # a short write on a regular file is exceptional; finish it
                n += os.pwrite(fd, padded[n:], n)
            os.fsync(fd)
            if len(padded) > len(data):
                os.ftruncate(fd, len(data))
                os.fsync(fd)
            st1 = os.fstat(fd)
            if (st1.st_uid, st1.st_gid, stat.S_IMODE(st1.st_mode)) != (st0.st_uid, st0.st_gid,
                                                                       stat.S_IMODE(st0.st_mode)):
                log.warning("config_owner_or_mode_changed", path=path)
            written_m = int(st1.st_mtime)
            if ahead is not None:
                try:
                    os.utime(CONFIG_FILE, (self._clock(), float(ahead)), dir_fd=dfd, follow_symlinks=False)
                    written_m = ahead
                    log.warning("config_mtime_ahead_of_clock", path=path, mtime_s=ahead,
                                ahead_s=round(ahead - self._clock()),
                                note="ranks that saw the future mtime ignore older ones")
                except PermissionError:  # an explicit mtime needs ownership: the content is written all the same
                    log.warning("config_mtime_ahead_not_settable", path=path, mtime_s=ahead,
                                note="the file is not ours: ranks that saw its future mtime ignore this edit")
            mtime = self._bump_mtime(dfd, path, written_m)
        finally:
            os.close(fd)  # releases the lock
        self._last_mtime[path] = mtime
        self._last_content[path] = content
        log.info("config_written", path=path, mtime_s=mtime, inode=st1.st_ino, start_step=content.get("start_step"))
        return WriteResult(path, mtime, st1.st_ino, created, problem)

    # -- steps --------------------------------------------------------------------------------------------------
    @staticmethod
    def _check_held(fd: int, path: str, capture_id: str) -> None:
        """Raise :class:`ConfigIdleNotNeeded` unless the file holds ``capture_id``'s arm."""
        held = _held_capture(os.pread(fd, min(os.fstat(fd).st_size, 1 << 21), 0))
        if held != capture_id:
            raise ConfigIdleNotNeeded(f"{path} holds {f'capture {held}' if held else 'no profwatch arm'} now, "
                                      f"not capture {capture_id}'s: left as it is")

    def _ensure_file(self, dfd: int, path: str) -> bool:
        """Create torch_npu's template (0640, indent 4, owned like the dir ``dfd``) only if the file is absent."""
        try:
            st = os.lstat(CONFIG_FILE, dir_fd=dfd)
        except FileNotFoundError:
            st = None
        if st is not None:
            if stat.S_ISLNK(st.st_mode):
                raise ConfigPathSymlink(f"{path} is a symlink; refusing to write through it")
            return False
        try:
            fd = os.open(CONFIG_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o640, dir_fd=dfd)
        except FileExistsError:
            return False
        except PermissionError as exc:
            raise ConfigDirReadOnly(f"cannot create {path}: {exc}") from None
        try:
            os.write(fd, json.dumps(TEMPLATE, indent=4).encode())
            os.fchmod(fd, 0o640)
            if os.geteuid() == 0:
                dst = os.fstat(dfd)
                os.fchown(fd, dst.st_uid, dst.st_gid)  # the rank user must read it (mtime rules)
            os.fsync(fd)
            m = int(os.fstat(fd).st_mtime)
        finally:
            os.close(fd)
        self._last_mtime[path] = max(self._last_mtime.get(path, 0), m)
        log.info("config_template_created", path=path)
        return True

    def _check_current(self, fd: int, path: str, size: int) -> str | None:
        """Report an invalid hand edit in the file (our last valid content stays in memory)."""
        raw = os.pread(fd, min(size, 1 << 21), 0)
        try:
            cur = json.loads(raw) if raw.strip() else {}
        except ValueError as exc:
            problem = f"not JSON: {exc}"
        else:
            if cur == self._last_content.get(path) or cur == TEMPLATE:
                return None
            try:
                if isinstance(cur, dict) and cur.get("start_step") == 0 and cur.get("metadata"):
                    check_idle_config(cur)  # an idle config (a cancel's, maybe by another writer) is no hand edit
                else:
                    ProfilerConfig.parse(cur)
                return None
            except InvalidProfilerConfig as exc:
                problem = str(exc)
        log.warning("config_hand_edit_invalid", path=path, problem=problem,
                    kept_in_memory=self._last_content.get(path) is not None)
        return problem

    def _wait_for_fresh_second(self, path: str, st: os.stat_result, not_before_unix_s: float) -> int | None:
        """Wait until the clock is in a second the ranks accept; return None, or the mtime to set explicitly when
        the file's (or our previous) mtime is ahead of the clock (see the module doc)."""
        now = self._clock()
        seen = max(self._last_mtime.get(path, 0), int(st.st_mtime))
        if seen + 1 > now + self._max_wait_s:
            return max(seen, int(not_before_unix_s)) + 1
        need = max(seen, int(not_before_unix_s)) + 1
        if need > now + self._max_wait_s:
            raise ConfigWriteTooEarly(f"{path}: next acceptable mtime second {need} is {need - now:.1f}s away")
        while int(now) < need:
            self._sleep(max(0.005, need - now))
            now = self._clock()
        return None

    def _bump_mtime(self, dfd: int, path: str, written_m: int) -> int:
        """Set the mtime to the second after the write: once the clock reached it, or at once when the written
        mtime is already ahead of the clock."""
        target = written_m + 1
        now = self._clock()
        if target <= now + self._max_wait_s:
            while now < target:
                self._sleep(max(0.005, target - now))
                now = self._clock()
        try:
            os.utime(CONFIG_FILE, (now, float(target)), dir_fd=dfd, follow_symlinks=False)
        except PermissionError:
            # an explicit time needs ownership (torch_npu created the file as the rank's user); "now" needs only
            # write access. The file system's clock is coarse (it can lag time.time() by a tick, ~4 ms): right after
            # the second turned, "now" may still land in the written second, so stamp again until it does not
            end = self._clock() + 2.0
            while True:
                os.utime(CONFIG_FILE, None, dir_fd=dfd, follow_symlinks=False)
                got = int(os.stat(CONFIG_FILE, dir_fd=dfd, follow_symlinks=False).st_mtime)
                if got > written_m:
                    return got
                if self._clock() > end:
                    log.warning("config_mtime_not_advanced", path=path, mtime_s=got, written_s=written_m,
                                note="the file system kept the written second: ranks may ignore this edit")
                    return got
                self._sleep(0.005)
        return target


def check_config_dir(config_dir: str, allowed_roots: Sequence[str]) -> str:
    """Return the absolute config dir if it is a real, writable directory inside one of ``allowed_roots``.

    The dir is taken lexically (``abspath``, no link resolution); each component below the matching root must
    not be a symlink, so a link cannot lead out of the root. Roots themselves may be symlinks (compared both as
    given and resolved). Raises ConfigDirNotAllowed / ConfigPathSymlink / ConfigDirMissing / ConfigDirReadOnly.
    """
    if not os.path.isabs(config_dir):
        raise ConfigDirNotAllowed(f"config dir must be absolute, got {config_dir!r}")
    d = os.path.abspath(config_dir)
    root = None
    for r in allowed_roots:
        for cand in {os.path.abspath(r), os.path.realpath(r)}:
            if d == cand or d.startswith(cand.rstrip("/") + "/"):
                root = cand
                break
        if root:
            break
    if root is None:
        raise ConfigDirNotAllowed(f"{d} is outside the allowed roots {list(allowed_roots)}")
    cur = root
    rest = [p for p in d[len(root):].split("/") if p]
    for part in rest:
        cur = os.path.join(cur, part)
        try:
            st = os.lstat(cur)
        except FileNotFoundError:
            raise ConfigDirMissing(f"{cur} does not exist") from None
        if stat.S_ISLNK(st.st_mode):
            raise ConfigPathSymlink(f"{cur} is a symlink; refusing (it could lead out of {root})")
    try:
        st = os.stat(d)
    except FileNotFoundError:
        raise ConfigDirMissing(f"{d} does not exist") from None
    if not stat.S_ISDIR(st.st_mode):
        raise ConfigDirMissing(f"{d} is not a directory")
    if os.statvfs(d).f_flag & os.ST_RDONLY:
        raise ConfigDirReadOnly(f"{d} is on a read-only file system")
    if stat.S_IMODE(st.st_mode) & 0o222 == 0 or not os.access(d, os.W_OK):
        raise ConfigDirReadOnly(f"{d} is read-only (mode {stat.S_IMODE(st.st_mode):o})")
    return d


def write_profiler_config(
    config_dir: str,
    content: dict[str, Any],
    *,
    not_before_unix_s: float,
    allowed_roots: Sequence[str],
) -> WriteResult:
    """One-shot :meth:`ConfigWriter.write` (the file's own mtime stands in for the writer's memory)."""
    return ConfigWriter().write(config_dir, content, not_before_unix_s=not_before_unix_s, allowed_roots=allowed_roots)
