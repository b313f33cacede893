"""Step-time anomaly detection: aggregation, baselines, regressions, spikes, rank outliers, stalls."""
