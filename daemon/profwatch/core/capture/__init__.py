"""Capture planning and the capture lifecycle: profiler_config, the planner, the lifecycle state machine, idle writes,
the report (what to arm and when is ``profwatch.core.arming``)."""
