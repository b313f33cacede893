"""Batch completeness: rank-dir layout, mounts, watch settings."""
