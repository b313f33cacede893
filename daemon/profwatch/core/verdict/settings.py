"""Settings of one batch analysis (``profwatch.analysis.facade.analyze_batch``): tool runs, ranking, report (pure, pydantic).

Kept apart from ``daemon/profwatch/analysis/facade.py`` so that ``daemon/profwatch/config.py`` composes it without importing the analysis
stack (staging, subprocess runner, Kineto reader, report rendering).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from profwatch.core.verdict.msprof_plan import MsprofSettings
from profwatch.core.verdict.ranking import RankingSettings


class AnalysisSettings(BaseModel):
    """Settings of ``analyze_batch``: msprof-analyze runs (``msprof``), ranking thresholds (``ranking``), and
    whether ``report.json`` (``report``) and ``report.html`` (``report_html``) are written (by the alert phase, and
    again by the enrich phase). ``kineto_op_compare``: the torch.profiler follow-up, each suspect's ops against a
    reference rank's (``analysis_enriched``); ``suspect_compare``: the same drill-down on Ascend batches, each suspect
against its median peer with ``msprof-analyze compare`` (docs/verdicts.md#drill-down). ``own_tables``: judge an Ascend batch first on profwatch's own reading of
    each rank's tables (``daemon/profwatch/core/verdict/own_tables.py``), msprof-analyze's cluster_time_summary and
    slow_rank then confirming it in the enrich phase (docs/msprof-analyze.md#own-tables); ``own_tables_workers``
    threads read the rank dirs."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    msprof: MsprofSettings = Field(default_factory=MsprofSettings)
    ranking: RankingSettings = Field(default_factory=RankingSettings)
    report: bool = Field(True, description="write report.json for each analysed batch")
    report_html: bool = Field(True, description="write report.html (offline page) for each analysed batch")
    report_html_inline: bool = Field(False, description=(
        "inline plotly.js (4.8 MB) in each report.html, a page that needs no second file (e.g. to mail it); off: "
        "one shared plotly-<version>.min.js (the coordinator's work dir; profwatch analyze: its results folder)"))
    kineto_op_compare: bool = Field(True, description=(
        "torch.profiler batches: compare each suspect's operators with a reference rank's (enrich phase)"))
    suspect_compare: bool = Field(True, description=(
        "Ascend batches: compare each suspect rank's operators with its median peer's (msprof-analyze compare, enrich "
        "phase): the drill-down of why the suspect is slow"))
    own_tables: bool = Field(True, description=(
        "judge an Ascend batch first on profwatch's own reading of each rank's tables; msprof-analyze confirms it in "
        "the enrich phase"))
    own_tables_workers: int = Field(default=4, ge=1, le=64, description="threads reading rank dirs for own_tables")

    def for_reference(self) -> AnalysisSettings:
        """A copy for analysing a reference capture, whose time breakdown alone is compared with later captures
        (docs/changes.md, docs/reference.md): no advisor, no communication matrix, no html report."""
        s = self.model_copy(deep=True)
        s.msprof.without_advisor("not run on a reference capture (its time breakdown alone is compared)")
        s.msprof.communication_matrix = False
        s.report_html = False
        return s
