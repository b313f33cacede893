"""Issue 33 #4: a bounded reader everywhere a file or pipe is read. Whole-file readers of paths a user or peer
controls (certificates in the client key directory, JSON documents in a capture, config files, authorization
files) read through ``adapters/fs/bounded_read.read_capped``: a device (``/dev/zero``: unbounded memory before), a
FIFO (blocked the reader for ever before) or a file over the cap is refused unread with an error naming it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from profwatch.adapters.fs.bounded_read import InputTooLarge, read_capped
from profwatch.adapters.tools.msprof_db import MAX_INFO_JSON_BYTES, inspect_inputs
from profwatch.adapters.zmq.keyfiles import KeyRing, create_certificate
from profwatch.config import MAX_CONFIG_BYTES, ConfigError, load_settings


def _hostile(d: Path, stem: str, suffix: str, big_bytes: int) -> list[Path]:
    dev = d / f"{stem}-dev{suffix}"
    dev.symlink_to("/dev/zero")
    fifo = d / f"{stem}-fifo{suffix}"
    os.mkfifo(fifo)
    big = d / f"{stem}-big{suffix}"
    with open(big, "wb") as f:
        f.truncate(big_bytes)  # sparse: large without writing it
    return [dev, fifo, big]


def test_read_capped_reads_a_small_file_and_refuses_devices_fifos_dirs_and_large_files(tmp_path: Path) -> None:
    ok = tmp_path / "ok"
    ok.write_bytes(b"x" * 100)
    assert read_capped(ok, 100) == b"x" * 100
    dev, fifo, big = _hostile(tmp_path, "f", "", 101)
    for p, says in ((dev, "not a regular file"), (fifo, "not a regular file"), (tmp_path, "not a regular file"),
                    (big, "101 bytes, over the 100-byte cap")):
        with pytest.raises(InputTooLarge, match=says) as ei:
            read_capped(p, 100, "key file")
        assert str(ei.value).startswith(f"key file {p} ")
    with pytest.raises(FileNotFoundError):
        read_capped(tmp_path / "none", 100)


def test_a_key_directory_entry_that_is_a_device_fifo_or_large_file_is_a_problem_not_a_hang(tmp_path: Path) -> None:
    keys = tmp_path / "clients"
    keys.mkdir()
    out = tmp_path / "issued"
    out.mkdir()
    pub, _sec = create_certificate(out, "n1", "node")
    (keys / "n1.key").write_bytes(pub.read_bytes())
    _hostile(keys, "evil", ".key", 100 * 1024)
    ring = KeyRing(keys)
    assert len(ring) == 1 and ring.lookup(next(iter(ring._by_key))) is not None
    assert len(ring.problems) == 3
    assert sum("not a regular file" in p for p in ring.problems) == 2
    assert sum("over the 65536-byte cap" in p for p in ring.problems) == 1


def test_a_capture_json_that_is_a_device_fifo_or_huge_is_refused_unread(tmp_path: Path) -> None:
    rank_dir = tmp_path / "staged" / "host_1_20260101_ascend_pt"
    (rank_dir / "ASCEND_PROFILER_OUTPUT").mkdir(parents=True)
    hostile = _hostile(tmp_path, "j", ".json", MAX_INFO_JSON_BYTES + 1)
    for name in ("profiler_info_0.json", "profiler_metadata.json"):
        for p, says in zip(hostile, ("not a regular file", "not a regular file", "over the"), strict=True):
            target = rank_dir / name
            if target.is_symlink():
                target.unlink()
            target.symlink_to(p)
            facts = inspect_inputs(tmp_path / "staged")  # never hangs, never reads the device whole
            assert facts.rank_count == 1
            assert [n for n in facts.notes if str(target) in n and says in n], (name, p, facts.notes)
        (rank_dir / name).unlink()


def test_a_config_file_over_the_cap_is_a_clear_error(tmp_path: Path) -> None:
    big = tmp_path / "profwatch.toml"
    big.write_bytes(b"# padding\n" * (MAX_CONFIG_BYTES // 10 + 1))
    with pytest.raises(ConfigError, match=f"over the {MAX_CONFIG_BYTES}-byte cap"):
        load_settings(big)
