"""Capture planning and the capture lifecycle: profiler_config, targeting, arming, the report."""
