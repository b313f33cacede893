"""What changed since the job's healthy reference capture (pure): when to take the reference (``reference``), the
comparison of two captures' step breakdowns (``comparison``), AI Core frequency (``hardware``) and the operators,
kernels and collectives behind each change (``detail``). The I/O around them is ``profwatch.changes``."""
