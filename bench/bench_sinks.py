"""Alert sink costs on the coordinator's main loop (prints numbers; no assertions).

1. ``AlertBook.apply`` per suspect_ranks event and ``due`` (re-send of every standing alert) for many jobs.
2. ``AlertSinks.submit`` latency while the Alertmanager endpoint is a black hole (accepts TCP, never answers):
   the caller must not wait on the network; the bounded queue drops and counts.
3. Rebuilding the book from stored events after a restart (``restore``).

Usage: python bench/bench_sinks.py [--jobs 200] [--events 2000]
"""

from __future__ import annotations

import argparse
import socket
import statistics
import time

from profwatch.adapters.outputs.alert_sinks import AlertSinks
from profwatch.core.alerts.alertmanager import AlertBook
from profwatch.core.alerts.events import TYPE_SUSPECT_RANKS, make_cloudevent
from profwatch.core.alerts.settings import AlertmanagerSettings, WebhookSettings


def _event(job: int, i: int, t: float) -> dict:
    suspects = [{"rank": (i + k) % 64, "score": 0.9 - 0.1 * k, "kind": "compute", "hostname": f"n{k}",
                 "rank_dir": f"/p/{k}", "evidence": {"summary": "x", "effect_frac": 0.3}} for k in range(3)]
    data = {"batch_id": f"b{i}", "capture_id": f"c{i}", "status": "ok", "world_size": 64,
            "judged_ranks": list(range(64)), "suspects": suspects, "paths": {"report_html": f"/w/{i}/report.html"}}
    return make_cloudevent(TYPE_SUSPECT_RANKS, f"job{job}", data, source="//bench", now_unix_s=t,
                           event_id=f"e{job}-{i}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--events", type=int, default=2000)
    a = ap.parse_args()
    t0 = 1.7e9
    events = [_event(i % a.jobs, i, t0 + i) for i in range(a.events)]

    book = AlertBook(cluster="bench", resend_interval_s=60)
    lat = []
    for i, ev in enumerate(events):
        s = time.perf_counter()
        book.apply(ev, t0 + i)
        lat.append(time.perf_counter() - s)
    s = time.perf_counter()
    due = book.due(t0 + a.events)
    due_s = time.perf_counter() - s
    print(f"AlertBook.apply: {a.events} events over {a.jobs} jobs: median {statistics.median(lat) * 1e6:.1f} us, "
          f"max {max(lat) * 1e6:.1f} us; standing alerts {len(book.alerts)}; due() re-send of {len(due)} alerts "
          f"{due_s * 1e3:.2f} ms")

    s = time.perf_counter()
    n = AlertBook(cluster="bench", resend_interval_s=60).restore(events)
    print(f"AlertBook.restore: {a.events} stored events -> {n} standing alerts in {(time.perf_counter() - s) * 1e3:.1f} ms")

    hole = socket.socket()
    hole.bind(("127.0.0.1", 0))
    hole.listen(4096)
    url = f"http://127.0.0.1:{hole.getsockname()[1]}"
    sinks = AlertSinks.from_settings(AlertmanagerSettings(url=url, timeout_s=2, retries=0, queue_size=100),
                                     WebhookSettings(), {})
    lat = []
    try:
        for i, ev in enumerate(events):
            s = time.perf_counter()
            sinks.submit(ev, True, t0 + i)
            lat.append(time.perf_counter() - s)
        poster = sinks.sinks[0].poster
        lat.sort()
        print(f"AlertSinks.submit with a black-hole Alertmanager: median {statistics.median(lat) * 1e6:.1f} us, "
              f"p99 {lat[int(0.99 * (len(lat) - 1))] * 1e6:.1f} us, max {lat[-1] * 1e3:.2f} ms; "
              f"queued {poster.stats.queued}, dropped {poster.stats.dropped}")
        s = time.perf_counter()
    finally:
        sinks.close(flush_s=0.0)
        hole.close()
    print(f"close with a request in flight: {(time.perf_counter() - s):.2f} s")


if __name__ == "__main__":
    main()
