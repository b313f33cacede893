"""Jobs, nodes and ranks: registry, generations, job end, rank intake, peers, limits, telemetry."""
