"""What changed since the reference capture (I/O shell around ``profwatch.core.changes``): the reference desk that
arms and keeps each job's reference, the comparison attached to an analysed batch and ``msprof-analyze compare``."""
