"""The analysis facade: one batch's verdict from msprof-analyze or the Kineto analysis."""
