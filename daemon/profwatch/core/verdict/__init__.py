"""The verdict: signals, robust statistics, ranking, links, impact, msprof-analyze plan and results (what changed
since the reference is ``profwatch.core.changes``)."""
