"""Files on shared storage: prof_dir watching, rank dirs, config writes, staging, retention."""
