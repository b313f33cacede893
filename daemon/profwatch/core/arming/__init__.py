"""Automatic capture arming (pure): anomaly episodes and their capture queue (``episodes``, ``episode_record``), the
arming policy (``policy``) and its limits (``settings``), which ranks a capture covers (``targeting``), whether a job
can take an arm now (``admission``, ``availability``). The I/O around them is ``profwatch.arming``."""
