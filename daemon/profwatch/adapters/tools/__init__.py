"""External analysis tools and their outputs: msprof-analyze, its DBs, Kineto traces."""
