"""The stage ``status`` shows for a capture's analysis (``captures/analysis_steps.py: AnalysisSteps.stage_of``)
survives the order in which the analysis worker, the main loop and the enrich worker touch it."""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from profwatch.captures import analysis_steps as steps_mod
from profwatch.captures.analysis_steps import AnalysisSteps


class _Held:
    """An executor that keeps what it is given until run (the worker has not picked it up yet)."""

    def __init__(self) -> None:
        self.jobs: list[tuple[Any, tuple[Any, ...]]] = []

    def submit(self, fn: Any, *args: Any) -> Future[None]:
        self.jobs.append((fn, args))
        return Future()

    def run(self) -> None:
        while self.jobs:
            fn, args = self.jobs.pop(0)
            fn(*args)


def test_an_enrich_queued_before_the_analysis_worker_let_go_keeps_its_stage(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The analysis worker posts its verdict, then clears the capture's stage; the main loop may queue the enrich
    phase (or the enrich worker start it) in between. It cleared whatever stage was there: the capture showed no
    stage for its whole enrich phase. Here the main loop runs the post at once (the worker not yet past it)."""
    monkeypatch.setattr(steps_mod.lc, "analysis_context", lambda cap: {})
    analyser = SimpleNamespace(analyse=lambda *a, **k: ("ok", {}), enrich=lambda cid: ("ok", {}))
    steps: AnalysisSteps
    posted: list[Any] = []

    def post(fn: Any) -> None:  # the main loop: the verdict's post queues the enrich phase at once
        posted.append(fn)
        if len(posted) == 1:
            steps.enrich("c1")

    steps = AnalysisSteps(store=None, jobs={}, analyser=analyser, scanner=None, work_dir=tmp_path,  # type: ignore[arg-type]
                          watch=None, analysis_workers=1, settings=None, fs_pool=None,  # type: ignore[arg-type]
                          find=lambda cid: None, apply=lambda t: None,  # type: ignore[arg-type,return-value]
                          post=post, clock=lambda: 0.0)
    try:
        held = _Held()
        steps.enrich_pool = held  # type: ignore[assignment]
        cap = SimpleNamespace(capture_id="c1", job_id="j1", config={}, reason="r")
        steps._analyse(cap, SimpleNamespace())  # type: ignore[arg-type]
        assert steps.stage_of("c1") == {"stage": "enrich_queued", "ahead": []}
        fn, args = held.jobs.pop(0)
        steps._set_stage("c1", "enriching")  # the enrich worker starts, then an old analysis worker lets go
        steps._leave_stage("c1", "analysing")
        assert steps.stage_of("c1") == {"stage": "enriching", "ahead": []}
        fn(*args)
        assert steps.stage_of("c1") is None
    finally:
        steps.analysis_pool.shutdown()
        steps.enrich_pool = steps.analysis_pool
