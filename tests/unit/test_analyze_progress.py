"""`profwatch analyze`'s progress lines say what ran: `--no-advisor` is named as the advisor's reason, and the
follow-up line lists the enrich recipes that ran, not a fixed list (commands/analyze.py ``RecipeProgress``)."""

from __future__ import annotations

import io

from profwatch.commands.analyze import RecipeProgress
from profwatch.core.verdict.evidence import RecipeStatus
from profwatch.core.verdict.msprof_plan import InputFacts, MsprofSettings, plan_recipes
from profwatch.core.verdict.settings import AnalysisSettings

GOOD = InputFacts(rank_count=4, db_ranks=[0, 1, 2, 3], has_communication=True, has_memcpy=True, max_group_size=4)


def test_the_advisor_skip_names_what_turned_it_off() -> None:
    s = MsprofSettings()
    s.without_advisor("turned off by --no-advisor")
    assert plan_recipes(GOOD, s, "/stage/b1").skipped["advisor"].detail == "turned off by --no-advisor"
    assert "[analysis.msprof] advisor = false" in plan_recipes(GOOD, MsprofSettings(advisor=False),
                                                               "/stage/b1").skipped["advisor"].detail
    ref = AnalysisSettings().for_reference()
    assert "reference capture" in plan_recipes(GOOD, ref.msprof, "/stage/b1").skipped["advisor"].detail


def test_follow_up_line_lists_only_what_ran() -> None:
    out = io.StringIO()
    with RecipeProgress("b1", stream=out, tty=False) as p:
        p("finished", "advisor", RecipeStatus("advisor", "skipped", "turned off by --no-advisor"))
        p("finished", "communication_matrix", RecipeStatus("communication_matrix", "ok", "", phase="enrich"))
        p("follow_up", "ok", None)
    last = out.getvalue().splitlines()[-1]
    assert "follow-up done (communication_matrix ok;" in last and "advisor" not in last, last
    out = io.StringIO()
    with RecipeProgress("b2", stream=out, tty=False) as p:
        p("follow_up", "ok", None)
    assert "no follow-up tool ran" in out.getvalue()
