"""Reads each rank dir of a capture once, as soon as its scan sees it finished, on a bounded thread pool, and hands
the reads to the capture's analysis (I/O adapter). Used for the Ascend ranks' own tables
(``own_tables_reader.TablePrefetcher``) and the torch.profiler ranks' Kineto traces
(``kineto_reader.TracePrefetcher``): at completion only the ranks not read yet and the cross-rank step remain.
Each read carries what it was read from (a signature), so the analysis uses it only while that is unchanged.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Generic, TypeVar

T = TypeVar("T")


class RankPrefetcher(Generic[T]):
    """``read(rank, rank_dir)`` of each rank dir submitted, once per capture and path, on a pool of ``workers``
    threads; :meth:`take` hands a capture's finished reads to its analysis. At most ``max_captures`` captures are
    kept (the oldest dropped first, its queued reads cancelled). Thread-safe."""

    def __init__(self, read: Callable[[int, Path], T], workers: int = 4, max_captures: int = 8, *,
                 thread_name: str = "profwatch-prefetch") -> None:
        self._read = read
        self._pool = ThreadPoolExecutor(max(1, workers), thread_name_prefix=thread_name)
        self._lock = threading.Lock()
        self._reads: OrderedDict[str, dict[str, Future[T]]] = OrderedDict()
        self._max = max_captures

    def submit(self, key: str, rank_dirs: Mapping[int, str]) -> int:
        """Queue the reads of ``rank_dirs`` (rank -> path) not yet asked for under ``key``; returns how many."""
        with self._lock:
            reads = self._reads.setdefault(key, {})
            self._reads.move_to_end(key)
            while len(self._reads) > self._max:
                _, old = self._reads.popitem(last=False)
                for fut in old.values():
                    fut.cancel()
            new = {r: p for r, p in rank_dirs.items() if p not in reads}
            for rank, path in new.items():
                reads[path] = self._pool.submit(self._read, rank, Path(path))
        return len(new)

    def unfinished(self, key: str) -> int:
        """Reads queued or running under ``key``."""
        with self._lock:
            return sum(not fut.done() for fut in self._reads.get(key, {}).values())

    def take(self, key: str) -> dict[str, T]:
        """The finished reads of ``key`` (path -> read), forgotten here; queued ones are cancelled (the analysis
        reads those itself), running ones are waited for (finishing is quicker than starting over), failed ones
        left out (the analysis reads them again and reports the failure itself)."""
        with self._lock:
            reads = self._reads.pop(key, {})
        out = {}
        for path, fut in reads.items():
            if fut.cancel():
                continue
            try:
                out[path] = fut.result()
            except Exception:  # noqa: BLE001 - a failed read is read again by the analysis
                continue
        return out

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
