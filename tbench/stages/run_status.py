"""A run's status, as its manifest, the report, the results dataset and the CLI's exit code say it: the vocabulary
every reader of a manifest imports."""

RUNNING = "running"  # while its run runs; never a run's final status
COMPLETED, COMPLETED_WITH_FAILURES, FAILED, INTERRUPTED = (
    "completed",
    "completed_with_failures",
    "failed",
    "interrupted",
)
