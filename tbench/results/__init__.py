"""Results: metrics, the published table, comparison, reports, the dataset, reused points."""
