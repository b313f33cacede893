"""The verdict: signals, robust statistics, ranking, links, impact, msprof-analyze plan and results."""
