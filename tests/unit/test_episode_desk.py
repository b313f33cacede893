"""EpisodeDesk.start (arming/episode_desk.py) over a real state store: stored episodes with odd rows."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from profwatch.adapters.store.state import StateStore
from profwatch.arming.episode_desk import EpisodeDesk
from profwatch.config import Settings
from profwatch.core.arming.episodes import Episode, JobEpisodes
from profwatch.core.arming.policy import ArmingPolicy
from profwatch.core.detection.types import Anomaly

T0 = 100_000.0


def stored_episode(job: str) -> dict[str, Any]:
    b = JobEpisodes(job, Settings().arming)
    ep, _ = b.observe(Anomaly("step_regression", job, 50, (), 0.3, {"pattern": "cusum", "baseline_s": 1.0}), T0)
    assert ep is not None
    return ep.to_json()


def desk(store: StateStore, jobs: list[str]) -> EpisodeDesk:
    s = Settings()
    return EpisodeDesk(settings=s, store=store, jobs=dict.fromkeys(jobs), detectors=None,  # type: ignore[arg-type]
                       emit=lambda ev: None, arm=lambda *a, **k: {}, in_flight=lambda j: False,
                       topology=lambda j: None, policy=lambda: ArmingPolicy(s.arming))


def test_odd_stored_follow_ranks_drop_the_follow_up_and_an_infinite_rank_only_its_row(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state.db")
    odd = stored_episode("a")
    del odd["follow_spans"]  # a row stored before follow_spans: its follow_ranks list is read
    odd["follow_ranks"] = ["3", 4.5, True, None, -1, 7, 7, 2]
    store.save_episode(odd["episode_id"], "a", True, T0, odd)
    assert Episode.from_json(odd).follow_ranks == (2, 7)
    bad = stored_episode("b")
    store.save_episode(bad["episode_id"], "b", True, T0 + 1, bad)
    store.db.execute("UPDATE episodes SET body = ? WHERE job_id = 'b'",  # a rank the JSON reads as infinity
                     (json.dumps(bad).replace('"ranks": []', '"ranks": [Infinity]'),))
    store.db.commit()
    good = stored_episode("c")
    store.save_episode(good["episode_id"], "c", True, T0 + 2, good)
    d = desk(store, ["a", "b", "c"])
    d.start()  # raised OverflowError: the coordinator could not start
    (resumed,) = d.books["a"].open.values()
    assert set(d.books) == {"a", "c"} and resumed.follow_ranks == (2, 7)
